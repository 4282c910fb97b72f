#!/usr/bin/env bash
# Tabby on a kind cluster, then the upstream Kubernetes NetworkPolicy e2e tests.
#
# NEEDS a machine with Docker (a running daemon), kind, kubectl, curl and tar,
# and Internet access (kind node image, e2e test binaries, CNI plugins). It does
# NOT run on Tabby's test machines (no Docker daemon there) and is not part of
# `make test`; it exits with a message when a tool is missing. Nothing here
# touches the host's network beyond what kind itself sets up (a docker network).
#
# Usage: hack/kind-conformance.sh [up|test|down|all]     (default: all)
#   up    create the cluster (manifests/kind-config.yaml: 1 control plane +
#         2 workers, no default CNI), build and load the image, install Tabby,
#         wait until every node is Ready and CoreDNS runs on the pod network
#   test  run the e2e tests focused on NetworkPolicy ('Netpol') against it
#   down  delete the cluster
#   all   up + test, then down unless KEEP=1 (logs are exported on failure)
#
# Environment (defaults in brackets):
#   CLUSTER [tabby]                kind cluster name
#   KIND_NODE_IMAGE []             kindest/node image; empty = kind's default
#   IMAGE [tabby:0.1.0]            image built from ./Dockerfile and loaded
#   E2E_FOCUS ['\[sig-network\] Netpol']
#   E2E_SKIP ['SCTP|\[Disruptive\]|\[Feature:Networking-IPv6\]']
#   E2E_NODES [1]                  >1: run in parallel through ginkgo
#   E2E_DIR []                     folder with e2e.test (and ginkgo); empty =
#                                  download the release matching the server
#   ARTIFACTS [_artifacts/kind-conformance]   e2e reports and exported logs
#   KEEP []                        1: keep the cluster after `all`
set -euo pipefail

cd "$(dirname "$0")/.."
CLUSTER=${CLUSTER:-tabby}
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-}
IMAGE=${IMAGE:-tabby:0.1.0}
DEFAULT_IMAGE=tabby:0.1.0 # what manifests/*.yaml name
E2E_FOCUS=${E2E_FOCUS:-'\[sig-network\] Netpol'}
E2E_SKIP=${E2E_SKIP:-'SCTP|\[Disruptive\]|\[Feature:Networking-IPv6\]'}
E2E_NODES=${E2E_NODES:-1}
E2E_DIR=${E2E_DIR:-}
ARTIFACTS=${ARTIFACTS:-_artifacts/kind-conformance}
KEEP=${KEEP:-}
CONTEXT="kind-$CLUSTER"

log() { echo "[kind-conformance] $*" >&2; }
die() { log "error: $*"; exit 1; }
k() { kubectl --context "$CONTEXT" "$@"; }

require_tools() {
  local missing=()
  for tool in docker kind kubectl curl tar; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  if ((${#missing[@]})); then
    die "missing: ${missing[*]}. This script needs a machine with Docker and kind" \
      "(https://kind.sigs.k8s.io); it cannot run where there is no Docker daemon."
  fi
  docker info >/dev/null 2>&1 || die "docker is installed but its daemon is not reachable (docker info failed)"
}

arch() {
  case "$(uname -m)" in
    x86_64) echo amd64 ;;
    aarch64 | arm64) echo arm64 ;;
    *) die "unsupported architecture $(uname -m)" ;;
  esac
}

create_cluster() {
  if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "cluster $CLUSTER exists; reusing it"
    return
  fi
  log "creating kind cluster $CLUSTER (no default CNI: nodes stay NotReady until Tabby runs)"
  kind create cluster --name "$CLUSTER" --config manifests/kind-config.yaml \
    ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 0s
}

build_and_load_image() {
  log "building $IMAGE"
  docker build -t "$IMAGE" .
  kind load docker-image "$IMAGE" --name "$CLUSTER"
}

install_tabby() {
  log "installing Tabby"
  # CRDs first and Established, else the IPPool in the kustomization is
  # rejected by kubectl's discovery on a fresh cluster.
  k apply --server-side -f manifests/crds/
  k wait --for=condition=Established --timeout=120s -f manifests/crds/
  k apply --server-side -k manifests/
  if [[ $IMAGE != "$DEFAULT_IMAGE" ]]; then
    k -n kube-system set image daemonset/tabby-node install-cni="$IMAGE" tabby-node="$IMAGE"
    k -n kube-system set image deployment/tabby-controllers ipam-gc="$IMAGE"
  fi
  log "waiting for tabby-node on every node"
  k -n kube-system rollout status daemonset/tabby-node --timeout=10m
  k wait --for=condition=Ready nodes --all --timeout=10m
  # CoreDNS is the first workload on the pod network: if it runs, pods get addresses.
  k -n kube-system rollout status deployment/coredns --timeout=10m
  k -n kube-system rollout status deployment/tabby-controllers --timeout=10m
  k get pods -A -o wide
}

fetch_e2e() {
  if [[ -n $E2E_DIR ]]; then
    [[ -x $E2E_DIR/e2e.test ]] || die "E2E_DIR=$E2E_DIR has no executable e2e.test"
    return
  fi
  local version
  version=$(k version -o json | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p' | tail -n 1)
  [[ -n $version ]] || die "could not read the server version"
  E2E_DIR="$ARTIFACTS/e2e-$version"
  if [[ ! -x $E2E_DIR/e2e.test ]]; then
    log "downloading the $version e2e tests"
    mkdir -p "$E2E_DIR"
    curl -fsSL "https://dl.k8s.io/$version/kubernetes-test-linux-$(arch).tar.gz" |
      tar -xz -C "$E2E_DIR" --strip-components=3 kubernetes/test/bin/e2e.test kubernetes/test/bin/ginkgo
  fi
}

run_e2e() {
  fetch_e2e
  local kubeconfig="$ARTIFACTS/kubeconfig"
  mkdir -p "$ARTIFACTS"
  kind get kubeconfig --name "$CLUSTER" >"$kubeconfig"
  local args=(--provider=local --kubeconfig="$kubeconfig" --report-dir="$ARTIFACTS")
  log "running e2e: focus '$E2E_FOCUS', skip '$E2E_SKIP', $E2E_NODES process(es)"
  if ((E2E_NODES > 1)); then
    "$E2E_DIR/ginkgo" --nodes="$E2E_NODES" --focus="$E2E_FOCUS" --skip="$E2E_SKIP" --timeout=3h \
      "$E2E_DIR/e2e.test" -- "${args[@]}"
  else
    "$E2E_DIR/e2e.test" "${args[@]}" --ginkgo.focus="$E2E_FOCUS" --ginkgo.skip="$E2E_SKIP" \
      --ginkgo.timeout=3h --ginkgo.v
  fi
  log "e2e passed; reports in $ARTIFACTS"
}

export_logs() {
  log "exporting cluster logs to $ARTIFACTS/logs"
  kind export logs "$ARTIFACTS/logs" --name "$CLUSTER" >/dev/null 2>&1 || true
  k -n kube-system logs -l app.kubernetes.io/name=tabby-node --all-containers --prefix --tail=-1 \
    >"$ARTIFACTS/tabby-node.log" 2>&1 || true
}

up() { create_cluster; build_and_load_image; install_tabby; }
down() { kind delete cluster --name "$CLUSTER"; }

main() {
  local step=${1:-all}
  require_tools
  case "$step" in
    up) up ;;
    test) run_e2e ;;
    down) down ;;
    all)
      # On any exit: logs if something failed, then the cluster goes (unless KEEP=1).
      trap 'rc=$?; ((rc == 0)) || export_logs; [[ $KEEP == 1 ]] || down; exit "$rc"' EXIT
      up
      run_e2e
      ;;
    *) die "unknown step '$step': use up, test, down or all" ;;
  esac
}

main "$@"
