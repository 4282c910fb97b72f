"""iptables rules and chains as plain values.

A :class:`Rule` holds the match arguments exactly as ``iptables-restore``
takes them (``("-p", "tcp", "-m", "tcp", "--dport", "80")``) and a target.
It carries two hashes for drift detection:

* :attr:`Rule.hash` depends on the rule's content only;
* :meth:`Chain.rule_ids` chains the hashes Calico-style (seeded with the
  chain name, each id also covering every rule before it), so a rule that
  moved or a rule inserted above it is noticed too.  :meth:`Chain.render`
  puts these ids in ``-m comment --comment tabby:<id>``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from policy.naming import short_hash

RULE_HASH_LENGTH = 16
COMMENT_PREFIX = "tabby:"


@dataclass(frozen=True)
class Rule:
    """``match`` then ``-j target target_args`` (target: ACCEPT, DROP,
    RETURN, MARK or the name of another chain)."""

    match: tuple[str, ...]
    target: str
    target_args: tuple[str, ...] = ()

    @property
    def args(self) -> tuple[str, ...]:
        """The full argument vector after ``-A <chain>``, without the comment."""
        return (*self.match, "-j", self.target, *self.target_args)

    @property
    def hash(self) -> str:
        """A 16-character hash of the content, stable across runs."""
        return short_hash("\x00".join(self.args), RULE_HASH_LENGTH)


@dataclass(frozen=True)
class Chain:
    """A named, ordered list of rules."""

    name: str
    rules: tuple[Rule, ...] = ()

    def rule_ids(self) -> tuple[str, ...]:
        """Position-dependent ids: h0 = H(name), h_i = H(h_{i-1} + rule_i)."""
        ids = []
        state = hashlib.sha224(self.name.encode()).digest()
        for rule in self.rules:
            state = hashlib.sha224(state + "\x00".join(rule.args).encode()).digest()
            ids.append(short_hash(state.hex(), RULE_HASH_LENGTH))
        return tuple(ids)

    def render(self) -> list[str]:
        """``-A`` lines for iptables-restore, each tagged with its rule id."""
        return [
            " ".join(
                [
                    "-A",
                    self.name,
                    *rule.match,
                    "-m",
                    "comment",
                    "--comment",
                    f'"{COMMENT_PREFIX}{rid}"',
                    "-j",
                    rule.target,
                    *rule.target_args,
                ]
            )
            for rule, rid in zip(self.rules, self.rule_ids(), strict=True)
        ]

    def jump_targets(self) -> frozenset[str]:
        """Chains this chain jumps to (what must exist before it is written)."""
        builtin = {"ACCEPT", "DROP", "RETURN", "MARK", "REJECT", "LOG"}
        return frozenset(r.target for r in self.rules if r.target not in builtin)
