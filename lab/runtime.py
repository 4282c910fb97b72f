"""A real container runtime for a lab node: Debian's containerd + runc, driven over CRI.

containerd runs inside the node's network namespace (entered with nsenter so that
cgroups stay visible) with its own root, state dir, socket and CNI directories, so
the CNI plugin it executes wires the host side of each pod into that node, never
into the host. Pods are sandboxes (the pause container) created through crictl, a
real CRI client, exactly as kubelet would: RunPodSandbox creates the sandbox's network
namespace first and only then calls the CNI plugin with its path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from lab.netns import run
from lab.process import ManagedProcess
from lab.topology import Lab, Node

log = logging.getLogger(__name__)

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
# The same image under the tag the pinned e2e framework runs as a plain container
# (imageutils.GetPauseImageName(), e.g. the Service latency spec's Deployment).
PAUSE_ALIASES = ("registry.k8s.io/pause:3.10.2",)
START_TIMEOUT_S = 60.0


def build_pause_image(pause_binary: Path, cache_dir: Path) -> Path:
    """An image archive holding only the static pause binary (umoci + skopeo, no registry)."""
    names = hashlib.sha256(" ".join((PAUSE_IMAGE, *PAUSE_ALIASES)).encode()).hexdigest()
    archive = cache_dir / f"pause-image-{names[:12]}.tar"  # other tags: another archive
    if archive.exists():
        return archive
    cache_dir.mkdir(parents=True, exist_ok=True)
    layout, bundle = cache_dir / "pause-oci", cache_dir / "pause-bundle"
    shutil.rmtree(layout, ignore_errors=True)
    shutil.rmtree(bundle, ignore_errors=True)
    run(["umoci", "init", "--layout", str(layout)])
    run(["umoci", "new", "--image", f"{layout}:pause"])
    run(["umoci", "unpack", "--rootless", "--image", f"{layout}:pause", str(bundle)])
    shutil.copy2(pause_binary, bundle / "rootfs" / "pause")
    run(["umoci", "repack", "--image", f"{layout}:pause", str(bundle)])
    run(["umoci", "config", "--image", f"{layout}:pause", "--config.entrypoint", "/pause"])
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    run(
        [
            "skopeo",
            "copy",
            "--quiet",
            *(arg for alias in PAUSE_ALIASES for arg in ("--additional-tag", alias)),
            f"oci:{layout}:pause",
            f"docker-archive:{partial}:{PAUSE_IMAGE}",
        ]
    )
    partial.rename(archive)
    shutil.rmtree(bundle, ignore_errors=True)
    return archive


class Containerd:
    """containerd for one lab node, plus a crictl wrapper for the CRI calls tests make."""

    def __init__(
        self,
        lab: Lab,
        node: Node,
        workdir: Path,
        *,
        cni_bin_dir: Path,
        cni_conf_dir: Path,
        crictl: Path,
        mountns: Path | None = None,
    ) -> None:
        self.lab, self.node, self.workdir = lab, node, workdir
        self.cni_bin_dir, self.cni_conf_dir, self.crictl_bin = cni_bin_dir, cni_conf_dir, crictl
        self.socket = workdir / "containerd.sock"
        self.cgroup_parent = f"/tabby-{lab.lab_id}-{node.name}"
        # A kubelet node (lab.kubenode) has its own mount namespace: pod namespaces are
        # then mounted where a real node has them (/var/run/netns, private to the node)
        # and the agent's pod sees them through its HostToContainer hostPath.
        self.mountns = mountns
        self.process: ManagedProcess | None = None

    def config_toml(self) -> str:
        w = self.workdir
        return f"""version = 2
root = "{w / "root"}"
state = "{w / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{w / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = {"false" if self.mountns else "true"}
  enable_selinux = false
  # hugetlb is not mounted as a cgroup v1 hierarchy on this machine.
  tolerate_missing_hugepages_controller = true
  # This machine cannot lower a process's OOM score below its own (no CAP_SYS_RESOURCE
  # over it); without this, runc fails with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state per node: its default, /run/containerd/runc, is shared by
        # every containerd on the machine.
        Root = "{w / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{self.cni_bin_dir}"
    conf_dir = "{self.cni_conf_dir}"
    max_conf_num = 1
"""

    # -- lifecycle ----------------------------------------------------------------------
    def start(self, pause_archive: Path, *images: Path) -> Containerd:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.toml"
        config.write_text(self.config_toml())
        self.process = self.lab.start_process(
            f"containerd-{self.node.name}",
            self.node,
            ["containerd", "--config", str(config), "--log-level", "warn"],
            keep_mounts=True,
            mountns=self.mountns,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if not self.process.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start:\n{self.process.log_tail()}")
            time.sleep(0.2)
        for archive in (pause_archive, *images):
            run(
                ["ctr", "-a", str(self.socket), "-n", "k8s.io", "images", "import", str(archive)],
                timeout=300,
            )
        return self

    def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        out = subprocess.run(
            [str(self.crictl_bin), *self._endpoint(), "version"],
            capture_output=True,
            check=False,
            timeout=10,
        )
        return out.returncode == 0

    def stop(self) -> None:
        """Remove every pod (so CNI DEL runs and netns mounts go), then stop containerd."""
        if self.process is None:
            return
        if self.process.alive():
            self.remove_pods()
        self.process.stop()
        self.process = None
        self._kill_cgroup_leftovers()
        remove_cgroup_tree(self.cgroup_parent)

    def remove_pods(self) -> None:
        """StopPodSandbox + RemovePodSandbox for every pod (CNI DEL runs for each)."""
        if not self._answers():
            return
        for pod in self.pods():
            self.crictl("stopp", pod, check=False)
            self.crictl("rmp", "-f", pod, check=False)

    def kill_cgroup_leftovers(self) -> None:
        self._kill_cgroup_leftovers()

    def _kill_cgroup_leftovers(self) -> None:
        """Sandbox processes live in our cgroup parent: kill any that survived, by PID."""
        for procs in Path("/sys/fs/cgroup/pids").glob(
            f"{self.cgroup_parent.lstrip('/')}/**/cgroup.procs"
        ):
            for pid in procs.read_text().split():
                subprocess.run(["kill", "-9", pid], check=False)

    # -- CRI calls ----------------------------------------------------------------------
    def _endpoint(self) -> list[str]:
        sock = f"unix://{self.socket}"
        return ["--runtime-endpoint", sock, "--image-endpoint", sock, "--timeout", "60s"]

    def crictl(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(
            [str(self.crictl_bin), *self._endpoint(), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"crictl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def run_pod_sandbox(self, name: str, namespace: str, uid: str | None = None) -> str:
        """RunPodSandbox as kubelet would; returns the sandbox id."""
        config = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid or f"uid-{name}",
                "attempt": 0,
            },
            "log_directory": str(self.workdir / "pod-logs" / namespace / name),
            "linux": {
                "cgroup_parent": self.cgroup_parent,
                "security_context": {"namespace_options": {"network": 0}},
            },
        }
        path = self.workdir / f"pod-{namespace}-{name}.json"
        path.write_text(json.dumps(config))
        return self.crictl("runp", str(path)).strip()

    def inspect_pod(self, pod_id: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.crictl("inspectp", pod_id))
        return result

    def pod_netns_path(self, pod_id: str) -> str:
        spec = self.inspect_pod(pod_id)["info"]["runtimeSpec"]
        for ns in spec["linux"]["namespaces"]:
            if ns["type"] == "network":
                return str(ns["path"])
        raise RuntimeError(f"sandbox {pod_id} has no network namespace path")

    def pods(self) -> list[str]:
        return self.crictl("pods", "-q", check=False).split()


def remove_cgroup_tree(name: str) -> None:
    """rmdir a (process-free) cgroup and its children in every v1 hierarchy, deepest first."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        root = hierarchy / name.strip("/")
        if not root.is_dir():
            continue
        for directory in sorted(root.glob("**/"), key=lambda p: len(p.parts), reverse=True):
            try:
                directory.rmdir()
            except OSError:
                log.debug("cgroup %s not removed (busy)", directory)
