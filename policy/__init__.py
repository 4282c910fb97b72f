"""Kubernetes NetworkPolicy → iptables chains and ipsets (pure; no kernel).

Public API::

    parse_policy(obj) -> NetworkPolicy        # API dicts → validated values;
    parse_pod(obj) -> Pod                     # every bad object raises
    parse_namespace(obj) -> Namespace         # PolicyError, nothing else

    compile_policy(policy, family=4) -> CompiledPolicy
        # the policy's shared cali-pi-/cali-po- chains + the IPSetSpecs they use;
        # independent of pods, so it is compiled once per policy version
    endpoint_chains(pod, policies, iface, family=4) -> EndpointChains
        # cali-tw-<iface> (ingress) and cali-fw-<iface> (egress, anti-spoofing)
    ipset_members(specs, pods, namespaces) -> {set name: frozenset(members)}
        # the only output that changes when pods or namespaces change
    desired_state(policies, pods, namespaces, {iface: pod}, family=4) -> DesiredState
        # all of the above for one node

A :class:`Rule` is match args + target (+ :attr:`Rule.hash`); a :class:`Chain`
is a name + rules (:meth:`Chain.rule_ids` for position-aware comment hashes,
:meth:`Chain.render` for iptables-restore lines).  The verdict contract
(accept mark ``0x10000``) is described in :mod:`policy.compiler`.
"""

from policy.compiler import (
    ACCEPT_MARK,
    CompiledPolicy,
    DesiredState,
    EndpointChains,
    compile_policy,
    desired_state,
    endpoint_chains,
    policies_for,
)
from policy.errors import PolicyError
from policy.ipsets import IPSetSpec, NamedPortSet, NetSet, SelectorSet, ipset_members
from policy.model import (
    ContainerPort,
    IPBlock,
    Namespace,
    NetworkPolicy,
    Pod,
    PodSelection,
    PolicyRule,
    PortSpec,
    make_namespace,
    make_pod,
    parse_namespace,
    parse_pod,
    parse_policy,
)
from policy.rules import Chain, Rule
from policy.selectors import LabelSelector, Requirement, parse_selector

__all__ = [
    "ACCEPT_MARK",
    "Chain",
    "CompiledPolicy",
    "ContainerPort",
    "DesiredState",
    "EndpointChains",
    "IPBlock",
    "IPSetSpec",
    "LabelSelector",
    "NamedPortSet",
    "Namespace",
    "NetSet",
    "NetworkPolicy",
    "Pod",
    "PodSelection",
    "PolicyError",
    "PolicyRule",
    "PortSpec",
    "Requirement",
    "Rule",
    "SelectorSet",
    "compile_policy",
    "desired_state",
    "endpoint_chains",
    "ipset_members",
    "make_namespace",
    "make_pod",
    "parse_namespace",
    "parse_pod",
    "parse_policy",
    "parse_selector",
    "policies_for",
]
