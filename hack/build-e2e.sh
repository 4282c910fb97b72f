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

start=$(date +%s)
[[ -x $bindir/e2e-network.test ]] || build_network_e2e
[[ -x $bindir/cyclonus ]] || build_cyclonus
[[ -x $bindir/ginkgo ]] || build_ginkgo
printf '%s\n' "kubernetes-e2e=$K8S_VERSION" "cyclonus=$CYCLONUS_VERSION" "ginkgo=$GINKGO_VERSION" \
  > "$bindir/VERSIONS"
log "binaries ready in $(( $(date +%s) - start ))s: $bindir"
echo "$bindir"
