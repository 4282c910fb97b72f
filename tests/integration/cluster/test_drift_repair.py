"""Drift on a node is repaired by the agent's next resync, whatever was changed by hand.

Someone (or something) on a node deletes a pod's /32 route, turns a pod veth's
``proxy_arp`` off and deletes the VXLAN route to another node's block. The agent's
periodic resync re-reads the kernel and puts each back: the pod route and the
sysctl from its endpoint table (``CNIHandlers.repair``), the tunnel route from the
routes BGP learned (``BGPController.resync``). Each must be back within one resync
period of the change (plus the time of one pass), and traffic must flow again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from felix.wiring import host_ifname_for
from lab import netns
from lab.cluster import ClusterSpec, LabCluster

RESYNC_S = 5.0
# One pass after the resync timer fires, on a loaded 2-core machine (a pass takes
# well under a second here; the margin is for the machine, not for the agent).
PASS_ALLOWANCE_S = 10.0
SETTLE_S = 60.0  # the lab's first routes and pods


@pytest.fixture
def vxlan_pair(tmp_path: Path) -> Iterator[LabCluster]:
    """Two nodes on two subnets, so traffic between them goes through VXLAN."""
    spec = ClusterSpec(nodes=2, subnets=2, encap="vxlan", resync_interval_s=RESYNC_S)
    cluster = LabCluster.up(tmp_path / "lab", spec)
    try:
        yield cluster
    finally:
        cluster.down()


def _until(condition: Callable[[], bool], timeout: float, what: str, since: float) -> float:
    """Seconds from ``since`` until the condition held; fails after ``timeout`` from it."""
    while not condition():
        if time.monotonic() - since > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.1)
    return time.monotonic() - since


def _sysctl(ns: str, key: str, value: str | None = None) -> str:
    path = f"/proc/sys/net/{key}"
    if value is not None:
        netns.ns_exec(ns, ["sh", "-c", f"echo {value} > {path}"])
    return netns.ns_exec(ns, ["cat", path]).strip()


def test_a_deleted_pod_route_a_flipped_sysctl_and_a_deleted_tunnel_route_are_repaired(
    vxlan_pair: LabCluster,
) -> None:
    local = vxlan_pair.create_pod("default", "local", "node1")
    remote = vxlan_pair.create_pod("default", "remote", "node2")
    node_ns = vxlan_pair.node("node1").netns
    host = host_ifname_for("default", "local")

    def tunnel_routes() -> list[str]:
        return netns.ip(node_ns, "route", "show", "dev", "vxlan.tabby").splitlines()

    _until(lambda: bool(tunnel_routes()), SETTLE_S, "node1's VXLAN route", time.monotonic())
    assert vxlan_pair.can_reach(local.key, remote.key, attempts=5), "before any drift"
    tunnel = tunnel_routes()[0].split()[0]

    netns.ip(node_ns, "route", "del", f"{local.ip}/32")
    assert _sysctl(node_ns, f"ipv4/conf/{host}/proxy_arp", "0") == "0"
    netns.ip(node_ns, "route", "del", tunnel, "dev", "vxlan.tabby")
    assert all(r.split()[0] != tunnel for r in tunnel_routes())
    changed = time.monotonic()

    within = RESYNC_S + PASS_ALLOWANCE_S
    took = {
        "pod route": _until(
            lambda: "proto 80" in netns.ip(node_ns, "route", "show", f"{local.ip}/32"),
            within,
            f"route {local.ip}/32 back",
            changed,
        ),
        "proxy_arp": _until(
            lambda: _sysctl(node_ns, f"ipv4/conf/{host}/proxy_arp") == "1",
            within,
            f"proxy_arp of {host} back",
            changed,
        ),
        "tunnel route": _until(
            lambda: any(r.split()[0] == tunnel for r in tunnel_routes()),
            within,
            f"tunnel route {tunnel} back",
            changed,
        ),
    }
    print("repaired after (s):", {k: round(v, 1) for k, v in took.items()})
    netns.ip(local.netns, "neigh", "flush", "all")  # the gateway is resolved again
    assert vxlan_pair.can_reach(local.key, remote.key, attempts=5), f"after repair {took}"
