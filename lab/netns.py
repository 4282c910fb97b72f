"""Thin helpers to run commands inside network namespaces the lab owns.

All of them name the namespace explicitly: nothing here can touch the host's own
network namespace by accident.
"""

from __future__ import annotations

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
