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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from bgp import annotations as ann
from bgp.config import RenderOptions
from bgp.controller import BGPController, BGPInputs
from bgp.kernel import iproute_factory
from bgp.routes import PROTO_BGP
from bgp.speaker import Speaker, SpeakerOptions
from datastore.models import BGPConfiguration, BGPPeer, BlockAffinity
from tabbyctl.node import node as node_cmd
from tests.helpers import wait_for
from tests.integration.bgp.bgp_netns import Lab

pytestmark = pytest.mark.integration

N = ipaddress.IPv4Network


def node(name: str, address: str, **extra: str) -> dict[str, Any]:
    annotations = {ann.IPV4_ADDRESS: address, **extra}
    return {"metadata": {"name": name, "annotations": annotations, "labels": {}}}


def affinity(cidr: str, node_name: str) -> BlockAffinity:
    return BlockAffinity.model_validate(
        {
            "metadata": {"name": f"{node_name}-{cidr.replace('/', '-')}"},
            "spec": {"cidr": cidr, "node": node_name, "state": "confirmed"},
        }
    )


@dataclass
class Agent:
    """The BGP half of one node agent, as the agent wires it (BGPController)."""

    name: str
    ns: str
    controller: BGPController
    inputs: BGPInputs

    @property
    def speaker(self) -> Speaker:
        assert self.controller.speaker is not None
        return self.controller.speaker

    def kernel(self) -> set[str]:
        return {str(r) for r in self.controller.routes.read()}

    def update(self, **changes: Any) -> None:
        self.inputs = replace(self.inputs, **changes)
        self.controller.update(self.inputs)


def start_agent(
    lab: Lab,
    tmp: Path,
    name: str,
    *,
    nodes: list[dict[str, Any]],
    blocks: list[str],
    peers: list[BGPPeer] | None = None,
    restart_time: int | None = 3,
    config: BGPConfiguration | None = None,
    passwords: dict[str, str] | None = None,
) -> Agent:
    """One node's BGP; a short graceful-restart time keeps the tests quick."""
    ns = lab.ns(name)
    options = SpeakerOptions(
        workdir=tmp / name,
        command_prefix=("ip", "netns", "exec", ns),
        status_file=tmp / name / "bgp-status.json",
        backoff_initial=0.2,
        render=RenderOptions(graceful_restart=restart_time),
    )
    controller = BGPController(name, options, iproute_factory(ns))
    inputs = BGPInputs(
        config=config,
        nodes=nodes,
        peers=peers or [],
        affinities=[affinity(b, name) for b in blocks],
        passwords=passwords or {},
    )
    agent = Agent(name, ns, controller, inputs)
    controller.update(inputs)
    assert controller.speaker is not None
    lab.speakers.append(controller.speaker)
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
    cli = CliRunner().invoke(
        click.Group(commands={"node": node_cmd}),
        ["node", "status", "--status-file", str(tmp_path / "b" / "bgp-status.json")],
    )
    assert cli.exit_code == 0, cli.output
    assert cli.output.startswith("Tabby process is running.")
    row = next(line for line in cli.output.splitlines() if "10.99.0.1" in line)
    assert [c.strip() for c in row.strip("│").split("│")][1:3] == ["node-to-node mesh", "up"]

    # drift: someone deletes our route; the next resync puts it back
    # (no check that it is gone: a pass the speaker runs meanwhile may already repair it)
    subprocess.run(["ip", "-n", b.ns, "route", "del", "10.244.1.0/26"], check=True)
    result = b.controller.resync().routes
    # restored by this resync, or by a pass the speaker ran meanwhile (both are resyncs)
    assert via_a in b.kernel()
    assert not result.errors and not result.conflicts

    # a loses its block: withdrawn, gone from b's kernel (and a's blackhole goes too)
    a.update(affinities=[])
    wait_for(lambda: via_a not in b.kernel(), what="withdraw to reach b's kernel")
    assert not any("blackhole" in r for r in a.kernel())
    a.update(affinities=[affinity("10.244.1.0/26", "a"), affinity("10.244.1.64/26", "a")])
    wait_for(lambda: via_a in b.kernel(), what="re-announce")
    wait_for(lambda: "10.244.1.64/26 via 10.99.0.1 proto 81" in b.kernel(), what="second block")

    # a's ExaBGP stops for good: b gets only a `down` (no withdraws). a offered graceful
    # restart (3 s here), so b keeps both routes as stale, then drops them at the deadline.
    a.speaker.stop()
    wait_for(lambda: b.speaker.status_document()["peers"][0]["state"] == "start", what="down")
    assert b.speaker.status_document()["peers"][0]["staleRoutes"] == 2
    assert via_a in b.kernel()
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
    samples: list[bool] = []

    def b_session_back() -> bool:
        samples.append(via_a in b.kernel())
        peer = b.speaker.status_document()["peers"][0]
        return peer["sessions"] == 2 and peer["staleRoutes"] == 0 and peer["routesReceived"] == 1

    os.killpg(first_pid, signal.SIGKILL)
    # graceful restart: b keeps a's route while the supervisor restarts a's ExaBGP, and
    # after the new session and End-of-RIB nothing is stale any more
    wait_for(b_session_back, timeout=40, what="a's session back at b, routes fresh")
    assert all(samples), samples
    assert a.speaker.restarts == 1
    assert a.speaker.pid not in (None, first_pid)
    # a's new ExaBGP learns b's block over the new session a moment after b sees it up
    # (a CI run once checked in between: only a's own blackhole was there yet).
    via_b = "10.244.2.0/26 via 10.99.0.2 proto 81"
    wait_for(lambda: via_b in a.kernel(), timeout=20, what="a to install b's block again")


def test_without_graceful_restart_a_dead_peers_routes_go_at_once(lab: Lab, tmp_path: Path) -> None:
    lab.add_node("a", 1)
    lab.add_node("b", 2)
    nodes = two_nodes()
    a = start_agent(lab, tmp_path, "a", nodes=nodes, blocks=["10.244.1.0/26"], restart_time=None)
    b = start_agent(lab, tmp_path, "b", nodes=nodes, blocks=["10.244.2.0/26"], restart_time=None)
    via_a = "10.244.1.0/26 via 10.99.0.1 proto 81"
    wait_for(lambda: via_a in b.kernel(), what="b to install a's block")
    a.speaker.stop()  # no supervisor restart racing with the check below
    wait_for(lambda: via_a not in b.kernel(), timeout=5, what="b to drop a's routes")
    assert b.speaker.status_document()["peers"][0]["staleRoutes"] == 0


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


def test_node_joining_later_gets_routes_after_reload(lab: Lab, tmp_path: Path) -> None:
    """a starts alone (no neighbors); b joins: SIGUSR1 reload, replay to the new peer."""
    lab.add_node("a", 1)
    lab.add_node("b", 2)
    alone = [node("a", "10.99.0.1/24")]
    a = start_agent(lab, tmp_path, "a", nodes=alone, blocks=["10.244.1.0/26"])
    wait_for(lambda: a.speaker.pid is not None, what="a's ExaBGP to run")
    assert a.speaker.status_document()["peers"] == []

    both = two_nodes()
    b = start_agent(lab, tmp_path, "b", nodes=both, blocks=["10.244.2.0/26"])
    a.update(nodes=both)
    assert "neighbor 10.99.0.2" in (tmp_path / "a" / "exabgp.conf").read_text()
    wait_for(lambda: "10.244.1.0/26 via 10.99.0.1 proto 81" in b.kernel(), what="a's block at b")
    wait_for(lambda: "10.244.2.0/26 via 10.99.0.2 proto 81" in a.kernel(), what="b's block at a")

    # b leaves the cluster: a drops the neighbor and its routes
    a.update(nodes=alone)
    wait_for(lambda: "10.244.2.0/26 via 10.99.0.2 proto 81" not in a.kernel(), what="b removed")
    assert "neighbor 10.99.0.2" not in (tmp_path / "a" / "exabgp.conf").read_text()


def test_agent_restart_changes_no_route(lab: Lab, tmp_path: Path) -> None:
    """b's agent stops and a new one starts: routes stay in both kernels throughout."""
    lab.add_node("a", 1)
    lab.add_node("b", 2)
    nodes = two_nodes()
    a = start_agent(lab, tmp_path, "a", nodes=nodes, blocks=["10.244.1.0/26"], restart_time=30)
    b = start_agent(lab, tmp_path, "b", nodes=nodes, blocks=["10.244.2.0/26"], restart_time=30)
    at_b = "10.244.1.0/26 via 10.99.0.1 proto 81"
    at_a = "10.244.2.0/26 via 10.99.0.2 proto 81"
    wait_for(lambda: at_b in b.kernel() and at_a in a.kernel(), what="both routes")

    samples: list[tuple[bool, bool]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((at_b in b.kernel(), at_a in a.kernel()))
            done.wait(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        b.controller.stop()
        restarted = start_agent(
            lab, tmp_path, "b", nodes=nodes, blocks=["10.244.2.0/26"], restart_time=30
        )
        assert not restarted.speaker.synced()  # nothing pruned before BGP caught up
        wait_for(restarted.speaker.synced, what="the new agent to sync")
        wait_for(
            lambda: a.speaker.status_document()["peers"][0]["staleRoutes"] == 0,
            what="a to see b's routes fresh again",
        )
    finally:
        done.set()
        sampler.join()
    assert len(samples) >= 3  # each sample opens netlink in two namespaces: slow-ish
    assert all(ok_b and ok_a for ok_b, ok_a in samples), samples
    assert at_b in restarted.kernel()


def test_a_change_while_exabgp_starts_is_applied_without_killing_it(
    lab: Lab, tmp_path: Path
) -> None:
    """A peer added while ExaBGP is still starting (as at every agent start: the Nodes
    arrive right after) is a reload owed, not a SIGUSR1 into a process whose handler
    is not installed yet, which killed it (-10) and cost a restart."""
    lab.add_node("a", 1)
    lab.add_node("b", 2)
    a = start_agent(lab, tmp_path, "a", nodes=[node("a", "10.99.0.1/24")], blocks=["10.244.1.0/26"])
    wait_for(lambda: a.speaker.pid is not None, what="a's ExaBGP started")
    a.update(nodes=two_nodes())  # at once: a's ExaBGP is still importing
    b = start_agent(lab, tmp_path, "b", nodes=two_nodes(), blocks=["10.244.2.0/26"])
    wait_for(lambda: "10.244.1.0/26 via 10.99.0.1 proto 81" in b.kernel(), what="a's block at b")
    wait_for(lambda: "10.244.2.0/26 via 10.99.0.2 proto 81" in a.kernel(), what="b's block at a")
    assert a.speaker.restarts == 0, (tmp_path / "a" / "exabgp.log").read_text()[-2000:]
