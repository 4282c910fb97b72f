"""BIRD 2 as the route reflector of Tabby nodes (node-to-node mesh off, BGPPeer objects).

BIRD runs in a lab namespace of its own on the nodes' subnet, with `rr client` for
every node; each node has one BGP session (to BIRD), yet learns every other node's
block through it, with the originating node kept as next hop.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from datastore.models import BGPPeer
from lab import netns
from lab.cluster import ClusterSpec, LabCluster, PodInfo
from lab.topology import Node

NODES = 3
BIRD_CLUSTER_ID = "244.0.0.9"

BIRD_HEAD = """\
router id {router_id};
protocol device {{}}
protocol direct {{ ipv4; interface "eth0"; }}
template bgp tabby_client {{
  local {router_id} as 64512;
  rr client;
  rr cluster id {cluster_id};
  hold time 30;
  ipv4 {{ import all; export all; }};
}}
"""
BIRD_CLIENT = "protocol bgp {name} from tabby_client {{ neighbor {ip} as 64512; }}\n"


def bird_config(reflector: Node, clients: list[Node]) -> str:
    head = BIRD_HEAD.format(router_id=reflector.ip, cluster_id=BIRD_CLUSTER_ID)
    return head + "".join(BIRD_CLIENT.format(name=n.name, ip=n.ip) for n in clients)


@pytest.fixture
def bird_rr(tmp_path: Path) -> Iterator[tuple[LabCluster, Node]]:
    if shutil.which("bird") is None or shutil.which("birdc") is None:
        pytest.skip("bird2 (bird, birdc) is not installed")
    # bgp="none": neither mesh nor Tabby reflectors; the BGPPeer below is the only peering
    cluster = LabCluster.up(tmp_path / "lab", ClusterSpec(nodes=NODES, bgp="none"))
    try:
        assert cluster.lab is not None
        reflector = cluster.lab.add_host("bird")
        conf = tmp_path / "bird.conf"
        conf.write_text(bird_config(reflector, cluster.nodes))
        control = tmp_path / "bird.ctl"
        argv = ["bird", "-f", "-c", str(conf), "-s", str(control), "-P", str(tmp_path / "pid")]
        cluster.lab.start_process("bird", reflector, argv)
        peer = {
            "metadata": {"name": "bird-rr"},
            "spec": {"peerIP": reflector.ip, "asNumber": 64512},
        }
        cluster.datastore().create(BGPPeer.model_validate(peer))
        yield cluster, reflector
    finally:
        cluster.down()


def _peers(cluster: LabCluster, node: str) -> list[dict[str, object]]:
    path = cluster.run_dir(node) / "bgp-status.json"
    try:
        peers: list[dict[str, object]] = json.loads(path.read_text())["peers"]
    except (OSError, ValueError, KeyError):
        return []
    return peers


def _wait(check: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def _bgp_routes(cluster: LabCluster, node: str) -> list[str]:
    out = netns.ip(cluster.node(node).netns, "route", "show", "proto", "81")
    return [line for line in out.splitlines() if not line.startswith("blackhole")]


def _block(pod: PodInfo) -> str:
    octets = pod.ip.split(".")
    return ".".join([*octets[:3], str(int(octets[3]) & ~63)]) + "/26"


def test_bird_reflects_between_tabby_nodes(bird_rr: tuple[LabCluster, Node]) -> None:
    cluster, reflector = bird_rr
    pods = {n.name: cluster.create_pod("default", f"pod-{n.name}", n.name) for n in cluster.nodes}

    # one session per node, to BIRD, as a global BGPPeer
    for node in cluster.nodes:
        assert _wait(
            lambda node=node: [p.get("state") for p in _peers(cluster, node.name)] == ["up"]
        )
        peers = _peers(cluster, node.name)
        assert [(p["address"], p["type"]) for p in peers] == [(reflector.ip, "global")], peers

    # every other node's block arrives through BIRD, next hop kept on the originating node
    for node in cluster.nodes:
        others = [n for n in cluster.nodes if n is not node]
        expected = {f"{_block(pods[o.name])} via {o.ip}" for o in others}

        def learned(node: Node = node, expected: set[str] = expected) -> bool:
            return {" ".join(r.split()[:3]) for r in _bgp_routes(cluster, node.name)} == expected

        assert _wait(learned), f"{node.name}: {_bgp_routes(cluster, node.name)}"
    birdc = ["birdc", "-s", str(Path(cluster.workdir).parent / "bird.ctl"), "show", "route"]
    shown = netns.ns_exec(reflector.netns, birdc)
    assert all(_block(p) in shown for p in pods.values()), shown

    # pods reach each other across nodes: ICMP both ways, and TCP
    for src in pods.values():
        for dst in pods.values():
            if src is not dst:
                assert cluster.can_reach(src.key, dst.key, attempts=5), f"{src.key} -> {dst.key}"
    _assert_tcp(cluster, pods["node1"], pods["node3"])


def _assert_tcp(cluster: LabCluster, client: PodInfo, server: PodInfo) -> None:
    listener = subprocess.Popen(
        ["ip", "netns", "exec", server.netns, "nc", "-l", "8080"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        connected = _wait(
            lambda: (
                cluster.exec(client.key, ["nc", "-z", "-w", "2", server.ip, "8080"]).returncode == 0
            ),
            timeout=15,
        )
        assert connected, f"TCP {client.key} -> {server.ip}:8080"
    finally:
        listener.kill()
        listener.wait()
