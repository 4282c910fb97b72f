"""Pods on different lab nodes reach each other through routes learned over BGP."""

from __future__ import annotations

import ipaddress
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from datastore import kinds
from lab import netns
from lab.cluster import ClusterSpec, LabCluster

PROTO_BGP = "proto 81"


@pytest.fixture
def mesh3(tmp_path: Path) -> Iterator[LabCluster]:
    cluster = LabCluster.up(tmp_path / "lab", ClusterSpec(nodes=3, subnets=1, bgp="mesh"))
    try:
        yield cluster
    finally:
        cluster.down()


def _wait(check: object, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def _block_routes(cluster: LabCluster, node: str) -> list[str]:
    out = netns.ip(cluster.node(node).netns, "route", "show", "proto", "81")
    return [line for line in out.splitlines() if not line.startswith("blackhole")]


def test_three_node_mesh_routes_pod_traffic_by_blocks_learned_over_bgp(mesh3: LabCluster) -> None:
    pods = {n.name: mesh3.create_pod("default", f"pod-{n.name}", n.name) for n in mesh3.nodes}
    # each other node's block arrives as one kernel route via that node, from BGP (proto 81)
    for node in mesh3.nodes:
        others = [n for n in mesh3.nodes if n.name != node.name]
        assert _wait(lambda node=node, others=others: len(_block_routes(mesh3, node.name)) == 2), (
            f"{node.name} routes: {_block_routes(mesh3, node.name)}"
        )
        for other in others:
            block = ipaddress.ip_network(pods[other.name].ip + "/26", strict=False)
            via = [r for r in _block_routes(mesh3, node.name) if r.startswith(str(block))]
            assert via and f"via {other.ip}" in via[0], via
    # ICMP and TCP across nodes, pod to pod
    for src in pods.values():
        for dst in pods.values():
            if src is not dst:
                assert mesh3.can_reach(src.key, dst.key), f"{src.key} -> {dst.key}"
    server = pods["node2"]
    listener = subprocess.Popen(
        ["ip", "netns", "exec", server.netns, "nc", "-l", "8080"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        client = mesh3.exec(pods["node1"].key, ["nc", "-z", "-w", "3", server.ip, "8080"])
        assert client.returncode == 0, client.stderr
    finally:
        listener.kill()
        listener.wait()


def test_a_deleted_node_takes_its_routes_out_of_every_other_kernel(mesh3: LabCluster) -> None:
    for n in mesh3.nodes:
        mesh3.create_pod("default", f"pod-{n.name}", n.name)
    assert _wait(lambda: all(len(_block_routes(mesh3, n.name)) == 2 for n in mesh3.nodes))
    gone = mesh3.node("node3")
    assert mesh3.lab is not None
    agent = next(p for p in mesh3.lab.processes if p.name == f"tabby-node-{gone.name}")
    agent.stop()  # the node goes away: its agent (and ExaBGP) stop ...
    began = time.monotonic()
    mesh3.datastore().delete_raw(kinds.NODE, gone.name)  # ... and it is deleted from the cluster
    for node in ("node1", "node2"):
        assert _wait(
            lambda node=node: all(f"via {gone.ip}" not in r for r in _block_routes(mesh3, node))
        ), node
    elapsed = time.monotonic() - began
    print(f"routes of a deleted node left both other kernels in {elapsed * 1000:.0f} ms")
    assert all(len(_block_routes(mesh3, n)) == 1 for n in ("node1", "node2"))
