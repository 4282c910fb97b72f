"""BGP convergence and memory benchmark on a real lab cluster (full mesh and reflectors).

What is measured, and how:

1. Convergence latency, full mesh (default 10 nodes). `LabCluster` brings up etcd,
   kube-apiserver, N node namespaces and one real `tabby-node` agent (with its ExaBGP)
   per node. Once every agent's `bgp-status.json` shows all expected peers `up`, the
   script triggers block claims one at a time: it creates the first pod on a node (a
   real CNI ADD, which makes that node claim a /26 IPAM block and announce it). The
   timestamp `t0` is taken just before the CNI ADD is executed. Every node's kernel is
   watched through a netlink socket (RTMGRP_IPV4_ROUTE, opened inside each node
   namespace; nothing is opened in the host's namespace) and the arrival time of each
   RTM_NEWROUTE with route protocol 81 is recorded as it is read. The latency of one
   (claim, other node) pair is: first time that node's kernel holds a proto-81 route for
   the claimed block, minus `t0`. p50 / p99 are over all such pairs. As a breakdown, the
   latency from the claiming node's own `blackhole` route (proto 81, installed by its
   agent just before it announces the block) is also shown.
2. The same for a route-reflector topology (default 2 reflectors + 18 clients).
3. Memory: VmRSS of each agent process plus all its descendants (ExaBGP), from
   `/proc/<pid>/status`, children found through the ppid field of `/proc/*/stat`,
   averaged per node after the claims. The figure on the last line is the larger of
   the two topologies' averages.

Run as root from the repo root: `.venv/bin/python tests/bench/bgp_convergence.py`.
The last line printed is exactly:
  bgp mesh10_p99_ms=X rr20_p99_ms=Y rss_per_node_mb=Z
(the labels keep their names; the node counts actually used are printed above it).
Every cluster is torn down in a `finally`, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ipaddress
import json
import math
import os
import select
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lab.cluster import ClusterSpec, LabCluster  # noqa: E402

PROTO_BGP = 81
RTN_BLACKHOLE = 6
RTM_NEWROUTE = 24
RTA_DST = 1
NLMSG_HDR = struct.Struct("=IHHII")
RTMSG = struct.Struct("=BBBBBBBBI")
RTATTR = struct.Struct("=HH")
RTMGRP_IPV4_ROUTE = 0x40
NETLINK_ROUTE = 0
CLONE_NEWNET = 0x40000000
BENCH_NS = "bench-bgp"

_libc = ctypes.CDLL(None, use_errno=True)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- netlink route watcher ------------------------------------------------------------------
@contextlib.contextmanager
def _in_netns(name: str) -> Iterator[None]:
    """Run the block with this thread inside /run/netns/<name>, then come back."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
        try:
            yield
        finally:
            if _libc.setns(home, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns back: {os.strerror(err)}")
    finally:
        os.close(target)
        os.close(home)


def _route_socket(netns_name: str) -> socket.socket:
    """A netlink socket subscribed to IPv4 route changes inside one lab namespace."""
    with _in_netns(netns_name):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((0, RTMGRP_IPV4_ROUTE))
    sock.setblocking(False)
    return sock


def parse_new_routes(data: bytes) -> list[tuple[str, bool]]:
    """(prefix, is_blackhole) for each RTM_NEWROUTE with protocol 81 in a netlink read."""
    found: list[tuple[str, bool]] = []
    offset = 0
    while offset + NLMSG_HDR.size <= len(data):
        length, kind, _, _, _ = NLMSG_HDR.unpack_from(data, offset)
        if length < NLMSG_HDR.size:
            break
        body = offset + NLMSG_HDR.size
        if kind == RTM_NEWROUTE and length >= NLMSG_HDR.size + RTMSG.size:
            family, dst_len, _, _, _, proto, _, rtype, _ = RTMSG.unpack_from(data, body)
            if family == socket.AF_INET and proto == PROTO_BGP:
                dst = _attr(data, body + RTMSG.size, offset + length, RTA_DST)
                if dst is not None and len(dst) == 4:
                    found.append((f"{socket.inet_ntoa(dst)}/{dst_len}", rtype == RTN_BLACKHOLE))
        offset += (length + 3) & ~3
    return found


def _attr(data: bytes, start: int, end: int, wanted: int) -> bytes | None:
    while start + RTATTR.size <= end:
        rta_len, rta_type = RTATTR.unpack_from(data, start)
        if rta_len < RTATTR.size:
            return None
        if rta_type == wanted:
            return data[start + RTATTR.size : start + rta_len]
        start += (rta_len + 3) & ~3
    return None


class RouteWatcher:
    """Records, per node, the first time each proto-81 prefix shows up in its kernel."""

    def __init__(self, namespaces: dict[str, str]) -> None:
        self._socks = {_route_socket(ns): node for node, ns in namespaces.items()}
        self.first_seen: dict[tuple[str, str], float] = {}
        self.overflows = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="route-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        socks = list(self._socks)
        while not self._stop.is_set():
            ready, _, _ = select.select(socks, [], [], 0.2)
            now = time.monotonic()
            for sock in ready:
                try:
                    data = sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                except OSError:  # ENOBUFS: events were dropped; we say so in the report
                    self.overflows += 1
                    continue
                node = self._socks[sock]
                with self._cond:
                    for prefix, _ in parse_new_routes(data):
                        self.first_seen.setdefault((node, prefix), now)
                    self._cond.notify_all()

    def wait_for(self, prefix: str, nodes: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not all((n, prefix) in self.first_seen for n in nodes):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for sock in self._socks:
            sock.close()


# -- cluster helpers ------------------------------------------------------------------------
def expected_peers(cluster: LabCluster, index: int) -> int:
    n = len(cluster.nodes)
    if cluster.spec.bgp != "reflectors":
        return n - 1
    return n - 1 if index < cluster.spec.reflectors else cluster.spec.reflectors


def read_status(cluster: LabCluster, node: str) -> dict[str, Any]:
    try:
        data = json.loads((cluster.run_dir(node) / "bgp-status.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def wait_established(cluster: LabCluster, timeout: float) -> float:
    """Seconds until every agent reports all its expected peers up."""
    start = time.monotonic()
    pending: dict[str, int] = {
        n.name: expected_peers(cluster, i) for i, n in enumerate(cluster.nodes)
    }
    while pending:
        for node, want in list(pending.items()):
            peers = read_status(cluster, node).get("peers") or []
            if sum(1 for p in peers if p.get("state") == "up") >= want:
                del pending[node]
        if not pending:
            break
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"BGP sessions not established after {timeout:.0f}s: {pending}")
        time.sleep(0.25)
    return time.monotonic() - start


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kb(root: int, children: dict[int, list[int]]) -> tuple[int, int]:
    """(VmRSS of root plus all its descendants in kB, number of processes)."""
    total, count, todo = 0, 0, [root]
    while todo:
        pid = todo.pop()
        total += _rss_kb(pid)
        count += 1
        todo.extend(children.get(pid, []))
    return total, count


def agent_rss_mb(cluster: LabCluster) -> list[float]:
    assert cluster.lab is not None
    children = _children_map()
    per_node = []
    for proc in cluster.lab.processes:
        if proc.name.startswith("tabby-node-") and proc.pid is not None:
            kb, count = tree_rss_kb(proc.pid, children)
            if count < 2:
                log(f"warning: {proc.name} has no child process (ExaBGP not running?)")
            per_node.append(kb / 1024)
    return per_node


def _stop_agents_in_parallel(cluster: LabCluster, timeout: float = 12.0) -> None:
    """SIGTERM every agent at once, SIGKILL what is left after `timeout`.

    `cluster.down()` stops processes one by one with a 10 s grace each, and agents
    currently need about that long, so a 20-node teardown would take minutes. This
    does the same steps for all agents together; `down()` then finds them gone and
    removes the rest (ExaBGP, relays, namespaces) as usual.
    """
    if cluster.lab is None:
        return
    agents = [
        p.proc for p in cluster.lab.processes if p.name.startswith("tabby-node-") and p.alive()
    ]
    for proc in agents:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p is not None and p.poll() is None for p in agents):
        time.sleep(0.1)
    left = [p for p in agents if p is not None and p.poll() is None]
    for proc in left:
        proc.kill()
        proc.wait()
    done = len(agents) - len(left)
    log(f"agents stopped: {done} by SIGTERM, {len(left)} SIGKILLed after {timeout:.0f}s")


# -- one topology ---------------------------------------------------------------------------
@dataclass
class TopologyResult:
    label: str
    nodes: int
    latencies_ms: list[float] = field(default_factory=list)
    from_blackhole_ms: list[float] = field(default_factory=list)
    missing: int = 0
    rss_mb: list[float] = field(default_factory=list)
    overflows: int = 0


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile; `inf` if there are no samples."""
    if not samples:
        return math.inf
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def run_topology(
    label: str, spec: ClusterSpec, samples: int, route_timeout: float, workdir: Path
) -> TopologyResult:
    result = TopologyResult(label, spec.nodes)
    log(f"{label}: bringing up {spec.nodes} nodes ({spec.bgp}, reflectors={spec.reflectors})")
    began = time.monotonic()
    cluster = LabCluster.up(workdir, spec)
    watcher: RouteWatcher | None = None
    try:
        log(f"{label}: agents ready after {time.monotonic() - began:.1f}s")
        took = wait_established(cluster, timeout=240)
        log(f"{label}: all BGP sessions established after {took:.1f}s more")
        watcher = RouteWatcher({n.name: n.netns for n in cluster.nodes})
        cluster.create_namespace(BENCH_NS)
        names = [n.name for n in cluster.nodes]
        # spread the claiming nodes over the cluster (reflectors and clients alike)
        step = max(1, len(names) // samples)
        claimers = [names[(i * step) % len(names)] for i in range(min(samples, len(names)))]
        for claimer in claimers:
            _one_claim(cluster, watcher, result, claimer, names, route_timeout, label)
        result.rss_mb = agent_rss_mb(cluster)
        result.overflows = watcher.overflows
    finally:
        if watcher is not None:
            watcher.close()
        log(f"{label}: tearing down")
        with _signals_deferred():
            _stop_agents_in_parallel(cluster)
            cluster.down()
    return result


def _one_claim(
    cluster: LabCluster,
    watcher: RouteWatcher,
    result: TopologyResult,
    claimer: str,
    names: list[str],
    route_timeout: float,
    label: str,
) -> None:
    t0 = 0.0
    original = cluster.cni

    def timed_cni(
        node: str, command: str, container_id: str, pod_ns: str, namespace: str, name: str
    ) -> dict[str, Any]:
        nonlocal t0
        if command == "ADD":
            t0 = time.monotonic()  # the claim is triggered by this CNI ADD
        return original(node, command, container_id, pod_ns, namespace, name)

    cluster.cni = timed_cni  # type: ignore[method-assign]
    try:
        pod = cluster.create_pod(BENCH_NS, f"claim-{claimer}", claimer)
    finally:
        del cluster.cni
    add_ms = (time.monotonic() - t0) * 1000
    block = str(ipaddress.ip_network(f"{pod.ip}/26", strict=False))
    others = [n for n in names if n != claimer]
    watcher.wait_for(block, [*others, claimer], route_timeout)
    with watcher._cond:
        seen = dict(watcher.first_seen)
    local = seen.get((claimer, block))
    got = [(seen[(n, block)] - t0) * 1000 for n in others if (n, block) in seen]
    result.latencies_ms.extend(got)
    result.missing += len(others) - len(got)
    if local is not None:
        result.from_blackhole_ms.extend(
            (seen[(n, block)] - local) * 1000 for n in others if (n, block) in seen
        )
    own = f"{(local - t0) * 1000:.0f}" if local is not None else "never"
    worst = f"{max(got):.0f}" if got else "-"
    log(
        f"{label}: {claimer} claimed {block}: CNI ADD {add_ms:.0f} ms, own blackhole "
        f"+{own} ms, {len(got)}/{len(others)} peers, slowest +{worst} ms"
    )


def summarise(result: TopologyResult) -> None:
    lat = result.latencies_ms
    print(f"\n== {result.label}: {result.nodes} nodes ==", flush=True)
    if lat:
        print(
            f"  claim (CNI ADD start) -> route in other node's kernel, {len(lat)} pairs: "
            f"p50={percentile(lat, 50):.0f} ms p99={percentile(lat, 99):.0f} ms "
            f"max={max(lat):.0f} ms mean={statistics.fmean(lat):.0f} ms"
        )
    bh = result.from_blackhole_ms
    if bh:
        print(
            f"  claimer's own blackhole route -> other node's kernel: "
            f"p50={percentile(bh, 50):.0f} ms p99={percentile(bh, 99):.0f} ms"
        )
    if result.missing:
        print(f"  MISSING: {result.missing} (node, block) pairs never got the route in time")
    if result.overflows:
        print(f"  warning: {result.overflows} netlink overflows (events may be late/missing)")
    if result.rss_mb:
        print(
            f"  RSS per node (agent + ExaBGP): mean={statistics.fmean(result.rss_mb):.1f} MB "
            f"min={min(result.rss_mb):.1f} max={max(result.rss_mb):.1f}"
        )


def p99_with_missing(result: TopologyResult | None) -> float:
    """p99 counting pairs that never converged as infinitely slow."""
    if result is None:
        return math.nan
    return percentile(result.latencies_ms + [math.inf] * result.missing, 99)


def _fmt(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if math.isinf(value) else f"{value:.0f}")


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Ignore Ctrl-C / SIGTERM while tearing down, so that teardown runs to its end."""
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mesh-nodes", type=int, default=10)
    parser.add_argument("--rr-nodes", type=int, default=20)
    parser.add_argument("--reflectors", type=int, default=2)
    parser.add_argument("--samples", type=int, default=10, help="block claims per topology")
    parser.add_argument("--route-timeout", type=float, default=30.0, help="seconds per claim")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root (it creates network namespaces)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _sigterm)
    root = Path(tempfile.mkdtemp(prefix="tabby-bgp-bench-"))
    results: dict[str, TopologyResult] = {}
    started = time.monotonic()
    try:
        mesh = ClusterSpec(nodes=args.mesh_nodes, subnets=1, bgp="mesh", encap="none")
        results["mesh"] = run_topology(
            f"mesh{args.mesh_nodes}", mesh, args.samples, args.route_timeout, root / "mesh"
        )
        summarise(results["mesh"])
        rr = ClusterSpec(
            nodes=args.rr_nodes,
            subnets=1,
            bgp="reflectors",
            reflectors=args.reflectors,
            encap="none",
        )
        label = f"rr{args.rr_nodes} ({args.reflectors} reflectors)"
        results["rr"] = run_topology(label, rr, args.samples, args.route_timeout, root / "rr")
        summarise(results["rr"])
    except KeyboardInterrupt:
        log("interrupted; clusters torn down")
        return 130
    finally:
        shutil.rmtree(root, ignore_errors=True)
    log(f"total {time.monotonic() - started:.0f}s")
    rss = [statistics.fmean(r.rss_mb) for r in results.values() if r.rss_mb]
    print(
        f"\nnodes used: mesh={args.mesh_nodes}, reflectors={args.rr_nodes} "
        f"({args.reflectors} RR + {args.rr_nodes - args.reflectors} clients); "
        "rss_per_node_mb = larger of the two topology means; goal: both p99 < 1000 ms"
    )
    print(
        f"bgp mesh10_p99_ms={_fmt(p99_with_missing(results.get('mesh')))} "
        f"rr20_p99_ms={_fmt(p99_with_missing(results.get('rr')))} "
        f"rss_per_node_mb={max(rss):.1f}"
        if rss
        else "bgp mesh10_p99_ms=nan rr20_p99_ms=nan rss_per_node_mb=nan"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
