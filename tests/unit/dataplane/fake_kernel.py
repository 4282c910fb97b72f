"""A stateful fake of the kernel's iptables (both backends) and ipsets.

It implements :class:`felix.dataplane.runner.CommandRunner`: it *parses*
iptables-restore and ipset restore input, applies it to its own state with the
kernel's rules (a restore is all-or-nothing per table; a jump needs its target
chain; a rule needs its ipset; a set in use cannot be destroyed) and prints
save output from that state. Tests assert on the resulting state, not on
which commands ran. ``fail_next`` injects failures.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from felix.dataplane.iptables import parse_save
from felix.dataplane.runner import CommandResult

BUILTINS = {
    "filter": ["INPUT", "FORWARD", "OUTPUT"],
    "nat": ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
    "mangle": ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
    "raw": ["PREROUTING", "OUTPUT"],
}
_TARGET_RE = re.compile(r"(?:^|\s)-[jg]\s+(\S+)")
_SET_RE = re.compile(r"--match-set\s+(\S+)")

Tables = dict[str, dict[str, list[str]]]


class FakeError(Exception):
    pass


def _empty_tables() -> Tables:
    return {t: {c: [] for c in chains} for t, chains in BUILTINS.items()}


@dataclass
class FakeKernel:
    """Both iptables backends and the ipsets of one fake network namespace."""

    iptables: dict[str, Tables] = field(
        default_factory=lambda: {"nft": _empty_tables(), "legacy": _empty_tables()}
    )
    ipsets: dict[str, tuple[str, set[str]]] = field(default_factory=dict)
    fail_next: set[str] = field(default_factory=set)
    restore_inputs: list[str] = field(default_factory=list)
    ipset_inputs: list[str] = field(default_factory=list)
    reads: int = 0

    # -- CommandRunner ------------------------------------------------------

    def run(self, argv: Sequence[str], stdin: str | None = None) -> CommandResult:
        args = tuple(argv)
        try:
            out = self._dispatch(args, stdin or "")
        except FakeError as exc:
            return CommandResult(args, 1, "", str(exc))
        return CommandResult(args, 0, out, "")

    def _dispatch(self, argv: tuple[str, ...], stdin: str) -> str:
        cmd = argv[0]
        if cmd.startswith(("iptables-", "ip6tables-")) and cmd.endswith("-save"):
            return self._save(_family_key(cmd), argv)
        if cmd.startswith(("iptables-", "ip6tables-")) and cmd.endswith("-restore"):
            if "--noflush" not in argv:
                raise FakeError("restore without --noflush would flush every chain")
            self._maybe_fail("iptables-restore")
            self.restore_inputs.append(stdin)
            self._restore(_family_key(cmd), stdin)
            return ""
        if cmd == "ipset":
            return self._ipset(argv[1:], stdin)
        if argv[1].endswith("legacy_helper.py"):  # the libiptc reader
            self.reads += 1
            table, key = argv[-1], "legacy6" if "--ipv6" in argv else "legacy"
            return json.dumps(parse_save(self.save_text(key, [table]), table))
        raise FakeError(f"fake kernel does not know {argv}")

    def _maybe_fail(self, what: str) -> None:
        if what in self.fail_next:
            self.fail_next.discard(what)
            raise FakeError(f"injected failure of {what}")

    # -- iptables -----------------------------------------------------------

    def _save(self, backend: str, argv: tuple[str, ...]) -> str:
        self.reads += 1
        tables = [argv[argv.index("-t") + 1]] if "-t" in argv else list(BUILTINS)
        return self.save_text(backend, tables)

    def save_text(self, backend: str, tables: list[str]) -> str:
        self.iptables.setdefault(backend, _empty_tables())
        lines = []
        for table in tables:
            chains = self.iptables[backend][table]
            lines.append(f"*{table}")
            for chain in chains:
                policy = "ACCEPT" if chain in BUILTINS[table] else "-"
                lines.append(f":{chain} {policy} [0:0]")
            lines += [f"-A {chain} {rule}" for chain, rules in chains.items() for rule in rules]
            lines.append("COMMIT")
        return "\n".join(lines) + "\n"

    def _restore(self, backend: str, text: str) -> None:
        self.iptables.setdefault(backend, _empty_tables())
        staged = {
            t: {c: list(r) for c, r in chains.items()}
            for t, chains in self.iptables[backend].items()
        }
        table: str | None = None
        for lineno, line in enumerate(text.splitlines(), 1):
            try:
                table = self._restore_line(staged, table, line)
            except (FakeError, IndexError, ValueError) as exc:
                raise FakeError(f"line {lineno} failed: {line!r}: {exc}") from exc
        self.iptables[backend] = staged

    def _restore_line(self, staged: Tables, table: str | None, line: str) -> str | None:
        if not line.strip() or line.startswith("#"):
            return table
        if line.startswith("*"):
            return line[1:].strip()
        if line == "COMMIT":
            return None
        if table is None:
            raise FakeError("rule outside a table")
        chains = staged[table]
        if line.startswith(":"):
            name = line[1:].split(maxsplit=1)[0]
            if name not in BUILTINS[table]:
                chains[name] = []
            return table
        op, chain, *rest = line.split(maxsplit=2)
        body = rest[0] if rest else ""
        if chain not in chains:
            raise FakeError(f"no chain {chain}")
        self._rule_op(chains, op, chain, body)
        return table

    def _rule_op(self, chains: dict[str, list[str]], op: str, chain: str, body: str) -> None:
        rules = chains[chain]
        if op in ("-I", "-R"):
            index, _, body = body.partition(" ")
            pos = int(index) - 1
            self._check_rule(chains, body)
            if op == "-I" and 0 <= pos <= len(rules):
                rules.insert(pos, body)
            elif op == "-R" and 0 <= pos < len(rules):
                rules[pos] = body
            else:
                raise FakeError("index out of range")
        elif op == "-A":
            self._check_rule(chains, body)
            rules.append(body)
        elif op == "-D":
            del rules[int(body) - 1]
        elif op == "-F":
            rules.clear()
        elif op == "-X":
            self._delete_chain(chains, chain)
        else:
            raise FakeError(f"unknown op {op}")

    def _check_rule(self, chains: dict[str, list[str]], body: str) -> None:
        shlex.split(body)  # unbalanced quotes are a syntax error, as in iptables-restore
        match = _TARGET_RE.search(body)
        if match is None:
            raise FakeError("no target")
        target = match.group(1)
        if target not in chains and not target.isupper():
            raise FakeError(f"Couldn't load target `{target}'")
        for name in _SET_RE.findall(body):
            if name not in self.ipsets:
                raise FakeError(f"Set {name} doesn't exist")

    def _delete_chain(self, chains: dict[str, list[str]], chain: str) -> None:
        if chains[chain]:
            raise FakeError(f"chain {chain} is not empty")
        for rules in chains.values():
            for rule in rules:
                found = _TARGET_RE.search(rule)
                if found is not None and found.group(1) == chain:
                    raise FakeError(f"chain {chain} is in use")
        del chains[chain]

    # -- ipset --------------------------------------------------------------

    def _ipset(self, args: tuple[str, ...], stdin: str) -> str:
        if args[0] == "save":
            self.reads += 1
            return self.ipset_save()
        if args[0] == "restore":
            self._maybe_fail("ipset-restore")
            self.ipset_inputs.append(stdin)
            for line in stdin.splitlines():
                if line.strip():
                    self._ipset_cmd(line.split(), exist="-exist" in args)
            return ""
        self._ipset_cmd(list(args), exist=False)
        return ""

    def ipset_save(self) -> str:
        lines = []
        for name, (set_type, members) in self.ipsets.items():
            lines.append(f"create {name} {set_type} family inet hashsize 1024 maxelem 1048576")
            lines += [f"add {name} {m}" for m in sorted(members)]
        return "\n".join(lines) + "\n"

    def _ipset_cmd(self, words: list[str], *, exist: bool) -> None:
        cmd, name, *rest = words
        if cmd == "create":
            if name in self.ipsets and not (exist and self.ipsets[name][0] == rest[0]):
                raise FakeError(f"set {name} already exists")
            self.ipsets.setdefault(name, (rest[0], set()))
        elif name not in self.ipsets:
            raise FakeError(f"The set with the given name does not exist: {name}")
        elif cmd == "add":
            self.ipsets[name][1].add(" ".join(rest))
        elif cmd == "del":
            self.ipsets[name][1].discard(rest[0])
            self.ipsets[name][1].discard(rest[0] + " nomatch")
        elif cmd == "swap":
            other = rest[0]
            if self.ipsets[other][0] != self.ipsets[name][0]:
                raise FakeError("types differ")
            self.ipsets[name], self.ipsets[other] = self.ipsets[other], self.ipsets[name]
        elif cmd == "destroy":
            if self._set_in_use(name):
                raise FakeError("Set cannot be destroyed: it is in use by a kernel component")
            del self.ipsets[name]
        else:
            raise FakeError(f"unknown ipset command {cmd}")

    def _set_in_use(self, name: str) -> bool:
        return any(
            name in _SET_RE.findall(rule)
            for tables in self.iptables.values()
            for chains in tables.values()
            for rules in chains.values()
            for rule in rules
        )

    # -- helpers for tests ----------------------------------------------------

    def rules(self, backend: str, table: str, chain: str) -> list[str]:
        """Rule bodies of one chain, without the Tabby hash comment, for assertions."""
        return [strip_hash(r) for r in self.iptables[backend][table][chain]]

    def members(self, name: str) -> set[str]:
        return set(self.ipsets[name][1])


def _family_key(cmd: str) -> str:
    """``iptables-nft-save`` -> "nft", ``ip6tables-legacy-restore`` -> "legacy6"."""
    family, backend = cmd.split("-")[:2]
    return backend + ("6" if family == "ip6tables" else "")


def strip_hash(rule: str) -> str:
    return re.sub(r'-m comment --comment "tby:[A-Za-z0-9_-]{16}" ', "", rule)
