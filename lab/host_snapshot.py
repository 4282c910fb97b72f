"""What a harness must leave as it found it on the host: a snapshot to compare.

A harness that runs a container engine (lab/docker.py: dockerd, kind's nodes) is
judged on the host's own network namespace (links, addresses, routes, iptables in
both front ends, the nftables ruleset), its mounts (points and options) and its
cgroup tree (each hierarchy's top-level cgroups, every cgroup mount's options: a
container that saw the host's /sys/fs/cgroup once remounted it read-only). Taken
before and after, `differences` names what changed, in words for a report.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, fields
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _out(*argv: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        return f"({argv[0]} not installed)"
    return done.stdout


def _lines(text: str, skip_prefixes: tuple[str, ...] = ()) -> frozenset[str]:
    return frozenset(
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.startswith(skip_prefixes)
    )


def cgroup_entries(root: Path = CGROUP_ROOT) -> frozenset[str]:
    """Each hierarchy's top-level cgroups (`pids/NAME`, the unified one included) and
    every cgroup mount with its options (`mount POINT OPTIONS`)."""
    found = set()
    for hierarchy in root.iterdir() if root.is_dir() else ():
        try:
            found |= {f"{hierarchy.name}/{c.name}" for c in hierarchy.iterdir() if c.is_dir()}
        except OSError:
            continue
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split()
        if parts[4].startswith(str(root)):
            found.add(f"mount {parts[4]} {parts[5]}")
    return frozenset(found)


def mount_entries() -> frozenset[str]:
    """Every mount of this process' mount namespace: point, options, type, source."""
    out = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split()
        dash = parts.index("-")
        out.add(f"{parts[4]} {parts[5]} {parts[dash + 1]} {parts[dash + 2]}")
    return frozenset(out)


@dataclass(frozen=True)
class HostSnapshot:
    links: frozenset[str]
    addresses: frozenset[str]
    routes: frozenset[str]
    iptables: frozenset[str]
    iptables_legacy: frozenset[str]
    nftables: frozenset[str]
    mounts: frozenset[str]
    cgroups: frozenset[str]

    @classmethod
    def take(cls) -> HostSnapshot:
        links = _out("ip", "-o", "link", "show")
        return cls(
            # name and flags, not counters or the link's index
            links=frozenset(" ".join(line.split()[1:3]) for line in links.splitlines()),
            addresses=_lines(_out("ip", "-o", "addr", "show")),
            routes=_lines(_out("ip", "route", "show", "table", "all")),
            iptables=_lines(_out("iptables-save"), ("#",)),
            iptables_legacy=_lines(_out("iptables-legacy-save"), ("#",)),
            nftables=_lines(_out("nft", "list", "ruleset")),
            mounts=mount_entries(),
            cgroups=cgroup_entries(),
        )

    def differences(self, later: HostSnapshot) -> list[str]:
        """What changed from this snapshot to `later`, one line per item."""
        out = []
        for field in fields(self):
            before, after = getattr(self, field.name), getattr(later, field.name)
            out += [f"{field.name}: new {item}" for item in sorted(after - before)]
            out += [f"{field.name}: gone {item}" for item in sorted(before - after)]
        return out

    def summary(self) -> str:
        """Counts, for a report: what was compared."""
        return ", ".join(f"{f.name} {len(getattr(self, f.name))}" for f in fields(self))
