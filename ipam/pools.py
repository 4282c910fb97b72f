"""Pure pool logic: validation, selection for a node, block enumeration, naming.

Pool lifecycle (decided here, enforced by the allocator and `tabbyctl ipam check`):
- A pool is retired by setting `disabled: true` first. A disabled pool hands out
  nothing new: no new blocks are claimed in it and no address is taken from its
  existing blocks, but every address already allocated stays valid and can be
  released.
- Deleting a pool object removes it from selection at once. Blocks whose CIDR lies
  in no existing pool ("orphan blocks") are never used for new allocations;
  releases still work, and `ipam check` reports orphan blocks that still hold
  allocations so an operator can drain them. GC deletes orphan blocks once empty.
- Pools must not overlap each other or a reserved range. Admission rejects such a
  pool (the CRD's CEL rules and manifests/ippool-admission.yaml); one that got in
  anyway (created before those checks, or with admission off) is refused here
  (`refused_pools`): of two overlapping pools only the older one is used, on every
  node alike, so no address can be handed out twice.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from ipaddress import IPv4Address, IPv4Network

from datastore.models import IPPool
from ipam.errors import InvalidPool, PoolNotFound
from ipam.selector import SelectorError, parse_selector

MIN_BLOCK_SIZE = 20
MAX_BLOCK_SIZE = 32
MIN_POOL_PREFIX = 8
"""A shorter pool would cover reserved ranges and the addresses pods must reach."""
LINK_LOCAL = IPv4Network("169.254.0.0/16")
RESERVED: tuple[tuple[IPv4Network, str], ...] = (
    (IPv4Network("0.0.0.0/8"), "this-network 0.0.0.0/8"),
    (IPv4Network("127.0.0.0/8"), "loopback 127.0.0.0/8"),
    (LINK_LOCAL, f"link-local {LINK_LOCAL}"),
    (IPv4Network("224.0.0.0/4"), "multicast 224.0.0.0/4"),
    (IPv4Network("240.0.0.0/4"), "reserved 240.0.0.0/4 (class E and broadcast)"),
)
"""Ranges no pod address may come from; the IPPool CRD's CEL rules list the same."""
MAX_NAME = 253
_NAME_OK = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")


# -- names ------------------------------------------------------------------------
def cidr_name(cidr: IPv4Network | str) -> str:
    """Resource name of a block: '10.244.1.0/26' -> '10-244-1-0-26' (Calico's form)."""
    return str(cidr).replace(".", "-").replace(":", "-").replace("/", "-")


def _hashed(name: str, original: str) -> str:
    digest = hashlib.sha256(original.encode()).hexdigest()[:11]
    return f"{name[: MAX_NAME - 12].rstrip('-.')}-{digest}"


def affinity_name(node: str, cidr: IPv4Network | str) -> str:
    """'<node>-<block name>', truncated with a hash suffix when it would be too long."""
    name = f"{node}-{cidr_name(cidr)}"
    return name if len(name) < MAX_NAME else _hashed(name, name)


def handle_name(handle_id: str) -> str:
    """A valid object name for a handle id; ids that need changing get a hash suffix.

    The suffix keeps two ids that sanitise to the same text apart; the exact id is
    stored in spec.handleID and checked on read.
    """
    if len(handle_id) < MAX_NAME and _NAME_OK.match(handle_id):
        return handle_id
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", handle_id.lower()).strip("-.") or "handle"
    return _hashed(cleaned, handle_id)


def tunnel_handle_id(kind: str, node: str) -> str:
    """Calico's tunnel handle ids: 'ipip-tunnel-addr-<node>', 'vxlan-tunnel-addr-<node>'."""
    if kind not in ("ipip", "vxlan"):
        raise ValueError(f"unknown tunnel kind {kind!r}: use 'ipip' or 'vxlan'")
    return f"{kind}-tunnel-addr-{node}"


# -- validation -------------------------------------------------------------------
def pool_network(pool: IPPool) -> IPv4Network:
    """The pool's CIDR; InvalidPool if it is not a strictly masked IPv4 network."""
    try:
        return IPv4Network(pool.spec.cidr)
    except ValueError as exc:
        raise InvalidPool(f"pool {pool.name}: cidr {pool.spec.cidr!r} is invalid: {exc}") from None


def validate_pool(pool: IPPool) -> None:
    """One pool on its own: CIDR, block size, selector, encapsulation."""
    network = pool_network(pool)
    size = pool.spec.block_size
    if not MIN_BLOCK_SIZE <= size <= MAX_BLOCK_SIZE:
        raise InvalidPool(
            f"pool {pool.name}: blockSize {size} is outside {MIN_BLOCK_SIZE}-{MAX_BLOCK_SIZE}"
        )
    if network.prefixlen > size:
        raise InvalidPool(f"pool {pool.name}: cidr {network} is smaller than one /{size} block")
    if network.prefixlen < MIN_POOL_PREFIX:
        raise InvalidPool(
            f"pool {pool.name}: cidr {network} is shorter than /{MIN_POOL_PREFIX}: "
            "it would cover reserved ranges and addresses the pods must reach"
        )
    for reserved, what in RESERVED:
        if network.overlaps(reserved):
            raise InvalidPool(f"pool {pool.name}: cidr {network} overlaps {what}")
    if pool.spec.ipip_mode != "Never" and pool.spec.vxlan_mode != "Never":
        raise InvalidPool(f"pool {pool.name}: ipipMode and vxlanMode cannot both be enabled")
    try:
        parse_selector(pool.spec.node_selector)
    except SelectorError as exc:
        raise InvalidPool(f"pool {pool.name}: nodeSelector: {exc}") from None


def validate_pools(pools: Iterable[IPPool]) -> None:
    """All pools together: each valid, and no two overlapping."""
    seen: list[tuple[IPv4Network, str]] = []
    for pool in pools:
        validate_pool(pool)
        network = pool_network(pool)
        for other, name in seen:
            if network.overlaps(other):
                raise InvalidPool(
                    f"pool {pool.name} ({network}) overlaps pool {name} ({other}): "
                    "pools must not overlap; change or delete one of them"
                )
        seen.append((network, pool.name))


def _age(pool: IPPool) -> tuple[str, str]:
    """Oldest first (RFC 3339 timestamps sort as text), then by name for a tie."""
    return (pool.metadata.creation_timestamp or "", pool.name)


def refused_pools(pools: Iterable[IPPool]) -> dict[str, str]:
    """Pools no node may take addresses from, each with why and what to do.

    Decided from all pools alike, so every node decides the same: a pool invalid on
    its own is refused; of pools that overlap, the oldest valid one is kept (disabled
    or not: its blocks still hold addresses) and each newer one that overlaps a kept
    pool is refused. Kept pools never overlap, so no address lies in two of them.
    """
    refused: dict[str, str] = {}
    kept: list[tuple[IPv4Network, IPPool]] = []
    for pool in sorted(pools, key=_age):
        try:
            validate_pool(pool)
        except InvalidPool as exc:
            refused[pool.name] = f"{exc}; no address is allocated from it: fix or delete it"
            continue
        network = pool_network(pool)
        clash = next((p for other, p in kept if other.overlaps(network)), None)
        if clash is None:
            kept.append((network, pool))
            continue
        state = ", disabled" if clash.spec.disabled else ""
        refused[pool.name] = (
            f"pool {pool.name} ({network}) overlaps pool {clash.name} "
            f"({clash.spec.cidr}{state}), which is older: no address is allocated from "
            f"{pool.name}, so that no address goes to two pods; delete {pool.name} and "
            f"create it again with a cidr outside every other pool (or delete {clash.name} "
            "once its addresses are released)"
        )
    return refused


# -- selection --------------------------------------------------------------------
def select_pools(
    pools: Sequence[IPPool],
    node_labels: Mapping[str, str],
    names: Sequence[str] | None = None,
    *,
    refused: Mapping[str, str] | None = None,
) -> list[IPPool]:
    """The pools a node may take new addresses from, in a stable order.

    `names` restricts to named pools (PoolNotFound if one does not exist). Disabled
    pools and pools whose nodeSelector does not match are left out; so are refused
    pools (`refused`, computed by refused_pools when not given): overlapping or
    invalid ones.
    """
    if refused is None:
        refused = refused_pools(pools)
    by_name = {p.name: p for p in pools}
    if names:
        missing = [n for n in names if n not in by_name]
        if missing:
            known = ", ".join(sorted(by_name)) or "none"
            raise PoolNotFound(f"unknown pool(s) {', '.join(missing)}; known: {known}")
        candidates = [by_name[n] for n in names]
    else:
        candidates = sorted(pools, key=lambda p: p.name)
    return [
        p
        for p in candidates
        if not p.spec.disabled and p.name not in refused and selects_node(p, node_labels)
    ]


def selects_node(pool: IPPool, labels: Mapping[str, str]) -> bool:
    """Whether the pool's nodeSelector matches the labels (False if it does not parse)."""
    try:
        return parse_selector(pool.spec.node_selector).matches(labels)
    except SelectorError:
        return False


@functools.lru_cache(maxsize=4096)
def parse_network(cidr: str) -> IPv4Network:
    """IPv4Network(cidr), parsed once: every allocation checks each block against the pools."""
    return IPv4Network(cidr)


def pool_containing(address: IPv4Address | IPv4Network, pools: Iterable[IPPool]) -> IPPool | None:
    """The pool whose CIDR holds an address or a block, if any."""
    for pool in pools:
        network = parse_network(pool.spec.cidr)
        if isinstance(address, IPv4Network):
            if address.subnet_of(network):
                return pool
        elif address in network:
            return pool
    return None


# -- block enumeration --------------------------------------------------------------
def node_seed(node: str) -> int:
    """A stable number from the hostname: retries walk the same order, nodes diverge."""
    return int.from_bytes(hashlib.sha256(node.encode()).digest()[:8], "big")


def block_count(pool: IPPool) -> int:
    return 2 ** (pool.spec.block_size - pool_network(pool).prefixlen)


def block_cidrs(pool: IPPool, node: str) -> Iterator[IPv4Network]:
    """Every block CIDR of the pool, once each, starting at a node-seeded offset.

    Like Calico's randomBlockGenerator: a pseudo-random start, then a wrapping
    walk, so enumeration is O(1) to start even for very large pools.
    """
    network = pool_network(pool)
    size = pool.spec.block_size
    count = block_count(pool)
    step = 2 ** (32 - size)
    base = int(network.network_address)
    start = node_seed(node) % count
    for i in range(count):
        index = (start + i) % count
        yield IPv4Network((base + index * step, size))


def block_of(ip: IPv4Address, pool: IPPool) -> IPv4Network:
    """The block CIDR inside pool that holds ip."""
    return IPv4Network((int(ip), pool.spec.block_size), strict=False)
