"""`tabbyctl policy explain` over an in-memory apiserver."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from datastore import kinds
from datastore.client import Datastore
from datastore.memory import MemoryTransport
from tabbyctl.main import Context, cli


def _world() -> Context:
    ds = Datastore(MemoryTransport())
    for ns in ("x", "y"):
        ds.create_raw(
            kinds.NAMESPACE,
            {"metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}},
        )
    for ns, name, ip in (("x", "a", "10.244.0.1"), ("y", "b", "10.244.0.2")):
        ds.create_raw(
            kinds.POD,
            {
                "metadata": {"name": name, "namespace": ns, "labels": {"pod": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
                        }
                    ]
                },
                "status": {"podIP": ip},
            },
        )
    ds.create_raw(
        kinds.NETWORKPOLICY,
        {
            "metadata": {"name": "only-a", "namespace": "y"},
            "spec": {
                "podSelector": {"matchLabels": {"pod": "b"}},
                "ingress": [
                    {
                        "from": [
                            {
                                "namespaceSelector": {
                                    "matchLabels": {"kubernetes.io/metadata.name": "x"}
                                }
                            }
                        ],
                        "ports": [{"port": "http"}],
                    }
                ],
            },
        },
    )
    ctx = Context("unused")
    ctx._datastore = ds
    return ctx


def _explain(ctx: Context, *args: str) -> tuple[int, Any]:
    result = CliRunner().invoke(cli, ["policy", "explain", *args, "-o", "json"], obj=ctx)
    return result.exit_code, (json.loads(result.output) if result.exit_code == 0 else result.output)


def test_named_port_allowed_from_the_selected_namespace_and_denied_elsewhere() -> None:
    ctx = _world()
    code, out = _explain(ctx, "--from", "x/a", "--to", "y/b", "--port", "80/TCP")
    assert code == 0 and out["allowed"] is True
    ingress = next(d for d in out["directions"] if d["direction"] == "ingress")
    assert ingress["decided_by"] == "y/only-a" and "ingress[0]" in ingress["reason"]
    code, out = _explain(ctx, "--from", "x/a", "--to", "y/b", "--port", "81/TCP")
    assert out["allowed"] is False
    # the reverse direction is not isolated by any policy: the default applies
    code, out = _explain(ctx, "--from", "y/b", "--to", "x/a", "--port", "80/TCP")
    assert out["allowed"] is True
    assert {d["decided_by"] for d in out["directions"]} == {"default (not isolated)"}


def test_bad_input_is_a_clear_error() -> None:
    ctx = _world()
    code, out = _explain(ctx, "--from", "x/a", "--to", "y/b", "--port", "http")
    assert code == 2 and "PORT" in out
    code, out = _explain(ctx, "--from", "x/nope", "--to", "y/b", "--port", "80")
    assert code == 2 and "x/nope not found" in out


def _cnp(
    ctx: Context, name: str, tier: str, priority: int, rule: dict[str, Any], on: str = "y"
) -> None:
    kind = kinds.CLUSTERNETWORKPOLICY
    subject = {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": on}}}
    spec = {"tier": tier, "priority": priority, "subject": subject, "ingress": [rule]}
    ctx.datastore.create_raw(
        kind, {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": {"name": name},
               "spec": spec}
    )  # fmt: skip


def test_the_tier_that_decides_is_named() -> None:
    ctx = _world()
    everyone = [{"namespaces": {}}]
    _cnp(ctx, "lockdown", "Admin", 10, {"name": "all", "action": "Deny", "from": everyone})
    code, out = _explain(ctx, "--from", "x/a", "--to", "y/b", "--port", "80/TCP")
    ingress = next(d for d in out["directions"] if d["direction"] == "ingress")
    assert code == 0 and out["allowed"] is False
    assert ingress["tier"] == "admin" and ingress["decided_by"] == "clusternetworkpolicy/lockdown"
    reason = "ingress[0] (all) of Admin ClusterNetworkPolicy lockdown (priority 10) denies"
    assert reason in ingress["reason"]
    # a Pass at a higher precedence hands the decision back to the NetworkPolicy
    _cnp(ctx, "defer", "Admin", 1, {"action": "Pass", "from": everyone})
    code, out = _explain(ctx, "--from", "x/a", "--to", "y/b", "--port", "80/TCP")
    ingress = next(d for d in out["directions"] if d["direction"] == "ingress")
    assert out["allowed"] is True and ingress["tier"] == "networkpolicy"
    # the table names the tier too
    result = CliRunner().invoke(
        cli, ["policy", "explain", "--from", "x/a", "--to", "y/b", "--port", "80/TCP"], obj=ctx
    )
    assert result.exit_code == 0 and "TIER" in result.output and "networkpolicy" in result.output


def test_a_baseline_policy_decides_only_where_no_networkpolicy_selects() -> None:
    ctx = _world()
    deny_all = {"action": "Deny", "from": [{"namespaces": {}}]}
    _cnp(ctx, "isolate-x", "Baseline", 1, deny_all, on="x")
    _cnp(ctx, "isolate-y", "Baseline", 1, deny_all, on="y")
    _, out = _explain(ctx, "--from", "y/b", "--to", "x/a", "--port", "80/TCP")
    ingress = next(d for d in out["directions"] if d["direction"] == "ingress")
    assert out["allowed"] is False and ingress["tier"] == "baseline"  # no NetworkPolicy in x
    assert ingress["decided_by"] == "clusternetworkpolicy/isolate-x"
    _, out = _explain(ctx, "--from", "x/a", "--to", "y/b", "--port", "80/TCP")
    ingress = next(d for d in out["directions"] if d["direction"] == "ingress")
    assert out["allowed"] is True and ingress["tier"] == "networkpolicy"  # y/only-a selects b


def test_policy_list_orders_the_tiers_and_reports_ties() -> None:
    ctx = _world()
    deny = {"action": "Deny", "from": [{"namespaces": {}}]}
    _cnp(ctx, "b-second", "Admin", 5, deny)
    _cnp(ctx, "a-first", "Admin", 5, deny)
    _cnp(ctx, "early", "Admin", 1, deny)
    _cnp(ctx, "floor", "Baseline", 0, deny)
    result = CliRunner().invoke(cli, ["policy", "list", "-o", "json"], obj=ctx)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [(r["tier"], r["name"]) for r in out["policies"]] == [
        ("Admin", "early"),
        ("Admin", "a-first"),
        ("Admin", "b-second"),
        ("NetworkPolicy", "y/only-a"),
        ("Baseline", "floor"),
    ]
    assert out["policies"][3]["ingress"] == 1 and out["policies"][3]["egress"] == "-"
    assert out["ties"] == [{"tier": "Admin", "priority": 5, "policies": ["a-first", "b-second"]}]
    table = CliRunner().invoke(cli, ["policy", "list"], obj=ctx)
    assert table.exit_code == 0 and "y/only-a" in table.output
    assert "Admin priority 5 is shared by a-first, b-second" in table.output
