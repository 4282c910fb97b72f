"""The truth table on a real lab: pods with servers, emulated Services, parallel probes.

``TruthLab.up`` starts a :class:`~lab.cluster.LabCluster` (its own etcd +
kube-apiserver, node namespaces, real ``tabby-node`` agents with the chosen
iptables backend), creates the world's namespaces and pods through the
apiserver and CNI, starts a :mod:`podagent <tests.truthtable.podagent>` in every
pod, and writes kube-proxy's ClusterIP DNAT (``KUBE-SERVICES`` in the nat table,
from PREROUTING and OUTPUT, with the same backend, plus kubelet's
``KUBE-IPTABLES-HINT`` chain) into every node namespace.

``TruthLab.check`` probes every cell of the world at once and compares with the
oracle's matrix:

1. *converge*: probe all cells, then re-probe only those that differ, until
   none does or :data:`CONVERGE_S` passed (the agents apply changes within a
   pass; upstream e2e polls each probe for up to 10 s the same way);
2. *confirm*: probe every cell once more. A cell that is open but should be
   closed is a mismatch at once (a dropped packet cannot come back). A cell that
   is closed but should be open is re-probed twice with a longer timeout first
   (a probe can time out on a loaded machine); still closed, it is a mismatch.

Everything started is stopped by PID in ``down()``, also after a failure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from datastore import kinds
from lab import netns
from lab.cluster import ClusterSpec, LabCluster
from lab.kubecluster import KubeCluster
from tests.truthtable import kubeproxy
from tests.truthtable.world import PORTS, SERVICE_PORT_OFFSET, Cell, World

log = logging.getLogger(__name__)

PODAGENT = Path(__file__).with_name("podagent.py")
PROBE_TIMEOUT_S = 1.0
RETRY_TIMEOUT_S = 2.5
CONVERGE_S = 30.0
Progress = Callable[[str], None]

# --backend name -> the agent's --iptables-backend and the restore/save commands.
BACKENDS = {
    "nft": ("nft", "iptables-nft"),
    "legacy": ("legacy-iptc", "iptables-legacy"),  # writes via restore, reads via libiptc
}
SERVICES = ("emulated", "kube-proxy")  # who translates Service IPs: see TruthLab.up


def _quiet(_: str) -> None:
    return None


# ---------------------------------------------------------------- pod agents


class PodAgents:
    """One podagent process per pod (server + prober), talked to over pipes."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(self, key: str, in_pod: Sequence[str], log_path: Path) -> None:
        """The pod's agent, run by *in_pod* (the prefix that enters the pod's netns:
        ``ip netns exec`` in the namespace lab, ``nsenter`` of a kubelet sandbox)."""
        ports = ",".join(str(p) for p in PORTS)
        with open(log_path, "a") as err:
            proc = subprocess.Popen(
                [*in_pod, sys.executable, str(PODAGENT), "--ports", ports],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self.procs[key] = proc
        hello = self._read(key)
        if not hello.get("ready"):
            raise RuntimeError(f"pod agent of {key} did not start: {hello}")

    def _read(self, key: str) -> dict[str, Any]:
        stdout = self.procs[key].stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"pod agent of {key} exited (code {self.procs[key].poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def probe(self, batches: dict[str, list[list[Any]]], timeout: float) -> dict[str, str]:
        """Send every pod its batch at once, then collect: results by probe id."""
        for key, probes in batches.items():
            stdin: IO[str] | None = self.procs[key].stdin
            assert stdin is not None
            stdin.write(json.dumps({"timeout": timeout, "probes": probes}) + "\n")
            stdin.flush()
        results: dict[str, str] = {}
        for key in batches:
            results.update(self._read(key)["results"])
        return results

    def stop(self) -> None:
        stop_processes(self.procs.values())
        self.procs.clear()


def stop_processes(procs: Iterable[subprocess.Popen[str]]) -> None:
    """SIGTERM all, then reap each (SIGKILL after 5 s) and close its pipes."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


# ---------------------------------------------------------------- kube-proxy emulation


def service_rules(world: World) -> str:
    """iptables-restore input for the nat table: ClusterIP:port+1000 -> pod:port (pure)."""
    lines = ["*nat", ":KUBE-SERVICES - [0:0]"]
    for key, cluster_ip in sorted(world.cluster_ips.items()):
        for proto in ("tcp", "udp", "sctp"):
            for port in PORTS:
                lines.append(
                    f"-A KUBE-SERVICES -d {cluster_ip}/32 -p {proto} -m {proto} "
                    f"--dport {port + SERVICE_PORT_OFFSET} -m comment --comment svc/{key} "
                    f"-j DNAT --to-destination {world.ip(key)}:{port}"
                )
    lines += [
        "-A PREROUTING -m comment --comment kubernetes-services -j KUBE-SERVICES",
        "-A OUTPUT -m comment --comment kubernetes-services -j KUBE-SERVICES",
        "COMMIT",
        "*mangle",
        ":KUBE-IPTABLES-HINT - [0:0]",
        "COMMIT",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- results


@dataclass
class CheckResult:
    """One matrix: cells confirmed, probes sent, and what did not match."""

    cells: int = 0
    probes: int = 0
    converge_s: float = 0.0
    mismatches: list[str] = field(default_factory=list)
    allowed: int = 0
    same_node: int = 0
    refused: int = 0


KUBE_PROXY_TIMEOUT_S = 60.0


def _services_on_nodes(cluster: KubeCluster, world: World) -> None:
    """The world's Services and EndpointSlices; until every node's kube-proxy
    (iptables mode: lab.kubecluster) has written every ClusterIP."""
    ds = cluster.datastore()
    for kind, body in kubeproxy.service_objects(world):
        ds.create_raw(kind, body)
    cluster_ips = sorted(world.cluster_ips.values())
    deadline = time.monotonic() + KUBE_PROXY_TIMEOUT_S
    for node in cluster.nodes:
        while True:
            table = netns.ns_exec(node.netns, ["iptables-save", "-t", "nat"], check=False)
            missing = [ip for ip in cluster_ips if ip not in table]
            if not missing:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"kube-proxy on {node.name} did not program {len(missing)} ClusterIPs "
                    f"within {KUBE_PROXY_TIMEOUT_S:.0f} s: {', '.join(missing[:5])}"
                )
            time.sleep(0.5)


def _is_open(result: str) -> bool:
    return result == "ok"


# ---------------------------------------------------------------- the lab


class TruthLab:
    """A lab cluster with the truth-table world in it."""

    def __init__(
        self,
        cluster: LabCluster | KubeCluster,
        world: World,
        backend: str,
        services: str = "emulated",
    ) -> None:
        if services not in SERVICES:
            raise ValueError(f"services {services!r} is not one of {', '.join(SERVICES)}")
        self.cluster = cluster
        self.world = world
        self.backend = backend
        self.services = services
        self.agents = PodAgents()
        self.baseline: tuple[dict[str, Any], dict[str, Any]] | None = None

    @classmethod
    def up(
        cls,
        workdir: Path,
        backend: str,
        progress: Progress = _quiet,
        *,
        nodes: int = 2,
        spare_nodes: int = 0,
        resync_interval_s: float = 30.0,
        services: str = "emulated",
    ) -> TruthLab:
        """The world's pods on *nodes* nodes; *spare_nodes* more join the cluster with
        none of them (what a test may remove and re-add without changing the matrix).
        *services*: ``emulated`` (the DNAT written here) or ``kube-proxy`` (Service
        objects and the real kube-proxy on the world's nodes)."""
        if services not in SERVICES:
            raise ValueError(f"services {services!r} is not one of {', '.join(SERVICES)}")
        agent_backend, _ = BACKENDS[backend]
        spec = ClusterSpec(
            nodes=nodes + spare_nodes,
            iptables_backend=agent_backend,
            resync_interval_s=resync_interval_s,
        )
        cluster = LabCluster.up(workdir, spec, progress)
        world = World.create([n.name for n in cluster.nodes[:nodes]])
        lab = cls(cluster, world, backend, services)
        try:
            lab._populate(progress)
        except BaseException:
            lab.down()
            raise
        return lab

    @classmethod
    def on_nodes(
        cls, cluster: KubeCluster, progress: Progress = _quiet, *, nodes: int = 3
    ) -> TruthLab:
        """The world on a real-node lab that is up (lab.kubecluster): its pods are
        kubelet's sandboxes on the first *nodes* nodes, their pod agents entered by
        ``nsenter``, its Services translated by the nodes' own kube-proxy (iptables
        mode). ``down`` stops the pod agents and the lab."""
        world = World.create([n.name for n in cluster.nodes[:nodes]])
        lab = cls(cluster, world, "legacy", services="kube-proxy")
        try:
            lab._populate(progress)
        except BaseException:
            lab.agents.stop()
            raise
        return lab

    def _populate(self, progress: Progress) -> None:
        for ns, obj in self.world.namespaces.items():
            self.cluster.create_namespace(ns, obj["metadata"]["labels"])
        progress(f"creating {len(self.world.pods)} pods")
        for key, obj in self.world.pods.items():
            meta = obj["metadata"]
            info = self.cluster.create_pod(
                meta["namespace"],
                meta["name"],
                self.world.placement[key],
                dict(meta["labels"]),
                obj["spec"]["containers"][0]["ports"],
            )
            self.world.set_ip(key, info.ip)
        logs = self.cluster.workdir / "podagents.log"
        for key in self.world.pods:
            self.agents.start(key, self.cluster.netns_argv(key), logs)
        if isinstance(self.cluster, KubeCluster):
            progress("creating the world's Services (the nodes' kube-proxy programs them)")
            _services_on_nodes(self.cluster, self.world)
        elif self.services == "kube-proxy":
            progress("starting kube-proxy on the world's nodes")
            assert isinstance(self.cluster, LabCluster)
            world_nodes = sorted(set(self.world.placement.values()))
            kubeproxy.start(self.cluster, self.world, [self.cluster.node(n) for n in world_nodes])
        else:
            self._emulate_services()
        self.baseline = self.world.snapshot_labels()

    def _emulate_services(self) -> None:
        assert isinstance(self.cluster, LabCluster)
        _, save_cmd = BACKENDS[self.backend]
        rules = service_rules(self.world)
        for node in self.cluster.nodes:
            subprocess.run(
                ["ip", "netns", "exec", node.netns, f"{save_cmd}-restore", "--noflush"],
                input=rules,
                text=True,
                check=True,
                capture_output=True,
                timeout=60,
            )

    def down(self) -> None:
        try:
            self.agents.stop()
        finally:
            self.cluster.down()

    # -- changes: the apiserver and the model together ---------------------------------
    def apply_policy(self, policy: dict[str, Any]) -> None:
        self.world.apply_policy(policy)
        self.cluster.apply_policy(policy)

    def delete_policy(self, namespace: str, name: str) -> None:
        self.world.delete_policy(namespace, name)
        self.cluster.delete_policy(namespace, name)

    def apply_cluster_policy(self, policy: dict[str, Any]) -> None:
        self.world.apply_cluster_policy(policy)
        self.cluster.apply_cluster_policy(policy)

    def delete_cluster_policy(self, name: str) -> None:
        self.world.delete_cluster_policy(name)
        self.cluster.delete_cluster_policy(name)

    def label_pod(self, key: str, labels: dict[str, str | None]) -> None:
        self.world.label_pod(key, labels)
        ns, name = key.split("/")
        self.cluster.label_pod(ns, name, labels)

    def label_namespace(self, name: str, labels: dict[str, str | None]) -> None:
        self.world.label_namespace(name, labels)
        patch = {"metadata": {"labels": labels}}
        self.cluster.datastore().patch_raw(kinds.NAMESPACE, name, patch)

    def reset(self) -> None:
        """No policy, original labels: the state every case starts from."""
        for key in list(self.world.policies):
            ns, name = key.split("/")
            self.delete_policy(ns, name)
        for name in list(self.world.cluster_policies):
            self.delete_cluster_policy(name)
        assert self.baseline is not None
        pods, namespaces = self.baseline
        for key, labels in pods.items():
            current = self.world.pods[key]["metadata"]["labels"]
            if current != labels:
                self.label_pod(key, {**dict.fromkeys(current), **labels})
        for name, labels in namespaces.items():
            current = self.world.namespaces[name]["metadata"]["labels"]
            if current != labels:
                self.label_namespace(name, {**dict.fromkeys(current), **labels})

    # -- probing -----------------------------------------------------------------------
    def probe(self, cells: Iterable[Cell], timeout: float = PROBE_TIMEOUT_S) -> dict[Cell, str]:
        """Probe these cells once, all at once: the result of each."""
        return self._probe(cells, timeout)

    def _probe(self, cells: Iterable[Cell], timeout: float) -> dict[Cell, str]:
        batches: dict[str, list[list[Any]]] = {}
        by_key: dict[str, Cell] = {}
        for cell in cells:
            ip, port = self.world.target(cell)
            batches.setdefault(cell.src, []).append([cell.key, cell.protocol.lower(), ip, port])
            by_key[cell.key] = cell
        results = self.agents.probe(batches, timeout)
        return {by_key[k]: v for k, v in results.items()}

    def check(self, converge_s: float = CONVERGE_S) -> CheckResult:
        """Converge, then confirm the whole matrix (see the module docstring)."""
        expected = self.world.expected()
        out = CheckResult(cells=len(expected))
        started = time.monotonic()
        pending = list(expected)
        while pending:
            seen = self._probe(pending, PROBE_TIMEOUT_S)
            out.probes += len(seen)
            pending = [c for c, r in seen.items() if _is_open(r) != expected[c]]
            if time.monotonic() - started > converge_s:
                break
        out.converge_s = time.monotonic() - started
        final = self._probe(expected, PROBE_TIMEOUT_S)
        out.probes += len(final)
        for _ in range(2):
            closed = [c for c, r in final.items() if expected[c] and not _is_open(r)]
            if not closed:
                break
            retried = self._probe(closed, RETRY_TIMEOUT_S)
            out.probes += len(retried)
            final.update(retried)
        for cell, result in sorted(final.items(), key=lambda kv: kv[0].key):
            out.refused += result == "refused"
            out.allowed += expected[cell]
            out.same_node += self.world.same_node(cell.src, cell.dst)
            if _is_open(result) != expected[cell]:
                want = "open" if expected[cell] else "closed"
                out.mismatches.append(f"{cell.key}: expected {want}, got {result}")
        return out
