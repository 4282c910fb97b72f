"""A corrupt IPAMBlock is reported and skipped, never a crash or a hot loop (issue 21, item 4).

Pure pieces: the block's shape check, the report/check over a snapshot holding one,
BGP's borrowed addresses and its once-only report, the loop's backoff, and the CRD's
regexes (which must accept every string the encoder writes and refuse out-of-range
numbers). The scenario with real agents is tests/integration/cluster/test_corrupt_block.py.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import add_node, add_pool
from hypothesis import given, settings
from hypothesis import strategies as st

from bgp.controller import BGPController, BGPInputs
from bgp.routes import borrowed_addresses
from bgp.speaker import SpeakerOptions
from datastore.client import Datastore
from datastore.models import IPAMBlock, IPAMBlockSpec, IPPool, IPPoolSpec, Meta
from felix.loop import ReconcileLoop, backoff_s
from ipam.allocator import IPAMAllocator
from ipam.block import AllocationBlock, encode_allocations, encode_ordinals, free_count
from ipam.errors import BlockCorrupt
from ipam.gc import IPAMGarbageCollector
from ipam.report import Snapshot, check, pool_usage
from tests.unit.bgp.test_bgp_controller import NODES, FakeSpeaker
from tests.unit.bgp.test_bgp_kernel import FakeNetlink

CRD = Path(__file__).resolve().parents[3] / "manifests" / "crds" / "ipamblocks.yaml"


def model(cidr: str, affinity: str | None, **spec: Any) -> IPAMBlock:
    if not spec:
        block = AllocationBlock.new(cidr, affinity)
        block.auto_assign(2, "h1", {"node": "n1", "pod": "p", "namespace": "default"})
        spec = block.to_spec().model_dump()
    else:
        spec = {"cidr": cidr, "affinity": affinity, **spec}
    name = cidr.replace(".", "-").replace("/", "-")
    return IPAMBlock(metadata=Meta(name=name), spec=IPAMBlockSpec.model_validate(spec))


TOO_LONG = {"allocations": "0,-*69", "unallocated": "1-63", "attributes": ["1 h?node=n1"]}
INVERTED = {"allocations": "0,-*63", "unallocated": "9-3", "attributes": ["1 h?node=n1"]}
MISSING = {"allocations": "5,-*63", "unallocated": "1-63", "attributes": ["1 h?node=n1"]}
DISAGREE = {"allocations": "0,-*63", "unallocated": "0-62", "attributes": ["1 h?node=n1"]}


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        (TOO_LONG, "overruns 64"),
        (INVERTED, "outside"),
        (MISSING, "missing attributes"),
        (DISAGREE, "disagrees with allocations"),
    ],
)
def test_an_unsafe_block_is_refused_whole_and_offers_no_free_address(
    fields: dict[str, Any], complaint: str
) -> None:
    spec = model("10.9.0.0/26", "host:n2", **fields).spec
    with pytest.raises(BlockCorrupt, match=complaint):
        AllocationBlock.from_spec(spec)
    assert free_count(spec) == 0  # the allocator passes it by instead of failing


def test_check_names_the_corrupt_block_and_goes_on_with_the_rest() -> None:
    pool = IPPool(metadata=Meta(name="p"), spec=IPPoolSpec(cidr="10.9.0.0/16"))
    good = model("10.9.1.0/26", "host:n1")
    bad = model("10.9.0.0/26", "host:n2", **INVERTED)
    snapshot = Snapshot(pools=[pool], blocks=[bad, good], affinities=[], handles=[])
    report = check(snapshot)
    corrupt = [p for p in report.problems if p.kind == "corrupt-block"]
    assert [p.block for p in corrupt] == ["10.9.0.0/26"]
    assert "outside" in corrupt[0].message and bad.name in corrupt[0].message
    assert report.allocations == 2  # the good block was still checked
    assert any(p.kind == "missing-handle" for p in report.problems)
    assert pool_usage(snapshot)[0].in_use == 2


def test_bgp_announces_the_readable_borrowed_addresses_and_sets_the_bad_block_aside() -> None:
    other = model("10.9.1.0/26", "host:n2")  # n1 took two addresses from n2's block
    found = borrowed_addresses("n1", [model("10.9.0.0/26", "host:n2", **MISSING), other])
    assert found.addresses == (("10.9.1.0", "n2"), ("10.9.1.1", "n2"))
    assert [name for name, _ in found.corrupt] == ["10-9-0-0-26"]


def test_the_controller_reports_a_corrupt_block_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    controller = BGPController("n1", SpeakerOptions(workdir=tmp_path), lambda: FakeNetlink([]))
    speaker = FakeSpeaker()
    controller.speaker = speaker  # type: ignore[assignment]
    blocks = [model("10.9.0.0/26", "host:n2", **TOO_LONG), model("10.9.1.0/26", "host:n2")]
    caplog.set_level(logging.INFO, logger="bgp.controller")
    reported = []
    for _ in range(50):
        reported.append(controller.update(BGPInputs(nodes=NODES, blocks=blocks)).newly_invalid)
    assert reported == [1] + [0] * 49
    assert sum("corrupt IPAMBlock 10-9-0-0-26" in r.getMessage() for r in caplog.records) == 1
    assert speaker.announced[-1] == {ipaddress.IPv4Network(f"10.9.1.{i}/32") for i in (0, 1)}
    controller.update(BGPInputs(nodes=NODES, blocks=blocks[1:]))  # fixed: said once, too
    assert controller.status.invalid_blocks == {}
    assert any("readable again" in r.getMessage() for r in caplog.records)


def test_backoff_doubles_to_a_cap() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff_s(7) == 30.0 and backoff_s(10_000) == 30.0


def test_a_delayed_request_runs_once_after_its_delay() -> None:
    passes: list[tuple[float, set[str]]] = []
    done = threading.Event()

    def sync(reasons: set[str]) -> None:
        passes.append((time.monotonic(), reasons))
        done.set()

    loop = ReconcileLoop(sync, resync_interval_s=3600).start()
    try:
        began = time.monotonic()
        loop.request_after("retry-bgp", 0.3)
        loop.request_after("retry-bgp", 5.0)  # the earliest ask wins
        assert done.wait(3.0)
        time.sleep(0.2)
    finally:
        loop.stop()
    assert [r for _, r in passes] == [{"retry-bgp"}]
    assert passes[0][0] - began >= 0.29


# -- the CRD's regexes ---------------------------------------------------------------------
def _rules() -> dict[str, str]:
    doc = yaml.safe_load(CRD.read_text())
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return {r.get("message", ""): r["rule"] for r in spec["x-kubernetes-validations"]}


def _regex(field: str, prefix: int) -> re.Pattern[str]:
    rule = next(r for r in _rules().values() if f"self.{field}.matches" in r)
    found = re.search(rf"prefixLength\(\) == {prefix} \? self\.{field}\.matches\('([^']*)'\)", rule)
    assert found, f"no {field} regex for /{prefix}"
    return re.compile(found.group(1).replace("\\\\", "\\"))


@settings(max_examples=200, deadline=None)
@given(st.integers(20, 32).flatmap(lambda p: st.tuples(st.just(p), st.randoms())))
def test_crd_regexes_accept_what_the_encoder_writes(case: tuple[int, Any]) -> None:
    prefix, rnd = case
    block = AllocationBlock.new(f"10.0.0.0/{prefix}")
    for k in range(rnd.randint(0, min(block.size, 300))):
        block.auto_assign(rnd.randint(1, 3), f"h{k}", {"node": "n"})
        if rnd.random() < 0.4:
            block.release_handle(f"h{rnd.randint(0, k)}")
    spec = block.to_spec()
    assert _regex("allocations", prefix).fullmatch(spec.allocations), spec.allocations
    assert _regex("unallocated", prefix).fullmatch(spec.unallocated), spec.unallocated


@pytest.mark.parametrize("prefix", range(20, 33))
def test_crd_regexes_refuse_numbers_outside_the_block(prefix: int) -> None:
    size = 2 ** (32 - prefix)
    allocations, unallocated = _regex("allocations", prefix), _regex("unallocated", prefix)
    assert allocations.fullmatch(encode_allocations([None] * size))
    assert allocations.fullmatch(f"{size - 1},-*{size - 1}" if size > 1 else "0")
    assert not allocations.fullmatch(f"{size},-*{size - 1}")  # attribute index
    assert not allocations.fullmatch(f"-*{size + 1}")  # a run past the block
    assert unallocated.fullmatch(encode_ordinals(range(size)))
    assert not unallocated.fullmatch(f"{size}") and not unallocated.fullmatch(f"0-{size}")


def test_gc_keeps_a_corrupt_block_and_cleans_the_rest(ds: Datastore) -> None:
    """A deleted node's corrupt block is only unaffined (a person must look at it); its
    leaks elsewhere are still released, and the pass does not fail."""
    add_pool(ds, "p", "10.0.0.0/24")
    add_node(ds, "n2")
    gone = IPAMAllocator(ds, "n1")
    gone.auto_assign("dead-pod", {"namespace": "ns", "pod": "dead"})
    (bad,) = ds.list(IPAMBlock)
    bad.spec.unallocated = "9-3"
    ds.update(bad)
    IPAMAllocator(ds, "n2").auto_assign("n2-dead", {"namespace": "ns", "pod": "dead2"})
    result = IPAMGarbageCollector(ds, grace=0).run_once()
    assert result.cleaned_nodes == ["n1"]
    assert len(result.released_ips) == 1  # n2's leak; the corrupt block's is not readable
    kept = ds.get(IPAMBlock, bad.name)
    assert kept.spec.unallocated == "9-3" and kept.spec.affinity is None
