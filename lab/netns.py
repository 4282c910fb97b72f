"""Thin helpers to run commands inside network namespaces the lab owns.

All of them name the namespace explicitly: nothing here can touch the host's own
network namespace by accident.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

NETNS_DIR = Path("/run/netns")

# Namespaces this process created through `add` (for the tests' leftover check).
CREATED: set[str] = set()


class NetnsError(RuntimeError):
    """A command in a namespace failed; carries the command and its stderr."""


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> str:
    proc = subprocess.run(list(argv), check=False, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def ns_exec(netns: str, argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> str:
    """Run argv inside netns and return stdout."""
    return run(["ip", "netns", "exec", netns, *argv], check=check, timeout=timeout)


def ip(netns: str, *args: str, check: bool = True) -> str:
    """`ip -n NETNS ...`: iproute2 acting inside the namespace."""
    return run(["ip", "-n", netns, *args], check=check)


def exists(netns: str) -> bool:
    return (NETNS_DIR / netns).exists()


def list_netns(prefix: str = "") -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))


def add(netns: str) -> None:
    run(["ip", "netns", "add", netns])
    CREATED.add(netns)
    ip(netns, "link", "set", "lo", "up")


def netns_dir_mounted() -> bool:
    """Whether /run/netns is already the shared mount `ip netns add` makes on first use."""
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return any(line.split()[4] == str(NETNS_DIR) for line in mounts)


def prepare_netns_dir() -> None:
    """Make /run/netns the way the first `ip netns add` on a machine leaves it.

    iproute2 mounts /run/netns (a shared bind mount of itself) the first time any
    namespace is added and never unmounts it. That is machine set-up, not a test's
    leftover: doing it once up front keeps the first test on a fresh machine from
    being blamed for it. A throwaway namespace makes iproute2 do it exactly its way.
    """
    if netns_dir_mounted():
        return
    scratch = f"tabby-setup-{os.getpid()}"
    run(["ip", "netns", "add", scratch])
    run(["ip", "netns", "delete", scratch])


def pids_in(netns: str) -> list[int]:
    out = run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in out.split()]


def delete(netns: str) -> None:
    """Delete a namespace; its processes must be gone first (see Lab.teardown)."""
    if exists(netns):
        run(["ip", "netns", "delete", netns], check=False)


def sysctl(netns: str, key: str, value: str) -> None:
    """Set a sysctl inside netns only (net.* sysctls are per namespace)."""
    ns_exec(netns, ["sysctl", "-q", "-w", f"{key}={value}"])
