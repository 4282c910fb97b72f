"""Shared pieces of the IPAM integration tests: pool setup/teardown and a worker."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from ipaddress import IPv4Network

from datastore.client import Datastore
from datastore.errors import NotFound, Unavailable
from datastore.models import (
    BlockAffinity,
    IPAMBlock,
    IPAMHandle,
    IPPool,
    IPPoolSpec,
    Meta,
)
from ipam.allocator import IPAMAllocator
from ipam.errors import PoolExhausted

Event = tuple[str, str, float, float | None]  # (ip, handle, allocated at, released at)


@contextlib.contextmanager
def scratch_pool(ds: Datastore, name: str, cidr: str, block_size: int) -> Iterator[IPPool]:
    """A pool for one test; everything IPAM created inside it is deleted afterwards."""
    pool = _create_when_ready(
        ds, IPPool(metadata=Meta(name=name), spec=IPPoolSpec(cidr=cidr, block_size=block_size))
    )
    try:
        yield pool
    finally:
        clean_pool(ds, cidr)
        with contextlib.suppress(NotFound):
            ds.delete(ds.get(IPPool, name), check_version=False)


def _create_when_ready(ds: Datastore, pool: IPPool, timeout: float = 60.0) -> IPPool:
    """Create, waiting out 'storage is (re)initializing' right after CRDs are installed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ds.create(pool)
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def clean_pool(ds: Datastore, cidr: str) -> None:
    network = IPv4Network(cidr)
    blocks = [b for b in ds.list(IPAMBlock) if IPv4Network(b.spec.cidr).subnet_of(network)]
    cidrs = {b.spec.cidr for b in blocks}
    for handle in ds.list(IPAMHandle):
        if set(handle.spec.block) & cidrs:
            with contextlib.suppress(NotFound):
                ds.delete(handle, check_version=False)
    for affinity in ds.list(BlockAffinity):
        if IPv4Network(affinity.spec.cidr).subnet_of(network):
            with contextlib.suppress(NotFound):
                ds.delete(affinity, check_version=False)
    for block in blocks:
        with contextlib.suppress(NotFound):
            ds.delete(block, check_version=False)


def churn(
    kubeconfig: str, node: str, pool: str, count: int, release_p: float, seed: int
) -> tuple[list[Event], int, int]:
    """Allocate count addresses, releasing a random held one with probability release_p.

    Returns every holding interval (monotonic clock, shared by processes on one
    host), how many allocations were borrowed, and how many hit an exhausted pool.
    """
    ds = Datastore.from_kubeconfig(kubeconfig)
    allocator = IPAMAllocator(ds, node)
    rnd = random.Random(seed)
    held: dict[str, tuple[str, float]] = {}
    events: list[Event] = []
    borrowed = exhausted = 0
    for i in range(count):
        handle = f"{node}-{i}"
        try:
            (ip,) = allocator.auto_assign(handle, {"node": node}, pools=[pool])
        except PoolExhausted:
            exhausted += 1
            release_p = 1.0 if held else release_p
        else:
            held[handle] = (str(ip), time.monotonic())
            if not any(ip in block for block in allocator.affine_blocks()):
                borrowed += 1
        if held and rnd.random() < release_p:
            victim = rnd.choice(sorted(held))
            address, since = held.pop(victim)
            events.append((address, victim, since, time.monotonic()))
            allocator.release_by_handle(victim)
    events += [(address, handle, since, None) for handle, (address, since) in held.items()]
    return events, borrowed, exhausted
