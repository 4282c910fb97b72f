"""natOutgoing: pods of pools that ask for it leave the cluster with the node's address.

As Calico does (``felix/rules/nat.go``): two ipsets of pool CIDRs and one rule,

    nat POSTROUTING (appended, so kube-proxy's own masquerade chain runs first)
        -> cali-POSTROUTING -> cali-nat-outgoing:
           -m set --match-set cali40masq-ipam-pools src
           -m set ! --match-set cali40all-ipam-pools dst -j MASQUERADE

so traffic from a natOutgoing pool to anything outside *every* pool (the
internet, the node network) is masqueraded, and pod-to-pod traffic never is,
whichever pool the peer is in. Pools without natOutgoing are only in the
all-pools set. With no natOutgoing pool the chain is empty. Disabled pools
still count: their pods may still be running.

Pure: :func:`nat_state` computes what the nat table and the two sets should hold;
:class:`~felix.policy_dataplane.PolicyDataplane` writes it with the filter table,
through the same ipset manager (one manager owns all of a node's sets).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from felix.dataplane.iptables import Rule

POSTROUTING = "cali-POSTROUTING"
NAT_OUTGOING = "cali-nat-outgoing"
MASQ_POOLS = "cali40masq-ipam-pools"
ALL_POOLS = "cali40all-ipam-pools"


@dataclass(frozen=True)
class PoolNat:
    """What natOutgoing needs of a pool: its CIDR and the flag."""

    cidr: str
    nat_outgoing: bool


@dataclass(frozen=True)
class NatState:
    """The nat table's Tabby chains and hooks, and the pool sets they match."""

    chains: Mapping[str, tuple[Rule, ...]]
    hooks: Mapping[str, tuple[Rule, ...]]  # appended to these kernel chains
    ipsets: Mapping[str, tuple[str, frozenset[str]]]


def nat_state(pools: Iterable[PoolNat]) -> NatState:
    """Desired nat-table state for IPv4 pools (IPv6 pools are left out)."""
    v4 = [p for p in pools if ipaddress.ip_network(p.cidr, strict=False).version == 4]
    masq = frozenset(_canonical(p.cidr) for p in v4 if p.nat_outgoing)
    every = frozenset(_canonical(p.cidr) for p in v4)
    rules: tuple[Rule, ...] = ()
    if masq:
        rules = (
            Rule(
                (
                    "-m",
                    "set",
                    "--match-set",
                    MASQ_POOLS,
                    "src",
                    "-m",
                    "set",
                    "!",
                    "--match-set",
                    ALL_POOLS,
                    "dst",
                    "-j",
                    "MASQUERADE",
                )
            ),
        )
    return NatState(
        chains={POSTROUTING: (Rule(("-j", NAT_OUTGOING)),), NAT_OUTGOING: rules},
        hooks={"POSTROUTING": (Rule(("-j", POSTROUTING)),)},
        ipsets={MASQ_POOLS: ("hash:net", masq), ALL_POOLS: ("hash:net", every)},
    )


def _canonical(cidr: str) -> str:
    return str(ipaddress.ip_network(cidr, strict=False))
