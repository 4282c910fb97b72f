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

from policy.ipsets import IPSetSpec, NamedPortSet, NetSet, SelectorSet, ipset_members
from policy.model import (
    ALL_PODS,
    IPBlock,
    Namespace,
    NetworkPolicy,
    Peer,
    Pod,
    PodSelection,
    PolicyRule,
    PortSpec,
)
from policy.naming import endpoint_chain_names, policy_chain_name
from policy.rules import Chain, Rule

ACCEPT_MARK = 0x10000
_MARK = f"{ACCEPT_MARK:#x}/{ACCEPT_MARK:#x}"
SET_ACCEPT = Rule((), "MARK", ("--set-xmark", _MARK))
CLEAR_ACCEPT = Rule((), "MARK", ("--set-xmark", f"0x0/{ACCEPT_MARK:#x}"))
RETURN_IF_ACCEPTED = Rule(("-m", "mark", "--mark", _MARK), "RETURN")
CONNTRACK_ACCEPT = Rule(("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"), "ACCEPT")
# What an allowed reply gets in an endpoint chain: ACCEPT, or RETURN to let the
# kernel's chains after Tabby's still decide (Calico's IptablesFilterAllowAction).
ALLOW_ACTIONS = ("ACCEPT", "RETURN")
CONNTRACK_DROP_INVALID = Rule(("-m", "conntrack", "--ctstate", "INVALID"), "DROP")
DEFAULT_DROP = Rule((), "DROP")


@dataclass(frozen=True)
class CompiledPolicy:
    """A policy's chains (None for a direction it does not isolate) and the
    ipsets those chains refer to."""

    key: str
    ingress: Chain | None
    egress: Chain | None
    ipsets: tuple[IPSetSpec, ...]

    @property
    def chains(self) -> tuple[Chain, ...]:
        """The chains that exist, ingress first."""
        return tuple(c for c in (self.ingress, self.egress) if c is not None)


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


@dataclass
class _Compiling:
    """What every rule of one policy direction needs while it is compiled."""

    policy: NetworkPolicy
    direction: str
    family: int
    sets: dict[str, IPSetSpec]

    @property
    def side(self) -> str:
        """Which address is the peer's: the source for ingress, else the destination."""
        return "src" if self.direction == "ingress" else "dst"


def compile_policy(policy: NetworkPolicy, family: int = 4) -> CompiledPolicy:
    """Compile ``policy`` into its shared chains; depends on no pod."""
    sets: dict[str, IPSetSpec] = {}
    ingress = _compile_direction(_Compiling(policy, "ingress", family, sets), policy.ingress)
    egress = _compile_direction(_Compiling(policy, "egress", family, sets), policy.egress)
    return CompiledPolicy(
        key=policy.key,
        ingress=ingress,
        egress=egress,
        ipsets=tuple(sets[name] for name in sorted(sets)),
    )


def _compile_direction(ctx: _Compiling, rules: tuple[PolicyRule, ...] | None) -> Chain | None:
    """One chain for one direction; None when the policy does not isolate it."""
    if rules is None:
        return None
    body: list[Rule] = []
    for rule in rules:
        lines = list(_rule_lines(ctx, rule))
        if lines:
            body.extend(lines)
            body.append(RETURN_IF_ACCEPTED)
    return Chain(policy_chain_name(ctx.policy.key, ctx.direction), tuple(body))


def _rule_lines(ctx: _Compiling, rule: PolicyRule) -> Iterable[Rule]:
    """One MARK rule per (peer, port); an empty list means "any"."""
    peers: tuple[Peer | None, ...] = rule.peers or (None,)
    ports: tuple[PortSpec | None, ...] = rule.ports or (None,)
    for peer in peers:
        if isinstance(peer, IPBlock) and peer.cidr.version != ctx.family:
            continue
        for port in ports:
            match = _port_match(port) + _address_match(ctx, peer, port)
            yield Rule(match, SET_ACCEPT.target, SET_ACCEPT.target_args)


def _port_match(port: PortSpec | None) -> tuple[str, ...]:
    """Protocol and numeric port (range); named ports only fix the protocol here."""
    if port is None:
        return ()
    proto = port.protocol.lower()
    if not isinstance(port.port, int):
        return ("-p", proto)
    dport = str(port.port) if port.end_port is None else f"{port.port}:{port.end_port}"
    return ("-p", proto, "-m", proto, "--dport", dport)


def _address_match(ctx: _Compiling, peer: Peer | None, port: PortSpec | None) -> tuple[str, ...]:
    """The address part of a rule, folding in named-port resolution."""
    if port is None or not isinstance(port.port, str):
        return _peer_match(ctx, peer)
    # The named-port set checks destination IP and port together, so it also
    # decides *which* pods the name resolves on: the policy's own pods for
    # ingress, the peer's pods for egress (all pods when the peer is not a
    # selection).
    if ctx.direction == "ingress":
        where = ctx.policy.target
    else:
        where = peer if isinstance(peer, PodSelection) else ALL_PODS
    named_set = _add(ctx.sets, NamedPortSet(ctx.family, where, port.protocol, port.port))
    named_match = ("-m", "set", "--match-set", named_set, "dst,dst")
    if ctx.direction == "egress" and isinstance(peer, PodSelection):
        return named_match
    return _peer_match(ctx, peer) + named_match


def _peer_match(ctx: _Compiling, peer: Peer | None) -> tuple[str, ...]:
    """Match the remote address against a pod selection or an ipBlock."""
    if peer is None:
        return ()
    if isinstance(peer, PodSelection):
        name = _add(ctx.sets, SelectorSet(ctx.family, peer))
        return ("-m", "set", "--match-set", name, ctx.side)
    flag = "-s" if ctx.side == "src" else "-d"
    match: tuple[str, ...] = () if peer.cidr.prefixlen == 0 else (flag, str(peer.cidr))
    if peer.excepts:
        except_set = _add(ctx.sets, NetSet(ctx.family, peer.excepts))
        match += ("-m", "set", "!", "--match-set", except_set, ctx.side)
    return match


def _add(sets: dict[str, IPSetSpec], spec: IPSetSpec) -> str:
    """Record a set the chain uses and return its name."""
    sets[spec.name] = spec
    return spec.name


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


def endpoint_chains(
    pod: Pod,
    policies: Iterable[NetworkPolicy],
    iface: str,
    family: int = 4,
    allow: str = "ACCEPT",
) -> EndpointChains:
    """``cali-tw-<iface>`` and ``cali-fw-<iface>`` for a local pod."""
    tw_name, fw_name = endpoint_chain_names(iface)
    policy_list = list(policies)
    to_wl = _conntrack_rules(allow) + _policy_jumps(pod, policy_list, "ingress")
    from_wl = _anti_spoof(pod, family) + _conntrack_rules(allow)
    from_wl += _policy_jumps(pod, policy_list, "egress")
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


def _policy_jumps(pod: Pod, policies: list[NetworkPolicy], direction: str) -> tuple[Rule, ...]:
    """Clear the mark, try each policy, then default deny or allow."""
    chosen = policies_for(pod, policies, direction)
    rules = [CLEAR_ACCEPT]
    for policy in chosen:
        rules.append(Rule((), policy_chain_name(policy.key, direction)))
        rules.append(RETURN_IF_ACCEPTED)
    rules.append(DEFAULT_DROP if chosen else SET_ACCEPT)
    return tuple(rules)


# ---------------------------------------------------------------- one node


def desired_state(
    policies: Iterable[NetworkPolicy],
    pods: Iterable[Pod],
    namespaces: Iterable[Namespace],
    local_endpoints: Mapping[str, Pod],
    family: int = 4,
    allow: str = "ACCEPT",
) -> DesiredState:
    """Chains and ipsets for the endpoints on one node (``iface`` → pod).

    ``allow`` is what an endpoint chain does with replies of allowed connections
    (``ACCEPT`` or ``RETURN``); new connections are only ever marked.

    Only policies that apply to some local endpoint are compiled, and only the
    sets their chains use are listed, so a node carries what it needs.
    """
    # A policy only ever selects pods of its own namespace: index once, so a pod is
    # matched against its namespace's policies, not the cluster's.
    by_namespace: dict[str, list[NetworkPolicy]] = {}
    for policy in policies:
        by_namespace.setdefault(policy.namespace, []).append(policy)
    chains: dict[str, Chain] = {}
    specs: dict[str, IPSetSpec] = {}
    used: dict[str, NetworkPolicy] = {}
    for iface, pod in sorted(local_endpoints.items()):
        candidates = by_namespace.get(pod.namespace, [])
        eps = endpoint_chains(pod, candidates, iface, family, allow)
        chains[eps.to_workload.name] = eps.to_workload
        chains[eps.from_workload.name] = eps.from_workload
        for direction in ("ingress", "egress"):
            used.update((p.key, p) for p in policies_for(pod, candidates, direction))
    for key in sorted(used):
        compiled = _compile_cached(used[key], family)
        chains.update((c.name, c) for c in compiled.chains)
        specs.update((s.name, s) for s in compiled.ipsets)
    return DesiredState(chains, specs, ipset_members(specs.values(), pods, namespaces))
