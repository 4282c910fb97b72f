"""IPAM garbage collection: pure decisions over a Snapshot, plus the I/O to apply them.

Rules (Calico's kube-controllers IPAM GC, simplified):
- An empty affine block is released once it has been seen empty for the whole
  grace period, but a node always keeps at least one block.
- A deleted Node: its leaked allocations are released at once (no grace), its
  affinities deleted, its empty blocks deleted; blocks still holding allocations
  lose their affinity (they become ordinary borrowable blocks, deleted when empty).
- A leak (pod gone / tunnel of a gone node) is released once it has been a leak
  for the grace period, all-or-none per handle, with its sequence number (ABA).
- Empty blocks with no affinity, or outside every pool, are deleted.

`GCState` carries what was seen on earlier passes; losing it (a restart) only
restarts the grace periods.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import IPv4Address

from datastore.client import Datastore
from datastore.errors import Conflict, NotFound
from datastore.models import BlockAffinity, IPAMBlock
from ipam.allocator import IPAMAllocator
from ipam.block import AllocationBlock, decode_blocks, is_empty
from ipam.pools import affinity_name, cidr_name, pool_containing
from ipam.report import Leak, Snapshot, find_leaks

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 15 * 60.0
LeakKey = tuple[str, str | None, int | None]  # (ip, handle, sequence number)


@dataclass
class GCState:
    """When each candidate was first seen; keys that stop being candidates are dropped."""

    empty_since: dict[str, float] = field(default_factory=dict)  # block cidr -> time
    leak_since: dict[LeakKey, float] = field(default_factory=dict)


@dataclass
class GCPlan:
    """What one pass will do; built by `plan`, applied by `IPAMGarbageCollector`."""

    release_blocks: list[str] = field(default_factory=list)  # empty affine blocks
    delete_blocks: list[str] = field(default_factory=list)  # empty unaffine/orphan blocks
    gone_nodes: list[str] = field(default_factory=list)
    release_leaks: list[Leak] = field(default_factory=list)
    leak_candidates: int = 0

    @property
    def empty(self) -> bool:
        return not (
            self.release_blocks or self.delete_blocks or self.gone_nodes or self.release_leaks
        )


def _leak_key(leak: Leak) -> LeakKey:
    return (leak.ip, leak.handle, leak.sequence_number)


def plan(snapshot: Snapshot, state: GCState, now: float, grace: float) -> GCPlan:
    """Decide this pass's work; updates state's first-seen times."""
    result = GCPlan()
    gone = _gone_nodes(snapshot)
    result.gone_nodes = sorted(gone)
    result.release_blocks = _empty_blocks_due(snapshot, state, now, grace, gone)
    result.delete_blocks = _dead_empty_blocks(snapshot)
    leaks = find_leaks(snapshot)
    result.leak_candidates = len(leaks)
    result.release_leaks = _leaks_due(leaks, snapshot, state=state, now=now, grace=grace, gone=gone)
    return result


def _gone_nodes(snapshot: Snapshot) -> set[str]:
    """Nodes that own affinities or blocks but no longer exist (empty when unknown)."""
    if not snapshot.nodes:
        return set()  # no Node list (or an empty one): never conclude all nodes are gone
    owners = {a.spec.node for a in snapshot.affinities}
    owners |= {b.host for _, b in snapshot.allocation_blocks() if b.host}
    return owners - snapshot.nodes


def _empty_blocks_due(
    snapshot: Snapshot, state: GCState, now: float, grace: float, gone: set[str]
) -> list[str]:
    decoded = snapshot.allocation_blocks()
    per_node = Counter(b.host for _, b in decoded if b.host)
    empty_now = {
        str(b.cidr): b.host for _, b in decoded if b.host and b.is_empty and b.host not in gone
    }
    for cidr in list(state.empty_since):
        if cidr not in empty_now:
            del state.empty_since[cidr]
    due = []
    for cidr, host in sorted(empty_now.items()):
        first = state.empty_since.setdefault(cidr, now)
        if now - first >= grace and per_node[host] > 1:
            per_node[host] -= 1  # keep at least one block per node
            due.append(cidr)
    return due


def _dead_empty_blocks(snapshot: Snapshot) -> list[str]:
    out = []
    for _, block in snapshot.allocation_blocks():
        if not block.is_empty:
            continue
        if not block.affinity or pool_containing(block.cidr, snapshot.pools) is None:
            out.append(str(block.cidr))
    return sorted(out)


def _leaks_due(
    leaks: list[Leak],
    snapshot: Snapshot,
    *,
    state: GCState,
    now: float,
    grace: float,
    gone: set[str],
) -> list[Leak]:
    keys = {_leak_key(leak) for leak in leaks}
    for key in list(state.leak_since):
        if key not in keys:
            del state.leak_since[key]
    ripe = []
    for leak in leaks:
        first = state.leak_since.setdefault(_leak_key(leak), now)
        if leak.node in gone or now - first >= grace:
            ripe.append(leak)
    return _whole_handles(ripe, snapshot)


def _whole_handles(ripe: list[Leak], snapshot: Snapshot) -> list[Leak]:
    """Release a handle's addresses only if every one of them is a ripe leak."""
    held = Counter(
        a.handle_id for _, b in snapshot.allocation_blocks() for a in b.iter_allocations()
    )
    ripe_count = Counter(leak.handle for leak in ripe)
    # a handle that also holds addresses in a block nobody can read is left alone
    unreadable = {m.spec.cidr for m, _ in snapshot.corrupt_blocks()}
    touching = {h.spec.handle_id for h in snapshot.handles if set(h.spec.block) & unreadable}
    return [
        leak
        for leak in ripe
        if leak.handle is None
        or (ripe_count[leak.handle] == held[leak.handle] and leak.handle not in touching)
    ]


@dataclass
class GCResult:
    released_blocks: list[str] = field(default_factory=list)
    deleted_blocks: list[str] = field(default_factory=list)
    released_ips: list[IPv4Address] = field(default_factory=list)
    cleaned_nodes: list[str] = field(default_factory=list)
    leak_candidates: int = 0


class IPAMGarbageCollector:
    """Runs GC passes; keep one instance so grace periods span passes."""

    def __init__(
        self,
        datastore: Datastore,
        *,
        grace: float = DEFAULT_GRACE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ds = datastore
        self.grace = grace
        self.clock = clock
        self.state = GCState()

    def run_once(self) -> GCResult:
        snapshot = Snapshot.load(self.ds)
        work = plan(snapshot, self.state, self.clock(), self.grace)
        result = GCResult(leak_candidates=work.leak_candidates)
        result.released_ips = self._release_leaks(work.release_leaks)
        for node in work.gone_nodes:
            self._clean_node(node)
            result.cleaned_nodes.append(node)
        for cidr in work.release_blocks:
            if self._release_affine_block(cidr):
                result.released_blocks.append(cidr)
        for cidr in work.delete_blocks:
            if self._delete_block_if_empty(cidr):
                result.deleted_blocks.append(cidr)
        return result

    def _release_leaks(self, leaks: list[Leak]) -> list[IPv4Address]:
        if not leaks:
            return []
        releaser = IPAMAllocator(self.ds, "ipam-gc")
        seqs = {
            IPv4Address(leak.ip): leak.sequence_number
            for leak in leaks
            if leak.sequence_number is not None
        }
        outcome = releaser.release_ips([leak.ip for leak in leaks], seqs)
        for ip in outcome.stale:
            log.info("ipam gc: %s was reassigned since it was seen leaking; kept", ip)
        return outcome.released

    def _clean_node(self, node: str) -> None:
        """A deleted node: drop its affinities; its blocks become unaffine or go."""
        decoded = decode_blocks(self.ds.list(IPAMBlock))
        for model, reason in decoded.corrupt:  # never deleted: a person must look at it
            if model.spec.affinity == f"host:{node}":
                log.warning(
                    "ipam gc: corrupt block %s kept, only unaffined: %s", model.name, reason
                )
                self._unaffine(model.name, node)
        for model, block in decoded.good:
            if block.host != node:
                continue
            if block.is_empty:
                self._delete_quietly(model)
            else:
                self._unaffine(model.name, node)
        for affinity in self.ds.list(BlockAffinity):
            if affinity.spec.node == node:
                self._delete_quietly(affinity)
        log.info("ipam gc: cleaned up blocks and affinities of deleted node %s", node)

    def _unaffine(self, name: str, node: str) -> None:
        def change(model: IPAMBlock) -> IPAMBlock | None:
            if model.spec.affinity != f"host:{node}":
                return None
            model.spec.affinity = None
            return model

        with contextlib.suppress(NotFound):
            self.ds.mutate(IPAMBlock, name, change)

    def _release_affine_block(self, cidr: str) -> bool:
        """pendingDeletion -> delete the block if still empty -> delete the affinity."""
        model = self.ds.try_get(IPAMBlock, cidr_name(cidr))
        if model is None or not is_empty(model.spec):  # a corrupt block is never empty
            return False
        node = AllocationBlock.from_spec(model.spec).host or ""
        affinity_key = affinity_name(node, cidr)
        self._set_affinity_state(affinity_key, "pendingDeletion")
        try:
            self.ds.delete(model)  # precondition: unchanged since seen empty
        except Conflict:
            self._set_affinity_state(affinity_key, "confirmed")  # it was used meanwhile
            return False
        except NotFound:
            pass
        affinity = self.ds.try_get(BlockAffinity, affinity_key)
        if affinity is not None and affinity.spec.state == "pendingDeletion":
            self._delete_quietly(affinity)  # not if the node re-claimed it meanwhile
        return True

    def _set_affinity_state(self, name: str, state: str) -> None:
        def change(affinity: BlockAffinity) -> BlockAffinity | None:
            if affinity.spec.state == state:
                return None
            affinity.spec.state = state  # type: ignore[assignment]
            return affinity

        with contextlib.suppress(NotFound):
            self.ds.mutate(BlockAffinity, name, change)

    def _delete_block_if_empty(self, cidr: str) -> bool:
        model = self.ds.try_get(IPAMBlock, cidr_name(cidr))
        if model is None or not is_empty(model.spec):  # a corrupt block is never empty
            return False
        return self._delete_quietly(model)

    def _delete_quietly(self, obj: IPAMBlock | BlockAffinity) -> bool:
        try:
            self.ds.delete(obj)
        except (NotFound, Conflict):
            return False
        return True
