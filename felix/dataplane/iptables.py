"""A desired-state iptables table that writes only what changed, and heals drift.

Design (after Felix's ``iptables/table.go``):

1. *Ownership.* Tabby owns every chain named ``cali-*`` outright. Into other
   chains (the kernel's FORWARD, INPUT, ...) it only inserts or appends its own
   hook rules. Every rule Tabby writes carries ``-m comment --comment
   "tby:<hash>"``; rules without that comment are someone else's and are never
   touched.
2. *No rule parsing.* iptables-save does not round-trip rule text exactly, so
   the kernel is read back as chain names plus, per rule, the hash comment or
   ``None``. The hash of rule *i* is chained over the chain name and rules
   ``0..i``, so a rule that moved or changed, or a rule before it, gives a
   different hash at that position: comparing hash lists finds every change.
3. *Small, atomic writes.* ``apply()`` renders one ``iptables-restore
   --noflush`` transaction for the table, replacing, appending or deleting only
   the rules that differ, so counters of unchanged rules survive and an
   incremental change writes a few lines, not the whole ruleset.
4. *Resync.* ``invalidate()`` (or the refresh interval) throws the cached
   kernel view away; the next ``apply()`` re-reads and repairs whatever another
   program deleted or changed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

from felix.dataplane.backend import NFT, Backend
from felix.dataplane.runner import CommandRunner

log = logging.getLogger(__name__)

HASH_PREFIX = "tby:"
HASH_LENGTH = 16
OWNED_CHAIN_PREFIX = "cali-"
MAX_CHAIN_NAME = 28  # the kernel's limit is 29 bytes with the NUL
TABLES = ("raw", "mangle", "nat", "filter")
_HASH_RE = re.compile(r'--comment "?' + HASH_PREFIX + r'([A-Za-z0-9_-]{16})"?')

# The kernel's view of one table: chain name -> per rule, Tabby's hash or None.
KernelView = dict[str, list[str | None]]


class IptablesError(RuntimeError):
    """A restore kept failing; carries the exact input and the last stderr."""

    def __init__(self, message: str, restore_input: str = "", stderr: str = "") -> None:
        super().__init__(message)
        self.restore_input = restore_input
        self.stderr = stderr


@dataclass(frozen=True)
class Rule:
    """One rule as iptables args (matches then target), without a chain or a comment."""

    args: tuple[str, ...]

    def render(self) -> str:
        """The args as iptables-restore reads them (double quotes around spaces)."""
        return " ".join(_quote(arg) for arg in self.args)


def _quote(arg: str) -> str:
    if arg and not any(c in arg for c in ' "\t\\'):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rule_hashes(seed: str, rules: Sequence[Rule]) -> list[str]:
    """One hash per rule, of the chain (``seed``) and the rule's content.

    Where a rule sits is told by the order of the hashes (a moved, missing or added
    rule changes the sequence); a rule keeps its hash when another is inserted above
    it, so an insert is written as one insert. That matters on nf_tables: a commit
    that deletes or replaces a rule waits for an RCU grace period (about 10 ms here),
    one that only adds does not (2.5 ms).
    """
    prefix = hashlib.sha224(seed.encode()).digest()
    return [
        base64.urlsafe_b64encode(hashlib.sha224(prefix + rule.render().encode()).digest()).decode()[
            :HASH_LENGTH
        ]
        for rule in rules
    ]


def parse_save(text: str, table: str) -> KernelView:
    """Chain names and hash comments of ``table`` in iptables-save output; nothing else."""
    view: KernelView = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("*"):
            current = line[1:].strip()
        elif current != table:
            continue
        elif line.startswith(":"):
            view.setdefault(line[1:].split()[0], [])
        elif line.startswith("-A "):
            chain = line.split(maxsplit=2)[1]
            match = _HASH_RE.search(line)
            view.setdefault(chain, []).append(match.group(1) if match else None)
    return view


def is_owned(chain: str) -> bool:
    return chain.startswith(OWNED_CHAIN_PREFIX)


@dataclass(frozen=True)
class ApplyResult:
    """What one apply() did: bytes of restore input written, chains touched, tries."""

    bytes_written: int = 0
    chains_written: int = 0
    attempts: int = 0
    seconds: float = 0.0  # the whole apply, reads included


@dataclass
class _Hooks:
    """Tabby's rules in one kernel chain: a block at the top and one at the bottom."""

    inserted: list[Rule] = field(default_factory=list)
    appended: list[Rule] = field(default_factory=list)


@dataclass
class _Transaction:
    """The restore lines for one table, in the order iptables-restore needs them."""

    declare: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    flush: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    chains: int = 0

    def render(self, table: str) -> str:
        body = self.declare + self.rules + self.flush + self.delete
        return "\n".join([f"*{table}", *body, "COMMIT", ""]) if body else ""


class Table:
    """Desired state of one iptables table (filter, nat, mangle or raw).

    ``set_chain``/``remove_chain``/``insert_hooks``/``append_hooks`` only record
    intent and mark it dirty; ``apply()`` computes the difference with the
    kernel and writes it in one transaction.
    """

    def __init__(
        self,
        name: str,
        runner: CommandRunner,
        backend: Backend = NFT,
        *,
        max_attempts: int = 3,
        refresh_interval: float | None = 180.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if name not in TABLES:
            raise ValueError(f"unknown iptables table {name!r}")
        self.name = name
        self._runner = runner
        self._backend = backend
        self._max_attempts = max_attempts
        self._refresh_interval = refresh_interval
        self._sleep = sleep
        self._clock = clock
        self._chains: dict[str, list[Rule]] = {}
        # Each owned chain's rule hashes, with the list they were computed from (a
        # changed chain gets a new list: set_chain): a pass hashes only what changed.
        self._hashed: dict[str, tuple[list[Rule], list[str]]] = {}
        self._hooks: dict[str, _Hooks] = {}
        self._kernel: KernelView | None = None
        self._read_at = 0.0
        self._dirty_chains: set[str] = set()
        self._dirty_hooks: set[str] = set()
        self.total_bytes_written = 0

    # -- intent -------------------------------------------------------------

    def set_chain(self, name: str, rules: Iterable[Rule]) -> None:
        """Own chain ``name`` (``cali-*``) with exactly these rules, in order."""
        _check_owned_name(name)
        new = list(rules)
        if self._chains.get(name) != new:
            self._chains[name] = new
            self._dirty_chains.add(name)

    def remove_chain(self, name: str) -> None:
        """Delete chain ``name``; rules that jump to it must be gone in the same apply."""
        self._hashed.pop(name, None)
        if self._chains.pop(name, None) is not None:
            self._dirty_chains.add(name)

    def replace_chains(self, chains: Mapping[str, Iterable[Rule]]) -> None:
        """Own exactly these chains: for an agent that recomputes everything each pass."""
        for name in self.chain_names - set(chains):
            self.remove_chain(name)
        for name, rules in chains.items():
            self.set_chain(name, rules)

    def insert_hooks(self, kernel_chain: str, rules: Iterable[Rule]) -> None:
        """Tabby's rules at the top of a chain it does not own (usually one jump)."""
        self._set_hooks(kernel_chain, rules, append=False)

    def append_hooks(self, kernel_chain: str, rules: Iterable[Rule]) -> None:
        """Tabby's rules at the bottom of a chain it does not own (nat POSTROUTING)."""
        self._set_hooks(kernel_chain, rules, append=True)

    def _set_hooks(self, chain: str, rules: Iterable[Rule], *, append: bool) -> None:
        if is_owned(chain):
            raise ValueError(f"{chain} is Tabby's own chain: use set_chain")
        hooks = self._hooks.setdefault(chain, _Hooks())
        new = list(rules)
        current = hooks.appended if append else hooks.inserted
        if current != new:
            current[:] = new
            self._dirty_hooks.add(chain)

    def invalidate(self) -> None:
        """Forget the cached kernel view: the next apply re-reads and repairs drift."""
        self._kernel = None

    @property
    def chain_names(self) -> set[str]:
        return set(self._chains)

    # -- apply --------------------------------------------------------------

    def apply(self) -> ApplyResult:
        """Make the kernel match; retried with a re-read, then :class:`IptablesError`."""
        if self._refresh_due():
            self.invalidate()
        started = self._clock()
        text, stderr = "", ""
        for attempt in range(1, self._max_attempts + 1):
            if self._kernel is None:
                try:
                    self._resync()
                except IptablesError as exc:
                    stderr = str(exc)
                    self._back_off(attempt)
                    continue
            assert self._kernel is not None
            txn = self._plan(self._kernel)
            text = txn.render(self.name)
            if not text:
                self._clear_dirty()
                return ApplyResult(attempts=attempt, seconds=self._clock() - started)
            result = self._runner.run(self._backend.restore_argv(), text)
            if result.ok:
                self._kernel = self._expected_view(self._kernel)
                self._clear_dirty()
                self.total_bytes_written += len(text.encode())
                elapsed = self._clock() - started
                return ApplyResult(len(text.encode()), txn.chains, attempt, elapsed)
            stderr = result.stderr
            self._log_failure(attempt, stderr, text)
            self.invalidate()
            self._back_off(attempt)
        raise IptablesError(f"iptables-restore of table {self.name} kept failing", text, stderr)

    def _log_failure(self, attempt: int, stderr: str, text: str) -> None:
        """The exact input, so a failed transaction can be replayed by hand."""
        log.error(
            "iptables-restore (%s, table %s, try %d/%d) failed: %s\ninput was:\n%s",
            self._backend.name,
            self.name,
            attempt,
            self._max_attempts,
            stderr.strip(),
            text,
        )

    def _back_off(self, attempt: int) -> None:
        if attempt < self._max_attempts:
            self._sleep(0.05 * 2**attempt)

    def _refresh_due(self) -> bool:
        interval = self._refresh_interval
        return interval is not None and self._clock() - self._read_at >= interval

    def _resync(self) -> None:
        """Read the kernel and mark everything that might differ as dirty."""
        self._kernel = read_kernel_view(self._runner, self._backend, self.name)
        self._read_at = self._clock()
        self._dirty_chains |= set(self._chains) | {c for c in self._kernel if is_owned(c)}
        self._dirty_hooks |= set(self._hooks) | {
            c for c, hashes in self._kernel.items() if not is_owned(c) and any(hashes)
        }

    def _clear_dirty(self) -> None:
        self._dirty_chains.clear()
        self._dirty_hooks.clear()

    def _plan(self, kernel: KernelView) -> _Transaction:
        txn = _Transaction()
        for chain in sorted(self._dirty_chains):
            self._plan_owned(txn, chain, kernel.get(chain))
        for chain in sorted(self._dirty_hooks):
            self._plan_hooks(txn, chain, kernel.get(chain, []))
        return txn

    def _plan_owned(self, txn: _Transaction, chain: str, current: list[str | None] | None) -> None:
        desired = self._chains.get(chain)
        if desired is None:
            if current is not None:
                txn.flush.append(f"-F {chain}")
                txn.delete.append(f"-X {chain}")
                txn.chains += 1
            return
        hashes = self._chain_hashes(chain, desired)
        if current == hashes:
            return
        txn.chains += 1
        if current is None:
            txn.declare.append(f":{chain} - [0:0]")
            current = []
        txn.rules.extend(_edit_lines(chain, current, desired, hashes))

    def _chain_hashes(self, chain: str, rules: list[Rule]) -> list[str]:
        known = self._hashed.get(chain)
        if known is None or known[0] is not rules:
            known = (rules, rule_hashes(chain, rules))
            self._hashed[chain] = known
        return known[1]

    def _plan_hooks(self, txn: _Transaction, chain: str, current: list[str | None]) -> None:
        hooks = self._hooks.get(chain, _Hooks())
        ins = rule_hashes(chain, hooks.inserted)
        app = rule_hashes(chain + "/append", hooks.appended)
        if _hooks_in_place(current, ins, app):
            return
        txn.chains += 1
        ours = [i for i, h in enumerate(current) if h is not None]
        txn.rules.extend(f"-D {chain} {i + 1}" for i in reversed(ours))
        for i, (rule, want) in enumerate(zip(hooks.inserted, ins, strict=True)):
            txn.rules.append(f"-I {chain} {i + 1} {_with_hash(rule, want)}")
        for rule, want in zip(hooks.appended, app, strict=True):
            txn.rules.append(f"-A {chain} {_with_hash(rule, want)}")

    def _expected_view(self, kernel: KernelView) -> KernelView:
        """The kernel view after a successful write of every dirty item."""
        view = {chain: list(hashes) for chain, hashes in kernel.items()}
        for chain in self._dirty_chains:
            if chain in self._chains:
                view[chain] = list(self._chain_hashes(chain, self._chains[chain]))
            else:
                view.pop(chain, None)
        for chain in self._dirty_hooks:
            hooks = self._hooks.get(chain, _Hooks())
            foreign = [h for h in view.get(chain, []) if h is None]
            view[chain] = [
                *rule_hashes(chain, hooks.inserted),
                *foreign,
                *rule_hashes(chain + "/append", hooks.appended),
            ]
        return view


def _edit_lines(
    chain: str, current: list[str | None], desired: Sequence[Rule], hashes: list[str]
) -> list[str]:
    """The fewest deletes and inserts that turn the kernel's chain into the desired one.

    From the end of the chain backwards, so each line's position is still right when
    it runs: rules kept keep their place, a new rule is one ``-I``, a rule gone is one
    ``-D``, and rules without Tabby's hash (added by hand) are deleted.
    """
    lines: list[str] = []
    matcher = SequenceMatcher(None, current, hashes, autojunk=False)
    for tag, i1, i2, j1, j2 in reversed(matcher.get_opcodes()):
        if tag == "equal":
            continue
        lines.extend(f"-D {chain} {k}" for k in range(i2, i1, -1))
        # -I at (length + 1) appends: both backends take it
        lines.extend(
            f"-I {chain} {i1 + 1 + offset} {_with_hash(desired[j], hashes[j])}"
            for offset, j in enumerate(range(j1, j2))
        )
    return lines


def _check_owned_name(name: str) -> None:
    if not is_owned(name):
        raise ValueError(f"chain {name!r} must start with {OWNED_CHAIN_PREFIX!r}")
    if len(name) > MAX_CHAIN_NAME:
        raise ValueError(f"chain {name!r} is longer than {MAX_CHAIN_NAME} characters")


def _with_hash(rule: Rule, rule_hash: str) -> str:
    return f'-m comment --comment "{HASH_PREFIX}{rule_hash}" {rule.render()}'


def _hooks_in_place(current: list[str | None], ins: list[str], app: list[str]) -> bool:
    """True if Tabby's rules are exactly ``ins`` at the top and ``app`` at the bottom."""
    ours = [h for h in current if h is not None]
    if ours != ins + app:
        return False
    return current[: len(ins)] == ins and (not app or current[-len(app) :] == app)


def read_kernel_view(runner: CommandRunner, backend: Backend, table: str) -> KernelView:
    """Chain names and Tabby hashes of ``table``, through save output or libiptc."""
    argv = backend.iptc_argv(table) if backend.reader == "iptc" else backend.save_argv(table)
    result = runner.run(argv)
    if not result.ok:
        raise IptablesError(f"reading table {table} failed: {result.stderr.strip()}")
    if backend.reader == "iptc":
        raw = json.loads(result.stdout)
        return {str(chain): [h if h else None for h in hashes] for chain, hashes in raw.items()}
    return parse_save(result.stdout, table)
