"""`kill -9` of tabby-node must not orphan its ExaBGP; /readyz follows BGP as it changes.

Issue 21 item 2 and item 10 (readiness lag), as an operator meets them: the real agent
(BGP on) in lab node 1, a BGP peer in lab node 2 (the agent's BGP half, real ExaBGP,
run from the test), the real apiserver. The agent is SIGKILLed and started again:
its ExaBGP must go with it (parent-death signal), or, when a speaker survived anyway
(an agent that could not set that signal), the next agent must stop it through its
pidfile, never a process the pidfile merely names. Then the session is Established
again within seconds and a block claimed after the restart reaches the peer.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bgp.controller import BGPController, BGPInputs
from bgp.kernel import iproute_factory
from bgp.speaker import SpeakerOptions
from datastore import kinds
from datastore.client import Datastore
from ipam.allocator import IPAMAllocator
from lab import netns
from lab.controlplane import ControlPlane
from lab.process import ManagedProcess
from lab.topology import Lab, Node
from tests.helpers import wait_for
from tests.integration.agent.conftest import (
    TABBY_NODE,
    _delete_pool_data,
    agent_args,
    create_pool,
    ensure_node,
    start_agent,
)

pytestmark = pytest.mark.integration

TAKEOVER_S = 20.0  # kill -9 -> the next agent's session Established
READY_LAG_S = 8.0  # a BGP state change -> /readyz says so (resync is 300 s here)
RESULTS = Path(os.environ.get("TABBY_TAKEOVER_LOG", "/tmp/tabby-bgp-takeover.jsonl"))

# An agent as on today's main: the same code, but its ExaBGP gets no parent-death
# signal, so a SIGKILL leaves it running (what the pidfile check is for).
NO_PDEATHSIG = """
import dataclasses, sys
from felix import agent
_Options = agent.SpeakerOptions
if "parent_death_signal" in {f.name for f in dataclasses.fields(_Options)}:
    agent.SpeakerOptions = lambda **kw: _Options(parent_death_signal=None, **kw)
raise SystemExit(agent.main(sys.argv[1:]))
"""


@dataclass
class Pair:
    """tabby-node on node 1 (restartable), its BGP peer on node 2."""

    lab: Lab
    ds: Datastore
    node: Node
    node_name: str
    run_dir: Path
    args: list[str]
    peer: BGPController
    agent: ManagedProcess | None = None
    starts: int = 0
    extra: list[ManagedProcess] = field(default_factory=list)

    def start_agent(self, stand_in: str | None = None) -> ManagedProcess:
        self.starts += 1
        argv = [sys.executable, "-c", stand_in] if stand_in else [str(TABBY_NODE)]
        proc = start_agent(
            self.lab,
            self.node,
            f"tabby-node-{self.starts}",
            [*argv, *self.args],
            self.run_dir / "cni.sock",
        )
        self.agent = proc
        return proc

    def kill_agent(self) -> None:
        assert self.agent is not None and self.agent.proc is not None
        self.agent.proc.send_signal(signal.SIGKILL)
        self.agent.proc.wait(timeout=10)

    def bgp_status(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.run_dir / "bgp-status.json").read_text()))
        except (OSError, ValueError):
            return {}

    def established(self) -> bool:
        """The agent's own status file shows its one peer up, written by a live agent."""
        doc = self.bgp_status()
        peers = doc.get("peers") or []
        agent_pid = self.agent.pid if self.agent else None
        return doc.get("agentPid") == agent_pid and len(peers) == 1 and peers[0]["state"] == "up"

    def readyz(self) -> int:
        out = netns.ns_exec(
            self.node.netns,
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:9099/readyz"],
            check=False,
        )
        return int(out.strip() or 0)

    def peer_learned(self) -> set[ipaddress.IPv4Network]:
        speaker = self.peer.speaker
        return {r.prefix for r in speaker.learned_routes()} if speaker else set()

    def peer_up(self) -> bool:
        speaker = self.peer.speaker
        peers = speaker.status_document()["peers"] if speaker else []
        return len(peers) == 1 and peers[0]["state"] == "up"

    def claim_block(self) -> ipaddress.IPv4Network:
        """A new block for node 1, claimed as its own allocator would (not via the agent)."""
        allocator = IPAMAllocator(self.ds, self.node_name)
        try:
            address = allocator.auto_assign(f"takeover-{uuid.uuid4().hex[:8]}", {}, num=1)[0]
        finally:
            allocator.close()
        return ipaddress.IPv4Network(f"{address}/26", strict=False)


def process_start_time(pid: int) -> int | None:
    """A live process's start time (clock ticks since boot); None once gone or a zombie.

    Read here, not imported from the code under test, so the test runs on the baseline.
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _alive(pid: int, started: int | None) -> bool:
    return started is not None and process_start_time(pid) == started


def _record(name: str, **figures: float) -> None:
    with RESULTS.open("a") as out:
        out.write(json.dumps({"test": name, "at": time.time(), **figures}) + "\n")


@pytest.fixture
def pair(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Pair]:
    ds = control_plane.datastore()
    pool_name = create_pool(ds)
    lab = Lab.create(nodes=2)
    node, other = lab.node("node1"), lab.node("node2")
    node_name, other_name = f"node1-{lab.lab_id}", f"node2-{lab.lab_id}"
    ensure_node(ds, node_name, str(node.address))
    ensure_node(ds, other_name, str(other.address))
    run_dir = tmp_path / "run"
    # --resync-interval 300: nothing in these tests may wait for a resync pass
    args = agent_args(node_name, control_plane.kubeconfig, run_dir, "--resync-interval", "300")
    peer = BGPController(
        other_name,
        SpeakerOptions(
            workdir=tmp_path / "peer",
            command_prefix=("ip", "netns", "exec", other.netns),
            backoff_initial=0.2,
        ),
        iproute_factory(other.netns),
    )
    built: Pair | None = None
    try:
        lab.relay_apiserver(node, control_plane.expose_unix_socket(), control_plane.apiserver_port)
        nodes = [ds.get_raw(kinds.NODE, node_name), ds.get_raw(kinds.NODE, other_name)]
        peer.update(BGPInputs(nodes=nodes))
        built = Pair(lab, ds, node, node_name, run_dir, args, peer)
        yield built
    finally:
        peer.stop()
        lab.teardown()  # also kills whatever still runs in the lab's namespaces
        _delete_pool_data(ds, pool_name, node_name)
        ds.delete_raw(kinds.NODE, other_name)


def _takeover(pair: Pair, name: str, old_speaker: int, old_started: int | None) -> None:
    """Start the next agent: the old speaker is gone, the session back, a new block out."""
    began = time.monotonic()
    pair.start_agent()
    wait_for(lambda: not _alive(old_speaker, old_started), timeout=10, what="old ExaBGP gone")
    wait_for(pair.established, timeout=TAKEOVER_S, what="the new agent's session Established")
    takeover = time.monotonic() - began
    wait_for(lambda: pair.readyz() == 200, timeout=READY_LAG_S, what="/readyz 200 after takeover")
    ready = time.monotonic() - began
    new_speaker = pair.bgp_status().get("speakerPid")
    assert new_speaker not in (None, old_speaker)
    before = pair.peer_learned()
    claiming = time.monotonic()  # the claim's own API writes count: the agent may beat them
    block = pair.claim_block()
    assert block not in before, f"{block} was not a new block"
    wait_for(lambda: block in pair.peer_learned(), timeout=15, what=f"{block} at the peer")
    announced = time.monotonic() - claiming
    _record(name, takeover_s=takeover, ready_s=ready, announce_s=announced)
    print(f"{name}: established {takeover:.2f}s, ready {ready:.2f}s, block {announced:.2f}s")


def test_sigkill_of_the_agent_takes_its_exabgp_along_and_the_next_agent_takes_over(
    pair: Pair,
) -> None:
    pair.start_agent()
    wait_for(pair.established, timeout=TAKEOVER_S, what="the first agent's session")
    speaker = pair.bgp_status()["speakerPid"]
    started = process_start_time(speaker)
    assert _alive(speaker, started)

    killed = time.monotonic()
    pair.kill_agent()
    wait_for(lambda: not _alive(speaker, started), timeout=5, what="ExaBGP to die with its agent")
    _record("speaker-gone-after-sigkill", gone_s=time.monotonic() - killed)
    _takeover(pair, "sigkill-takeover", speaker, started)


def test_a_speaker_that_outlived_its_agent_is_stopped_by_the_next_agent(pair: Pair) -> None:
    pair.start_agent(NO_PDEATHSIG)
    wait_for(pair.established, timeout=TAKEOVER_S, what="the first agent's session")
    speaker = pair.bgp_status()["speakerPid"]
    started = process_start_time(speaker)
    pair.kill_agent()
    time.sleep(2)
    assert _alive(speaker, started), "the orphan this test needs did not survive"
    _takeover(pair, "orphan-takeover", speaker, started)


def test_a_pidfile_naming_another_process_kills_nothing(pair: Pair) -> None:
    """A pid reused by another process, even one with our config path on its command
    line, is left alone: only the pidfile goes."""
    config = pair.run_dir / "bgp" / "exabgp.conf"
    decoy = pair.lab.start_process(
        "decoy",
        pair.node,
        [sys.executable, "-c", "import time; time.sleep(300)", str(config)],
    )
    assert decoy.pid is not None
    wait_for(lambda: str(config) in Path(f"/proc/{decoy.pid}/cmdline").read_text(), what="decoy")
    started = process_start_time(decoy.pid)
    assert started is not None
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    record = {"version": 1, "pid": decoy.pid, "startTime": started - 1}
    record |= {"bootId": boot, "config": str(config)}
    config.parent.mkdir(parents=True)
    (config.parent / "exabgp.pid").write_text(json.dumps(record))

    pair.start_agent()
    wait_for(pair.established, timeout=TAKEOVER_S, what="the agent's session")
    assert _alive(decoy.pid, started), "the agent killed a process its pidfile only named"


def test_readyz_follows_bgp_sessions_as_they_change(pair: Pair) -> None:
    """Up, down, up again: /readyz says so within seconds, not on the next resync."""
    pair.start_agent()
    wait_for(pair.established, timeout=TAKEOVER_S, what="the session")
    up = time.monotonic()
    wait_for(lambda: pair.readyz() == 200, timeout=READY_LAG_S, what="/readyz 200 once up")
    lag_up = time.monotonic() - up

    pair.peer.stop()  # the peer goes away: the session drops
    down = time.monotonic()
    wait_for(lambda: pair.readyz() == 503, timeout=READY_LAG_S + 5, what="/readyz 503")
    lag_down = time.monotonic() - down

    pair.peer.speaker = None  # a fresh speaker, as a restarted peer agent has
    pair.peer.update(BGPInputs(nodes=[pair.ds.get_raw(kinds.NODE, n) for n in _names(pair)]))
    wait_for(pair.peer_up, timeout=TAKEOVER_S, what="the peer back")
    back = time.monotonic()
    wait_for(lambda: pair.readyz() == 200, timeout=READY_LAG_S, what="/readyz 200 again")
    lag_back = time.monotonic() - back
    _record("readyz-lag", up_s=lag_up, down_s=lag_down, back_s=lag_back)
    print(f"readyz lag: up {lag_up:.2f}s, down {lag_down:.2f}s, back {lag_back:.2f}s")


def _names(pair: Pair) -> list[str]:
    return [pair.node_name, pair.node_name.replace("node1-", "node2-", 1)]
