"""IPAM reports: usage per pool and block, borrowed addresses, consistency check.

Everything here is a pure function of a `Snapshot` (one read of every IPAM object
plus the Nodes and Pods), so `tabbyctl ipam show|check` and GC share one view and
the logic is tested with plain data. The check report is JSON, and
`tabbyctl ipam release --from-report` releases its leaks with their sequence
numbers, so an address reassigned after the report was written is left alone.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from datastore import kinds
from datastore.client import Datastore
from datastore.models import (
    BlockAffinity,
    IPAMBlock,
    IPAMConfig,
    IPAMConfigSpec,
    IPAMHandle,
    IPPool,
)
from ipam.allocator import CLAIM_TIME_ANNOTATION
from ipam.block import Allocation, AllocationBlock, Decoded, decode_blocks
from ipam.pools import pool_containing, pool_network, refused_pools

REPORT_VERSION = 1
PENDING_AFFINITY_MAX_AGE_S = 60.0
TUNNEL_TYPES = {
    "ipipTunnelAddress",
    "vxlanTunnelAddress",
    "vxlanV6TunnelAddress",
    "wireguardTunnelAddress",
}


@dataclass
class Snapshot:
    """One consistent-enough read of everything IPAM decisions depend on."""

    pools: list[IPPool]
    blocks: list[IPAMBlock]
    affinities: list[BlockAffinity]
    handles: list[IPAMHandle]
    config: IPAMConfigSpec = field(default_factory=IPAMConfigSpec)
    nodes: set[str] | None = None  # None: not known, so no node-based conclusions
    pods: set[tuple[str, str]] | None = None  # (namespace, name)
    pod_uids: dict[tuple[str, str], str] | None = None  # (namespace, name) -> metadata.uid
    _decoded_cache: tuple[tuple[int, ...], Decoded] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @classmethod
    def load(cls, ds: Datastore, *, with_k8s: bool = True) -> Snapshot:
        config = ds.try_get(IPAMConfig, "default")
        snapshot = cls(
            pools=ds.list(IPPool),
            blocks=[b for b in ds.list(IPAMBlock) if not b.spec.deleted],
            affinities=[a for a in ds.list(BlockAffinity) if not a.spec.deleted],
            handles=[h for h in ds.list(IPAMHandle) if not h.spec.deleted],
            config=config.spec if config else IPAMConfigSpec(),
        )
        if with_k8s:
            nodes, _ = ds.list_raw(kinds.NODE)
            pods, _ = ds.list_raw(kinds.POD)
            snapshot.nodes = {n["metadata"]["name"] for n in nodes}
            snapshot.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods}
            snapshot.pod_uids = {
                (p["metadata"]["namespace"], p["metadata"]["name"]): p["metadata"].get("uid", "")
                for p in pods
            }
        return snapshot

    def allocation_blocks(self) -> list[tuple[IPAMBlock, AllocationBlock]]:
        """The readable blocks; corrupt ones are left out here (see corrupt_blocks)."""
        return self._decoded().good

    def corrupt_blocks(self) -> list[tuple[IPAMBlock, str]]:
        """Blocks that cannot be read safely, with the reason: `check` reports them."""
        return self._decoded().corrupt

    def _decoded(self) -> Decoded:
        key = tuple(id(b) for b in self.blocks)
        if self._decoded_cache is None or self._decoded_cache[0] != key:
            self._decoded_cache = (key, decode_blocks(self.blocks))
        return self._decoded_cache[1]


# -- usage ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockUsage:
    cidr: str
    owner: str | None
    in_use: int
    free: int


@dataclass(frozen=True)
class PoolUsage:
    name: str
    cidr: str
    disabled: bool
    total: int
    in_use: int
    free: int
    blocks: list[BlockUsage]


def pool_usage(snapshot: Snapshot) -> list[PoolUsage]:
    """Per pool: addresses in total, allocated, and free (free includes unclaimed blocks)."""
    out = []
    decoded = snapshot.allocation_blocks()
    for pool in sorted(snapshot.pools, key=lambda p: p.name):
        network = pool_network(pool)
        inside = [(m, b) for m, b in decoded if IPv4Network(m.spec.cidr).subnet_of(network)]
        blocks = [
            BlockUsage(m.spec.cidr, b.host, b.used_count, b.free_count)
            for m, b in sorted(inside, key=lambda mb: mb[1].cidr)
        ]
        used = sum(b.in_use for b in blocks)
        total = network.num_addresses
        out.append(
            PoolUsage(
                pool.name, str(network), pool.spec.disabled, total, used, total - used, blocks
            )
        )
    return out


# -- borrowed -------------------------------------------------------------------------
@dataclass(frozen=True)
class Borrowed:
    ip: str
    borrowing_node: str
    block: str
    block_owner: str | None
    type: str
    allocated_to: str


def allocation_type(attrs: dict[str, str]) -> str:
    if attrs.get("type"):
        return attrs["type"]
    return "pod" if "pod" in attrs else ""


def borrowed(snapshot: Snapshot) -> list[Borrowed]:
    """Addresses whose allocating node is not the block's owner (calicoctl's rule)."""
    out = []
    for _, block in snapshot.allocation_blocks():
        for alloc in block.iter_allocations():
            node = alloc.attrs.get("node")
            if node and node != block.host:
                out.append(
                    Borrowed(
                        str(alloc.ip),
                        node,
                        str(block.cidr),
                        block.host,
                        allocation_type(alloc.attrs),
                        _owner_text(alloc.attrs),
                    )
                )
    return sorted(out, key=lambda b: IPv4Address(b.ip))


def _owner_text(attrs: dict[str, str]) -> str:
    if "pod" in attrs:
        return f"{attrs.get('namespace', '')}/{attrs['pod']}"
    return attrs.get("type", "")


# -- check ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """One inconsistency; `kind` is stable for scripts, `message` is for people."""

    kind: str
    message: str
    ip: str | None = None
    handle: str | None = None
    block: str | None = None


@dataclass(frozen=True)
class Leak:
    """An allocation whose owner is gone; released only with its sequence number."""

    ip: str
    handle: str | None
    block: str
    sequence_number: int | None
    node: str | None
    namespace: str | None
    pod: str | None
    reason: str


@dataclass
class CheckReport:
    problems: list[Problem]
    leaks: list[Leak]
    allocations: int
    generated: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    @property
    def problem_count(self) -> int:
        return len(self.problems) + len(self.leaks)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": REPORT_VERSION,
            "generated": self.generated,
            "allocations": self.allocations,
            "problems": [asdict(p) for p in self.problems],
            "leaks": [asdict(leak) for leak in self.leaks],
        }


def leak_reason(alloc: Allocation, snapshot: Snapshot) -> str | None:
    """Why an allocation is a leak, or None when it is (or may be) in use.

    Like Calico: an allocation naming a pod is in use while that pod exists; a
    tunnel address while its node exists; one without such attributes is assumed
    in use (nobody can tell). An allocation that also names its pod's UID (the
    runtime's K8S_POD_UID) is in use only while *that* pod exists: a pod deleted and
    created again under the same name (a StatefulSet's) does not keep the address
    its earlier sandbox held, if that sandbox's DEL never came (its node died).
    """
    attrs = alloc.attrs
    if "pod" in attrs and snapshot.pods is not None:
        key = (attrs.get("namespace", ""), attrs["pod"])
        if key not in snapshot.pods:
            return f"pod {key[0]}/{key[1]} does not exist"
        current = (snapshot.pod_uids or {}).get(key)
        if attrs.get("uid") and current and current != attrs["uid"]:
            return (
                f"pod {key[0]}/{key[1]} was created again (uid {current}); the address "
                f"belongs to its earlier incarnation (uid {attrs['uid']})"
            )
        return None
    tunnel = attrs.get("type") in TUNNEL_TYPES
    if tunnel and snapshot.nodes is not None and attrs.get("node") not in snapshot.nodes:
        return f"tunnel address of node {attrs.get('node')}, which does not exist"
    return None


def find_leaks(snapshot: Snapshot) -> list[Leak]:
    out = []
    for _, block in snapshot.allocation_blocks():
        for alloc in block.iter_allocations():
            reason = leak_reason(alloc, snapshot)
            if reason:
                out.append(_leak(alloc, block, reason))
    return out


def _leak(alloc: Allocation, block: AllocationBlock, reason: str) -> Leak:
    attrs = alloc.attrs
    return Leak(
        ip=str(alloc.ip),
        handle=alloc.handle_id,
        block=str(block.cidr),
        sequence_number=alloc.sequence_number,
        node=attrs.get("node"),
        namespace=attrs.get("namespace"),
        pod=attrs.get("pod"),
        reason=reason,
    )


def check(snapshot: Snapshot, now: datetime | None = None) -> CheckReport:
    """Every inconsistency between blocks, handles, affinities, pools and pods."""
    now = now or datetime.now(UTC)
    problems: list[Problem] = []
    problems += _block_problems(snapshot)
    problems += _handle_problems(snapshot)
    problems += _affinity_problems(snapshot, now)
    problems += pool_overlap_problems(snapshot)
    total = sum(b.used_count for _, b in snapshot.allocation_blocks())
    return CheckReport(problems, find_leaks(snapshot), total, now.isoformat())


def pool_overlap_problems(snapshot: Snapshot) -> list[Problem]:
    """Pools the allocator refuses (overlapping an older pool, or invalid), and blocks
    whose CIDRs overlap (their common addresses may be held twice): issue 21 item 5."""
    out = [
        Problem("refused-pool", reason)
        for _, reason in sorted(refused_pools(snapshot.pools).items())
    ]
    blocks = sorted(
        (IPv4Network(b.spec.cidr) for b in snapshot.blocks if not b.spec.deleted),
        key=lambda n: (int(n.network_address), n.prefixlen),
    )
    widest: IPv4Network | None = None  # the block reaching furthest so far
    for cidr in blocks:
        if widest is not None and cidr != widest and cidr.overlaps(widest):
            out.append(
                Problem(
                    "overlapping-blocks",
                    f"blocks {widest} and {cidr} overlap: an address in both may be "
                    "allocated twice; release the addresses of one (tabbyctl ipam release) so GC "
                    "deletes it",
                    block=str(cidr),
                )
            )
        if widest is None or cidr.broadcast_address > widest.broadcast_address:
            widest = cidr
    return out


def _block_problems(snapshot: Snapshot) -> list[Problem]:
    out = []
    cidrs = Counter(b.spec.cidr for b in snapshot.blocks)
    for cidr, count in cidrs.items():
        if count > 1:
            out.append(Problem("duplicate-block", f"{count} blocks claim {cidr}", block=cidr))
    for model, reason in snapshot.corrupt_blocks():
        out.append(
            Problem(
                "corrupt-block",
                f"{reason} (IPAMBlock {model.name}: it is skipped by every reader; "
                "fix or delete it)",
                block=model.spec.cidr,
            )
        )
    for _, block in snapshot.allocation_blocks():
        cidr = str(block.cidr)
        for text in block.problems():
            out.append(Problem("corrupt-block", f"block {cidr}: {text}", block=cidr))
        pool = pool_containing(block.cidr, snapshot.pools)
        if pool is None and block.used_count:
            out.append(
                Problem(
                    "orphan-block",
                    f"block {cidr} lies in no IP pool but holds {block.used_count} "
                    "allocation(s): release them or recreate the pool",
                    block=cidr,
                )
            )
    return out


def _handle_problems(snapshot: Snapshot) -> list[Problem]:
    """Handles must count exactly what the blocks hold under them."""
    actual: dict[str, Counter[str]] = {}
    out = []
    for _, block in snapshot.allocation_blocks():
        for alloc in block.iter_allocations():
            if not alloc.handle_id:
                out.append(
                    Problem(
                        "allocation-without-handle",
                        f"{alloc.ip} in block {block.cidr} has no handle id",
                        ip=str(alloc.ip),
                        block=str(block.cidr),
                    )
                )
                continue
            actual.setdefault(alloc.handle_id, Counter())[str(block.cidr)] += 1
    recorded = {h.spec.handle_id: h for h in snapshot.handles}
    for handle_id, counts in sorted(actual.items()):
        handle = recorded.get(handle_id)
        if handle is None:
            ips = _ips_of(snapshot, handle_id)
            out.append(
                Problem(
                    "missing-handle",
                    f"handle {handle_id} holds {', '.join(ips)} but has no IPAMHandle",
                    ip=ips[0],
                    handle=handle_id,
                )
            )
        elif dict(counts) != {k: v for k, v in handle.spec.block.items() if v}:
            out.append(
                Problem(
                    "handle-mismatch",
                    f"handle {handle_id} records {dict(handle.spec.block)} "
                    f"but the blocks hold {dict(counts)}",
                    handle=handle_id,
                )
            )
    for handle_id in sorted(set(recorded) - set(actual)):
        out.append(
            Problem(
                "empty-handle",
                f"handle {handle_id} holds no address "
                f"(records {dict(recorded[handle_id].spec.block)})",
                handle=handle_id,
            )
        )
    return out


def _ips_of(snapshot: Snapshot, handle_id: str) -> list[str]:
    return [
        str(a.ip)
        for _, b in snapshot.allocation_blocks()
        for a in b.iter_allocations()
        if a.handle_id == handle_id
    ]


def _affinity_problems(snapshot: Snapshot, now: datetime) -> list[Problem]:
    blocks = {b.spec.cidr: b for b in snapshot.blocks}
    out = []
    claimed = {(a.spec.cidr, f"host:{a.spec.node}") for a in snapshot.affinities}
    for model in snapshot.blocks:
        owner = model.spec.affinity
        if owner and owner.startswith("host:") and (model.spec.cidr, owner) not in claimed:
            out.append(
                Problem(
                    "block-without-affinity",
                    f"block {model.spec.cidr} says {owner} but that node has no "
                    "BlockAffinity for it",
                    block=model.spec.cidr,
                )
            )
    for affinity in snapshot.affinities:
        spec = affinity.spec
        block = blocks.get(spec.cidr)
        if spec.state == "confirmed" and block is None:
            out.append(
                Problem(
                    "affinity-without-block",
                    f"node {spec.node} has an affinity for {spec.cidr} but the block is missing",
                    block=spec.cidr,
                )
            )
        elif spec.state == "confirmed" and block and block.spec.affinity != f"host:{spec.node}":
            out.append(
                Problem(
                    "affinity-mismatch",
                    f"node {spec.node} has an affinity for {spec.cidr}, "
                    f"but the block says {block.spec.affinity}",
                    block=spec.cidr,
                )
            )
        elif spec.state != "confirmed":
            age = _age_seconds(affinity, now)
            if age is not None and age > PENDING_AFFINITY_MAX_AGE_S:
                out.append(
                    Problem(
                        "stale-pending-affinity",
                        f"affinity of node {spec.node} for {spec.cidr} has been {spec.state} "
                        f"for {int(age)}s: its claim was interrupted; the node's next "
                        "allocation (or GC) finishes it",
                        block=spec.cidr,
                    )
                )
    return out


def _age_seconds(affinity: BlockAffinity, now: datetime) -> float | None:
    stamp = affinity.metadata.annotations.get(CLAIM_TIME_ANNOTATION)
    stamp = stamp or affinity.metadata.creation_timestamp
    if not stamp:
        return None
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (now - when).total_seconds()


# -- report files ------------------------------------------------------------------------
def write_report(report: CheckReport, path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report.to_json(), handle, indent=2)
        handle.write("\n")


def read_report_leaks(path: str) -> list[Leak]:
    """The leaks of a report file; ValueError with the reason if it is not one."""
    try:
        with open(path, encoding="utf-8") as handle:
            body = json.load(handle)
    except OSError as exc:
        raise ValueError(f"cannot read report {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"report {path} is not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("version") != REPORT_VERSION:
        raise ValueError(
            f"report {path} is not a version {REPORT_VERSION} report of `tabbyctl ipam check -o`"
        )
    try:
        return [Leak(**item) for item in body.get("leaks", [])]
    except TypeError as exc:
        raise ValueError(f"report {path} has a malformed leak entry: {exc}") from None
