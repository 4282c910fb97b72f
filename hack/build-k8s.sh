#!/usr/bin/env bash
# Build the upstream parts Tabby's tests run for real: kube-apiserver, kubectl and
# the node and control-plane daemons (kubelet, kube-proxy, kube-scheduler,
# kube-controller-manager) plus the agnhost test binary from k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3 (both through the Go
# module proxy via the wrapper modules in hack/go/), crictl from sigs.k8s.io/cri-tools,
# the pause binary from the C source shipped in the k8s.io/kubernetes module, and
# CoreDNS (github.com/coredns/coredns, the lab's cluster DNS).
# Binaries land in a cache folder keyed by version and are rebuilt only when missing.
#
# Usage: hack/build-k8s.sh            build what is missing, print the bin dir
#        hack/build-k8s.sh --print    only print the bin dir
set -euo pipefail

K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
CRICTL_VERSION=v1.37.0
COREDNS_VERSION=v1.14.7  # lab/images.py COREDNS_IMAGE carries the same tag
# The tag the pinned e2e framework's image manifest names (imageutils.Agnhost).
AGNHOST_TAG=2.63.0
K8S_COMMANDS=(kube-apiserver kubectl kubelet kube-proxy kube-scheduler kube-controller-manager)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${TABBY_CACHE_DIR:-$repo/.cache}
bindir=$cache/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-crictl-$CRICTL_VERSION

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
  # One `go build` for all of them: shared packages compile once (cold, 2 cores:
  # ~9 min for the six commands with an empty Go build cache).
  local targets=()
  for cmd in "${K8S_COMMANDS[@]}"; do
    [[ -x $bindir/$cmd ]] || targets+=("$pkg/cmd/$cmd")
  done
  [[ -x $bindir/agnhost ]] || targets+=("$pkg/test/images/agnhost")
  ((${#targets[@]})) || return 0
  log "building ${targets[*]##*/} $K8S_VERSION"
  (cd "$here/go/kubernetes" && go build -trimpath -ldflags "$flags" -o "$bindir/" "${targets[@]}")
}

build_etcd() {
  log "building etcd $ETCD_VERSION"
  (cd "$here/go/etcd" && go build -trimpath -ldflags "-s -w" -o "$bindir/etcd" \
      go.etcd.io/etcd/server/v3)
}

build_crictl() {
  log "building crictl $CRICTL_VERSION"
  GOBIN=$bindir go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
}

build_coredns() {
  # Every in-tree plugin (its default plugin.cfg): ~2.5 min cold on 2 cores.
  log "building coredns $COREDNS_VERSION"
  GOFLAGS= GOBIN=$bindir go install -trimpath -ldflags "-s -w" \
    "github.com/coredns/coredns@$COREDNS_VERSION"
}

build_pause() {
  # The sandbox's first process; upstream builds it the same way (build/pause/Makefile).
  local src
  src=$(cd "$here/go/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux
  log "building pause from $src"
  gcc -Os -Wall -Werror -static -DVERSION="tabby-$K8S_VERSION" -o "$bindir/pause" \
    "$src/pause.c"
  strip "$bindir/pause"
}

start=$(date +%s)
build_k8s
[[ -x $bindir/etcd ]] || build_etcd
[[ -x $bindir/crictl ]] || build_crictl
[[ -x $bindir/pause ]] || build_pause
# Its binary is not named by version: the stamp says which one is there.
[[ -x $bindir/coredns ]] && grep -qx "coredns=$COREDNS_VERSION" "$bindir/VERSIONS" 2>/dev/null \
  || build_coredns
printf '%s\n' "kubernetes=$K8S_VERSION" "etcd=$ETCD_VERSION" "crictl=$CRICTL_VERSION" \
  "agnhost=$AGNHOST_TAG" "coredns=$COREDNS_VERSION" \
  > "$bindir/VERSIONS"
log "binaries ready in $(( $(date +%s) - start ))s: $bindir"
echo "$bindir"
