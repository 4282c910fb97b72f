"""A real Kubernetes node in the lab: containerd, kubelet and kube-proxy in a node namespace.

A node is the lab node's network namespace plus a mount namespace of its own. In the
mount namespace the paths a node owns (`/etc/cni/net.d`, `/opt/cni/bin`,
`/var/lib/kubelet`, `/run/tabby`, `/var/run/netns`, ...) are bind mounts of per-node
directories, so the DaemonSet's hostPath volumes, the CNI plugin the runtime executes
and kubelet's own files are per node, while everything else (`/usr`, the Python
interpreter, `/sys/fs/cgroup`) is the host's. Mounts made inside (kubelet's root-dir
bind, container root filesystems, pod namespaces) never reach the host's mount table,
and vanish with the namespace.

Each node has its own cgroup root in every cgroup v1 hierarchy; kubelet creates its
`kubepods` tree under it. See ../shared/research/kubelet-nodes.md for the recipe and
the pitfalls each setting answers (P1-P12 there).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from lab.images import import_images
from lab.kubeproxy import kube_proxy_argv, kube_proxy_config
from lab.netns import run
from lab.process import ManagedProcess, PidRegistry, uts_namespace_of
from lab.runtime import Containerd, remove_cgroup_tree
from lab.topology import Lab, Node

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Where a node's own files live in its mount namespace (bind mounts of per-node dirs).
NODE_PATHS = (
    "/etc/cni/net.d",
    "/opt/cni/bin",
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/run/tabby",
    "/run/containerd",
    "/run/netns",
    "/lib/modules",
)
# CNI plugins a node is provisioned with (kubeadm's kubernetes-cni does the same):
# the runtime's loopback, and the ptp peer's plugins. What Tabby's conflist chains
# (portmap, bandwidth) its install-cni brings: a Tabby node has none of its own.
REFERENCE_PLUGINS = ("loopback", "host-local", "ptp")
PEER_CHAINED_PLUGINS = ("portmap", "bandwidth")  # only where the peer CNI is the ptp one
REFERENCE_PLUGIN_DIR = Path("/usr/lib/cni")
CLUSTER_DOMAIN = "cluster.local"
# The kube-dns Service's address in lab/coredns.yaml (inside the Service range).
CLUSTER_DNS = "10.96.0.10"
READY_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class NodeConfig:
    """What a lab node needs from the cluster: its kubeconfig, pod CIDR, proxy mode."""

    kubeconfig: Path
    bin_dir: Path
    cluster_cidr: str
    proxy_mode: str = "iptables"  # iptables | nftables
    max_pods: int = 110
    cluster_dns: str = CLUSTER_DNS
    cni: str = "tabby"  # tabby | ptp: the peer's nodes get the chained plugins too


class MountNamespace:
    """A persistent mount namespace (a bind-mounted ns file; no process needed), and
    beside it, when given a hostname, the node's UTS namespace: a real node's hostname
    is its name, and hostNetwork pods (which share the runtime's UTS namespace) say so."""

    def __init__(self, path: Path, hostname: str | None = None) -> None:
        self.path = path
        self.hostname = hostname
        self.uts_path = uts_namespace_of(path)

    @staticmethod
    def prepare_dir(directory: Path) -> None:
        """An ns file must live on a private mount: bind the dir onto itself, once."""
        directory.mkdir(parents=True, exist_ok=True)
        if not _is_mountpoint(directory):
            run(["mount", "--bind", str(directory), str(directory)])
            run(["mount", "--make-private", str(directory)])

    def create(self) -> None:
        self.path.touch()
        # slave: the host's later mounts still show inside; the node's never leave it.
        run(["unshare", f"--mount={self.path}", "--propagation", "slave", "true"])
        # A real node's / is shared (systemd does it): the runtime needs it for
        # HostToContainer volumes (/var/run/netns resolves through the /var/run
        # symlink to the root mount). Shared inside this namespace only: its peers
        # are the node's own copies, the host's mounts are not among them.
        self.run(["mount", "--make-rshared", "/"])
        if self.hostname:
            self.uts_path.touch()
            run(["unshare", f"--uts={self.uts_path}", "hostname", self.hostname])

    def run(self, argv: list[str]) -> str:
        return run(["nsenter", f"--mount={self.path}", *argv])

    def bind(self, source: Path, target: str, *, shared: bool = False) -> None:
        self.run(["mount", "--bind", str(source), target])
        if shared:
            self.run(["mount", "--make-shared", target])

    def destroy(self) -> None:
        for path in (self.path, self.uts_path):
            if _is_mountpoint(path):
                run(["umount", str(path)], check=False)
            path.unlink(missing_ok=True)

    @staticmethod
    def release_dir(directory: Path) -> None:
        if _is_mountpoint(directory):
            run(["umount", str(directory)], check=False)


def _is_mountpoint(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)], check=False).returncode == 0


class NodeCgroups:
    """The node's cgroup root in every v1 hierarchy kubelet uses (hybrid layout here)."""

    def __init__(self, name: str) -> None:
        self.name = name.strip("/")

    def hierarchies(self) -> list[Path]:
        return [
            h for h in sorted(CGROUP_ROOT.iterdir()) if h.is_dir() and h.name not in ("unified",)
        ]

    def create(self) -> None:
        for hierarchy in self.hierarchies():
            (hierarchy / self.name).mkdir(exist_ok=True)
        cpuset = CGROUP_ROOT / "cpuset"
        if cpuset.is_dir():  # a new cpuset cgroup starts empty: no process could run in it
            for key in ("cpuset.cpus", "cpuset.mems"):
                (cpuset / self.name / key).write_text((cpuset / key).read_text())

    def kill_leftovers(self) -> list[int]:
        """Kill, by PID, whatever still runs in the node's pids cgroup tree."""
        killed = []
        for procs in (CGROUP_ROOT / "pids" / self.name).glob("**/cgroup.procs"):
            with contextlib.suppress(OSError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), 9)
                        killed.append(int(pid))
        return killed

    def remove(self) -> None:
        remove_cgroup_tree(self.name)


class HostMountpoints:
    """Empty directories created on the host so a node's bind mounts have a target.

    Only directories that were missing are created, each recorded, and removed at
    teardown if still empty and no other lab is running (their mount namespaces would
    lose the bind mount: rmdir detaches mounts in other namespaces).
    """

    def __init__(self, record: Path) -> None:
        self.record = record

    def ensure(self, paths: tuple[str, ...]) -> None:
        created = self._read()
        for path in paths:
            missing = []
            current = Path(path)
            while not current.exists():
                missing.append(current)
                current = current.parent
            for directory in reversed(missing):
                directory.mkdir()
                created.append(str(directory))
        self.record.write_text(json.dumps(created))

    def _read(self) -> list[str]:
        try:
            return list(json.loads(self.record.read_text()))
        except (OSError, ValueError):
            return []

    def remove(self, others_running: bool) -> None:
        if not others_running:
            for path in sorted(self._read(), key=len, reverse=True):
                with contextlib.suppress(OSError):
                    Path(path).rmdir()
        self.record.unlink(missing_ok=True)


class KubeNode:
    """containerd + kubelet + kube-proxy for one lab node, each started by PID."""

    def __init__(self, lab: Lab, node: Node, workdir: Path, config: NodeConfig) -> None:
        self.lab, self.node, self.workdir, self.config = lab, node, workdir, config
        self.mountns = MountNamespace(lab.state_dir / "mntns" / node.name, hostname=node.name)
        self.cgroups = NodeCgroups(f"tabby-{lab.lab_id}-{node.name}")
        self.containerd = Containerd(
            lab,
            node,
            workdir / "containerd",
            cni_bin_dir=Path("/opt/cni/bin"),
            cni_conf_dir=Path("/etc/cni/net.d"),
            crictl=config.bin_dir / "crictl",
            mountns=self.mountns.path,
        )
        self.kubelet: ManagedProcess | None = None
        self.kube_proxy: ManagedProcess | None = None

    def private_dir(self, path: str) -> Path:
        """The host-side directory behind one of the node's own paths (NODE_PATHS)."""
        return self.workdir / "root" / path.strip("/")

    # -- bring-up -----------------------------------------------------------------------
    def start(self, images: list[Path]) -> KubeNode:
        self._make_mount_namespace()
        self.cgroups.create()
        self._provision_cni_plugins()
        pause, *rest = images
        self.containerd.start(pause)
        import_images(self.containerd.socket, rest)  # checks every name arrived
        self.kubelet = self._start("kubelet", self._kubelet_argv())
        self.kube_proxy = self._start("kube-proxy", self._kube_proxy_argv())
        return self

    def _make_mount_namespace(self) -> None:
        MountNamespace.prepare_dir(self.mountns.path.parent)
        self.mountns.create()
        for path in NODE_PATHS:
            source = self.private_dir(path)
            source.mkdir(parents=True, exist_ok=True)
            # Pod namespaces must propagate into the agent's pod (HostToContainer).
            self.mountns.bind(source, path, shared=path == "/run/netns")

    def _provision_cni_plugins(self) -> None:
        bin_dir = self.private_dir("/opt/cni/bin")
        extra = PEER_CHAINED_PLUGINS if self.config.cni == "ptp" else ()
        for name in (*REFERENCE_PLUGINS, *extra):
            if (REFERENCE_PLUGIN_DIR / name).exists():
                shutil.copy2(REFERENCE_PLUGIN_DIR / name, bin_dir / name)

    def _start(self, name: str, argv: list[str]) -> ManagedProcess:
        return self.lab.start_process(
            f"{name}-{self.node.name}", self.node, argv, mountns=self.mountns.path
        )

    # -- kubelet ------------------------------------------------------------------------
    def kubelet_config(self) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # this host is cgroup v1 (hybrid)
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroups.name}",
            "cgroupsPerQOS": True,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd.socket}",
            "volumePluginDir": str(self.workdir / "volume-plugins"),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "evictionHard": {
                "nodefs.available": "0%",
                "nodefs.inodesFree": "0%",
                "imagefs.available": "0%",
            },
            "imageGCHighThresholdPercent": 100,
            "serializeImagePulls": False,
            "resolvConf": "/etc/resolv.conf",
            "clusterDomain": CLUSTER_DOMAIN,
            "clusterDNS": [self.config.cluster_dns],
            "oomScoreAdj": 0,  # this machine will not lower OOM scores (P7)
            "maxPods": self.config.max_pods,
            "registerWithTaints": [],
            "nodeStatusReportFrequency": "10s",
        }

    def _kubelet_argv(self) -> list[str]:
        config = self.workdir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self.kubelet_config()))
        return [
            str(self.config.bin_dir / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={self.config.kubeconfig}",
            "--root-dir=/var/lib/kubelet",
            f"--cert-dir={self.workdir / 'kubelet-pki'}",
            f"--hostname-override={self.node.name}",
            f"--node-ip={self.node.ip}",
            "--node-labels=tabby.dev/lab=true",
            "--v=1",
        ]

    # -- kube-proxy ---------------------------------------------------------------------
    def kube_proxy_config(self) -> dict[str, object]:
        return kube_proxy_config(
            node_name=self.node.name,
            kubeconfig=self.config.kubeconfig,
            mode=self.config.proxy_mode,
            cluster_cidr=self.config.cluster_cidr,
        )

    def _kube_proxy_argv(self) -> list[str]:
        binary = self.config.bin_dir / "kube-proxy"
        return kube_proxy_argv(binary, self.workdir / "kube-proxy.yaml", self.kube_proxy_config())

    # -- teardown -----------------------------------------------------------------------
    def _stop_daemon(self, name: str, proc: ManagedProcess | None) -> None:
        """Our own process, or (after `load`) the one the registry recorded."""
        if proc is not None:
            proc.stop()
        PidRegistry(self.lab.state_dir / "pids.json").kill(f"{name}-{self.node.name}")

    def stop_kubelet(self) -> None:
        self._stop_daemon("kubelet", self.kubelet)
        self.kubelet = None

    def start_kubelet(self) -> None:
        """(Re)start kubelet with the config it had (e.g. after a Node was deleted)."""
        self.kubelet = self._start("kubelet", self._kubelet_argv())

    def stop(self) -> None:
        """kubelet first (it would recreate sandboxes), then pods, containerd, the rest.

        Every step runs whatever an earlier one raised: what is left running in the
        node's cgroups is killed by PID and its mount namespace released regardless.
        """
        errors: list[str] = []
        steps = (
            ("kubelet", self.stop_kubelet),
            ("pods", self.containerd.remove_pods),
            ("kube-proxy", lambda: self._stop_daemon("kube-proxy", self.kube_proxy)),
            ("containerd", lambda: self._stop_daemon("containerd", self.containerd.process)),
            ("leftovers", self.cgroups.kill_leftovers),
            ("cgroups", self._remove_cgroups),
            ("mount namespace", self.mountns.destroy),
        )
        for name, step in steps:
            try:
                step()
            except Exception as exc:  # teardown goes on; reported at the end
                errors.append(f"{name}: {exc}")
        self.kube_proxy = self.containerd.process = None
        if errors:
            raise RuntimeError(f"stopping {self.node.name}: " + "; ".join(errors))

    def _remove_cgroups(self) -> None:
        time.sleep(0.2)  # killed processes leave their cgroups a moment later
        self.cgroups.remove()

    def wait_ready(self, kubectl: list[str], timeout: float = READY_TIMEOUT_S) -> None:
        """Until the Node object reports Ready (needs a CNI config: Tabby installed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(
                [*kubectl, "get", "node", self.node.name, "-o", "json"],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode == 0 and _node_ready(json.loads(out.stdout)):
                return
            time.sleep(0.5)
        raise RuntimeError(f"node {self.node.name} not Ready after {timeout:.0f}s")


def _node_ready(node: dict[str, object]) -> bool:
    status = node.get("status")
    conditions = status.get("conditions", []) if isinstance(status, dict) else []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
