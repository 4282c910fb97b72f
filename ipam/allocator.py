"""The IPAM allocator of one node: pure block logic plus compare-and-swap I/O.

Order of work in `auto_assign` (Calico's AutoAssign):
1. this node's affine blocks (cached locally with their resourceVersion, so an
   uncontended allocation costs one handle write and one block write);
2. claim a new block (pending affinity -> block -> confirmed affinity; a crash
   between any two steps is finished by the next allocator of this node);
3. borrow single addresses from other nodes' blocks, unless strictAffinity.

Every write is a CAS on resourceVersion: a lost race re-reads that one object and
retries, a bounded number of times. The handle write and the block write go out
together (two requests in flight, so an allocation costs one round trip, not two);
a failed block write counts the handle back, a failed handle write gives the
addresses back. A crash between the two can leave a handle counting too much
(harmless: release by handle frees what the blocks hold) or, for a moment, an
allocation whose handle was never written: release by handle then finds it in this
node's blocks, and IPAM GC releases it once its pod is gone. An IPAMError leaves
the datastore as it was.

`auto_assign_each` serves a burst (one address per handle, as the agent's
:class:`ipam.batch.AssignBatcher` collects them): as many as fit are taken from one
affine block in one write, their handles written beside it several at once.

With `preclaim_below`, the next block is claimed in the background once this
node's blocks run low, so that no allocation waits for the six requests of a claim.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Concatenate, ParamSpec, TypeVar

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import AlreadyExists, Conflict, NotFound
from datastore.models import (
    BlockAffinity,
    BlockAffinitySpec,
    IPAMBlock,
    IPAMConfig,
    IPAMConfigSpec,
    IPAMHandle,
    IPAMHandleSpec,
    IPPool,
    Meta,
)
from datastore.timestamps import now_iso
from ipam.block import AllocationBlock, free_count, host_affinity, is_empty
from ipam.errors import (
    BlockCorrupt,
    ConcurrencyExhausted,
    HandleNotFound,
    InvalidPool,
    IPAMError,
    PoolExhausted,
    PoolNotFound,
)
from ipam.pools import (
    affinity_name,
    block_cidrs,
    block_count,
    block_of,
    cidr_name,
    handle_name,
    node_seed,
    parse_network,
    pool_containing,
    pool_network,
    refused_pools,
    select_pools,
    selects_node,
    tunnel_handle_id,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

DEFAULT_MAX_BLOCKS = 20
AGENT_PRECLAIM_BELOW = 16
"""The node agent claims its next block when fewer free addresses than this remain."""
IO_THREADS = 8
"""Writes beside the caller's: a background claim, and the handles of a batch."""
PRECLAIM_BACKOFF_S = 30.0
"""After a background claim found nothing (pool full, max blocks), wait this long."""
CAS_RETRIES = 16
CLAIM_TIME_ANNOTATION = "tabby.dev/claim-time"
CRASH_ENV = "TABBY_IPAM_CRASH_AT"
"""Test hook: the name of a claim step at which the process exits (crash tests)."""

CLAIM_STEPS = ("affinity-pending", "block-created", "affinity-confirmed")
TUNNEL_TYPES = {"ipip": "ipipTunnelAddress", "vxlan": "vxlanTunnelAddress"}


class _ClaimLost(Exception):
    """Another node owns the block we tried to claim; try the next CIDR."""


class _BlockGone(ConcurrencyExhausted):
    """The block was deleted under us (GC): callers skip it; if it escapes, retry later."""


class _NotAffine(_BlockGone):
    """A block cached as ours is no longer affine to this node (GC took the affinity of
    a deleted Node): skipped like a deleted one, never allocated from. Its addresses
    would be announced by no node's block route (Calico checks the same)."""


@dataclass(frozen=True)
class ReleaseResult:
    """What a release did: freed addresses, and those it skipped and why."""

    released: list[IPv4Address]
    not_allocated: list[IPv4Address]
    stale: list[IPv4Address]  # sequence number did not match: reassigned since


def _locked(
    method: Callable[Concatenate[IPAMAllocator, P], T],
) -> Callable[Concatenate[IPAMAllocator, P], T]:
    """Serialise public calls: the block cache is shared state (Calico's host-wide lock)."""

    @functools.wraps(method)
    def wrapper(self: IPAMAllocator, *args: P.args, **kwargs: P.kwargs) -> T:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


def _checkpoint(step: str) -> None:
    """Crash-test hook: exit abruptly at the claim step named in $TABBY_IPAM_CRASH_AT."""
    if os.environ.get(CRASH_ENV) == step:
        os._exit(86)


class IPAMAllocator:
    """Allocates and releases addresses on behalf of one node."""

    def __init__(
        self,
        datastore: Datastore,
        node: str,
        *,
        node_labels: Mapping[str, str] | None = None,
        config_ttl: float = 5.0,
        retries: int = CAS_RETRIES,
        on_block_claimed: Callable[[IPv4Network], None] | None = None,
        preclaim_below: int = 0,
    ) -> None:
        """`on_block_claimed` is told each block this allocator claims, right after the
        claim is confirmed: the node agent announces it without waiting for a watch.

        `preclaim_below` > 0 claims the next block in the background when fewer free
        addresses remain in this node's blocks (the agent uses AGENT_PRECLAIM_BELOW);
        0 claims only when an allocation finds the blocks full, as Calico does.
        """
        self.ds = datastore
        self.preclaim_below = preclaim_below
        self._io: ThreadPoolExecutor | None = None
        self._preclaim: Future[IPAMBlock | None] | None = None
        self._preclaim_idle_until = 0.0
        self.on_block_claimed = on_block_claimed
        self.node = node
        self.retries = retries
        self.config_ttl = config_ttl
        self._fixed_labels = dict(node_labels) if node_labels is not None else None
        self._labels: dict[str, str] = {}
        self._pools: list[IPPool] = []
        self._refused: dict[str, str] = {}  # pool name -> why no address comes from it
        self._config = IPAMConfigSpec()
        self._config_read_at = -1e18
        self._affine: dict[str, IPAMBlock] | None = None  # block name -> last seen
        self._lock = threading.RLock()

    def close(self) -> None:
        """Let a background claim finish and stop the allocator's I/O threads."""
        with self._lock:
            io, self._io = self._io, None
        if io is not None:
            io.shutdown(wait=True)

    def _background(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._lock:
            if self._io is None:
                self._io = ThreadPoolExecutor(IO_THREADS, thread_name_prefix=f"ipam-{self.node}")
            return self._io.submit(fn, *args, **kwargs)

    # -- configuration, read with a TTL so allocations don't re-read it --------------
    @_locked
    def refresh(self) -> None:
        """Re-read pools, IPAMConfig, node labels and this node's blocks now."""
        self._take_preclaim(wait=True)
        self._config_read_at = -1e18
        self._affine = None
        self._load()

    def _load(self) -> None:
        if time.monotonic() - self._config_read_at >= self.config_ttl:
            self._pools = self.ds.list(IPPool)
            self._note_refused(refused_pools(self._pools))
            config = self.ds.try_get(IPAMConfig, "default")
            self._config = config.spec if config else IPAMConfigSpec()
            self._labels = self._read_labels()
            self._config_read_at = time.monotonic()
        if self._affine is None:
            self._repair_claims()
            self._reload_affine()

    def _note_refused(self, refused: dict[str, str]) -> None:
        """Keep the refused pools; log each once when it becomes refused, not per call."""
        for name in sorted(refused.keys() - self._refused.keys()):
            log.warning("ipam: node %s refuses pool %s: %s", self.node, name, refused[name])
        self._refused = refused

    def _read_labels(self) -> dict[str, str]:
        if self._fixed_labels is not None:
            return self._fixed_labels
        try:
            body = self.ds.get_raw(kinds.NODE, self.node)
        except NotFound:
            return {}
        labels: dict[str, str] = body.get("metadata", {}).get("labels") or {}
        return labels

    @property
    def max_blocks(self) -> int:
        return self._config.max_blocks_per_host or DEFAULT_MAX_BLOCKS

    def _reload_affine(self) -> list[IPAMBlock]:
        """Cache this node's blocks; return every live block (for claim and borrow)."""
        live = self._live_blocks()
        mine = host_affinity(self.node)
        self._affine = {b.name: b for b in live if b.spec.affinity == mine}
        return live

    def _live_blocks(self) -> list[IPAMBlock]:
        return [b for b in self.ds.list(IPAMBlock) if not b.spec.deleted]

    # -- public API ------------------------------------------------------------------
    @_locked
    def auto_assign(
        self,
        handle_id: str,
        attrs: Mapping[str, str] | None = None,
        num: int = 1,
        *,
        pools: Sequence[str] | None = None,
    ) -> list[IPv4Address]:
        """Allocate num addresses under handle_id; all or nothing.

        attrs are stored with each address (`node` is added: it tells borrowed
        addresses apart); `pools` restricts the choice to the named pools.
        """
        if num < 1:
            raise ValueError("num must be at least 1")
        self._load()
        usable = select_pools(self._pools, self._labels, pools, refused=self._refused)
        if not usable:
            raise self._no_pool_error(pools)
        attrs = {"node": self.node, **(attrs or {})}
        self._take_preclaim(wait=False)
        got: list[IPv4Address] = []
        try:
            got += self._from_affine(usable, handle_id, attrs, num)
            while len(got) < num and self._may_claim():
                block = self._claim_in(usable)
                if block is None:
                    break
                with contextlib.suppress(_BlockGone):
                    got += self._assign_from(block.name, handle_id, attrs, num - len(got))
            if len(got) < num and not self._config.strict_affinity:
                got += self._borrow(usable, handle_id, attrs, num - len(got))
            if len(got) < num:
                raise PoolExhausted(self._exhausted_message(usable, num))
        except BaseException:
            self._rollback(got)
            raise
        self._maybe_preclaim(usable)
        return got

    @_locked
    def auto_assign_each(
        self, requests: Sequence[tuple[str, Mapping[str, str]]]
    ) -> list[IPv4Address | Exception]:
        """One address for each (handle_id, attrs): a burst of pods in few block writes.

        As many as fit are taken from one affine block in one write (each handle is
        still its own object, written beside it, several at once); the rest go
        through :meth:`auto_assign` one by one (claiming or borrowing as it does).
        Each request gets its address or its own error: a failed handle write gives
        back only that request's address.
        """
        self._load()
        usable = select_pools(self._pools, self._labels, None, refused=self._refused)
        results: dict[int, IPv4Address | Exception] = {}
        if usable:
            self._take_preclaim(wait=False)
            self._fill_from_affine(usable, requests, results)
        for i, (handle_id, attrs) in enumerate(requests):
            if i not in results:
                try:
                    results[i] = self.auto_assign(handle_id, attrs)[0]
                except Exception as exc:
                    results[i] = exc
        if usable:
            self._maybe_preclaim(usable)
        return [results[i] for i in range(len(requests))]

    def _fill_from_affine(
        self,
        usable: list[IPPool],
        requests: Sequence[tuple[str, Mapping[str, str]]],
        results: dict[int, IPv4Address | Exception],
    ) -> None:
        """Serve requests from this node's affine blocks, one block write per block."""
        assert self._affine is not None
        for name, model in sorted(self._affine.items()):
            waiting = [i for i in range(len(requests)) if i not in results]
            if len(waiting) < 2:  # one alone takes the ordinary path
                return
            room = free_count(model.spec)
            if model.spec.deleted or not room or not _in_pools(model.spec.cidr, usable):
                continue
            chunk = waiting[:room]
            try:
                got = self._assign_each_from(name, [requests[i] for i in chunk])
            except (_BlockGone, BlockCorrupt) as exc:
                log.info("ipam: batch skips block %s: %s", name, exc)
                continue
            for i, outcome in zip(chunk, got, strict=True):
                if outcome is not None:
                    results[i] = outcome

    def _assign_each_from(
        self, name: str, requests: Sequence[tuple[str, Mapping[str, str]]]
    ) -> list[IPv4Address | Exception | None]:
        """One block write for every request that fits (None: it did not fit)."""
        cached = self._cached(name)
        cidr = cached.spec.cidr if cached else _cidr_from_name(name)
        asks = [(handle_id, {"node": self.node, **attrs}) for handle_id, attrs in requests]

        def take(block: AllocationBlock) -> list[IPv4Address | None]:
            if block.host != self.node:
                raise _NotAffine(f"block {name} is no longer affine to {self.node}")
            return [next(iter(block.auto_assign(1, h, a)), None) for h, a in asks]

        counted = [self._background(self._handle_add, h, cidr, 1) for h, _ in asks]
        try:
            got = self._update_block(name, take)
        except BaseException:
            for (handle_id, _), future in zip(asks, counted, strict=True):
                with contextlib.suppress(Exception):
                    future.result()
                    self._handle_add(handle_id, cidr, -1)
            raise
        outcomes: list[IPv4Address | Exception | None] = []
        give_back: list[IPv4Address] = []
        for (handle_id, _), future, address in zip(asks, counted, got, strict=True):
            try:
                future.result()
            except Exception as exc:
                outcomes.append(exc)
                if address is not None:
                    give_back.append(address)
                continue
            if address is None:  # the block had less room than its cached copy said
                self._handle_add(handle_id, cidr, -1)
            outcomes.append(address)
        self._give_back(name, give_back)
        return outcomes

    @_locked
    def assign_ip(
        self, ip: IPv4Address | str, handle_id: str, attrs: Mapping[str, str] | None = None
    ) -> IPv4Address:
        """Allocate one specific address (claiming its block for this node if unclaimed)."""
        address = IPv4Address(ip)
        self._load()
        pool = pool_containing(address, [p for p in self._pools if p.name not in self._refused])
        if pool is None:
            refused = pool_containing(address, self._pools)
            if refused is not None:
                raise InvalidPool(f"{address}: {self._refused[refused.name]}")
            raise PoolNotFound(f"{address} is not in any IP pool")
        if pool.spec.disabled:
            raise PoolExhausted(f"{address} is in pool {pool.name}, which is disabled")
        cidr = block_of(address, pool)
        holder = self._block_holding(address)
        if holder is not None:  # e.g. a block of another size, from a pool deleted since
            cidr = IPv4Network(holder.spec.cidr)
        name = cidr_name(cidr)
        if holder is None and self.ds.try_get(IPAMBlock, name) is None:
            # if another node claims it first, the address is simply borrowed from it
            with contextlib.suppress(_ClaimLost):
                self._claim_cidr(cidr)
        attrs = {"node": self.node, **(attrs or {})}
        self._handle_add(handle_id, str(cidr), 1)
        try:
            self._update_block(name, lambda b: b.assign(address, handle_id, attrs))
        except BaseException:
            self._handle_add(handle_id, str(cidr), -1)
            raise
        return address

    @_locked
    def release_by_handle(self, handle_id: str, *, missing_ok: bool = True) -> list[IPv4Address]:
        """Free every address of a handle; a second call is a no-op (CNI DEL retries)."""
        handle = self._get_handle(handle_id)
        if handle is None:
            unrecorded = self._release_unrecorded(handle_id)
            if unrecorded or missing_ok:
                return unrecorded
            raise HandleNotFound(f"no allocation has handle {handle_id!r}")
        released: list[IPv4Address] = []
        per_block: dict[str, int] = {}
        for cidr in sorted(handle.spec.block):
            name = cidr_name(cidr)
            try:
                freed, orphan_empty = self._update_block(
                    name, lambda b: (_release_handle(b, handle_id), _orphan_empty(b))
                )
            except _BlockGone:
                continue
            released += freed
            per_block[cidr] = len(freed)
            if orphan_empty:
                self._delete_if_orphan_empty(name)
        self._drop_handle(handle, per_block)
        return released

    def _release_unrecorded(self, handle_id: str) -> list[IPv4Address]:
        """Addresses of a handle that was never written (a crash between the two writes).

        Looked up in this node's cached blocks, so the usual case (a repeated DEL)
        costs no request; borrowed addresses are left to IPAM GC.
        """
        self._load()
        assert self._affine is not None
        holding = [
            name
            for name, model in sorted(self._affine.items())
            if handle_id in AllocationBlock.from_spec(model.spec).handle_counts()
        ]
        released: list[IPv4Address] = []
        for name in holding:
            with contextlib.suppress(_BlockGone):
                released += self._update_block(name, lambda b: _release_handle(b, handle_id))
        if released:
            log.info("ipam: released %s of unrecorded handle %s", released, handle_id)
        return released

    @_locked
    def release_ips(
        self,
        ips: Sequence[IPv4Address | str],
        sequence_numbers: Mapping[IPv4Address, int] | None = None,
    ) -> ReleaseResult:
        """Free specific addresses; with sequence numbers, skip any reassigned since."""
        wanted = [IPv4Address(ip) for ip in ips]
        blocks = self._live_blocks()
        released: list[IPv4Address] = []
        not_allocated: list[IPv4Address] = []
        stale: list[IPv4Address] = []
        by_block: dict[str, list[IPv4Address]] = {}
        for address in wanted:
            block = next((b for b in blocks if address in IPv4Network(b.spec.cidr)), None)
            if block is None:
                not_allocated.append(address)
            else:
                by_block.setdefault(block.name, []).append(address)
        for name, addresses in by_block.items():
            outcome = self._release_in_block(name, addresses, sequence_numbers or {})
            released += outcome.released
            not_allocated += outcome.not_allocated
            stale += outcome.stale
        return ReleaseResult(released, not_allocated, stale)

    @_locked
    def tunnel_address(self, kind: str = "ipip") -> IPv4Address:
        """This node's tunnel address (one per node and kind), allocated on first use.

        Like Calico's reconciler: an address whose pool is gone, disabled or no longer
        asks for this encapsulation is released and a new one allocated.
        """
        handle_id = tunnel_handle_id(kind, self.node)
        self._load()
        eligible = [
            p
            for p in self._pools
            if _encap(p, kind) and not p.spec.disabled and p.name not in self._refused
        ]
        existing = self.addresses_of(handle_id)
        if existing and pool_containing(existing[0], eligible) is not None:
            return existing[0]
        if existing:
            log.info("ipam: %s tunnel address %s left its pool; reallocating", kind, existing[0])
            self.release_by_handle(handle_id)
        wanted = [p.name for p in eligible]
        if not wanted:
            raise PoolNotFound(
                f"no enabled IP pool has {kind}Mode Always or CrossSubnet: "
                f"set {kind}Mode on a pool to give node {self.node} a tunnel address"
            )
        attrs = {"node": self.node, "type": TUNNEL_TYPES[kind]}
        return self.auto_assign(handle_id, attrs, 1, pools=wanted)[0]

    @_locked
    def addresses_of(self, handle_id: str) -> list[IPv4Address]:
        """Addresses currently held by a handle (read from its blocks)."""
        handle = self._get_handle(handle_id)
        if handle is None:
            return []
        out: list[IPv4Address] = []
        for cidr in sorted(handle.spec.block):
            model = self.ds.try_get(IPAMBlock, cidr_name(cidr))
            if model is not None:
                block = AllocationBlock.from_spec(model.spec)
                out += [a.ip for a in block.iter_allocations() if a.handle_id == handle_id]
        return out

    def node_handles(self) -> set[str]:
        """Handle ids holding addresses allocated by this node (its own or borrowed).

        For CNI GC: a node may only collect its own pods' handles, never the cluster's.
        """
        return set(self.node_allocations())

    @_locked
    def node_allocations(self) -> dict[str, list[tuple[IPv4Address, dict[str, str]]]]:
        """This node's handles, each with its addresses and their attributes, from one
        list of the blocks (recovery after a restart names pods from these)."""
        out: dict[str, list[tuple[IPv4Address, dict[str, str]]]] = {}
        for model in self.ds.list(IPAMBlock):
            for alloc in AllocationBlock.from_spec(model.spec).iter_allocations():
                if alloc.handle_id and alloc.attrs.get("node") == self.node:
                    out.setdefault(alloc.handle_id, []).append((alloc.ip, dict(alloc.attrs)))
        return out

    @_locked
    def affine_blocks(self) -> list[IPv4Network]:
        """CIDRs of the blocks this node owns (what it announces over BGP)."""
        self._load()
        assert self._affine is not None
        return sorted(IPv4Network(b.spec.cidr) for b in self._affine.values())

    # -- step 1: affine blocks ---------------------------------------------------------
    def _from_affine(
        self, usable: list[IPPool], handle_id: str, attrs: dict[str, str], num: int
    ) -> list[IPv4Address]:
        got: list[IPv4Address] = []
        assert self._affine is not None
        for name, model in sorted(self._affine.items()):
            if len(got) >= num:
                break
            if model.spec.deleted or not _in_pools(model.spec.cidr, usable):
                continue
            if not free_count(model.spec):
                continue
            try:
                got += self._assign_from(name, handle_id, attrs, num - len(got), own=True)
            except _BlockGone:
                continue
            except BlockCorrupt as exc:  # reported by the agent; other blocks still serve
                log.warning("ipam: skipping corrupt block %s: %s", name, exc)
                continue
        return got

    def _assign_from(
        self, name: str, handle_id: str, attrs: dict[str, str], num: int, *, own: bool = False
    ) -> list[IPv4Address]:
        """Take up to num from one block, counting them in the handle at the same time.

        The handle write runs on an I/O thread while this one writes the block; the
        handle is fixed up after if the block gave fewer, and the addresses are given
        back if the handle write failed. own: the block must (still) be affine to this
        node, checked on the copy that is written (_NotAffine otherwise).
        """
        cached = self._cached(name)
        cidr = cached.spec.cidr if cached else _cidr_from_name(name)

        def take(block: AllocationBlock) -> list[IPv4Address]:
            if own and block.host != self.node:
                raise _NotAffine(f"block {name} is no longer affine to {self.node}")
            return block.auto_assign(num, handle_id, attrs)

        counted = self._background(self._handle_add, handle_id, cidr, num)
        got: list[IPv4Address] = []
        try:
            got = self._update_block(name, take)
        except BaseException:
            with contextlib.suppress(Exception):
                counted.result()
                self._handle_add(handle_id, cidr, -num)
            raise
        try:
            counted.result()
        except BaseException:
            self._give_back(name, got)
            raise
        if len(got) < num:
            self._handle_add(handle_id, cidr, len(got) - num)
        return got

    def _give_back(self, name: str, got: list[IPv4Address]) -> None:
        """Undo a block write whose handle write failed (best effort: GC finds the rest)."""
        if not got:
            return
        try:
            self._update_block(name, lambda b: b.release(got))
        except Exception:
            log.exception("ipam: could not give back %s after its handle failed", got)

    # -- step 2: claiming --------------------------------------------------------------
    def _may_claim(self) -> bool:
        assert self._affine is not None
        return self._config.auto_allocate_blocks and len(self._affine) < self.max_blocks

    def _claim_in(self, usable: list[IPPool]) -> IPAMBlock | None:
        """Claim the first free block CIDR (node-seeded order) of the usable pools."""
        self._take_preclaim(wait=True)  # a claim in flight may be the block we need
        live = self._reload_affine()
        assert self._affine is not None
        if len(self._affine) >= self.max_blocks:
            return None
        for model in self._affine.values():  # another process of ours claimed one
            if free_count(model.spec) and _in_pools(model.spec.cidr, usable):
                return model
        block = self._claim_first_free(usable, {b.spec.cidr for b in live})
        if block is not None:
            self._affine[block.name] = block
        return block

    def _claim_first_free(self, usable: list[IPPool], taken: set[str]) -> IPAMBlock | None:
        """Claim the first CIDR (node-seeded order) not in taken (block CIDRs); no cache.

        A taken block of another size or alignment (from an overlapping or deleted
        pool) rules out every CIDR that overlaps it, not only its own name: two blocks
        holding one address would hand it out twice.
        """
        for pool in usable:
            foreign = _foreign_blocks(pool, taken)
            for cidr in block_cidrs(pool, self.node):
                if str(cidr) in taken or any(cidr.overlaps(f) for f in foreign):
                    continue
                try:
                    return self._claim_steps(cidr)
                except _ClaimLost:
                    continue
        return None

    def _claim_cidr(self, cidr: IPv4Network) -> IPAMBlock:
        """Claim cidr and cache the block (lock held)."""
        block = self._claim_steps(cidr)
        assert self._affine is not None
        self._affine[block.name] = block
        return block

    def _claim_steps(self, cidr: IPv4Network) -> IPAMBlock:
        """Two-phase claim; also the repair path for an interrupted earlier claim.

        Datastore writes only (no cache): the background claim runs it without the lock.
        """
        affinity = self._pending_affinity(cidr)
        _checkpoint("affinity-pending")
        block = self._create_block(cidr, affinity)
        _checkpoint("block-created")
        self._confirm(affinity)
        _checkpoint("affinity-confirmed")
        self._tell_claimed(cidr)
        return block

    # -- claiming ahead, in the background ------------------------------------------------
    def _maybe_preclaim(self, usable: list[IPPool]) -> None:
        """Start a background claim when this node's usable blocks run low (lock held)."""
        if self.preclaim_below <= 0 or self._preclaim is not None or not self._may_claim():
            return
        if time.monotonic() < self._preclaim_idle_until:
            return
        assert self._affine is not None
        free = sum(
            free_count(m.spec)
            for m in self._affine.values()
            if not m.spec.deleted and _in_pools(m.spec.cidr, usable)
        )
        if free < self.preclaim_below:
            self._preclaim = self._background(self._claim_ahead, list(usable))

    def _claim_ahead(self, usable: list[IPPool]) -> IPAMBlock | None:
        """Background: claim the next free CIDR; the caller's thread caches the result.

        Free CIDRs are found from the blocks' names alone (a metadata-only list): a
        full list would send and parse every block in the cluster while this
        node's allocations wait for the same apiserver and CPU. maxBlocksPerHost was
        checked against this node's cached blocks when the claim was started.
        """
        # a name not in cidr_name's form can only hide a CIDR whose create then fails
        names = self.ds.list_names(kinds.IPAMBLOCK)
        taken = {_cidr_from_name(n) for n in names if n.count("-") == 4}
        block = self._claim_first_free(usable, taken)
        if block is not None:
            log.info("ipam: node %s claimed %s ahead of need", self.node, block.spec.cidr)
        return block

    def _take_preclaim(self, *, wait: bool) -> None:
        """Cache the block a finished background claim got (lock held)."""
        future = self._preclaim
        if future is None or not (wait or future.done()):
            return
        self._preclaim = None
        try:
            block = future.result()
        except Exception as exc:  # the foreground claims instead, and reports its error
            log.warning("ipam: node %s: background block claim failed: %s", self.node, exc)
            block = None
        if block is None:
            self._preclaim_idle_until = time.monotonic() + PRECLAIM_BACKOFF_S
        elif self._affine is not None:
            self._affine.setdefault(block.name, block)

    def _tell_claimed(self, cidr: IPv4Network) -> None:
        """A failing listener must not fail the allocation: the claim is already real."""
        if self.on_block_claimed is None:
            return
        try:
            self.on_block_claimed(cidr)
        except Exception:
            log.exception("ipam: on_block_claimed(%s) failed", cidr)

    def _pending_affinity(self, cidr: IPv4Network) -> BlockAffinity:
        name = affinity_name(self.node, cidr)
        wanted = BlockAffinity(
            metadata=Meta(name=name, annotations={CLAIM_TIME_ANNOTATION: now_iso()}),
            spec=BlockAffinitySpec(cidr=str(cidr), node=self.node, state="pending"),
        )
        try:
            return self.ds.create(wanted)
        except AlreadyExists:
            return self.ds.get(BlockAffinity, name)  # resume an interrupted claim

    def _create_block(self, cidr: IPv4Network, affinity: BlockAffinity) -> IPAMBlock:
        block = AllocationBlock.new(cidr, host_affinity(self.node), now_iso())
        model = IPAMBlock(metadata=Meta(name=cidr_name(cidr)), spec=block.to_spec())
        try:
            return self.ds.create(model)
        except AlreadyExists:
            existing = self.ds.get(IPAMBlock, model.name)
        if existing.spec.affinity == host_affinity(self.node) and not existing.spec.deleted:
            return existing
        self._delete_quietly(affinity)
        raise _ClaimLost(f"block {cidr} belongs to {existing.spec.affinity}")

    def _confirm(self, affinity: BlockAffinity) -> None:
        """pending -> confirmed: one CAS write on the copy we hold, re-read only on conflict."""
        if affinity.spec.state == "confirmed":
            return
        wanted = affinity.model_copy(deep=True)
        wanted.spec.state = "confirmed"
        try:
            self.ds.update(wanted)
            return
        except Conflict:
            pass

        def confirm(current: BlockAffinity) -> BlockAffinity | None:
            if current.spec.state == "confirmed":
                return None
            current.spec.state = "confirmed"
            return current

        self._cas(lambda: self.ds.mutate(BlockAffinity, affinity.name, confirm))

    def _repair_claims(self) -> None:
        """Finish claims a crashed allocator of this node left half done.

        pending + our block exists -> confirm; pending or confirmed without a block ->
        create it (or give the affinity up if its pool is gone); block owned by
        another node -> delete our affinity.
        """
        blocks = {b.spec.cidr: b for b in self.ds.list(IPAMBlock) if not b.spec.deleted}
        mine = host_affinity(self.node)
        for affinity in self.ds.list(BlockAffinity):
            spec = affinity.spec
            if spec.node != self.node or spec.deleted or spec.state == "pendingDeletion":
                continue
            block = blocks.get(spec.cidr)
            if spec.state == "confirmed" and block and block.spec.affinity == mine:
                continue  # the normal case
            cidr = IPv4Network(spec.cidr)
            if block is None and pool_containing(cidr, self._pools) is None:
                self._delete_quietly(affinity)  # its pool is gone: abandon the claim
                continue
            try:
                self._create_block(cidr, affinity)
                self._confirm(affinity)
                log.info("ipam: node %s repaired its claim of %s", self.node, cidr)
            except _ClaimLost:
                log.info("ipam: node %s dropped its stale affinity for %s", self.node, cidr)

    # -- step 3: borrowing ---------------------------------------------------------------
    def _borrow(
        self, usable: list[IPPool], handle_id: str, attrs: dict[str, str], num: int
    ) -> list[IPv4Address]:
        """Single addresses from other nodes' blocks, in this node's seeded order."""
        live = self._reload_affine()
        mine = host_affinity(self.node)
        got: list[IPv4Address] = []
        for pool in usable:
            for model in self._borrow_order(pool, live):
                if len(got) >= num:
                    return got
                if model.spec.affinity == mine or not free_count(model.spec):
                    continue
                try:
                    got += self._assign_from(model.name, handle_id, attrs, num - len(got))
                except (_BlockGone, BlockCorrupt):
                    continue
        return got

    def _borrow_order(self, pool: IPPool, live: list[IPAMBlock]) -> list[IPAMBlock]:
        network = pool_network(pool)
        step = 2 ** (32 - pool.spec.block_size)
        count = block_count(pool)
        start = node_seed(self.node) % count
        inside = [b for b in live if IPv4Network(b.spec.cidr).subnet_of(network)]

        def rank(block: IPAMBlock) -> int:
            index = (int(IPv4Network(block.spec.cidr).network_address) - int(network[0])) // step
            return (index - start) % count

        return sorted(inside, key=rank)

    # -- block writes ----------------------------------------------------------------------
    def _cached(self, name: str) -> IPAMBlock | None:
        return (self._affine or {}).get(name)

    def _update_block(self, name: str, change: Callable[[AllocationBlock], T]) -> T:
        """Apply change to a copy of the block and CAS it back; re-read on conflict.

        The cached copy is only trusted for writes (a CAS catches staleness): when
        the change finds nothing to do, or refuses, on a cached copy, that answer
        is checked against a fresh read before it is believed.
        """
        model = self._cached(name)
        for _ in range(self.retries):
            fresh = model is None
            if model is None:
                model = self._read_block(name)
            block = AllocationBlock.from_spec(model.spec)
            try:
                result = change(block)
            except IPAMError:
                if fresh:
                    raise
                model = None
                continue
            if block.sequence_number == model.spec.sequence_number:
                if not fresh:
                    model = None
                    continue
                return result  # nothing to change: no write
            wanted = IPAMBlock(metadata=_lean(model.metadata), spec=block.to_spec())
            try:
                stored = self.ds.update(wanted)
            except Conflict:
                model = None
                continue
            except NotFound:
                self._forget(name)
                raise _BlockGone(name) from None
            self._remember(stored)
            return result
        raise ConcurrencyExhausted(
            f"block {name}: still conflicting after {self.retries} attempts; retry later"
        )

    def _read_block(self, name: str) -> IPAMBlock:
        model = self.ds.try_get(IPAMBlock, name)
        if model is None or model.spec.deleted:
            self._forget(name)
            raise _BlockGone(name)
        self._remember(model)
        return model

    def _remember(self, model: IPAMBlock) -> None:
        if self._affine is None:
            return
        if model.spec.affinity == host_affinity(self.node) and not model.spec.deleted:
            self._affine[model.name] = model
        else:
            self._affine.pop(model.name, None)

    def _forget(self, name: str) -> None:
        if self._affine is not None:
            self._affine.pop(name, None)

    def _release_in_block(
        self, name: str, addresses: list[IPv4Address], seqs: Mapping[IPv4Address, int]
    ) -> ReleaseResult:
        outcome: dict[str, list[IPv4Address]] = {}

        orphan_empty = [False]

        def change(block: AllocationBlock) -> dict[str | None, int]:
            outcome.clear()
            outcome.update(released=[], not_allocated=[], stale=[])
            handles: dict[str | None, int] = {}
            for address in addresses:
                current = block.allocation(address)
                if current is None:
                    outcome["not_allocated"].append(address)
                elif address in seqs and seqs[address] != current.sequence_number:
                    outcome["stale"].append(address)
                else:
                    for handle, n in block.release([address]).items():
                        handles[handle] = handles.get(handle, 0) + n
                    outcome["released"].append(address)
            orphan_empty[0] = _orphan_empty(block)
            return handles

        try:
            handles = self._update_block(name, change)
        except _BlockGone:
            return ReleaseResult([], list(addresses), [])
        cidr = _cidr_from_name(name)
        for handle, count in handles.items():
            if handle:
                self._handle_add(handle, cidr, -count)
        if orphan_empty[0]:
            self._delete_if_orphan_empty(name)
        return ReleaseResult(outcome["released"], outcome["not_allocated"], outcome["stale"])

    def _delete_if_orphan_empty(self, name: str) -> None:
        """A block with no affinity is deleted as soon as it is empty (Calico does too)."""
        model = self.ds.try_get(IPAMBlock, name)
        spec = model.spec if model else None
        if model and spec and not spec.affinity and is_empty(spec):
            self._delete_quietly(model)

    def _rollback(self, got: list[IPv4Address]) -> None:
        """Best effort: give back a partial allocation before reporting the failure."""
        if not got:
            return
        log.info("ipam: rolling back %d partial allocations", len(got))
        try:
            self.release_ips(got)
        except Exception:
            log.exception("ipam: rollback of %s failed; `tabbyctl ipam check` will see it", got)

    # -- handles ---------------------------------------------------------------------------
    def _get_handle(self, handle_id: str) -> IPAMHandle | None:
        handle = self.ds.try_get(IPAMHandle, handle_name(handle_id))
        if handle is None or handle.spec.deleted:
            return None
        if handle.spec.handle_id != handle_id:
            raise IPAMError(
                f"handle object {handle.name} holds id {handle.spec.handle_id!r}, "
                f"not {handle_id!r}: the names collide"
            )
        return handle

    def _handle_add(self, handle_id: str, cidr: str, delta: int) -> None:
        """Count delta addresses of handle_id in block cidr (create / delete as needed)."""
        if delta == 0:
            return
        name = handle_name(handle_id)
        if delta > 0:
            fresh = IPAMHandle(
                metadata=Meta(name=name),
                spec=IPAMHandleSpec(handleID=handle_id, block={cidr: delta}),
            )
            try:
                self.ds.create(fresh)
                return
            except AlreadyExists:
                pass

        def change(handle: IPAMHandle) -> IPAMHandle | None:
            if handle.spec.handle_id != handle_id:
                raise IPAMError(f"handle object {name} belongs to {handle.spec.handle_id!r}")
            count = handle.spec.block.get(cidr, 0) + delta
            if count > 0:
                handle.spec.block[cidr] = count
            else:
                handle.spec.block.pop(cidr, None)
            return handle

        try:
            updated = self._cas(lambda: self.ds.mutate(IPAMHandle, name, change))
        except NotFound:
            if delta > 0:  # deleted between our create and read: start again
                self._handle_add(handle_id, cidr, delta)
            return
        if updated is not None and not updated.spec.block:
            self._delete_quietly(updated)

    def _drop_handle(self, handle: IPAMHandle, released: dict[str, int]) -> None:
        """Delete the handle as read; if it changed meanwhile, subtract what was freed."""
        try:
            self.ds.delete(handle)
            return
        except NotFound:
            return
        except Conflict:
            pass  # an allocation under the same id raced us: keep what it added
        for cidr, count in released.items():
            self._handle_add(handle.spec.handle_id, cidr, -count)

    # -- helpers -----------------------------------------------------------------------------
    def _cas(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Conflict as exc:
            raise ConcurrencyExhausted(f"{exc}; retry later") from None

    def _delete_quietly(self, obj: BlockAffinity | IPAMBlock | IPAMHandle) -> None:
        """Delete if unchanged since read; someone else's newer write wins."""
        with contextlib.suppress(NotFound, Conflict):
            self.ds.delete(obj)

    def _block_holding(self, address: IPv4Address) -> IPAMBlock | None:
        """The live block whose CIDR holds address, whatever its size."""
        return next((b for b in self._live_blocks() if address in IPv4Network(b.spec.cidr)), None)

    def _no_pool_error(self, names: Sequence[str] | None) -> IPAMError:
        """InvalidPool naming the overlap when a refused pool was this node's candidate."""
        wanted = f"pools {', '.join(names)}" if names else "any IP pool"
        by_name = {p.name: p for p in self._pools}
        candidates = [by_name[n] for n in names or sorted(by_name) if n in by_name]
        refused = [
            self._refused[p.name]
            for p in candidates
            if p.name in self._refused and not p.spec.disabled and selects_node(p, self._labels)
        ]
        if refused:
            return InvalidPool(f"node {self.node} may not use {wanted}: " + "; ".join(refused))
        return PoolExhausted(
            f"node {self.node} may not use {wanted}: every candidate is disabled or its "
            "nodeSelector does not match the node's labels"
        )

    def _exhausted_message(self, usable: list[IPPool], num: int) -> str:
        names = ", ".join(f"{p.name} ({p.spec.cidr})" for p in usable)
        message = f"no free address in pools {names} for {num} address(es) on node {self.node}"
        if self._config.strict_affinity:
            message += "; strictAffinity forbids borrowing from other nodes' blocks"
        assert self._affine is not None
        if len(self._affine) >= self.max_blocks:
            message += f"; node holds the maximum of {self.max_blocks} blocks"
        return message


def _lean(meta: Meta) -> Meta:
    """Metadata without managedFields: the apiserver keeps its own, and the body shrinks."""
    lean = meta.model_copy()
    if lean.model_extra:
        lean.__pydantic_extra__ = {
            k: v for k, v in lean.model_extra.items() if k != "managedFields"
        }
    return lean


def _release_handle(block: AllocationBlock, handle_id: str) -> list[IPv4Address]:
    ips = [a.ip for a in block.iter_allocations() if a.handle_id == handle_id]
    block.release_handle(handle_id)
    return ips


def _orphan_empty(block: AllocationBlock) -> bool:
    return not block.affinity and block.is_empty


def _in_pools(cidr: str, pools: list[IPPool]) -> bool:
    return pool_containing(parse_network(cidr), pools) is not None


def _foreign_blocks(pool: IPPool, taken: set[str]) -> list[IPv4Network]:
    """Taken block CIDRs overlapping pool that are not among its own block CIDRs."""
    network = pool_network(pool)
    size = pool.spec.block_size
    out = []
    for cidr in taken:
        block = parse_network(cidr)
        if block.overlaps(network) and (block.prefixlen != size or not block.subnet_of(network)):
            out.append(block)
    return out


def _encap(pool: IPPool, kind: str) -> bool:
    mode = pool.spec.ipip_mode if kind == "ipip" else pool.spec.vxlan_mode
    return mode != "Never"


def _cidr_from_name(name: str) -> str:
    """'10-244-1-0-26' -> '10.244.1.0/26' (inverse of cidr_name for IPv4)."""
    parts = name.split("-")
    return f"{'.'.join(parts[:4])}/{parts[4]}"
