"""RouteManager diff logic against a fake netlink (the real kernel is in integration)."""

from __future__ import annotations

import ipaddress
from typing import Any

from bgp.kernel import RouteManager
from bgp.routes import KernelRoute

A = ipaddress.IPv4Address
N = ipaddress.IPv4Network


class FakeRoute(dict):
    """A pyroute2-like route message: header fields by key, NLAs through get()."""


def msg(dst: str, proto: int, rtype: int = 1, **nla: Any) -> FakeRoute:
    net = N(dst)
    return FakeRoute(
        dst=str(net.network_address),
        dst_len=net.prefixlen,
        proto=proto,
        type=rtype,
        flags=nla.pop("flags", 0),
        table=nla.pop("table", 254),
        **nla,
    )


class FakeNetlink:
    def __init__(self, routes: list[FakeRoute]) -> None:
        self.routes = routes
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.closed = 0

    def route(self, command: str, **kwargs: Any) -> Any:
        if command == "dump":
            return list(self.routes)
        self.calls.append((command, kwargs))
        return None

    def neigh(self, command: str, **kwargs: Any) -> Any:
        return []

    def fdb(self, command: str, **kwargs: Any) -> Any:
        return []

    def get_links(self, *args: Any, **kwargs: Any) -> Any:
        return [{"index": 2, "ifname": "eth0"}, {"index": 5, "ifname": "tunl0"}]

    def close(self) -> None:
        self.closed += 1


def manager(routes: list[FakeRoute]) -> tuple[RouteManager, FakeNetlink]:
    fake = FakeNetlink(routes)
    return RouteManager(lambda: fake), fake


def test_adds_missing_removes_stale_and_leaves_other_protocols_alone() -> None:
    mgr, fake = manager(
        [
            msg("10.244.9.0/26", 81, gateway="10.0.0.9", oif=2),  # ours, no longer wanted
            msg("10.244.2.0/26", 81, gateway="10.0.0.2", oif=2),  # ours, already right
            msg("10.244.1.5/32", 80, oif=7),  # a pod route
            msg("10.0.0.0/24", 2, oif=2),  # kernel route
            msg("10.244.3.0/26", 81, gateway="10.0.0.3", table=100),  # another table
        ]
    )
    mgr.set_desired(
        [
            KernelRoute(N("10.244.2.0/26"), gateway=A("10.0.0.2")),
            KernelRoute(N("10.244.4.0/26"), gateway=A("10.0.1.4"), dev="tunl0", onlink=True),
            KernelRoute(N("10.244.1.0/26"), kind="blackhole", proto=99),  # proto forced to 81
        ]
    )
    result = mgr.apply()
    assert fake.calls == [
        ("del", {"dst": "10.244.9.0/26", "table": 254, "proto": 81, "type": 1,
                 "gateway": "10.0.0.9"}),
        ("replace", {"dst": "10.244.1.0/26", "table": 254, "proto": 81, "type": 6}),
        ("replace", {"dst": "10.244.4.0/26", "table": 254, "proto": 81, "type": 1,
                     "gateway": "10.0.1.4", "oif": 5, "flags": 4}),
    ]  # fmt: skip
    assert [str(r.dst) for r in result.removed] == ["10.244.9.0/26"]
    assert [str(r.dst) for r in result.added] == ["10.244.1.0/26", "10.244.4.0/26"]
    assert result.changed
    assert fake.closed == 1


def test_changed_route_is_replaced_and_conflicts_are_reported_not_touched() -> None:
    mgr, fake = manager(
        [
            msg("10.244.2.0/26", 81, gateway="10.0.0.2", oif=2),
            msg("10.244.5.0/26", 3, gateway="10.0.0.5", oif=2),  # someone else's route
        ]
    )
    mgr.set_desired(
        [
            KernelRoute(N("10.244.2.0/26"), gateway=A("10.0.0.2"), dev="tunl0", onlink=True),
            KernelRoute(N("10.244.5.0/26"), gateway=A("10.0.0.5")),
        ]
    )
    result = mgr.apply()
    assert [c[0] for c in fake.calls] == ["replace"]
    assert fake.calls[0][1]["oif"] == 5
    assert result.conflicts == [
        "10.244.5.0/26 via 10.0.0.5 proto 81: 10.244.5.0/26 already has a route of proto 3"
    ]


def test_steady_state_makes_no_calls_and_read_parses_kernel_routes() -> None:
    mgr, fake = manager(
        [
            msg("10.244.2.0/26", 81, gateway="10.0.0.2", oif=2),
            msg("10.244.4.0/26", 81, gateway="10.0.1.4", oif=5, flags=4),
            msg("10.244.1.0/26", 81, rtype=6),
        ]
    )
    current = mgr.read()
    assert [str(r) for r in current] == [
        "blackhole 10.244.1.0/26 proto 81",
        "10.244.2.0/26 via 10.0.0.2 proto 81",
        "10.244.4.0/26 via 10.0.1.4 dev tunl0 onlink proto 81",
    ]
    mgr.set_desired(current)
    result = mgr.apply()
    assert fake.calls == []
    assert not result.changed


def test_kernel_errors_are_collected() -> None:
    mgr, _ = manager([])
    mgr.set_desired([KernelRoute(N("10.244.4.0/26"), gateway=A("10.0.1.4"), dev="nope")])
    result = mgr.apply()
    assert result.added == []
    assert result.errors == ["add 10.244.4.0/26 via 10.0.1.4 dev nope proto 81: "
                             "device nope does not exist"]  # fmt: skip


def test_no_prune_keeps_unexplained_routes_but_still_adds() -> None:
    mgr, fake = manager([msg("10.244.9.0/26", 81, gateway="10.0.0.9", oif=2)])
    mgr.set_desired([KernelRoute(N("10.244.2.0/26"), gateway=A("10.0.0.2"))])
    result = mgr.apply(prune=False)
    assert [c[0] for c in fake.calls] == ["replace"]
    assert result.removed == []
    assert mgr.apply(prune=True).removed[0].dst == N("10.244.9.0/26")


def test_no_prune_still_deletes_what_this_run_wanted_before() -> None:
    """A withdraw (or a peer going down) before BGP synced must still leave the kernel."""
    mgr, fake = manager(
        [
            msg("10.244.9.0/26", 81, gateway="10.0.0.9", oif=2),  # left by a previous run
            msg("10.244.2.0/26", 81, gateway="10.0.0.2", oif=2),  # learned, then withdrawn
        ]
    )
    mgr.set_desired([KernelRoute(N("10.244.2.0/26"), gateway=A("10.0.0.2"))])
    assert mgr.apply(prune=False).removed == []
    mgr.set_desired([])
    result = mgr.apply(prune=False)
    assert [r.dst for r in result.removed] == [N("10.244.2.0/26")]
    assert [(c[0], c[1]["dst"]) for c in fake.calls] == [("del", "10.244.2.0/26")]
    assert mgr.explained == set()
