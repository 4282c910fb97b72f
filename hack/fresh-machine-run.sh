#!/usr/bin/env bash
# Run CI the way a fresh machine of this kind would: a fresh clone of HEAD (so no
# .venv, no .cache, no build/), an empty TABBY_CACHE_DIR (Kubernetes, etcd, CoreDNS
# and the images are built from scratch), empty Go build and module caches, and
# /run/netns unmounted, as on a machine
# where no network namespace was ever created. Then `CI=true bash .ci/run`.
#
# Usage (from the project root, as root): hack/fresh-machine-run.sh [--keep]
#   It refuses to unmount /run/netns while any namespace exists there (it would
#   cut those namespaces off from `ip netns`): end labs first (`tabbyctl lab down`).
#   Cold, it takes about 30 min more than a warm `make test` (the Go builds).
set -euo pipefail
top=$(git rev-parse --show-toplevel)
cd "$top"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "fresh-machine-run: uncommitted changes; it runs HEAD only. Commit first." >&2
  exit 2
fi
if grep -q ' /run/netns ' /proc/self/mountinfo; then
  if [ -n "$(ls -A /run/netns 2>/dev/null)" ]; then
    echo "fresh-machine-run: namespaces exist in /run/netns: $(ls /run/netns | tr '\n' ' ')" >&2
    exit 2
  fi
  # iproute2 mounts it twice (a bind of itself, then made shared): undo both.
  while grep -q ' /run/netns ' /proc/self/mountinfo; do umount /run/netns; done
fi
work=$(mktemp -d /tmp/fresh-run.XXXXXX)
git clone -q "$top" "$work/clone"
mkdir "$work/cache" "$work/gocache" "$work/gomod"
echo "fresh-machine-run: $(git rev-parse --short HEAD) in $work/clone, TABBY_CACHE_DIR=$work/cache"
t0=$(date +%s)
rc=0
( cd "$work/clone" && CI=true TABBY_CACHE_DIR="$work/cache" GOCACHE="$work/gocache" \
    GOMODCACHE="$work/gomod" bash .ci/run </dev/null ) \
  >"$work/run.log" 2>&1 || rc=$?
tail -n 25 "$work/run.log"
echo "fresh-machine-run: rc=$rc in $(( $(date +%s) - t0 ))s (log: $work/run.log)"
if [ "${1:-}" != "--keep" ]; then
  chmod -R u+w "$work/gomod"  # the module cache is read-only by design
  rm -rf "$work/clone" "$work/cache" "$work/gocache" "$work/gomod"
fi
exit $rc
