"""ClusterNetworkPolicy → iptables chains, and the tiers in an endpoint's chain.

Each ClusterNetworkPolicy compiles, like a NetworkPolicy and with the same peer, port
and named-port matches (``policy.compiler``), into at most two shared chains,
``cali-ci-_<hash>`` (ingress) and ``cali-co-_<hash>`` (egress), independent of pods.
Its rules keep their order, and each rule's lines end in its action:

* Accept: set the accept mark (``0x10000``); after the rule, RETURN if it is set;
* Deny: DROP (final, as for a NetworkPolicy's default deny);
* Pass: set the pass mark (``0x20000``); after the rule, RETURN if it is set.

An endpoint chain with ClusterNetworkPolicies (``compiler.endpoint_chains``) then
reads, for one direction::

    clear the accept and pass marks
    Admin policies, by priority:   -m mark --mark 0x0/0x20000 -j cali-ci-...   (skipped
                                   once a Pass set the mark); RETURN if accepted
    NetworkPolicies (if any select the pod): jumps as before, then DROP
    (only if none does) clear the pass mark; Baseline policies as the Admin ones
    set the accept mark (the default: allowed)

so an Admin Accept or Deny is final, a Pass skips the rest of the Admin tier, a
NetworkPolicy decides for the pods it selects, and Baseline decides only for the rest.
``nodes`` peers are resolved here, from the Nodes given, into a set of their
addresses (a Node change recompiles the policies that have such a peer).
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from policy.cluster_policy import (
    Action,
    ClusterNetworkPolicy,
    ClusterPeer,
    ClusterPolicyRule,
    Networks,
    NodeSelection,
    Tier,
    evaluation_order,
)
from policy.errors import PolicyError
from policy.ipsets import IPSetSpec, NetSet
from policy.matches import (
    NOT_PASSED,
    RETURN_IF_ACCEPTED,
    RETURN_IF_PASSED,
    SET_ACCEPT,
    SET_PASS,
    CompiledPolicy,
    Compiling,
    add_set,
    address_match,
    peer_match,
    port_match,
)
from policy.model import (
    IPAddress,
    IPBlock,
    Pod,
    PodSelection,
    PortSpec,
    _field,
    _labels,
    _metadata,
)
from policy.naming import cluster_policy_chain_name
from policy.rules import Chain, Rule
from policy.selectors import LabelSelector

_TARGETS = {Action.ACCEPT: SET_ACCEPT, Action.DENY: Rule((), "DROP"), Action.PASS: SET_PASS}
_AFTER = {Action.ACCEPT: RETURN_IF_ACCEPTED, Action.PASS: RETURN_IF_PASSED}


@dataclass(frozen=True)
class NodeAddresses:
    """What a ``nodes`` peer selects of a Node: its labels and the IPs of its
    ``status.addresses``."""

    name: str
    label_items: tuple[tuple[str, str], ...] = ()
    ips: tuple[IPAddress, ...] = ()

    def selected_by(self, selector: LabelSelector) -> bool:
        return selector.matches(dict(self.label_items))


def make_node(
    name: str, labels: Mapping[str, str] | None = None, ips: Iterable[str] = ()
) -> NodeAddresses:
    """Convenience constructor from plain values (tests; the agent uses parse_node)."""
    return NodeAddresses(
        name, tuple(sorted((labels or {}).items())), tuple(ipaddress.ip_address(i) for i in ips)
    )


def parse_node(obj: Any) -> NodeAddresses:
    """A Node dict as ``nodes`` peers see it: its name, labels and every entry of
    ``status.addresses`` that is an IP (not a Hostname)."""
    _, name = _metadata(obj, "node", namespaced=False)
    try:
        labels = _labels(obj["metadata"], "metadata.labels")
        status = _field(obj, "status", dict, "status") or {}
        ips: list[IPAddress] = []
        for i, entry in enumerate(_field(status, "addresses", list, "status.addresses") or []):
            if not isinstance(entry, dict) or not isinstance(entry.get("address"), str):
                raise PolicyError(
                    "must be an object with an address", path=f"status.addresses[{i}]"
                )
            with contextlib.suppress(ValueError):
                ips.append(ipaddress.ip_address(entry["address"]))
    except PolicyError as err:
        raise PolicyError(err.detail, obj=f"node {name}", path=err.path) from None
    return NodeAddresses(name, labels, tuple(dict.fromkeys(ips)))


def compile_cluster_policy(
    policy: ClusterNetworkPolicy, family: int = 4, nodes: tuple[NodeAddresses, ...] = ()
) -> CompiledPolicy:
    """The policy's shared chains (None for a direction it has no rules for)."""
    sets: dict[str, IPSetSpec] = {}
    chains: dict[str, Chain | None] = {}
    for direction, rules in (("ingress", policy.ingress), ("egress", policy.egress)):
        if not rules:
            chains[direction] = None
            continue
        ctx = Compiling(policy, direction, family, sets)
        body: list[Rule] = []
        for rule in rules:
            body.extend(_rule_lines(ctx, rule, nodes))
        chains[direction] = Chain(cluster_policy_chain_name(policy.name, direction), tuple(body))
    return CompiledPolicy(
        key=policy.key,
        ingress=chains["ingress"],
        egress=chains["egress"],
        ipsets=tuple(sets[name] for name in sorted(sets)),
    )


@lru_cache(maxsize=4096)
def compile_cluster_cached(
    policy: ClusterNetworkPolicy, family: int, nodes: tuple[NodeAddresses, ...]
) -> CompiledPolicy:
    """Policies are immutable values: an unchanged one (and Nodes) is compiled once."""
    return compile_cluster_policy(policy, family, nodes)


def _rule_lines(
    ctx: Compiling, rule: ClusterPolicyRule, nodes: tuple[NodeAddresses, ...]
) -> list[Rule]:
    """The rule's match lines with its action, then its RETURN (Accept, Pass)."""
    effective = rule.effective()
    if effective is None:
        return []
    target = _TARGETS[effective.action]
    lines = [
        Rule(port_match(port) + match, target.target, target.target_args)
        for peer in effective.peers
        for port in (effective.ports or (None,))
        for match in _peer_matches(ctx, peer, port, nodes)
    ]
    after = _AFTER.get(effective.action)
    return [*lines, after] if lines and after is not None else lines


def _peer_matches(
    ctx: Compiling, peer: ClusterPeer, port: PortSpec | None, nodes: tuple[NodeAddresses, ...]
) -> list[tuple[str, ...]]:
    """Address matches for one peer in this family; [] when it can match nothing."""
    if isinstance(peer, PodSelection):
        return [address_match(ctx, peer, port)]
    if isinstance(peer, Networks):  # each CIDR as an ipBlock without excepts
        return [peer_match(ctx, IPBlock(c)) for c in peer.cidrs if c.version == ctx.family]
    if isinstance(peer, NodeSelection):
        ips = sorted(
            {ip for n in nodes if n.selected_by(peer.selector) for ip in n.ips
             if ip.version == ctx.family}
        )  # fmt: skip
        if not ips:
            return []
        prefix = 32 if ctx.family == 4 else 128
        nets = tuple(ipaddress.ip_network(f"{ip}/{prefix}") for ip in ips)
        name = add_set(ctx.sets, NetSet(ctx.family, nets))
        return [("-m", "set", "--match-set", name, ctx.side)]
    return []  # domainNames: not implemented, matches nothing


# ---------------------------------------------------------------- endpoint chains


def cluster_policies_for(
    pod: Pod,
    policies: Iterable[ClusterNetworkPolicy],
    namespace_labels: Mapping[str, str],
    direction: str,
    tier: Tier,
) -> list[ClusterNetworkPolicy]:
    """The tier's policies whose subject holds ``pod`` and that have rules for
    ``direction``, in evaluation order. Host-network pods are no subject."""
    if pod.host_network:
        return []
    return [
        p
        for p in evaluation_order(policies)
        if p.tier is tier
        and (p.ingress if direction == "ingress" else p.egress)
        and p.subject.matches(pod, namespace_labels)
    ]


def tier_jumps(policies: list[ClusterNetworkPolicy], direction: str) -> list[Rule]:
    """One tier's jumps: each runs only while no Pass was taken, and an Accept returns."""
    rules: list[Rule] = []
    for policy in policies:
        rules.append(Rule(NOT_PASSED, cluster_policy_chain_name(policy.name, direction)))
        rules.append(RETURN_IF_ACCEPTED)
    return rules
