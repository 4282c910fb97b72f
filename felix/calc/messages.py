"""Typed dataplane messages: what changed between two of a node's desired states.

The calculation layer's answer (:class:`policy.DesiredState`) keeps the very same
:class:`policy.Chain` and members objects for whatever a change did not reach, so
the difference between two answers is found by identity, without comparing rules or
members: a chain or set whose object is new is an update, a name that is gone is an
explicit removal. The policy manager writes only these (:meth:`felix.policy_dataplane.
PolicyDataplane.apply_changes`); :func:`fold` applies them to a state, which is how the
tests check that nothing is lost: ``fold(old, changes(old, new)) == new``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from policy import Chain, DesiredState, IPSetSpec


@dataclass(frozen=True)
class ChainUpdate:
    """Own chain ``chain.name`` with exactly ``chain.rules`` (created if missing)."""

    chain: Chain


@dataclass(frozen=True)
class ChainRemove:
    """Chain ``name`` is no longer wanted (nothing left jumps to it)."""

    name: str


@dataclass(frozen=True)
class IPSetUpdate:
    """Set ``spec.name`` of ``spec``'s type holds exactly ``members``."""

    spec: IPSetSpec
    members: frozenset[str]


@dataclass(frozen=True)
class IPSetRemove:
    """Set ``name`` is no longer wanted (no chain refers to it)."""

    name: str


Message = ChainUpdate | ChainRemove | IPSetUpdate | IPSetRemove


def changes(old: DesiredState, new: DesiredState) -> list[Message]:
    """The messages that turn ``old`` into ``new``: updates first, removals last."""
    out: list[Message] = []
    if new.chains is not old.chains:
        out += [ChainUpdate(c) for n, c in new.chains.items() if old.chains.get(n) is not c]
    for name, spec in new.ipsets.items():
        members = new.members.get(name, frozenset())
        if old.ipsets.get(name) != spec or old.members.get(name) is not members:
            out.append(IPSetUpdate(spec, members))
    if new.chains is not old.chains:
        out += [ChainRemove(n) for n in old.chains if n not in new.chains]
    out += [IPSetRemove(n) for n in old.ipsets if n not in new.ipsets]
    return out


def fold(state: DesiredState, messages: Iterable[Message]) -> DesiredState:
    """``state`` with ``messages`` applied (what a dataplane that obeys them holds)."""
    chains, ipsets, members = dict(state.chains), dict(state.ipsets), dict(state.members)
    for message in messages:
        match message:
            case ChainUpdate(chain):
                chains[chain.name] = chain
            case ChainRemove(name):
                chains.pop(name, None)
            case IPSetUpdate(spec, set_members):
                ipsets[spec.name] = spec
                members[spec.name] = set_members
            case IPSetRemove(name):
                ipsets.pop(name, None)
                members.pop(name, None)
    return DesiredState(chains, ipsets, members)
