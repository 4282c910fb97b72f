"""An independent NetworkPolicy evaluator, written from the API reference.

It works on the raw API dicts and shares no code with ``policy/``: it exists to
catch the compiler and the oracle disagreeing.  It answers one question: may a
NEW connection from ``src`` to ``dst`` on (protocol, port) be made?

Spec text it follows (networking.k8s.io/v1):

* A pod is isolated for ingress (egress) if some policy in its namespace
  selects it and has Ingress (Egress) in policyTypes.  policyTypes, if empty,
  defaults to Ingress plus Egress when ``spec.egress`` has entries.
* Non-isolated: everything allowed.  Isolated: allowed iff at least one rule
  of one selecting policy matches (rules and policies are additive).
* A rule matches if its ports (empty = all) and peers (empty = all) match.
* A peer with only podSelector: pods in the policy's namespace; with
  namespaceSelector: pods in matching namespaces (and matching podSelector if
  given); ipBlock: the IP is in cidr (masked) and not in any except.
* A port matches if protocol (default TCP) matches and port is absent, equal,
  within ``port..endPort``, or a name that the *destination* pod declares
  with the same protocol and this number.
* A connection needs the source's egress AND the destination's ingress.

Tabby's chosen behaviour where the spec leaves room: hostNetwork pods are not
pods for selectors (their IP is the node's); an unknown namespace has only its
``kubernetes.io/metadata.name`` label.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Endpoint:
    """A connection end: a pod dict, or an address outside any pod."""

    ip: str
    pod: dict[str, Any] | None = None


@dataclass(frozen=True)
class Connection:
    """What the server side of a connection looks like: where it goes, how."""

    dst: Endpoint
    protocol: str
    port: int


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """LabelSelector semantics: all matchLabels and all expressions must hold."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


class Oracle:
    """Evaluates connections for a fixed set of policies, pods and namespaces."""

    def __init__(
        self,
        policies: list[dict[str, Any]],
        namespaces: list[dict[str, Any]],
    ) -> None:
        self.policies = policies
        self.ns_labels = {
            ns["metadata"]["name"]: {
                **(ns["metadata"].get("labels") or {}),
                "kubernetes.io/metadata.name": ns["metadata"]["name"],
            }
            for ns in namespaces
        }

    def allowed(self, src: Endpoint, dst: Endpoint, protocol: str, port: int) -> bool:
        """Client egress AND server ingress."""
        conn = Connection(dst, protocol, port)
        egress_ok = src.pod is None or self._direction_ok(src.pod, "Egress", dst, conn)
        ingress_ok = dst.pod is None or self._direction_ok(dst.pod, "Ingress", src, conn)
        return egress_ok and ingress_ok

    def _labels_of_namespace(self, name: str) -> dict[str, str]:
        """Namespace labels, or just the automatic name label."""
        return self.ns_labels.get(name, {"kubernetes.io/metadata.name": name})

    def _direction_ok(
        self, subject: dict[str, Any], ptype: str, remote: Endpoint, conn: Connection
    ) -> bool:
        """Is ``subject`` isolated for ``ptype``, and if so does a rule allow?"""
        if subject.get("spec", {}).get("hostNetwork"):
            return True
        selecting = [p for p in self.policies if self._selects(p, subject, ptype)]
        if not selecting:
            return True
        key, peer_key = ("ingress", "from") if ptype == "Ingress" else ("egress", "to")
        return any(
            self._rule_matches(rule, peer_key, p["metadata"]["namespace"], remote, conn)
            for p in selecting
            for rule in p["spec"].get(key) or []
        )

    @staticmethod
    def _selects(policy: dict[str, Any], pod: dict[str, Any], ptype: str) -> bool:
        """Policy namespace == pod namespace, podSelector matches, type applies."""
        spec = policy["spec"]
        types = spec.get("policyTypes") or (
            ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]
        )
        return (
            ptype in types
            and policy["metadata"]["namespace"] == pod["metadata"]["namespace"]
            and selector_matches(spec.get("podSelector"), pod["metadata"].get("labels") or {})
        )

    def _rule_matches(
        self,
        rule: dict[str, Any],
        peer_key: str,
        policy_ns: str,
        remote: Endpoint,
        conn: Connection,
    ) -> bool:
        """Ports (empty = any) AND peers (empty = any)."""
        ports = rule.get("ports") or []
        peers = rule.get(peer_key) or []
        port_ok = not ports or any(_port_matches(p, conn) for p in ports)
        peer_ok = not peers or any(self._peer_matches(p, policy_ns, remote) for p in peers)
        return port_ok and peer_ok

    def _peer_matches(self, peer: dict[str, Any], policy_ns: str, remote: Endpoint) -> bool:
        """ipBlock on the address; selectors only on (non-hostNetwork) pods."""
        block = peer.get("ipBlock")
        if block is not None:
            return _in_ip_block(block, remote.ip)
        pod = remote.pod
        if pod is None or pod.get("spec", {}).get("hostNetwork"):
            return False
        pod_ns = pod["metadata"]["namespace"]
        ns_sel = peer.get("namespaceSelector")
        if ns_sel is None:
            if pod_ns != policy_ns:
                return False
        elif not selector_matches(ns_sel, self._labels_of_namespace(pod_ns)):
            return False
        return selector_matches(peer.get("podSelector"), pod["metadata"].get("labels") or {})


def _in_ip_block(block: dict[str, Any], ip_text: str) -> bool:
    """Inside cidr (masked), outside every except."""
    ip = ipaddress.ip_address(ip_text)
    cidr = ipaddress.ip_network(block["cidr"], strict=False)
    if ip.version != cidr.version or ip not in cidr:
        return False
    return not any(ip in ipaddress.ip_network(e, strict=False) for e in block.get("except") or [])


def _port_matches(spec: dict[str, Any], conn: Connection) -> bool:
    """Protocol must match; then no port, a number, a range or a name."""
    dst, protocol, port = conn.dst, conn.protocol, conn.port
    if (spec.get("protocol") or "TCP") != protocol:
        return False
    want = spec.get("port")
    if want is None:
        return True
    if isinstance(want, int):
        return want <= port <= (spec.get("endPort") or want)
    if dst.pod is None:
        return False
    for container in dst.pod.get("spec", {}).get("containers") or []:
        for cport in container.get("ports") or []:
            if (
                cport.get("name") == want
                and (cport.get("protocol") or "TCP") == protocol
                and cport["containerPort"] == port
            ):
                return True
    return False
