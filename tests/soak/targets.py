"""What the soak does to a lab, for each kind of lab: the seam between the runner
(schedule, faults, invariants) and the cluster under it.

* :class:`NamespaceTarget`, the truth table's lab (:mod:`lab.cluster`): node network
  namespaces with ``tabby-node`` processes the lab started, pods that are network
  namespaces its CNI calls made, ``tabby-controllers`` started here.
* :class:`NodesTarget`, the real-node lab (:mod:`lab.kubecluster`): kubelet,
  containerd and kube-proxy per node, Tabby installed from ``manifests/``. Pods are
  Pods that kubelet starts; the agent is the DaemonSet's container (a killed one is
  restarted by kubelet); a node is lost by stopping its kubelet and deleting its Node;
  the sandboxes and their addresses are read through each node's CRI.

The runner keeps using what both labs have alike (``run_dir``, ``datastore``,
``exec``, ``netns_argv``, ``node(...).netns``, the control plane ``cp``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from datastore import kinds
from lab import netns
from lab.cluster import LabCluster
from lab.kubecluster import TABBY_NAMESPACE, KubeCluster, KubePod
from tests.soak.invariants import Endpoint
from tests.truthtable.harness import BACKENDS, TruthLab, stop_processes

AGENT_CONTAINER = "tabby-node"
AGENT_RESTART_TIMEOUT_S = 330.0  # kubelet's crash back-off reaches 300 s
POD_READY_TIMEOUT_S = 240.0  # a burst of 50 ADDs on one real node, on 2 cores
POD_GC_TIMEOUT_S = 180.0  # kube-controller-manager's pod GC after a Node is deleted
REJOIN_TIMEOUT_S = 180.0
CONTROLLERS_DEPLOYMENT = "deploy/tabby-controllers"
AGENT_DAEMONSET = "ds/tabby-node"
CONFIG_MAP = "tabby-config"


class SoakTarget(Protocol):
    """The lab-specific half of every soak event."""

    name: str
    lab: TruthLab

    def setup(self, gc_interval_s: float, gc_grace_s: float) -> None:
        """tabby-controllers running with these GC intervals, the churn namespace made."""

    def teardown(self) -> None:
        """Stop what ``setup`` started (the lab itself is brought down by the runner)."""

    def create_pods(
        self, namespace: str, node: str, names: Sequence[str], labels: dict[str, str]
    ) -> dict[str, str]:
        """All at once on *node*; the ones that never got networked, with why."""

    def abandon_pods(self, namespace: str, node: str, names: Sequence[str]) -> None:
        """What the runtime does with pods whose ADD failed."""

    def delete_pods(self, namespace: str, names: Sequence[str]) -> None:
        """As a user's ``kubectl delete``: each DEL, then the Pod object gone."""

    def kill_agent(self, node: str) -> None:
        """kill -9 of the node's agent; returns once the next agent serves."""

    def speaker_pid(self, node: str) -> int | None:
        """The host pid of the node's live ExaBGP, or None."""

    def kill_speaker(self, node: str) -> int | None:
        """kill -9 of the node's ExaBGP; the pid killed, or None."""

    def remove_node(self, node: str) -> list[str]:
        """The node lost (its Node deleted); the keys (ns/name) of the pods lost."""

    def rejoin_node(self, node: str) -> None:
        """The node back under its name, serving ADDs."""

    def live_sandboxes(self) -> dict[str, str]:
        """Container (sandbox) ID -> ``ns/name`` of every pod the runtime has running."""

    def pod_endpoints(self) -> list[Endpoint]:
        """Every live sandbox's eth0 address, as its kernel has it."""

    def flush_chain(self, node: str, chain: str) -> None:
        """``iptables -F`` of a filter chain in the node; NetnsError if it is not there."""


class NamespaceTarget:
    """The truth table's namespace lab."""

    name = "namespaces"

    def __init__(self, lab: TruthLab, backend: str) -> None:
        assert isinstance(lab.cluster, LabCluster)
        self.lab = lab
        self.cluster: LabCluster = lab.cluster
        self.backend = backend
        self.controllers: list[subprocess.Popen[str]] = []

    def setup(self, gc_interval_s: float, gc_grace_s: float) -> None:
        log_path = self.cluster.workdir / "controllers.log"
        self.controllers.append(
            start_controllers(self.cluster.kubeconfig, log_path, gc_interval_s, gc_grace_s)
        )

    def teardown(self) -> None:
        stop_processes(self.controllers)
        self.controllers.clear()

    def create_pods(
        self, namespace: str, node: str, names: Sequence[str], labels: dict[str, str]
    ) -> dict[str, str]:
        failed: dict[str, str] = {}

        def add(name: str) -> None:
            try:
                self.cluster.create_pod(namespace, name, node, labels)
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                failed[name] = str(err)

        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            list(pool.map(add, names))
        return failed

    def abandon_pods(self, namespace: str, node: str, names: Sequence[str]) -> None:
        """The runtime's DEL after each failed ADD, once the agent serves again."""
        for name in names:
            self.cluster.abandon_pod(namespace, name, node)

    def delete_pods(self, namespace: str, names: Sequence[str]) -> None:
        with ThreadPoolExecutor(max_workers=max(1, min(20, len(names)))) as pool:
            list(pool.map(lambda n: self.cluster.delete_pod(namespace, n), names))

    def kill_agent(self, node: str) -> None:
        self.cluster.kill_agent(node)

    def speaker_pid(self, node: str) -> int | None:
        return self.cluster.speaker_pid(node)

    def kill_speaker(self, node: str) -> int | None:
        return self.cluster.kill_speaker(node)

    def remove_node(self, node: str) -> list[str]:
        return [pod.key for pod in self.cluster.remove_node(node)]

    def rejoin_node(self, node: str) -> None:
        self.cluster.rejoin_node(node)

    def live_sandboxes(self) -> dict[str, str]:
        return {p.container_id: p.key for p in list(self.cluster.pods.values())}

    def pod_endpoints(self) -> list[Endpoint]:
        out = []
        for pod in list(self.cluster.pods.values()):
            text = netns.ip(pod.netns, "-4", "-o", "addr", "show", "dev", "eth0", check=False)
            out += [Endpoint(f"pod {pod.key}", ip) for ip in _addresses(text)]
        return out

    def flush_chain(self, node: str, chain: str) -> None:
        _, command = BACKENDS[self.backend]
        netns.ns_exec(self.cluster.node(node).netns, [command, "-t", "filter", "-F", chain])


class NodesTarget:
    """The real-node lab: kubelet, containerd, Tabby's DaemonSet and Deployment."""

    name = "nodes"

    def __init__(self, lab: TruthLab, stay_on: str, resync_s: float) -> None:
        assert isinstance(lab.cluster, KubeCluster)
        self.lab = lab
        self.cluster: KubeCluster = lab.cluster
        self.stay_on = stay_on  # a node no fault removes: tabby-controllers runs there
        self.resync_s = resync_s
        self.sandbox_pids: dict[str, int | None] = {}  # sandbox ID -> pid (None: host net)

    # -- setup --------------------------------------------------------------------------
    def setup(self, gc_interval_s: float, gc_grace_s: float) -> None:
        """What an operator sets to watch drift repaired and nodes cleaned up within a
        check: the agents' resync interval (tabby-config, then the DaemonSet rolled),
        tabby-controllers' GC intervals, and the controllers kept off the nodes a fault
        may remove."""
        ns = ("-n", TABBY_NAMESPACE)
        resync = {"data": {"resync_interval": f"{self.resync_s:g}"}}
        self.cluster.kubectl(*ns, "patch", "configmap", CONFIG_MAP, "-p", json.dumps(resync))
        self.cluster.kubectl(*ns, "rollout", "restart", AGENT_DAEMONSET)
        self.cluster.kubectl(
            *ns, "rollout", "status", AGENT_DAEMONSET, f"--timeout={REJOIN_TIMEOUT_S:.0f}s"
        )
        self.cluster.kubectl(
            *ns, "set", "env", CONTROLLERS_DEPLOYMENT,
            f"GC_INTERVAL_SECONDS={gc_interval_s:g}", f"GC_GRACE_SECONDS={gc_grace_s:g}",
        )  # fmt: skip
        pin = {
            "spec": {
                "template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": self.stay_on}}}
            }
        }
        self.cluster.kubectl(*ns, "patch", CONTROLLERS_DEPLOYMENT, "-p", json.dumps(pin))
        self.cluster.kubectl(
            *ns, "rollout", "status", CONTROLLERS_DEPLOYMENT, f"--timeout={REJOIN_TIMEOUT_S:.0f}s"
        )

    def teardown(self) -> None:
        return None  # the Deployment goes with the lab

    # -- pods ---------------------------------------------------------------------------
    def create_pods(
        self, namespace: str, node: str, names: Sequence[str], labels: dict[str, str]
    ) -> dict[str, str]:
        """One ``kubectl create`` of the whole burst (kubelet starts them together),
        then until each is Ready or :data:`POD_READY_TIMEOUT_S` passed."""
        self.cluster.create_namespace(namespace)
        items = [self._churn_pod(namespace, name, node, labels) for name in names]
        body = {"apiVersion": "v1", "kind": "List", "items": items}
        self.cluster.kubectl("create", "-f", "-", stdin=json.dumps(body))
        pending = set(names)
        deadline = time.monotonic() + POD_READY_TIMEOUT_S
        found: dict[str, dict[str, Any]] = {}
        while pending and time.monotonic() < deadline:
            time.sleep(1)
            pods, _ = self.cluster.datastore().list_raw(kinds.POD, namespace)
            found = {p["metadata"]["name"]: p for p in pods if p["metadata"]["name"] in pending}
            for name, pod in found.items():
                if _ready(pod) and pod["status"].get("podIP"):
                    self.cluster.pods[f"{namespace}/{name}"] = KubePod(
                        namespace, name, node, pod["status"]["podIP"], dict(labels)
                    )
                    pending.discard(name)
        return {name: _not_ready_reason(found.get(name)) for name in sorted(pending)}

    def _churn_pod(
        self, namespace: str, name: str, node: str, labels: dict[str, str]
    ) -> dict[str, Any]:
        """A pod that only has to be networked: agnhost sleeping, Ready once started."""
        pod = self.cluster.pod_manifest(namespace, name, node, labels)
        container = pod["spec"]["containers"][0]
        container["args"] = ["pause"]
        container["ports"] = []
        del container["readinessProbe"]
        return pod

    def abandon_pods(self, namespace: str, node: str, names: Sequence[str]) -> None:
        """kubelet retries a failed ADD by itself; a pod never networked is deleted."""
        self.delete_pods(namespace, names)

    def delete_pods(self, namespace: str, names: Sequence[str]) -> None:
        if not names:
            return
        for name in names:
            self.cluster.pods.pop(f"{namespace}/{name}", None)
        self.cluster.kubectl(
            "-n", namespace, "delete", "pod", *names, "--ignore-not-found", "--wait=true",
            f"--timeout={POD_READY_TIMEOUT_S:.0f}s",
        )  # fmt: skip

    # -- the agent and its speaker ------------------------------------------------------
    def _agent_container(self, node: str) -> tuple[str, int] | None:
        """The node's running tabby-node container: its ID and host pid."""
        runtime = self.cluster.kube_node(node).containerd
        ids = runtime.crictl(
            "ps", "-q", "--name", f"^{AGENT_CONTAINER}$", "--state", "running", check=False
        ).split()
        if not ids:
            return None
        info = json.loads(runtime.crictl("inspect", ids[0]))["info"]
        return ids[0], int(info["pid"])

    def kill_agent(self, node: str) -> None:
        """kill -9 of the agent container's process (its ExaBGP dies with it, as in an
        OOM kill); kubelet starts the container again. Returns once that container
        runs and its readiness probe passed."""
        found = self._agent_container(node)
        if found is None:
            raise RuntimeError(f"no running {AGENT_CONTAINER} container on {node}")
        old, pid = found
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + AGENT_RESTART_TIMEOUT_S
        while time.monotonic() < deadline:
            now = self._agent_container(node)
            if now is not None and now[0] != old and self._agent_ready(node, now[0]):
                return
            time.sleep(0.5)
        raise RuntimeError(f"kubelet did not restart {node}'s agent within the timeout")

    def _agent_ready(self, node: str, container_id: str) -> bool:
        """Whether the tabby-node pod on *node* reports this container ready."""
        pods, _ = self.cluster.datastore().list_raw(
            kinds.POD,
            TABBY_NAMESPACE,
            label_selector="app.kubernetes.io/name=tabby-node",
            field_selector=f"spec.nodeName={node}",
        )
        for pod in pods:
            for status in pod.get("status", {}).get("containerStatuses", []):
                if (
                    status["name"] == AGENT_CONTAINER
                    and status.get("ready")
                    and status.get("containerID", "").endswith(container_id)
                ):
                    return True
        return False

    def speaker_pid(self, node: str) -> int | None:
        """The agent's pidfile names its ExaBGP by the container's own pid; the host
        pid is the descendant of the container whose innermost pid is that one."""
        found = self._agent_container(node)
        try:
            record = json.loads((self.cluster.run_dir(node) / "bgp" / "exabgp.pid").read_text())
            inner = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if found is None:
            return None
        for pid in _descendants(found[1]):
            if _innermost_pid(pid) == inner and "exabgp" in _cmdline(pid):
                return pid
        return None

    def kill_speaker(self, node: str) -> int | None:
        pid = self.speaker_pid(node)
        if pid is None:
            return None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return pid

    # -- nodes --------------------------------------------------------------------------
    def remove_node(self, node: str) -> list[str]:
        """Its kubelet stopped and its Node deleted, as when a machine is lost; returns
        once kube-controller-manager's pod GC has deleted the Pods bound to it."""
        self.cluster.kube_node(node).stop_kubelet()
        self.cluster.kubectl("delete", "node", node, "--wait=true")
        deadline = time.monotonic() + POD_GC_TIMEOUT_S
        while self._pods_bound_to(node):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Pods bound to the deleted {node} were not deleted")
            time.sleep(1)
        lost = [key for key, pod in self.cluster.pods.items() if pod.node == node]
        for key in lost:
            self.cluster.pods.pop(key, None)
        return lost

    def _pods_bound_to(self, node: str) -> list[dict[str, Any]]:
        pods, _ = self.cluster.datastore().list_raw(
            kinds.POD, field_selector=f"spec.nodeName={node}"
        )
        return pods

    def rejoin_node(self, node: str) -> None:
        """Its kubelet started again: it registers the Node, tears down the sandboxes of
        the deleted Pods, and the DaemonSet runs a new agent there."""
        kube_node = self.cluster.kube_node(node)
        kube_node.start_kubelet()
        kube_node.wait_ready(self.cluster.kubectl_argv(), REJOIN_TIMEOUT_S)
        self.cluster.wait_daemonset(REJOIN_TIMEOUT_S)
        deadline = time.monotonic() + REJOIN_TIMEOUT_S
        while stale := self._stale_sandboxes(node):
            if time.monotonic() > deadline:
                raise RuntimeError(f"kubelet on {node} kept sandboxes of deleted pods: {stale}")
            time.sleep(1)

    def _stale_sandboxes(self, node: str) -> list[str]:
        """Ready sandboxes on *node* whose Pod (by UID) no longer exists."""
        uids = {p["metadata"]["uid"] for p in self._pods_bound_to(node)}
        return [
            f"{s['metadata']['namespace']}/{s['metadata']['name']}"
            for s in self._sandboxes(node)
            if s["metadata"].get("uid") not in uids
        ]

    # -- what the invariants read ------------------------------------------------------
    def _sandboxes(self, node: str) -> list[dict[str, Any]]:
        runtime = self.cluster.kube_node(node).containerd
        out = runtime.crictl("pods", "--state", "ready", "-o", "json", check=False)
        items: list[dict[str, Any]] = (json.loads(out).get("items") or []) if out else []
        return items

    def live_sandboxes(self) -> dict[str, str]:
        return {
            s["id"]: f"{s['metadata']['namespace']}/{s['metadata']['name']}"
            for node in self.cluster.nodes
            for s in self._sandboxes(node.name)
        }

    def pod_endpoints(self) -> list[Endpoint]:
        """eth0 of each ready sandbox with its own network namespace, entered by the
        sandbox's pid (read once per sandbox through CRI)."""
        out = []
        for node in self.cluster.nodes:
            runtime = self.cluster.kube_node(node.name).containerd
            for sandbox in self._sandboxes(node.name):
                if sandbox["id"] not in self.sandbox_pids:
                    self.sandbox_pids[sandbox["id"]] = _sandbox_pid(
                        runtime.inspect_pod(sandbox["id"])
                    )
                pid = self.sandbox_pids[sandbox["id"]]
                if pid is None:
                    continue  # hostNetwork: the node's own addresses
                key = f"{sandbox['metadata']['namespace']}/{sandbox['metadata']['name']}"
                out += [Endpoint(f"pod {key}", ip) for ip in _eth0_addresses(pid)]
        return out

    def flush_chain(self, node: str, chain: str) -> None:
        """The agent picks its iptables backend itself: flush the chain where it is."""
        errors = []
        for command in ("iptables-legacy", "iptables-nft"):
            try:
                netns.ns_exec(self.cluster.node(node).netns, [command, "-t", "filter", "-F", chain])
                return
            except netns.NetnsError as err:
                errors.append(str(err))
        raise netns.NetnsError("; ".join(errors))


def start_controllers(
    kubeconfig: Path, log_path: Path, gc_interval_s: float, gc_grace_s: float
) -> subprocess.Popen[str]:
    """tabby-controllers as its Deployment runs it, with short GC intervals (what an
    operator sets to watch it); the policy status writer is left out: the soak's
    NetworkPolicy edits are its subject, not writes racing them."""
    argv = [
        str(Path(sys.executable).with_name("tabby-controllers")),
        "--kubeconfig",
        str(kubeconfig),
        "--gc-interval-seconds",
        f"{gc_interval_s:g}",
        "--gc-grace-seconds",
        f"{gc_grace_s:g}",
        "--no-policy-status",
    ]
    with open(log_path, "a") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)


def _addresses(ip_addr_output: str) -> list[str]:
    """The IPv4 addresses in ``ip -o addr`` output."""
    return [w.split("/")[0] for w in ip_addr_output.split() if "/" in w and w[0].isdigit()]


def _eth0_addresses(pid: int) -> list[str]:
    """The IPv4 addresses on eth0 in the network namespace of process *pid*."""
    argv = ["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-4", "-o", "addr", "show", "dev"]
    got = subprocess.run([*argv, "eth0"], capture_output=True, text=True, check=False, timeout=30)
    return _addresses(got.stdout)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _not_ready_reason(pod: dict[str, Any] | None) -> str:
    if pod is None:
        return "the Pod was not found"
    name = pod["metadata"]["name"]
    conditions = pod.get("status", {}).get("conditions") or []
    why = "; ".join(f"{c['type']}={c['status']} {c.get('message', '')}".strip() for c in conditions)
    return (
        f"{name} not Ready after {POD_READY_TIMEOUT_S:.0f}s ({pod['status'].get('phase')}: {why})"
    )


def _sandbox_pid(inspected: dict[str, Any]) -> int | None:
    """The sandbox's pid, or None for a hostNetwork pod (no network namespace of its own)."""
    options = inspected.get("status", {}).get("linux", {}).get("namespaces", {}).get("options", {})
    if options.get("network") == "NODE":
        return None
    return int(inspected["info"]["pid"])


def _descendants(root: int) -> list[int]:
    """Every process below *root* (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _innermost_pid(pid: int) -> int | None:
    """The pid a process has in its own pid namespace (the last of /proc's NSpid)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
