"""policy.realization: a policy's realized counts and pending nodes from node reports."""

from __future__ import annotations

import pytest

from policy.errors import PolicyError
from policy.realization import (
    NodeHealth,
    NodeReport,
    Version,
    cluster_policy_key,
    networkpolicy_key,
    parse_node_health,
    parse_report,
    parse_version,
    realization,
    version_of,
)

KEY = networkpolicy_key("web", "allow-db")
UID = "1a2b3c4d-0000-4000-8000-000000000000"
V2 = Version(2, UID[:8])
READY = [NodeHealth("a", True), NodeHealth("b", True), NodeHealth("c", True)]


def report(node: str, programmed: dict[str, Version], applied: set[str]) -> NodeReport:
    return NodeReport(node, programmed, frozenset(applied), "2026-12-06T18:00:00Z")


def test_keys_and_versions() -> None:
    assert KEY == "np/web/allow-db"
    assert cluster_policy_key("deny-imds") == "cnp/deny-imds"
    raw = {"metadata": {"name": "x", "generation": 2, "uid": UID}}
    assert version_of(raw) == V2 and str(V2) == "2:1a2b3c4d"
    assert parse_version("2:1a2b3c4d") == V2
    assert version_of({"metadata": {}}) == Version(0, "")
    for bad in ("2", "x:1a2b", ":1a"):
        with pytest.raises(PolicyError):
            parse_version(bad)


def test_a_generation_on_every_node_it_applies_to_is_done() -> None:
    reports = {
        "a": report("a", {KEY: V2}, {KEY}),
        "b": report("b", {KEY: Version(3, V2.uid)}, {KEY}),  # newer counts
        "c": report("c", {KEY: V2}, set()),  # programmed, selects no pod there
    }
    r = realization(KEY, V2, reports, READY)
    assert (r.desired, r.current, r.done, r.summary()) == (2, 2, True, "2/2")


def test_nodes_behind_are_pending_and_counted_as_desired() -> None:
    reports = {
        "a": report("a", {KEY: Version(1, V2.uid)}, {KEY}),
        "b": report("b", {}, set()),
        "c": report("c", {KEY: Version(5, "ffffffff")}, {KEY}),  # an earlier object's
    }
    r = realization(KEY, V2, reports, READY)
    assert (r.desired, r.current, r.done) == (3, 0, False)
    reasons = {p.node: p.reason for p in r.pending}
    assert reasons["a"] == "has programmed generation 1, not generation 2 yet"
    assert reasons["b"] == "has not programmed it, not generation 2 yet"
    assert reasons["c"].startswith("has programmed an earlier object of that name")


def test_a_node_without_a_report_or_not_ready_says_so() -> None:
    nodes = [NodeHealth("a", True), NodeHealth("b", False, "Ready=Unknown since T: stopped")]
    r = realization(KEY, V2, {"a": report("a", {KEY: V2}, {KEY})}, nodes)
    assert [(p.node, p.reason) for p in r.pending] == [
        (
            "b",
            "its agent has published no policy status "
            "(node not Ready: Ready=Unknown since T: stopped)",
        )
    ]
    assert r.summary() == "1/2"


def test_reports_round_trip_through_their_status() -> None:
    mine = report("a", {KEY: V2, "cnp/x": Version(1, "abcdef01")}, {KEY})
    status = mine.to_status()
    assert status["programmed"] == {"cnp/x": "1:abcdef01", KEY: "2:1a2b3c4d"}
    assert (status["programmedCount"], status["appliedCount"]) == (2, 1)
    assert parse_report({"metadata": {"name": "a"}, "status": status}) == mine
    with pytest.raises(PolicyError):
        parse_report({"metadata": {}, "status": status})
    with pytest.raises(PolicyError):
        parse_report({"metadata": {"name": "a"}, "status": {"programmed": [], "applied": []}})


def test_node_health_comes_from_the_ready_condition() -> None:
    def node(*conditions: dict[str, str]) -> dict[str, object]:
        return {"metadata": {"name": "n"}, "status": {"conditions": list(conditions)}}

    ready = node({"type": "Ready", "status": "True", "lastTransitionTime": "T"})
    assert parse_node_health(ready).ready
    down = parse_node_health(
        node({"type": "Ready", "status": "Unknown", "lastTransitionTime": "T", "reason": "R"})
    )
    assert not down.ready and down.detail == "Ready=Unknown since T: R"
    assert parse_node_health(node()) == NodeHealth("n", False, "no Ready condition")
