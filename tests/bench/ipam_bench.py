"""IPAM allocation benchmark against a real kube-apiserver + etcd.

Standalone: starts its own control plane in a temporary directory, then measures
  1. uncontended: one node allocating one address at a time (its blocks cached);
  2. contended: three node processes allocating from the same pool at once.
Beside them, as a peer measured in the same run, the cheapest write the apiserver
takes: a PUT of a one-key ConfigMap (half before the uncontended run, half after),
so that a slow machine shows up as a slow peer, not as a slow allocator.
The last line printed is exactly:
  ipam alloc_p50_ms=X alloc_p99_ms=Y contended_p99_ms=Z

Run: .venv/bin/python tests/bench/ipam_bench.py [--allocations N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from datastore.client import Datastore  # noqa: E402
from datastore.errors import AlreadyExists  # noqa: E402
from datastore.models import (  # noqa: E402
    IPPool,
    IPPoolSpec,
    Meta,
)
from felix.agent import settle_heap  # noqa: E402
from ipam.allocator import AGENT_PRECLAIM_BELOW, IPAMAllocator  # noqa: E402
from lab.controlplane import ControlPlane  # noqa: E402

POOL = "bench-pool"
WARMUP = 20


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def pod_allocation(node: str, pod: str) -> tuple[str, dict[str, str]]:
    """A handle and attributes the size the CNI server writes for a real pod."""
    handle = f"k8s-pod-network.{secrets.token_hex(32)}"  # <network>.<64-hex container ID>
    return handle, {"ifname": "eth0", "namespace": "bench", "pod": f"{node}-{pod}-7d9f8b6c5-x2k4q"}


def timed_allocations(kubeconfig: str, node: str, count: int) -> list[float]:
    """Milliseconds per auto_assign, after a warm-up that claims the first block.

    The allocator is configured as the node agent configures it (claims ahead), and
    the heap is frozen after the warm-up as tabby-node freezes it after start-up.
    """
    ds = Datastore.from_kubeconfig(kubeconfig)
    allocator = IPAMAllocator(ds, node, config_ttl=60, preclaim_below=AGENT_PRECLAIM_BELOW)
    for i in range(WARMUP):
        allocator.auto_assign(*pod_allocation(node, f"warm{i}"), pools=[POOL])
    settle_heap()
    samples = []
    for i in range(count):
        handle, attrs = pod_allocation(node, str(i))
        began = time.perf_counter()
        allocator.auto_assign(handle, attrs, pools=[POOL])
        samples.append((time.perf_counter() - began) * 1000)
    allocator.close()
    return samples


def cpu_times() -> list[int]:
    """The machine's cpu line of /proc/stat: user nice system idle iowait irq softirq steal."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def steal_percent(before: list[int], after: list[int]) -> float:
    """Share of CPU time the hypervisor gave to someone else between two cpu_times()."""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    return 100 * delta[7] / max(1, sum(delta))


def timed_peer_puts(ds: Datastore, count: int) -> list[float]:
    """Milliseconds per PUT of a one-key ConfigMap: the apiserver's floor for a write."""
    path = "/api/v1/namespaces/default/configmaps"
    body = {"metadata": {"name": "ipam-bench-peer"}, "data": {"n": "0"}}
    try:
        body = ds.transport.request("POST", path, body=body)
    except AlreadyExists:
        body = ds.transport.request("GET", f"{path}/ipam-bench-peer")
    samples = []
    for i in range(count):
        body["data"]["n"] = str(i)
        began = time.perf_counter()
        body = ds.transport.request("PUT", f"{path}/ipam-bench-peer", body=body)
        samples.append((time.perf_counter() - began) * 1000)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--allocations", type=int, default=1000, help="per measurement (p99: the 10th slowest)"
    )
    parser.add_argument("--nodes", type=int, default=3, help="contending processes")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="ipam-bench-") as workdir,
        ControlPlane.start(Path(workdir)) as cp,
    ):
        ds = cp.datastore()  # the runner waited until the CRDs' storage answers
        spec = IPPoolSpec(cidr="10.96.0.0/12", block_size=26)
        ds.create(IPPool(metadata=Meta(name=POOL), spec=spec))
        kubeconfig = str(cp.kubeconfig)

        peer = timed_peer_puts(ds, args.allocations // 2)
        began, cpu_before = time.perf_counter(), cpu_times()
        solo = timed_allocations(kubeconfig, "bench-solo", args.allocations)
        solo_rate = args.allocations / (time.perf_counter() - began)
        solo_steal = steal_percent(cpu_before, cpu_times())
        peer += timed_peer_puts(ds, args.allocations - len(peer))

        ctx = multiprocessing.get_context("spawn")
        count = max(1, args.allocations // args.nodes)
        with ctx.Pool(args.nodes) as pool:
            began = time.perf_counter()
            parts = pool.starmap(
                timed_allocations,
                [(kubeconfig, f"bench-{i}", count) for i in range(args.nodes)],
            )
            wall = time.perf_counter() - began
        contended = [s for part in parts for s in part]
        contended_rate = len(contended) / wall  # includes process start-up

    p50, p99 = statistics.median(solo), percentile(solo, 99)
    c50, c99 = statistics.median(contended), percentile(contended, 99)
    peer50, peer99 = statistics.median(peer), percentile(peer, 99)
    print(
        f"uncontended: {len(solo)} allocations, {solo_rate:.0f}/s, "
        f"p50 {p50:.2f} ms, p99 {p99:.2f} ms; CPU stolen by the hypervisor {solo_steal:.1f}%"
    )
    print(
        f"contended ({args.nodes} node processes): {len(contended)} allocations, "
        f"{contended_rate:.0f}/s incl. start-up, p50 {c50:.2f} ms, p99 {c99:.2f} ms"
    )
    print(
        f"peer, ConfigMap PUT: {len(peer)} writes, p50 {peer50:.2f} ms, p99 {peer99:.2f} ms; "
        f"an allocation (two writes) is {p50 / peer50:.2f}x its p50, {p99 / peer99:.2f}x its p99"
    )
    print(f"ipam alloc_p50_ms={p50:.2f} alloc_p99_ms={p99:.2f} contended_p99_ms={c99:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
