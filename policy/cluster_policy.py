"""ClusterNetworkPolicy (``policy.networking.k8s.io/v1beta1``) as frozen, validated values.

The administrator's policies of sigs.k8s.io/network-policy-api, in two tiers around
the namespaced NetworkPolicies: **Admin** (evaluated first; its Accept and Deny are
final) and **Baseline** (evaluated only for traffic no NetworkPolicy decided). Inside a
tier, policies run in ``priority`` order (0 first) and each policy's rules in the
order written; the first rule that matches decides with its action:

* ``Accept``: allowed for this direction, nothing after it in any tier is consulted
  (an egress Accept still needs the destination's ingress, as for NetworkPolicy);
* ``Deny``: dropped;
* ``Pass``: the rest of this tier is skipped and the next tier decides (Admin →
  NetworkPolicy → Baseline → the default, which allows).

What this module decides where the API leaves room:

* Equal priorities in one tier: the API lets an implementation pick any order;
  Tabby orders them by name and reports the tie (:func:`priority_ties`).
* A peer with no field Tabby knows (a newer CRD than this parser) *fails closed*,
  as the API asks: an Accept rule with it matches nothing, a Deny or Pass rule
  with it becomes a Deny of all traffic (:attr:`ClusterPolicyRule.fails_closed`).
* ``domainNames`` peers (experimental; DNS-based, Accept only) are not implemented:
  such a peer matches nothing, so its Accept rule never widens access.
* ``destinationNamedPort`` has no protocol: it matches the destination pod's
  container port of that name with whichever protocol that port declares.
* Host-network pods are neither subjects nor pod peers (their address is the node's).

Validation mirrors the CRD's schema and CEL rules, so an object the apiserver would
refuse is refused here too, with :class:`~policy.errors.PolicyError` naming the field.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from policy.errors import PolicyError
from policy.model import (
    PROTOCOLS,
    IPNetwork,
    PodSelection,
    PortSpec,
    _field,
    _metadata,
    _parse_port_value,
    _reject_unknown,
)
from policy.selectors import EVERYTHING, LabelSelector, parse_selector

API_VERSIONS = ("policy.networking.k8s.io/v1beta1", "policy.networking.k8s.io/v1alpha2")
KIND = "ClusterNetworkPolicy"
MAX_PRIORITY = 1000
MAX_RULES = 25  # per direction, and peers and protocols per rule


class Tier(StrEnum):
    """Where a ClusterNetworkPolicy sits relative to NetworkPolicy."""

    ADMIN = "Admin"
    BASELINE = "Baseline"


class Action(StrEnum):
    """What a matching rule does."""

    ACCEPT = "Accept"
    DENY = "Deny"
    PASS = "Pass"


@dataclass(frozen=True)
class NodeSelection:
    """An egress peer: the addresses in ``status.addresses`` of the matching Nodes."""

    selector: LabelSelector = EVERYTHING


@dataclass(frozen=True)
class Networks:
    """An egress peer: any address in these CIDRs, pods' included."""

    cidrs: tuple[IPNetwork, ...]


@dataclass(frozen=True)
class DomainNames:
    """An egress peer by DNS name: not implemented, so it matches nothing."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class UnknownPeer:
    """A peer with no field this parser knows: the rule fails closed."""

    fields: tuple[str, ...]


ClusterPeer = PodSelection | NodeSelection | Networks | DomainNames | UnknownPeer


@dataclass(frozen=True)
class ClusterPolicyRule:
    """One rule: its action applies to traffic from/to any of ``peers`` on any of
    ``ports`` (an empty ``ports`` is every port and protocol)."""

    action: Action
    peers: tuple[ClusterPeer, ...]
    ports: tuple[PortSpec, ...] = ()
    name: str = ""

    @property
    def fails_closed(self) -> bool:
        """A peer Tabby cannot read is present (see the module's notes)."""
        return any(isinstance(p, UnknownPeer) for p in self.peers)

    def effective(self) -> ClusterPolicyRule | None:
        """The rule as enforced: None if it can match nothing; a Deny of all
        traffic if it fails closed with Deny or Pass."""
        if self.fails_closed:
            if self.action is Action.ACCEPT:
                return None
            return ClusterPolicyRule(Action.DENY, (ANY_PEER,), (), self.name)
        return self


# What a failed-closed Deny matches: every source or destination, inside the cluster
# or not.
ANY_PEER = Networks((ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")))


@dataclass(frozen=True)
class ClusterNetworkPolicy:
    """A validated ClusterNetworkPolicy. A direction without rules is not affected."""

    name: str
    tier: Tier
    priority: int
    subject: PodSelection
    ingress: tuple[ClusterPolicyRule, ...] = ()
    egress: tuple[ClusterPolicyRule, ...] = ()

    @property
    def key(self) -> str:
        """The policy's identity (cluster-scoped: its name)."""
        return self.name

    @property
    def target(self) -> PodSelection:
        """The pods this policy applies to (where an ingress named port resolves)."""
        return self.subject

    @property
    def order(self) -> tuple[int, int, str]:
        """Evaluation order across all ClusterNetworkPolicies: Admin before Baseline,
        then priority, then name (Tabby's choice for equal priorities)."""
        return (0 if self.tier is Tier.ADMIN else 1, self.priority, self.name)


def evaluation_order(policies: Iterable[ClusterNetworkPolicy]) -> list[ClusterNetworkPolicy]:
    """Policies in the order the dataplane consults them."""
    return sorted(policies, key=lambda p: p.order)


def priority_ties(policies: Iterable[ClusterNetworkPolicy]) -> dict[tuple[Tier, int], list[str]]:
    """(tier, priority) shared by more than one policy → their names, in the order Tabby
    applies them: what a user should be told, since the API leaves such order open."""
    groups: dict[tuple[Tier, int], list[str]] = {}
    for policy in evaluation_order(policies):
        groups.setdefault((policy.tier, policy.priority), []).append(policy.name)
    return {k: names for k, names in groups.items() if len(names) > 1}


# ---------------------------------------------------------------- parsing


def parse_cluster_policy(obj: Any) -> ClusterNetworkPolicy:
    """Validate a ClusterNetworkPolicy dict as the apiserver returns it."""
    _, name = _metadata(obj, "clusternetworkpolicy", namespaced=False)
    try:
        if obj.get("kind") not in (None, KIND):
            raise PolicyError(f"kind {obj.get('kind')!r} is not {KIND}", path="kind")
        if obj.get("apiVersion") not in (None, *API_VERSIONS):
            raise PolicyError(
                f"apiVersion {obj.get('apiVersion')!r} is not one of {', '.join(API_VERSIONS)}",
                path="apiVersion",
            )
        return _parse_spec(obj, name)
    except PolicyError as err:
        raise PolicyError(err.detail, obj=f"clusternetworkpolicy {name}", path=err.path) from None


def _parse_spec(obj: dict[str, Any], name: str) -> ClusterNetworkPolicy:
    spec = _field(obj, "spec", dict, "spec")
    if spec is None:
        raise PolicyError("spec is required", path="spec")
    _reject_unknown(spec, {"tier", "priority", "subject", "ingress", "egress"}, "spec")
    tier = spec.get("tier")
    if tier not in tuple(Tier):
        raise PolicyError(f"{tier!r} is not Admin or Baseline", path="spec.tier")
    priority = spec.get("priority")
    if not _is_int(priority) or not 0 <= priority <= MAX_PRIORITY:
        raise PolicyError(f"{priority!r} must be an integer from 0 to 1000", path="spec.priority")
    return ClusterNetworkPolicy(
        name=name,
        tier=Tier(tier),
        priority=priority,
        subject=_parse_subject(spec.get("subject"), "spec.subject"),
        ingress=_parse_rules(spec, "ingress", "from"),
        egress=_parse_rules(spec, "egress", "to"),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_field(obj: Any, allowed: set[str], path: str) -> tuple[str, Any]:
    """The single set field of a one-of object (subject, peer, protocol)."""
    if not isinstance(obj, dict):
        raise PolicyError("must be an object", path=path)
    present = sorted(k for k, v in obj.items() if v is not None)
    if len(present) != 1:
        raise PolicyError(
            f"exactly one of {sorted(allowed)} must be set, got {present or 'none'}", path=path
        )
    return present[0], obj[present[0]]


def _parse_subject(obj: Any, path: str) -> PodSelection:
    key, value = _one_field(obj, {"namespaces", "pods"}, path)
    if key == "namespaces":
        return PodSelection(None, parse_selector(value, f"{path}.namespaces"))
    if key == "pods":
        return _parse_namespaced_pod(value, f"{path}.pods")
    raise PolicyError(f"unknown field {key!r}; expected namespaces or pods", path=path)


def _parse_namespaced_pod(obj: Any, path: str) -> PodSelection:
    if not isinstance(obj, dict):
        raise PolicyError("must be an object", path=path)
    _reject_unknown(obj, {"namespaceSelector", "podSelector"}, path)
    if obj.get("podSelector") is None:
        raise PolicyError("podSelector is required", path=f"{path}.podSelector")
    return PodSelection(
        None,
        parse_selector(obj.get("namespaceSelector"), f"{path}.namespaceSelector"),
        parse_selector(obj["podSelector"], f"{path}.podSelector"),
    )


def _parse_rules(
    spec: dict[str, Any], direction: str, peer_key: str
) -> tuple[ClusterPolicyRule, ...]:
    rules = _field(spec, direction, list, f"spec.{direction}") or []
    _at_most(rules, f"spec.{direction}")
    return tuple(
        _parse_rule(rule, direction, peer_key, f"spec.{direction}[{i}]")
        for i, rule in enumerate(rules)
    )


def _at_most(items: list[Any], path: str) -> None:
    if len(items) > MAX_RULES:
        raise PolicyError(f"{len(items)} entries; at most {MAX_RULES} are allowed", path=path)


def _parse_rule(obj: Any, direction: str, peer_key: str, path: str) -> ClusterPolicyRule:
    if not isinstance(obj, dict):
        raise PolicyError("a rule must be an object", path=path)
    _reject_unknown(obj, {"name", "action", peer_key, "protocols"}, path)
    name = _field(obj, "name", str, f"{path}.name") or ""
    if len(name) > 100:
        raise PolicyError("at most 100 characters", path=f"{path}.name")
    action = obj.get("action")
    if action not in tuple(Action):
        raise PolicyError(f"{action!r} is not Accept, Deny or Pass", path=f"{path}.action")
    peers = _field(obj, peer_key, list, f"{path}.{peer_key}") or []
    if not peers:
        raise PolicyError("at least one peer is required", path=f"{path}.{peer_key}")
    _at_most(peers, f"{path}.{peer_key}")
    parsed_peers = tuple(
        _parse_peer(p, direction, f"{path}.{peer_key}[{i}]") for i, p in enumerate(peers)
    )
    protocols = _field(obj, "protocols", list, f"{path}.protocols")
    if protocols is not None and not protocols:
        raise PolicyError("must have at least one entry when set", path=f"{path}.protocols")
    _at_most(protocols or [], f"{path}.protocols")
    ports = tuple(
        spec
        for i, p in enumerate(protocols or [])
        for spec in _parse_protocol(p, f"{path}.protocols[{i}]")
    )
    if any(p.is_named for p in ports) and any(
        isinstance(p, (Networks, NodeSelection, DomainNames)) for p in parsed_peers
    ):
        raise PolicyError(
            "networks/nodes/domainNames peers cannot be combined with destinationNamedPort: "
            "they have no named ports",
            path=path,
        )
    return ClusterPolicyRule(Action(action), parsed_peers, ports, name)


_INGRESS_PEERS = {"namespaces", "pods"}
_EGRESS_PEERS = {"namespaces", "pods", "nodes", "networks", "domainNames"}


def _parse_peer(obj: Any, direction: str, path: str) -> ClusterPeer:
    allowed = _INGRESS_PEERS if direction == "ingress" else _EGRESS_PEERS
    if not isinstance(obj, dict):
        raise PolicyError("a peer must be an object", path=path)
    present = sorted(k for k, v in obj.items() if v is not None)
    known = [k for k in present if k in allowed]
    if not known:  # a field from a newer API than this parser: fail closed
        return UnknownPeer(tuple(present))
    key, value = _one_field(obj, allowed, path)
    if key == "namespaces":
        return PodSelection(None, parse_selector(value, f"{path}.namespaces"))
    if key == "pods":
        return _parse_namespaced_pod(value, f"{path}.pods")
    if key == "nodes":
        return NodeSelection(parse_selector(value, f"{path}.nodes"))
    if key == "networks":
        return Networks(_parse_networks(value, f"{path}.networks"))
    return DomainNames(_parse_domain_names(value, f"{path}.domainNames"))


def _parse_networks(value: Any, path: str) -> tuple[IPNetwork, ...]:
    if not isinstance(value, list) or not value:
        raise PolicyError("must be a non-empty array of CIDRs", path=path)
    _at_most(value, path)
    out = []
    for i, raw in enumerate(value):
        try:
            if not isinstance(raw, str) or "/" not in raw:
                raise ValueError("not in CIDR notation")
            out.append(ipaddress.ip_network(raw, strict=True))
        except ValueError as err:
            raise PolicyError(
                f"{raw!r} is not a CIDR with its host bits zero ({err})", path=f"{path}[{i}]"
            ) from None
    return tuple(dict.fromkeys(out))


def _parse_domain_names(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise PolicyError("must be a non-empty array of domain names", path=path)
    return tuple(value)


def _parse_protocol(obj: Any, path: str) -> tuple[PortSpec, ...]:
    """One ``protocols[]`` entry as the PortSpecs it matches (a named port: one per
    protocol, since the container port's own protocol decides)."""
    key, value = _one_field(obj, {"tcp", "udp", "sctp", "destinationNamedPort"}, path)
    if key == "destinationNamedPort":
        name = _parse_port_value(value, f"{path}.destinationNamedPort")
        if not isinstance(name, str):
            raise PolicyError("must be a port name", path=f"{path}.destinationNamedPort")
        return tuple(PortSpec(protocol, name) for protocol in PROTOCOLS)
    protocol = key.upper()
    if protocol not in PROTOCOLS:
        raise PolicyError(f"unknown field {key!r}", path=path)
    return (_parse_destination_port(value, protocol, f"{path}.{key}"),)


def _parse_destination_port(obj: Any, protocol: str, path: str) -> PortSpec:
    if not isinstance(obj, dict):
        raise PolicyError("must be an object", path=path)
    _reject_unknown(obj, {"destinationPort"}, path)
    port = obj.get("destinationPort")
    if port is None:
        raise PolicyError("destinationPort is required", path=f"{path}.destinationPort")
    key, value = _one_field(port, {"number", "range"}, f"{path}.destinationPort")
    if key == "number":
        return PortSpec(protocol, _port_number(value, f"{path}.destinationPort.number"))
    if key != "range" or not isinstance(value, dict):
        raise PolicyError("must set number or range", path=f"{path}.destinationPort")
    rpath = f"{path}.destinationPort.range"
    _reject_unknown(value, {"start", "end"}, rpath)
    start = _port_number(value.get("start"), f"{rpath}.start")
    end = _port_number(value.get("end"), f"{rpath}.end")
    if start >= end:
        raise PolicyError(f"start {start} must be less than end {end}", path=rpath)
    return PortSpec(protocol, start, end)


def _port_number(value: Any, path: str) -> int:
    if not _is_int(value) or not 1 <= value <= 65535:
        raise PolicyError(f"{value!r} must be a port number from 1 to 65535", path=path)
    return int(value)
