"""The real-node lab: kubelet, containerd and kube-proxy per node, Tabby from its manifests.

    underlay + router + node netns          as in lab.topology
    cp netns (tlab-<id>-cp, on subnet 0)    etcd, kube-apiserver, kube-scheduler,
                                            kube-controller-manager; the host reaches the
                                            apiserver on 127.0.0.1 through a relay
    node netns + mount ns (lab.kubenode)    containerd, kubelet, kube-proxy; Tabby's
                                            DaemonSet pod (hostNetwork) on each

Tabby is installed exactly as a cluster operator does: the objects of `manifests/`
(kustomization.yaml) are applied, the DaemonSet's init container installs the plugin
and conflist into each node's CNI dirs, and the agent talks to the apiserver with its
ServiceAccount through the `kubernetes` Service (kube-proxy). Pods are real Pods:
scheduled, started by kubelet through CRI, networked by Tabby.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import NotFound
from lab import netns
from lab.cluster import LabCluster
from lab.controlplane import ControlPlane
from lab.kubenode import (
    CLUSTER_DNS,
    NODE_PATHS,
    HostMountpoints,
    KubeNode,
    MountNamespace,
    NodeConfig,
)
from lab.podlab import PodLab, clear_workdir
from lab.process import PidRegistry
from lab.topology import Lab, Node, cleanup_stale, live_labs

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
MANIFESTS = REPO / "manifests"
COREDNS_MANIFEST = Path(__file__).resolve().parent / "coredns.yaml"
POD_CIDR = "10.244.0.0/16"
AGNHOST_IMAGE = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
TABBY_NAMESPACE = "kube-system"
CP_HOST = 2  # the control plane's address on subnet 0: 172.31.0.2
READY_TIMEOUT_S = 180.0
Progress = Callable[[str], None]


@dataclass
class KubeSpec:
    nodes: int = 3
    subnets: int = 1
    proxy_mode: str = "iptables"  # kube-proxy's mode: iptables | nftables
    cni: str = "tabby"  # tabby | ptp (Debian's ptp + host-local, the benchmarks' peer)
    # Who enforces NetworkPolicy: tabby, or kube-network-policies (lab/refpolicy.py, with
    # Tabby's policy engine off) to check the upstream suites' harness.
    policy: str = "tabby"
    max_pods: int = 110


@dataclass
class KubePod:
    """A lab pod: the Pod object's node and address, and its sandbox's network ns."""

    namespace: str
    name: str
    node: str
    ip: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _quiet(_: str) -> None:
    return None


class KubeCluster(PodLab[KubePod]):
    """Start with `KubeCluster.up(workdir, spec)`, re-open with `KubeCluster.load(workdir)`."""

    mode = "kubelet"
    pod_type = KubePod

    def __init__(self, workdir: Path, spec: KubeSpec) -> None:
        self.workdir = workdir
        self.spec = spec
        self.cp: ControlPlane | None = None
        self.lab: Lab | None = None
        self.kube_nodes: list[KubeNode] = []
        self.kubeconfig = workdir / "controlplane" / "kubeconfig"
        self.apiserver_port = 0
        self.pods: dict[str, KubePod] = {}
        self.bin_dir: Path | None = None

    # -- bring-up -----------------------------------------------------------------------
    @classmethod
    def up(cls, workdir: Path, spec: KubeSpec, progress: Progress = _quiet) -> KubeCluster:
        cluster = cls(workdir, spec)
        workdir.mkdir(parents=True, exist_ok=True)
        clear_workdir(workdir)
        try:
            cluster._start(progress)
        except BaseException:
            cluster.down()
            # A lab that never came up leaves no cluster.json for `lab up` to refuse.
            for name in ("cluster.json", "cluster.json.lock"):
                (workdir / name).unlink(missing_ok=True)
            raise
        return cluster

    def _start(self, progress: Progress) -> None:
        from lab.images import node_images

        cleanup_stale()
        progress("building images (pause, agnhost, coredns, tabby)")
        images = node_images(self._bin_dir())
        self.lab = Lab.create(self.spec.nodes, self.spec.subnets)
        cp_host = self.lab.add_host("cp", subnet=0, host=CP_HOST)
        netns.ip(cp_host.netns, "route", "add", "default", "via", self.lab.gateway(0))
        self._save(fresh=True)
        progress(f"starting etcd, kube-apiserver, scheduler, controller-manager on {cp_host.ip}")
        self.cp = ControlPlane.start(
            self.workdir / "controlplane", netns=cp_host.netns, address=cp_host.ip
        )
        assert self.cp.etcd is not None and self.cp.etcd.pid is not None
        self.lab.set_owner(self.cp.etcd.pid)  # the lab lives as long as its etcd
        self.cp.start_controllers()
        self.apiserver_port = self.cp.apiserver_port
        self._save()
        HostMountpoints(self.lab.state_dir / "host-mountpoints.json").ensure(NODE_PATHS)
        config = NodeConfig(
            kubeconfig=self.cp.lab_kubeconfig,
            bin_dir=self._bin_dir(),
            cluster_cidr=POD_CIDR,
            proxy_mode=self.spec.proxy_mode,
            max_pods=self.spec.max_pods,
            cni=self.spec.cni,
        )
        names = ", ".join(n.name for n in self.lab.nodes)
        progress(f"starting containerd, kubelet and kube-proxy on {names} (images imported)")
        self.kube_nodes = [
            KubeNode(self.lab, node, self.node_dir(node.name), config) for node in self.lab.nodes
        ]
        MountNamespace.prepare_dir(self.lab.state_dir / "mntns")  # once, before the threads
        # In parallel: importing the images into each containerd is most of a node's
        # start (the Tabby image is unpacked in 6-10 s).
        with ThreadPoolExecutor(max_workers=len(self.kube_nodes)) as pool:
            for started in [pool.submit(n.start, images) for n in self.kube_nodes]:
                started.result()
        if self.spec.cni == "tabby":
            progress("installing Tabby from manifests/ (kubectl apply -k)")
            self.install_tabby()
        else:
            progress("installing Debian's ptp + host-local as the cluster's CNI")
            self._install_ptp()
        progress("waiting for every node to be Ready")
        for kube_node in self.kube_nodes:
            kube_node.wait_ready(self.kubectl_argv(), READY_TIMEOUT_S)
        if self.spec.cni == "tabby":
            self.wait_daemonset()
            if self.spec.policy != "tabby":
                progress(f"starting {self.spec.policy} on every node (Tabby's policy off)")
                from lab import refpolicy

                refpolicy.start(self, REPO, POD_CIDR)
            progress("waiting for the tabby-controllers Deployment")
            self.kubectl(
                "-n", TABBY_NAMESPACE, "rollout", "status", "deploy/tabby-controllers",
                f"--timeout={READY_TIMEOUT_S:.0f}s",
            )  # fmt: skip
        progress(f"deploying cluster DNS (CoreDNS, Service kube-dns {CLUSTER_DNS})")
        self.install_dns()
        progress("all nodes Ready")

    def _bin_dir(self) -> Path:
        """The Kubernetes binaries this lab was started with (recorded in cluster.json:
        a later `lab down` must find crictl whatever $TABBY_CACHE_DIR says then)."""
        if self.bin_dir is None:
            from lab.controlplane import k8s_bin_dir

            self.bin_dir = k8s_bin_dir()
        return self.bin_dir

    def install_tabby(self) -> None:
        """`kubectl apply -k manifests/`: CRDs, RBAC, ConfigMap, DaemonSet, controllers;
        with another policy engine, the same objects with $TABBY_POLICY=off."""
        apply = ("apply", "--server-side", "--force-conflicts")
        if self.spec.policy == "tabby":
            self.kubectl(*apply, "-k", str(MANIFESTS))
            return
        objects = list(yaml.safe_load_all(self.kubectl("kustomize", str(MANIFESTS))))
        for obj in objects:
            if obj and obj.get("kind") == "DaemonSet":
                for container in obj["spec"]["template"]["spec"]["containers"]:
                    container.setdefault("env", []).append({"name": "TABBY_POLICY", "value": "off"})
        self.kubectl(*apply, "-f", "-", stdin=yaml.safe_dump_all([o for o in objects if o]))

    def install_dns(self) -> None:
        """lab/coredns.yaml, as kubeadm's CoreDNS add-on: Service names resolve in pods
        through the CNI under test; wait until it answers (its readiness probe)."""
        self.kubectl("apply", "-f", str(COREDNS_MANIFEST))
        self.kubectl(
            "-n", "kube-system", "rollout", "status", "deploy/coredns",
            f"--timeout={READY_TIMEOUT_S:.0f}s",
        )  # fmt: skip

    def _install_ptp(self) -> None:
        """The peer CNI: ptp + host-local with a static /24 per node, static routes, and
        portmap chained as Tabby's conflist chains it (hostPort works for both)."""
        assert self.lab is not None
        for index, kube_node in enumerate(self.kube_nodes):
            subnet = f"10.244.{index + 1}.0/24"
            conf = {
                "cniVersion": "1.0.0",
                "name": "ptp-peer",
                "plugins": [
                    {
                        "type": "ptp",
                        "ipMasq": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": subnet}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(kube_node.workdir / "host-local"),
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
                ],
            }
            path = kube_node.private_dir("/etc/cni/net.d") / "10-ptp.conflist"
            path.write_text(json.dumps(conf))
            for other in self.kube_nodes:
                if other is not kube_node:
                    netns.ip(other.node.netns, "route", "add", subnet, "via", kube_node.node.ip)

    def wait_daemonset(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until tabby-node's DaemonSet has every desired pod ready and up to date."""
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            out = self.kubectl(
                "-n", TABBY_NAMESPACE, "get", "ds", "tabby-node", "-o", "json", check=False
            )
            if out:
                status = json.loads(out).get("status", {})
                want = status.get("desiredNumberScheduled", -1)
                ready = status.get("numberReady") == want
                updated = status.get("updatedNumberScheduled", want) == want
                if want == len(self.kube_nodes) and ready and updated:
                    return
            time.sleep(1)
        raise RuntimeError(
            f"tabby-node DaemonSet not ready after {timeout:.0f}s: {status}\n"
            + self.agent_diagnostics()
        )

    def agent_diagnostics(self, lines: int = 25) -> str:
        """The tabby-node pods' events and last log lines, for an error message."""
        selector = "app.kubernetes.io/name=tabby-node"
        ns = ["-n", TABBY_NAMESPACE]
        described = self.kubectl(*ns, "describe", "pods", "-l", selector, check=False)
        events = described[described.rfind("Events:") :] if "Events:" in described else ""
        logs = []
        for container in ("install-cni", "tabby-node"):
            out = self.kubectl(
                *ns, "logs", "-l", selector, "-c", container, f"--tail={lines}", check=False
            )
            logs.append(f"--- {container} logs ---\n{out}")
        return "\n".join([f"--- events ---\n{events}", *logs])

    # -- access -------------------------------------------------------------------------
    def node_dir(self, node: str) -> Path:
        return self.workdir / "nodes" / node

    def run_dir(self, node: str) -> Path:
        """The node's /run/tabby (the agent's CNI socket, status, journal), host side."""
        return self.node_dir(node) / "root" / "run" / "tabby"

    def datastore(self) -> Datastore:
        return Datastore.from_kubeconfig(str(self.kubeconfig))

    @property
    def nodes(self) -> list[Node]:
        return self.lab.nodes if self.lab else []

    def node(self, name: str) -> Node:
        assert self.lab is not None
        return self.lab.node(name)

    def kube_node(self, name: str) -> KubeNode:
        for kube_node in self.kube_nodes:
            if kube_node.node.name == name:
                return kube_node
        raise KeyError(name)

    def daemon_pids(self) -> set[int]:
        """Every process this lab started and runs (for the tests' leftover check)."""
        procs = [*(self.lab.processes if self.lab else [])]
        if self.cp is not None:
            return {*(p.pid for p in procs if p.pid), *self.cp.pids_running()}
        return {p.pid for p in procs if p.pid}

    def namespaces(self) -> list[str]:
        return self.lab.namespaces() if self.lab else []

    def owns_cgroup(self, name: str) -> bool:
        """A top-level cgroup of this lab's nodes (kubelet's and containerd's roots)."""
        return self.lab is not None and name.startswith(f"tabby-{self.lab.lab_id}-")

    def state_prefix(self) -> str:
        return str(self.lab.state_dir) if self.lab else "/nonexistent"

    def kubectl_argv(self) -> list[str]:
        return [str(self._bin_dir() / "kubectl"), f"--kubeconfig={self.kubeconfig}"]

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        proc = subprocess.run(
            [*self.kubectl_argv(), *args],
            capture_output=True,
            text=True,
            input=stdin,
            check=False,
            timeout=300,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    # -- pods ---------------------------------------------------------------------------
    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}},
        }
        self.kubectl("apply", "-f", "-", stdin=json.dumps(body))

    def pod_manifest(
        self,
        namespace: str,
        name: str,
        node: str | None,
        labels: dict[str, str] | None = None,
        ports: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        """An agnhost pod serving HTTP on 8080 (netexec), scheduled onto `node`; *ports*
        are declared beside it (named ports a policy may use; something else serves them)."""
        spec: dict[str, Any] = {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "agnhost",
                    "image": AGNHOST_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["netexec", "--http-port=8080", "--udp-port=-1"],
                    "ports": [{"containerPort": 8080, "name": "http"}, *ports],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                }
            ],
        }
        if node:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": spec,
        }

    def create_pod(
        self,
        namespace: str,
        name: str,
        node: str | None = None,
        labels: dict[str, str] | None = None,
        ports: Sequence[dict[str, Any]] = (),
    ) -> KubePod:
        """A Pod object: kube-scheduler places it, kubelet starts it, Tabby networks it."""
        self.create_namespace(namespace)
        body = self.pod_manifest(namespace, name, node, labels, ports)
        self.kubectl("apply", "-f", "-", stdin=json.dumps(body))
        try:
            self.kubectl(
                "-n", namespace, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s"
            )
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{self.pod_diagnostics(namespace, name)}") from None
        pod = self._pod_from_api(namespace, name)
        self._save(added=pod)
        return pod

    def pod_diagnostics(self, namespace: str, name: str, lines: int = 30) -> str:
        """A pod's events, and the last lines of the agent's log on its node."""
        described = self.kubectl("-n", namespace, "describe", "pod", name, check=False)
        events = described[described.rfind("Events:") :] if "Events:" in described else ""
        node = self._pod_from_api(namespace, name).node
        agents = tabby_pods_by_node(self).get(node, {})
        agent_log = ""
        if agents:
            agent_log = self.kubectl(
                "-n", TABBY_NAMESPACE, "logs", agents["pod"], "-c", "tabby-node",
                f"--tail={lines}", check=False,
            )  # fmt: skip
        return f"--- events ---\n{events}\n--- tabby-node on {node} ---\n{agent_log}"

    def network_diagnostics(self, nodes: Sequence[str], pods: Sequence[str] = ()) -> str:
        """What decides reachability, for a failing test's message: per node its routes,
        BGP peers (the agent's status file) and block affinities; per pod its record,
        addresses and routes inside its namespace; the agents' last log lines."""
        affinities: dict[str, list[str]] = {}
        with contextlib.suppress(Exception):
            items, _ = self.datastore().list_raw(kinds.BLOCKAFFINITY)
            for item in items:
                spec = item.get("spec", {})
                affinities.setdefault(spec.get("node", "?"), []).append(spec.get("cidr", "?"))
        parts = []
        for name in nodes:
            routes = netns.ip(self.node(name).netns, "route", "show", check=False)
            status = self.run_dir(name) / "bgp-status.json"
            try:
                peers = json.loads(status.read_text()).get("peers", [])
                bgp = "\n".join(
                    f"  {p.get('node')} {p.get('address')}: {p.get('state')} ({p.get('info')}),"
                    f" {p.get('routesReceived')} routes received, since {p.get('since')}"
                    for p in peers
                )
            except (OSError, ValueError) as exc:
                bgp = f"  (no status: {exc})"
            parts.append(
                f"=== node {name}: affinities {sorted(affinities.get(name, []))}\n"
                f"--- routes ---\n{routes}--- bgp peers ---\n{bgp}"
            )
        for key in pods:
            info = self.pods.get(key)
            inside = self.exec(key, ["ip", "-o", "addr"]).stdout if info else ""
            inside += self.exec(key, ["ip", "route"]).stdout if info else ""
            parts.append(f"=== pod {key}: {info}\n{inside}")
        agents = tabby_pods_by_node(self)
        for name in nodes:
            agent = agents.get(name, {}).get("pod")
            if agent:
                logs = self.kubectl(
                    "-n", TABBY_NAMESPACE, "logs", agent, "-c", "tabby-node", "--tail=20",
                    check=False,
                )  # fmt: skip
                parts.append(f"=== tabby-node {agent} on {name} (last 20 lines)\n{logs}")
        return "\n".join(parts)

    def _pod_from_api(self, namespace: str, name: str) -> KubePod:
        obj = json.loads(self.kubectl("-n", namespace, "get", "pod", name, "-o", "json"))
        return KubePod(
            namespace,
            name,
            obj["spec"].get("nodeName", ""),
            obj["status"].get("podIP", ""),
            obj["metadata"].get("labels") or {},
        )

    def delete_pod(self, namespace: str, name: str) -> None:
        self.kubectl("-n", namespace, "delete", "pod", name, "--wait=true", "--timeout=120s")
        self._save(removed=f"{namespace}/{name}")

    def label_pod(self, namespace: str, name: str, labels: dict[str, str | None]) -> None:
        self.datastore().patch_raw(kinds.POD, name, {"metadata": {"labels": labels}}, namespace)

    def apply_policy(self, policy: dict[str, Any]) -> None:
        body = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", **policy}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(body))

    def delete_policy(self, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFound):
            self.datastore().delete_raw(kinds.NETWORKPOLICY, name, namespace)

    def apply_cluster_policy(self, policy: dict[str, Any]) -> None:
        """Create or replace a ClusterNetworkPolicy (``metadata`` and ``spec``)."""
        kind = kinds.CLUSTERNETWORKPOLICY
        body = {"apiVersion": kind.api_version, "kind": kind.kind, **policy}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(body))

    def delete_cluster_policy(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            self.datastore().delete_raw(kinds.CLUSTERNETWORKPOLICY, name)

    def sandbox_pid(self, pod: str) -> int:
        """The pid of the pod's sandbox (pause) process, found through the node's CRI."""
        info = self.pods[pod]
        runtime = self.kube_node(info.node).containerd
        namespace, name = info.namespace, info.name
        ids = runtime.crictl(
            "pods", "-q", "--namespace", namespace, "--name", f"^{name}$", "--state", "ready"
        ).split()
        if not ids:
            raise RuntimeError(f"no ready sandbox for {pod} on {info.node}")
        return int(runtime.inspect_pod(ids[0])["info"]["pid"])

    def netns_argv(self, pod: str) -> list[str]:
        """The prefix that runs a host command inside a pod's network namespace."""
        return ["nsenter", f"--net=/proc/{self.sandbox_pid(pod)}/ns/net"]

    def exec(
        self, pod: str, argv: Sequence[str], timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run a host command inside the pod's network namespace (as `lab exec` does)."""
        return subprocess.run(
            [*self.netns_argv(pod), *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # -- persistence and teardown -------------------------------------------------------
    def _extra_state(self) -> dict[str, Any]:
        return {"bin_dir": str(self._bin_dir())}

    @classmethod
    def load(cls, workdir: Path) -> KubeCluster:
        state = json.loads((workdir / "cluster.json").read_text())
        cluster = cls(workdir, KubeSpec(**state["spec"]))
        if state.get("bin_dir"):
            cluster.bin_dir = Path(state["bin_dir"])
        if state["lab_id"]:
            cluster.lab = Lab.load(state["lab_id"])
            config = NodeConfig(
                kubeconfig=workdir / "controlplane" / "kubeconfig-lab",
                bin_dir=cluster._bin_dir(),
                cluster_cidr=POD_CIDR,
                proxy_mode=cluster.spec.proxy_mode,
                max_pods=cluster.spec.max_pods,
                cni=cluster.spec.cni,
            )
            cluster.kube_nodes = [
                KubeNode(cluster.lab, n, cluster.node_dir(n.name), config)
                for n in cluster.lab.nodes
            ]
        cluster.apiserver_port = state["apiserver_port"]
        cluster.pods = {k: KubePod(**v) for k, v in state["pods"].items()}
        return cluster

    def down(self) -> None:
        """Pods through CRI (CNI DEL runs), daemons by PID, mounts, cgroups, namespaces."""
        for kube_node in self.kube_nodes:
            try:
                kube_node.stop()
            except Exception:  # teardown goes on whatever fails
                log.exception("stopping %s", kube_node.node.name)
        if self.cp is not None:
            self.cp.stop()
        else:
            PidRegistry(self.workdir / "controlplane" / "pids.json").kill_leftovers()
        if self.lab is not None:
            state_dir = self.lab.state_dir
            others = [lab_id for lab_id in live_labs() if lab_id != self.lab.lab_id]
            HostMountpoints(state_dir / "host-mountpoints.json").remove(bool(others))
            MountNamespace.release_dir(state_dir / "mntns")
            self.lab.teardown()


def load_lab(workdir: Path) -> LabCluster | KubeCluster:
    """Re-open whichever lab `tabbyctl lab up` made in workdir."""
    state = json.loads((workdir / "cluster.json").read_text())
    if state.get("mode") == KubeCluster.mode:
        return KubeCluster.load(workdir)
    return LabCluster.load(workdir)


def tabby_pods_by_node(cluster: KubeCluster) -> dict[str, dict[str, Any]]:
    """The tabby-node pod on each node: name, phase, readiness (for `lab status`)."""
    out = cluster.kubectl(
        "-n",
        TABBY_NAMESPACE,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=tabby-node",
        "-o",
        "json",
        check=False,
    )
    pods: dict[str, dict[str, Any]] = {}
    for item in json.loads(out).get("items", []) if out else []:
        conditions = item.get("status", {}).get("conditions", [])
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        pods[item["spec"].get("nodeName", "")] = {
            "pod": item["metadata"]["name"],
            "ready": ready,
        }
    return pods
