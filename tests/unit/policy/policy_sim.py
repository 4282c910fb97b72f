"""A tiny iptables + ipset interpreter for the compiled chains.

It understands exactly the match and target syntax the compiler emits and
raises on anything else, so a rule iptables would reject (``--dport`` without
``-p``/``-m``, an unknown set, a missing chain) fails the test instead of
being silently skipped.  It models the FORWARD path described in
``policy.compiler``: the source's ``cali-fw`` chain, then the destination's
``cali-tw`` chain, then ACCEPT iff the accept mark is set.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from policy import ACCEPT_MARK, Chain, IPSetSpec, Rule


@dataclass
class Packet:
    """The fields our rules look at; ``mark`` is mutated like skb->mark."""

    src: str
    dst: str
    proto: str  # lower case, as after -p
    dport: int
    ctstate: str = "NEW"
    mark: int = 0


class Simulator:
    """Runs chains against packets using given ipset members."""

    def __init__(
        self,
        chains: Mapping[str, Chain],
        specs: Mapping[str, IPSetSpec],
        members: Mapping[str, frozenset[str]],
    ) -> None:
        self.chains = chains
        self.specs = specs
        self.members = members
        self._parsed: dict[tuple[str, ...], list[tuple[bool, str, tuple[str, ...]]]] = {}

    # ------------------------------------------------------------ FORWARD path

    def forward(self, pkt: Packet, src_iface: str | None, dst_iface: str | None) -> bool:
        """Verdict of the FORWARD path for a packet between endpoints."""
        pkt.mark = 0
        for chain in (
            f"cali-fw-{src_iface}" if src_iface else None,
            f"cali-tw-{dst_iface}" if dst_iface else None,
        ):
            if chain is None:
                continue
            verdict = self.run(chain, pkt)
            if verdict == "DROP":
                return False
            if verdict == "ACCEPT":
                return True
        return bool(pkt.mark & ACCEPT_MARK)

    # ------------------------------------------------------------ chains

    def run(self, name: str, pkt: Packet, depth: int = 0) -> str:
        """ACCEPT, DROP or RETURN (fell off the end / explicit RETURN)."""
        if depth > 8:
            raise RuntimeError("jump loop")
        for rule in self.chains[name].rules:
            if not self.matches(rule, pkt):
                continue
            verdict = self._target(rule, pkt, depth)
            if verdict is not None:
                return verdict
        return "RETURN"

    def _target(self, rule: Rule, pkt: Packet, depth: int) -> str | None:
        """Apply a target; None means "continue with the next rule"."""
        if rule.target in ("ACCEPT", "DROP", "RETURN"):
            assert not rule.target_args
            return rule.target
        if rule.target == "MARK":
            assert rule.target_args[0] == "--set-xmark" and len(rule.target_args) == 2
            value, mask = (int(x, 16) for x in rule.target_args[1].split("/"))
            pkt.mark = (pkt.mark & ~mask) ^ value
            return None
        verdict = self.run(rule.target, pkt, depth + 1)
        return None if verdict == "RETURN" else verdict

    # ------------------------------------------------------------ matches

    def matches(self, rule: Rule, pkt: Packet) -> bool:
        """All match terms of ``rule`` hold (``!`` negates the term after it)."""
        terms = self._parsed.get(rule.match)
        if terms is None:
            terms = self._parsed[rule.match] = parse_match(rule.match)
        return all(self._term(kind, arg, pkt) != negate for negate, kind, arg in terms)

    def _term(self, kind: str, arg: tuple[str, ...], pkt: Packet) -> bool:
        """Evaluate one parsed match term."""
        if kind == "-p":
            return pkt.proto == arg[0]
        if kind == "--dport":
            lo, _, hi = arg[0].partition(":")
            return pkt.proto == arg[1] and int(lo) <= pkt.dport <= int(hi or lo)
        if kind in ("-s", "-d"):
            ip = ipaddress.ip_address(pkt.src if kind == "-s" else pkt.dst)
            return ip in ipaddress.ip_network(arg[0])  # strict: must be canonical
        if kind == "--match-set":
            return self._in_set(arg[0], arg[1], pkt)
        if kind == "--mark":
            value, mask = (int(x, 16) for x in arg[0].split("/"))
            return (pkt.mark & mask) == value
        assert kind == "--ctstate"
        return pkt.ctstate in arg[0].split(",")

    def _in_set(self, name: str, flags: str, pkt: Packet) -> bool:
        """ipset membership by set type, as the kernel tests it."""
        spec = self.specs[name]
        members = self.members[name]
        addr = {"src": pkt.src, "dst": pkt.dst}
        if spec.set_type == "hash:ip":
            assert flags in addr
            return str(ipaddress.ip_address(addr[flags])) in members
        if spec.set_type == "hash:net":
            assert flags in addr
            ip = ipaddress.ip_address(addr[flags])
            return any(ip in ipaddress.ip_network(m) for m in members)
        assert spec.set_type == "hash:ip,port" and flags == "dst,dst"
        if pkt.proto not in ("tcp", "udp", "sctp"):
            return False
        return f"{ipaddress.ip_address(pkt.dst)},{pkt.proto}:{pkt.dport}" in members


_ARITY = {"-p": 1, "--dport": 1, "-s": 1, "-d": 1, "--match-set": 2, "--mark": 1, "--ctstate": 1}
_NEEDS_MODULE = {"--match-set": "set", "--mark": "mark", "--ctstate": "conntrack"}


def parse_match(args: tuple[str, ...]) -> list[tuple[bool, str, tuple[str, ...]]]:
    """(negated, option, values) terms; raises on syntax iptables would reject."""
    terms: list[tuple[bool, str, tuple[str, ...]]] = []
    modules: set[str] = set()
    proto: str | None = None
    negate = False
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "!":
            assert not negate, f"double '!' in {args}"
            negate, i = True, i + 1
            continue
        if tok == "-m":
            modules.add(args[i + 1])
            i += 2
            continue
        assert tok in _ARITY, f"simulator does not understand {tok!r} in {args}"
        values = args[i + 1 : i + 1 + _ARITY[tok]]
        assert len(values) == _ARITY[tok], f"{tok} is missing a value in {args}"
        if tok == "-p":
            proto = values[0]
        if tok == "--dport":
            assert proto is not None and proto in modules, f"--dport without -p/-m in {args}"
            values = (values[0], proto)
        if tok in _NEEDS_MODULE:
            assert _NEEDS_MODULE[tok] in modules, f"{tok} without -m {_NEEDS_MODULE[tok]}"
        terms.append((negate, tok, values))
        negate = False
        i += 1 + _ARITY[tok]
    assert not negate, f"dangling '!' in {args}"
    return terms
