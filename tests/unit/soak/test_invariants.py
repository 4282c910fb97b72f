"""The soak's invariants over plain data and an in-memory IPAM."""

from __future__ import annotations

from datastore.client import Datastore
from datastore.memory import MemoryTransport
from ipam.allocator import IPAMAllocator
from ipam.report import Snapshot
from tests.soak.invariants import NETWORK, Endpoint, Tally, duplicates, leaks, unheld_addresses
from tests.unit.ipam.conftest import add_node, add_pod, add_pool


def _ipam() -> tuple[Datastore, IPAMAllocator]:
    ds = Datastore(MemoryTransport())
    add_pool(ds, "p", "10.0.0.0/24")
    add_node(ds, "n1")
    return ds, IPAMAllocator(ds, "n1", config_ttl=0)


def _pod(ds: Datastore, allocator: IPAMAllocator, name: str, container: str) -> str:
    add_pod(ds, "ns", name, "n1")
    attrs = {"namespace": "ns", "pod": name, "node": "n1"}
    (ip,) = allocator.auto_assign(f"{NETWORK}.{container}", attrs)
    return str(ip)


def test_an_address_held_by_two_owners_is_a_duplicate() -> None:
    found = duplicates(
        [
            Endpoint("pod ns/a", "10.0.0.1"),
            Endpoint("pod ns/b", "10.0.0.1"),
            Endpoint("tunnel n1", "10.0.0.2"),
            Endpoint("pod ns/c", "10.0.0.2"),
            Endpoint("pod ns/d", "10.0.0.3"),
            Endpoint("pod ns/d", "10.0.0.3"),  # one owner seen twice is not a duplicate
        ]
    )
    assert found == {"10.0.0.1": ["pod ns/a", "pod ns/b"], "10.0.0.2": ["pod ns/c", "tunnel n1"]}


def test_allocations_of_live_sandboxes_are_no_leak() -> None:
    ds, allocator = _ipam()
    _pod(ds, allocator, "a", "c1")
    _pod(ds, allocator, "b", "c2")
    assert leaks(Snapshot.load(ds), {"c1": "ns/a", "c2": "ns/b"}) == []


def test_an_address_kept_for_a_gone_sandbox_is_a_leak_even_if_its_pod_lives() -> None:
    ds, allocator = _ipam()
    ip = _pod(ds, allocator, "a", "c1")
    (found,) = leaks(Snapshot.load(ds), {"c9": "ns/a"})
    assert found.startswith(f"{ip}: held by sandbox c1 of ns/a"), found


def test_an_allocation_whose_pod_is_gone_is_a_leak_and_named_by_ipam_check() -> None:
    ds, allocator = _ipam()
    add_pod(ds, "ns", "placeholder")
    (ip,) = allocator.auto_assign(f"{NETWORK}.c1", {"namespace": "ns", "pod": "gone"})
    found = leaks(Snapshot.load(ds), {"c1": "ns/gone"})
    assert found == [f"{ip}: pod ns/gone does not exist"], found


def test_a_pod_address_ipam_does_not_hold_for_its_sandbox_is_reported() -> None:
    ds, allocator = _ipam()
    ip_a = _pod(ds, allocator, "a", "c1")
    ip_b = _pod(ds, allocator, "b", "c2")
    live = {"c1": "ns/a", "c2": "ns/b", "c3": "ns/c"}
    endpoints = [
        Endpoint("pod ns/a", ip_a),  # held by its own sandbox: fine
        Endpoint("pod ns/b", ip_a),  # b's sandbox shows a's address
        Endpoint("pod ns/c", "10.0.0.200"),  # nobody holds it: IPAM may hand it out
        Endpoint("tunnel n1", ip_b),  # judged by duplicates(), not here
    ]
    found = unheld_addresses(Snapshot.load(ds), endpoints, live)
    assert found == [
        f"{ip_a} of pod ns/b: allocated to c1",
        "10.0.0.200 of pod ns/c: not allocated",
    ]


def test_the_tally_counts_repeats_once_when_asked_and_ends_with_the_last_line() -> None:
    tally = Tally(seed=9)
    tally.found("leaks", ["10.0.0.1: x"], "#1", once=True)
    tally.found("leaks", ["10.0.0.1: x", "10.0.0.2: y"], "#2", once=True)
    tally.found("policy_violations", ["cell"], "#1")
    tally.found("policy_violations", ["cell"], "#2")  # a new incident each time
    assert (tally.leaks, tally.policy_violations, tally.clean) == (2, 2, False)
    assert tally.findings[1] == "#2: leaks: 10.0.0.2: y"
    assert Tally(seed=1).clean
    tally.minutes, tally.pods, tally.faults = 2.04, 30, 6
    assert tally.last_line() == (
        "soak minutes=2.0 pods=30 policies=0 faults=6 duplicates=0 leaks=2 "
        "policy_violations=2 flows_lost=0"
    )
