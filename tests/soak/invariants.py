"""What must hold all through the soak, as pure functions of what the runner read.

* **duplicates**: no address is held by two live endpoints (pods and the nodes'
  tunnel addresses), as the sandboxes themselves show it;
* **leaks**: every IPAM allocation has a live owner: a pod that exists, with the
  sandbox (container ID) the runtime knows, or a node's tunnel address; and IPAM's own
  consistency check (blocks, handles, affinities) finds nothing;
* **policy violations**: probed cells that disagree with the oracle once the
  network has had time to converge, and any closed cell found open while an agent
  restarts (an allow-all window);
* **flows lost**: established TCP flows that broke across the faults.

The counters go into the summary's last line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cni.install import NETWORK_NAME
from ipam.report import Snapshot, check

NETWORK = NETWORK_NAME  # pod allocations are held by handle <network>.<container id>


@dataclass(frozen=True)
class Endpoint:
    """A live holder of an address: ``pod ns/name`` or ``tunnel <node>``."""

    owner: str
    ip: str


def duplicates(endpoints: Iterable[Endpoint]) -> dict[str, list[str]]:
    """Addresses held by more than one owner, with the owners (sorted)."""
    holders: dict[str, set[str]] = {}
    for endpoint in endpoints:
        holders.setdefault(endpoint.ip, set()).add(endpoint.owner)
    return {ip: sorted(owners) for ip, owners in sorted(holders.items()) if len(owners) > 1}


def leaks(snapshot: Snapshot, live_sandboxes: Mapping[str, str]) -> list[str]:
    """Allocations without a live owner, and IPAM inconsistencies, one line each.

    *live_sandboxes* maps container ID to ``ns/name`` for every pod whose ADD
    succeeded and whose DEL has not run: a pod allocation must name one of them
    (an address kept for a sandbox that is gone is a leak even if its Pod lives on).
    """
    report = check(snapshot)
    out = [f"{leak.ip}: {leak.reason}" for leak in report.leaks]
    out += [f"{p.kind}: {p.message}" for p in report.problems]
    for _, block in snapshot.allocation_blocks():
        for alloc in block.iter_allocations():
            handle = alloc.handle_id or ""
            if not handle.startswith(f"{NETWORK}."):
                continue  # tunnel addresses: judged by the check above (node exists)
            container = handle.removeprefix(f"{NETWORK}.")
            if container not in live_sandboxes:
                pod = f"{alloc.attrs.get('namespace')}/{alloc.attrs.get('pod')}"
                out.append(f"{alloc.ip}: held by sandbox {container[:12]} of {pod}, not live")
    return out


def unheld_addresses(
    snapshot: Snapshot, endpoints: Iterable[Endpoint], live_sandboxes: Mapping[str, str]
) -> list[str]:
    """Pod addresses in use that IPAM does not hold for that pod's sandbox: IPAM may
    hand them out again, which is how duplicate addresses are born."""
    held: dict[str, str] = {}
    for _, block in snapshot.allocation_blocks():
        for alloc in block.iter_allocations():
            held[str(alloc.ip)] = (alloc.handle_id or "").removeprefix(f"{NETWORK}.")
    owners = {f"pod {key}": container for container, key in live_sandboxes.items()}
    out = []
    for endpoint in endpoints:
        container = owners.get(endpoint.owner)
        if container is None:
            continue  # tunnel addresses, and pods gone since the read
        holder = held.get(endpoint.ip)
        if holder != container:
            what = "not allocated" if holder is None else f"allocated to {holder[:12]}"
            out.append(f"{endpoint.ip} of {endpoint.owner}: {what}")
    return out


@dataclass
class Tally:
    """The soak's counters; ``last_line`` is what `make soak` ends with."""

    seed: int
    minutes: float = 0.0
    pods: int = 0  # pods created (ADD succeeded)
    policies: int = 0  # policy applies and deletes
    faults: int = 0
    events: int = 0
    checks: int = 0  # matrix checks (each converges, then confirms every cell)
    duplicates: int = 0
    leaks: int = 0
    policy_violations: int = 0
    flows_lost: int = 0
    flow_exchanges: int = 0  # echoes the established flow got back
    flow_gap_s: float = 0.0  # its longest stall (a stall that recovers is no loss)
    window_probes: int = 0  # closed cells probed while agents restarted
    mid_add_in_flight: int = 0  # mid-ADD kills that found ADDs in the journal
    teardown_wait_s: float = 0.0  # longest wait for answered DELs to free their addresses
    add_failures: list[str] = field(default_factory=list)  # failed ADDs outside a kill
    fault_misses: list[str] = field(default_factory=list)  # faults that found nothing to break
    findings: list[str] = field(default_factory=list)
    fault_kinds: dict[str, int] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set, repr=False)

    def found(self, counter: str, lines: Iterable[str], when: str, *, once: bool = False) -> None:
        """Add *lines* to *counter* and keep them, with when they were seen. With
        *once*, a line already counted (a leak still there) is not counted again."""
        new = []
        for line in lines:
            if once and f"{counter}: {line}" in self._seen:
                continue
            self._seen.add(f"{counter}: {line}")
            new.append(line)
        setattr(self, counter, getattr(self, counter) + len(new))
        self.findings += [f"{when}: {counter}: {line}" for line in new]

    @property
    def clean(self) -> bool:
        return not (self.duplicates or self.leaks or self.policy_violations or self.flows_lost)

    def last_line(self) -> str:
        return (
            f"soak minutes={self.minutes:.1f} pods={self.pods} "
            f"policies={self.policies} faults={self.faults} duplicates={self.duplicates} "
            f"leaks={self.leaks} policy_violations={self.policy_violations} "
            f"flows_lost={self.flows_lost}"
        )
