"""Network namespace lab and polling helpers for the BGP integration tests.

Every namespace is named `tbt-<random>`, created here and deleted at teardown,
even when a test fails; ExaBGP processes are stopped by their own PID (process
group) through Speaker.stop(), then killed if they survived.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from bgp.speaker import Speaker
from lab import netns


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class Lab:
    """Namespaces joined by one bridge (in a namespace of its own), plus speakers."""

    prefix: str
    subnet: str = "10.99.0"
    namespaces: list[str] = field(default_factory=list)
    speakers: list[Speaker] = field(default_factory=list)

    def ns(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def add_switch(self) -> str:
        sw = self.ns("sw")
        netns.add(sw)  # through lab.netns so the suite's leftover check knows it is ours
        self.namespaces.append(sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        return sw

    def add_node(self, name: str, host: int) -> str:
        """A node namespace with eth0 = <subnet>.<host>/24 plugged into the bridge."""
        ns, sw = self.ns(name), self.ns("sw")
        netns.add(ns)
        self.namespaces.append(ns)
        port = f"p{host}"
        _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", sw, "link", "set", port, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{self.subnet}.{host}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        return ns

    def routes(self, ns: str) -> str:
        out = subprocess.run(["ip", "-n", ns, "route"], check=True, capture_output=True, text=True)
        return out.stdout

    def teardown(self) -> None:
        for speaker in self.speakers:
            pid = speaker.pid
            with contextlib.suppress(Exception):
                speaker.stop()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        for ns in reversed(self.namespaces):
            netns.delete(ns)


@contextlib.contextmanager
def daemon(ns: str, argv: Sequence[str]) -> Iterator[subprocess.Popen[bytes]]:
    """Run a foreground daemon (BIRD, GoBGP) inside `ns`; killed by its own PID group after."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        stop_daemon(proc)


def stop_daemon(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Signal the daemon's process group, SIGKILL it if it lingers; safe to call twice."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
