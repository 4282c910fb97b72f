"""What every policy chain is made of: the marks, and the iptables matches of peers
and ports, shared by NetworkPolicy (``policy.compiler``) and ClusterNetworkPolicy
(``policy.cluster_compiler``).

Marks: a chain that allows sets the accept mark (``0x10000``), one that passes to
the next tier sets the pass mark (``0x20000``); endpoint chains read both (the
verdict contract is described in :mod:`policy.compiler`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from policy.ipsets import IPSetSpec, NamedPortSet, NetSet, SelectorSet
from policy.model import ALL_PODS, IPBlock, PodSelection, PortSpec
from policy.rules import Chain, Rule

ACCEPT_MARK = 0x10000
_ACCEPT = f"{ACCEPT_MARK:#x}/{ACCEPT_MARK:#x}"
SET_ACCEPT = Rule((), "MARK", ("--set-xmark", _ACCEPT))
CLEAR_ACCEPT = Rule((), "MARK", ("--set-xmark", f"0x0/{ACCEPT_MARK:#x}"))
RETURN_IF_ACCEPTED = Rule(("-m", "mark", "--mark", _ACCEPT), "RETURN")

PASS_MARK = 0x20000
_PASS = f"{PASS_MARK:#x}/{PASS_MARK:#x}"
SET_PASS = Rule((), "MARK", ("--set-xmark", _PASS))
RETURN_IF_PASSED = Rule(("-m", "mark", "--mark", _PASS), "RETURN")
CLEAR_PASS = Rule((), "MARK", ("--set-xmark", f"0x0/{PASS_MARK:#x}"))
NOT_PASSED = ("-m", "mark", "--mark", f"0x0/{PASS_MARK:#x}")
CLEAR_MARKS = Rule((), "MARK", ("--set-xmark", f"0x0/{ACCEPT_MARK | PASS_MARK:#x}"))


@dataclass(frozen=True)
class CompiledPolicy:
    """A policy's chains (None for a direction it does not affect) and the
    ipsets those chains refer to."""

    key: str
    ingress: Chain | None
    egress: Chain | None
    ipsets: tuple[IPSetSpec, ...]

    @property
    def chains(self) -> tuple[Chain, ...]:
        """The chains that exist, ingress first."""
        return tuple(c for c in (self.ingress, self.egress) if c is not None)


class Targeted(Protocol):
    """A policy as its matches see it: the pods it applies to (where an ingress
    named port resolves)."""

    @property
    def target(self) -> PodSelection: ...


@dataclass
class Compiling:
    """What every rule of one policy direction needs while it is compiled."""

    policy: Targeted
    direction: str
    family: int
    sets: dict[str, IPSetSpec]

    @property
    def side(self) -> str:
        """Which address is the peer's: the source for ingress, else the destination."""
        return "src" if self.direction == "ingress" else "dst"


def port_match(port: PortSpec | None) -> tuple[str, ...]:
    """Protocol and numeric port (range); named ports only fix the protocol here."""
    if port is None:
        return ()
    proto = port.protocol.lower()
    if not isinstance(port.port, int):
        return ("-p", proto)
    dport = str(port.port) if port.end_port is None else f"{port.port}:{port.end_port}"
    return ("-p", proto, "-m", proto, "--dport", dport)


def address_match(
    ctx: Compiling, peer: PodSelection | IPBlock | None, port: PortSpec | None
) -> tuple[str, ...]:
    """The address part of a rule, folding in named-port resolution."""
    if port is None or not isinstance(port.port, str):
        return peer_match(ctx, peer)
    # The named-port set checks destination IP and port together, so it also
    # decides *which* pods the name resolves on: the policy's own pods for
    # ingress, the peer's pods for egress (all pods when the peer is not a
    # selection).
    if ctx.direction == "ingress":
        where = ctx.policy.target
    else:
        where = peer if isinstance(peer, PodSelection) else ALL_PODS
    named_set = add_set(ctx.sets, NamedPortSet(ctx.family, where, port.protocol, port.port))
    named_match = ("-m", "set", "--match-set", named_set, "dst,dst")
    if ctx.direction == "egress" and isinstance(peer, PodSelection):
        return named_match
    return peer_match(ctx, peer) + named_match


def peer_match(ctx: Compiling, peer: PodSelection | IPBlock | None) -> tuple[str, ...]:
    """Match the remote address against a pod selection or an ipBlock."""
    if peer is None:
        return ()
    if isinstance(peer, PodSelection):
        name = add_set(ctx.sets, SelectorSet(ctx.family, peer))
        return ("-m", "set", "--match-set", name, ctx.side)
    flag = "-s" if ctx.side == "src" else "-d"
    match: tuple[str, ...] = () if peer.cidr.prefixlen == 0 else (flag, str(peer.cidr))
    if peer.excepts:
        except_set = add_set(ctx.sets, NetSet(ctx.family, peer.excepts))
        match += ("-m", "set", "!", "--match-set", except_set, ctx.side)
    return match


def add_set(sets: dict[str, IPSetSpec], spec: IPSetSpec) -> str:
    """Record a set the chain uses and return its name."""
    sets[spec.name] = spec
    return spec.name
