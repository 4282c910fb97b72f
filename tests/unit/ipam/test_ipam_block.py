"""AllocationBlock: FIFO order, attributes, sequence numbers, invariants."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datastore.models import IPAMBlock, IPAMBlockSpec, Meta
from ipam.block import (
    AllocationBlock,
    Attribute,
    decode_allocations,
    decode_ordinals,
    encode_allocations,
    encode_ordinals,
    free_count,
    host_affinity,
    is_empty,
)
from ipam.errors import AddressInUse, AddressNotAllocated, BadSequenceNumber, BlockCorrupt

ip = IPv4Address
UNICODE = st.characters(blacklist_categories=("Cs",))  # what JSON strings carry


def test_new_block_is_empty_and_sound() -> None:
    block = AllocationBlock.new("10.0.0.0/29", host_affinity("n1"))
    assert (block.size, block.free_count, block.used_count) == (8, 8, 0)
    assert block.is_empty and block.host == "n1"
    block.verify()


def test_auto_assign_takes_fifo_head_with_one_attribute_per_call() -> None:
    block = AllocationBlock.new("10.0.0.0/29")
    got = block.auto_assign(3, "h1", {"pod": "a", "namespace": "ns"})
    assert got == [ip("10.0.0.0"), ip("10.0.0.1"), ip("10.0.0.2")]
    assert len(block.attributes) == 1  # one call's addresses share the entry
    more = block.auto_assign(1, "h1", {"namespace": "ns", "pod": "a"})
    assert more == [ip("10.0.0.3")]
    assert len(block.attributes) == 2  # a later call has its own sequence number
    assert [a.sequence_number for a in block.attributes] == [1, 2]
    block.auto_assign(1, "h2", None)
    assert len(block.attributes) == 3
    assert block.handle_counts() == {"h1": 4, "h2": 1}
    block.verify()


def test_auto_assign_partial_when_block_runs_out() -> None:
    block = AllocationBlock.new("10.0.0.0/30")
    assert len(block.auto_assign(10, "h", None)) == 4
    assert block.auto_assign(1, "h", None) == []
    assert block.free_count == 0


def test_released_ordinals_go_to_the_tail() -> None:
    block = AllocationBlock.new("10.0.0.0/30")
    first = block.auto_assign(2, "h1", None)
    block.release([first[0]])
    assert block.unallocated == [2, 3, 0]
    assert block.auto_assign(3, "h2", None) == [ip("10.0.0.2"), ip("10.0.0.3"), ip("10.0.0.0")]


def test_release_compacts_attributes_and_reports_handles() -> None:
    block = AllocationBlock.new("10.0.0.0/29")
    a = block.auto_assign(2, "a", None)
    block.auto_assign(2, "b", None)
    assert block.release(a) == {"a": 2}
    assert [x.handle_id for x in block.attributes] == ["b"]
    assert set(block.allocations) == {None, 0}
    block.verify()


def test_release_by_handle_is_idempotent() -> None:
    block = AllocationBlock.new("10.0.0.0/29")
    block.auto_assign(3, "a", None)
    seq = block.sequence_number
    assert block.release_handle("a") == {"a": 3}
    assert block.release_handle("a") == {}
    assert block.sequence_number == seq + 1
    assert block.is_empty


def test_assign_specific_ip() -> None:
    block = AllocationBlock.new("10.0.0.0/29")
    block.assign(ip("10.0.0.5"), "x", {"k": "v"})
    assert 5 not in block.unallocated
    allocation = block.allocation(ip("10.0.0.5"))
    assert allocation is not None and allocation.handle_id == "x"
    assert allocation.attrs == {"k": "v"}
    with pytest.raises(AddressInUse, match="handle x"):
        block.assign(ip("10.0.0.5"), "y", None)
    with pytest.raises(ValueError, match="not in block"):
        block.assign(ip("10.0.1.5"), "y", None)
    block.verify()


def test_release_refuses_unallocated_without_change() -> None:
    block = AllocationBlock.new("10.0.0.0/29")
    got = block.auto_assign(1, "a", None)
    before = block.to_spec()
    with pytest.raises(AddressNotAllocated):
        block.release([got[0], ip("10.0.0.7")])
    assert block.to_spec() == before


def test_sequence_numbers_stop_aba_release() -> None:
    block = AllocationBlock.new("10.0.0.0/30")
    (addr,) = block.auto_assign(1, "old", None)
    seen = block.allocation(addr)
    assert seen is not None and seen.sequence_number is not None
    block.release([addr])
    # the address comes back around to a new holder
    block.auto_assign(4, "new", None)
    with pytest.raises(BadSequenceNumber, match="reassigned"):
        block.release([addr], {addr: seen.sequence_number})
    current = block.allocation(addr)
    assert current is not None and current.handle_id == "new"
    block.release([addr], {addr: current.sequence_number})  # type: ignore[dict-item]
    assert block.allocation(addr) is None


def test_spec_round_trip_through_model() -> None:
    block = AllocationBlock.new("10.1.2.0/28", host_affinity("n"), "2026-01-01T00:00:00Z")
    block.auto_assign(3, "h", {"pod": "p"})
    block.release([ip("10.1.2.1")])
    wire = IPAMBlock(metadata=Meta(name="10-1-2-0-28"), spec=block.to_spec()).to_wire()
    again = AllocationBlock.from_spec(IPAMBlock.from_wire(wire).spec)
    assert again == block
    assert wire["spec"]["attributes"] == ["1 h?pod=p"]
    assert wire["spec"]["allocations"] == "0,-,0,-*13"
    assert wire["spec"]["unallocated"] == "3-15,1"
    assert "sequenceNumberForAllocation" not in wire["spec"]


def test_attribute_wire_string_escapes_what_it_must() -> None:
    odd = Attribute.of("net work/1?&x", {"pod": "a b&c=d", "ns": ""}, 7)
    assert odd.encode() == "7 net%20work%2F1%3F%26x?ns=&pod=a+b%26c%3Dd"
    assert Attribute.decode(odd.encode()) == odd
    assert Attribute.decode("3 ") == Attribute.of(None, None, 3)  # tunnel-style, no handle


@pytest.mark.parametrize("text", ["", "h?pod=p", "x h", "-1 h", "1 h?pod"])
def test_unreadable_attribute_is_reported_as_corrupt(text: str) -> None:
    spec = IPAMBlockSpec(cidr="10.0.0.0/31", allocations="0,-", unallocated="1", attributes=[text])
    with pytest.raises(BlockCorrupt, match=r"block 10\.0\.0\.0/31"):
        AllocationBlock.from_spec(spec)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.none(), st.text(UNICODE, min_size=1)),
    st.dictionaries(st.text(UNICODE, min_size=1), st.text(UNICODE)),
    st.integers(0, 2**62),
)
def test_attribute_wire_string_round_trips(
    handle: str | None, attrs: dict[str, str], seq: int
) -> None:
    attribute = Attribute.of(handle, attrs, seq)
    assert Attribute.decode(attribute.encode()) == attribute


def test_ordinal_lists_are_short_strings() -> None:
    assert encode_allocations([None] * 64) == "-*64"
    assert encode_allocations([0, 1, 1, None, 2]) == "0,1*2,-,2"
    assert encode_ordinals(range(64)) == "0-63"
    assert encode_ordinals([9, 3, 4, 5, 7]) == "9,3-5,7"  # FIFO order is kept
    assert encode_allocations([]) == encode_ordinals([]) == ""


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 70)), max_size=80))
def test_allocations_string_round_trips(allocations: list[int | None]) -> None:
    text = encode_allocations(allocations)
    assert list(decode_allocations(text, len(allocations))) == allocations


@settings(max_examples=300, deadline=None)
@given(st.permutations(range(64)).flatmap(lambda p: st.integers(0, 64).map(lambda n: p[:n])))
def test_unallocated_string_round_trips(ordinals: list[int]) -> None:
    assert list(decode_ordinals(encode_ordinals(ordinals), 64)) == ordinals


@pytest.mark.parametrize(
    ("allocations", "unallocated", "complaint"),
    [
        ("-", "0-1", "covers 1 addresses"),  # a /31 has two
        ("-*3", "0-1", "overruns 2"),
        ("0,-*9999999999", "1", "overruns"),  # refused before it is expanded
        ("-*0,-*2", "0-1", "empty"),
        ("x,-", "1", "attribute index"),
        ("0,-", "1-0", "outside"),
        ("0,-", "2", "outside"),
        ("0,-", "0-4294967295", "outside"),
        ("0,-", "1,", "ordinal"),
        ("0,-", "\u0661", "ordinal"),  # an Arabic-Indic digit: isdigit(), not ASCII
    ],
)
def test_unreadable_ordinal_lists_are_reported_as_corrupt(
    allocations: str, unallocated: str, complaint: str
) -> None:
    spec = IPAMBlockSpec(
        cidr="10.0.0.0/31", allocations=allocations, unallocated=unallocated, attributes=["1 h"]
    )
    with pytest.raises(BlockCorrupt, match=complaint):
        AllocationBlock.from_spec(spec)


def test_free_count_and_is_empty_read_the_stored_strings() -> None:
    block = AllocationBlock.new("10.0.0.0/28")
    assert is_empty(block.to_spec()) and free_count(block.to_spec()) == 16
    block.auto_assign(3, "h", None)
    assert free_count(block.to_spec()) == 13 and not is_empty(block.to_spec())
    corrupt = block.to_spec().model_copy(update={"unallocated": "99"})
    assert free_count(corrupt) == 0


def test_verify_reports_corruption() -> None:
    block = AllocationBlock.new("10.0.0.0/30")
    block.auto_assign(1, "h", None)
    block.unallocated.append(1)
    with pytest.raises(BlockCorrupt, match="twice"):
        block.verify()
    block = AllocationBlock.new("10.0.0.0/30")
    block.allocations[1] = 3
    problems = block.problems()
    assert any("missing attributes" in p for p in problems)
    assert any("disagrees" in p for p in problems)
    block = AllocationBlock.new("10.0.0.0/30")
    block.auto_assign(1, "h", None)
    block.sequence_number = 0  # an attribute stamped later than the block's own number
    assert any("past the block's" in p for p in block.problems())


def test_spec_from_wire_defaults() -> None:
    spec = IPAMBlockSpec(cidr="10.0.0.0/31", allocations="-*2", unallocated="1,0")
    block = AllocationBlock.from_spec(spec)
    assert block.auto_assign(1, "h", None) == [ip("10.0.0.1")]


# -- property tests ------------------------------------------------------------------
ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 5), st.sampled_from(["a", "b", "c"])),
        st.tuples(st.just("release"), st.integers(0, 31), st.just("")),
        st.tuples(st.just("release_handle"), st.just(0), st.sampled_from(["a", "b", "c"])),
        st.tuples(st.just("assign"), st.integers(0, 31), st.sampled_from(["a", "b", "c"])),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_random_sequences_keep_invariants(sequence: list[tuple[str, int, str]]) -> None:
    block = AllocationBlock.new("10.9.0.0/27")
    holders: dict[IPv4Address, str] = {}  # the model: who holds what
    last_seq = block.sequence_number
    for op, n, handle in sequence:
        if op == "alloc":
            got = block.auto_assign(n, handle, {"h": handle})
            assert not set(got) & set(holders), "an address was handed out twice"
            assert len(got) == min(n, 32 - len(holders))
            holders.update(dict.fromkeys(got, handle))
        elif op == "assign":
            addr = block.ip_of(n)
            if addr in holders:
                with pytest.raises(AddressInUse):
                    block.assign(addr, handle, None)
            else:
                block.assign(addr, handle, {"h": handle})
                holders[addr] = handle
        elif op == "release":
            addr = block.ip_of(n)
            if addr in holders:
                assert block.release([addr]) == {holders.pop(addr): 1}
            else:
                with pytest.raises(AddressNotAllocated):
                    block.release([addr])
        else:
            expected = sum(1 for h in holders.values() if h == handle)
            assert block.release_handle(handle).get(handle, 0) == expected
            holders = {a: h for a, h in holders.items() if h != handle}
        block.verify()
        assert AllocationBlock.from_spec(block.to_spec()) == block
        assert block.sequence_number >= last_seq
        last_seq = block.sequence_number
        assert block.used_count == len(holders)
        assert {a.ip: a.handle_id for a in block.iter_allocations()} == holders


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 4), max_size=30), st.randoms(use_true_random=False))
def test_fifo_reuses_longest_free_first(sizes: list[int], rnd: object) -> None:
    block = AllocationBlock.new(IPv4Network("10.9.0.0/28"))
    freed_order: list[IPv4Address] = []
    live: list[IPv4Address] = []
    for n in sizes:
        got = block.auto_assign(n, "h", None)
        for addr in got:
            if addr in freed_order:
                assert freed_order[0] == addr  # the oldest freed comes back first
                freed_order.pop(0)
        live.extend(got)
        if live:
            victim = live.pop(rnd.randrange(len(live)))  # type: ignore[attr-defined]
            block.release([victim])
            freed_order.append(victim)
    block.verify()
