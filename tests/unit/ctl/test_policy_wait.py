"""`tabbyctl policy wait` over an in-memory apiserver: nodes' reports in, a verdict out."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from click.testing import CliRunner

from datastore import kinds
from datastore.client import Datastore
from datastore.memory import MemoryTransport
from policy.realization import NodeReport, Version, version_of
from tabbyctl.main import Context, cli
from tabbyctl.policy import parse_duration, parse_policy_ref

KEY = "np/y/only-b"


def _node(ds: Datastore, name: str, ready: str = "True") -> None:
    condition = {"type": "Ready", "status": ready, "lastTransitionTime": "2026-12-06T18:00:00Z"}
    if ready != "True":
        condition["reason"] = "NodeStatusUnknown"
    ds.create_raw(kinds.NODE, {"metadata": {"name": name}, "status": {"conditions": [condition]}})


def _report(ds: Datastore, node: str, programmed: dict[str, Version], applied: set[str]) -> None:
    status = NodeReport(node, programmed, frozenset(applied), "T").to_status()
    ds.create_raw(kinds.NODEPOLICYSTATUS, {"metadata": {"name": node}, "status": status})


def _world(*nodes: tuple[str, str]) -> tuple[Context, Version]:
    ds = Datastore(MemoryTransport())
    policy = ds.create_raw(
        kinds.NETWORKPOLICY,
        {
            "metadata": {"name": "only-b", "namespace": "y", "generation": 2, "uid": "c0ffee00-1"},
            "spec": {"podSelector": {"matchLabels": {"pod": "b"}}, "ingress": []},
        },
    )
    for name, ready in nodes:
        _node(ds, name, ready)
    ctx = Context("unused")
    ctx._datastore = ds
    return ctx, version_of(policy)


def _wait(ctx: Context, *args: str) -> tuple[int, Any]:
    result = CliRunner().invoke(cli, ["policy", "wait", *args], obj=ctx)
    return result.exit_code, result.output


def test_it_returns_at_once_when_every_node_has_the_generation() -> None:
    ctx, version = _world(("a", "True"), ("b", "True"))
    _report(ctx.datastore, "a", {KEY: version}, {KEY})
    _report(ctx.datastore, "b", {KEY: version}, set())  # selects no pod there
    code, out = _wait(ctx, "networkpolicy/only-b", "-n", "y", "-o", "json")
    assert code == 0, out
    data = json.loads(out)
    assert (data["realized"], data["desiredNodes"], data["currentNodes"]) == (True, 1, 1)
    assert data["generation"] == 2 and data["pending"] == []
    code, out = _wait(ctx, "netpol/only-b", "-n", "y")
    assert code == 0 and "generation 2: realized on 1/1 nodes" in out


def test_it_waits_for_a_node_that_catches_up() -> None:
    ctx, version = _world(("a", "True"), ("b", "True"))
    _report(ctx.datastore, "a", {KEY: version}, {KEY})
    _report(ctx.datastore, "b", {KEY: Version(1, version.uid)}, {KEY})
    current = ctx.datastore.get_raw(kinds.NODEPOLICYSTATUS, "b")

    def catch_up() -> None:
        status = NodeReport("b", {KEY: version}, frozenset({KEY}), "T").to_status()
        ctx.datastore.replace_raw(kinds.NODEPOLICYSTATUS, {**current, "status": status})

    timer = threading.Timer(0.5, catch_up)
    timer.start()
    try:
        code, out = _wait(ctx, "networkpolicy/only-b", "-n", "y", "--timeout", "10s")
    finally:
        timer.join()
    assert code == 0, out
    assert "realized on 2/2 nodes" in out


def test_a_timeout_names_each_node_behind_and_a_node_that_is_down() -> None:
    ctx, version = _world(("a", "True"), ("b", "True"), ("c", "Unknown"))
    _report(ctx.datastore, "a", {KEY: version}, {KEY})
    _report(ctx.datastore, "b", {KEY: Version(1, version.uid)}, {KEY})
    code, out = _wait(ctx, "networkpolicy/only-b", "-n", "y", "--timeout", "300ms")
    assert code == 1, out
    assert "timed out after 300ms" in out
    assert "b has programmed generation 1, not generation 2 yet" in out
    assert "c its agent has published no policy status (node not Ready: Ready=Unknown" in out
    code, out = _wait(ctx, "networkpolicy/only-b", "-n", "y", "--timeout", "0s", "-o", "json")
    data = json.loads(out[: out.rindex("}") + 1])
    assert data["realized"] is False and [p["node"] for p in data["pending"]] == ["b", "c"]
    assert (data["desiredNodes"], data["currentNodes"]) == (3, 1)


def test_cluster_policies_are_waited_for_by_name() -> None:
    ctx, _ = _world(("a", "True"))
    cnp = ctx.datastore.create_raw(
        kinds.CLUSTERNETWORKPOLICY,
        {
            "metadata": {"name": "deny-imds", "generation": 1, "uid": "abcdef12-3"},
            "spec": {
                "tier": "Admin",
                "priority": 1,
                "subject": {"namespaces": {}},
                "egress": [{"action": "Deny", "to": [{"networks": ["169.254.169.254/32"]}]}],
            },
        },
    )
    key = "cnp/deny-imds"
    _report(ctx.datastore, "a", {key: version_of(cnp)}, {key})
    code, out = _wait(ctx, "clusternetworkpolicy/deny-imds")
    assert code == 0 and "clusternetworkpolicy/deny-imds generation 1: realized" in out


def test_bad_input_gets_a_clear_error() -> None:
    ctx, _ = _world(("a", "True"))
    code, out = _wait(ctx, "only-b")
    assert code == 2 and "networkpolicy/NAME" in out
    code, out = _wait(ctx, "networkpolicy/missing", "-n", "y")
    assert code == 2 and "networkpolicy y/missing not found" in out
    code, out = _wait(ctx, "networkpolicy/only-b", "-n", "y", "--timeout", "soon")
    assert code == 2 and "invalid duration" in out
    ctx.datastore.create_raw(
        kinds.NETWORKPOLICY,
        {"metadata": {"name": "bad", "namespace": "y"}, "spec": {"podSelector": {"a": 5}}},
    )
    code, out = _wait(ctx, "networkpolicy/bad", "-n", "y")
    assert code == 1 and "is invalid, so no agent programs it" in out


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("2m", 120.0), ("500ms", 0.5)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_policy_refs() -> None:
    assert parse_policy_ref("networkpolicy/web", "prod") == ("np", "web", "prod")
    assert parse_policy_ref("cnp/deny", "prod") == ("cnp", "deny", None)
    for bad in ("web", "pod/web", "networkpolicy/", "np/a/b"):
        with pytest.raises(ValueError):
            parse_policy_ref(bad, "default")


def test_policy_list_shows_how_far_each_policy_has_reached() -> None:
    ctx, version = _world(("a", "True"), ("b", "True"))
    _report(ctx.datastore, "a", {KEY: version}, {KEY})
    _report(ctx.datastore, "b", {}, set())
    result = CliRunner().invoke(cli, ["policy", "list", "-o", "json"], obj=ctx)
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.output)["policies"] if r["name"] == "y/only-b")
    assert row["realized"] == {
        "generation": 2,
        "desiredNodes": 2,
        "currentNodes": 1,
        "pending": ["b"],
    }
    table = CliRunner().invoke(cli, ["policy", "list"], obj=ctx)
    assert "1/2 (pending: b)" in table.output
