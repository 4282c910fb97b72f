"""IPAMAllocator against the in-memory apiserver: claims, borrowing, limits, repair."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest
from conftest import add_node, add_pool, set_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datastore.client import Datastore
from datastore.errors import Conflict, Unavailable
from datastore.memory import MemoryTransport
from datastore.models import BlockAffinity, BlockAffinitySpec, IPAMBlock, IPAMHandle, IPPool, Meta
from ipam import allocator as allocator_mod
from ipam.allocator import IPAMAllocator
from ipam.block import AllocationBlock, host_affinity
from ipam.errors import (
    AddressInUse,
    HandleNotFound,
    PoolExhausted,
    PoolNotFound,
)
from ipam.pools import affinity_name
from ipam.report import Snapshot, check


def alloc(ds: Datastore, node: str, **kw: Any) -> IPAMAllocator:
    return IPAMAllocator(ds, node, config_ttl=0, **kw)


def snapshot(transport: MemoryTransport) -> dict[Any, Any]:
    """Every stored object without resourceVersions (lists bump the global counter)."""
    return copy.deepcopy(transport._objects)


def blocks_of(ds: Datastore) -> dict[str, AllocationBlock]:
    return {b.spec.cidr: AllocationBlock.from_spec(b.spec) for b in ds.list(IPAMBlock)}


def all_allocated(ds: Datastore) -> list[IPv4Address]:
    return [a.ip for b in blocks_of(ds).values() for a in b.iter_allocations()]


def test_first_allocation_claims_a_block(ds: Datastore) -> None:
    add_pool(ds, "default", "10.244.0.0/16")
    a = alloc(ds, "n1")
    ips = a.auto_assign("k8s-pod-network.c1", {"namespace": "ns", "pod": "p1"}, num=3)
    assert len(set(ips)) == 3
    (block,) = ds.list(IPAMBlock)
    assert block.spec.affinity == "host:n1"
    assert all(ip in IPv4Network(block.spec.cidr) for ip in ips)
    (affinity,) = ds.list(BlockAffinity)
    assert affinity.spec.state == "confirmed"
    assert affinity.name == affinity_name("n1", block.spec.cidr)
    handle = ds.get(IPAMHandle, "k8s-pod-network.c1")
    assert handle.spec.block == {block.spec.cidr: 3}
    allocation = AllocationBlock.from_spec(block.spec).allocation(ips[0])
    assert allocation is not None
    assert allocation.attrs == {"namespace": "ns", "pod": "p1", "node": "n1"}
    assert a.affine_blocks() == [IPv4Network(block.spec.cidr)]


def test_allocation_spans_blocks(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24", block_size=28)
    a = alloc(ds, "n1")
    ips = a.auto_assign("h", None, num=20)
    assert len(set(ips)) == 20
    handle = ds.get(IPAMHandle, "h")
    assert sorted(handle.spec.block.values()) == [4, 16]
    assert len(a.affine_blocks()) == 2


def test_warm_allocation_costs_two_requests(ds: Datastore, transport: MemoryTransport) -> None:
    add_pool(ds, "p", "10.0.0.0/16")
    a = IPAMAllocator(ds, "n1", config_ttl=60)
    a.auto_assign("h0")
    before = transport.requests
    for i in range(10):
        a.auto_assign(f"h{i + 1}")
    assert transport.requests - before == 20  # POST handle + PUT block, no reads


def test_release_by_handle_is_idempotent(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    a = alloc(ds, "n1")
    ips = a.auto_assign("h", None, num=2)
    assert sorted(a.release_by_handle("h")) == sorted(ips)
    assert a.release_by_handle("h") == []
    assert ds.list(IPAMHandle) == []
    assert all_allocated(ds) == []
    with pytest.raises(HandleNotFound, match="'h'"):
        a.release_by_handle("h", missing_ok=False)
    # the empty affine block stays for reuse (GC decides later)
    assert len(ds.list(IPAMBlock)) == 1


def test_addresses_are_reused_longest_free_first(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/30", block_size=30)
    a = alloc(ds, "n1")
    first = a.auto_assign("a")[0]
    a.auto_assign("b", None, 3)
    a.release_by_handle("a")
    assert a.auto_assign("c") == [first]


def test_borrowing_from_another_nodes_block(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/26")
    alloc(ds, "n1").auto_assign("h1")
    (ip,) = alloc(ds, "n2").auto_assign("h2", {"pod": "x"})
    (block,) = blocks_of(ds).values()
    assert block.host == "n1"
    allocation = block.allocation(ip)
    assert allocation is not None and allocation.attrs["node"] == "n2"
    assert ds.list(BlockAffinity)[0].spec.node == "n1"  # n2 claimed nothing


def test_strict_affinity_forbids_borrowing_and_changes_nothing(
    ds: Datastore, transport: MemoryTransport
) -> None:
    add_pool(ds, "p", "10.0.0.0/26")
    set_config(ds, strict_affinity=True)
    alloc(ds, "n1").auto_assign("h1")
    before = snapshot(transport)
    with pytest.raises(PoolExhausted, match="strictAffinity forbids borrowing"):
        alloc(ds, "n2").auto_assign("h2")
    assert snapshot(transport) == before


def test_max_blocks_per_host(ds: Datastore, transport: MemoryTransport) -> None:
    add_pool(ds, "p", "10.0.0.0/24", block_size=28)
    set_config(ds, strict_affinity=True, max_blocks_per_host=2)
    a = alloc(ds, "n1")
    a.auto_assign("h", None, 32)
    before = snapshot(transport)
    with pytest.raises(PoolExhausted, match="maximum of 2 blocks"):
        a.auto_assign("h2")
    assert snapshot(transport) == before
    assert len(a.affine_blocks()) == 2


def test_partial_allocation_is_rolled_back(ds: Datastore, transport: MemoryTransport) -> None:
    add_pool(ds, "p", "10.0.0.0/27", block_size=28)
    a = alloc(ds, "n1")
    a.auto_assign("warm")
    a.release_by_handle("warm")
    with pytest.raises(PoolExhausted, match="for 40 address"):
        a.auto_assign("big", None, 40)
    assert all_allocated(ds) == []
    assert ds.list(IPAMHandle) == []


def test_disabled_pool_hands_out_nothing_new(ds: Datastore) -> None:
    pool = add_pool(ds, "p", "10.0.0.0/24")
    a = alloc(ds, "n1")
    ip = a.auto_assign("h1")[0]
    pool.spec.disabled = True
    ds.update(pool)
    with pytest.raises(PoolExhausted, match="disabled or its nodeSelector"):
        a.auto_assign("h2")
    with pytest.raises(PoolExhausted, match="disabled"):
        a.assign_ip("10.0.0.200", "h3")
    assert a.release_by_handle("h1") == [ip]


def test_new_pool_used_once_old_is_disabled(ds: Datastore) -> None:
    old = add_pool(ds, "old", "10.0.0.0/24")
    add_pool(ds, "new", "10.1.0.0/24")
    a = alloc(ds, "n1")
    assert a.auto_assign("h1", pools=["old"])[0] in IPv4Network("10.0.0.0/24")
    old.spec.disabled = True
    ds.update(old)
    assert a.auto_assign("h2")[0] in IPv4Network("10.1.0.0/24")
    with pytest.raises(PoolNotFound, match="unknown pool"):
        a.auto_assign("h3", pools=["missing"])


def test_deleted_pool_blocks_not_used(ds: Datastore) -> None:
    old = add_pool(ds, "old", "10.0.0.0/24")
    a = alloc(ds, "n1")
    a.auto_assign("h1")
    ds.delete(ds.get(IPPool, old.name))
    add_pool(ds, "new", "10.1.0.0/24")
    assert a.auto_assign("h2")[0] in IPv4Network("10.1.0.0/24")


def test_node_selector(ds: Datastore) -> None:
    add_pool(ds, "gpu", "10.0.0.0/24", node_selector="role == 'gpu'")
    add_pool(ds, "rest", "10.1.0.0/24", node_selector="!has(role)")
    add_node(ds, "g1", {"role": "gpu"})
    add_node(ds, "c1", {})
    assert alloc(ds, "g1").auto_assign("a")[0] in IPv4Network("10.0.0.0/24")
    assert alloc(ds, "c1").auto_assign("b")[0] in IPv4Network("10.1.0.0/24")
    fixed = alloc(ds, "x", node_labels={"role": "gpu"})
    assert fixed.auto_assign("c")[0] in IPv4Network("10.0.0.0/24")


def test_assign_ip(ds: Datastore, transport: MemoryTransport) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    a = alloc(ds, "n1")
    assert a.assign_ip("10.0.0.70", "h", {"pod": "p"}) == IPv4Address("10.0.0.70")
    block = ds.get(IPAMBlock, "10-0-0-64-26")
    assert block.spec.affinity == "host:n1"
    before = snapshot(transport)
    with pytest.raises(AddressInUse):
        alloc(ds, "n2").assign_ip("10.0.0.70", "other")
    with pytest.raises(PoolNotFound, match="not in any IP pool"):
        a.assign_ip("192.168.0.1", "other")
    assert snapshot(transport) == before
    # an address in another node's block is assigned there (borrowed)
    alloc(ds, "n2").assign_ip("10.0.0.71", "h2")
    assert ds.get(IPAMHandle, "h2").spec.block == {"10.0.0.64/26": 1}


def test_release_ips_reports_what_it_skipped(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    a = alloc(ds, "n1")
    x, y = a.auto_assign("h", None, 2)
    seq_y = next(al for b in blocks_of(ds).values() for al in b.iter_allocations() if al.ip == y)
    result = a.release_ips([x, IPv4Address("10.0.0.250"), y], {y: 999})
    assert result.released == [x]
    assert result.not_allocated == [IPv4Address("10.0.0.250")]
    assert result.stale == [y]
    assert ds.get(IPAMHandle, "h").spec.block == {str(IPv4Network((int(y), 26), strict=False)): 1}
    assert seq_y.sequence_number is not None
    assert a.release_ips([y], {y: seq_y.sequence_number}).released == [y]
    assert ds.list(IPAMHandle) == []


def test_unaffine_empty_block_is_deleted_on_release(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    block = AllocationBlock.new("10.0.0.0/26")
    address = IPv4Address("10.0.0.5")
    block.assign(address, "h", None)
    ds.create(IPAMBlock(metadata=Meta(name="10-0-0-0-26"), spec=block.to_spec()))
    assert alloc(ds, "n1").release_ips([address]).released == [address]
    assert ds.list(IPAMBlock) == []


def test_tunnel_address(ds: Datastore) -> None:
    add_pool(ds, "plain", "10.0.0.0/24")
    a = alloc(ds, "n1")
    with pytest.raises(PoolNotFound, match="ipipMode Always or CrossSubnet"):
        a.tunnel_address("ipip")
    add_pool(ds, "ipip", "10.1.0.0/24", ipip_mode="Always")
    ip = a.tunnel_address("ipip")
    assert ip in IPv4Network("10.1.0.0/24")
    assert a.tunnel_address("ipip") == ip
    assert alloc(ds, "n1").tunnel_address() == ip
    handle = ds.get(IPAMHandle, "ipip-tunnel-addr-n1")
    assert sum(handle.spec.block.values()) == 1
    block = blocks_of(ds)[next(iter(handle.spec.block))]
    allocation = block.allocation(ip)
    assert allocation is not None
    assert allocation.attrs == {"node": "n1", "type": "ipipTunnelAddress"}


def test_cas_conflict_is_retried(ds: Datastore, transport: MemoryTransport) -> None:
    add_pool(ds, "p", "10.0.0.0/26")  # one block: n2 must borrow from n1's
    a = alloc(ds, "n1")
    a.auto_assign("h0")
    alloc(ds, "n2").auto_assign("borrowed")  # n1's cached copy of its block is now stale
    writes: list[str] = []
    transport.fault_hook = lambda method, path: writes.append(method)
    ips = a.auto_assign("h1", None, 2)
    transport.fault_hook = None
    assert writes.count("PUT") == 2  # the stale write lost, the retry won
    held = all_allocated(ds)
    assert len(held) == len(set(held)) == 4
    assert set(ips) <= set(held)


def test_stale_cache_is_not_trusted_for_no_op_answers(ds: Datastore) -> None:
    """Found by hypothesis: a release read from a stale cached block found nothing."""
    add_pool(ds, "p", "10.0.0.0/29", block_size=29)
    owner = alloc(ds, "n1")
    (mine,) = owner.auto_assign("mine")
    borrowed = alloc(ds, "n2").auto_assign("theirs", None, 2)  # owner's cache is now stale
    assert sorted(owner.release_by_handle("theirs")) == sorted(borrowed)
    assert len(all_allocated(ds)) == 1
    # and an address the stale cache thinks is taken can still be assigned
    alloc(ds, "n2").release_by_handle("mine")
    assert owner.assign_ip(str(mine), "again") == mine


def test_errors_from_datastore_leave_nothing_half_done(
    ds: Datastore, transport: MemoryTransport
) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    a = alloc(ds, "n1")
    a.auto_assign("h0")

    def fail_block_put(method: str, path: str) -> None:
        if method == "PUT" and "/ipamblocks/" in path:
            raise Unavailable("apiserver down", 503)

    transport.fault_hook = fail_block_put
    with pytest.raises(Unavailable):
        a.auto_assign("h1")
    transport.fault_hook = None
    assert ds.try_get(IPAMHandle, "h1") is None  # the handle count was taken back
    assert len(all_allocated(ds)) == 1


# -- crash in the middle of a claim ------------------------------------------------------
class Crash(Exception):
    """Stands in for the process dying: no cleanup runs after it."""


def crash_on_write(transport: MemoryTransport, n: int) -> Callable[[str, str], None]:
    writes = [0]

    def hook(method: str, path: str) -> None:
        if method in ("POST", "PUT", "DELETE"):
            writes[0] += 1
            if writes[0] == n:
                raise Crash(f"write {n}: {method} {path}")

    return hook


def assert_sound(ds: Datastore, node: str) -> None:
    """After repair: every affinity of node confirmed with a block it owns, no duplicates."""
    affinities = [a for a in ds.list(BlockAffinity) if a.spec.node == node]
    blocks = {b.spec.cidr: b for b in ds.list(IPAMBlock)}
    for affinity in affinities:
        assert affinity.spec.state == "confirmed", affinity
        assert blocks[affinity.spec.cidr].spec.affinity == host_affinity(node)
    ips = all_allocated(ds)
    assert len(ips) == len(set(ips))
    for block in blocks.values():
        AllocationBlock.from_spec(block.spec).verify()


@pytest.mark.parametrize("nth_write", [1, 2, 3, 4, 5])
def test_crash_at_each_write_is_repaired(
    ds: Datastore, transport: MemoryTransport, nth_write: int
) -> None:
    """Writes of a first allocation: affinity, block, confirm, handle, block update."""
    add_pool(ds, "p", "10.0.0.0/24")
    transport.fault_hook = crash_on_write(transport, nth_write)
    with pytest.raises(Crash):
        alloc(ds, "n1").auto_assign("h1")
    transport.fault_hook = None
    fresh = alloc(ds, "n1")
    ip = fresh.auto_assign("h2")[0]
    assert_sound(ds, "n1")
    assert len(ds.list(IPAMBlock)) == 1  # the repaired block was reused, not a second one
    assert ip in IPv4Network(ds.list(IPAMBlock)[0].spec.cidr)


@pytest.mark.parametrize("step", allocator_mod.CLAIM_STEPS)
def test_crash_at_each_claim_step(
    ds: Datastore, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    add_pool(ds, "p", "10.0.0.0/24")

    def checkpoint(at: str) -> None:
        if at == step:
            raise Crash(at)

    monkeypatch.setattr(allocator_mod, "_checkpoint", checkpoint)
    with pytest.raises(Crash):
        alloc(ds, "n1").auto_assign("h1")
    states = {a.spec.state for a in ds.list(BlockAffinity)}
    assert states == ({"pending"} if step != "affinity-confirmed" else {"confirmed"})
    monkeypatch.setattr(allocator_mod, "_checkpoint", lambda at: None)
    alloc(ds, "n1").auto_assign("h2")
    assert_sound(ds, "n1")
    assert len(ds.list(IPAMBlock)) == 1


def test_pending_affinity_for_a_block_another_node_owns_is_dropped(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/26")
    alloc(ds, "n2").auto_assign("h")
    cidr = ds.list(IPAMBlock)[0].spec.cidr
    ds.create(
        BlockAffinity(
            metadata=Meta(name=affinity_name("n1", cidr)),
            spec=BlockAffinitySpec(cidr=cidr, node="n1", state="pending"),
        )
    )
    alloc(ds, "n1").auto_assign("h1")  # borrows; the stale claim is gone
    assert [a.spec.node for a in ds.list(BlockAffinity)] == ["n2"]


def test_pending_affinity_of_deleted_pool_is_dropped(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    ds.create(
        BlockAffinity(
            metadata=Meta(name=affinity_name("n1", "10.9.0.0/26")),
            spec=BlockAffinitySpec(cidr="10.9.0.0/26", node="n1", state="pending"),
        )
    )
    alloc(ds, "n1").auto_assign("h")
    assert [a.spec.cidr for a in ds.list(BlockAffinity)] == [ds.list(IPAMBlock)[0].spec.cidr]


def test_threads_never_share_an_address(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/25", block_size=28)
    got: dict[str, list[IPv4Address]] = {}
    errors: list[BaseException] = []

    def worker(node: str) -> None:
        a = alloc(ds, node)
        mine = got.setdefault(node, [])
        try:
            for i in range(30):
                mine += a.auto_assign(f"{node}-{i}")
                if i % 3 == 0:
                    a.release_by_handle(f"{node}-{i}")
                    mine.pop()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"n{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    held = [ip for ips in got.values() for ip in ips]
    assert len(held) == len(set(held)) == 4 * 20
    assert sorted(held) == sorted(all_allocated(ds))
    for block in blocks_of(ds).values():
        block.verify()
    handles = {h.spec.handle_id: sum(h.spec.block.values()) for h in ds.list(IPAMHandle)}
    assert sum(handles.values()) == 80


def test_conflict_storm_gives_up_cleanly(ds: Datastore, transport: MemoryTransport) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    a = alloc(ds, "n1", retries=3)
    a.auto_assign("h0")

    def always_conflict(method: str, path: str) -> None:
        if method == "PUT" and "/ipamblocks/" in path:
            raise Conflict("changed", 409, "Conflict")

    transport.fault_hook = always_conflict
    with pytest.raises(allocator_mod.ConcurrencyExhausted, match="retry later"):
        a.auto_assign("h1")
    transport.fault_hook = None
    assert ds.try_get(IPAMHandle, "h1") is None


# -- random operation sequences across nodes ------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["alloc", "release"]),
            st.integers(0, 2),
            st.integers(1, 6),
        ),
        max_size=25,
    ),
    st.booleans(),
)
def test_random_operations_keep_the_datastore_consistent(
    ops: list[tuple[str, int, int]], strict: bool
) -> None:
    ds = Datastore(MemoryTransport())
    add_pool(ds, "p", "10.0.0.0/27", block_size=29)  # 4 blocks of 8
    set_config(ds, strict_affinity=strict)
    allocators = [alloc(ds, f"n{i}") for i in range(3)]
    held: dict[str, list[IPv4Address]] = {}
    for number, (op, who, n) in enumerate(ops):
        a = allocators[who]
        if op == "alloc":
            before = sorted(all_allocated(ds))
            try:
                held[f"h{number}"] = a.auto_assign(f"h{number}", None, n)
            except PoolExhausted:
                assert sorted(all_allocated(ds)) == before  # nothing changed
        elif held:
            victim = sorted(held)[n % len(held)]
            assert sorted(a.release_by_handle(victim)) == sorted(held.pop(victim))
        live = [ip for ips in held.values() for ip in ips]
        assert sorted(live) == sorted(all_allocated(ds))
        assert check(Snapshot.load(ds, with_k8s=False)).problems == []
        if strict:
            for block in blocks_of(ds).values():
                assert all(al.attrs["node"] == block.host for al in block.iter_allocations())


def test_tunnel_address_moves_when_its_pool_stops_asking_for_it(ds: Datastore) -> None:
    first = add_pool(ds, "a", "10.0.0.0/24", ipip_mode="Always")
    a = alloc(ds, "n1")
    old = a.tunnel_address("ipip")
    assert old in IPv4Network("10.0.0.0/24")
    add_pool(ds, "b", "10.1.0.0/24", ipip_mode="CrossSubnet")
    first.spec.ipip_mode = "Never"
    ds.update(first)
    new = a.tunnel_address("ipip")
    assert new in IPv4Network("10.1.0.0/24")
    assert a.addresses_of("ipip-tunnel-addr-n1") == [new]
    assert old not in all_allocated(ds)


def test_node_handles_lists_only_this_nodes_allocations(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/26")
    n1, n2 = alloc(ds, "n1"), alloc(ds, "n2")
    n1.auto_assign("k8s-pod-network.a")
    n2.auto_assign("k8s-pod-network.b")  # borrowed from n1's block
    assert n1.node_handles() == {"k8s-pod-network.a"}
    assert n2.node_handles() == {"k8s-pod-network.b"}
