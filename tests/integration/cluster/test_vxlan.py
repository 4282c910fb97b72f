"""vxlanMode CrossSubnet: encapsulated between subnets, plain routing within one."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import netns
from lab.cluster import ClusterSpec, LabCluster


@pytest.fixture
def two_subnets(tmp_path: Path) -> Iterator[LabCluster]:
    # node1 and node3 share subnet 0; node2 is on subnet 1, behind the router namespace
    spec = ClusterSpec(nodes=3, subnets=2, bgp="mesh", encap="vxlan")
    cluster = LabCluster.up(tmp_path / "lab", spec)
    try:
        yield cluster
    finally:
        cluster.down()


def _route_to(cluster: LabCluster, node: str, pod_ip: str) -> str:
    return netns.ip(cluster.node(node).netns, "route", "get", pod_ip).splitlines()[0]


def _wait_route(cluster: LabCluster, node: str, pod_ip: str, needle: str) -> str:
    deadline = time.monotonic() + 30
    route = ""
    while time.monotonic() < deadline:
        route = _route_to(cluster, node, pod_ip)
        if needle in route:
            return route
        time.sleep(0.2)
    raise AssertionError(f"{node} -> {pod_ip}: {route!r} never used {needle!r}")


def _wait_listening(capture: subprocess.Popen[str], timeout: float = 10.0) -> None:
    """Until tcpdump says it captures (a fixed sleep lost the pings on a busy machine)."""
    assert capture.stderr is not None
    lines: queue.Queue[str] = queue.Queue()
    stderr = capture.stderr
    threading.Thread(target=lambda: [lines.put(x) for x in stderr], daemon=True).start()
    deadline = time.monotonic() + timeout
    said: list[str] = []
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if "listening on" in line:
            return
        said.append(line)
    raise AssertionError(f"tcpdump did not start capturing: {''.join(said)!r}")


def _vxlan_packets_on_router(cluster: LabCluster, send: list[str], pod_netns: str) -> int:
    """Count UDP/4789 frames the router forwards while a pod pings."""
    assert cluster.lab is not None
    capture = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            cluster.lab.router,
            "tcpdump",
            "-l",
            "-n",
            "-i",
            "any",
            "-c",
            "2",
            "udp",
            "port",
            "4789",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_listening(capture)
        subprocess.run(["ip", "netns", "exec", pod_netns, *send], capture_output=True, check=False)
        out, _ = capture.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        capture.kill()
        out, _ = capture.communicate()
    return sum(1 for line in out.splitlines() if "4789" in line or "VXLAN" in line)


def test_cross_subnet_traffic_is_encapsulated_and_same_subnet_is_not(
    two_subnets: LabCluster,
) -> None:
    pods = {
        n.name: two_subnets.create_pod("default", f"p-{n.name}", n.name) for n in two_subnets.nodes
    }
    # routes: node1 -> node3 (same subnet) plain via eth0; node1 -> node2 via the VXLAN device
    # (waiting for "dev eth0" alone would also match the default route, before BGP's)
    direct = f"via {two_subnets.node('node3').ip} dev eth0"
    same = _wait_route(two_subnets, "node1", pods["node3"].ip, direct)
    assert "vxlan" not in same
    cross = _wait_route(two_subnets, "node1", pods["node2"].ip, "dev vxlan.tabby")
    assert "vxlan.tabby" in cross
    link = netns.ip(two_subnets.node("node1").netns, "-d", "link", "show", "vxlan.tabby")
    assert "vxlan id 4096" in link and "mtu 1450" in link

    for src in pods.values():
        for dst in pods.values():
            if src is not dst:
                assert two_subnets.can_reach(src.key, dst.key, attempts=3), f"{src.key}->{dst.key}"
    # on the wire: the router between the subnets carries VXLAN (UDP 4789) frames
    ping = ["ping", "-c", "3", "-i", "0.2", pods["node2"].ip]
    assert _vxlan_packets_on_router(two_subnets, ping, pods["node1"].netns) >= 1
