"""A burst of allocations on one node: one block write for many pods, and each pod's
own answer (its address, or its own error) whatever happens to the others."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from ipaddress import IPv4Address
from typing import Any

import pytest
from conftest import add_pool

from datastore.client import Datastore
from datastore.errors import Unavailable
from datastore.memory import MemoryTransport
from datastore.models import IPAMBlock, IPAMHandle
from ipam.allocator import IPAMAllocator
from ipam.batch import AssignBatcher
from ipam.block import AllocationBlock
from ipam.pools import handle_name
from ipam.report import Snapshot, check


def writes(transport: MemoryTransport) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []

    def hook(method: str, path: str) -> None:
        if method in ("POST", "PUT", "DELETE"):
            seen.append((method, path))

    transport.fault_hook = hook
    return seen


def allocated(ds: Datastore) -> list[IPv4Address]:
    return [
        a.ip
        for b in ds.list(IPAMBlock)
        for a in AllocationBlock.from_spec(b.spec).iter_allocations()
    ]


def handle_counts(ds: Datastore) -> dict[str, int]:
    return {h.spec.handle_id: sum(h.spec.block.values()) for h in ds.list(IPAMHandle)}


def requests(n: int, start: int = 0) -> list[tuple[str, Mapping[str, str]]]:
    return [(f"net.c{i}", {"namespace": "ns", "pod": f"p{i}"}) for i in range(start, start + n)]


def warm(ds: Datastore, cidr: str = "10.0.0.0/24", **pool: Any) -> IPAMAllocator:
    add_pool(ds, "p", cidr, **pool)
    a = IPAMAllocator(ds, "n1", config_ttl=60)
    a.auto_assign("net.warm")  # the node's block is claimed and cached
    return a


def test_a_batch_is_one_block_write_and_a_handle_each(
    ds: Datastore, transport: MemoryTransport
) -> None:
    a = warm(ds)
    seen = writes(transport)
    got = a.auto_assign_each(requests(10))
    transport.fault_hook = None
    assert all(isinstance(ip, IPv4Address) for ip in got)
    assert len(set(got)) == 10
    block_writes = [w for w in seen if "/ipamblocks/" in w[1]]
    handle_writes = [w for w in seen if "/ipamhandles" in w[1]]
    assert len(block_writes) == 1 and len(handle_writes) == 10
    assert handle_counts(ds) == {"net.warm": 1, **{f"net.c{i}": 1 for i in range(10)}}
    held = {
        x.ip: (x.handle_id, x.attrs)
        for b in ds.list(IPAMBlock)
        for x in AllocationBlock.from_spec(b.spec).iter_allocations()
    }
    assert held[got[3]] == ("net.c3", {"node": "n1", "namespace": "ns", "pod": "p3"})  # type: ignore[index]
    assert check(Snapshot.load(ds, with_k8s=False)).problems == []
    a.close()


def test_what_does_not_fit_the_block_takes_the_ordinary_path(ds: Datastore) -> None:
    a = warm(ds, block_size=29)  # 8 addresses per block, 7 left after the warm-up
    got = a.auto_assign_each(requests(12))
    assert all(isinstance(ip, IPv4Address) for ip in got)
    assert len(set(got)) == 12 and sorted(got) == sorted(set(allocated(ds)) - {min(allocated(ds))})
    assert len(ds.list(IPAMBlock)) == 2  # the five that did not fit claimed the next block
    assert check(Snapshot.load(ds, with_k8s=False)).problems == []
    a.close()


def test_a_failed_handle_write_fails_only_its_own_request(
    ds: Datastore, transport: MemoryTransport
) -> None:
    a = warm(ds)
    posts = [0]
    lock = threading.Lock()

    def fail_third_handle(method: str, path: str) -> None:
        if method == "POST" and path.endswith("/ipamhandles"):
            with lock:
                posts[0] += 1
                if posts[0] == 3:
                    raise Unavailable("apiserver refused", 503)

    transport.fault_hook = fail_third_handle
    got = a.auto_assign_each(requests(6))
    transport.fault_hook = None
    failed = [i for i, outcome in enumerate(got) if isinstance(outcome, Unavailable)]
    assert len(failed) == 1  # handles are written at once: which one is not fixed
    served = [ip for ip in got if isinstance(ip, IPv4Address)]
    assert len(served) == 5
    assert sorted(allocated(ds)) == sorted([*served, *a.addresses_of("net.warm")])
    assert ds.try_get(IPAMHandle, handle_name(f"net.c{failed[0]}")) is None
    assert check(Snapshot.load(ds, with_k8s=False)).problems == []
    a.close()


def test_a_failed_block_write_fails_the_batch_and_leaves_nothing(
    ds: Datastore, transport: MemoryTransport
) -> None:
    a = warm(ds)

    def fail_block_put(method: str, path: str) -> None:
        if method == "PUT" and "/ipamblocks/" in path:
            raise Unavailable("apiserver down", 503)

    transport.fault_hook = fail_block_put
    with pytest.raises(Unavailable):
        a.auto_assign_each(requests(4))
    transport.fault_hook = None
    assert len(allocated(ds)) == 1
    assert handle_counts(ds) == {"net.warm": 1}
    assert check(Snapshot.load(ds, with_k8s=False)).problems == []
    a.close()


class GatedAllocator:
    """assign_each that holds its first call until ``queued`` more callers wait."""

    def __init__(self, batcher_ref: list[AssignBatcher], queued: int) -> None:
        self.ref = batcher_ref
        self.queued = queued
        self.calls: list[list[str]] = []

    def __call__(self, reqs: Sequence[tuple[str, Mapping[str, str]]]) -> list[Any]:
        self.calls.append([h for h, _ in reqs])
        if len(self.calls) == 1:
            batcher = self.ref[0]
            with batcher.queued:
                batcher.queued.wait_for(lambda: len(batcher._queue) >= self.queued, timeout=30)
        out: list[Any] = []
        for handle, _ in reqs:
            number = int(handle.rsplit("c", 1)[1])
            out.append(
                ValueError(f"no address for {handle}") if number == 5 else IPv4Address(number)
            )
        return out


def burst(max_batch: int) -> tuple[GatedAllocator, AssignBatcher, dict[int, Any]]:
    """Ten callers: the first is at the allocator while the nine others queue."""
    ref: list[AssignBatcher] = []
    fake = GatedAllocator(ref, queued=9)
    batcher = AssignBatcher(fake, max_batch=max_batch)
    ref.append(batcher)
    results: dict[int, Any] = {}

    def call(i: int) -> None:
        try:
            results[i] = batcher.assign(f"net.c{i}", {})
        except ValueError as exc:
            results[i] = exc

    first = threading.Thread(target=call, args=(0,))
    first.start()
    with batcher._cond:
        batcher._cond.wait_for(lambda: batcher._busy, timeout=30)
    others = [threading.Thread(target=call, args=(i,)) for i in range(1, 10)]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join(timeout=30)
    return fake, batcher, results


def test_callers_that_arrive_during_a_write_share_the_next_one() -> None:
    fake, batcher, results = burst(max_batch=64)
    assert fake.calls[0] == ["net.c0"]
    assert sorted(fake.calls[1]) == [f"net.c{i}" for i in range(1, 10)]
    assert len(fake.calls) == 2 and list(batcher.batches) == [1, 9]
    assert isinstance(results[5], ValueError)  # its own error, and only its own
    assert all(results[i] == IPv4Address(i) for i in range(10) if i != 5)


def test_batches_keep_to_the_limit() -> None:
    fake, batcher, results = burst(max_batch=4)
    assert list(batcher.batches) == [1, 4, 4, 1]
    assert sorted(h for call in fake.calls for h in call) == sorted(f"net.c{i}" for i in range(10))
    assert len(results) == 10
    with pytest.raises(ValueError, match="at least 1"):
        AssignBatcher(fake, max_batch=0)


def test_threads_through_the_batcher_never_share_an_address(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/24", block_size=28)
    a = IPAMAllocator(ds, "n1", config_ttl=60)
    batcher = AssignBatcher(a.auto_assign_each)
    got: list[IPv4Address] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        try:
            ip = batcher.assign(f"net.c{i}", {"pod": f"p{i}"})
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            got.append(ip)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(got) == len(set(got)) == 40
    assert sorted(got) == sorted(allocated(ds))
    assert sum(handle_counts(ds).values()) == 40
    assert check(Snapshot.load(ds, with_k8s=False)).problems == []
    a.close()


def test_a_stale_block_cache_sends_the_overflow_the_ordinary_way(ds: Datastore) -> None:
    a = warm(ds)  # /26 blocks: 63 free as a last saw its block
    other = IPAMAllocator(ds, "n1", config_ttl=60)  # e.g. the agent before a restart
    other.auto_assign("net.other", None, 60)  # 3 free left; a's copy does not know
    got = a.auto_assign_each(requests(6))
    assert all(isinstance(ip, IPv4Address) for ip in got) and len(set(got)) == 6
    assert handle_counts(ds) == {
        "net.warm": 1,
        "net.other": 60,
        **{f"net.c{i}": 1 for i in range(6)},
    }
    assert len(ds.list(IPAMBlock)) == 2
    assert check(Snapshot.load(ds, with_k8s=False)).problems == []
    a.close()
    other.close()
