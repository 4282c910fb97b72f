"""IPAM against a real kube-apiserver: contending node processes, and crash repair."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import subprocess
import sys
from collections import defaultdict
from ipaddress import IPv4Address, IPv4Network

import pytest

from datastore.client import Datastore
from datastore.models import BlockAffinity, IPAMBlock
from ipam.allocator import CLAIM_STEPS, CRASH_ENV, IPAMAllocator
from ipam.block import AllocationBlock
from ipam.report import Snapshot, check, pool_usage
from lab.controlplane import ControlPlane
from tests.integration.ipam.helpers import Event, churn, scratch_pool

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def _assert_no_overlap(events: list[Event]) -> None:
    """No two holders of one address at the same time (intervals never overlap)."""
    by_ip: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        by_ip[event[0]].append(event)
    for ip, holds in by_ip.items():
        holds.sort(key=lambda e: e[2])
        for first, second in itertools.pairwise(holds):
            assert first[3] is not None and first[3] <= second[2], (
                f"{ip} handed out twice: {first} and {second}"
            )


def test_contending_processes_share_a_small_pool(
    control_plane: ControlPlane, datastore: Datastore
) -> None:
    nodes, per_node = 3, 220
    cidr = "10.220.0.0/25"  # 8 blocks of 16: nodes run out of blocks and borrow
    with scratch_pool(datastore, "ipam-concurrency", cidr, 28):
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(nodes) as workers:
            jobs = [
                workers.apply_async(
                    churn,
                    (
                        str(control_plane.kubeconfig),
                        f"cc-{i}",
                        "ipam-concurrency",
                        per_node,
                        0.8,
                        i,
                    ),
                )
                for i in range(nodes)
            ]
            results = [job.get(timeout=240) for job in jobs]
        events = [e for evs, _, _ in results for e in evs]
        borrowed = sum(b for _, b, _ in results)
        allocations = sum(1 for _ in events)
        assert allocations >= 600
        assert borrowed > 0, "the pool was meant to force borrowing"
        _assert_no_overlap(events)

        live = {IPv4Address(ip): handle for ip, handle, _, released in events if released is None}
        snapshot = Snapshot.load(datastore)
        network = IPv4Network(cidr)
        in_blocks = {
            a.ip: a.handle_id
            for model in snapshot.blocks
            if IPv4Network(model.spec.cidr).subnet_of(network)
            for a in AllocationBlock.from_spec(model.spec).iter_allocations()
        }
        assert in_blocks == live  # every allocation recorded, none extra, same handle
        report = check(snapshot)
        mine = [
            p
            for p in report.problems
            if p.block is None or p.block in {m.spec.cidr for m in snapshot.blocks}
        ]
        assert [p for p in mine if _in_pool(p.ip, p.block, network)] == []
        assert {h.spec.handle_id for h in snapshot.handles} >= set(live.values())
        usage = next(u for u in pool_usage(snapshot) if u.name == "ipam-concurrency")
        assert usage.in_use == len(live)
        assert sum(b.in_use for b in usage.blocks) == len(live)


def _in_pool(ip: str | None, block: str | None, network: IPv4Network) -> bool:
    if ip:
        return IPv4Address(ip) in network
    return block is not None and IPv4Network(block).subnet_of(network)


CRASH_SCRIPT = """
import sys
from datastore.client import Datastore
from ipam.allocator import IPAMAllocator
ds = Datastore.from_kubeconfig(sys.argv[1])
IPAMAllocator(ds, sys.argv[2]).auto_assign("crash-handle", pools=[sys.argv[3]])
"""


@pytest.mark.parametrize("step", CLAIM_STEPS)
def test_killed_at_each_claim_step_is_repaired(
    control_plane: ControlPlane, datastore: Datastore, step: str
) -> None:
    index = CLAIM_STEPS.index(step)
    cidr = f"10.221.{index * 4}.0/22"
    name = f"ipam-crash-{index}"
    node = f"crash-{index}"
    with scratch_pool(datastore, name, cidr, 26):
        env = {**os.environ, CRASH_ENV: step, "PYTHONPATH": REPO}
        proc = subprocess.run(
            [sys.executable, "-c", CRASH_SCRIPT, str(control_plane.kubeconfig), node, name],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 86, proc.stderr
        network = IPv4Network(cidr)
        mine = [a for a in datastore.list(BlockAffinity) if a.spec.node == node]
        assert len(mine) == 1
        expected = "confirmed" if step == "affinity-confirmed" else "pending"
        assert mine[0].spec.state == expected

        ip = IPAMAllocator(datastore, node).auto_assign("after-crash", pools=[name])[0]
        affinities = [a for a in datastore.list(BlockAffinity) if a.spec.node == node]
        blocks = [
            b for b in datastore.list(IPAMBlock) if IPv4Network(b.spec.cidr).subnet_of(network)
        ]
        assert [a.spec.state for a in affinities] == ["confirmed"]
        assert len(blocks) == 1 and blocks[0].spec.affinity == f"host:{node}"
        assert ip in IPv4Network(blocks[0].spec.cidr)
        assert blocks[0].spec.cidr == affinities[0].spec.cidr
