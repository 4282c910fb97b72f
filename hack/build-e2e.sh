#!/usr/bin/env bash
# Build the upstream suites that `make conformance` runs:
#   e2e-network.test the Kubernetes e2e sig-network specs of the pinned release
#                    (`Netpol`, `Services`, the sig-network `[Conformance]` specs),
#                    from a thin test package of ours (hack/go/kubernetes/network)
#                    that imports test/e2e/network, test/e2e/common/network and the
#                    framework's init (942 specs; the full test/e2e binary has ~7,500
#                    and every provider)
#   cyclonus         github.com/mattfenwick/cyclonus, the generated-case suite
#   ginkgo           the ginkgo CLI (the version the e2e tree pins), to run the e2e
#                    binary with parallel processes and write JSON/JUnit reports
#   npapi-conformance-<version>-<source hash>.test
#                    the network-policy-api conformance profiles (ClusterNetworkPolicy)
#                    of the pinned sigs.k8s.io/network-policy-api, from a thin test
#                    package of ours (hack/go/npapi-conformance) that embeds a copy of
#                    the module's base manifests plus a variant without SCTP servers;
#                    NPAPI_SCTP_PROBES=skip (sctp-probes.patch) logs SCTP probes
#                    instead of running them
# Binaries land in a cache folder keyed by version, rebuilt only when missing.
# Shares GOCACHE with hack/build-k8s.sh: warm ~20 s, cold ~4 min on 2 cores.
#
# Usage: hack/build-e2e.sh            build what is missing, print the bin dir
#        hack/build-e2e.sh --print    only print the bin dir
#        hack/build-e2e.sh --kube-network-policies
#                                     build sigs.k8s.io/kube-network-policies (the reference
#                                     NetworkPolicy implementation, lab/refpolicy.py) and
#                                     print its bin dir (cold ~3 min)
set -euo pipefail

K8S_VERSION=v1.36.3
CYCLONUS_VERSION=v0.5.6
GINKGO_VERSION=v2.28.1  # hack/go/kubernetes/go.mod's github.com/onsi/ginkgo/v2
NPAPI_VERSION=v0.3.0    # hack/go/npapi-conformance/go.mod's, and hack/gen-cnp-crd.sh's
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${TABBY_CACHE_DIR:-$repo/.cache}
bindir=$cache/bin/e2e-$K8S_VERSION-cyclonus-$CYCLONUS_VERSION

if [[ "${1:-}" == "--print" ]]; then echo "$bindir"; exit 0; fi

log() { printf '[build-e2e] %s\n' "$*" >&2; }

export CGO_ENABLED=0 GOTOOLCHAIN=local

KNP_VERSION=v0.8.0
if [[ "${1:-}" == "--kube-network-policies" ]]; then
  knpdir=$cache/bin/kube-network-policies-$KNP_VERSION
  if [[ ! -x $knpdir/kube-network-policies ]]; then
    log "building kube-network-policies $KNP_VERSION"
    mkdir -p "$knpdir"
    # The main package is .../cmd, so go install names the binary `cmd`.
    GOFLAGS= GOBIN=$knpdir go install -trimpath -ldflags "-s -w" \
      "sigs.k8s.io/kube-network-policies/cmd@$KNP_VERSION"
    mv -f "$knpdir/cmd" "$knpdir/kube-network-policies"
  fi
  echo "$knpdir"
  exit 0
fi
mkdir -p "$bindir"

build_network_e2e() {
  local minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  local flags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    flags+=" -X $p.gitTreeState=clean -X $p.gitCommit=tabby-module-build"
  done
  log "building e2e-network.test $K8S_VERSION (test/e2e/network, test/e2e/common/network)"
  (cd "$here/go/kubernetes" && GOFLAGS=-mod=mod go test -c -vet=off -trimpath \
      -ldflags "$flags" -o "$bindir/e2e-network.test" ./network)
}

build_cyclonus() {
  log "building cyclonus $CYCLONUS_VERSION"
  GOFLAGS= GOBIN=$bindir go install -trimpath \
    -ldflags "-s -w -X github.com/mattfenwick/cyclonus/pkg/cli.version=$CYCLONUS_VERSION" \
    "github.com/mattfenwick/cyclonus/cmd/cyclonus@$CYCLONUS_VERSION"
}

build_ginkgo() {
  log "building ginkgo CLI $GINKGO_VERSION"
  GOFLAGS= GOBIN=$bindir go install -trimpath -ldflags "-s -w" \
    "github.com/onsi/ginkgo/v2/ginkgo@$GINKGO_VERSION"
}

build_npapi_conformance() {
  log "building the network-policy-api $NPAPI_VERSION conformance suite"
  local work=$cache/build/npapi-conformance-$NPAPI_VERSION
  rm -rf "$work"
  mkdir -p "$work"
  cp "$here"/go/npapi-conformance/{go.mod,go.sum,*.go} "$work"/
  local info dir
  info=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/network-policy-api@$NPAPI_VERSION")
  dir=$(printf '%s' "$info" | python3 -c "import json,sys; print(json.load(sys.stdin)['Dir'])")
  # The module, with one change that only NPAPI_SCTP_PROBES=skip turns on: an SCTP
  # probe is logged instead of run (lab/conformance.py uses it where the kernel has no
  # SCTP sockets, in a second run beside the unchanged one).
  cp -r "$dir" "$work/npapi"
  chmod -R u+w "$work/npapi"
  patch -s -p1 -d "$work/npapi" < "$here/go/npapi-conformance/sctp-probes.patch"
  (cd "$work" && go mod edit -replace "sigs.k8s.io/network-policy-api=./npapi")
  cp -r "$work/npapi/conformance/base" "$work/base"
  # agnhost porter exits when it cannot open an SCTP socket: this variant renames the
  # SCTP servers' variables so that those containers run and serve nothing.
  sed 's/SERVE_SCTP_PORT_/NO_SCTP_SOCKETS_SERVE_SCTP_PORT_/' "$work/base/manifests.yaml" \
    > "$work/base/manifests-no-sctp.yaml"
  if ! grep -q NO_SCTP_SOCKETS_ "$work/base/manifests-no-sctp.yaml"; then
    log "no SCTP server found in $NPAPI_VERSION's base manifests: update this script"
    exit 1
  fi
  (cd "$work" && GOFLAGS=-mod=mod go test -c -vet=off -trimpath -ldflags "-s -w" \
      -o "$npapi_bin" .)
  rm -rf "$work"
}

# The suite's binary is named by the module's version and our package's content.
npapi_src=$(cat "$here"/go/npapi-conformance/* | sha256sum | cut -c1-10)
npapi_bin=$bindir/npapi-conformance-$NPAPI_VERSION-$npapi_src.test

start=$(date +%s)
[[ -x $bindir/e2e-network.test ]] || build_network_e2e
[[ -x $bindir/cyclonus ]] || build_cyclonus
[[ -x $bindir/ginkgo ]] || build_ginkgo
[[ -x $npapi_bin ]] || build_npapi_conformance
printf '%s\n' "kubernetes-e2e=$K8S_VERSION" "cyclonus=$CYCLONUS_VERSION" "ginkgo=$GINKGO_VERSION" \
  "network-policy-api=$NPAPI_VERSION" > "$bindir/VERSIONS"
log "binaries ready in $(( $(date +%s) - start ))s: $bindir"
echo "$bindir"
