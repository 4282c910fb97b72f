"""Announcements and the kernel form of learned routes (pure)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from bgp import annotations as ann
from bgp.messages import LearnedRoute
from bgp.nodes import parse_nodes
from bgp.routes import (
    PROTO_BGP,
    PROTO_POD,
    FdbEntry,
    KernelRoute,
    NeighEntry,
    RouteContext,
    announcements,
    best_routes,
    desired_dataplane,
    own_blocks,
    pool_for,
)
from datastore.models import BlockAffinity, IPPool

A = ipaddress.IPv4Address
N = ipaddress.IPv4Network


def affinity(cidr: str, node: str, state: str = "confirmed", deleted: bool = False) -> Any:
    return BlockAffinity.model_validate(
        {
            "metadata": {"name": f"{node}-{cidr.replace('/', '-')}"},
            "spec": {"cidr": cidr, "node": node, "state": state, "deleted": deleted},
        }
    )


def pool(cidr: str, ipip: str = "Never", vxlan: str = "Never") -> IPPool:
    return IPPool.model_validate(
        {"metadata": {"name": cidr}, "spec": {"cidr": cidr, "ipipMode": ipip, "vxlanMode": vxlan}}
    )


def node(name: str, address: str, **extra: str) -> dict:
    annotations = {ann.IPV4_ADDRESS: address, **{getattr(ann, k): v for k, v in extra.items()}}
    return {"metadata": {"name": name, "annotations": annotations}}


NODES = parse_nodes(
    [
        node("n1", "10.0.0.1/24"),
        node(
            "n2",
            "10.0.0.2/24",
            VXLAN_TUNNEL_ADDR="10.244.2.0",
            VXLAN_TUNNEL_MAC="66:AA:BB:CC:DD:02",
        ),
        node(
            "n3",
            "10.0.1.3/24",
            VXLAN_TUNNEL_ADDR="10.244.3.0",
            VXLAN_TUNNEL_MAC="66:aa:bb:cc:dd:03",
        ),
        node("n4", "10.0.1.4/24"),
    ]
)


def learned(prefix: str, next_hop: str, peer: str | None = None, **attrs: Any) -> LearnedRoute:
    return LearnedRoute(N(prefix), A(next_hop), A(peer or next_hop), **attrs)


def ctx(pools: list[IPPool], blocks: tuple[str, ...] = ("10.244.1.0/26",)) -> RouteContext:
    return RouteContext(
        me=NODES["n1"], own_blocks=frozenset(N(b) for b in blocks), pools=pools, nodes=NODES
    )


def test_protocol_numbers_are_distinct() -> None:
    assert (PROTO_POD, PROTO_BGP) == (80, 81)


def test_announce_confirmed_own_blocks_and_borrowed_addresses() -> None:
    affinities = [
        affinity("10.244.1.0/26", "n1"),
        affinity("10.244.1.64/26", "n1", state="pending"),
        affinity("10.244.1.128/26", "n1", deleted=True),
        affinity("10.244.2.0/26", "n2"),
    ]
    borrowed = [
        ("10.244.2.7", "n2"),  # from n2's block: needs a /32
        ("10.244.2.8/32", "n2"),
        ("10.244.1.5", "n1"),  # our own block
        ("10.244.1.6", None),  # owner unknown, but inside our block
        ("10.244.9.9", None),  # block without affinity
    ]
    assert own_blocks("n1", affinities) == {N("10.244.1.0/26")}
    assert sorted(announcements("n1", affinities, borrowed)) == [
        N("10.244.1.0/26"),
        N("10.244.2.7/32"),
        N("10.244.2.8/32"),
        N("10.244.9.9/32"),
    ]
    assert announcements("n3", affinities) == frozenset()


def test_same_subnet_without_encapsulation_routes_via_the_node() -> None:
    plane = desired_dataplane(ctx([pool("10.244.0.0/16")]), [learned("10.244.2.0/26", "10.0.0.2")])
    assert plane.routes == (
        KernelRoute(N("10.244.1.0/26"), kind="blackhole"),
        KernelRoute(N("10.244.2.0/26"), gateway=A("10.0.0.2")),
    )
    assert [str(r) for r in plane.routes] == [
        "blackhole 10.244.1.0/26 proto 81",
        "10.244.2.0/26 via 10.0.0.2 proto 81",
    ]
    assert (plane.neighs, plane.fdbs, plane.problems) == ((), (), ())


def test_ipip_always_uses_tunl0_onlink_even_on_the_same_subnet() -> None:
    plane = desired_dataplane(
        ctx([pool("10.244.0.0/16", ipip="Always")]), [learned("10.244.2.0/26", "10.0.0.2")]
    )
    assert str(plane.routes[1]) == "10.244.2.0/26 via 10.0.0.2 dev tunl0 onlink proto 81"


def test_ipip_cross_subnet_encapsulates_only_across_subnets() -> None:
    plane = desired_dataplane(
        ctx([pool("10.244.0.0/16", ipip="CrossSubnet")]),
        [learned("10.244.2.0/26", "10.0.0.2"), learned("10.244.4.0/26", "10.0.1.4")],
    )
    assert [str(r) for r in plane.routes[1:]] == [
        "10.244.2.0/26 via 10.0.0.2 proto 81",
        "10.244.4.0/26 via 10.0.1.4 dev tunl0 onlink proto 81",
    ]


def test_vxlan_always_adds_neighbour_and_fdb_entries() -> None:
    plane = desired_dataplane(
        ctx([pool("10.244.0.0/16", vxlan="Always")]), [learned("10.244.2.0/26", "10.0.0.2")]
    )
    assert str(plane.routes[1]) == "10.244.2.0/26 via 10.244.2.0 dev vxlan.tabby onlink proto 81"
    assert plane.neighs == (NeighEntry(A("10.244.2.0"), "66:aa:bb:cc:dd:02", "vxlan.tabby"),)
    assert plane.fdbs == (FdbEntry("66:aa:bb:cc:dd:02", A("10.0.0.2"), "vxlan.tabby"),)


def test_vxlan_cross_subnet_and_missing_annotations() -> None:
    plane = desired_dataplane(
        ctx([pool("10.244.0.0/16", vxlan="CrossSubnet")]),
        [
            learned("10.244.2.0/26", "10.0.0.2"),  # same subnet: plain
            learned("10.244.3.0/26", "10.0.1.3"),  # other subnet: VXLAN
            learned("10.244.4.0/26", "10.0.1.4"),  # other subnet, no VTEP facts
        ],
    )
    assert [str(r) for r in plane.routes[1:]] == [
        "10.244.2.0/26 via 10.0.0.2 proto 81",
        "10.244.3.0/26 via 10.244.3.0 dev vxlan.tabby onlink proto 81",
    ]
    assert [n.ip for n in plane.neighs] == [A("10.244.3.0")]
    assert [f.dst for f in plane.fdbs] == [A("10.0.1.3")]
    assert len(plane.problems) == 1
    assert plane.problems[0].startswith("10.244.4.0/26 via 10.0.1.4: VXLAN needs")


def test_routes_outside_pools_are_plain() -> None:
    plane = desired_dataplane(
        ctx([pool("10.244.0.0/16", ipip="Always")]), [learned("172.16.0.0/16", "10.0.0.254")]
    )
    assert str(plane.routes[1]) == "172.16.0.0/16 via 10.0.0.254 proto 81"


def test_own_block_echo_and_self_next_hop_are_ignored_but_borrowed_32_is_kept() -> None:
    plane = desired_dataplane(
        ctx([pool("10.244.0.0/16")]),
        [
            learned("10.244.1.0/26", "10.0.0.2"),  # our block, from someone else
            learned("10.244.5.0/26", "10.0.0.1", peer="10.0.0.2"),  # points at us
            learned("10.244.1.9/32", "10.0.0.2"),  # n2 borrowed from our block
        ],
    )
    assert [str(r) for r in plane.routes] == [
        "blackhole 10.244.1.0/26 proto 81",
        "10.244.1.9/32 via 10.0.0.2 proto 81",
    ]


def test_unreachable_can_replace_blackhole() -> None:
    context = RouteContext(
        me=NODES["n1"], own_blocks=frozenset({N("10.244.1.0/26")}), own_block_kind="unreachable"
    )
    assert str(desired_dataplane(context, []).routes[0]) == "unreachable 10.244.1.0/26 proto 81"


def test_best_route_prefers_local_pref_then_shorter_path_then_lower_peer() -> None:
    routes = [
        learned("10.244.9.0/26", "10.0.0.3", as_path=(65001, 65002)),
        learned("10.244.9.0/26", "10.0.0.4", as_path=(65001,)),
        learned("10.244.8.0/26", "10.0.0.3"),
        learned("10.244.8.0/26", "10.0.0.2"),
        learned("10.244.7.0/26", "10.0.0.2", local_pref=100),
        learned("10.244.7.0/26", "10.0.0.3", local_pref=200),
    ]
    best = best_routes(routes)
    assert best[N("10.244.9.0/26")].next_hop == A("10.0.0.4")
    assert best[N("10.244.8.0/26")].next_hop == A("10.0.0.2")
    assert best[N("10.244.7.0/26")].next_hop == A("10.0.0.3")


def test_pool_for_picks_the_most_specific_ipv4_pool() -> None:
    pools = [pool("fd00::/48"), pool("10.0.0.0/8", ipip="Always"), pool("10.244.0.0/16")]
    found = pool_for(N("10.244.2.0/26"), pools)
    assert found is not None
    assert found.spec.cidr == "10.244.0.0/16"
    assert pool_for(N("192.168.0.0/24"), pools) is None


@pytest.mark.parametrize("mode", ["Always", "CrossSubnet"])
def test_vxlan_wins_over_ipip_when_both_are_set(mode: str) -> None:
    plane = desired_dataplane(
        ctx([pool("10.244.0.0/16", ipip="Always", vxlan=mode)]),
        [learned("10.244.3.0/26", "10.0.1.3")],
    )
    assert plane.routes[1].dev == "vxlan.tabby"
