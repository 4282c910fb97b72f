"""The IPAMBlock CRD's CEL rules, against the real kube-apiserver (issue 21, item 4).

What a schema can see of a block's fields against its size is refused at the door
with a message naming the rule; every block the allocator writes (empty, full,
fragmented, /26 to /20, /32) is still accepted, and under the apiserver's CEL cost
limits (the CRD itself installs, so the estimate fits; a fragmented /20 validates).
What CEL cannot price (sums, a <= b in ranges) is left to the readers, which report
and skip such a block (tests/integration/cluster/test_corrupt_block.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import Invalid, NotFound
from ipam.block import AllocationBlock

pytestmark = pytest.mark.integration


@pytest.fixture
def blocks(datastore: Datastore) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(NotFound):
            datastore.delete_raw(kinds.IPAMBLOCK, name)


def _create(ds: Datastore, names: list[str], name: str, spec: dict[str, Any]) -> None:
    names.append(name)
    body = {"apiVersion": "crd.tabby.dev/v1", "kind": "IPAMBlock", "metadata": {"name": name}}
    ds.create_raw(kinds.IPAMBLOCK, {**body, "spec": spec})


def _written(cidr: str, *, used: int = 0, fragmented: bool = False) -> dict[str, Any]:
    """A block as the allocator writes it."""
    block = AllocationBlock.new(cidr, affinity="host:n1")
    if fragmented:  # every address taken by its own call, every second one given back
        for k in range(block.size):
            block.auto_assign(1, f"h{k}", {"namespace": "default", "pod": f"p{k}", "node": "n1"})
        for k in range(0, block.size, 2):
            block.release_handle(f"h{k}")
    else:
        block.auto_assign(used, "h", {"node": "n1"})
    return block.to_spec().model_dump(by_alias=True, exclude_none=True)


@pytest.mark.parametrize(
    ("cidr", "used", "fragmented"),
    [
        ("10.50.0.0/26", 0, False),
        ("10.50.1.0/26", 64, False),
        ("10.50.2.0/26", 0, True),
        ("10.51.0.0/20", 4096, False),
        ("10.52.0.0/20", 0, True),
        ("10.53.0.7/32", 1, False),
    ],
)
def test_blocks_the_allocator_writes_are_accepted(
    datastore: Datastore, blocks: list[str], cidr: str, used: int, fragmented: bool
) -> None:
    spec = _written(cidr, used=used, fragmented=fragmented)
    _create(datastore, blocks, cidr.replace(".", "-").replace("/", "-"), spec)
    stored = datastore.get_raw(kinds.IPAMBLOCK, blocks[-1])["spec"]
    assert stored["allocations"] == spec["allocations"]


BASE = {"cidr": "10.60.0.0/26", "attributes": ["1 h?node=n1"], "sequenceNumber": 1}


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"allocations": "0,-*69", "unallocated": "1-63"}, "every run at most that long"),
        ({"allocations": "64,-*63", "unallocated": "1-63"}, "every index below the block's size"),
        ({"allocations": "0,-*63", "unallocated": "1-64"}, "unallocated must list ordinals inside"),
        ({"allocations": "0,-*63", "unallocated": "99"}, "unallocated must list ordinals inside"),
        ({"allocations": ",".join(["0"] * 65), "unallocated": ""}, "more runs than the block"),
        ({"allocations": "-*64", "unallocated": ",".join(["1"] * 65)}, "more items than the block"),
        ({"cidr": "10.0.0.0/16", "allocations": "-*65536", "unallocated": ""}, "/20 or smaller"),
    ],
)
def test_blocks_whose_fields_disagree_with_their_size_are_refused(
    datastore: Datastore, blocks: list[str], fields: dict[str, str], complaint: str
) -> None:
    with pytest.raises(Invalid, match=complaint):
        _create(datastore, blocks, "bad-block", {**BASE, **fields})
