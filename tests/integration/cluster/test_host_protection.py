"""Pods cannot reach their own node's ports, BGP's 179 included (issue 21 item 7),
nor send from an address that is not theirs (issue 20, access).

A two-node lab with real agents and ExaBGP. Before the fix a pod connected to its
node's BGP port and to any other listener in the node's namespace. Now the agents'
default endpoint-to-host action (Drop, as Calico's DefaultEndpointToHostAction)
refuses that, while the BGP sessions between the nodes stay up, routes keep carrying
pod traffic across nodes and the node's own connections to its pods (health checks)
work. With the action set to Accept the pod reaches the host port again.

Issue 40: a pod's connect to another node's 179 completed the handshake with that
node's ExaBGP. Now the pod's own node drops TCP to port 179 of every node address
(`felix.bgp_guard`) unless the operator sets TABBY_POD_TO_NODE_BGP=Allow (the rules
it leaves out: tests/unit/felix/test_bgp_guard.py).
"""

from __future__ import annotations

import ipaddress
import json
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.cluster import ClusterSpec, LabCluster, PodInfo
from tests.helpers import settles
from tests.integration.cluster.conftest import cluster_up

pytestmark = pytest.mark.integration

HOST_PORT, POD_PORT = 10250, 8080
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
except OSError as exc:
    print(exc)
    sys.exit(1)
"""
LISTEN = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("ready", flush=True)
while True:
    s.accept()[0].close()
"""


# Prints the source of every datagram it gets; the sender binds the source it claims.
UDP_SINK = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    print(s.recvfrom(64)[1][0], flush=True)
"""
UDP_SEND = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_IP, 19, 1)  # IP_TRANSPARENT: send from an address not ours
s.bind((sys.argv[1], 0))
for _ in range(5):
    s.sendto(b"x", (sys.argv[2], int(sys.argv[3])))
"""
UDP_PORT = 9999


def _connects(netns: str, address: str, port: int) -> bool:
    argv = ["ip", "netns", "exec", netns, sys.executable, "-c", CONNECT, address, str(port)]
    return subprocess.run(argv, capture_output=True, timeout=20, check=False).returncode == 0


def _listen(netns: str, address: str, port: int) -> subprocess.Popen[str]:
    argv = ["ip", "netns", "exec", netns, sys.executable, "-c", LISTEN, address, str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _bgp_up(cluster: LabCluster) -> bool:
    for node in cluster.nodes:
        path = cluster.run_dir(node.name) / "bgp-status.json"
        peers = json.loads(path.read_text())["peers"] if path.exists() else []
        if [p.get("state") for p in peers] != ["up"]:
            return False
    return True


class _Lab:
    """Two nodes, a pod on each, a listener on a host port of node1 and in pod a."""

    def __init__(self, cluster: LabCluster) -> None:
        self.cluster = cluster
        self.a: PodInfo = cluster.create_pod("x", "a", "node1", {"pod": "a"})
        self.b: PodInfo = cluster.create_pod("x", "b", "node2", {"pod": "b"})
        self.node1 = cluster.node("node1")
        self.node2 = cluster.node("node2")
        self.procs = [
            _listen(self.node1.netns, "0.0.0.0", HOST_PORT),
            _listen(self.a.netns, self.a.ip, POD_PORT),
        ]

    def pod_reaches_node(self, port: int) -> bool:
        return _connects(self.a.netns, self.node1.ip, port)

    def pod_reaches_other_nodes_bgp(self) -> bool:
        """Pod a (node1) to node2's ExaBGP, which listens on node2's address."""
        return _connects(self.a.netns, self.node2.ip, 179)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def _up(tmp_path: Path) -> Iterator[_Lab]:
    with cluster_up(tmp_path, ClusterSpec(nodes=2)) as cluster:
        lab: _Lab | None = None
        try:
            lab = _Lab(cluster)
            up = settles(lambda: _bgp_up(cluster), timeout=60.0, interval=0.5)
            assert up, "BGP sessions did not come up"
            assert settles(
                lambda: cluster.can_reach("x/a", "x/b", timeout_s=1, attempts=1),
                timeout=60.0,
                interval=0.5,
            )
            yield lab
        finally:
            if lab is not None:
                lab.close()


@pytest.fixture
def default_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Lab]:
    monkeypatch.delenv("TABBY_DEFAULT_ENDPOINT_TO_HOST_ACTION", raising=False)
    monkeypatch.delenv("TABBY_POD_TO_NODE_BGP", raising=False)
    yield from _up(tmp_path)


@pytest.fixture
def accept_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Lab]:
    monkeypatch.setenv("TABBY_DEFAULT_ENDPOINT_TO_HOST_ACTION", "Accept")
    monkeypatch.delenv("TABBY_POD_TO_NODE_BGP", raising=False)
    yield from _up(tmp_path)


def test_pod_cannot_reach_its_nodes_bgp_port_or_host_ports(default_lab: _Lab) -> None:
    lab, cluster = default_lab, default_lab.cluster
    assert not lab.pod_reaches_node(179), "pod reached its node's BGP port"
    assert not lab.pod_reaches_other_nodes_bgp(), "pod reached another node's BGP port"
    assert not lab.pod_reaches_node(HOST_PORT), "pod reached a host port of its node"
    # node to node BGP is untouched, and routes still carry pod traffic both ways
    assert _bgp_up(cluster)
    assert cluster.can_reach("x/a", "x/b") and cluster.can_reach("x/b", "x/a")
    # health checks: the node connects to its pod (TCP and ICMP)
    assert _connects(lab.node1.netns, lab.a.ip, POD_PORT)
    ping = ["ip", "netns", "exec", lab.node1.netns, "ping", "-c1", "-W2", lab.a.ip]
    assert subprocess.run(ping, capture_output=True, timeout=10, check=False).returncode == 0
    # a pod on the other node still reaches pod a's port
    assert _connects(lab.b.netns, lab.a.ip, POD_PORT)
    assert _bgp_up(cluster)


def test_with_accept_the_pod_reaches_the_host_port_but_never_bgp(accept_lab: _Lab) -> None:
    """Accept (the manifests' setting, as Calico's manifest): hostNetwork services on the
    node answer pods; Tabby's own BGP listener still does not."""
    assert accept_lab.pod_reaches_node(HOST_PORT)
    assert not accept_lab.pod_reaches_node(179), "pod reached its node's BGP port"
    assert not accept_lab.pod_reaches_other_nodes_bgp(), "pod reached another node's BGP port"
    assert _bgp_up(accept_lab.cluster)


def _send_udp(netns: str, source: str, address: str) -> None:
    argv = ["ip", "netns", "exec", netns, sys.executable, "-c", UDP_SEND, source, address]
    subprocess.run([*argv, str(UDP_PORT)], capture_output=True, timeout=20, check=True)


def test_a_pod_sending_from_a_spoofed_source_is_dropped(default_lab: _Lab) -> None:
    """Pod a claims another pool address (a pod that could exist) as its source: the
    datagram never reaches pod b on the other node; from its own address it does."""
    lab = default_lab
    spoofed = str(ipaddress.ip_address(lab.a.ip) + 7)
    argv = ["ip", "netns", "exec", lab.b.netns, sys.executable, "-c", UDP_SINK]
    sink = subprocess.Popen([*argv, lab.b.ip, str(UDP_PORT)], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
        _send_udp(lab.a.netns, spoofed, lab.b.ip)
        _send_udp(lab.a.netns, lab.a.ip, lab.b.ip)  # the marker: it arrives after any spoof
        arrived = select.select([sink.stdout], [], [], 10)[0]
        first = sink.stdout.readline().strip() if arrived else "nothing within 10 s"
    finally:
        sink.kill()
        sink.wait()
    assert first == lab.a.ip, f"pod b got a datagram from {first} (pod a spoofed {spoofed})"
