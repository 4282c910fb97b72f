"""How soon `kubectl get` shows a policy realized on every node of a 3-node real lab.

Run as root from the repo root: ``.venv/bin/python tests/bench/policy_realization.py``.

The path a user watches (issue 19): a real-node lab (kube-apiserver, kubelet,
containerd, kube-proxy on each node) with Tabby installed from manifests/ (the
DaemonSet's agents publish their NodePolicyStatus, the tabby-controllers Deployment
writes each policy's realization on the object). One pod runs on every node, so each
policy below applies to all of them (desired = the node count).

For ``--rounds`` rounds, one after another: a NetworkPolicy is created, then changed
(generation 2), and a ClusterNetworkPolicy is created, then changed. Each time the
clock runs from just before `kubectl apply` until `kubectl get` (the real binary,
polled every ``--poll`` seconds) shows ``N/N nodes run generation G`` for that
generation: a NetworkPolicy's ``policy.tabby.dev/realized`` annotation, a
ClusterNetworkPolicy's REALIZED column. A kubectl call takes part of that time, as it
does for a user.

The last line is ``policy_realization nodes=N np_p50_s=.. np_max_s=.. cnp_p50_s=..
cnp_max_s=..`` (creations and changes together).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TABBY_CACHE_DIR", str(REPO / ".cache"))
from lab.kubecluster import KubeCluster, KubeSpec  # noqa: E402

NAMESPACE = "realize"
TIMEOUT_S = 60.0


def networkpolicy(name: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"app": "rz"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": port}]}],
        },
    }


def cluster_policy(name: str, priority: int, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy.networking.k8s.io/v1beta1",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": name},
        "spec": {
            "tier": "Baseline",
            "priority": priority,
            "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}},
            "ingress": [
                {
                    "action": "Deny",
                    "from": [{"namespaces": {"matchLabels": {"bench": "nobody"}}}],
                    "protocols": [{"tcp": {"destinationPort": {"number": port}}}],
                }
            ],
        },
    }


def shown_np(cluster: KubeCluster, name: str) -> str:
    """The NetworkPolicy's realized message, as `kubectl get` prints it."""
    path = r"jsonpath={.metadata.annotations.policy\.tabby\.dev/realized}"
    return cluster.kubectl("-n", NAMESPACE, "get", "networkpolicy", name, "-o", path).strip()


def shown_cnp(cluster: KubeCluster, name: str) -> str:
    """The ClusterNetworkPolicy's REALIZED column, from `kubectl get cnp NAME`."""
    header, row = cluster.kubectl("get", "clusternetworkpolicy", name).splitlines()[:2]
    start = header.index("REALIZED")
    end = header.index("AGE")
    return row[start:end].strip()


def time_until(
    apply: Callable[[], None], shown: Callable[[], str], wanted: str, poll: float
) -> float:
    began = time.monotonic()
    apply()
    while True:
        if shown() == wanted:
            return time.monotonic() - began
        if time.monotonic() - began > TIMEOUT_S:
            raise RuntimeError(f"not shown after {TIMEOUT_S}s: wanted {wanted!r}, got {shown()!r}")
        time.sleep(poll)


def bench(work: Path, nodes: int, rounds: int, poll: float) -> dict[str, list[float]]:
    cluster = KubeCluster.up(work / "lab", KubeSpec(nodes=nodes))
    try:
        for node in cluster.nodes:
            cluster.create_pod(NAMESPACE, f"rz-{node.name}", node.name, {"app": "rz"})

        def apply(body: dict[str, Any]) -> Callable[[], None]:
            def run() -> None:
                cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))

            return run

        times: dict[str, list[float]] = {"np": [], "cnp": []}
        for r in range(rounds):
            np_name, cnp_name = f"np-{r}", f"cnp-{r}"
            for generation, port in ((1, 8080), (2, 8081)):
                wanted = f"{nodes}/{nodes} nodes run generation {generation}"
                times["np"].append(
                    time_until(
                        apply(networkpolicy(np_name, port)),
                        functools.partial(shown_np, cluster, np_name),
                        wanted,
                        poll,
                    )
                )
                times["cnp"].append(
                    time_until(
                        apply(cluster_policy(cnp_name, 100 + r, port)),
                        functools.partial(shown_cnp, cluster, cnp_name),
                        wanted,
                        poll,
                    )
                )
            print(
                f"round {r + 1}/{rounds}: np {times['np'][-2]:.2f} / {times['np'][-1]:.2f} s, "
                f"cnp {times['cnp'][-2]:.2f} / {times['cnp'][-1]:.2f} s (create / change)",
                flush=True,
            )
        return times
    finally:
        cluster.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10, help="policies of each kind")
    parser.add_argument("--poll", type=float, default=0.1, help="seconds between kubectl gets")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tbt-realize-") as work:
        times = bench(Path(work), opts.nodes, opts.rounds, opts.poll)
    figures = {kind: (statistics.median(values), max(values)) for kind, values in times.items()}
    print(
        f"policy_realization nodes={opts.nodes} "
        + " ".join(
            f"{kind}_p50_s={p50:.2f} {kind}_max_s={high:.2f}"
            for kind, (p50, high) in figures.items()
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
