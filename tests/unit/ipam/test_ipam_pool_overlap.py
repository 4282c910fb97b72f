"""Overlapping and reserved pools (issue 21, item 5), on the in-memory datastore.

The scenario itself, against the real apiserver and its admission, is in
tests/integration/ipam/test_pool_overlap.py; these pin the rule it relies on.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest
from conftest import add_pool, make_pool

from datastore.client import Datastore
from datastore.models import IPAMBlock, IPPool, Meta
from ipam.allocator import IPAMAllocator
from ipam.block import AllocationBlock
from ipam.errors import InvalidPool
from ipam.pools import cidr_name, refused_pools, select_pools, validate_pool
from ipam.report import Snapshot, check


def aged(pool: IPPool, stamp: str) -> IPPool:
    pool.metadata.creation_timestamp = stamp
    return pool


@pytest.mark.parametrize(
    ("cidr", "block_size", "message"),
    [
        ("127.0.0.0/8", 26, "loopback"),
        ("127.5.0.0/16", 26, "loopback"),
        ("224.0.0.0/24", 26, "multicast"),
        ("255.255.255.255/32", 32, "broadcast"),
        ("0.0.0.0/8", 20, "this-network"),
        ("169.254.0.0/16", 26, "link-local"),
        ("8.0.0.0/6", 26, "shorter than /8"),
    ],
)
def test_reserved_ranges_are_invalid(cidr: str, block_size: int, message: str) -> None:
    with pytest.raises(InvalidPool, match=message):
        validate_pool(make_pool("p", cidr, block_size))


def test_the_older_of_two_overlapping_pools_is_kept() -> None:
    older = aged(make_pool("zz-old", "10.0.0.0/16"), "2026-01-01T00:00:00Z")
    newer = aged(make_pool("aa-new", "10.0.4.0/24", 28), "2026-02-01T00:00:00Z")
    apart = aged(make_pool("apart", "10.1.0.0/16"), "2026-03-01T00:00:00Z")
    refused = refused_pools([newer, apart, older])
    assert list(refused) == ["aa-new"]
    assert "overlaps pool zz-old (10.0.0.0/16), which is older" in refused["aa-new"]
    assert "delete aa-new" in refused["aa-new"]
    assert [p.name for p in select_pools([older, newer, apart], {})] == ["apart", "zz-old"]


def test_a_disabled_older_pool_still_counts_and_ties_go_by_name() -> None:
    same = "2026-01-01T00:00:00Z"
    pools = [
        aged(make_pool("b", "10.0.0.0/16"), same),
        aged(make_pool("a", "10.0.0.0/16", disabled=True), same),
    ]
    refused = refused_pools(pools)
    assert list(refused) == ["b"] and "(10.0.0.0/16, disabled)" in refused["b"]


def test_invalid_pools_are_refused_and_do_not_shadow_valid_ones() -> None:
    bad = aged(make_pool("lo", "127.0.0.0/8"), "2026-01-01T00:00:00Z")
    refused = refused_pools([bad, make_pool("ok", "10.0.0.0/16")])
    assert list(refused) == ["lo"] and "loopback" in refused["lo"]


def test_allocator_refuses_the_newer_pool_with_a_clear_error(ds: Datastore) -> None:
    add_pool(ds, "a", "10.9.0.0/25", 26, node_selector="zone == 'a'")
    add_pool(ds, "b", "10.9.0.0/24", 28, node_selector="zone == 'b'")
    one = IPAMAllocator(ds, "n1", node_labels={"zone": "a"})
    two = IPAMAllocator(ds, "n2", node_labels={"zone": "b"})
    got = [one.auto_assign(f"h1-{i}")[0] for i in range(70)]
    with pytest.raises(InvalidPool) as err:
        two.auto_assign("h2-0")
    assert "node n2 may not use any IP pool: pool b (10.9.0.0/24) overlaps pool a" in str(err)
    assert len(set(got)) == 70
    with pytest.raises(InvalidPool, match="overlaps pool a"):
        two.assign_ip("10.9.0.200", "h2-static")  # in b only


def test_a_claim_skips_cidrs_that_overlap_a_block_of_another_size(ds: Datastore) -> None:
    """A /28 left by a deleted pool of another block size rules out the /26 around it."""
    add_pool(ds, "p", "10.9.0.0/25", 26)
    stray = IPv4Network("10.9.0.16/28")
    block = AllocationBlock.new(stray, "host:gone", "2026-01-01T00:00:00Z")
    block.assign(IPv4Address("10.9.0.17"), "old", {})
    ds.create(IPAMBlock(metadata=Meta(name=cidr_name(stray)), spec=block.to_spec()))
    alloc = IPAMAllocator(ds, "n1", node_labels={})
    got = alloc.auto_assign("h", num=64)
    assert IPv4Address("10.9.0.17") not in got
    assert alloc.affine_blocks() == [IPv4Network("10.9.0.64/26")]
    assert alloc.assign_ip("10.9.0.18", "h-static") == IPv4Address("10.9.0.18")
    held = AllocationBlock.from_spec(ds.get(IPAMBlock, cidr_name(stray)).spec)
    assert {a.ip for a in held.iter_allocations()} == {
        IPv4Address("10.9.0.17"),
        IPv4Address("10.9.0.18"),
    }


def test_ipam_check_reports_refused_pools_and_overlapping_blocks(ds: Datastore) -> None:
    add_pool(ds, "a", "10.9.0.0/24", 26)
    add_pool(ds, "b", "10.9.0.0/25", 28)
    for cidr in ("10.9.0.0/26", "10.9.0.16/28", "10.9.0.128/26"):
        block = AllocationBlock.new(IPv4Network(cidr), "host:n1", "2026-01-01T00:00:00Z")
        ds.create(IPAMBlock(metadata=Meta(name=cidr_name(cidr)), spec=block.to_spec()))
    problems = check(Snapshot.load(ds, with_k8s=False)).problems
    found = [(p.kind, p.message) for p in problems if "refused" in p.kind or "overlap" in p.kind]
    assert [kind for kind, _ in found] == ["refused-pool", "overlapping-blocks"]
    assert "pool b (10.9.0.0/25) overlaps pool a (10.9.0.0/24)" in found[0][1]
    assert "blocks 10.9.0.0/26 and 10.9.0.16/28 overlap" in found[1][1]
