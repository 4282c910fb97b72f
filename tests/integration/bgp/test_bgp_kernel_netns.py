"""RouteManager and NeighManager against a real kernel, inside a `tbt-*` namespace."""

from __future__ import annotations

import ipaddress
import subprocess

import pytest

from bgp.kernel import NeighManager, RouteManager, iproute_factory
from bgp.routes import FdbEntry, KernelRoute, NeighEntry
from tests.integration.bgp.bgp_netns import Lab

pytestmark = pytest.mark.integration

A = ipaddress.IPv4Address
N = ipaddress.IPv4Network
MAC2 = "66:aa:bb:cc:dd:02"
MAC3 = "66:aa:bb:cc:dd:03"


def sh(ns: str, *args: str) -> str:
    return subprocess.run(
        ["ip", "-n", ns, *args], check=True, capture_output=True, text=True
    ).stdout


def test_routes_of_every_kind_and_foreign_routes_survive(lab: Lab) -> None:
    ns = lab.add_node("k", 1)
    sh(ns, "route", "add", "10.244.7.0/26", "via", "10.99.0.7", "proto", "80")
    mgr = RouteManager(iproute_factory(ns))
    mgr.set_desired(
        [
            KernelRoute(N("10.244.1.0/26"), kind="blackhole"),
            KernelRoute(N("10.244.1.64/26"), kind="unreachable"),
            KernelRoute(N("10.244.2.0/26"), gateway=A("10.99.0.2")),
            KernelRoute(N("10.244.3.0/26"), gateway=A("10.50.0.3"), dev="eth0", onlink=True),
            KernelRoute(N("10.244.7.0/26"), gateway=A("10.99.0.8")),  # conflicts with proto 80
        ]
    )
    result = mgr.apply()
    assert result.errors == []
    assert len(result.added) == 4
    assert result.conflicts == [
        "10.244.7.0/26 via 10.99.0.8 proto 81: 10.244.7.0/26 already has a route of proto 80"
    ]
    table = sh(ns, "route")
    for line in (
        "blackhole 10.244.1.0/26 proto 81",
        "unreachable 10.244.1.64/26 proto 81",
        "10.244.2.0/26 via 10.99.0.2 dev eth0 proto 81",
        "10.244.3.0/26 via 10.50.0.3 dev eth0 proto 81 onlink",
        "10.244.7.0/26 via 10.99.0.7 dev eth0 proto 80",
    ):
        assert line in table
    # steady state: nothing to do; read() round-trips what apply() wrote
    again = mgr.apply()
    assert not again.changed
    assert [r.dst for r in mgr.read()] == sorted(
        N(d) for d in ("10.244.1.0/26", "10.244.1.64/26", "10.244.2.0/26", "10.244.3.0/26")
    )
    # drift: a route changed behind our back is put back
    sh(ns, "route", "replace", "10.244.2.0/26", "via", "10.99.0.9", "proto", "81")
    assert [str(r.dst) for r in mgr.apply().added] == ["10.244.2.0/26"]
    assert "10.244.2.0/26 via 10.99.0.2 dev eth0 proto 81" in sh(ns, "route")
    # empty desired set: all ours gone, the proto 80 route stays
    mgr.set_desired([])
    assert len(mgr.apply().removed) == 4
    assert "proto 81" not in sh(ns, "route")
    assert "10.244.7.0/26 via 10.99.0.7 dev eth0 proto 80" in sh(ns, "route")


def test_vxlan_neighbour_and_fdb_entries(lab: Lab) -> None:
    ns = lab.add_node("v", 1)
    sh(ns, "link", "add", "vxlan.tabby", "type", "vxlan", "id", "4096", "dstport", "4789",
       "dev", "eth0")  # fmt: skip
    sh(ns, "link", "set", "vxlan.tabby", "up")
    sh(ns, "addr", "add", "10.244.1.0/32", "dev", "vxlan.tabby")
    netlink = iproute_factory(ns)
    neighs = NeighManager(netlink, "vxlan.tabby")
    errors = neighs.apply(
        [
            NeighEntry(A("10.244.2.0"), MAC2, "vxlan.tabby"),
            NeighEntry(A("10.244.3.0"), MAC3, "vxlan.tabby"),
        ],
        [
            FdbEntry(MAC2, A("10.99.0.2"), "vxlan.tabby"),
            FdbEntry(MAC3, A("10.99.0.3"), "vxlan.tabby"),
        ],
    )
    assert errors == []
    neigh = sh(ns, "neigh", "show", "dev", "vxlan.tabby")
    assert f"10.244.2.0 lladdr {MAC2} PERMANENT" in neigh
    assert f"10.244.3.0 lladdr {MAC3} PERMANENT" in neigh
    fdb = subprocess.run(
        ["ip", "netns", "exec", ns, "bridge", "fdb", "show", "dev", "vxlan.tabby"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert f"{MAC2} dst 10.99.0.2 self permanent" in fdb
    assert f"{MAC3} dst 10.99.0.3 self permanent" in fdb

    # the route through the device is accepted by the kernel (onlink via the VTEP address)
    routes = RouteManager(netlink)
    routes.set_desired(
        [KernelRoute(N("10.244.2.0/26"), gateway=A("10.244.2.0"), dev="vxlan.tabby", onlink=True)]
    )
    assert routes.apply().errors == []
    assert "10.244.2.0/26 via 10.244.2.0 dev vxlan.tabby proto 81 onlink" in sh(ns, "route")

    # node 3 leaves: its entries go, node 2's stay
    assert (
        neighs.apply(
            [NeighEntry(A("10.244.2.0"), MAC2, "vxlan.tabby")],
            [FdbEntry(MAC2, A("10.99.0.2"), "vxlan.tabby")],
        )
        == []
    )
    neigh = sh(ns, "neigh", "show", "dev", "vxlan.tabby")
    assert "10.244.3.0" not in neigh
    assert "10.244.2.0" in neigh
    fdb = subprocess.run(
        ["ip", "netns", "exec", ns, "bridge", "fdb", "show", "dev", "vxlan.tabby"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert MAC3 not in fdb
    assert MAC2 in fdb


def test_ipip_route_through_tunl0(lab: Lab) -> None:
    ns = lab.add_node("i", 1)
    probe = subprocess.run(
        ["ip", "-n", ns, "link", "add", "tbtipip", "type", "ipip", "remote", "10.99.0.2"],
        check=False, capture_output=True, text=True,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(
            "this kernel has no ipip module (tunl0 cannot exist); IPIP route decisions are "
            f"covered by unit tests: {probe.stderr.strip()}"
        )
    sh(ns, "link", "set", "tunl0", "up")
    mgr = RouteManager(iproute_factory(ns))
    mgr.set_desired(
        [KernelRoute(N("10.244.2.0/26"), gateway=A("10.99.0.2"), dev="tunl0", onlink=True)]
    )
    assert mgr.apply().errors == []
    assert "10.244.2.0/26 via 10.99.0.2 dev tunl0 proto 81 onlink" in sh(ns, "route")
