"""Pure allocation logic for one IPAM block (the IPAMBlock spec shape, no I/O).

The block follows Calico's: `allocations[ordinal]` is None (free) or an index into
`attributes`; `unallocated` is a FIFO of free ordinals (allocate from the head,
freed ordinals go to the tail so the longest-free address is reused first);
`sequence_number` is bumped on every change and each attribute remembers the number
at its allocation, so a release carrying an old number (a GC pass that looked before
the address was reassigned) is refused instead of freeing someone else's address.

Unlike Calico, the sequence number lives in the attribute (one entry per allocation
call, not a map per ordinal), and the wire form is strings, not JSON arrays and
objects: each attribute is `<sequence> <handle>?<attr>=<value>&...`, `allocations`
is a run-length list like `0,1*2,-*61` (`-` free) and `unallocated` a list of
ordinals and ascending runs like `3,7-63`. kube-apiserver's cost of a write grows
with the number of JSON values, not bytes: a full /26 with Calico's nested shape
took 32 ms at p99 per PUT here, as strings under half of that, and the apiserver's
CPU per PUT fell by a further sixth to a quarter when the two lists became strings
(docs/benchmarks.md).

The allocator reads a block, calls these methods on the copy, and writes it back
with compare-and-swap; a lost race simply discards the copy.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from urllib.parse import parse_qsl, quote, unquote, urlencode

from datastore.models import IPAMBlock, IPAMBlockSpec
from ipam.errors import AddressInUse, AddressNotAllocated, BadSequenceNumber, BlockCorrupt
from ipam.pools import parse_network

HOST_AFFINITY_PREFIX = "host:"


@dataclass(frozen=True)
class Attribute:
    """Who holds an allocation: the handle (for release), free-form owner attrs, and
    the block's sequence number when it was allocated."""

    handle_id: str | None
    secondary: tuple[tuple[str, str], ...] = ()
    sequence_number: int = 0

    @classmethod
    def of(
        cls, handle_id: str | None, attrs: Mapping[str, str] | None, sequence_number: int = 0
    ) -> Attribute:
        return cls(handle_id, tuple(sorted((attrs or {}).items())), sequence_number)

    @property
    def attrs(self) -> dict[str, str]:
        return dict(self.secondary)

    def encode(self) -> str:
        """The wire string: `<seq> <handle>?<attrs>` (handle and attrs percent-encoded)."""
        return self._wire

    @functools.cached_property
    def _wire(self) -> str:  # a block is re-encoded on every write: once per entry
        text = f"{self.sequence_number} {quote(self.handle_id or '', safe='')}"
        return f"{text}?{urlencode(self.secondary)}" if self.secondary else text

    @staticmethod
    def decode(text: str) -> Attribute:
        """Parse encode()'s string; ValueError names what is wrong with it."""
        return _decode_attribute(text)


@functools.lru_cache(maxsize=16384)  # a block is re-read on every write: parse each once
def _decode_attribute(text: str) -> Attribute:
    seq, space, rest = text.partition(" ")
    if not space or not seq.isdigit():
        raise ValueError(f"attribute {text[:80]!r} does not start with '<sequence> '")
    handle, _, query = rest.partition("?")
    secondary = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    return Attribute.of(unquote(handle) or None, dict(secondary), int(seq))


# -- the two ordinal lists as strings ---------------------------------------------------
FREE = "-"


def encode_allocations(allocations: Iterable[int | None]) -> str:
    """`allocations` as runs: `0,1*2,-*61` (an attribute index or `-` for free, `*n` repeats)."""
    items: list[str] = []
    for value, run in itertools.groupby(allocations):
        text = FREE if value is None else str(value)
        count = sum(1 for _ in run)
        items.append(f"{text}*{count}" if count > 1 else text)
    return ",".join(items)


# A node re-reads its own blocks (at most maxBlocksPerHost) on every write; the bound
# keeps a cache of /20 blocks (20 kB strings) near 15 MB.
@functools.lru_cache(maxsize=256)
def decode_allocations(text: str, size: int) -> tuple[int | None, ...]:
    """Parse encode_allocations(); ValueError unless it is well formed and `size` long."""
    out: list[int | None] = []
    for item in text.split(",") if text else ():
        value, star, count = item.partition("*")
        repeat = _natural(count, "run length", item) if star else 1
        if repeat < 1 or len(out) + repeat > size:
            raise ValueError(f"allocations run {item!r} is empty or overruns {size} addresses")
        out += [None if value == FREE else _natural(value, "attribute index", item)] * repeat
    if len(out) != size:
        raise ValueError(f"allocations covers {len(out)} addresses, the block has {size}")
    return tuple(out)


def encode_ordinals(ordinals: Iterable[int]) -> str:
    """`unallocated` in its order, ascending runs written `a-b`: `3,7-63`."""
    runs: list[list[int]] = []
    for ordinal in ordinals:
        if runs and ordinal == runs[-1][1] + 1:
            runs[-1][1] = ordinal
        else:
            runs.append([ordinal, ordinal])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


@functools.lru_cache(maxsize=256)
def decode_ordinals(text: str, size: int) -> tuple[int, ...]:
    """Parse encode_ordinals(); ValueError if malformed or an ordinal is outside the block."""
    out: list[int] = []
    for item in text.split(",") if text else ():
        first, dash, last = item.partition("-")
        low = _natural(first, "ordinal", item)
        high = _natural(last, "ordinal", item) if dash else low
        if not low <= high < size or len(out) + high - low + 1 > size:
            raise ValueError(f"unallocated item {item!r} is outside the {size} addresses")
        out += range(low, high + 1)
    return tuple(out)


@functools.lru_cache(maxsize=256)
def shape_problems(
    allocations: str, unallocated: str, size: int, attributes: int
) -> tuple[str, ...]:
    """What makes a stored block unsafe to read or allocate from, beyond parsing.

    An allocation pointing past `attributes` cannot be read (IndexError), and a free
    list that disagrees with `allocations` would hand out an address someone holds:
    such a block is refused as a whole (reported, skipped) rather than half used.
    ValueError if a string does not parse. Cached: a block is re-read on every write.
    """
    owners = decode_allocations(allocations, size)
    free_list = decode_ordinals(unallocated, size)
    out: list[str] = []
    missing = sorted({i for i in owners if i is not None and i >= attributes})
    if missing:
        out.append(f"allocations point at missing attributes {missing[:8]} (has {attributes})")
    free_set = set(free_list)
    if len(free_set) != len(free_list):
        out.append("unallocated lists an ordinal twice")
    free = {o for o, i in enumerate(owners) if i is None}
    if free_set != free:
        out.append(f"unallocated {sorted(free_set ^ free)[:8]} disagrees with allocations")
    return tuple(out)


def _natural(text: str, what: str, item: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"{what} in {item!r} is not a number")
    return int(text)


@dataclass(frozen=True)
class Allocation:
    """One allocated address as seen in a block."""

    ip: IPv4Address
    ordinal: int
    handle_id: str | None
    attrs: dict[str, str]
    sequence_number: int | None


@dataclass
class AllocationBlock:
    """A mutable working copy of one IPAMBlock spec."""

    cidr: IPv4Network
    affinity: str | None = None
    affinity_claim_time: str | None = None
    allocations: list[int | None] = field(default_factory=list)
    unallocated: list[int] = field(default_factory=list)
    attributes: list[Attribute] = field(default_factory=list)
    sequence_number: int = 0
    deleted: bool = False

    # -- construction and wire form -------------------------------------------------
    @classmethod
    def new(
        cls, cidr: IPv4Network | str, affinity: str | None = None, claim_time: str | None = None
    ) -> AllocationBlock:
        """An empty block: every ordinal free, in address order."""
        network = IPv4Network(cidr)
        size = network.num_addresses
        return cls(
            cidr=network,
            affinity=affinity,
            affinity_claim_time=claim_time,
            allocations=[None] * size,
            unallocated=list(range(size)),
        )

    @classmethod
    def from_spec(cls, spec: IPAMBlockSpec) -> AllocationBlock:
        """The working copy of a stored block; BlockCorrupt if its strings are unreadable."""
        try:
            cidr = parse_network(spec.cidr)
            attributes = [Attribute.decode(text) for text in spec.attributes]
            allocations = decode_allocations(spec.allocations, cidr.num_addresses)
            unallocated = decode_ordinals(spec.unallocated, cidr.num_addresses)
            unsafe = shape_problems(
                spec.allocations, spec.unallocated, cidr.num_addresses, len(attributes)
            )
        except ValueError as exc:
            raise BlockCorrupt(f"block {spec.cidr}: {exc}") from exc
        if unsafe:
            raise BlockCorrupt(f"block {spec.cidr}: " + "; ".join(unsafe))
        return cls(
            cidr=cidr,
            affinity=spec.affinity,
            affinity_claim_time=spec.affinity_claim_time,
            allocations=list(allocations),
            unallocated=list(unallocated),
            attributes=attributes,
            sequence_number=spec.sequence_number,
            deleted=spec.deleted,
        )

    def to_spec(self) -> IPAMBlockSpec:
        return IPAMBlockSpec(
            cidr=str(self.cidr),
            affinity=self.affinity,
            affinity_claim_time=self.affinity_claim_time,
            allocations=encode_allocations(self.allocations),
            unallocated=encode_ordinals(self.unallocated),
            attributes=[a.encode() for a in self.attributes],
            sequence_number=self.sequence_number,
            deleted=self.deleted,
        )

    # -- read-only views ------------------------------------------------------------
    @property
    def size(self) -> int:
        return self.cidr.num_addresses

    @property
    def free_count(self) -> int:
        return len(self.unallocated)

    @property
    def used_count(self) -> int:
        return self.size - len(self.unallocated)

    @property
    def is_empty(self) -> bool:
        return not self.used_count

    @property
    def host(self) -> str | None:
        """The node this block is affine to, or None (not affine / virtual)."""
        if self.affinity and self.affinity.startswith(HOST_AFFINITY_PREFIX):
            return self.affinity[len(HOST_AFFINITY_PREFIX) :]
        return None

    def contains(self, ip: IPv4Address) -> bool:
        return ip in self.cidr

    def ordinal_of(self, ip: IPv4Address) -> int:
        if ip not in self.cidr:
            raise ValueError(f"{ip} is not in block {self.cidr}")
        return int(ip) - int(self.cidr.network_address)

    def ip_of(self, ordinal: int) -> IPv4Address:
        return self.cidr.network_address + ordinal

    def allocation(self, ip: IPv4Address) -> Allocation | None:
        """The allocation of ip, or None when it is free."""
        ordinal = self.ordinal_of(ip)
        index = self.allocations[ordinal]
        if index is None:
            return None
        attribute = self.attributes[index]
        return Allocation(
            ip, ordinal, attribute.handle_id, attribute.attrs, attribute.sequence_number
        )

    def iter_allocations(self) -> Iterator[Allocation]:
        for ordinal, index in enumerate(self.allocations):
            if index is not None:
                attribute = self.attributes[index]
                yield Allocation(
                    self.ip_of(ordinal),
                    ordinal,
                    attribute.handle_id,
                    attribute.attrs,
                    attribute.sequence_number,
                )

    def handle_counts(self) -> dict[str, int]:
        """How many addresses each handle holds in this block."""
        counts: dict[str, int] = {}
        for alloc in self.iter_allocations():
            if alloc.handle_id:
                counts[alloc.handle_id] = counts.get(alloc.handle_id, 0) + 1
        return counts

    # -- changes ----------------------------------------------------------------------
    def auto_assign(
        self, num: int, handle_id: str | None, attrs: Mapping[str, str] | None = None
    ) -> list[IPv4Address]:
        """Take up to num addresses from the FIFO head; fewer if the block runs out."""
        if num < 0:
            raise ValueError("num must be >= 0")
        count = min(num, len(self.unallocated))
        if count == 0:
            return []
        ordinals, self.unallocated = self.unallocated[:count], self.unallocated[count:]
        self._mark(ordinals, handle_id, attrs)
        return [self.ip_of(o) for o in ordinals]

    def assign(
        self, ip: IPv4Address, handle_id: str | None, attrs: Mapping[str, str] | None = None
    ) -> None:
        """Allocate one specific address; AddressInUse if it is taken."""
        ordinal = self.ordinal_of(ip)
        if self.allocations[ordinal] is not None:
            holder = self.attributes[self.allocations[ordinal]].handle_id  # type: ignore[index]
            raise AddressInUse(f"{ip} is already allocated (handle {holder})")
        self.unallocated.remove(ordinal)
        self._mark([ordinal], handle_id, attrs)

    def release(
        self, ips: Iterable[IPv4Address], sequence_numbers: Mapping[IPv4Address, int] | None = None
    ) -> dict[str | None, int]:
        """Free the addresses; return how many each handle lost.

        Raises AddressNotAllocated / BadSequenceNumber before changing anything, so a
        refused release leaves the block as it was.
        """
        ordinals = []
        for ip in dict.fromkeys(ips):
            ordinal = self.ordinal_of(ip)
            if self.allocations[ordinal] is None:
                raise AddressNotAllocated(f"{ip} is not allocated in block {self.cidr}")
            expected = (sequence_numbers or {}).get(ip)
            actual = self._sequence_of(ordinal)
            if expected is not None and expected != actual:
                raise BadSequenceNumber(
                    f"{ip}: sequence number {expected} does not match {actual}; "
                    "it was reassigned since it was inspected"
                )
            ordinals.append(ordinal)
        return self._free(ordinals)

    def release_handle(self, handle_id: str) -> dict[str | None, int]:
        """Free every address held by handle_id in this block (none: no change)."""
        ordinals = [a.ordinal for a in self.iter_allocations() if a.handle_id == handle_id]
        return self._free(ordinals)

    def _sequence_of(self, ordinal: int) -> int | None:
        index = self.allocations[ordinal]
        if index is None or not 0 <= index < len(self.attributes):
            return None
        return self.attributes[index].sequence_number

    def _mark(
        self, ordinals: list[int], handle_id: str | None, attrs: Mapping[str, str] | None
    ) -> None:
        """One attribute entry per call, stamped with the bumped sequence number."""
        self.sequence_number += 1
        self.attributes.append(Attribute.of(handle_id, attrs, self.sequence_number))
        for ordinal in ordinals:
            self.allocations[ordinal] = len(self.attributes) - 1

    def _free(self, ordinals: list[int]) -> dict[str | None, int]:
        if not ordinals:
            return {}
        released: dict[str | None, int] = {}
        for ordinal in ordinals:
            index = self.allocations[ordinal]
            assert index is not None
            handle = self.attributes[index].handle_id
            released[handle] = released.get(handle, 0) + 1
            self.allocations[ordinal] = None
            self.unallocated.append(ordinal)
        self.sequence_number += 1
        self._compact_attributes()
        return released

    def _compact_attributes(self) -> None:
        """Drop attribute entries no allocation refers to, renumbering the rest."""
        used = sorted({i for i in self.allocations if i is not None})
        if len(used) == len(self.attributes):
            return
        remap = {old: new for new, old in enumerate(used)}
        self.attributes = [self.attributes[i] for i in used]
        self.allocations = [None if i is None else remap[i] for i in self.allocations]

    # -- invariants -------------------------------------------------------------------
    def problems(self) -> list[str]:
        """Every broken invariant, described; empty when the block is sound."""
        out: list[str] = []
        if len(self.allocations) != self.size:
            out.append(f"allocations has {len(self.allocations)} entries, block size {self.size}")
        if len(set(self.unallocated)) != len(self.unallocated):
            out.append("unallocated lists an ordinal twice")
        free = {o for o, i in enumerate(self.allocations) if i is None}
        if set(self.unallocated) != free:
            out.append(
                f"unallocated {sorted(set(self.unallocated) ^ free)[:8]} disagrees with allocations"
            )
        bad_index = [
            i for i in self.allocations if i is not None and not 0 <= i < len(self.attributes)
        ]
        if bad_index:
            out.append(f"allocations point at missing attributes {sorted(set(bad_index))[:8]}")
        referenced = {i for i in self.allocations if i is not None}
        if referenced != set(range(len(self.attributes))) and not bad_index:
            out.append("attributes holds entries no allocation uses")
        ahead = [
            a.sequence_number for a in self.attributes if a.sequence_number > self.sequence_number
        ]
        if ahead:
            out.append(f"attributes carry sequence numbers {sorted(ahead)[:8]} past the block's")
        return out

    def verify(self) -> None:
        """Raise BlockCorrupt listing every broken invariant."""
        problems = self.problems()
        if problems:
            raise BlockCorrupt(f"block {self.cidr}: " + "; ".join(problems))


@dataclass(frozen=True)
class Decoded:
    """Stored blocks split into working copies and the corrupt ones (name, why)."""

    good: list[tuple[IPAMBlock, AllocationBlock]]
    corrupt: list[tuple[IPAMBlock, str]]


def decode_blocks(models: Iterable[IPAMBlock]) -> Decoded:
    """Working copies of every readable block; a corrupt one is set aside with its reason,
    so one bad object costs its own addresses, not every reader's whole pass."""
    good: list[tuple[IPAMBlock, AllocationBlock]] = []
    corrupt: list[tuple[IPAMBlock, str]] = []
    for model in models:
        try:
            good.append((model, AllocationBlock.from_spec(model.spec)))
        except BlockCorrupt as exc:
            corrupt.append((model, str(exc)))
    return Decoded(good, corrupt)


def free_count(spec: IPAMBlockSpec) -> int:
    """Free addresses in a stored block without a working copy; 0 if unreadable or unsafe
    (so the allocator passes a corrupt block by instead of failing on it)."""
    try:
        size = parse_network(spec.cidr).num_addresses
        if shape_problems(spec.allocations, spec.unallocated, size, len(spec.attributes)):
            return 0
        return len(decode_ordinals(spec.unallocated, size))
    except ValueError:
        return 0  # from_spec names the corruption when something does read it


def is_empty(spec: IPAMBlockSpec) -> bool:
    return free_count(spec) == parse_network(spec.cidr).num_addresses


def host_affinity(node: str) -> str:
    return f"{HOST_AFFINITY_PREFIX}{node}"
