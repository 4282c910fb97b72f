"""`tabbyctl policy explain`: would a connection pass, and which policy decides it;
`tabbyctl policy list`: every policy in evaluation order; `tabbyctl policy wait`: until
every node has programmed a policy's current generation (:mod:`policy.realization`).

A connection needs the client's egress and the server's ingress; each direction is
answered with the tier (Admin or Baseline ClusterNetworkPolicy, NetworkPolicy, or the
default), the deciding policy and rule, or the default that applies (no policy
isolates the pod: allowed). The evaluation is :mod:`policy.explain`, the one
`tabbyctl diagnose` uses, over the policy compilers' own parsing and policy selection.
"""

from __future__ import annotations

import re
import time
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
from policy.realization import (
    NodeHealth,
    NodeReport,
    Realization,
    cluster_policy_key,
    networkpolicy_key,
    parse_node_health,
    parse_report,
    realization,
    version_of,
)
from tabbyctl.diagnose import parse_port, split_key
from tabbyctl.output import emit_data, emit_table, fail, output_option, warn


@click.group("policy")
def policy() -> None:
    """Explain, list and wait for NetworkPolicy and ClusterNetworkPolicy."""


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
    raw_cluster = _cluster_raw(obj)
    cluster = _parse_cluster(raw_cluster)
    ordered = evaluation_order(cluster)
    realized = _Realized.read(obj)
    by_name = {r["metadata"]["name"]: r for r in raw_cluster}
    rows = [_cluster_row(p, realized, by_name[p.name]) for p in ordered if p.tier is Tier.ADMIN]
    for raw in sorted(
        obj.datastore.list_raw(kinds.NETWORKPOLICY)[0],
        key=lambda r: (r["metadata"]["namespace"], r["metadata"]["name"]),
    ):
        rows.append(_networkpolicy_row(raw, realized))
    rows += [_cluster_row(p, realized, by_name[p.name]) for p in ordered if p.tier is Tier.BASELINE]
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
        ["TIER", "PRIORITY", "NAME", "INGRESS RULES", "EGRESS RULES", "REALIZED"],
        [
            [r["tier"], r["priority"], r["name"], r["ingress"], r["egress"], _cell(r["realized"])]
            for r in rows
        ],
    )
    for tie in ties:
        warn(
            f"{tie['tier']} priority {tie['priority']} is shared by "
            f"{', '.join(tie['policies'])}: Tabby applies them in that (name) order; give "
            "each its own priority if the order matters"
        )


class _Realized:
    """The nodes' reports and health, read once, for each policy's REALIZED cell."""

    def __init__(self, reports: dict[str, NodeReport] | None, nodes: list[NodeHealth]) -> None:
        self.reports, self.nodes = reports, nodes

    @classmethod
    def read(cls, obj: Any, warned: set[str] | None = None) -> _Realized:
        """Read now; ``warned`` holds the warnings already printed (a polling caller)."""
        try:
            raw_reports, _ = obj.datastore.list_raw(kinds.NODEPOLICYSTATUS)
        except NotFound:
            warn("NodePolicyStatus is not installed (no CRD): realization is not reported")
            return cls(None, [])
        reports = {}
        for item in raw_reports:
            try:
                report = parse_report(item)
            except PolicyError as err:
                message = f"skipping a node's policy status: {err}"
                if warned is None or message not in warned:
                    warn(message)
                if warned is not None:
                    warned.add(message)
                continue
            reports[report.node] = report
        nodes = [parse_node_health(n) for n in obj.datastore.list_raw(kinds.NODE)[0]]
        return cls(reports, nodes)

    def of(self, key: str, raw: dict[str, Any]) -> dict[str, Any] | None:
        if self.reports is None:
            return None
        state = realization(key, version_of(raw), self.reports, self.nodes)
        return {
            "generation": state.version.generation,
            "desiredNodes": state.desired,
            "currentNodes": state.current,
            "pending": [p.node for p in state.pending],
        }


def _cell(realized: dict[str, Any] | None) -> str:
    """``2/3`` or ``1/3 (pending: node-c)``; ``-`` where nothing is reported."""
    if realized is None:
        return "-"
    text = f"{realized['currentNodes']}/{realized['desiredNodes']}"
    return text + (f" (pending: {', '.join(realized['pending'])})" if realized["pending"] else "")


def _cluster_row(
    policy: ClusterNetworkPolicy, realized: _Realized, raw: dict[str, Any]
) -> dict[str, Any]:
    return {
        "tier": policy.tier.value,
        "priority": policy.priority,
        "name": policy.name,
        "ingress": len(policy.ingress),
        "egress": len(policy.egress),
        "realized": realized.of(cluster_policy_key(policy.name), raw),
    }


def _networkpolicy_row(raw: dict[str, Any], realized: _Realized) -> dict[str, Any]:
    """A NetworkPolicy's row: its rule counts ("-": the direction is not isolated), or
    "invalid" (the agents skip it too), and how far its generation has reached."""
    meta = raw["metadata"]
    name = f"{meta['namespace']}/{meta['name']}"
    row: dict[str, Any] = {"tier": "NetworkPolicy", "priority": None, "name": name}
    try:
        parsed = parse_policy(raw)
    except PolicyError as err:
        warn(f"invalid policy, skipped by the agents: {err}")
        return {**row, "ingress": "invalid", "egress": "invalid", "realized": None}
    row["ingress"] = "-" if parsed.ingress is None else len(parsed.ingress)
    row["egress"] = "-" if parsed.egress is None else len(parsed.egress)
    row["realized"] = realized.of(networkpolicy_key(meta["namespace"], meta["name"]), raw)
    return row


def _cluster_inputs(
    obj: Any, with_nodes: bool = True
) -> tuple[list[ClusterNetworkPolicy], list[NodeAddresses]]:
    """The ClusterNetworkPolicies (none, with a warning, where the CRD is not installed)
    and the Nodes their ``nodes`` peers select."""
    cluster = _parse_cluster(_cluster_raw(obj))
    nodes = []
    for raw in obj.datastore.list_raw(kinds.NODE)[0] if cluster and with_nodes else []:
        try:
            nodes.append(parse_node(raw))
        except PolicyError as err:
            warn(f"skipping node: {err}")
    return cluster, nodes


# -- wait: until every node has programmed the policy's current generation ----------------
POLICY_KINDS = {
    "networkpolicy": "np",
    "networkpolicies": "np",
    "netpol": "np",
    "np": "np",
    "clusternetworkpolicy": "cnp",
    "clusternetworkpolicies": "cnp",
    "cnp": "cnp",
}
POLL_S = 0.2
PROGRESS_S = 5.0  # how often a long wait says what it still waits for


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``2m``, ``500ms`` in seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", text.strip())
    if not match:
        raise ValueError(f"invalid duration {text!r}: use e.g. 30s, 2m or 500ms")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]


def parse_policy_ref(ref: str, namespace: str) -> tuple[str, str, str | None]:
    """``networkpolicy/NAME`` or ``clusternetworkpolicy/NAME`` (kubectl's spelling, or
    np/netpol/cnp) -> (kind ``np`` or ``cnp``, name, namespace or None)."""
    kind_text, sep, name = ref.partition("/")
    kind = POLICY_KINDS.get(kind_text.lower())
    if not sep or kind is None or not name or "/" in name:
        raise ValueError(
            f"{ref!r}: name the policy as networkpolicy/NAME (with -n NAMESPACE) or "
            "clusternetworkpolicy/NAME"
        )
    return kind, name, (namespace if kind == "np" else None)


@policy.command("wait")
@click.argument("ref", metavar="KIND/NAME")
@click.option("-n", "--namespace", default="default", show_default=True,
              help="The NetworkPolicy's namespace.")  # fmt: skip
@click.option("--timeout", "timeout_text", default="60s", show_default=True,
              help="Give up after this long (e.g. 30s, 2m).")  # fmt: skip
@output_option
@click.pass_obj
def wait(obj: Any, ref: str, namespace: str, timeout_text: str, output: str) -> None:
    """Wait until every node has programmed the policy's current generation.

    KIND/NAME is networkpolicy/NAME or clusternetworkpolicy/NAME. Exits 0 once no
    node is behind (the table shows each node), 1 on timeout, naming every node still
    behind and why (its agent published nothing, an older generation, the node is not
    Ready)."""
    try:
        kind, name, ns = parse_policy_ref(ref, namespace)
        timeout = parse_duration(timeout_text)
    except ValueError as err:
        fail(str(err))
        raise
    deadline = time.monotonic() + timeout
    last_progress = time.monotonic()
    warned: set[str] = set()  # each warning once, not once a poll
    while True:
        state = _realization_now(obj, kind, name, ns, warned)
        now = time.monotonic()
        if state.done or now >= deadline:
            break
        if now - last_progress >= PROGRESS_S:
            last_progress = now
            click.echo(f"waiting: {state.summary()} nodes, {_pending_text(state)}", err=True)
        time.sleep(min(POLL_S, max(0.0, deadline - now)))
    rows = [{"node": p.node, "state": "pending", "reason": p.reason} for p in state.pending]
    data = {
        "policy": ref if kind == "cnp" else f"{ref} -n {ns}",
        "generation": state.version.generation,
        "desiredNodes": state.desired,
        "currentNodes": state.current,
        "realized": state.done,
        "pending": rows,
    }
    if output != "table":
        emit_data(data, output)
    elif rows:
        emit_table(
            f"{data['policy']} generation {state.version.generation}: "
            f"{state.summary()} nodes, NOT realized",
            ["NODE", "STATE", "REASON"],
            [[r["node"], r["state"], r["reason"]] for r in rows],
        )
    else:
        where = f"on {state.summary()} nodes" if state.desired else "(it selects no pod yet)"
        click.echo(f"{data['policy']} generation {state.version.generation}: realized {where}")
    if not state.done:
        fail(f"timed out after {timeout_text}: {_pending_text(state)}", code=1)


def _pending_text(state: Realization) -> str:
    return "; ".join(f"{p.node} {p.reason}" for p in state.pending) or "nothing pending"


def _realization_now(
    obj: Any, kind: str, name: str, namespace: str | None, warned: set[str]
) -> Realization:
    """The policy's current version against the nodes' reports, read now."""
    resource = kinds.NETWORKPOLICY if kind == "np" else kinds.CLUSTERNETWORKPOLICY
    shown = f"networkpolicy {namespace}/{name}" if kind == "np" else f"clusternetworkpolicy {name}"
    try:
        raw = obj.datastore.get_raw(resource, name, namespace)
    except NotFound:
        fail(f"{shown} not found")
        raise
    try:
        parse_policy(raw) if kind == "np" else parse_cluster_policy(raw)
    except PolicyError as err:
        fail(f"{shown} is invalid, so no agent programs it: {err}", code=1)
        raise
    key = networkpolicy_key(namespace or "", name) if kind == "np" else cluster_policy_key(name)
    now = _Realized.read(obj, warned)
    if now.reports is None:
        fail("NodePolicyStatus is not installed (no CRD): the agents publish no realization")
    return realization(key, version_of(raw), now.reports or {}, now.nodes)


def _cluster_raw(obj: Any) -> list[dict[str, Any]]:
    """The ClusterNetworkPolicy objects (none, with a warning, without the CRD)."""
    try:
        raw_cluster: list[dict[str, Any]] = obj.datastore.list_raw(kinds.CLUSTERNETWORKPOLICY)[0]
    except NotFound:
        warn("ClusterNetworkPolicy is not installed (no CRD): NetworkPolicy only")
        return []
    return raw_cluster


def _parse_cluster(raw_cluster: list[dict[str, Any]]) -> list[ClusterNetworkPolicy]:
    cluster = []
    for raw in raw_cluster:
        try:
            cluster.append(parse_cluster_policy(raw))
        except PolicyError as err:
            warn(f"skipping invalid policy: {err}")
    return cluster
