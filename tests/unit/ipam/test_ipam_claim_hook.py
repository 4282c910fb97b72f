"""IPAMAllocator's on_block_claimed hook: what the node agent announces over BGP at once."""

from __future__ import annotations

from ipaddress import IPv4Network

from conftest import add_pool

from datastore.client import Datastore
from datastore.models import IPAMBlock
from ipam.allocator import IPAMAllocator


def test_each_claimed_block_is_told_once_after_its_claim(ds: Datastore) -> None:
    add_pool(ds, "default", "10.244.0.0/16")
    claimed: list[IPv4Network] = []
    a = IPAMAllocator(ds, "n1", config_ttl=0, on_block_claimed=claimed.append)
    a.auto_assign("h1", {"pod": "p1"}, num=1)
    a.auto_assign("h2", {"pod": "p2"}, num=1)  # same block: no second claim
    assert claimed == [IPv4Network(b.spec.cidr) for b in ds.list(IPAMBlock)]
    a.auto_assign("h3", {"pod": "p3"}, num=64)  # spills into a second block
    assert len(claimed) == 2
    assert set(claimed) == {IPv4Network(b.spec.cidr) for b in ds.list(IPAMBlock)}


def test_a_failing_listener_does_not_fail_the_allocation(ds: Datastore) -> None:
    add_pool(ds, "default", "10.244.0.0/16")

    def broken(block: IPv4Network) -> None:
        raise RuntimeError("listener down")

    a = IPAMAllocator(ds, "n1", config_ttl=0, on_block_claimed=broken)
    (ip,) = a.auto_assign("h1", {"pod": "p1"}, num=1)
    assert a.addresses_of("h1") == [ip]
