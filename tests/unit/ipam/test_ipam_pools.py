"""Pool validation, selection, block enumeration and naming."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest
from conftest import make_pool
from hypothesis import given, settings
from hypothesis import strategies as st

from ipam.errors import InvalidPool, PoolNotFound
from ipam.pools import (
    affinity_name,
    block_cidrs,
    block_of,
    cidr_name,
    handle_name,
    pool_containing,
    select_pools,
    tunnel_handle_id,
    validate_pool,
    validate_pools,
)


def test_names_follow_calico() -> None:
    assert cidr_name("10.244.1.0/26") == "10-244-1-0-26"
    assert affinity_name("node-1", IPv4Network("10.244.1.0/26")) == "node-1-10-244-1-0-26"
    long = affinity_name("n" * 260, "10.0.0.0/26")
    assert len(long) <= 253 and long != affinity_name("n" * 261, "10.0.0.0/26")
    assert tunnel_handle_id("ipip", "n1") == "ipip-tunnel-addr-n1"
    with pytest.raises(ValueError, match="unknown tunnel kind"):
        tunnel_handle_id("gre", "n1")


def test_handle_names_are_valid_and_distinct() -> None:
    assert handle_name("k8s-pod-network.8c92f9") == "k8s-pod-network.8c92f9"
    odd = handle_name("Net/Work_1")
    assert odd.startswith("net-work-1-") and len(odd) == len("net-work-1-") + 11
    assert handle_name("Net/Work_1") != handle_name("net-work-1")
    assert len(handle_name("x" * 600)) <= 253


def test_validation_errors_name_the_problem() -> None:
    validate_pool(make_pool("ok", "10.0.0.0/16"))
    cases = [
        (make_pool("a", "10.0.0.1/16"), "cidr '10.0.0.1/16' is invalid"),
        (make_pool("a", "10.0.0.0/16", block_size=19), "blockSize 19 is outside 20-32"),
        (make_pool("a", "10.0.0.0/28", block_size=26), "smaller than one /26 block"),
        (make_pool("a", "169.254.0.0/20"), "overlaps link-local"),
        (make_pool("a", "10.0.0.0/16", ipip_mode="Always", vxlan_mode="Always"), "cannot both"),
        (make_pool("a", "10.0.0.0/16", node_selector="role =="), "nodeSelector"),
    ]
    for pool, message in cases:
        with pytest.raises(InvalidPool, match=message):
            validate_pool(pool)


def test_overlapping_pools_rejected() -> None:
    validate_pools([make_pool("a", "10.0.0.0/16"), make_pool("b", "10.1.0.0/16")])
    with pytest.raises(InvalidPool, match=r"pool b \(10.0.128.0/17\) overlaps pool a"):
        validate_pools([make_pool("a", "10.0.0.0/16"), make_pool("b", "10.0.128.0/17")])


def test_select_pools() -> None:
    pools = [
        make_pool("b-workers", "10.1.0.0/16", node_selector="role == 'worker'"),
        make_pool("a-all", "10.0.0.0/16"),
        make_pool("c-off", "10.2.0.0/16", disabled=True),
        make_pool("d-bad", "10.3.0.0/16", node_selector="((("),
    ]
    names = [p.name for p in select_pools(pools, {"role": "worker"})]
    assert names == ["a-all", "b-workers"]
    assert [p.name for p in select_pools(pools, {})] == ["a-all"]
    assert select_pools(pools, {}, ["c-off"]) == []
    with pytest.raises(PoolNotFound, match=r"unknown pool.*nope; known: a-all"):
        select_pools(pools, {}, ["nope"])


def test_pool_containing_and_block_of() -> None:
    pools = [make_pool("a", "10.0.0.0/16"), make_pool("b", "10.1.0.0/24", block_size=28)]
    assert pool_containing(IPv4Address("10.1.0.77"), pools) == pools[1]
    assert pool_containing(IPv4Network("10.0.3.0/26"), pools) == pools[0]
    assert pool_containing(IPv4Address("10.9.0.1"), pools) is None
    assert block_of(IPv4Address("10.1.0.77"), pools[1]) == IPv4Network("10.1.0.64/28")


@settings(max_examples=150, deadline=None)
@given(st.integers(20, 28), st.integers(0, 6), st.text(min_size=1, max_size=20))
def test_block_enumeration_covers_pool_once(prefix: int, extra: int, node: str) -> None:
    size = min(32, prefix + extra)
    pool = make_pool("p", f"10.0.0.0/{prefix}", block_size=size)
    blocks = list(block_cidrs(pool, node))
    network = IPv4Network(pool.spec.cidr)
    assert len(blocks) == len(set(blocks)) == 2 ** (size - prefix)
    assert all(b.subnet_of(network) and b.prefixlen == pool.spec.block_size for b in blocks)
    assert blocks == list(block_cidrs(pool, node))  # same node, same order


def test_nodes_start_at_different_blocks() -> None:
    pool = make_pool("p", "10.0.0.0/16")
    starts = {next(block_cidrs(pool, f"node-{i}")) for i in range(20)}
    assert len(starts) > 15
