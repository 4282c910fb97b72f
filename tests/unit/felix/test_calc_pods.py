"""The pod resolver's incremental answer equals :func:`trusted_pod` for every pod.

Random Pod objects (with and without status addresses, terminating, finished,
hostNetwork, bound or not), random IPAM owners and random wired addresses change
one at a time; after each change every pod the resolver reports equals
:func:`policy.membership.trusted_pod` of its object now.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from felix.calc import PodKey
from felix.calc.pods import PodResolver
from policy import Pod, PolicyError
from policy.membership import AddressBook, LocalAddress, Owner, trusted_pod

KEYS = [("x", "a"), ("x", "b"), ("y", "a")]
IPS = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
NODES = ["", "n1", "n2"]
UIDS = ["", "u1", "u2"]


@st.composite
def raw_pods(draw: st.DrawFn, key: PodKey) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": key[0], "name": key[1], "uid": draw(st.sampled_from(UIDS))}
    if draw(st.integers(0, 4)) == 0:
        meta["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "c"}], "nodeName": draw(st.sampled_from(NODES))}
    spec["hostNetwork"] = draw(st.integers(0, 6)) == 0
    status: dict[str, Any] = {"phase": draw(st.sampled_from(["Pending", "Running", "Failed"]))}
    if draw(st.booleans()):
        ip = draw(st.sampled_from(IPS))
        status |= {"podIP": ip, "podIPs": [{"ip": ip}]}
    if draw(st.integers(0, 9)) == 0:
        status["phase"] = 7  # mistyped: the pod is invalid
    return {"metadata": meta, "spec": spec, "status": status}


@st.composite
def pod_change(draw: st.DrawFn) -> tuple[str, Any]:
    key = draw(st.sampled_from(KEYS))
    raw = None if draw(st.integers(0, 4)) == 0 else draw(raw_pods(key))
    return ("pod", (key, raw))


owners = st.builds(
    Owner,
    namespace=st.sampled_from(["x", "y"]),
    pod=st.sampled_from(["a", "b"]),
    node=st.sampled_from(NODES),
    uid=st.sampled_from(UIDS),
)
book_change = st.tuples(st.just("book"), st.dictionaries(st.sampled_from(IPS), owners, max_size=3))
wired_change = st.tuples(
    st.just("wired"),
    st.dictionaries(
        st.sampled_from(KEYS),
        st.builds(
            LocalAddress, st.sampled_from(IPS).map(ipaddress.ip_address), st.sampled_from(UIDS)
        ),
        max_size=2,
    ),
)
CHANGES = st.one_of(pod_change(), pod_change(), book_change, wired_change)


def expected(
    raws: dict[PodKey, Any], book: AddressBook, wired: dict[PodKey, LocalAddress]
) -> dict[PodKey, Pod]:
    out = {}
    for key, raw in raws.items():
        try:
            out[key] = trusted_pod(raw, book, wired.get(key))
        except PolicyError:
            continue
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CHANGES, min_size=1, max_size=30))
def test_incremental_pods_equal_trusted_pod_after_any_changes(changes: list[Any]) -> None:
    resolver = PodResolver()
    raws: dict[PodKey, Any] = {}
    book = AddressBook()
    wired: dict[PodKey, LocalAddress] = {}
    reported: dict[PodKey, Pod] = {}
    for kind, value in changes:
        if kind == "pod":
            key, raw = value
            if raw is None:
                raws.pop(key, None)
            else:
                raws[key] = raw
            resolver.update_pod(key, raw)
        elif kind == "book":
            book = AddressBook((ipaddress.ip_address(ip), o) for ip, o in value.items())
            resolver.update_book(book)
        else:
            wired = dict(value)
            resolver.update_wired(wired)
        for key, pod in resolver.take():
            if pod is None:
                reported.pop(key, None)
            else:
                reported[key] = pod
        assert reported == expected(raws, book, wired)
        assert dict(resolver.resolved()) == reported


def test_an_address_ipam_gives_away_leaves_the_stale_status_at_once() -> None:
    """The Pod object does not change; only the book does. The pod is re-derived."""
    resolver = PodResolver()
    stale = {
        "metadata": {"namespace": "x", "name": "old", "uid": "u1"},
        "spec": {"containers": [{"name": "c"}], "nodeName": "n1"},
        "status": {"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]},
    }
    resolver.update_pod(("x", "old"), stale)
    assert [str(ip) for _, pod in resolver.take() for ip in pod.ips] == ["10.0.0.5"]
    new_owner = Owner("x", "new", node="n1", uid="u2")
    resolver.update_book(AddressBook([(ipaddress.ip_address("10.0.0.5"), new_owner)]))
    changes = resolver.take()
    assert [(key, pod.ips if pod else None) for key, pod in changes] == [(("x", "old"), ())]


def test_an_invalid_pod_is_reported_and_left_out() -> None:
    seen: list[PolicyError] = []
    resolver = PodResolver(on_invalid=seen.append)
    bad = {"metadata": {"namespace": "x", "name": "p"}, "spec": {"nodeName": 5}}
    resolver.update_pod(("x", "p"), bad)
    assert resolver.take() == []
    assert len(seen) == 1
