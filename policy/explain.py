"""Why a connection is allowed or denied: the one explanation ``tabbyctl diagnose``
and ``tabbyctl policy explain`` give.

A connection needs the client's egress and the server's ingress. Each direction
is answered from the compiler's own parsing and policy selection
(:func:`policy.policies_for`): not isolated (allowed by default), or the first
selecting policy with a rule whose peers and ports match, or denied by the
policies that isolate the pod. The unit tests hold it to the truth-table oracle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


def explain(
    subject: Pod,
    direction: str,
    remote: Pod,
    remote_ns: Namespace,
    dst: Pod,
    protocol: str,
    port: int,
    policies: Sequence[NetworkPolicy],
) -> Verdict:
    """One direction: isolated by the compiler's policy selection? Then the first
    selecting policy with a matching rule allows, else the isolation denies."""
    selecting = policies_for(subject, policies, direction)
    if not selecting:
        reason = f"no policy isolates {subject.key} for {direction}"
        return Verdict(direction, subject.key, True, None, reason)
    for policy in selecting:
        rules = (policy.ingress if direction == "ingress" else policy.egress) or ()
        for index, rule in enumerate(rules):
            ports_ok = not rule.ports or any(
                port_matches(p, protocol, port, dst) for p in rule.ports
            )
            peers_ok = not rule.peers or any(peer_matches(p, remote, remote_ns) for p in rule.peers)
            if ports_ok and peers_ok:
                reason = f"{direction}[{index}] of {policy.key} allows"
                return Verdict(direction, subject.key, True, policy.key, reason)
    names = ", ".join(p.key for p in selecting)
    reason = f"isolated by {names}; no {direction} rule allows"
    return Verdict(direction, subject.key, False, selecting[0].key, reason)


def explain_connection(
    src: Pod,
    dst: Pod,
    namespaces: Mapping[str, Namespace],
    policies: Sequence[NetworkPolicy],
    protocol: str,
    port: int,
) -> tuple[Verdict, Verdict]:
    """The client's egress and the server's ingress; allowed only if both allow."""
    src_ns = namespaces.get(src.namespace, make_namespace(src.namespace))
    dst_ns = namespaces.get(dst.namespace, make_namespace(dst.namespace))
    egress = explain(src, "egress", dst, dst_ns, dst, protocol, port, policies)
    ingress = explain(dst, "ingress", src, src_ns, dst, protocol, port, policies)
    return egress, ingress
