#!/usr/bin/env bash
# Build what Tabby puts on a node's /opt/cni/bin, all static (CGO_ENABLED=0), so a
# node needs neither an interpreter nor CNI plugins of its own:
#   tabby      cni/forwarder: the node-side CNI executable, a forwarder to the agent;
#   portmap    containernetworking/plugins' reference plugins that Tabby's conflist
#   bandwidth  chains (hostPort, traffic shaping), from the Go module proxy.
# They land together in a cache folder keyed by the forwarder's sources and the
# plugins' version: rebuilt only when those change (cold ~20 s on 2 cores, warm:
# nothing to do). Prints the path of `tabby`; the others are beside it.
#
# Usage: hack/build-cni.sh            build if missing, print tabby's path
#        hack/build-cni.sh --print    only print the path
set -euo pipefail

CNI_PLUGINS_VERSION=v1.10.0  # github.com/containernetworking/plugins
CNI_PLUGINS=(meta/portmap meta/bandwidth)

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${TABBY_CACHE_DIR:-$repo/.cache}
src=$repo/cni/forwarder
hash=$( (cat "$src"/go.mod "$src"/*.go; echo "$CNI_PLUGINS_VERSION ${CNI_PLUGINS[*]}") \
  | sha256sum | cut -c1-16)
dir=$cache/bin/tabby-cni-$hash
out=$dir/tabby

if [[ "${1:-}" == "--print" ]]; then echo "$out"; exit 0; fi
if [[ ! -x $out ]]; then
  printf '[build-cni] building %s (forwarder, portmap and bandwidth %s)\n' "$dir" \
    "$CNI_PLUGINS_VERSION" >&2
  tmp=$dir.tmp.$$
  rm -rf "$tmp" && mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$tmp/tabby" .)
  packages=()
  for plugin in "${CNI_PLUGINS[@]}"; do
    packages+=("github.com/containernetworking/plugins/plugins/$plugin@$CNI_PLUGINS_VERSION")
  done
  GOBIN=$tmp go install -trimpath -ldflags "-s -w" "${packages[@]}"
  for name in tabby portmap bandwidth; do
    [[ -x $tmp/$name ]] || { echo "[build-cni] $name was not built" >&2; exit 1; }
  done
  rm -rf "$dir" && mv "$tmp" "$dir"
fi
echo "$out"
