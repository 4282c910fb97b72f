"""A whole Tabby cluster on one machine: control plane, node namespaces, agents, pods.

This is what `tabbyctl lab up`, `make demo` and the multi-node tests run. Pods are
created the way a cluster creates them, minus kubelet: a Pod object is written to the
apiserver, a network namespace plays the sandbox, and the node's `tabby` plugin is
executed inside the node namespace with the CNI environment a runtime would give it.

State lives in `<workdir>/cluster.json`, so a later `tabbyctl lab ...` call can find
the lab again; everything started is recorded by PID and stopped by `down()`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bgp.speaker import is_our_speaker
from cni.install import conflist, install_shim
from datastore import kinds
from datastore.client import Datastore
from datastore.errors import AlreadyExists, NotFound
from datastore.models import BGPConfiguration, BGPConfigurationSpec, IPPool, IPPoolSpec, Meta
from lab import netns
from lab.controlplane import ControlPlane
from lab.podlab import PodLab, clear_workdir
from lab.process import ManagedProcess, PidRegistry
from lab.topology import Lab, Node

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
POD_CIDR = "10.244.0.0/16"
RR_CLUSTER_ID = "244.0.0.1"
AGENT_START_TIMEOUT_S = 90.0
Progress = Callable[[str], None]


@dataclass
class PodInfo:
    namespace: str
    name: str
    node: str
    netns: str
    container_id: str
    ip: str
    labels: dict[str, str] = field(default_factory=dict)
    uid: str = ""  # the Pod object's metadata.uid, passed as K8S_POD_UID

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class ClusterSpec:
    nodes: int = 3
    subnets: int = 1
    bgp: str = "mesh"  # mesh | reflectors
    encap: str = "none"  # none | vxlan | ipip
    reflectors: int = 1
    iptables_backend: str = "auto"  # the agents' --iptables-backend
    resync_interval_s: float = 30.0  # the agents' --resync-interval (drift repair)


def _quiet(_: str) -> None:
    return None


class LabCluster(PodLab[PodInfo]):
    """Start with `LabCluster.up(workdir, spec)`, re-open with `LabCluster.load(workdir)`."""

    pod_type = PodInfo

    def __init__(self, workdir: Path, spec: ClusterSpec) -> None:
        self.workdir = workdir
        self.spec = spec
        self.cp: ControlPlane | None = None
        self.lab: Lab | None = None
        self.pods: dict[str, PodInfo] = {}
        self.kubeconfig = workdir / "controlplane" / "kubeconfig"
        self.apiserver_port = 0

    # -- bring-up -----------------------------------------------------------------------
    @classmethod
    def up(cls, workdir: Path, spec: ClusterSpec, progress: Progress = _quiet) -> LabCluster:
        cluster = cls(workdir, spec)
        workdir.mkdir(parents=True, exist_ok=True)
        clear_workdir(workdir)
        try:
            cluster._start(progress)
        except BaseException:
            cluster.down()
            raise
        return cluster

    def _start(self, progress: Progress) -> None:
        progress("starting etcd and kube-apiserver")
        self.cp = ControlPlane.start(self.workdir / "controlplane")
        self.apiserver_port = self.cp.apiserver_port
        socket_path = self.cp.expose_unix_socket()
        progress(f"creating {self.spec.nodes} node namespaces on {self.spec.subnets} subnet(s)")
        assert self.cp.etcd is not None
        self.lab = Lab.create(self.spec.nodes, self.spec.subnets, owner_pid=self.cp.etcd.pid)
        self._save(fresh=True)  # a new lab: nothing of an older cluster.json carries over
        ds = self.datastore()
        self._create_cluster_objects(ds)
        install_shim(self.cni_bin_dir, sys.executable)
        for index, node in enumerate(self.lab.nodes):
            progress(f"starting tabby-node on {node.name} ({node.ip})")
            self._register_node(ds, node, reflector=self._is_reflector(index))
            self.lab.relay_apiserver(node, socket_path, self.apiserver_port)
            self._start_agent(node)
        for node in self.lab.nodes:
            self._wait_agent(node)
        self._save()
        progress("all agents ready")

    def _is_reflector(self, index: int) -> bool:
        return self.spec.bgp == "reflectors" and index < self.spec.reflectors

    def _create_cluster_objects(self, ds: Datastore) -> None:
        encap = self.spec.encap
        spec = IPPoolSpec(
            cidr=POD_CIDR,
            block_size=26,
            vxlan_mode="CrossSubnet" if encap == "vxlan" else "Never",
            ipip_mode="CrossSubnet" if encap == "ipip" else "Never",
            nat_outgoing=False,
        )
        _create(ds.create, IPPool(metadata=Meta(name="default-ipv4-ippool"), spec=spec))
        mesh = self.spec.bgp == "mesh"
        config = BGPConfiguration(
            metadata=Meta(name="default"),
            spec=BGPConfigurationSpec(node_to_node_mesh_enabled=mesh),
        )
        _create(ds.create, config)

    def _register_node(self, ds: Datastore, node: Node, reflector: bool) -> None:
        annotations = {"tabby.dev/ipv4-address": str(node.address)}
        labels = {"kubernetes.io/hostname": node.name, "tabby.dev/lab": "true"}
        if reflector:
            annotations["tabby.dev/route-reflector-cluster-id"] = RR_CLUSTER_ID
            labels["tabby.dev/route-reflector"] = "true"
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.name, "labels": labels, "annotations": annotations},
        }
        _create(lambda b: ds.create_raw(kinds.NODE, b), body)

    def _start_agent(self, node: Node) -> None:
        assert self.lab is not None and self.cp is not None
        argv = [
            str(Path(sys.executable).with_name("tabby-node")),
            "--node-name",
            node.name,
            "--kubeconfig",
            str(self.cp.kubeconfig),
            "--run-dir",
            str(self.run_dir(node.name)),
            "--node-ip",
            str(node.address),
            "--resync-interval",
            f"{self.spec.resync_interval_s:g}",
        ]
        if self.spec.iptables_backend != "auto":
            argv += ["--iptables-backend", self.spec.iptables_backend]
        self.lab.start_process(f"tabby-node-{node.name}", node, argv, env={"PYTHONPATH": str(REPO)})

    def _wait_agent(self, node: Node) -> None:
        assert self.lab is not None
        deadline = time.monotonic() + AGENT_START_TIMEOUT_S
        sock = self.run_dir(node.name) / "cni.sock"
        while not sock.exists():
            proc = self._agent_process(node.name)
            if not proc.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"tabby-node on {node.name} did not start:\n{proc.log_tail(30)}")
            time.sleep(0.1)

    def restart_agent(self, name: str, while_down: Callable[[], None] | None = None) -> int:
        """Stop the node's tabby-node (SIGTERM), run *while_down* (a fault to inject while
        it is stopped), start it again, wait for its CNI socket; returns the new pid."""
        return self._restart_agent(name, ManagedProcess.stop, while_down)

    def kill_agent(self, name: str, while_down: Callable[[], None] | None = None) -> int:
        """kill -9 the node's tabby-node (by PID), run *while_down*, start it again with
        the same args and wait for its CNI socket; returns the new pid."""
        return self._restart_agent(name, _kill, while_down)

    def _restart_agent(
        self,
        name: str,
        stop: Callable[[ManagedProcess], None],
        while_down: Callable[[], None] | None,
    ) -> int:
        assert self.lab is not None
        proc = self._agent_process(name)
        stop(proc)
        (self.run_dir(name) / "cni.sock").unlink(missing_ok=True)
        if while_down is not None:
            while_down()
        proc.start()
        PidRegistry(self.lab.state_dir / "pids.json").record(proc)
        self._wait_agent(self.node(name))
        assert proc.pid is not None
        return proc.pid

    def remove_node(self, name: str) -> list[PodInfo]:
        """The node's machine lost, as when a cloud replaces it: its agent and ExaBGP
        killed by PID, its sandboxes gone without a DEL, its Pod objects deleted (the
        pod GC's work) and its Node object deleted. Returns the pods lost with it.

        The node's network namespace stays: :meth:`rejoin_node` brings the node back
        under the same name, as a new machine would register.
        """
        assert self.lab is not None
        _kill(self._agent_process(name))
        self.kill_speaker(name)
        ds = self.datastore()
        lost = [pod for pod in list(self.pods.values()) if pod.node == name]
        for pod in lost:
            self.pods.pop(pod.key, None)
            if netns.exists(pod.netns):
                netns.delete(pod.netns)
            with contextlib.suppress(NotFound):
                ds.delete_raw(kinds.POD, pod.name, pod.namespace)
            self._save(removed=pod.key)
        with contextlib.suppress(NotFound):
            ds.delete_raw(kinds.NODE, name)
        return lost

    def rejoin_node(self, name: str) -> int:
        """A removed node back under its name, as after a reinstall: an empty run dir,
        its Node object registered again, its agent started; returns the agent's pid."""
        assert self.lab is not None
        shutil.rmtree(self.run_dir(name), ignore_errors=True)
        index = [n.name for n in self.nodes].index(name)
        self._register_node(self.datastore(), self.node(name), self._is_reflector(index))
        proc = self._agent_process(name)
        proc.start()
        PidRegistry(self.lab.state_dir / "pids.json").record(proc)
        self._wait_agent(self.node(name))
        assert proc.pid is not None
        return proc.pid

    def _agent_process(self, name: str) -> ManagedProcess:
        assert self.lab is not None
        return next(p for p in self.lab.processes if p.name == f"tabby-node-{name}")

    def speaker_pid(self, name: str) -> int | None:
        """The pid of the live ExaBGP the node's agent started (its pidfile names it)."""
        bgp_dir = self.run_dir(name) / "bgp"
        try:
            record = json.loads((bgp_dir / "exabgp.pid").read_text())
        except (OSError, ValueError):
            return None  # the agent had not started one, or is writing the file
        return int(record["pid"]) if is_our_speaker(record, bgp_dir / "exabgp.conf") else None

    def kill_speaker(self, name: str) -> int | None:
        """kill -9 the node's ExaBGP and wait until it is gone: its BGP sessions end as
        a crashed daemon's do. Returns the pid killed (None: there was none)."""
        pid = self.speaker_pid(name)
        if pid is None:
            return None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        return pid

    # -- access -------------------------------------------------------------------------
    @property
    def cni_bin_dir(self) -> Path:
        return self.workdir / "cni-bin"

    def run_dir(self, node: str) -> Path:
        return self.workdir / "nodes" / node

    def datastore(self) -> Datastore:
        return Datastore.from_kubeconfig(str(self.kubeconfig))

    def node(self, name: str) -> Node:
        assert self.lab is not None
        return self.lab.node(name)

    @property
    def nodes(self) -> list[Node]:
        return self.lab.nodes if self.lab else []

    # -- pods ---------------------------------------------------------------------------
    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        meta = {"name": name, "labels": {"kubernetes.io/metadata.name": name, **(labels or {})}}
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}
        _create(lambda b: self.datastore().create_raw(kinds.NAMESPACE, b), body)

    def create_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        labels: dict[str, str] | None = None,
        ports: Sequence[dict[str, Any]] = (),
    ) -> PodInfo:
        """Pod object, sandbox namespace, then CNI ADD through the node's plugin."""
        assert self.lab is not None
        ds = self.datastore()
        self.create_namespace(namespace)
        container = {"name": "main", "image": "busybox", "ports": list(ports)}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [container]},
        }
        try:
            uid = ds.create_raw(kinds.POD, body)["metadata"]["uid"]
        except AlreadyExists:
            uid = ds.get_raw(kinds.POD, name, namespace)["metadata"]["uid"]
        pod_ns, container_id = self.sandbox_of(namespace, name)
        if not netns.exists(pod_ns):
            netns.add(pod_ns)
        result = self.cni(node, "ADD", container_id, pod_ns, namespace, name, uid)
        ip = result["ips"][0]["address"].split("/")[0]
        self._report_pod_ip(ds, namespace, name, ip)
        pod = PodInfo(namespace, name, node, pod_ns, container_id, ip, labels or {}, uid)
        self.pods[pod.key] = pod
        self._save(added=pod)
        return pod

    def sandbox_of(self, namespace: str, name: str) -> tuple[str, str]:
        """The pod's sandbox: (network namespace, container ID), fixed by its name."""
        assert self.lab is not None
        digest = hashlib.sha1(f"{namespace}.{name}".encode()).hexdigest()
        return self.lab.ns(f"p{digest[:8]}"), digest[:32]

    def abandon_pod(self, namespace: str, name: str, node: str) -> None:
        """What a runtime does after a failed ADD: DEL, remove the sandbox; then the
        Pod object goes too (the pod was never recorded as created)."""
        pod_ns, container_id = self.sandbox_of(namespace, name)
        try:
            uid = self.datastore().get_raw(kinds.POD, name, namespace)["metadata"]["uid"]
        except NotFound:
            uid = ""
        self.cni(node, "DEL", container_id, pod_ns, namespace, name, uid)
        if netns.exists(pod_ns):
            netns.delete(pod_ns)
        with contextlib.suppress(NotFound):
            self.datastore().delete_raw(kinds.POD, name, namespace)

    @staticmethod
    def _report_pod_ip(ds: Datastore, namespace: str, name: str, ip: str) -> None:
        """What kubelet does after a sandbox starts: publish the pod's address."""
        status = {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}
        path = kinds.POD.object_path(name, namespace) + "/status"
        ds.transport.request(
            "PATCH", path, body=status, content_type="application/merge-patch+json"
        )

    def label_pod(self, namespace: str, name: str, labels: dict[str, str | None]) -> None:
        self.datastore().patch_raw(kinds.POD, name, {"metadata": {"labels": labels}}, namespace)

    def apply_policy(self, policy: dict[str, Any]) -> None:
        """Create or replace a NetworkPolicy (the dict as `kubectl apply` would send it)."""
        ds = self.datastore()
        meta = policy["metadata"]
        body = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", **policy}
        try:
            current = ds.get_raw(kinds.NETWORKPOLICY, meta["name"], meta["namespace"])
        except NotFound:
            ds.create_raw(kinds.NETWORKPOLICY, body)
            return
        body["metadata"] = {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}
        ds.replace_raw(kinds.NETWORKPOLICY, body)

    def delete_policy(self, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFound):
            self.datastore().delete_raw(kinds.NETWORKPOLICY, name, namespace)

    def apply_cluster_policy(self, policy: dict[str, Any]) -> None:
        """Create or replace a ClusterNetworkPolicy (``metadata`` and ``spec``)."""
        ds, kind = self.datastore(), kinds.CLUSTERNETWORKPOLICY
        body = {"apiVersion": kind.api_version, "kind": kind.kind, **policy}
        try:
            current = ds.get_raw(kind, policy["metadata"]["name"])
        except NotFound:
            ds.create_raw(kind, body)
            return
        version = current["metadata"]["resourceVersion"]
        body["metadata"] = {**policy["metadata"], "resourceVersion": version}
        ds.replace_raw(kind, body)

    def delete_cluster_policy(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            self.datastore().delete_raw(kinds.CLUSTERNETWORKPOLICY, name)

    def delete_pod(self, namespace: str, name: str) -> None:
        pod = self.pods.pop(f"{namespace}/{name}")
        self.cni(pod.node, "DEL", pod.container_id, pod.netns, namespace, name, pod.uid)
        netns.delete(pod.netns)
        with contextlib.suppress(NotFound):
            self.datastore().delete_raw(kinds.POD, name, namespace)
        self._save(removed=pod.key)

    def cni(
        self,
        node: str,
        command: str,
        container_id: str,
        pod_ns: str,
        namespace: str,
        name: str,
        uid: str = "",
    ) -> dict[str, Any]:
        """Execute the installed plugin inside the node, as a runtime would (containerd
        passes the pod's UID too)."""
        config = conflist(
            socket=str(self.run_dir(node) / "cni.sock"), chain_portmap=False, chain_bandwidth=False
        )
        net = {"cniVersion": config["cniVersion"], "name": config["name"], **config["plugins"][0]}  # type: ignore[index]
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id,
            "CNI_IFNAME": "eth0",
            "CNI_NETNS": f"/run/netns/{pod_ns}",
            "CNI_PATH": str(self.cni_bin_dir),
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"
            + (f";K8S_POD_UID={uid}" if uid else ""),
        }
        proc = subprocess.run(
            ["ip", "netns", "exec", self.node(node).netns, str(self.cni_bin_dir / "tabby")],
            input=json.dumps(net),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        answer: dict[str, Any] = json.loads(proc.stdout) if proc.stdout.strip() else {}
        if proc.returncode != 0:
            raise RuntimeError(
                f"CNI {command} for {namespace}/{name} on {node} failed: "
                f"{answer.get('msg') or proc.stderr.strip()} {answer.get('details', '')}".rstrip()
            )
        return answer

    def exec(
        self, pod: str, argv: Sequence[str], timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside a pod's network namespace."""
        info = self.pods[pod]
        return subprocess.run(
            ["ip", "netns", "exec", info.netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def netns_argv(self, pod: str) -> list[str]:
        """The prefix that runs a host command inside a pod's network namespace."""
        return ["ip", "netns", "exec", self.pods[pod].netns]

    # -- persistence and teardown -------------------------------------------------------
    @classmethod
    def load(cls, workdir: Path) -> LabCluster:
        state = json.loads((workdir / "cluster.json").read_text())
        cluster = cls(workdir, ClusterSpec(**state["spec"]))
        if state["lab_id"]:
            cluster.lab = Lab.load(state["lab_id"])
        cluster.apiserver_port = state["apiserver_port"]
        cluster.pods = {k: PodInfo(**v) for k, v in state["pods"].items()}
        return cluster

    def down(self) -> None:
        """Stop agents, relays and the control plane; remove every namespace."""
        if self.lab is not None:
            self.lab.teardown()
        if self.cp is not None:
            self.cp.stop()
        else:
            PidRegistry(self.workdir / "controlplane" / "pids.json").kill_leftovers()


def _kill(proc: ManagedProcess) -> None:
    """SIGKILL by PID, reaped: no chance to clean up, as the OOM killer does it."""
    if proc.proc is not None:
        proc.proc.kill()
        proc.proc.wait()
    proc.proc = None


def _alive(pid: int) -> bool:
    """Whether *pid* still runs (a zombie waiting for its parent counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _create(create: Callable[[Any], Any], obj: Any) -> None:
    with contextlib.suppress(AlreadyExists):
        create(obj)
