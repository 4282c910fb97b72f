"""`make soak`: churn and faults on a 3-node lab, with the invariants checked after
every event.

The probed world is the truth table's (:class:`~tests.truthtable.harness.TruthLab`):
nine pods with servers on TCP, UDP and SCTP, a ClusterIP Service for each through the
real ``kube-proxy``, and the independent oracle, on one of two labs (``--lab``):

* ``namespaces``: its own etcd and kube-apiserver, node namespaces with ``tabby-node``
  agents the lab starts (ExaBGP full mesh), kube-proxy in nftables mode;
* ``nodes``: the real-node lab (:mod:`lab.kubecluster`): kubelet, containerd and
  kube-proxy (iptables mode) per node, Tabby installed from ``manifests/``; pods are
  Pods, the agent is the DaemonSet's container, and a removed node is a stopped
  kubelet and a deleted Node.

What differs between the two is behind :mod:`tests.soak.targets`. Around the world the
soak adds a fourth, spare node (churn pods only: the one a ``node-replace`` fault
removes and re-adds), churn pods (bursts of ADDs on one node), an established TCP flow
between two more pods on different nodes, ``tabby-controllers`` with short GC
intervals (its IPAM GC cleans up after a removed node), and runs the seeded
:mod:`schedule <tests.soak.schedule>`.

After each event (a checkpoint): the whole matrix is probed against the oracle
(converge, then confirm: see the harness), the sandboxes' addresses are read for
duplicates, IPAM is read for leaks, and the flow is asked whether it still lives.
While an agent restarts, the cells the oracle says are closed around its node are
probed without pause: one open is an allow-all window.

Run: ``.venv/bin/python -m tests.soak.runner --minutes 15 [--seed N] [--lab nodes]``; the last
line is ``soak minutes=... duplicates=0 leaks=0 policy_violations=0 flows_lost=0``
and the exit code is 0 only if every loss counter is 0. Everything started is
stopped by PID, also after a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import DatastoreError
from felix.cni_server.journal import AddJournal
from felix.wiring import host_ifname_for
from ipam.report import Snapshot
from lab import netns
from lab.cluster import PodInfo
from lab.kubecluster import KubeCluster, KubePod, KubeSpec
from policy.naming import endpoint_chain_names
from tests.soak import policies
from tests.soak.invariants import Endpoint, Tally, duplicates, leaks, unheld_addresses
from tests.soak.schedule import FAULT_KINDS, Event, schedule
from tests.soak.targets import NamespaceTarget, NodesTarget, SoakTarget
from tests.truthtable.harness import PROBE_TIMEOUT_S, TruthLab, stop_processes
from tests.truthtable.world import NAMESPACES, Cell

CHURN_NS = "soak-churn"
FLOW_NS = "soak-flow"
FLOW_PORT = 7000
FLOW_SCRIPT = Path(__file__).with_name("flow.py")
RESYNC_S = 10.0  # the agents' full resync: what repairs a deleted route or chain
GC_INTERVAL_S = 2.0  # tabby-controllers' passes: a removed node is cleaned up in seconds
GC_GRACE_S = 30.0  # how long a leak must last before GC releases it
NODE_CLEANUP_TIMEOUT_S = 60.0  # a removed node's blocks and affinities released by then
REJOIN_REACH_TIMEOUT_S = 60.0  # a pod on a rejoined node reaches another node by then
SPARE_NODES = 1
LOST_PODS = 5  # a replaced node holds at least this many churn pods when it is lost
APISERVER_DOWN_S = 60.0
RESTART_SETTLE_S = 3.0  # restart-window probes go on this long after the agent serves
WINDOW_SAMPLE = 120  # closed cells probed during a restart
JOURNAL = "cni-inflight"  # the agent's ADD journal under its run dir
TEARDOWN_TIMEOUT_S = 60.0  # answered DELs' deferred teardowns finished by then
BACKEND = "nft"
LABS = ("namespaces", "nodes")
MAX_PODS_PER_NODE = 250  # kubelet's limit on the real-node lab: bursts pile up
Progress = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)


class Soak:
    """One soak run on a lab that is up; ``run`` returns the tally."""

    def __init__(
        self,
        target: SoakTarget,
        tally: Tally,
        *,
        apiserver_down_s: float = APISERVER_DOWN_S,
        progress: Progress = _print,
    ) -> None:
        self.target = target
        self.lab = target.lab
        self.cluster = target.lab.cluster
        self.tally = tally
        self.apiserver_down_s = apiserver_down_s
        self.progress = progress
        self.churn: dict[str, str] = {}  # churn pod name -> node
        self.flow_procs: list[subprocess.Popen[str]] = []
        self.flow_client: subprocess.Popen[str] | None = None
        self.lock = threading.Lock()  # the burst threads' shared state
        self.started = time.monotonic()

    # -- the run ------------------------------------------------------------------------
    def run(self, events: Iterator[Event], minutes: float) -> Tally:
        self.started = time.monotonic()  # the lab's setup is not the soak's time
        self.start_flow()
        self.checkpoint("start")
        deadline = self.started + minutes * 60
        pending = set(FAULT_KINDS)
        for event in events:
            if time.monotonic() >= deadline and not pending:
                break
            began = time.monotonic()
            self.handle(event)
            pending.discard(event.kind)
            self.checkpoint(event.describe())
            t = self.tally
            self.progress(
                f"[{self.elapsed():6.0f}s] {event.describe()} ({self.took(began)}): "
                f"duplicates={t.duplicates} leaks={t.leaks} "
                f"policy_violations={t.policy_violations} flows_lost={t.flows_lost}"
            )
        self.finish()
        return self.tally

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @staticmethod
    def took(began: float) -> str:
        return f"{time.monotonic() - began:.1f}s"

    def handle(self, event: Event) -> None:
        handlers: dict[str, Callable[[Event], None]] = {
            "pods-create": self.pods_create,
            "pods-delete": self.pods_delete,
            "policy-apply": self.policy_apply,
            "policy-delete": self.policy_delete,
            "namespace-relabel": self.namespace_relabel,
            "agent-kill": self.agent_kill,
            "agent-kill-mid-add": self.agent_kill_mid_add,
            "exabgp-kill": self.exabgp_kill,
            "apiserver-stop": self.apiserver_stop,
            "route-delete": self.route_delete,
            "chain-delete": self.chain_delete,
            "node-replace": self.node_replace,
        }
        self.tally.events += 1
        if event.is_fault:
            self.tally.faults += 1
            self.tally.fault_kinds[event.kind] = self.tally.fault_kinds.get(event.kind, 0) + 1
        handlers[event.kind](event)

    # -- churn --------------------------------------------------------------------------
    def pods_create(self, event: Event) -> None:
        names = [f"c{event.index}-{i}" for i in range(event.count)]
        failed = self.burst(event.node, names)
        self.tally.add_failures += [f"{event.describe()}: {err}" for err in failed.values()]
        self.abandon(event.node, failed)

    def burst(self, node: str, names: list[str]) -> dict[str, str]:
        """All ADDs at once on *node*; returns the failed ones with their errors."""
        failed = self.target.create_pods(CHURN_NS, node, names, {"pod": "churn"})
        with self.lock:
            for name in names:
                if name not in failed:
                    self.churn[name] = node
                    self.tally.pods += 1
        return failed

    def abandon(self, node: str, failed: dict[str, str]) -> None:
        """What the runtime does after each failed ADD, once the agent serves again."""
        self.target.abandon_pods(CHURN_NS, node, sorted(failed))

    def pods_delete(self, event: Event) -> None:
        rng = random.Random(event.seed)
        victims = rng.sample(sorted(self.churn), min(event.count, len(self.churn)))
        for name in victims:
            del self.churn[name]
        self.target.delete_pods(CHURN_NS, victims)

    def policy_apply(self, event: Event) -> None:
        self.lab.apply_policy(policies.policy(event.seed))
        self.tally.policies += 1

    def policy_delete(self, event: Event) -> None:
        existing = sorted(self.lab.world.policies)
        if not existing:
            return
        namespace, name = random.Random(event.seed).choice(existing).split("/")
        self.lab.delete_policy(namespace, name)
        self.tally.policies += 1

    def namespace_relabel(self, event: Event) -> None:
        namespace = random.Random(event.seed).choice(NAMESPACES)
        current = self.lab.world.namespaces[namespace]["metadata"]["labels"]
        self.lab.label_namespace(namespace, policies.namespace_labels(event.seed, current))

    # -- faults -------------------------------------------------------------------------
    def agent_kill(self, event: Event) -> None:
        self.kill_agent_watched(event)

    def agent_kill_mid_add(self, event: Event) -> None:
        """A burst on the node; the kill lands once the journal shows ADDs in flight."""
        names = [f"k{event.index}-{i}" for i in range(event.count)]
        failed: dict[str, str] = {}
        burst = threading.Thread(target=lambda: failed.update(self.burst(event.node, names)))
        journal = self.cluster.run_dir(event.node) / JOURNAL
        burst.start()
        deadline = time.monotonic() + 30
        while burst.is_alive() and time.monotonic() < deadline:
            if any(journal.glob("*.add")):
                self.tally.mid_add_in_flight += 1
                break
            time.sleep(0.005)
        self.kill_agent_watched(event)
        burst.join()
        self.abandon(event.node, failed)

    def kill_agent_watched(self, event: Event) -> None:
        """kill -9 and restart, probing the node's closed cells all the while."""
        rng = random.Random(event.seed)
        cells = self.closed_cells_around(event.node)
        sample = rng.sample(cells, min(WINDOW_SAMPLE, len(cells)))
        opened: set[str] = set()
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                seen = self.lab.probe(sample, PROBE_TIMEOUT_S) if sample else {}
                opened.update(c.key for c, r in seen.items() if r == "ok")
                self.tally.window_probes += len(seen)
                if not sample:
                    stop.wait(0.2)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            self.target.kill_agent(event.node)
            stop.wait(RESTART_SETTLE_S)
        finally:
            stop.set()
            watcher.join()
        lines = [f"{key} open while {event.node}'s agent restarted" for key in sorted(opened)]
        self.tally.found("policy_violations", lines, event.describe())

    def closed_cells_around(self, node: str) -> list[Cell]:
        placement = self.lab.world.placement
        expected = self.lab.world.expected()
        return sorted(
            (
                c
                for c, ok in expected.items()
                if not ok and node in (placement[c.src], placement[c.dst])
            ),
            key=lambda c: c.key,
        )

    def exabgp_kill(self, event: Event) -> None:
        """kill -9 of the node's ExaBGP; the agent restarts it. Waits for the new
        speaker, so the checkpoint judges routes after it."""
        killed = self.target.kill_speaker(event.node)
        if killed is None:
            raise RuntimeError(f"{event.node}'s agent runs no live ExaBGP to kill")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.target.speaker_pid(event.node) not in (None, killed):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{event.node}'s agent did not start ExaBGP again within 60 s")

    def apiserver_stop(self, event: Event) -> None:
        """etcd and kube-apiserver down for a while; the dataplane must keep enforcing
        (one matrix check during the outage), then both start again."""
        cp = self.cluster.cp
        assert cp is not None and cp.etcd is not None and self.cluster.lab is not None
        down_at = time.monotonic()
        cp.stop_apiserver()
        cp.etcd.stop()
        cp.pids.forget(cp.etcd.name)
        cp.etcd = None
        result = self.lab.check()
        self.tally.checks += 1
        self.tally.found("policy_violations", result.mismatches, f"{event.describe()} (down)")
        remaining = self.apiserver_down_s - (time.monotonic() - down_at)
        if remaining > 0:
            time.sleep(remaining)  # the outage's length is the fault itself
        cp.start_etcd()
        assert cp.etcd is not None and cp.etcd.pid is not None
        self.cluster.lab.set_owner(cp.etcd.pid)  # the lab lives as long as its etcd
        cp.start_apiserver()

    def route_delete(self, event: Event) -> None:
        key = random.Random(event.seed).choice(sorted(self.lab.world.pods))
        node = self.cluster.node(self.lab.world.placement[key])
        try:
            netns.ip(node.netns, "route", "del", f"{self.lab.world.ip(key)}/32")
        except netns.NetnsError as err:  # still missing since an earlier deletion?
            self.tally.fault_misses.append(f"{event.describe()}: {err}")

    def chain_delete(self, event: Event) -> None:
        key = random.Random(event.seed).choice(sorted(self.lab.world.pods))
        namespace, name = key.split("/")
        to_chain, _ = endpoint_chain_names(host_ifname_for(namespace, name))
        try:
            self.target.flush_chain(self.lab.world.placement[key], to_chain)
        except netns.NetnsError as err:  # the agent never made the chain?
            self.tally.fault_misses.append(f"{event.describe()}: {err}")

    def node_replace(self, event: Event) -> None:
        """The spare node's machine lost and a new one joining under its name: its churn
        pods die with it (no DEL), its Node object is deleted, and tabby-controllers'
        GC must free its blocks and affinities (a stale affinity hands the new node
        addresses that are still in use: Calico's duplicate IP). Then ADDs on the new
        node, and one of its pods must reach the flow's server on another node."""
        self.populate(event)
        try:
            held = _ipam_of_node(self.cluster.datastore(), event.node)
        except DatastoreError as err:
            held = [f"unreadable: {err}"]
        if not held:
            self.tally.fault_misses.append(f"{event.describe()}: IPAM held nothing of the node")
        lost = self.target.remove_node(event.node)
        with self.lock:
            for key in lost:
                namespace, name = key.split("/")
                if namespace != CHURN_NS:
                    raise RuntimeError(f"{key} was on {event.node}, which must hold churn only")
                self.churn.pop(name, None)
        self.tally.found("leaks", self.wait_node_cleaned(event.node), event.describe())
        self.target.rejoin_node(event.node)
        names = [f"r{event.index}-{i}" for i in range(event.count)]
        failed = self.burst(event.node, names)
        self.tally.add_failures += [f"{event.describe()}: {err}" for err in failed.values()]
        self.abandon(event.node, failed)
        added = [n for n in names if n not in failed]
        if added:
            self.tally.found("flows_lost", self.unreachable_from(added[0]), event.describe())

    def populate(self, event: Event) -> None:
        """At least :data:`LOST_PODS` churn pods on the node: a lost machine has pods."""
        with self.lock:
            there = sum(1 for node in self.churn.values() if node == event.node)
        names = [f"l{event.index}-{i}" for i in range(max(0, LOST_PODS - there))]
        if names:
            failed = self.burst(event.node, names)
            self.tally.add_failures += [f"{event.describe()}: {err}" for err in failed.values()]
            self.abandon(event.node, failed)

    def wait_node_cleaned(self, node: str) -> list[str]:
        """What IPAM still gives a removed node after the wait (nothing, when GC works)."""
        ds = self.cluster.datastore()
        deadline = time.monotonic() + NODE_CLEANUP_TIMEOUT_S
        while True:
            try:
                stale = _ipam_of_node(ds, node)
            except DatastoreError as err:
                stale = [f"IPAM of {node} not readable: {err}"]
            if not stale or time.monotonic() >= deadline:
                return [f"{what} still {node}'s after it was deleted" for what in stale]
            time.sleep(0.5)

    def unreachable_from(self, name: str) -> list[str]:
        """Ping the flow's server (another node) from a pod of the rejoined node until
        it answers; the line that says it never did, or nothing."""
        server = self.cluster.pods[f"{FLOW_NS}/server"]
        key = f"{CHURN_NS}/{name}"
        deadline = time.monotonic() + REJOIN_REACH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.cluster.exec(key, ["ping", "-c1", "-W1", server.ip]).returncode == 0:
                return []
            time.sleep(0.2)  # "network unreachable" returns at once: poll, do not spin
        return [f"{key} on a rejoined node never reached {server.key} ({server.ip})"]

    # -- the flow -----------------------------------------------------------------------
    def start_flow(self) -> None:
        """A server pod on the first node, a client on the second, one TCP connection."""
        first, second = (n.name for n in self.cluster.nodes[:2])
        server = self.cluster.create_pod(FLOW_NS, "server", first, {"app": "flow"})
        client = self.cluster.create_pod(FLOW_NS, "client", second, {"app": "flow"})
        self.flow_procs.append(self._flow_proc(server, ["serve", str(FLOW_PORT)]))
        self.flow_client = self._flow_proc(client, ["client", server.ip, str(FLOW_PORT)])
        self.flow_procs.append(self.flow_client)

    def _flow_proc(self, pod: PodInfo | KubePod, args: list[str]) -> subprocess.Popen[str]:
        log_path = self.cluster.workdir / "flow.log"
        in_pod = self.cluster.netns_argv(pod.key)
        with open(log_path, "a") as err:
            proc = subprocess.Popen(
                [*in_pod, sys.executable, str(FLOW_SCRIPT), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert proc.stdout is not None
        hello = proc.stdout.readline()
        if not hello.startswith('{"ready": true'):
            raise RuntimeError(f"flow {args[0]} in {pod.key} did not start: {hello!r}")
        return proc

    def flow_report(self) -> dict[str, Any]:
        client = self.flow_client
        assert client is not None and client.stdin is not None and client.stdout is not None
        client.stdin.write("report\n")
        client.stdin.flush()
        report: dict[str, Any] = json.loads(client.stdout.readline())
        return report

    def stop_flow(self) -> None:
        stop_processes(self.flow_procs)
        self.flow_procs.clear()

    # -- invariants ---------------------------------------------------------------------
    def checkpoint(self, when: str) -> None:
        result = self.lab.check()
        self.tally.checks += 1
        self.tally.found("policy_violations", result.mismatches, when)
        endpoints = self.endpoints()
        dups = [f"{ip} held by {', '.join(o)}" for ip, o in duplicates(endpoints).items()]
        self.tally.found("duplicates", dups, when, once=True)
        self.tally.found("leaks", self.wait_teardowns(), when, once=True)
        snapshot = Snapshot.load(self.cluster.datastore())
        live = self.target.live_sandboxes()
        self.tally.found("duplicates", unheld_addresses(snapshot, endpoints, live), when, once=True)
        self.tally.found("leaks", leaks(snapshot, live), when, once=True)
        self.check_flow(when)

    def wait_teardowns(self) -> list[str]:
        """Wait until no node has a DEL answered but not yet torn down (the agent
        answers first and frees the address right after: felix.teardown); the lines
        naming those still pending at the timeout. Reading IPAM before that would
        count an address on its way back as a leak."""
        run_dirs = {node.name: self.cluster.run_dir(node.name) for node in self.cluster.nodes}
        began = time.monotonic()
        while True:
            pending = unfinished_teardowns(run_dirs)
            waited = time.monotonic() - began
            if not pending or waited >= TEARDOWN_TIMEOUT_S:
                self.tally.teardown_wait_s = max(self.tally.teardown_wait_s, waited)
                return pending
            time.sleep(0.1)

    def check_flow(self, when: str) -> None:
        report = self.flow_report()
        self.tally.flow_gap_s = max(self.tally.flow_gap_s, float(report["longest_gap_s"]))
        self.tally.flow_exchanges = int(report["exchanges"])
        if report["error"]:
            self.tally.found("flows_lost", [str(report["error"])], when, once=True)

    def endpoints(self) -> list[Endpoint]:
        """Every live sandbox's eth0 address as the kernel has it, and tunnel addresses."""
        out = self.target.pod_endpoints()
        nodes, _ = self.cluster.datastore().list_raw(kinds.NODE)
        for node in nodes:
            for key, value in (node["metadata"].get("annotations") or {}).items():
                if "tunnel" in key and value and value[0].isdigit():
                    out.append(Endpoint(f"tunnel {node['metadata']['name']}", value.split("/")[0]))
        return out

    def finish(self) -> None:
        """Every churn pod deleted as a runtime would; then nothing may be left held."""
        self.target.delete_pods(CHURN_NS, sorted(self.churn))
        self.churn.clear()
        self.checkpoint("end, churn pods deleted")
        self.tally.minutes = self.elapsed() / 60


def summary(tally: Tally) -> list[str]:
    """The lines before the last one: what ran, and every finding."""
    kinds_done = ", ".join(f"{k} {n}" for k, n in sorted(tally.fault_kinds.items()))
    lines = [
        f"seed {tally.seed}: {tally.events} events, {tally.checks} matrix checks, "
        f"faults: {kinds_done}",
        f"closed cells probed while agents restarted: {tally.window_probes}",
        f"mid-ADD kills that found ADDs in flight: {tally.mid_add_in_flight} of "
        f"{tally.fault_kinds.get('agent-kill-mid-add', 0)}",
        f"established flow: {tally.flow_exchanges} echoes, longest gap {tally.flow_gap_s:.1f}s",
        f"longest wait for answered DELs' teardowns before reading IPAM: "
        f"{tally.teardown_wait_s:.1f}s",
        f"failed ADDs outside a kill: {len(tally.add_failures)}",
    ]
    lines += [f"  {line}" for line in tally.add_failures[:20]]
    lines.append(f"faults that found nothing to break: {len(tally.fault_misses)}")
    lines += [f"  {line}" for line in tally.fault_misses[:20]]
    lines += [f"finding: {line}" for line in tally.findings[:100]]
    return lines


def run_soak(
    minutes: float,
    seed: int,
    workdir: Path,
    *,
    lab_kind: str = "namespaces",
    apiserver_down_s: float = APISERVER_DOWN_S,
    progress: Progress = _print,
) -> Tally:
    """Bring the lab up, soak, bring it down (however it ends)."""
    progress(f"soak: {minutes:g} min, seed {seed}, {lab_kind} lab in {workdir}")
    target = bring_up(lab_kind, workdir, progress)
    soak = Soak(target, Tally(seed), apiserver_down_s=apiserver_down_s, progress=progress)
    try:
        target.setup(GC_INTERVAL_S, GC_GRACE_S)
        nodes = [n.name for n in target.lab.cluster.nodes]
        events = schedule(seed, nodes, spares=nodes[-SPARE_NODES:])
        return soak.run(events, minutes)
    finally:
        target.teardown()
        soak.stop_flow()
        target.lab.down()


def bring_up(lab_kind: str, workdir: Path, progress: Progress) -> SoakTarget:
    """Three nodes with the probed world and :data:`SPARE_NODES` more, of either lab."""
    if lab_kind == "namespaces":
        lab = TruthLab.up(
            workdir,
            BACKEND,
            progress,
            nodes=3,
            spare_nodes=SPARE_NODES,
            resync_interval_s=RESYNC_S,
            services="kube-proxy",
        )
        return NamespaceTarget(lab, BACKEND)
    if lab_kind != "nodes":
        raise ValueError(f"lab {lab_kind!r} is not one of {', '.join(LABS)}")
    spec = KubeSpec(nodes=3 + SPARE_NODES, max_pods=MAX_PODS_PER_NODE)
    cluster = KubeCluster.up(workdir, spec, progress)
    try:
        lab = TruthLab.on_nodes(cluster, progress, nodes=3)
    except BaseException:
        cluster.down()
        raise
    return NodesTarget(lab, stay_on=cluster.nodes[0].name, resync_s=RESYNC_S)


def unfinished_teardowns(run_dirs: dict[str, Path]) -> list[str]:
    """One line per DEL a node's agent answered but has not torn down yet (its
    journal's ``.del`` marker: felix.cni_server.journal)."""
    return [
        f"{node}: DEL answered, teardown unfinished: {marker.name}"
        for node, run_dir in sorted(run_dirs.items())
        for marker in sorted((run_dir / JOURNAL).glob(f"*{AddJournal.DEL_SUFFIX}"))
    ]


def _ipam_of_node(ds: Datastore, node: str) -> list[str]:
    """The block affinities and affine blocks that name *node*."""
    affinities, _ = ds.list_raw(kinds.BLOCKAFFINITY)
    blocks, _ = ds.list_raw(kinds.IPAMBLOCK)
    out = [f"affinity {a['metadata']['name']}" for a in affinities if a["spec"].get("node") == node]
    out += [
        f"block {b['spec'].get('cidr')}"
        for b in blocks
        if b["spec"].get("affinity") == f"host:{node}"
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.runner", description=__doc__)
    minutes = float(os.environ.get("SOAK_MINUTES", "15"))
    parser.add_argument("--minutes", type=float, default=minutes, help="$SOAK_MINUTES or 15")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--apiserver-down", type=float, default=APISERVER_DOWN_S)
    parser.add_argument(
        "--lab", choices=LABS, default=os.environ.get("SOAK_LAB", "namespaces"),
        help="namespaces (default, $SOAK_LAB) or nodes: kubelet, containerd, the manifests",
    )  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the soak's lab creates network namespaces: run it as root")
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        tally = run_soak(
            args.minutes,
            seed,
            workdir / "lab",
            lab_kind=args.lab,
            apiserver_down_s=args.apiserver_down,
        )
    for line in summary(tally):
        print(line)
    print(tally.last_line(), flush=True)
    return 0 if tally.clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
