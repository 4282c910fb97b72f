"""Compile NetworkPolicies into iptables chains and ipset specifications.

Design (Calico's mark approach)
-------------------------------
Each policy is compiled once, independent of pods, into at most two shared
chains: ``cali-pi-_<hash>`` for its ingress rules and ``cali-po-_<hash>`` for
its egress rules.  A NetworkPolicy rule becomes one iptables rule per
(peer, port) pair; a match sets the accept mark (``0x10000``) and, after each
NetworkPolicy rule, ``-m mark --mark 0x10000/0x10000 -j RETURN`` skips the
rest.  Policy chains never ACCEPT or DROP: they only report "allowed".

Every local endpoint gets two chains:

``cali-fw-<iface>`` (from workload: the pod's egress), in order
  1. anti-spoofing: drop unless the source is the pod's own IP;
  2. ``RELATED,ESTABLISHED`` → the allow action (replies always pass), ``INVALID`` →
     DROP;
  3. clear the accept mark;
  4. for each policy that selects the pod and has Egress: jump to its
     ``cali-po`` chain, RETURN if the accept mark is now set;
  5. at least one such policy → DROP (default deny); none → set the accept mark.

``cali-tw-<iface>`` (to workload: the pod's ingress) is the same without
anti-spoofing and with ``cali-pi`` chains.

Contract with the dataplane: when an endpoint chain returns, the packet is
allowed for that direction iff the accept mark is set; DROP is final.  The
FORWARD path runs the source's ``cali-fw`` chain, then the destination's
``cali-tw`` chain (each clears the mark first, so one direction's allow never
leaks into the other); the mark, if still set, is accepted at the bottom of the
kernel's FORWARD chain, after other programs' rules (kube-proxy's REJECT for a
Service without endpoints) had their say.  Thus a connection needs the client's
egress AND the server's ingress.

Peers and ports:

* pod peers (selectors) match a :class:`~policy.ipsets.SelectorSet` of pod IPs
  (``src`` for ingress, ``dst`` for egress);
* an ipBlock matches ``-s``/``-d <cidr>`` (omitted for /0) and, when it has
  excepts, ``! --match-set <NetSet>`` on the same address, so excepted
  addresses fall through to later rules (which may still allow them);
* numeric ports: ``-p <proto> -m <proto> --dport N`` or ``N:M`` for endPort;
  a protocol without a port matches every port of that protocol;
* named ports match ``--match-set <NamedPortSet> dst,dst`` (destination IP
  and port together), which resolves the name on the destination pod.  For
  ingress the set covers the pods the policy selects; for egress it covers
  the peer's pods, or every pod in the cluster when the peer is an ipBlock or
  the rule has no peers.

Only one address family is compiled at a time (``family`` 4 or 6): ipBlocks
of the other family are left out, and a rule left with no peers of this
family matches nothing (it never widens into "any peer").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from policy.cluster_compiler import (
    NodeAddresses,
    cluster_policies_for,
    compile_cluster_cached,
    tier_jumps,
)
from policy.cluster_policy import ClusterNetworkPolicy, Tier
from policy.ipsets import IPSetSpec, ipset_members
from policy.matches import (
    ACCEPT_MARK,
    CLEAR_ACCEPT,
    CLEAR_MARKS,
    CLEAR_PASS,
    RETURN_IF_ACCEPTED,
    SET_ACCEPT,
    CompiledPolicy,
    Compiling,
    address_match,
    port_match,
)
from policy.model import (
    IPBlock,
    Namespace,
    NetworkPolicy,
    Peer,
    Pod,
    PolicyRule,
    PortSpec,
    make_namespace,
)
from policy.naming import endpoint_chain_names, policy_chain_name
from policy.rules import Chain, Rule

__all__ = [
    "ACCEPT_MARK",
    "ALLOW_ACTIONS",
    "CLEAR_ACCEPT",
    "CONNTRACK_ACCEPT",
    "RETURN_IF_ACCEPTED",
    "SET_ACCEPT",
    "CompiledPolicy",
    "DesiredState",
    "EndpointChains",
    "compile_policy",
    "desired_state",
    "endpoint_chains",
    "policies_for",
]

CONNTRACK_ACCEPT = Rule(("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"), "ACCEPT")
# What an allowed reply gets in an endpoint chain: ACCEPT, or RETURN to let the
# kernel's chains after Tabby's still decide (Calico's IptablesFilterAllowAction).
ALLOW_ACTIONS = ("ACCEPT", "RETURN")
CONNTRACK_DROP_INVALID = Rule(("-m", "conntrack", "--ctstate", "INVALID"), "DROP")
DEFAULT_DROP = Rule((), "DROP")


@dataclass(frozen=True)
class EndpointChains:
    """The two per-endpoint chains of one local pod interface."""

    to_workload: Chain
    from_workload: Chain


@dataclass(frozen=True)
class DesiredState:
    """Everything one node needs for one address family."""

    chains: Mapping[str, Chain] = field(default_factory=dict)
    ipsets: Mapping[str, IPSetSpec] = field(default_factory=dict)
    members: Mapping[str, frozenset[str]] = field(default_factory=dict)


# ---------------------------------------------------------------- policy chains


def compile_policy(policy: NetworkPolicy, family: int = 4) -> CompiledPolicy:
    """Compile ``policy`` into its shared chains; depends on no pod."""
    sets: dict[str, IPSetSpec] = {}
    ingress = _compile_direction(policy, Compiling(policy, "ingress", family, sets), policy.ingress)
    egress = _compile_direction(policy, Compiling(policy, "egress", family, sets), policy.egress)
    return CompiledPolicy(
        key=policy.key,
        ingress=ingress,
        egress=egress,
        ipsets=tuple(sets[name] for name in sorted(sets)),
    )


def _compile_direction(
    policy: NetworkPolicy, ctx: Compiling, rules: tuple[PolicyRule, ...] | None
) -> Chain | None:
    """One chain for one direction; None when the policy does not isolate it."""
    if rules is None:
        return None
    body: list[Rule] = []
    for rule in rules:
        lines = list(_rule_lines(ctx, rule))
        if lines:
            body.extend(lines)
            body.append(RETURN_IF_ACCEPTED)
    return Chain(policy_chain_name(policy.key, ctx.direction), tuple(body))


def _rule_lines(ctx: Compiling, rule: PolicyRule) -> Iterable[Rule]:
    """One MARK rule per (peer, port); an empty list means "any"."""
    peers: tuple[Peer | None, ...] = rule.peers or (None,)
    ports: tuple[PortSpec | None, ...] = rule.ports or (None,)
    for peer in peers:
        if isinstance(peer, IPBlock) and peer.cidr.version != ctx.family:
            continue
        for port in ports:
            match = port_match(port) + address_match(ctx, peer, port)
            yield Rule(match, SET_ACCEPT.target, SET_ACCEPT.target_args)


# ---------------------------------------------------------------- endpoint chains


@lru_cache(maxsize=8192)
def _compile_cached(policy: NetworkPolicy, family: int) -> CompiledPolicy:
    """Policies are immutable values: an unchanged policy is compiled once."""
    return compile_policy(policy, family)


def policies_for(
    pod: Pod, policies: Iterable[NetworkPolicy], direction: str
) -> list[NetworkPolicy]:
    """Policies that select ``pod`` and isolate ``direction``, in a stable order."""
    chosen = [
        p
        for p in policies
        if p.selects(pod) and (p.ingress if direction == "ingress" else p.egress) is not None
    ]
    return sorted(chosen, key=lambda p: p.key)


@dataclass(frozen=True)
class ClusterTiers:
    """The ClusterNetworkPolicies of one pod and direction, by tier, in evaluation order."""

    admin: tuple[ClusterNetworkPolicy, ...] = ()
    baseline: tuple[ClusterNetworkPolicy, ...] = ()

    @classmethod
    def of(
        cls,
        pod: Pod,
        cluster_policies: Iterable[ClusterNetworkPolicy],
        namespace_labels: Mapping[str, str],
        direction: str,
    ) -> ClusterTiers:
        policies = list(cluster_policies)
        if not policies:  # the common case: no sorting, no matching
            return NO_TIERS
        return cls(
            *(
                tuple(cluster_policies_for(pod, policies, namespace_labels, direction, tier))
                for tier in (Tier.ADMIN, Tier.BASELINE)
            )
        )


NO_TIERS = ClusterTiers()


def endpoint_chains(
    pod: Pod,
    policies: Iterable[NetworkPolicy],
    iface: str,
    family: int = 4,
    allow: str = "ACCEPT",
    tiers: Mapping[str, ClusterTiers] | None = None,
) -> EndpointChains:
    """``cali-tw-<iface>`` and ``cali-fw-<iface>`` for a local pod; ``tiers`` holds
    the ClusterNetworkPolicies that apply to it, by direction."""
    tw_name, fw_name = endpoint_chain_names(iface)
    policy_list = list(policies)
    tiers = tiers or {}
    to_wl = _conntrack_rules(allow) + _policy_jumps(
        pod, policy_list, "ingress", tiers.get("ingress", NO_TIERS)
    )
    from_wl = _anti_spoof(pod, family) + _conntrack_rules(allow)
    from_wl += _policy_jumps(pod, policy_list, "egress", tiers.get("egress", NO_TIERS))
    return EndpointChains(Chain(tw_name, to_wl), Chain(fw_name, from_wl))


def _conntrack_rules(allow: str = "ACCEPT") -> tuple[Rule, ...]:
    """Replies of allowed connections pass (or return); broken ones never do."""
    if allow not in ALLOW_ACTIONS:
        raise ValueError(f"allow action must be one of {ALLOW_ACTIONS}, not {allow!r}")
    return (Rule(CONNTRACK_ACCEPT.match, allow), CONNTRACK_DROP_INVALID)


def _anti_spoof(pod: Pod, family: int) -> tuple[Rule, ...]:
    """A pod may only send from its own address (at most one per family)."""
    ips = pod.ips_of(family)
    if not ips:
        return (Rule((), "DROP"),)
    prefix = 32 if family == 4 else 128
    return (Rule(("!", "-s", f"{ips[0]}/{prefix}"), "DROP"),)


def _policy_jumps(
    pod: Pod, policies: list[NetworkPolicy], direction: str, tiers: ClusterTiers
) -> tuple[Rule, ...]:
    """Clear the marks, try the Admin tier, each NetworkPolicy, then default deny; or,
    when no NetworkPolicy selects the pod, the Baseline tier and the default allow.
    Without ClusterNetworkPolicies only the accept mark is used."""
    chosen = policies_for(pod, policies, direction)
    rules = [CLEAR_MARKS if tiers.admin or tiers.baseline else CLEAR_ACCEPT]
    rules += tier_jumps(list(tiers.admin), direction)
    for policy in chosen:
        rules.append(Rule((), policy_chain_name(policy.key, direction)))
        rules.append(RETURN_IF_ACCEPTED)
    if chosen:
        rules.append(DEFAULT_DROP)
        return tuple(rules)
    if tiers.baseline:
        rules.append(CLEAR_PASS)
        rules += tier_jumps(list(tiers.baseline), direction)
    rules.append(SET_ACCEPT)
    return tuple(rules)


# ---------------------------------------------------------------- one node


def desired_state(
    policies: Iterable[NetworkPolicy],
    pods: Iterable[Pod],
    namespaces: Iterable[Namespace],
    local_endpoints: Mapping[str, Pod],
    family: int = 4,
    allow: str = "ACCEPT",
    cluster_policies: Iterable[ClusterNetworkPolicy] = (),
    nodes: Iterable[NodeAddresses] = (),
) -> DesiredState:
    """Chains and ipsets for the endpoints on one node (``iface`` → pod).

    ``allow`` is what an endpoint chain does with replies of allowed connections
    (``ACCEPT`` or ``RETURN``); new connections are only ever marked.

    Only policies that apply to some local endpoint are compiled, and only the
    sets their chains use are listed, so a node carries what it needs.
    ClusterNetworkPolicies add their tiers around the NetworkPolicies (``nodes``:
    the Nodes whose addresses their ``nodes`` peers select).
    """
    # A policy only ever selects pods of its own namespace: index once, so a pod is
    # matched against its namespace's policies, not the cluster's.
    by_namespace: dict[str, list[NetworkPolicy]] = {}
    for policy in policies:
        by_namespace.setdefault(policy.namespace, []).append(policy)
    chains: dict[str, Chain] = {}
    specs: dict[str, IPSetSpec] = {}
    used: dict[str, NetworkPolicy] = {}
    used_cluster: dict[str, ClusterNetworkPolicy] = {}
    cluster_list = list(cluster_policies)
    namespace_list = list(namespaces)
    ns_labels = {ns.name: ns.labels for ns in namespace_list}
    for iface, pod in sorted(local_endpoints.items()):
        candidates = by_namespace.get(pod.namespace, [])
        labels = ns_labels.get(pod.namespace) or make_namespace(pod.namespace).labels
        tiers = {d: ClusterTiers.of(pod, cluster_list, labels, d) for d in ("ingress", "egress")}
        eps = endpoint_chains(pod, candidates, iface, family, allow, tiers)
        chains[eps.to_workload.name] = eps.to_workload
        chains[eps.from_workload.name] = eps.from_workload
        for direction in ("ingress", "egress"):
            used.update((p.key, p) for p in policies_for(pod, candidates, direction))
            for tier in (tiers[direction].admin, tiers[direction].baseline):
                used_cluster.update((p.name, p) for p in tier)
    compiled = [_compile_cached(used[key], family) for key in sorted(used)]
    node_tuple = tuple(sorted(nodes, key=lambda n: n.name))
    compiled += [
        compile_cluster_cached(used_cluster[name], family, node_tuple)
        for name in sorted(used_cluster)
    ]
    for one in compiled:
        chains.update((c.name, c) for c in one.chains)
        specs.update((s.name, s) for s in one.ipsets)
    return DesiredState(chains, specs, ipset_members(specs.values(), pods, namespace_list))
