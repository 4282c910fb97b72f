"""Real ExaBGP speakers in network namespaces: sessions, learned routes, kernel routes.

Each node is a namespace on one bridge; the test process runs the agent side
(Speaker + RouteManager) for each node, and ExaBGP runs inside the namespace via
`ip netns exec`. Kernel routes are written with pyroute2 into that namespace only.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bgp import annotations as ann
from bgp.config import BGPPlan, compute_plan
from bgp.kernel import RouteManager, iproute_factory
from bgp.messages import LearnedRoute
from bgp.nodes import parse_nodes
from bgp.routes import PROTO_BGP, RouteContext, desired_dataplane
from bgp.speaker import Speaker, SpeakerOptions
from datastore.models import BGPConfiguration, BGPPeer
from tests.integration.bgp.bgp_netns import Lab, wait_for

pytestmark = pytest.mark.integration

N = ipaddress.IPv4Network


def node(name: str, address: str, **extra: str) -> dict[str, Any]:
    annotations = {ann.IPV4_ADDRESS: address, **extra}
    return {"metadata": {"name": name, "annotations": annotations, "labels": {}}}


@dataclass
class Agent:
    """The BGP half of one node agent: speaker → desired routes → kernel."""

    name: str
    ns: str
    routes: RouteManager
    ctx: RouteContext
    speaker: Speaker = field(init=False)
    applied: list[list[LearnedRoute]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def program(self, learned: list[LearnedRoute]) -> None:
        with self.lock:
            self.applied.append(learned)
            self.routes.set_desired(desired_dataplane(self.ctx, learned).routes)
            self.routes.apply()

    def kernel(self) -> set[str]:
        return {str(r) for r in self.routes.read()}


def start_agent(
    lab: Lab,
    tmp: Path,
    name: str,
    *,
    nodes: list[dict[str, Any]],
    blocks: list[str],
    peers: list[BGPPeer] | None = None,
) -> Agent:
    plan = compute_plan(
        BGPConfiguration.model_validate({"metadata": {"name": "default"}}), nodes, peers or [], name
    )
    assert isinstance(plan, BGPPlan)
    ns = lab.ns(name)
    facts = parse_nodes(nodes)
    own = frozenset(N(b) for b in blocks)
    ctx = RouteContext(me=facts[name], own_blocks=own, nodes=facts)
    manager = RouteManager(iproute_factory(ns))
    options = SpeakerOptions(
        workdir=tmp / name,
        command_prefix=("ip", "netns", "exec", ns),
        status_file=tmp / name / "bgp-status.json",
        backoff_initial=0.2,
    )
    agent = Agent(name, ns, manager, ctx)
    speaker = Speaker(plan, options, on_routes=agent.program)
    agent.speaker = speaker
    lab.speakers.append(speaker)
    agent.program([])  # blackholes for own blocks before any session
    speaker.announce(own)
    speaker.start()
    return agent


def two_nodes() -> list[dict[str, Any]]:
    return [node("a", "10.99.0.1/24"), node("b", "10.99.0.2/24")]


def test_mesh_routes_reach_the_other_kernel_and_leave_when_the_peer_dies(
    lab: Lab, tmp_path: Path
) -> None:
    lab.add_node("a", 1)
    lab.add_node("b", 2)
    nodes = two_nodes()
    a = start_agent(lab, tmp_path, "a", nodes=nodes, blocks=["10.244.1.0/26"])
    b = start_agent(lab, tmp_path, "b", nodes=nodes, blocks=["10.244.2.0/26"])

    # an unrelated route of another protocol must survive everything below
    subprocess.run(
        ["ip", "-n", b.ns, "route", "add", "10.250.0.0/24", "via", "10.99.0.1", "proto", "static"],
        check=True,
    )
    via_a = f"10.244.1.0/26 via 10.99.0.1 proto {PROTO_BGP}"
    wait_for(lambda: via_a in b.kernel(), what="b to install a's block")
    wait_for(lambda: "10.244.2.0/26 via 10.99.0.2 proto 81" in a.kernel(), what="a learns b")
    assert f"blackhole 10.244.2.0/26 proto {PROTO_BGP}" in b.kernel()
    assert "10.244.1.0/26 via 10.99.0.1 dev eth0 proto 81" in lab.routes(b.ns)
    learned = b.speaker.learned_routes()
    assert [(str(r.prefix), str(r.next_hop)) for r in learned] == [("10.244.1.0/26", "10.99.0.1")]

    # the status file says the session is up
    doc = b.speaker.status_document()
    assert doc["peers"][0]["address"] == "10.99.0.1"
    assert doc["peers"][0]["state"] == "up"
    assert doc["peers"][0]["type"] == "node-to-node mesh"

    # drift: someone deletes our route; the next resync puts it back
    subprocess.run(["ip", "-n", b.ns, "route", "del", "10.244.1.0/26"], check=True)
    assert via_a not in b.kernel()
    result = b.routes.apply()
    assert [str(r.dst) for r in result.added] == ["10.244.1.0/26"]
    assert via_a in b.kernel()

    # a withdraws its block: gone from b's kernel
    a.speaker.announce([])
    wait_for(lambda: via_a not in b.kernel(), what="withdraw to reach b's kernel")
    a.speaker.announce([N("10.244.1.0/26"), N("10.244.1.64/26")])
    wait_for(lambda: via_a in b.kernel(), what="re-announce")
    wait_for(lambda: "10.244.1.64/26 via 10.99.0.1 proto 81" in b.kernel(), what="second block")

    # a's ExaBGP stops for good: b gets only a `down` (no withdraws) and must drop both
    a.speaker.stop()
    wait_for(lambda: not any("via 10.99.0.1" in r for r in b.kernel()), what="routes dropped")
    assert f"blackhole 10.244.2.0/26 proto {PROTO_BGP}" in b.kernel()
    assert "10.250.0.0/24 via 10.99.0.1 dev eth0 proto static" in lab.routes(b.ns)
    wait_for(lambda: b.speaker.status_document()["peers"][0]["state"] == "start", what="down")


def test_speaker_killed_is_restarted_and_routes_come_back(lab: Lab, tmp_path: Path) -> None:
    lab.add_node("a", 1)
    lab.add_node("b", 2)
    nodes = two_nodes()
    a = start_agent(lab, tmp_path, "a", nodes=nodes, blocks=["10.244.1.0/26"])
    b = start_agent(lab, tmp_path, "b", nodes=nodes, blocks=["10.244.2.0/26"])
    via_a = "10.244.1.0/26 via 10.99.0.1 proto 81"
    wait_for(lambda: via_a in b.kernel(), what="b to install a's block")

    first_pid = a.speaker.pid
    assert first_pid is not None
    os.killpg(first_pid, signal.SIGKILL)
    wait_for(lambda: via_a not in b.kernel(), timeout=10, what="b to drop a's routes")
    wait_for(lambda: a.speaker.restarts >= 1, what="supervisor restart")
    wait_for(lambda: via_a in b.kernel(), timeout=40, what="routes back after restart")
    assert a.speaker.pid not in (None, first_pid)
    wait_for(lambda: "10.244.2.0/26 via 10.99.0.2 proto 81" in a.kernel(), what="a relearns b")


def test_route_reflector_reflects_between_clients(lab: Lab, tmp_path: Path) -> None:
    """c is a reflector; a and b only peer with c yet learn each other's blocks."""
    lab.add_node("a", 1)
    lab.add_node("b", 2)
    lab.add_node("c", 3)
    nodes = [
        node("a", "10.99.0.1/24"),
        node("b", "10.99.0.2/24"),
        node("c", "10.99.0.3/24", **{ann.RR_CLUSTER_ID: "244.0.0.1"}),
    ]
    a = start_agent(lab, tmp_path, "a", nodes=nodes, blocks=["10.244.1.0/26"])
    b = start_agent(lab, tmp_path, "b", nodes=nodes, blocks=["10.244.2.0/26"])
    c = start_agent(lab, tmp_path, "c", nodes=nodes, blocks=["10.244.3.0/26"])
    assert [str(p) for p in a.speaker.core.peers] == ["10.99.0.3"]

    wait_for(lambda: "10.244.2.0/26 via 10.99.0.2 proto 81" in a.kernel(), what="b via c at a")
    wait_for(lambda: "10.244.1.0/26 via 10.99.0.1 proto 81" in b.kernel(), what="a via c at b")
    assert "10.244.3.0/26 via 10.99.0.3 proto 81" in a.kernel()
    reflected = next(r for r in a.speaker.learned_routes() if str(r.prefix) == "10.244.2.0/26")
    assert str(reflected.originator_id) == "10.99.0.2"
    assert reflected.cluster_list == ("244.0.0.1",)
    assert str(reflected.peer) == "10.99.0.3"
    assert {"10.244.1.0/26 via 10.99.0.1 proto 81", "10.244.2.0/26 via 10.99.0.2 proto 81"} <= (
        c.kernel()
    )

    # b dies: the reflector withdraws b's block from a explicitly
    b.speaker.stop()
    wait_for(lambda: "10.244.2.0/26 via 10.99.0.2 proto 81" not in a.kernel(), what="withdraw")
