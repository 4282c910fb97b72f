"""`tabbyctl policy explain`: would a connection pass, and which policy decides it.

A connection needs the client's egress and the server's ingress; each direction is
answered with the tier (Admin or Baseline ClusterNetworkPolicy, NetworkPolicy, or the
default), the deciding policy and rule, or the default that applies (no policy
isolates the pod: allowed). The evaluation is :mod:`policy.explain`, the one
`tabbyctl diagnose` uses, over the policy compilers' own parsing and policy selection.
"""

from __future__ import annotations

from typing import Any

import click

from datastore import kinds
from datastore.errors import NotFound
from policy import PolicyError, parse_namespace, parse_pod, parse_policy
from policy.cluster_compiler import NodeAddresses, parse_node
from policy.cluster_policy import (
    ClusterNetworkPolicy,
    Tier,
    evaluation_order,
    parse_cluster_policy,
    priority_ties,
)
from policy.explain import explain_connection
from tabbyctl.diagnose import parse_port, split_key
from tabbyctl.output import emit_data, emit_table, fail, output_option, warn


@click.group("policy")
def policy() -> None:
    """Explain NetworkPolicy and ClusterNetworkPolicy decisions."""


def _pod(ctx_obj: Any, key: str) -> dict[str, Any]:
    namespace, name = split_key(key)
    try:
        raw: dict[str, Any] = ctx_obj.datastore.get_raw(kinds.POD, name, namespace)
    except NotFound:
        fail(f"pod {namespace}/{name} not found")
        raise
    return raw


@policy.command("explain")
@click.option("--from", "source", required=True, help="Client pod, NAMESPACE/NAME.")
@click.option("--to", "target", required=True, help="Server pod, NAMESPACE/NAME.")
@click.option("--port", "port_text", required=True, help="PORT/PROTOCOL, e.g. 80/TCP.")
@output_option
@click.pass_obj
def explain(obj: Any, source: str, target: str, port_text: str, output: str) -> None:
    """The verdict for each direction and the policy and rule that decide it."""
    try:
        port, protocol = parse_port(port_text)
    except ValueError as err:
        fail(str(err))
        raise
    try:
        src, dst = parse_pod(_pod(obj, source)), parse_pod(_pod(obj, target))
    except PolicyError as err:
        fail(f"cannot evaluate: {err}")
        raise
    raw_namespaces, _ = obj.datastore.list_raw(kinds.NAMESPACE)
    namespaces = {n.name: n for n in map(parse_namespace, raw_namespaces)}
    policies = []
    for raw in obj.datastore.list_raw(kinds.NETWORKPOLICY)[0]:
        try:
            policies.append(parse_policy(raw))
        except PolicyError as err:
            warn(f"skipping invalid policy: {err}")
    cluster, nodes = _cluster_inputs(obj)
    rows = []
    verdicts = explain_connection(src, dst, namespaces, policies, protocol, port, cluster, nodes)
    for v in verdicts:
        rows.append(
            {
                "direction": v.direction,
                "pod": v.subject,
                "verdict": "allow" if v.allowed else "deny",
                "tier": v.tier,
                "decided_by": v.policy or "default (not isolated)",
                "reason": v.reason,
            }
        )
    allowed = all(r["verdict"] == "allow" for r in rows)
    if output != "table":
        emit_data(
            {
                "from": src.key,
                "to": dst.key,
                "port": f"{port}/{protocol}",
                "allowed": allowed,
                "directions": rows,
            },
            output,
        )
        return
    emit_table(
        f"{src.key} -> {dst.key} {port}/{protocol}: {'ALLOWED' if allowed else 'DENIED'}",
        ["DIRECTION", "POD", "VERDICT", "TIER", "DECIDED BY", "REASON"],
        [
            [r["direction"], r["pod"], r["verdict"], r["tier"], r["decided_by"], r["reason"]]
            for r in rows
        ],
    )


@policy.command("list")
@output_option
@click.pass_obj
def list_policies(obj: Any, output: str) -> None:
    """Every policy in the order a connection meets them: Admin ClusterNetworkPolicies by
    priority, NetworkPolicies, Baseline ClusterNetworkPolicies; equal priorities in one
    tier are reported (the API leaves their order open: Tabby applies them by name)."""
    cluster, _ = _cluster_inputs(obj, with_nodes=False)
    ordered = evaluation_order(cluster)
    rows = [_cluster_row(p) for p in ordered if p.tier is Tier.ADMIN]
    for raw in sorted(
        obj.datastore.list_raw(kinds.NETWORKPOLICY)[0],
        key=lambda r: (r["metadata"]["namespace"], r["metadata"]["name"]),
    ):
        rows.append(_networkpolicy_row(raw))
    rows += [_cluster_row(p) for p in ordered if p.tier is Tier.BASELINE]
    shared = priority_ties(cluster)
    ties: list[dict[str, Any]] = [
        {"tier": tier.value, "priority": priority, "policies": names}
        for (tier, priority), names in shared.items()
    ]
    if output != "table":
        emit_data({"policies": rows, "ties": ties}, output)
        return
    emit_table(
        None,
        ["TIER", "PRIORITY", "NAME", "INGRESS RULES", "EGRESS RULES"],
        [[r["tier"], r["priority"], r["name"], r["ingress"], r["egress"]] for r in rows],
    )
    for tie in ties:
        warn(
            f"{tie['tier']} priority {tie['priority']} is shared by "
            f"{', '.join(tie['policies'])}: Tabby applies them in that (name) order; give "
            "each its own priority if the order matters"
        )


def _cluster_row(policy: ClusterNetworkPolicy) -> dict[str, Any]:
    return {
        "tier": policy.tier.value,
        "priority": policy.priority,
        "name": policy.name,
        "ingress": len(policy.ingress),
        "egress": len(policy.egress),
    }


def _networkpolicy_row(raw: dict[str, Any]) -> dict[str, Any]:
    """A NetworkPolicy's row: its rule counts ("-": the direction is not isolated), or
    "invalid" (the agents skip it too)."""
    meta = raw["metadata"]
    name = f"{meta['namespace']}/{meta['name']}"
    row: dict[str, Any] = {"tier": "NetworkPolicy", "priority": None, "name": name}
    try:
        parsed = parse_policy(raw)
    except PolicyError as err:
        warn(f"invalid policy, skipped by the agents: {err}")
        return {**row, "ingress": "invalid", "egress": "invalid"}
    row["ingress"] = "-" if parsed.ingress is None else len(parsed.ingress)
    row["egress"] = "-" if parsed.egress is None else len(parsed.egress)
    return row


def _cluster_inputs(
    obj: Any, with_nodes: bool = True
) -> tuple[list[ClusterNetworkPolicy], list[NodeAddresses]]:
    """The ClusterNetworkPolicies (none, with a warning, where the CRD is not installed)
    and the Nodes their ``nodes`` peers select."""
    try:
        raw_cluster, _ = obj.datastore.list_raw(kinds.CLUSTERNETWORKPOLICY)
    except NotFound:
        warn("ClusterNetworkPolicy is not installed (no CRD): NetworkPolicy only")
        raw_cluster = []
    cluster = []
    for raw in raw_cluster:
        try:
            cluster.append(parse_cluster_policy(raw))
        except PolicyError as err:
            warn(f"skipping invalid policy: {err}")
    nodes = []
    for raw in obj.datastore.list_raw(kinds.NODE)[0] if cluster and with_nodes else []:
        try:
            nodes.append(parse_node(raw))
        except PolicyError as err:
            warn(f"skipping node: {err}")
    return cluster, nodes
