#!/usr/bin/env bash
# Build the container images a lab node's containerd needs (pause, agnhost, coredns, tabby),
# with no Docker daemon and no registry: see lab/images.py. Cached under
# $TABBY_CACHE_DIR/images/; prints each image's name, archive, size and seconds.
# Needs root (mmdebstrap --mode=root) and hack/install-deps.sh's packages.
#
# Usage: hack/build-images.sh [--only pause|agnhost|tabby]... [-v]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export TABBY_CACHE_DIR=${TABBY_CACHE_DIR:-$repo/.cache}
cd "$repo"
exec "${PYTHON:-$repo/.venv/bin/python}" -m lab.images "$@"
