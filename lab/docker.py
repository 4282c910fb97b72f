"""A Docker daemon for a harness, kept off the host: kind runs its nodes through it.

Debian's dockerd (docker.io 20.10, hack/install-deps.sh) started so that nothing of it
reaches the host:

- its own network namespace (`tbt-dockerd-*`), entered with `nsenter --net`, not `ip
  netns exec`, which mounts a fresh /sys and hides the cgroup hierarchies from it:
  its bridge, addresses, routes, iptables rules and ip_forward live there;
- its own mount namespace with private propagation (`unshare --mount`): overlay
  mounts and the containers' namespace files never appear in the host's mount table,
  and they go when its last process does; /run/containerd is covered with a tmpfs
  there so that it never adopts another containerd and runs its own;
- its own data root (in the harness' folder), exec root, socket and pid file (in a
  short /tmp folder: socket paths have a length limit), and
  its containers' cgroups under one parent of its own (`tabby-docker-*`), removed at
  the end;
- when this host's capability bounding set lacks capabilities runc would grant a
  `--privileged` container (here CAP_SYS_RESOURCE: "unable to apply caps"), a runc
  wrapper as its default runtime drops them from the bundle's config.json (create,
  run) and from `runc exec`'s process file. Detected, not assumed.

`stop` removes every container, then stops dockerd, then kills by PID whatever is
left in its network namespace and its cgroup parent, removes that cgroup tree and
the namespace.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from lab import netns
from lab.kubenode import NodeCgroups

log = logging.getLogger(__name__)

DOCKERD = "/usr/sbin/dockerd"
DOCKER = "/usr/bin/docker"  # Debian's client (a newer one may shadow it on PATH)
RUNC = "/usr/sbin/runc"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0

# Linux capability numbers (include/uapi/linux/capability.h), as runc names them.
CAPABILITIES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)  # fmt: skip

# The runc wrapper: argv[1] is a JSON list of capability names to drop.
RUNC_WRAPPER = """#!{python} -IS
import json, os, sys
DROP = set(json.loads({drop!r}))
RUNC = {runc!r}

def strip(path):
    with open(path) as f:
        doc = json.load(f)
    caps = (doc.get("process", doc) or {{}}).get("capabilities") or {{}}
    for key, names in list(caps.items()):
        if isinstance(names, list):
            caps[key] = [n for n in names if n not in DROP]
    with open(path + ".tabby", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tabby", path)

args = sys.argv[1:]
command = next((a for a in args if not a.startswith("-") and a in
                ("create", "run", "exec")), None)
def value(*flags):
    for i, a in enumerate(args):
        for flag in flags:
            if a == flag and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
    return None
if command in ("create", "run"):
    strip(os.path.join(value("--bundle", "-b") or os.getcwd(), "config.json"))
elif command == "exec":
    process = value("--process", "-p")
    if process:
        strip(process)
os.execv(RUNC, [RUNC, *args])
"""


class DockerError(RuntimeError):
    """dockerd would not start, or a docker command failed; says which and why."""


def missing_capabilities(status: str | None = None) -> list[str]:
    """Capabilities this kernel has but the bounding set lacks: runc cannot grant them,
    and a --privileged container asks for all."""
    text = status if status is not None else Path("/proc/self/status").read_text()
    [bounding] = [line.split()[1] for line in text.splitlines() if line.startswith("CapBnd:")]
    mask = int(bounding, 16)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    return [name for bit, name in enumerate(CAPABILITIES[: last + 1]) if not mask & (1 << bit)]


class DockerDaemon:
    """One dockerd in namespaces of its own (module docstring)."""

    def __init__(self, workdir: Path) -> None:
        tag = secrets.token_hex(3)
        self.workdir = workdir
        self.netns = f"tbt-dockerd-{tag}"
        self.cgroup_parent = f"tabby-docker-{tag}"
        # Sockets live here, not in workdir: containerd's under the exec root must fit
        # in a unix socket path (104 bytes), which a pytest tmp_path does not.
        self.run_dir = Path(f"/tmp/tbt-dockerd-{tag}")
        self.socket = self.run_dir / "docker.sock"
        self.log_file = workdir / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.dropped: list[str] = []

    # -- start ----------------------------------------------------------------------------
    @classmethod
    def start(cls, workdir: Path) -> DockerDaemon:
        daemon = cls(workdir)
        try:
            daemon._start()
        except BaseException:
            daemon.stop()
            raise
        return daemon

    def _argv(self) -> list[str]:
        argv = [
            DOCKERD,
            f"--host=unix://{self.socket}",
            f"--data-root={self.workdir / 'data'}",
            f"--exec-root={self.run_dir / 'exec'}",
            f"--pidfile={self.run_dir / 'dockerd.pid'}",
            f"--cgroup-parent=/{self.cgroup_parent}",
            "--exec-opt=native.cgroupdriver=cgroupfs",
            "--storage-driver=overlay2",
        ]
        self.dropped = missing_capabilities()
        if self.dropped:
            wrapper = self.workdir / "runc-wrapper"
            wrapper.write_text(
                RUNC_WRAPPER.format(python=sys.executable, drop=json.dumps(self.dropped), runc=RUNC)
            )
            wrapper.chmod(0o755)
            argv += [f"--add-runtime=tabby-runc={wrapper}", "--default-runtime=tabby-runc"]
        return argv

    def _start(self) -> None:
        for tool in (DOCKERD, DOCKER, RUNC):
            if not Path(tool).exists():
                raise DockerError(f"{tool} is missing: hack/install-deps.sh installs docker.io")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(mode=0o700)
        netns.add(self.netns)
        # Inside the private mount namespace: no other containerd is ever adopted.
        setup = '[ -d /run/containerd ] && mount -t tmpfs tabby-docker /run/containerd; exec "$@"'
        argv = [
            "nsenter", f"--net={netns.NETNS_DIR / self.netns}",
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", setup, "sh", *self._argv(),
        ]  # fmt: skip
        with self.log_file.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DockerError(f"dockerd exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.docker("info", check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise DockerError(f"dockerd did not answer in {START_TIMEOUT_S:.0f}s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    # -- use --------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The environment for tools that call `docker` themselves (kind)."""
        return {**os.environ, "DOCKER_HOST": f"unix://{self.socket}"}

    def docker(
        self, *args: str, check: bool = True, stdin: bytes | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            [DOCKER, f"--host=unix://{self.socket}", *args],
            input=stdin,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise DockerError(f"docker {' '.join(args)}: {done.stderr.decode(errors='replace')}")
        return done

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Containers, dockerd, then whatever is left, by PID; the cgroups; the namespace."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired, DockerError):
                ids = self.docker("ps", "-aq", check=False, timeout=30).stdout.decode().split()
                if ids:
                    self.docker("rm", "-f", "-v", *ids, check=False, timeout=120)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._kill_leftovers()
        NodeCgroups(self.cgroup_parent).remove()
        if netns.exists(self.netns):
            netns.delete(self.netns)
        shutil.rmtree(self.workdir / "data", ignore_errors=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _kill_leftovers(self) -> None:
        """containerd, shims and container processes that outlived dockerd, by PID:
        what runs in its namespace, then what runs in its cgroup parent."""
        cgroups = NodeCgroups(self.cgroup_parent)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            in_netns = netns.pids_in(self.netns) if netns.exists(self.netns) else []
            for pid in in_netns:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if not in_netns and not cgroups.kill_leftovers():
                return
            time.sleep(0.1)
        log.warning("dockerd's processes survived SIGKILL for %.0fs", STOP_TIMEOUT_S)
