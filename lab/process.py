"""Start and stop the lab's daemons by PID, with logs, and find ones a crashed run left.

Every daemon the lab starts is recorded in a pid file inside the lab's work dir,
with the command line it was started with, so that a later run can stop exactly
those processes (and never an unrelated one that reused the PID).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0
_REGISTRY_LOCK = threading.Lock()


def uts_namespace_of(mountns: Path) -> Path:
    """The UTS namespace file a lab node keeps beside its mount namespace file."""
    return mountns.with_name(f"{mountns.name}.uts")


class ManagedProcess:
    """One daemon: started with its output in a log file, stopped by PID."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        netns: str | None = None,
        keep_mounts: bool = False,
        mountns: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        if netns and mountns:
            # A lab node's daemons: its network namespace and its own mount namespace
            # (per-node /etc/cni/net.d, /var/lib/kubelet, ...; see lab.kubenode), and
            # the node's UTS namespace (its hostname) where the node has one.
            uts = uts_namespace_of(mountns)
            self.argv = [
                "nsenter", f"--net=/run/netns/{netns}", f"--mount={mountns}",
                *([f"--uts={uts}"] if uts.exists() else []), *self.argv,
            ]  # fmt: skip
        elif netns and keep_mounts:
            # `ip netns exec` remounts /sys (hiding cgroups from runtimes); nsenter
            # enters only the network namespace.
            self.argv = ["nsenter", f"--net=/run/netns/{netns}", *self.argv]
        elif netns:
            self.argv = ["ip", "netns", "exec", netns, *self.argv]
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> ManagedProcess:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env} if self.env else None,
                start_new_session=True,
            )
        log.debug("started %s pid=%d: %s", self.name, self.proc.pid, " ".join(self.argv))
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, then SIGKILL after timeout; always reaps the child."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class PidRegistry:
    """pids.json in a work dir: which daemons this lab started, to clean up after a crash."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, dict[str, object]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def record(self, process: ManagedProcess) -> None:
        with _REGISTRY_LOCK:  # nodes start in parallel threads (lab.kubecluster)
            data = self._read()
            data[process.name] = {"pid": process.pid, "argv": " ".join(process.argv)}
            self.path.write_text(json.dumps(data, indent=1))

    def forget(self, name: str) -> None:
        with _REGISTRY_LOCK:
            data = self._read()
            data.pop(name, None)
            self.path.write_text(json.dumps(data, indent=1))

    def kill(self, name: str) -> bool:
        """Stop one recorded daemon (started by another process) by its PID."""
        entry = self._read().get(name)
        if not entry:
            return False
        pid = int(entry.get("pid") or 0)  # type: ignore[call-overload]
        running = pid > 0 and _runs(pid, str(entry.get("argv", "")))
        if running:
            _kill_and_wait(pid)
        self.forget(name)
        return running

    def kill_leftovers(self) -> list[int]:
        """Kill recorded PIDs that still run the recorded command line; return them."""
        killed = []
        for entry in self._read().values():
            pid = int(entry.get("pid") or 0)  # type: ignore[call-overload]
            if pid > 0 and _runs(pid, str(entry.get("argv", ""))):
                _kill_and_wait(pid)
                killed.append(pid)
        self.path.unlink(missing_ok=True)
        return killed


def _runs(pid: int, argv: str) -> bool:
    """Whether pid still runs what we started: the same command line, or the command a
    wrapper (`ip netns exec NS ...`, `nsenter ...`) replaced itself with."""
    current = _cmdline_of(pid)
    return bool(current and argv) and (current == argv or argv.endswith(" " + current))


def _cmdline_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _kill_and_wait(pid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
