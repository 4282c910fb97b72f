"""The allocator's fast path: handle and block written together, the next block claimed ahead."""

from __future__ import annotations

from ipaddress import IPv4Network

import pytest
from conftest import add_pool, set_config

from datastore.client import Datastore
from datastore.errors import Unavailable
from datastore.memory import MemoryTransport
from datastore.models import IPAMBlock, IPAMHandle
from ipam.allocator import IPAMAllocator
from ipam.block import AllocationBlock
from ipam.pools import handle_name
from ipam.report import Snapshot, check


def allocated(ds: Datastore) -> int:
    return sum(
        len(list(AllocationBlock.from_spec(b.spec).iter_allocations())) for b in ds.list(IPAMBlock)
    )


def test_failed_handle_write_gives_the_addresses_back(
    ds: Datastore, transport: MemoryTransport
) -> None:
    add_pool(ds, "p", "10.0.0.0/24")
    a = IPAMAllocator(ds, "n1", config_ttl=60)
    a.auto_assign("h0")

    def fail_handle_post(method: str, path: str) -> None:
        if method == "POST" and "/ipamhandles" in path:
            raise Unavailable("apiserver down", 503)

    transport.fault_hook = fail_handle_post
    with pytest.raises(Unavailable):
        a.auto_assign("h1")
    transport.fault_hook = None
    assert allocated(ds) == 1  # the block write that went out with it was undone
    assert ds.try_get(IPAMHandle, handle_name("h1")) is None
    assert check(Snapshot.load(ds, with_k8s=False)).problems == []
    a.close()


def test_release_finds_an_allocation_whose_handle_was_never_written(ds: Datastore) -> None:
    """A crash between the two writes: the block holds the address, no IPAMHandle exists."""
    add_pool(ds, "p", "10.0.0.0/24")
    a = IPAMAllocator(ds, "n1", config_ttl=60)
    (ip,) = a.auto_assign("lost")
    ds.delete(ds.get(IPAMHandle, handle_name("lost")))
    assert a.release_by_handle("lost") == [ip]
    assert allocated(ds) == 0
    assert a.release_by_handle("lost") == []  # and a repeated DEL is still a no-op
    a.close()


def test_next_block_is_claimed_before_the_current_one_fills(
    ds: Datastore, transport: MemoryTransport
) -> None:
    add_pool(ds, "p", "10.0.0.0/16")
    claimed: list[IPv4Network] = []
    a = IPAMAllocator(ds, "n1", config_ttl=60, preclaim_below=16, on_block_claimed=claimed.append)
    for i in range(48):  # 16 free left: not yet below the mark
        a.auto_assign(f"h{i}")
    assert len(ds.list(IPAMBlock)) == 1
    a.auto_assign("h48")  # 15 free: the claim starts in the background
    a.close()  # waits for it
    assert len(ds.list(IPAMBlock)) == 2
    assert len(claimed) == 2
    before = transport.requests
    for i in range(49, 80):  # fills the first block and moves on to the second
        a.auto_assign(f"h{i}")
    assert transport.requests - before == 2 * 31  # handle + block each; no claim, no read
    assert check(Snapshot.load(ds, with_k8s=False)).problems == []
    a.close()


def test_nothing_to_claim_ahead_backs_off(ds: Datastore, transport: MemoryTransport) -> None:
    add_pool(ds, "p", "10.0.0.0/26")  # a single block
    a = IPAMAllocator(ds, "n1", config_ttl=60, preclaim_below=16)
    for i in range(50):
        a.auto_assign(f"h{i}")
    a.close()  # the background claim found no free block
    before = transport.requests
    for i in range(50, 60):
        a.auto_assign(f"h{i}")
    a.close()
    assert transport.requests - before == 2 * 10  # no new background list per allocation
    assert len(ds.list(IPAMBlock)) == 1


def test_max_blocks_per_host_stops_claiming_ahead(ds: Datastore) -> None:
    add_pool(ds, "p", "10.0.0.0/16")
    set_config(ds, max_blocks_per_host=1)
    a = IPAMAllocator(ds, "n1", config_ttl=0, preclaim_below=16)
    for i in range(60):
        a.auto_assign(f"h{i}")
    a.close()
    assert len(ds.list(IPAMBlock)) == 1
