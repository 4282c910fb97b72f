"""IPAM blocks as the agent reads them for policy membership (felix.pod_members)."""

from __future__ import annotations

import ipaddress
from typing import Any

from datastore.models import IPAMBlock, Meta
from felix.pod_members import IPAMOwners, block_owners, holds_address
from ipam.block import AllocationBlock
from ipam.pools import cidr_name
from policy.membership import Owner

CIDR = "10.244.1.0/26"


def _block(version: str, *allocations: tuple[str, dict[str, str]]) -> dict[str, Any]:
    block = AllocationBlock.new(CIDR, affinity="host:node1")
    for n, (ip, attrs) in enumerate(allocations):
        block.assign(ipaddress.IPv4Address(ip), f"k8s-pod-network.c{n}", attrs)
    wire = IPAMBlock(metadata=Meta(name=cidr_name(CIDR)), spec=block.to_spec()).to_wire()
    wire["metadata"]["resourceVersion"] = version
    return wire


def test_pod_allocations_name_their_owner_and_tunnel_addresses_own_nothing() -> None:
    raw = _block(
        "1",
        ("10.244.1.1", {"node": "node1", "namespace": "x", "pod": "a", "ifname": "eth0"}),
        ("10.244.1.2", {"node": "node1", "type": "vxlanTunnelAddress"}),
    )
    assert block_owners(raw) == [
        (ipaddress.IPv4Address("10.244.1.1"), Owner("x", "a", node="node1", ifname="eth0"))
    ]


def test_an_unreadable_block_is_reported_once_per_version_and_skipped() -> None:
    reported: list[int] = []
    owners = IPAMOwners(on_invalid=lambda: reported.append(1))
    good = _block("1", ("10.244.1.1", {"node": "node1", "namespace": "x", "pod": "a"}))
    bad = {**_block("7"), "metadata": {"name": "bad", "resourceVersion": "7"}}
    bad["spec"] = {**bad["spec"], "allocations": "0*99", "attributes": []}
    for _ in range(3):
        book = owners.book([good, bad])
        assert book.owner(ipaddress.IPv4Address("10.244.1.1")) == Owner("x", "a", node="node1")
    assert len(reported) == 1


def test_a_new_block_version_is_read_again_and_a_gone_block_forgotten() -> None:
    owners = IPAMOwners()
    ip = ipaddress.IPv4Address("10.244.1.1")
    first = _block("1", ("10.244.1.1", {"node": "node1", "namespace": "x", "pod": "a"}))
    assert owners.book([first]).owner(ip) == Owner("x", "a", node="node1")
    reused = _block("2", ("10.244.1.1", {"node": "node1", "namespace": "x", "pod": "b"}))
    assert owners.book([reused]).owner(ip) == Owner("x", "b", node="node1")
    assert owners.book([]).owner(ip) is None


def test_unchanged_blocks_give_the_same_book_without_a_rebuild() -> None:
    owners = IPAMOwners()
    block = _block("1", ("10.244.1.1", {"node": "node1", "namespace": "x", "pod": "a"}))
    first = owners.book([block])
    assert owners.book([block]) is first
    assert owners.book([_block("2")]) is not first


def _tunnel_block(version: str, *allocations: tuple[str, str]) -> dict[str, Any]:
    block = AllocationBlock.new(CIDR, affinity="host:node1")
    for ip, handle in allocations:
        block.assign(ipaddress.IPv4Address(ip), handle, {"node": "node1"})
    wire = IPAMBlock(metadata=Meta(name=cidr_name(CIDR)), spec=block.to_spec()).to_wire()
    wire["metadata"]["resourceVersion"] = version
    return wire


def test_a_tunnel_address_is_held_only_while_its_block_grants_it_to_the_tunnel_handle() -> None:
    """Issue 16: the GC released a deleted Node's tunnel address while its agent ran on;
    the agent's remembered address must then count as lost (a pod got it otherwise)."""
    tunnel = ipaddress.IPv4Address("10.244.1.0")
    handle = "vxlan-tunnel-addr-node1"
    assert holds_address([_tunnel_block("1", ("10.244.1.0", handle))], tunnel, handle)
    assert not holds_address([_tunnel_block("2")], tunnel, handle)  # released
    reused = _tunnel_block("3", ("10.244.1.0", "k8s-pod-network.c9"))
    assert not holds_address([reused], tunnel, handle)  # given to a pod since
    assert not holds_address([], tunnel, handle)  # the block itself is gone
