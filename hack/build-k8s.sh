#!/usr/bin/env bash
# Build the upstream parts Tabby's tests run for real: kube-apiserver and kubectl
# from k8s.io/kubernetes, and etcd from go.etcd.io/etcd/server/v3, all through the
# Go module proxy via the wrapper modules in hack/go/. Binaries land in a cache
# folder keyed by version and are rebuilt only when missing.
#
# Usage: hack/build-k8s.sh            build what is missing, print the bin dir
#        hack/build-k8s.sh --print    only print the bin dir
set -euo pipefail

K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${TABBY_CACHE_DIR:-$repo/.cache}
bindir=$cache/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION

if [[ "${1:-}" == "--print" ]]; then echo "$bindir"; exit 0; fi

log() { printf '[build-k8s] %s\n' "$*" >&2; }

export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
mkdir -p "$bindir"

build_k8s() {
  local pkg=k8s.io/kubernetes minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  local date; date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local flags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    flags+=" -X $p.gitTreeState=clean -X $p.buildDate=$date -X $p.gitCommit=tabby-module-build"
  done
  log "building kube-apiserver and kubectl $K8S_VERSION (cold: ~25 min on 2 cores)"
  (cd "$here/go/kubernetes" && go build -trimpath -ldflags "$flags" -o "$bindir/" \
      "$pkg/cmd/kube-apiserver" "$pkg/cmd/kubectl")
}

build_etcd() {
  log "building etcd $ETCD_VERSION"
  (cd "$here/go/etcd" && go build -trimpath -ldflags "-s -w" -o "$bindir/etcd" \
      go.etcd.io/etcd/server/v3)
}

start=$(date +%s)
[[ -x $bindir/kube-apiserver && -x $bindir/kubectl ]] || build_k8s
[[ -x $bindir/etcd ]] || build_etcd
printf '%s\n' "kubernetes=$K8S_VERSION" "etcd=$ETCD_VERSION" > "$bindir/VERSIONS"
log "binaries ready in $(( $(date +%s) - start ))s: $bindir"
echo "$bindir"
