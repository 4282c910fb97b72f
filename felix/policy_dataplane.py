"""NetworkPolicy on one node: the compiled chains, hooked into the kernel's filter table.

The policy compiler (`policy/`) gives per-endpoint chains (cali-tw-/cali-fw-<iface>),
shared policy chains and ipsets. This module adds the top of the tree, as Felix does,
and applies everything through the dataplane tables:

    FORWARD (top, inserted) -> cali-FORWARD:
        clear Tabby's accept mark
        -i cali+ TCP to port 179 of any node address (set cali40all-hosts) -> DROP
            (`felix.bgp_guard`; off with pod_to_node_bgp=Allow)
        -i cali+ -> cali-from-wl-dispatch: -i cali<c>+ -g cali-from-wl-dispatch-<c>
                       (a leaf per character c: -i <iface> -g cali-fw-<iface> ... DROP)
        -o cali+ -> cali-to-wl-dispatch:   the same with -o and cali-tw-<iface>
        (returns: denies were dropped, allows carry the accept mark)
    ... other programs' FORWARD rules: kube-proxy's KUBE-SERVICES (REJECT for a
        Service without endpoints), KUBE-EXTERNAL-SERVICES, KUBE-FORWARD ...
    FORWARD (bottom, appended): mark set -> ACCEPT (both directions said yes)

The allow action (Calico's IptablesFilterAllowAction) is ``ACCEPT`` (default) or
``RETURN``. With RETURN nothing is appended to FORWARD and the endpoint chains return
allowed replies instead of accepting them, so the kernel chain's later rules and its
policy decide everything Tabby allowed. Either way a policy deny is a DROP inside
cali-FORWARD, before any other program's rule, so nothing denied becomes reachable.
kube-proxy in nftables mode rejects in its own table at priority -110, before any
iptables filter chain, so neither setting hides its REJECT.
    INPUT -> cali-INPUT:
        -i cali+ -g cali-wl-to-host: traffic from a pod to its own node
            clear the accept mark
            -> cali-from-wl-dispatch (the pod's egress policy; replies to the node's own
               connections are accepted there by conntrack, after anti-spoofing)
            the node's BGP port (179) is dropped, whatever the action (unless
            pod_to_node_bgp=Allow)
            with DROP, a connection a Service DNAT'ed to this node (a hostNetwork
            endpoint) is allowed
            the configured endpoint-to-host action: DROP (default), ACCEPT, or RETURN
            (back to the kernel's INPUT: the host's own rules decide)
        nothing else: traffic that did not come from a pod is never judged here
    OUTPUT: the node's own traffic to its pods (kubelet probes) is left alone.

Pods reaching their node's BGP port (179) or any other host port is what the default
DROP stops, as Calico's DefaultEndpointToHostAction does. The failsafes hold by
construction: node-to-node BGP, VXLAN and IPIP arrive on the underlay, not on a cali
interface, so Tabby's INPUT chain returns them untouched; host-to-pod health checks
leave through OUTPUT (not filtered) and their replies are ESTABLISHED, accepted by the
pod's ``cali-fw`` chain before any policy or the endpoint-to-host action.

Unknown cali interfaces (a pod wired before its chains exist) fail closed. The
desired state is a pure function (`render`); `PolicyDataplane.apply` writes it.

The nat table's natOutgoing chains (`felix.nat_outgoing`) are written here too:
their pool ipsets must go through the same ipset manager as the policy sets,
which owns every `cali40` set of the node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from felix.bgp_guard import (
    ALL_HOSTS_SET,
    BGP_PORT,
    DEFAULT_POD_TO_NODE_BGP,
    OTHER_NODES_COMMENT,
    PodToNodeBGP,
    parse_pod_to_node_bgp,
)
from felix.calc.messages import ChainRemove, ChainUpdate, IPSetRemove, IPSetUpdate, Message
from felix.constants import HOST_IFACE_PREFIX
from felix.dataplane import apply_in_order
from felix.dataplane.backend import detect_backend
from felix.dataplane.ipsets import IpsetManager
from felix.dataplane.iptables import Rule, Table
from felix.dataplane.runner import CommandRunner
from felix.nat_outgoing import NatState, PoolNat, nat_state
from policy import ACCEPT_MARK, DesiredState, desired_state
from policy import Pod as PolicyPod
from policy.model import Namespace, NetworkPolicy
from policy.rules import Chain as PolicyChain

log = logging.getLogger(__name__)

FORWARD, INPUT = "cali-FORWARD", "cali-INPUT"
FROM_DISPATCH, TO_DISPATCH = "cali-from-wl-dispatch", "cali-to-wl-dispatch"
WL_TO_HOST = "cali-wl-to-host"
HOST_PREFIX = HOST_IFACE_PREFIX  # every pod veth's host end
MARK = f"{ACCEPT_MARK:#x}/{ACCEPT_MARK:#x}"

# What a pod's traffic to its own node gets once its egress policy allowed it.
EndpointToHostAction = Literal["DROP", "ACCEPT", "RETURN"]
ENDPOINT_TO_HOST_ACTIONS: tuple[EndpointToHostAction, ...] = ("DROP", "ACCEPT", "RETURN")
DEFAULT_ENDPOINT_TO_HOST_ACTION: EndpointToHostAction = "DROP"
CONFIGURED_COMMENT = "configured DefaultEndpointToHostAction"
SERVICE_TO_HOST_COMMENT = "a Service's endpoint on this node"
BGP_PORT_COMMENT = "the node's BGP port"

# What Tabby's filter rules do with what they allow (Calico's IptablesFilterAllowAction).
FilterAllowAction = Literal["ACCEPT", "RETURN"]
FILTER_ALLOW_ACTIONS: tuple[FilterAllowAction, ...] = ("ACCEPT", "RETURN")
DEFAULT_FILTER_ALLOW_ACTION: FilterAllowAction = "ACCEPT"
ACCEPTED_COMMENT = "policy explicitly accepted packet"


def parse_filter_allow_action(value: str) -> FilterAllowAction:
    """``Accept``/``Return`` in any case, or a ValueError naming the choices."""
    for action in FILTER_ALLOW_ACTIONS:
        if value.strip().upper() == action:
            return action
    choices = ", ".join(a.capitalize() for a in FILTER_ALLOW_ACTIONS)
    raise ValueError(
        f"filter allow action must be one of {choices} "
        f"(what Tabby's filter rules do with allowed traffic), not {value!r}"
    )


def parse_endpoint_to_host_action(value: str) -> EndpointToHostAction:
    """``Drop``/``Accept``/``Return`` in any case, or a ValueError naming the choices."""
    for action in ENDPOINT_TO_HOST_ACTIONS:
        if value.strip().upper() == action:
            return action
    choices = ", ".join(a.capitalize() for a in ENDPOINT_TO_HOST_ACTIONS)
    raise ValueError(
        f"default endpoint-to-host action must be one of {choices} "
        f"(what pods may send to their own node), not {value!r}"
    )


@dataclass(frozen=True)
class FilterState:
    """What the filter table and the ipsets should hold on this node."""

    chains: Mapping[str, tuple[Rule, ...]]
    hooks: Mapping[str, tuple[Rule, ...]]  # inserted at the top of kernel chains
    ipsets: Mapping[str, tuple[str, frozenset[str]]]
    appended: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict)  # at the bottom


def _rules(*rows: tuple[str, ...]) -> tuple[Rule, ...]:
    return tuple(Rule(row) for row in rows)


UNKNOWN_ENDPOINT = ("-m", "comment", "--comment", "unknown endpoint", "-j", "DROP")


def _dispatch(ifaces: Iterable[str], flag: str, prefix: str) -> tuple[Rule, ...]:
    jumps = [(flag, iface, "-g", f"{prefix}{iface}") for iface in sorted(ifaces)]
    return _rules(*jumps, UNKNOWN_ENDPOINT)


def dispatch_tree(
    ifaces: Iterable[str], flag: str, prefix: str, root: str
) -> dict[str, tuple[Rule, ...]]:
    """The dispatch chain ``root`` and its leaves, one per character after ``cali``.

    Pod veths are ``cali`` + 11 hex characters, so the root has at most 16 jumps
    (``-i cali3+ -g <root>-3``) and each leaf the endpoints of its character, as in
    Felix: a new endpoint rewrites one leaf of about n/16 rules, not a chain listing
    every endpoint of the node. Interfaces of another shape are dispatched from the
    root itself. Every chain ends in a drop, so an unknown ``cali`` interface is
    dropped wherever it lands (the goto never returns to a chain that would pass it).
    """
    groups: dict[str, list[str]] = {}
    direct: list[str] = []
    for iface in sorted(ifaces):
        key = iface[len(HOST_PREFIX)] if _in_tree(iface) else ""
        (groups.setdefault(key, []) if key else direct).append(iface)
    chains = {f"{root}-{key}": _dispatch(members, flag, prefix) for key, members in groups.items()}
    jumps = [(flag, f"{HOST_PREFIX}{key}+", "-g", f"{root}-{key}") for key in sorted(groups)]
    jumps += [(flag, iface, "-g", f"{prefix}{iface}") for iface in direct]
    chains[root] = _rules(*jumps, UNKNOWN_ENDPOINT)
    return chains


def _in_tree(iface: str) -> bool:
    """``cali`` followed by a letter or digit: dispatched through a leaf chain."""
    return (
        iface.startswith(HOST_PREFIX)
        and len(iface) > len(HOST_PREFIX)
        and iface[len(HOST_PREFIX)].isalnum()
        and iface[len(HOST_PREFIX)].isascii()
    )


def _wl_to_host(
    action: EndpointToHostAction,
    allow: FilterAllowAction = DEFAULT_FILTER_ALLOW_ACTION,
    bgp: PodToNodeBGP = DEFAULT_POD_TO_NODE_BGP,
) -> tuple[Rule, ...]:
    """A pod's traffic to its own node: egress policy first, then the configured action.

    The dispatch chain only returns here when the egress policy allowed the packet
    (the accept mark is set): replies to the node's own connections were accepted
    inside it and anything denied was dropped. ACCEPT and RETURN still check the mark,
    so a dispatch that ever returned without a verdict fails closed. With the RETURN
    allow action those replies come back here unmarked: they return to INPUT.

    Whatever the action, a pod never reaches the node's BGP port: Tabby's own listener
    (its health and metrics server listens on loopback only, out of a pod's reach),
    unless the operator set pod_to_node_bgp=Allow (`felix.bgp_guard`).

    DROP spares one thing: a connection a Service DNAT'ed to this node (conntrack state
    DNAT: kube-proxy chose a hostNetwork endpoint, such as the apiserver behind
    `kubernetes` on a control-plane node). The cluster exposed that endpoint on purpose;
    the pod's egress policy has judged it already. Dialled directly, the same port is
    still dropped.
    """
    configured = ("-m", "comment", "--comment", CONFIGURED_COMMENT)
    rules: list[tuple[str, ...]] = [
        ("-j", "MARK", "--set-xmark", f"0x0/{ACCEPT_MARK:#x}"),
        ("-j", FROM_DISPATCH),
    ]
    if allow == "RETURN":
        rules.append(("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"))
    if bgp == "DROP":
        rules.append(("-p", "tcp", "--dport", str(BGP_PORT), "-m", "comment", "--comment",
                      BGP_PORT_COMMENT, "-j", "DROP"))  # fmt: skip
    if action == "DROP":
        service = ("-m", "comment", "--comment", SERVICE_TO_HOST_COMMENT)
        rules.append(("-m", "mark", "--mark", MARK, "-m", "conntrack", "--ctstate", "DNAT",
                      *service, "-j", allow))  # fmt: skip
        rules.append((*configured, "-j", "DROP"))
    else:
        rules.append(("-m", "mark", "--mark", MARK, *configured, "-j", action))
        rules.append(("-m", "comment", "--comment", "no egress verdict", "-j", "DROP"))
    return _rules(*rules)


class ChainRules:
    """Compiled chains as dataplane rules, converted once per chain value.

    The calculation layer hands back the very same :class:`policy.Chain` object for
    a chain it did not recompute, so a pass converts only the chains that changed.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[PolicyChain, tuple[Rule, ...]]] = {}

    def __call__(self, chains: Mapping[str, PolicyChain]) -> dict[str, tuple[Rule, ...]]:
        out = {name: self.one(chain) for name, chain in chains.items()}
        for name in self._by_name.keys() - chains.keys():
            del self._by_name[name]
        return out

    def one(self, chain: PolicyChain) -> tuple[Rule, ...]:
        """One chain's rules, converted again only if the chain object is new."""
        hit = self._by_name.get(chain.name)
        if hit is None or hit[0] is not chain:
            hit = (chain, tuple(Rule(rule.args) for rule in chain.rules))
            self._by_name[chain.name] = hit
        return hit[1]

    def forget(self, name: str) -> None:
        self._by_name.pop(name, None)


def _convert(chains: Mapping[str, PolicyChain]) -> dict[str, tuple[Rule, ...]]:
    return {name: tuple(Rule(rule.args) for rule in chain.rules) for name, chain in chains.items()}


def render(
    state: DesiredState,
    local_ifaces: Iterable[str],
    endpoint_to_host: EndpointToHostAction,
    allow: FilterAllowAction = DEFAULT_FILTER_ALLOW_ACTION,
    convert: Callable[[Mapping[str, PolicyChain]], dict[str, tuple[Rule, ...]]] = _convert,
    guard: BGPGuard | None = None,
) -> FilterState:
    """The whole filter-table picture for this node (pure).

    ``state`` must have been compiled with the same ``allow`` action.
    """
    fixed = fixed_state(local_ifaces, endpoint_to_host, allow, guard)
    chains = convert(state.chains)
    chains.update(fixed.chains)
    ipsets = {
        name: (spec.set_type, state.members.get(name, frozenset()))
        for name, spec in state.ipsets.items()
    }
    ipsets.update(fixed.ipsets)
    return FilterState(chains, fixed.hooks, ipsets, fixed.appended)


@dataclass(frozen=True)
class BGPGuard:
    """Whether pods are kept from nodes' BGP port, and every node address (`felix.bgp_guard`)."""

    mode: PodToNodeBGP = DEFAULT_POD_TO_NODE_BGP
    hosts: frozenset[str] = frozenset()


def fixed_state(
    local_ifaces: Iterable[str],
    endpoint_to_host: EndpointToHostAction,
    allow: FilterAllowAction = DEFAULT_FILTER_ALLOW_ACTION,
    guard: BGPGuard | None = None,
) -> FilterState:
    """The part of the filter table no policy decides: the dispatch trees over this
    node's endpoints, cali-FORWARD, cali-INPUT, cali-wl-to-host, the BGP guard's set
    and the hooks (pure)."""
    guard = guard or BGPGuard()
    ifaces = sorted(local_ifaces)
    chains = dict(dispatch_tree(ifaces, "-i", "cali-fw-", FROM_DISPATCH))
    chains.update(dispatch_tree(ifaces, "-o", "cali-tw-", TO_DISPATCH))
    forward: list[tuple[str, ...]] = [("-j", "MARK", "--set-xmark", f"0x0/{ACCEPT_MARK:#x}")]
    ipsets: dict[str, tuple[str, frozenset[str]]] = {}
    if guard.mode == "DROP":
        to_nodes = ("-m", "set", "--match-set", ALL_HOSTS_SET, "dst")
        comment = ("-m", "comment", "--comment", OTHER_NODES_COMMENT)
        bgp = ("-p", "tcp", "--dport", str(BGP_PORT))
        forward.append(("-i", "cali+", *bgp, *to_nodes, *comment, "-j", "DROP"))
        ipsets[ALL_HOSTS_SET] = ("hash:ip", guard.hosts)
    forward += [("-i", "cali+", "-j", FROM_DISPATCH), ("-o", "cali+", "-j", TO_DISPATCH)]
    chains[FORWARD] = _rules(*forward)
    # goto, so that RETURN from cali-wl-to-host continues in the kernel's INPUT chain
    chains[INPUT] = _rules(("-i", "cali+", "-g", WL_TO_HOST))
    chains[WL_TO_HOST] = _wl_to_host(endpoint_to_host, allow, guard.mode)
    hooks = {"FORWARD": _rules(("-j", FORWARD)), "INPUT": _rules(("-j", INPUT))}
    return FilterState(chains, hooks, ipsets, _forward_appended(allow))


def _forward_appended(allow: FilterAllowAction) -> dict[str, tuple[Rule, ...]]:
    """The verdict on what cali-FORWARD allowed, at the bottom of FORWARD (as Felix's).

    Below kube-proxy's jumps, so its REJECT for a Service without endpoints and its
    other filter rules run first; with RETURN the kernel chain's own policy decides.
    """
    if allow == "RETURN":
        return {}
    accepted = ("-m", "mark", "--mark", MARK, "-m", "comment", "--comment", ACCEPTED_COMMENT)
    return {"FORWARD": _rules((*accepted, "-j", "ACCEPT"))}


class PolicyDataplane:
    """Owns the filter table and the ipsets of one node (the namespace it runs in)."""

    def __init__(
        self,
        runner: CommandRunner,
        backend: str = "auto",
        endpoint_to_host: str = DEFAULT_ENDPOINT_TO_HOST_ACTION,
        allow: str = DEFAULT_FILTER_ALLOW_ACTION,
        pod_to_node_bgp: str = DEFAULT_POD_TO_NODE_BGP,
    ) -> None:
        self.endpoint_to_host = parse_endpoint_to_host_action(endpoint_to_host)
        self.allow = parse_filter_allow_action(allow)
        self.pod_to_node_bgp = parse_pod_to_node_bgp(pod_to_node_bgp)
        self.backend = detect_backend(runner, backend)
        self.filter = Table("filter", runner, self.backend)
        self.nat = Table("nat", runner, self.backend)
        self.ipsets = IpsetManager(runner)
        self.last_bytes = 0
        self._chain_rules = ChainRules()
        self._fixed: set[str] = set()  # names of the chains fixed_state() wrote last

    def apply(
        self,
        policies: Iterable[NetworkPolicy],
        pods: Iterable[PolicyPod],
        namespaces: Iterable[Namespace],
        local: Mapping[str, PolicyPod],
        *,
        pools: Iterable[PoolNat] = (),
        hosts: Iterable[str] = (),
        resync: bool = False,
    ) -> FilterState:
        """Compute from scratch and write; `resync` re-reads the kernel first to repair drift."""
        desired = desired_state(policies, pods, namespaces, local, allow=self.allow)
        return self.apply_state(desired, local, pools=pools, hosts=hosts, resync=resync)

    def apply_state(
        self,
        desired: DesiredState,
        local_ifaces: Iterable[str],
        *,
        pools: Iterable[PoolNat] = (),
        hosts: Iterable[str] = (),
        resync: bool = False,
    ) -> FilterState:
        """Write a computed state (the agent's :class:`felix.calc.PolicyCalculator`'s):
        only what differs from the last write reaches the kernel. ``hosts``: every node
        address (:func:`felix.bgp_guard.node_addresses`)."""
        state = render(
            desired,
            local_ifaces,
            self.endpoint_to_host,
            self.allow,
            self._chain_rules,
            self._guard(hosts),
        )
        nat = nat_state(pools)
        if resync:
            self.filter.invalidate()
            self.nat.invalidate()
            self.ipsets.invalidate()
        self.ipsets.replace_sets({**state.ipsets, **nat.ipsets})
        self.filter.replace_chains(state.chains)
        self._fixed = set(state.chains) - set(desired.chains)
        self._set_hooks(state)
        self._set_nat(nat)
        result = apply_in_order(self.ipsets, [self.filter, self.nat])
        self.last_bytes = result.bytes_written
        return state

    def apply_changes(
        self,
        messages: Iterable[Message],
        local_ifaces: Iterable[str],
        *,
        pools: Iterable[PoolNat] = (),
        hosts: Iterable[str] = (),
    ) -> None:
        """Write what the calculation says changed (:mod:`felix.calc.messages`), the
        dispatch trees over ``local_ifaces`` and the NAT state; nothing else is read or
        compared. Must follow an :meth:`apply_state` of the state the messages start
        from (the agent's resync does one)."""
        for message in messages:
            match message:
                case ChainUpdate(chain):
                    self.filter.set_chain(chain.name, self._chain_rules.one(chain))
                case ChainRemove(name):
                    self._chain_rules.forget(name)
                    self.filter.remove_chain(name)
                case IPSetUpdate(spec, members):
                    self.ipsets.set_members(spec.name, spec.set_type, members)
                case IPSetRemove(name):
                    self.ipsets.remove(name)
        fixed = fixed_state(local_ifaces, self.endpoint_to_host, self.allow, self._guard(hosts))
        for name, (set_type, members) in fixed.ipsets.items():
            self.ipsets.set_members(name, set_type, members)
        for name in self._fixed - fixed.chains.keys():
            self.filter.remove_chain(name)
        for name, rules in fixed.chains.items():
            self.filter.set_chain(name, rules)
        self._fixed = set(fixed.chains)
        self._set_hooks(fixed)
        nat = nat_state(pools)
        for name, (set_type, members) in nat.ipsets.items():
            self.ipsets.set_members(name, set_type, members)
        self._set_nat(nat)
        result = apply_in_order(self.ipsets, [self.filter, self.nat])
        self.last_bytes = result.bytes_written

    def _guard(self, hosts: Iterable[str]) -> BGPGuard:
        return BGPGuard(self.pod_to_node_bgp, frozenset(hosts))

    def _set_hooks(self, state: FilterState) -> None:
        for kernel_chain, rules in state.hooks.items():
            self.filter.insert_hooks(kernel_chain, rules)
        for kernel_chain in {*state.hooks, *state.appended}:
            self.filter.append_hooks(kernel_chain, state.appended.get(kernel_chain, ()))

    def _set_nat(self, nat: NatState) -> None:
        """natOutgoing chains, appended to POSTROUTING after kube-proxy's rules."""
        self.nat.replace_chains(nat.chains)
        for kernel_chain, rules in nat.hooks.items():
            self.nat.append_hooks(kernel_chain, rules)
