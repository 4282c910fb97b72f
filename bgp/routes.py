"""What this node announces, and which kernel routes its learned routes become (pure).

Announcements: each confirmed block affine to this node (one route per block, not
per pod), plus a /32 for every address this node uses from another node's block
(the owner keeps announcing the block; the more specific /32 wins at every node).

Kernel state from learned routes, per pool of the prefix:
- VXLAN (vxlanMode Always, or CrossSubnet with the next hop on another subnet):
  `via <peer VXLAN tunnel addr> dev <vxlan device> onlink`, a permanent neighbour
  entry (tunnel addr → peer VTEP MAC) and an FDB entry (MAC → peer node address).
- IPIP (ipipMode Always, or CrossSubnet with the next hop on another subnet):
  `via <peer node addr> dev tunl0 onlink`.
- Otherwise a plain `via <next hop>`.
Each own block gets a blackhole route, so traffic to unallocated addresses of the
block dies here instead of following a default route out. A learned route for
exactly one of our blocks is ignored (an echo, or a misconfigured peer); more
specific ones (a /32 another node borrowed from our block) are installed.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from bgp.messages import LearnedRoute
from bgp.nodes import NodeFacts
from datastore.models import BlockAffinity, IPAMBlock, IPPool
from ipam.block import decode_blocks

log = logging.getLogger(__name__)

PROTO_POD: Final = 80
"""Route protocol of pod routes (`<pod ip>/32 dev cali...`), written by the CNI/agent."""
PROTO_BGP: Final = 81
"""Route protocol of every route bgp/ writes: learned routes and own-block blackholes."""

IPIP_DEVICE: Final = "tunl0"
VXLAN_DEVICE: Final = "vxlan.tabby"
DEFAULT_LOCAL_PREF: Final = 100

Network = ipaddress.IPv4Network
Address = ipaddress.IPv4Address


@dataclass(frozen=True, order=True)
class KernelRoute:
    """A route in the main table; `kind` is unicast, blackhole or unreachable."""

    dst: Network
    kind: str = "unicast"
    gateway: Address | None = None
    dev: str | None = None
    onlink: bool = False
    proto: int = PROTO_BGP

    def __str__(self) -> str:
        parts = [str(self.dst)] if self.kind == "unicast" else [self.kind, str(self.dst)]
        if self.gateway is not None:
            parts += ["via", str(self.gateway)]
        if self.dev:
            parts += ["dev", self.dev]
        if self.onlink:
            parts.append("onlink")
        return " ".join([*parts, "proto", str(self.proto)])


@dataclass(frozen=True, order=True)
class NeighEntry:
    """A permanent ARP entry: the remote VTEP's tunnel address → its MAC."""

    ip: Address
    mac: str
    dev: str


@dataclass(frozen=True, order=True)
class FdbEntry:
    """A permanent FDB entry: frames for the remote VTEP MAC go to its node address."""

    mac: str
    dst: Address
    dev: str


@dataclass(frozen=True)
class Dataplane:
    """Desired kernel state for BGP; `problems` explains routes that could not be made."""

    routes: tuple[KernelRoute, ...] = ()
    neighs: tuple[NeighEntry, ...] = ()
    fdbs: tuple[FdbEntry, ...] = ()
    problems: tuple[str, ...] = ()


# -- announcements ------------------------------------------------------------------------


def own_blocks(node_name: str, affinities: Iterable[BlockAffinity]) -> frozenset[Network]:
    """Blocks this node may announce: confirmed affinities (pending ones are not yet ours)."""
    return frozenset(
        ipaddress.IPv4Network(a.spec.cidr)
        for a in affinities
        if a.spec.node == node_name and a.spec.state == "confirmed" and not a.spec.deleted
    )


def announcements(
    node_name: str,
    affinities: Iterable[BlockAffinity],
    borrowed: Iterable[tuple[str, str | None]] = (),
) -> frozenset[Network]:
    """Prefixes to announce: own blocks, and /32s of addresses borrowed from others' blocks.

    `borrowed` lists (ip, owner of the ip's block) for addresses used on this node;
    an owner equal to this node (or an address inside an own block) needs no /32.
    """
    blocks = own_blocks(node_name, affinities)
    out = set(blocks)
    for ip, owner in borrowed:
        address = ipaddress.IPv4Address(ip.split("/")[0])
        if owner == node_name or any(address in b for b in blocks):
            continue
        out.add(ipaddress.IPv4Network(f"{address}/32"))
    return frozenset(out)


@dataclass(frozen=True)
class Borrowed:
    """Addresses this node uses from other nodes' blocks, and blocks that could not be read."""

    addresses: tuple[tuple[str, str | None], ...] = ()  # (ip, owner of its block)
    corrupt: tuple[tuple[str, str], ...] = ()  # (IPAMBlock name, why it is unreadable)


def borrowed_addresses(node_name: str, blocks: Iterable[IPAMBlock]) -> Borrowed:
    """What `announcements` needs from the IPAM blocks: addresses allocated by this node
    in blocks affine to others. A corrupt block is set aside with its reason (the
    caller reports it), so it costs its own /32s, not the whole BGP pass."""
    me = f"host:{node_name}"
    others = [b for b in blocks if b.spec.affinity != me and not b.spec.deleted]
    decoded = decode_blocks(others)
    out: list[tuple[str, str | None]] = []
    for model, block in decoded.good:
        owner = (model.spec.affinity or "").removeprefix("host:") or None
        for alloc in block.iter_allocations():
            if alloc.attrs.get("node") == node_name:
                out.append((str(alloc.ip), owner))
    corrupt = tuple((model.name, reason) for model, reason in decoded.corrupt)
    return Borrowed(tuple(out), corrupt)


# -- kernel routes from learned routes ----------------------------------------------------


@dataclass(frozen=True)
class RouteContext:
    """Everything besides the learned routes that decides the kernel state."""

    me: NodeFacts
    own_blocks: frozenset[Network]
    pools: Sequence[IPPool] = ()
    nodes: Mapping[str, NodeFacts] = field(default_factory=dict)
    ipip_device: str = IPIP_DEVICE
    vxlan_device: str = VXLAN_DEVICE
    own_block_kind: str = "blackhole"


def best_routes(learned: Iterable[LearnedRoute]) -> dict[Network, LearnedRoute]:
    """One route per prefix: highest local-pref, shortest AS path, lowest peer address."""
    best: dict[Network, LearnedRoute] = {}
    for route in sorted(learned, key=_preference):
        best.setdefault(route.prefix, route)
    return best


def _preference(route: LearnedRoute) -> tuple[int, int, int, int]:
    pref = route.local_pref if route.local_pref is not None else DEFAULT_LOCAL_PREF
    return (-pref, len(route.as_path), int(route.peer), int(route.next_hop))


def desired_dataplane(ctx: RouteContext, learned: Iterable[LearnedRoute]) -> Dataplane:
    """Routes, neighbour and FDB entries the kernel should hold for BGP."""
    routes = {b: KernelRoute(dst=b, kind=ctx.own_block_kind) for b in sorted(ctx.own_blocks)}
    neighs: set[NeighEntry] = set()
    fdbs: set[FdbEntry] = set()
    problems: list[str] = []
    by_ip = {n.ip: n for n in ctx.nodes.values()}
    for prefix, route in sorted(best_routes(learned).items()):
        if prefix in ctx.own_blocks or route.next_hop == ctx.me.ip:
            continue  # our own block echoed back, or a route pointing at ourselves
        decision = route_for(ctx, route, by_ip.get(route.next_hop))
        if isinstance(decision, str):
            problems.append(decision)
            continue
        kernel_route, neigh, fdb = decision
        routes[prefix] = kernel_route
        neighs.update(x for x in (neigh,) if x is not None)
        fdbs.update(x for x in (fdb,) if x is not None)
    return Dataplane(
        routes=tuple(sorted(routes.values())),
        neighs=tuple(sorted(neighs)),
        fdbs=tuple(sorted(fdbs)),
        problems=tuple(problems),
    )


RouteDecision = tuple[KernelRoute, NeighEntry | None, FdbEntry | None]


def route_for(
    ctx: RouteContext, route: LearnedRoute, remote: NodeFacts | None
) -> RouteDecision | str:
    """The kernel form of one learned route, or a reason why there is none."""
    pool = pool_for(route.prefix, ctx.pools)
    same_subnet = route.next_hop in ctx.me.address.network
    if pool is not None and _encap(pool.spec.vxlan_mode, same_subnet):
        return _vxlan_route(ctx, route, remote)
    if pool is not None and _encap(pool.spec.ipip_mode, same_subnet):
        return (
            KernelRoute(route.prefix, gateway=route.next_hop, dev=ctx.ipip_device, onlink=True),
            None,
            None,
        )
    return KernelRoute(route.prefix, gateway=route.next_hop), None, None


def _encap(mode: str, same_subnet: bool) -> bool:
    return mode == "Always" or (mode == "CrossSubnet" and not same_subnet)


def _vxlan_route(
    ctx: RouteContext, route: LearnedRoute, remote: NodeFacts | None
) -> RouteDecision | str:
    if remote is None or remote.vxlan_tunnel_addr is None or remote.vxlan_tunnel_mac is None:
        return (
            f"{route.prefix} via {route.next_hop}: VXLAN needs the node's tunnel address "
            "and MAC annotations"
        )
    dev = ctx.vxlan_device
    mac = remote.vxlan_tunnel_mac.lower()
    return (
        KernelRoute(route.prefix, gateway=remote.vxlan_tunnel_addr, dev=dev, onlink=True),
        NeighEntry(ip=remote.vxlan_tunnel_addr, mac=mac, dev=dev),
        FdbEntry(mac=mac, dst=remote.ip, dev=dev),
    )


def pool_for(prefix: Network, pools: Sequence[IPPool]) -> IPPool | None:
    """The most specific IPv4 pool containing the prefix (disabled pools still route)."""
    best: tuple[int, IPPool] | None = None
    for pool in pools:
        cidr = ipaddress.ip_network(pool.spec.cidr, strict=False)
        if not isinstance(cidr, ipaddress.IPv4Network) or not prefix.subnet_of(cidr):
            continue
        if best is None or cidr.prefixlen > best[0]:
            best = (cidr.prefixlen, pool)
    return None if best is None else best[1]
