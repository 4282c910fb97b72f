"""BGPController without ExaBGP: the claim fast path and kernel passes only on change."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from bgp import annotations as ann
from bgp.controller import BGPController, BGPInputs
from bgp.messages import LearnedRoute
from bgp.speaker import SpeakerOptions
from datastore.models import BlockAffinity
from tests.unit.bgp.test_bgp_kernel import FakeNetlink

N = ipaddress.IPv4Network
NODES = [
    {"metadata": {"name": "n1", "annotations": {ann.IPV4_ADDRESS: "10.0.0.1/24"}}},
    {"metadata": {"name": "n2", "annotations": {ann.IPV4_ADDRESS: "10.0.0.2/24"}}},
]


class FakeSpeaker:
    """What the controller asks of its Speaker; records each announcement."""

    def __init__(self) -> None:
        self.announced: list[frozenset[N]] = []

    def announce(self, prefixes: Any) -> None:
        self.announced.append(frozenset(prefixes))

    def update_plan(self, plan: Any) -> None:
        return None

    def learned_routes(self) -> list[LearnedRoute]:
        return []

    def synced(self) -> bool:
        return True


def affinity(cidr: str) -> BlockAffinity:
    return BlockAffinity.model_validate(
        {"metadata": {"name": cidr}, "spec": {"cidr": cidr, "node": "n1", "state": "confirmed"}}
    )


def make(tmp_path: Path) -> tuple[BGPController, FakeSpeaker, FakeNetlink, list[int]]:
    fake = FakeNetlink([])
    opened: list[int] = []

    def netlink() -> FakeNetlink:
        opened.append(1)
        return fake

    controller = BGPController("n1", SpeakerOptions(workdir=tmp_path), netlink)
    speaker = FakeSpeaker()
    controller.speaker = speaker  # type: ignore[assignment]
    return controller, speaker, fake, opened


def blackholes(fake: FakeNetlink) -> list[str]:
    return [kw["dst"] for cmd, kw in fake.calls if cmd == "replace" and kw["type"] == 6]


def test_a_claimed_block_is_blackholed_and_announced_before_the_cache_has_it(
    tmp_path: Path,
) -> None:
    controller, speaker, fake, _ = make(tmp_path)
    controller.update(BGPInputs(nodes=NODES, affinities=[affinity("10.244.1.0/26")]))
    controller.block_claimed(N("10.244.9.0/26"))
    assert speaker.announced[-1] == {N("10.244.1.0/26"), N("10.244.9.0/26")}
    assert set(blackholes(fake)) == {"10.244.1.0/26", "10.244.9.0/26"}  # the fake keeps none
    # a pass from a cache that has not seen the claim yet keeps announcing it ...
    controller.update(BGPInputs(nodes=NODES, affinities=[affinity("10.244.1.0/26")]))
    assert speaker.announced[-1] == {N("10.244.1.0/26"), N("10.244.9.0/26")}
    # ... and once the cache has it, the cache is the truth (a release withdraws it)
    both = [affinity("10.244.1.0/26"), affinity("10.244.9.0/26")]
    controller.update(BGPInputs(nodes=NODES, affinities=both))
    controller.update(BGPInputs(nodes=NODES, affinities=both[:1]))
    assert speaker.announced[-1] == {N("10.244.1.0/26")}


def test_a_claim_before_the_first_pass_is_announced_by_it(tmp_path: Path) -> None:
    controller, speaker, _, _ = make(tmp_path)
    controller.speaker = None
    controller.block_claimed(N("10.244.9.0/26"))
    controller.speaker = speaker  # type: ignore[assignment]
    controller.update(BGPInputs(nodes=NODES))
    assert speaker.announced[-1] == {N("10.244.9.0/26")}


def test_kernel_is_touched_only_when_the_desired_state_changes(tmp_path: Path) -> None:
    controller, _, _, opened = make(tmp_path)
    inputs = BGPInputs(nodes=NODES, affinities=[affinity("10.244.1.0/26")])
    controller.update(inputs)
    kernel_passes = len(opened)
    controller.update(inputs)  # an unrelated watch event: nothing to do in the kernel
    assert len(opened) == kernel_passes
    controller.resync()  # the timer: always a full pass (drift repair)
    assert len(opened) == kernel_passes + 2  # routes, then neighbours
    controller.update(BGPInputs(nodes=NODES, affinities=[affinity("10.244.2.0/26")]))
    assert len(opened) == kernel_passes + 4
