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

ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1, from its API reference):

* Each direction is decided by tiers in turn: Admin, then NetworkPolicy, then
  Baseline, then the default (allow). Admin and Baseline consult the
  ClusterNetworkPolicies of their tier whose subject holds the pod, lowest
  ``priority`` first (Tabby breaks ties by name), each policy's rules in order.
* The first matching rule decides: Accept allows, Deny denies, Pass ends the
  tier and hands the decision to the next one.
* The NetworkPolicy tier decides only for pods some NetworkPolicy isolates.
* A rule matches if its ``protocols`` (absent = all) and one of its peers match.
  Peers: ``namespaces`` (pods in matching namespaces), ``pods`` (namespace AND
  pod selectors), egress-only ``nodes`` (an address in ``status.addresses`` of a
  matching Node), ``networks`` (the address is inside a CIDR: pods included),
  ``domainNames`` (Tabby implements none: matches nothing).
* A peer with no known field fails closed: an Accept rule with it matches
  nothing, a Deny or Pass rule with it denies everything.
* ``destinationNamedPort``: the destination pod has a container port of that
  name whose number and protocol are the connection's.
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


CNP_PEER_KINDS = {"namespaces", "pods", "nodes", "networks", "domainNames"}


class Oracle:
    """Evaluates connections for a fixed set of policies, pods and namespaces."""

    def __init__(
        self,
        policies: list[dict[str, Any]],
        namespaces: list[dict[str, Any]],
        cluster_policies: list[dict[str, Any]] | None = None,
        nodes: list[dict[str, Any]] | None = None,
    ) -> None:
        self.policies = policies
        self.cluster_policies = sorted(
            cluster_policies or [], key=lambda c: (c["spec"]["priority"], c["metadata"]["name"])
        )
        self.node_addresses = [
            (
                n["metadata"].get("labels") or {},
                {a["address"] for a in (n.get("status") or {}).get("addresses") or []},
            )
            for n in nodes or []
        ]
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
        admin = self._tier_verdict("Admin", subject, ptype, remote, conn)
        if admin is not None:
            return admin
        selecting = [p for p in self.policies if self._selects(p, subject, ptype)]
        key, peer_key = ("ingress", "from") if ptype == "Ingress" else ("egress", "to")
        if selecting:
            return any(
                self._rule_matches(rule, peer_key, p["metadata"]["namespace"], remote, conn)
                for p in selecting
                for rule in p["spec"].get(key) or []
            )
        baseline = self._tier_verdict("Baseline", subject, ptype, remote, conn)
        return True if baseline is None else baseline

    # -- ClusterNetworkPolicy ---------------------------------------------------------
    def _tier_verdict(
        self, tier: str, subject: dict[str, Any], ptype: str, remote: Endpoint, conn: Connection
    ) -> bool | None:
        """Accept → True, Deny → False; None when the tier passes or nothing matched."""
        key, peer_key = ("ingress", "from") if ptype == "Ingress" else ("egress", "to")
        for cnp in self.cluster_policies:
            spec = cnp["spec"]
            if spec["tier"] != tier or not self._cnp_subject(spec["subject"], subject):
                continue
            for rule in spec.get(key) or []:
                action = rule["action"]
                peers = rule[peer_key]
                if any(not (set(p) & CNP_PEER_KINDS) for p in peers):  # fails closed
                    if action == "Accept":
                        continue
                    return False
                if not self._cnp_ports_match(rule.get("protocols"), conn):
                    continue
                if not any(self._cnp_peer_matches(p, remote) for p in peers):
                    continue
                if action == "Pass":
                    return None
                return action == "Accept"
        return None

    def _cnp_subject(self, subject: dict[str, Any], pod: dict[str, Any]) -> bool:
        if "namespaces" in subject:
            return self._in_namespaces(subject["namespaces"], pod)
        pods = subject["pods"]
        return self._in_namespaces(pods.get("namespaceSelector"), pod) and selector_matches(
            pods["podSelector"], pod["metadata"].get("labels") or {}
        )

    def _in_namespaces(self, selector: dict[str, Any] | None, pod: dict[str, Any]) -> bool:
        return selector_matches(selector, self._labels_of_namespace(pod["metadata"]["namespace"]))

    def _cnp_peer_matches(self, peer: dict[str, Any], remote: Endpoint) -> bool:
        if "networks" in peer:
            ip = ipaddress.ip_address(remote.ip)
            return any(ip in ipaddress.ip_network(c) for c in peer["networks"])
        if "nodes" in peer:
            return any(
                remote.ip in addresses and selector_matches(peer["nodes"], labels)
                for labels, addresses in self.node_addresses
            )
        pod = remote.pod
        if pod is None or pod.get("spec", {}).get("hostNetwork"):
            return False
        if "namespaces" in peer:
            return self._in_namespaces(peer["namespaces"], pod)
        if "pods" in peer:
            return self._cnp_subject(peer, pod)
        return False  # domainNames

    @staticmethod
    def _cnp_ports_match(protocols: list[dict[str, Any]] | None, conn: Connection) -> bool:
        if not protocols:
            return True
        for entry in protocols:
            if "destinationNamedPort" in entry:
                if _named_port_is(conn, entry["destinationNamedPort"]):
                    return True
                continue
            [(proto, attrs)] = entry.items()
            if proto.upper() != conn.protocol:
                continue
            port = attrs["destinationPort"]
            if "number" in port and port["number"] == conn.port:
                return True
            if "range" in port and port["range"]["start"] <= conn.port <= port["range"]["end"]:
                return True
        return False

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
    protocol, port = conn.protocol, conn.port
    if (spec.get("protocol") or "TCP") != protocol:
        return False
    want = spec.get("port")
    if want is None:
        return True
    if isinstance(want, int):
        return want <= port <= (spec.get("endPort") or want)
    return _named_port_is(conn, want)


def _named_port_is(conn: Connection, name: str) -> bool:
    """The destination pod declares a port ``name`` with the connection's number and
    protocol."""
    if conn.dst.pod is None:
        return False
    for container in conn.dst.pod.get("spec", {}).get("containers") or []:
        for cport in container.get("ports") or []:
            if (
                cport.get("name") == name
                and (cport.get("protocol") or "TCP") == conn.protocol
                and cport["containerPort"] == conn.port
            ):
                return True
    return False
