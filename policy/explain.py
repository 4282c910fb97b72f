"""Why a connection is allowed or denied: the one explanation ``tabbyctl diagnose``
and ``tabbyctl policy explain`` give.

A connection needs the client's egress and the server's ingress. Each direction
is answered tier by tier, from the compilers' own parsing and policy selection:
the Admin ClusterNetworkPolicies (the first matching rule's Accept or Deny decides,
a Pass moves on), then the NetworkPolicies (:func:`policy.policies_for`: the first
selecting policy with a rule whose peers and ports match allows, else the isolation
denies), then, for a pod no NetworkPolicy selects, the Baseline ones, then the
default (allowed). The unit tests hold it to the truth-table oracle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policy.cluster_compiler import NodeAddresses, cluster_policies_for
from policy.cluster_policy import (
    Action,
    ClusterNetworkPolicy,
    ClusterPeer,
    ClusterPolicyRule,
    Networks,
    NodeSelection,
    Tier,
)
from policy.compiler import policies_for
from policy.model import (
    IPBlock,
    Namespace,
    NetworkPolicy,
    Pod,
    PodSelection,
    PortSpec,
    make_namespace,
)


@dataclass(frozen=True)
class Verdict:
    """One direction's answer and the policy that decided it (None: not isolated)."""

    direction: str  # "egress" (of the client) or "ingress" (of the server)
    subject: str  # the pod whose policies decide, namespace/name
    allowed: bool
    policy: str | None
    reason: str
    tier: str = "default"  # "admin", "networkpolicy", "baseline" or "default"


def port_matches(spec: PortSpec, protocol: str, port: int, dst: Pod) -> bool:
    """Protocol equal; then no port, a number, a range, or a name the destination declares."""
    if spec.protocol != protocol:
        return False
    if spec.port is None:
        return True
    if isinstance(spec.port, int):
        return spec.port <= port <= (spec.end_port or spec.port)
    return dst.named_port(spec.port, protocol) == port


def peer_matches(peer: PodSelection | IPBlock, remote: Pod, remote_ns: Namespace) -> bool:
    """ipBlock by address; selectors by the remote pod and its namespace's labels."""
    if isinstance(peer, IPBlock):
        return any(peer.contains(ip) for ip in remote.ips)
    if remote.host_network:
        return False
    return peer.matches(remote, remote_ns.labels)


@dataclass(frozen=True)
class Connection:
    """One direction's question: the pod whose policies decide, the other end (and its
    namespace), the server, and the protocol and port."""

    subject: Pod
    direction: str
    remote: Pod
    remote_ns: Namespace
    dst: Pod
    protocol: str
    port: int


def explain(
    subject: Pod,
    direction: str,
    remote: Pod,
    remote_ns: Namespace,
    dst: Pod,
    protocol: str,
    port: int,
    policies: Sequence[NetworkPolicy],
    cluster: TierInputs | None = None,
) -> Verdict:
    """One direction, tier by tier (see the module's docstring)."""
    conn = Connection(subject, direction, remote, remote_ns, dst, protocol, port)
    cluster = cluster or TierInputs()
    passed: list[str] = []
    admin = _tier_verdict(conn, cluster, Tier.ADMIN, passed)
    if admin is not None:
        return admin
    selecting = policies_for(subject, policies, direction)
    if selecting:
        return _networkpolicy_verdict(conn, selecting)
    baseline = _tier_verdict(conn, cluster, Tier.BASELINE, passed)
    if baseline is not None:
        return baseline
    reason = f"no policy isolates {subject.key} for {direction}"
    if passed:
        reason += f" ({'; '.join(passed)})"
    return Verdict(direction, subject.key, True, None, reason)


@dataclass(frozen=True)
class TierInputs:
    """What the ClusterNetworkPolicy tiers need: the policies, the subject's namespace
    labels, and the Nodes (``nodes`` peers)."""

    policies: Sequence[ClusterNetworkPolicy] = ()
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None
    nodes: Sequence[NodeAddresses] = ()


def _tier_verdict(
    conn: Connection, cluster: TierInputs, tier: Tier, passed: list[str]
) -> Verdict | None:
    """The first matching rule of the tier's policies: Accept/Deny decide, a Pass ends
    the tier (noted in ``passed``); None when the tier did not decide."""
    if not cluster.policies:
        return None
    labels = (cluster.namespace_labels or {}).get(conn.subject.namespace)
    labels = labels if labels is not None else make_namespace(conn.subject.namespace).labels
    chosen = cluster_policies_for(conn.subject, cluster.policies, labels, conn.direction, tier)
    for policy in chosen:
        rules = policy.ingress if conn.direction == "ingress" else policy.egress
        for index, rule in enumerate(rules):
            effective = rule.effective()
            if effective is None or not _cluster_rule_matches(conn, effective, cluster.nodes):
                continue
            named = f" ({rule.name})" if rule.name else ""
            where = f"{conn.direction}[{index}]{named} of {tier.value} ClusterNetworkPolicy "
            where += f"{policy.name} (priority {policy.priority})"
            if effective.action is Action.PASS:
                passed.append(f"passed by {where}")
                return None
            allowed = effective.action is Action.ACCEPT
            verb = "accepts" if allowed else "denies"
            if rule.fails_closed:
                verb += " (a peer Tabby does not know: failed closed)"
            return Verdict(
                conn.direction,
                conn.subject.key,
                allowed,
                f"clusternetworkpolicy/{policy.name}",
                f"{where} {verb}",
                tier.value.lower(),
            )
    return None


def _cluster_rule_matches(
    conn: Connection, rule: ClusterPolicyRule, nodes: Sequence[NodeAddresses]
) -> bool:
    ports_ok = not rule.ports or any(
        port_matches(p, conn.protocol, conn.port, conn.dst) for p in rule.ports
    )
    return ports_ok and any(
        _cluster_peer_matches(p, conn.remote, conn.remote_ns, nodes) for p in rule.peers
    )


def _cluster_peer_matches(
    peer: ClusterPeer, remote: Pod, remote_ns: Namespace, nodes: Sequence[NodeAddresses]
) -> bool:
    """Pod peers as NetworkPolicy's; networks by address (pods' too); nodes by the
    selected Nodes' addresses; anything else (domainNames) matches nothing."""
    if isinstance(peer, PodSelection):
        return peer_matches(peer, remote, remote_ns)
    if isinstance(peer, Networks):
        return any(
            ip in cidr for ip in remote.ips for cidr in peer.cidrs if ip.version == cidr.version
        )
    if isinstance(peer, NodeSelection):
        addresses = {ip for n in nodes if n.selected_by(peer.selector) for ip in n.ips}
        return any(ip in addresses for ip in remote.ips)
    return False


def _networkpolicy_verdict(conn: Connection, selecting: Sequence[NetworkPolicy]) -> Verdict:
    """The first selecting policy with a matching rule allows, else the isolation denies."""
    direction, subject, remote, dst = conn.direction, conn.subject, conn.remote, conn.dst
    protocol, port, remote_ns = conn.protocol, conn.port, conn.remote_ns
    for policy in selecting:
        rules = (policy.ingress if direction == "ingress" else policy.egress) or ()
        for index, rule in enumerate(rules):
            ports_ok = not rule.ports or any(
                port_matches(p, protocol, port, dst) for p in rule.ports
            )
            peers_ok = not rule.peers or any(peer_matches(p, remote, remote_ns) for p in rule.peers)
            if ports_ok and peers_ok:
                reason = f"{direction}[{index}] of {policy.key} allows"
                return Verdict(direction, subject.key, True, policy.key, reason, "networkpolicy")
    names = ", ".join(p.key for p in selecting)
    reason = f"isolated by {names}; no {direction} rule allows"
    return Verdict(direction, subject.key, False, selecting[0].key, reason, "networkpolicy")


def explain_connection(
    src: Pod,
    dst: Pod,
    namespaces: Mapping[str, Namespace],
    policies: Sequence[NetworkPolicy],
    protocol: str,
    port: int,
    cluster_policies: Sequence[ClusterNetworkPolicy] = (),
    nodes: Sequence[NodeAddresses] = (),
) -> tuple[Verdict, Verdict]:
    """The client's egress and the server's ingress; allowed only if both allow."""
    src_ns = namespaces.get(src.namespace, make_namespace(src.namespace))
    dst_ns = namespaces.get(dst.namespace, make_namespace(dst.namespace))
    cluster = TierInputs(cluster_policies, {n: ns.labels for n, ns in namespaces.items()}, nodes)
    egress = explain(src, "egress", dst, dst_ns, dst, protocol, port, policies, cluster)
    ingress = explain(dst, "ingress", src, src_ns, dst, protocol, port, policies, cluster)
    return egress, ingress
