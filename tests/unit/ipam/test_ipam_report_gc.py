"""Usage, borrowed, check and GC decisions over the in-memory datastore."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest
from conftest import add_node, add_pod, add_pool

from datastore import kinds
from datastore.client import Datastore
from datastore.memory import MemoryTransport
from datastore.models import (
    AffinityState,
    BlockAffinity,
    BlockAffinitySpec,
    IPAMBlock,
    IPAMHandle,
    IPPool,
    Meta,
)
from ipam.allocator import CLAIM_TIME_ANNOTATION, IPAMAllocator
from ipam.block import AllocationBlock
from ipam.gc import GCState, IPAMGarbageCollector, plan
from ipam.pools import affinity_name, cidr_name
from ipam.report import (
    Snapshot,
    borrowed,
    check,
    pool_usage,
    read_report_leaks,
    write_report,
)


def alloc(ds: Datastore, node: str) -> IPAMAllocator:
    return IPAMAllocator(ds, node, config_ttl=0)


def kinds_of(ds: Datastore) -> list[str]:
    return sorted(p.kind for p in check(Snapshot.load(ds)).problems)


def test_usage_and_borrowed(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/26")
    add_pool(ds, "q", "10.1.0.0/24", disabled=True)
    alloc(ds, "n1").auto_assign("h1", {"namespace": "ns", "pod": "a"})
    (ip,) = alloc(ds, "n2").auto_assign("h2", {"namespace": "ns", "pod": "b"})
    p, q = pool_usage(Snapshot.load(ds))
    assert (p.name, p.total, p.in_use, p.free) == ("p", 64, 2, 62)
    assert [(b.cidr, b.owner, b.in_use, b.free) for b in p.blocks] == [("10.0.0.0/26", "n1", 2, 62)]
    assert (q.total, q.in_use, q.disabled, q.blocks) == (256, 0, True, [])
    (entry,) = borrowed(Snapshot.load(ds))
    assert entry.ip == str(ip)
    assert (entry.borrowing_node, entry.block_owner) == ("n2", "n1")
    assert (entry.type, entry.allocated_to) == ("pod", "ns/b")


def test_check_clean_state_has_no_problems(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    add_node(ds, "n1")
    add_pod(ds, "ns", "a")
    a = alloc(ds, "n1")
    a.auto_assign("h1", {"namespace": "ns", "pod": "a"}, 2)
    report = check(Snapshot.load(ds))
    assert report.problems == [] and report.leaks == []
    assert report.allocations == 2 and report.problem_count == 0


def test_check_finds_each_kind_of_problem(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24", ipip_mode="Always")
    add_node(ds, "n1")
    a = alloc(ds, "n1")
    a.auto_assign("h1", {"namespace": "ns", "pod": "gone"})  # pod missing -> leak
    ghost = alloc(ds, "ghost")
    tunnel = ghost.tunnel_address("ipip")  # node "ghost" does not exist -> leak
    # a handle counting wrong, and one with nothing behind it
    handle = ds.get(IPAMHandle, "h1")
    handle.spec.block = {next(iter(handle.spec.block)): 5}
    ds.update(handle)
    a.auto_assign("h2")
    ds.delete(ds.get(IPAMHandle, "h2"))
    # an affinity without block, and a stale pending one
    old = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    claims: list[tuple[str, AffinityState]] = [
        ("10.0.0.192/26", "confirmed"),
        ("10.0.0.128/26", "pending"),
    ]
    for cidr, state in claims:
        ds.create(
            BlockAffinity(
                metadata=Meta(
                    name=f"n9-{cidr}".replace("/", "-"), annotations={CLAIM_TIME_ANNOTATION: old}
                ),
                spec=BlockAffinitySpec(cidr=cidr, node="n9", state=state),
            )
        )
    # an orphan block (its pool is gone) holding an allocation without a handle id
    orphan = AllocationBlock.new("10.9.0.0/26")
    orphan.assign(IPv4Address("10.9.0.1"), None, {})
    ds.create(IPAMBlock(metadata=Meta(name="10-9-0-0-26"), spec=orphan.to_spec()))
    report = check(Snapshot.load(ds))
    kinds = sorted(p.kind for p in report.problems)
    assert kinds == [
        "affinity-without-block",
        "allocation-without-handle",
        "handle-mismatch",
        "missing-handle",
        "orphan-block",
        "stale-pending-affinity",
    ]
    reasons = {leak.ip: leak.reason for leak in report.leaks}
    assert "pod ns/gone does not exist" in reasons.values()
    assert reasons[str(tunnel)] == "tunnel address of node ghost, which does not exist"
    assert all(leak.sequence_number is not None for leak in report.leaks)
    assert report.problem_count == 8


def test_report_file_round_trip(ds: Datastore, tmp_path: Path) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    add_node(ds, "n1")
    alloc(ds, "n1").auto_assign("h1", {"namespace": "ns", "pod": "gone"})
    report = check(Snapshot.load(ds))
    path = tmp_path / "r.json"
    write_report(report, str(path))
    assert json.loads(path.read_text())["version"] == 1
    assert read_report_leaks(str(path)) == report.leaks
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="not JSON"):
        read_report_leaks(str(bad))
    bad.write_text('{"version": 7}')
    with pytest.raises(ValueError, match="not a version 1 report"):
        read_report_leaks(str(bad))
    with pytest.raises(ValueError, match="cannot read report"):
        read_report_leaks(str(tmp_path / "missing.json"))


# -- GC ----------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_empty_blocks_released_after_grace_keeping_one(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/26", block_size=28)
    add_node(ds, "n1")
    a = alloc(ds, "n1")
    a.auto_assign("h", None, 40)  # three blocks
    a.release_by_handle("h")
    clock = Clock()
    gc = IPAMGarbageCollector(ds, grace=60, clock=clock)
    assert gc.run_once().released_blocks == []
    clock.now += 59
    assert gc.run_once().released_blocks == []
    clock.now += 1
    result = gc.run_once()
    assert len(result.released_blocks) == 2
    (kept,) = ds.list(IPAMBlock)
    (affinity,) = ds.list(BlockAffinity)
    assert affinity.spec.cidr == kept.spec.cidr and affinity.spec.state == "confirmed"
    assert Snapshot.load(ds) and kinds_of(ds) == []
    # the allocator copes with its blocks disappearing
    assert a.auto_assign("again", None, 20)


def test_block_used_again_restarts_grace(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/27", block_size=28)
    add_node(ds, "n1")
    a = alloc(ds, "n1")
    a.auto_assign("h", None, 20)
    a.release_by_handle("h")
    clock = Clock()
    gc = IPAMGarbageCollector(ds, grace=60, clock=clock)
    gc.run_once()
    clock.now += 30
    a.auto_assign("x", None, 20)
    gc.run_once()
    a.release_by_handle("x")
    clock.now += 40
    assert gc.run_once().released_blocks == []  # seen empty only 0s ago


def test_block_used_during_release_is_kept(ds: Datastore, transport: MemoryTransport) -> None:
    """A block written between the GC's re-read and its delete keeps its affinity."""
    add_pool(ds, "p", "10.0.0.0/27", block_size=28)
    add_node(ds, "n1")
    a = alloc(ds, "n1")
    a.auto_assign("h", None, 20)
    a.release_by_handle("h")
    work = plan(Snapshot.load(ds), GCState(), 0.0, 0.0)
    (target,) = work.release_blocks
    gc = IPAMGarbageCollector(ds, grace=0)
    # used after the plan was made: the re-read sees it in use
    b = alloc(ds, "n1")
    b.affine_blocks()
    ip = b.assign_ip(str(next(IPv4Network(target).hosts())), "late")
    assert gc._release_affine_block(target) is False
    b.release_by_handle("late")

    # written between the re-read and the delete: the delete precondition fails
    def write_first(method: str, path: str) -> None:
        if method == "DELETE" and "/ipamblocks/" in path:
            transport.fault_hook = None
            ds.update(ds.get(IPAMBlock, cidr_name(target)))

    transport.fault_hook = write_first
    assert gc._release_affine_block(target) is False
    affinities = {x.spec.cidr: x.spec.state for x in ds.list(BlockAffinity)}
    assert affinities[target] == "confirmed"
    assert ip in IPv4Network(target)
    assert kinds_of(ds) == []


def test_deleted_node_is_cleaned_up(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    add_node(ds, "n2")
    add_pod(ds, "ns", "alive")
    gone = alloc(ds, "n1")
    gone.auto_assign("dead-pod", {"namespace": "ns", "pod": "dead"})
    gone.auto_assign("live-pod", {"namespace": "ns", "pod": "alive"})
    alloc(ds, "n2").auto_assign("n2-pod", {"namespace": "ns", "pod": "alive"})
    result = IPAMGarbageCollector(ds, grace=3600).run_once()
    assert result.cleaned_nodes == ["n1"]
    assert len(result.released_ips) == 1  # no grace for a deleted node's leaks
    assert {a.spec.node for a in ds.list(BlockAffinity)} == {"n2"}
    owners = sorted(str(b.spec.affinity) for b in ds.list(IPAMBlock))
    assert owners == ["None", "host:n2"]  # n1's block still holds a live pod: unaffine
    assert kinds_of(ds) == []


def test_leaks_released_after_grace_whole_handles_only(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    add_node(ds, "n1")
    a = alloc(ds, "n1")
    a.auto_assign("leaky", {"namespace": "ns", "pod": "gone"}, 2)
    a.auto_assign("mixed", {"namespace": "ns", "pod": "gone"})
    a.assign_ip("10.0.0.200", "mixed", {})  # no attrs: assumed in use
    clock = Clock()
    gc = IPAMGarbageCollector(ds, grace=100, clock=clock)
    assert gc.run_once().released_ips == []
    clock.now += 100
    result = gc.run_once()
    assert len(result.released_ips) == 2
    assert result.leak_candidates == 3
    assert {h.spec.handle_id for h in ds.list(IPAMHandle)} == {"mixed"}


def test_a_pod_created_again_under_its_name_does_not_keep_the_earlier_address(
    ds: Datastore,
) -> None:
    """Issue 20 (Calico's StatefulSet leak): web-0 ran on n1, n1 died before its DEL,
    web-0 was created again (a new uid) and runs on n2. The address n1's sandbox held
    names the same pod name, but not the pod that exists: it is a leak, GC releases it
    after its grace, and the live web-0's address is kept."""
    add_pool(ds, "p", "10.0.0.0/24")
    add_node(ds, "n1")  # NotReady, not deleted yet: its leaks wait for the grace period
    add_node(ds, "n2")
    old_attrs = {"namespace": "ns", "pod": "web-0", "uid": "uid-1"}
    (old_ip,) = alloc(ds, "n1").auto_assign("k8s-pod-network.sandbox1", old_attrs)
    add_pod(ds, "ns", "web-0")  # the apiserver gives it a uid of its own
    uid = ds.get_raw(kinds.POD, "web-0", "ns")["metadata"]["uid"]
    assert uid and uid != "uid-1"
    new_attrs = {"namespace": "ns", "pod": "web-0", "uid": uid}
    (new_ip,) = alloc(ds, "n2").auto_assign("k8s-pod-network.sandbox2", new_attrs)
    # an allocation without a uid (written before uids were recorded) keeps its pod's
    (legacy_ip,) = alloc(ds, "n2").auto_assign("legacy", {"namespace": "ns", "pod": "web-0"})

    (leak,) = check(Snapshot.load(ds)).leaks
    assert (leak.ip, leak.handle) == (str(old_ip), "k8s-pod-network.sandbox1")
    assert f"created again (uid {uid})" in leak.reason and "uid-1" in leak.reason
    clock = Clock()
    gc = IPAMGarbageCollector(ds, grace=60, clock=clock)
    assert gc.run_once().released_ips == []
    clock.now += 60
    assert [str(ip) for ip in gc.run_once().released_ips] == [str(old_ip)]
    handles = {h.spec.handle_id for h in ds.list(IPAMHandle)}
    assert handles == {"k8s-pod-network.sandbox2", "legacy"}
    assert alloc(ds, "n2").addresses_of("k8s-pod-network.sandbox2") == [new_ip]
    assert alloc(ds, "n2").addresses_of("legacy") == [legacy_ip]


def test_gc_release_is_aba_safe(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/30", block_size=30)
    add_node(ds, "n1")
    a = alloc(ds, "n1")
    (ip,) = a.auto_assign("old", {"namespace": "ns", "pod": "gone"})
    leaks = check(Snapshot.load(ds)).leaks
    a.release_by_handle("old")
    a.auto_assign("filler", None, 3)
    assert a.auto_assign("new", {"namespace": "ns", "pod": "gone"}) == [ip]
    gc = IPAMGarbageCollector(ds, grace=0)
    assert gc._release_leaks(leaks) == []
    assert a.addresses_of("new") == [ip]


def test_unaffine_and_orphan_empty_blocks_deleted(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    add_node(ds, "n1")
    for cidr, affinity in (("10.0.0.0/26", None), ("10.9.0.0/26", "host:n1")):
        block = AllocationBlock.new(cidr, affinity)
        name = cidr.replace(".", "-").replace("/", "-")
        ds.create(IPAMBlock(metadata=Meta(name=name), spec=block.to_spec()))
    result = IPAMGarbageCollector(ds, grace=0).run_once()
    assert sorted(result.deleted_blocks) == ["10.0.0.0/26", "10.9.0.0/26"]
    assert ds.list(IPAMBlock) == []


def test_no_node_list_means_no_node_conclusions(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    alloc(ds, "n1").auto_assign("h")
    snapshot = Snapshot.load(ds)
    assert snapshot.nodes == set()
    assert plan(snapshot, GCState(), 0.0, 0.0).gone_nodes == []
    assert ds.list(IPPool)


def test_check_reports_block_without_affinity(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    alloc(ds, "n1").auto_assign("h")
    ds.delete(ds.list(BlockAffinity)[0])
    assert kinds_of(ds) == ["block-without-affinity"]


def test_gc_keeps_an_affinity_the_node_reclaimed(ds: Datastore, transport: MemoryTransport) -> None:
    """GC marks pendingDeletion; if the node confirms again meanwhile, the affinity stays."""
    add_pool(ds, "p", "10.0.0.0/27", block_size=28)
    add_node(ds, "n1")
    a = alloc(ds, "n1")
    a.auto_assign("h", None, 20)
    a.release_by_handle("h")
    (target,) = plan(Snapshot.load(ds), GCState(), 0.0, 0.0).release_blocks
    gc = IPAMGarbageCollector(ds, grace=0)
    name = affinity_name("n1", target)

    def reclaim(method: str, path: str) -> None:
        if method == "DELETE" and "/ipamblocks/" in path:
            transport.fault_hook = None
            current = ds.get(BlockAffinity, name)
            current.spec.state = "confirmed"
            ds.update(current)

    transport.fault_hook = reclaim
    assert gc._release_affine_block(target) is True
    assert ds.get(BlockAffinity, name).spec.state == "confirmed"


def test_a_running_agent_never_allocates_from_a_block_gc_unaffined(ds: Datastore) -> None:
    """A node deleted and registered again while its agent runs (issue 29's rejoin):
    GC took the node's affinity off its block (a live pod still holds an address
    there); the agent's cache still lists the block as its own. Its next pod must get
    an address from a block affine to it, which it announces over BGP, not from the
    unaffine block that no node announces."""
    add_pool(ds, "p", "10.0.0.0/24")
    add_node(ds, "n2")
    add_pod(ds, "ns", "alive", node="n1")
    agent = alloc(ds, "n1")
    agent.auto_assign("live-pod", {"namespace": "ns", "pod": "alive", "node": "n1"})
    (old_block,) = agent.affine_blocks()
    assert IPAMGarbageCollector(ds, grace=3600).run_once().cleaned_nodes == ["n1"]
    add_node(ds, "n1")  # kubelet registers the node again
    (ip,) = agent.auto_assign("new-pod", {"namespace": "ns", "pod": "new", "node": "n1"})
    assert ip not in old_block
    assert any(ip in block for block in agent.affine_blocks())
    affine = {str(b.spec.cidr) for b in ds.list(IPAMBlock) if b.spec.affinity == "host:n1"}
    assert any(ip in IPv4Network(cidr) for cidr in affine), affine
