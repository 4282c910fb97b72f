"""NetworkPolicy on one node: the compiled chains, hooked into the kernel's filter table.

The policy compiler (`policy/`) gives per-endpoint chains (cali-tw-/cali-fw-<iface>),
shared policy chains and ipsets. This module adds the top of the tree, as Felix does,
and applies everything through the dataplane tables:

    FORWARD -> cali-FORWARD:
        clear Tabby's accept mark
        -i cali+ -> cali-from-wl-dispatch: -i <iface> -g cali-fw-<iface> ... else DROP
        -o cali+ -> cali-to-wl-dispatch:   -o <iface> -g cali-tw-<iface> ... else DROP
        mark set -> ACCEPT          (both directions said yes, or the one that applies)
    INPUT -> cali-INPUT: traffic from a pod to this node: the pod's egress policy, then
        the configurable endpoint-to-host action (ACCEPT or DROP)
    OUTPUT: the node's own traffic to its pods (kubelet probes) is left alone.

Unknown cali interfaces (a pod wired before its chains exist) fail closed. The
desired state is a pure function (`render`); `PolicyDataplane.apply` writes it.

The nat table's natOutgoing chains (`felix.nat_outgoing`) are written here too:
their pool ipsets must go through the same ipset manager as the policy sets,
which owns every `cali40` set of the node.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from felix.dataplane import apply_in_order
from felix.dataplane.backend import detect_backend
from felix.dataplane.ipsets import IpsetManager
from felix.dataplane.iptables import Rule, Table
from felix.dataplane.runner import CommandRunner
from felix.nat_outgoing import NatState, PoolNat, nat_state
from policy import ACCEPT_MARK, DesiredState, desired_state
from policy import Pod as PolicyPod
from policy.model import Namespace, NetworkPolicy

log = logging.getLogger(__name__)

FORWARD, INPUT = "cali-FORWARD", "cali-INPUT"
FROM_DISPATCH, TO_DISPATCH = "cali-from-wl-dispatch", "cali-to-wl-dispatch"
MARK = f"{ACCEPT_MARK:#x}/{ACCEPT_MARK:#x}"


@dataclass(frozen=True)
class FilterState:
    """What the filter table and the ipsets should hold on this node."""

    chains: Mapping[str, tuple[Rule, ...]]
    hooks: Mapping[str, tuple[Rule, ...]]
    ipsets: Mapping[str, tuple[str, frozenset[str]]]


def _rules(*rows: tuple[str, ...]) -> tuple[Rule, ...]:
    return tuple(Rule(row) for row in rows)


def _dispatch(ifaces: Iterable[str], flag: str, prefix: str) -> tuple[Rule, ...]:
    jumps = [(flag, iface, "-g", f"{prefix}{iface}") for iface in sorted(ifaces)]
    return _rules(*jumps, ("-m", "comment", "--comment", "unknown endpoint", "-j", "DROP"))


def render(state: DesiredState, local_ifaces: Iterable[str], endpoint_to_host: str) -> FilterState:
    """The whole filter-table picture for this node (pure)."""
    ifaces = sorted(local_ifaces)
    chains: dict[str, tuple[Rule, ...]] = {
        name: tuple(Rule(rule.args) for rule in chain.rules) for name, chain in state.chains.items()
    }
    chains[FROM_DISPATCH] = _dispatch(ifaces, "-i", "cali-fw-")
    chains[TO_DISPATCH] = _dispatch(ifaces, "-o", "cali-tw-")
    chains[FORWARD] = _rules(
        ("-j", "MARK", "--set-xmark", f"0x0/{ACCEPT_MARK:#x}"),
        ("-i", "cali+", "-j", FROM_DISPATCH),
        ("-o", "cali+", "-j", TO_DISPATCH),
        ("-m", "mark", "--mark", MARK, "-j", "ACCEPT"),
    )
    chains[INPUT] = _rules(
        ("-i", "cali+", "-j", "MARK", "--set-xmark", f"0x0/{ACCEPT_MARK:#x}"),
        ("-i", "cali+", "-j", FROM_DISPATCH),
        ("-i", "cali+", "-m", "mark", "--mark", MARK, "-j", endpoint_to_host),
        ("-i", "cali+", "-j", "DROP"),
    )
    hooks = {"FORWARD": _rules(("-j", FORWARD)), "INPUT": _rules(("-j", INPUT))}
    ipsets = {
        name: (spec.set_type, state.members.get(name, frozenset()))
        for name, spec in state.ipsets.items()
    }
    return FilterState(chains, hooks, ipsets)


class PolicyDataplane:
    """Owns the filter table and the ipsets of one node (the namespace it runs in)."""

    def __init__(
        self,
        runner: CommandRunner,
        backend: str = "auto",
        endpoint_to_host: str = "ACCEPT",
    ) -> None:
        if endpoint_to_host not in ("ACCEPT", "DROP"):
            raise ValueError(
                f"endpoint-to-host action must be ACCEPT or DROP, not {endpoint_to_host}"
            )
        self.backend = detect_backend(runner, backend)
        self.filter = Table("filter", runner, self.backend)
        self.nat = Table("nat", runner, self.backend)
        self.ipsets = IpsetManager(runner)
        self.endpoint_to_host = endpoint_to_host
        self.last_bytes = 0

    def apply(
        self,
        policies: Iterable[NetworkPolicy],
        pods: Iterable[PolicyPod],
        namespaces: Iterable[Namespace],
        local: Mapping[str, PolicyPod],
        *,
        pools: Iterable[PoolNat] = (),
        resync: bool = False,
    ) -> FilterState:
        """Compute and write; `resync` re-reads the kernel first to repair drift."""
        state = render(
            desired_state(policies, pods, namespaces, local), local, self.endpoint_to_host
        )
        nat = nat_state(pools)
        if resync:
            self.filter.invalidate()
            self.nat.invalidate()
            self.ipsets.invalidate()
        self.ipsets.replace_sets({**state.ipsets, **nat.ipsets})
        self.filter.replace_chains(state.chains)
        for kernel_chain, rules in state.hooks.items():
            self.filter.insert_hooks(kernel_chain, rules)
        self._set_nat(nat)
        result = apply_in_order(self.ipsets, [self.filter, self.nat])
        self.last_bytes = result.bytes_written
        return state

    def _set_nat(self, nat: NatState) -> None:
        """natOutgoing chains, appended to POSTROUTING after kube-proxy's rules."""
        self.nat.replace_chains(nat.chains)
        for kernel_chain, rules in nat.hooks.items():
            self.nat.append_hooks(kernel_chain, rules)
