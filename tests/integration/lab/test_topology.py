"""The network-namespace lab: nodes on subnets, a router, the apiserver relay, cleanup."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lab import netns
from lab.controlplane import ControlPlane
from lab.topology import PREFIX, STATE_ROOT, Lab, cleanup_stale

REPO = Path(__file__).resolve().parents[3]


def _ping(lab: Lab, src: str, dst: str) -> bool:
    out = subprocess.run(
        ["ip", "netns", "exec", lab.node(src).netns, "ping", "-c1", "-W2", lab.node(dst).ip],
        capture_output=True,
        check=False,
    )
    return out.returncode == 0


def test_nodes_on_two_subnets_reach_each_other_through_the_router() -> None:
    lab = Lab.create(nodes=3, subnets=2)
    try:
        assert [n.subnet_index for n in lab.nodes] == [0, 1, 0]
        assert lab.node("node1").address.network != lab.node("node2").address.network
        assert _ping(lab, "node1", "node3")  # same subnet, via the bridge
        assert _ping(lab, "node1", "node2")  # other subnet, via the router namespace
        routes = netns.ip(lab.router, "route", "show")
        assert "172.31.0.0/24" in routes and "172.31.1.0/24" in routes
        forwarding = netns.ns_exec(lab.node("node1").netns, ["sysctl", "-n", "net.ipv4.ip_forward"])
        assert forwarding.strip() == "1"
        assert all(name.startswith(f"{PREFIX}{lab.lab_id}-") for name in lab.namespaces())
    finally:
        lab.teardown()
    assert lab.namespaces() == []
    assert not (STATE_ROOT / lab.lab_id).exists()


def test_node_namespace_reaches_the_apiserver_through_the_unix_socket_relay(
    control_plane: ControlPlane,
) -> None:
    lab = Lab.create(nodes=1)
    try:
        node = lab.node("node1")
        sock = control_plane.expose_unix_socket()
        relay = lab.relay_apiserver(node, sock, control_plane.apiserver_port)
        probe = (
            "import time\nfrom datastore.client import Datastore\n"
            "from datastore.models import IPPool\n"
            f"ds = Datastore.from_kubeconfig({str(control_plane.kubeconfig)!r})\n"
            "for _ in range(50):\n"
            "    try:\n        print(len(ds.list(IPPool))); break\n"
            "    except Exception: time.sleep(0.1)\n"
        )
        out = netns.ns_exec(node.netns, [sys.executable, "-c", probe], timeout=60)
        assert out.strip().isdigit(), out
        assert relay.alive()
        # the node's default route leads to the lab's router, never to the host
        assert f"default via {lab.gateway(0)}" in netns.ip(node.netns, "route", "show")
    finally:
        lab.teardown()


def test_a_crashed_runs_lab_is_removed_by_the_next_run() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    lab = Lab.create(nodes=2, owner_pid=dead.pid)  # as if its owner crashed
    sleeper = lab.start_process("sleeper", lab.node("node1"), ["sleep", "300"])
    sleeper.proc = None  # the crashed owner can no longer stop it itself
    assert len(lab.namespaces()) == 4  # underlay, router, two nodes
    removed = cleanup_stale()
    assert lab.lab_id in removed
    assert lab.namespaces() == []
    assert not (STATE_ROOT / lab.lab_id).exists()
