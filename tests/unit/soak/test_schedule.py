"""The soak's schedule: replayable from its seed, every fault early, sane counts."""

from __future__ import annotations

from itertools import islice

import pytest

from tests.soak.schedule import (
    CHURN_KINDS,
    FAULT_KINDS,
    FAULT_SHARE,
    FAULT_WEIGHTS,
    MAX_BURST,
    schedule,
)

NODES = ["node1", "node2", "node3", "node4"]
SPARES = ["node4"]


def _take(seed: int, n: int, faults: tuple[str, ...] = FAULT_KINDS) -> list:
    return list(islice(schedule(seed, NODES, faults, SPARES), n))


def test_the_same_seed_gives_the_same_events_and_another_seed_others() -> None:
    assert _take(7, 200) == _take(7, 200)
    assert _take(7, 200) != _take(8, 200)


@pytest.mark.parametrize("seed", range(20))
def test_every_fault_kind_happens_once_within_the_opening(seed: int) -> None:
    opening = _take(seed, 3 * len(FAULT_KINDS))
    faults = [e.kind for e in opening if e.is_fault]
    assert sorted(faults[: len(FAULT_KINDS)]) == sorted(FAULT_KINDS)
    first_fault = next(i for i, e in enumerate(opening) if e.is_fault)
    assert first_fault >= 1, "churn comes first: a fault needs something to hit"


def test_later_events_mix_churn_and_faults_over_every_node() -> None:
    events = _take(3, 2000)[30:]
    kinds = {e.kind for e in events}
    assert set(CHURN_KINDS) <= kinds and set(FAULT_KINDS) <= kinds
    assert {e.node for e in events} == set(NODES)
    share = sum(e.is_fault for e in events) / len(events)
    assert 0.15 < share < 0.35, share
    assert [e.index for e in _take(3, 50)] == list(range(50))


def test_burst_sizes_stay_within_their_bounds() -> None:
    for event in _take(11, 3000):
        if event.kind == "pods-create":
            assert 1 <= event.count <= MAX_BURST
        elif event.kind in ("agent-kill-mid-add", "node-replace"):
            assert 5 <= event.count <= 20
        elif event.kind == "pods-delete":
            assert 1 <= event.count <= MAX_BURST // 2
        else:
            assert event.count == 1


def test_a_subset_of_faults_is_honoured_and_unknown_ones_refused() -> None:
    events = _take(5, 500, ("agent-kill",))
    assert {e.kind for e in events if e.is_fault} == {"agent-kill"}
    with pytest.raises(ValueError, match="unknown fault kinds: disk-full"):
        next(schedule(1, NODES, ("disk-full",)))
    with pytest.raises(ValueError, match="at least one node"):
        next(schedule(1, []))


def test_only_a_spare_node_is_replaced_and_a_replacement_needs_one() -> None:
    replaced = {e.node for e in _take(4, 3000) if e.kind == "node-replace"}
    assert replaced == set(SPARES)
    with pytest.raises(ValueError, match="node-replace needs a spare node"):
        next(schedule(1, NODES))
    with pytest.raises(ValueError, match="spare nodes not among the nodes: node9"):
        next(schedule(1, NODES, FAULT_KINDS, ["node9"]))
    assert next(schedule(1, NODES, ("agent-kill",))).index == 0  # no spare: no replacement


def test_long_faults_are_rarer_than_short_ones_after_the_opening() -> None:
    faults = [e.kind for e in _take(9, 20000)[40:] if e.is_fault]
    share = {kind: faults.count(kind) / len(faults) for kind in FAULT_KINDS}
    total = sum(FAULT_WEIGHTS.values())
    for kind, weight in FAULT_WEIGHTS.items():
        assert abs(share[kind] - weight / total) < 0.03, (kind, share[kind])
    assert share["apiserver-stop"] < share["agent-kill"] / 2
    assert set(FAULT_WEIGHTS) == set(FAULT_KINDS) and 0 < FAULT_SHARE < 1


def test_events_describe_themselves_for_the_log() -> None:
    event = next(e for e in _take(2, 100) if e.kind == "pods-create" and e.count > 1)
    assert event.describe() == f"#{event.index} pods-create on {event.node} x{event.count}"
