"""BGP for one node, wired end to end: datastore objects in, sessions and routes out.

This is what the node agent calls. It keeps the two halves of bgp/ apart:
- compute: `compute_plan` (peers), `announcements` (prefixes), `desired_dataplane`
  (kernel state from learned routes), all pure;
- apply: the Speaker (ExaBGP) and the Route/Neigh managers (netlink).

`update()` takes a full snapshot of the inputs (the agent calls it on any watch
event and on its resync timer); `resync()` re-applies the kernel state from the
routes currently learned, which also repairs drift. Learned-route changes from the
speaker apply the kernel state by themselves. Kernel writes happen only when the
desired state changed (or on `resync()`): a watch event that changes nothing for
BGP costs no netlink dump.

`block_claimed()` is the fast path for a new block: the node's own allocator calls
it right after a claim, so the blackhole and the announcement go out at once
instead of after the affinity's watch event reaches the cache. Such a block stays
announced until the cache shows its affinity (then the cache is the truth), or
for `CLAIM_GRACE_S` at most.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bgp.config import BGPPlan, compute_plan
from bgp.kernel import ApplyResult, NeighManager, Netlink, RouteManager
from bgp.messages import LearnedRoute
from bgp.nodes import parse_nodes
from bgp.routes import (
    IPIP_DEVICE,
    VXLAN_DEVICE,
    Dataplane,
    RouteContext,
    announcements,
    borrowed_addresses,
    desired_dataplane,
    own_blocks,
)
from bgp.speaker import Speaker, SpeakerOptions
from datastore.models import BGPConfiguration, BGPPeer, BlockAffinity, IPAMBlock, IPPool

log = logging.getLogger(__name__)

CLAIM_GRACE_S = 30.0
"""How long a block claimed here is announced without the cache confirming it."""

Network = ipaddress.IPv4Network


@dataclass(frozen=True)
class BGPInputs:
    """A snapshot of everything BGP depends on (raw Node dicts, typed resources)."""

    config: BGPConfiguration | None = None
    nodes: Sequence[Mapping[str, Any]] = ()
    peers: Sequence[BGPPeer] = ()
    affinities: Sequence[BlockAffinity] = ()
    pools: Sequence[IPPool] = ()
    borrowed: Sequence[tuple[str, str | None]] = ()  # (ip, owner of its block) used here
    blocks: Sequence[IPAMBlock] = ()  # IPAM blocks: their addresses used here join `borrowed`
    passwords: Mapping[str, str] = field(default_factory=dict)  # BGP_SECRET's keys


@dataclass
class ControllerStatus:
    """The last outcome, for logs, metrics and health."""

    plan: BGPPlan | None = None
    dataplane: Dataplane = field(default_factory=Dataplane)
    routes: ApplyResult = field(default_factory=ApplyResult)
    neigh_errors: list[str] = field(default_factory=list)
    invalid_blocks: dict[str, str] = field(default_factory=dict)  # name -> why, skipped now
    newly_invalid: int = 0  # of those, how many the last update() reported for the first time


class BGPController:
    """Owns this node's Speaker and kernel managers; thread-safe."""

    def __init__(
        self,
        node_name: str,
        options: SpeakerOptions,
        netlink: Callable[[], Netlink],
        *,
        ipip_device: str = IPIP_DEVICE,
        vxlan_device: str = VXLAN_DEVICE,
    ) -> None:
        self.node_name = node_name
        self.options = options
        self.routes = RouteManager(netlink)
        self.neighs = NeighManager(netlink, vxlan_device)
        self.ipip_device = ipip_device
        self.vxlan_device = vxlan_device
        self.speaker: Speaker | None = None
        self.status = ControllerStatus()
        self._ctx: RouteContext | None = None
        self._lock = threading.RLock()
        # Announcing takes _origin_lock only (never _lock): the speaker's callback
        # thread takes _lock while holding its own locks.
        self._origin_lock = threading.Lock()
        self._base_prefixes: frozenset[Network] = frozenset()
        self._claimed: dict[Network, float] = {}  # block -> when our allocator claimed it
        self._applied: tuple[Dataplane, bool] | None = None  # last clean kernel apply

    def update(self, inputs: BGPInputs) -> ControllerStatus:
        """Recompute everything from a snapshot and apply what changed."""
        plan = compute_plan(
            inputs.config, inputs.nodes, inputs.peers, self.node_name, passwords=inputs.passwords
        )
        self.status.plan = plan
        if plan is None:
            log.warning("node %s has no usable address annotation yet", self.node_name)
            return self.status
        for problem in plan.problems:
            log.warning("bgp: %s", problem)
        facts = parse_nodes(inputs.nodes)
        blocks = own_blocks(self.node_name, inputs.affinities)
        with self._lock:
            claimed = self._pending_claims(blocks)
            self._ctx = RouteContext(
                me=facts[self.node_name],
                own_blocks=blocks | claimed,
                pools=tuple(inputs.pools),
                nodes=facts,
                ipip_device=self.ipip_device,
                vxlan_device=self.vxlan_device,
            )
            self._apply_kernel(self._learned())  # blackholes before we announce the blocks
            speaker, fresh = self.speaker, self.speaker is None
            if speaker is None:
                speaker = self.speaker = Speaker(plan, self.options, on_routes=self._on_routes)
        # Speaker calls happen outside our lock: its callback thread takes our lock
        # while holding its own, so holding ours here could deadlock.
        if not fresh:
            speaker.update_plan(plan)
        borrowed = self._borrowed(inputs)
        with self._origin_lock:
            self._base_prefixes = announcements(self.node_name, inputs.affinities, borrowed)
            self._announce(speaker)
        if fresh:
            speaker.start()
        return self.status

    def _borrowed(self, inputs: BGPInputs) -> list[tuple[str, str | None]]:
        """inputs.borrowed plus what the blocks show; a corrupt block is logged once (per
        distinct reason) and skipped, so it never fails, nor floods, the pass."""
        found = borrowed_addresses(self.node_name, inputs.blocks)
        invalid = dict(found.corrupt)
        fresh = {n: why for n, why in invalid.items() if self.status.invalid_blocks.get(n) != why}
        for name, why in sorted(fresh.items()):
            log.error(
                "skipping corrupt IPAMBlock %s: %s; its borrowed addresses are not announced "
                "from here until it is fixed (tabbyctl ipam check)",
                name,
                why,
                extra={"ipamblock": name, "reason": why},
            )
        for name in sorted(set(self.status.invalid_blocks) - set(invalid)):
            log.info("IPAMBlock %s is readable again", name)
        self.status.invalid_blocks, self.status.newly_invalid = invalid, len(fresh)
        return [*inputs.borrowed, *found.addresses]

    def block_claimed(self, block: Network) -> None:
        """Our allocator just claimed `block`: blackhole it and announce it now."""
        with self._lock:
            self._claimed[block] = time.monotonic()
            speaker = self.speaker
            if self._ctx is None or speaker is None:
                return  # not started yet: the first update() includes the claim
            if block not in self._ctx.own_blocks:
                self._ctx = replace(self._ctx, own_blocks=self._ctx.own_blocks | {block})
                self._apply_kernel(self._learned())
        with self._origin_lock:
            self._announce(speaker)

    def _announce(self, speaker: Speaker) -> None:
        """The cache's prefixes plus claims it does not show yet (_origin_lock held)."""
        with self._lock:
            claimed = frozenset(self._claimed)
        speaker.announce(self._base_prefixes | claimed)

    def _pending_claims(self, confirmed: frozenset[Network]) -> frozenset[Network]:
        """Claims the cache does not show yet; forget those it shows, or too old (_lock held)."""
        now = time.monotonic()
        for block, when in list(self._claimed.items()):
            if block in confirmed or now - when > CLAIM_GRACE_S:
                del self._claimed[block]
        return frozenset(self._claimed)

    def resync(self) -> ControllerStatus:
        """Re-apply kernel state from the routes learned now (timer, drift repair)."""
        with self._lock:
            self._apply_kernel(self._learned(), force=True)
            return self.status

    def stop(self) -> None:
        """Stop the speaker; kernel routes stay (a restart must not change packet fates)."""
        speaker = self.speaker
        if speaker is not None:
            speaker.stop()

    def _learned(self) -> list[LearnedRoute]:
        return self.speaker.learned_routes() if self.speaker is not None else []

    def _on_routes(self, learned: list[LearnedRoute]) -> None:
        with self._lock:
            self._apply_kernel(learned)

    def _apply_kernel(self, learned: list[LearnedRoute], force: bool = False) -> None:
        """Bring the kernel to the desired state; skipped when nothing changed since the
        last clean apply (force: always, e.g. to repair drift)."""
        if self._ctx is None:
            return
        plane = desired_dataplane(self._ctx, learned)
        # after a restart, keep routes the previous run learned until BGP caught up
        synced = self.speaker is not None and self.speaker.synced()
        if not force and self._applied == (plane, synced):
            return
        for problem in plane.problems:
            log.warning("bgp route: %s", problem)
        self.routes.set_desired(plane.routes)
        result = self.routes.apply(prune=synced)
        for message in (*result.conflicts, *result.errors):
            log.warning("bgp kernel: %s", message)
        self.status.dataplane, self.status.routes = plane, result
        self.status.neigh_errors = self.neighs.apply(plane.neighs, plane.fdbs)
        clean = not (result.errors or result.conflicts or self.status.neigh_errors)
        self._applied = (plane, synced) if clean else None
