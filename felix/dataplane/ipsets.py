"""Desired-state ipsets, updated atomically and deleted only when no rule needs them.

Tabby owns every set whose name starts with ``cali40`` (IPv4; ``cali60`` for
IPv6) and uses ``cali4t``/``cali6t`` names for temporary sets. Other sets are
never read into the desired/actual diff, let alone changed.

A policy rule that matches a set must never see it half-filled, and iptables
must never reference a set that does not exist. Hence:

* a new set is created and filled in one ``ipset restore``;
* a small change to a live set is ``add``/``del`` lines (each is atomic);
* a large one fills a temporary set and ``swap``s it in, so a packet sees the
  old members or the new, never a mix;
* the apply is split in two phases around the iptables tables:
  :meth:`IpsetManager.apply_updates` (creates and updates) first, then
  iptables, then :meth:`IpsetManager.apply_deletions`, which destroys sets no
  longer wanted (the kernel refuses while a rule still references them; such a
  set simply stays pending until the next apply).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from felix.dataplane.runner import CommandRunner

log = logging.getLogger(__name__)

SET_TYPES = ("hash:ip", "hash:net", "hash:ip,port", "hash:net,port")
MAX_SET_NAME = 31
MAX_SET_SIZE = 1048576  # Felix's MaxIpsetSize default
NOMATCH = " nomatch"


class IpsetError(RuntimeError):
    """An ``ipset restore`` kept failing; carries the exact input and stderr."""

    def __init__(self, message: str, restore_input: str = "", stderr: str = "") -> None:
        super().__init__(message)
        self.restore_input = restore_input
        self.stderr = stderr


@dataclass(frozen=True)
class IpsetSpec:
    """A set as Tabby wants it, or as the kernel has it (members normalised)."""

    set_type: str
    members: frozenset[str] = frozenset()


@dataclass(frozen=True)
class IpsetApplyResult:
    bytes_written: int = 0
    sets_written: int = 0
    sets_swapped: int = 0
    sets_destroyed: int = 0


@dataclass
class _Plan:
    lines: list[str] = field(default_factory=list)
    written: int = 0
    swapped: int = 0

    def text(self) -> str:
        return "\n".join([*self.lines, ""]) if self.lines else ""


def normalize_members(set_type: str, members: Iterable[str]) -> frozenset[str]:
    """Members as ``ipset save`` prints them, so desired and actual compare equal."""
    out: set[str] = set()
    for member in members:
        out.update(_normalize(set_type, member.strip()))
    return frozenset(out)


# A set that gains one member is given whole again; remembering each member's form
# keeps that pass proportional to the change, not to the set (a set of every pod in
# a 10,000-pod cluster took 4 ms to parse again for one new member).
@functools.lru_cache(maxsize=1 << 16)
def _normalize(set_type: str, member: str) -> tuple[str, ...]:
    suffix = ""
    if member.endswith(NOMATCH):
        member, suffix = member[: -len(NOMATCH)].strip(), NOMATCH
    addr, _, port = member.partition(",")
    if set_type.startswith("hash:net"):
        nets = _split_default(ipaddress.ip_network(addr, strict=False))
        addrs = [_net_text(net) for net in nets]
    else:
        addrs = [str(ipaddress.ip_interface(addr).ip)]
    if set_type.endswith(",port"):
        proto, _, number = port.partition(":")
        addrs = [f"{a},{proto.lower()}:{int(number)}" for a in addrs]
    return tuple(a + suffix for a in addrs)


def _split_default(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> list[object]:
    """hash:net cannot hold a /0; two halves match the same addresses."""
    return list(net.subnets()) if net.prefixlen == 0 else [net]


def _net_text(net: object) -> str:
    assert isinstance(net, ipaddress.IPv4Network | ipaddress.IPv6Network)
    return str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)


def parse_ipset_save(text: str, prefixes: tuple[str, ...]) -> dict[str, IpsetSpec]:
    """Sets whose names start with one of ``prefixes``, from ``ipset save`` output."""
    types: dict[str, str] = {}
    members: dict[str, set[str]] = {}
    for line in text.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) < 3 or not parts[1].startswith(prefixes):
            continue
        if parts[0] == "create":
            types[parts[1]] = parts[2].split()[0]
            members.setdefault(parts[1], set())
        elif parts[0] == "add":
            members.setdefault(parts[1], set()).add(parts[2].strip())
    return {name: IpsetSpec(t, frozenset(members.get(name, ()))) for name, t in types.items()}


class IpsetManager:
    """Desired state of one IP family's Tabby-owned ipsets in one network namespace."""

    def __init__(
        self,
        runner: CommandRunner,
        *,
        ip_version: int = 4,
        small_change: int = 64,
        max_attempts: int = 3,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if ip_version not in (4, 6):
            raise ValueError("ip_version must be 4 or 6")
        self.prefix = f"cali{ip_version}0"
        self.temp_prefix = f"cali{ip_version}t"
        self._family = "inet" if ip_version == 4 else "inet6"
        self._runner = runner
        self._small_change = small_change
        self._max_attempts = max_attempts
        self._sleep = sleep
        self._desired: dict[str, IpsetSpec] = {}
        self._kernel: dict[str, IpsetSpec] | None = None
        self._dirty: set[str] = set()
        # The last frozenset of members given per set: an agent that passes the same
        # object again (its calculation did not touch the set) skips the parsing.
        self._given: dict[str, tuple[str, frozenset[str]]] = {}

    # -- intent -------------------------------------------------------------

    def set_members(self, name: str, set_type: str, members: Iterable[str]) -> None:
        """Want set ``name`` of ``set_type`` to hold exactly ``members``."""
        self._check_name(name)
        if set_type not in SET_TYPES:
            raise ValueError(f"unsupported set type {set_type!r}; use one of {SET_TYPES}")
        given = self._given.get(name)
        if given is not None and given[1] is members and given[0] == set_type:
            return  # the very same immutable members as last time: nothing to parse
        spec = IpsetSpec(set_type, normalize_members(set_type, members))
        if isinstance(members, frozenset):
            self._given[name] = (set_type, members)
        if self._desired.get(name) != spec:
            self._desired[name] = spec
            self._dirty.add(name)

    def replace_sets(self, sets: Mapping[str, tuple[str, Iterable[str]]]) -> None:
        """Want exactly these sets (name -> (type, members)); others go at apply_deletions."""
        for name in set(self._desired) - set(sets):
            self.remove(name)
        for name, (set_type, members) in sets.items():
            self.set_members(name, set_type, members)

    def remove(self, name: str) -> None:
        """Stop wanting ``name``; it is destroyed by the next apply_deletions."""
        self._desired.pop(name, None)
        self._given.pop(name, None)

    def invalidate(self) -> None:
        """Forget the cached kernel view: the next apply re-reads and repairs drift."""
        self._kernel = None

    @property
    def pending_deletions(self) -> set[str]:
        """Owned sets the kernel still has but nobody wants (as last read)."""
        return {n for n in (self._kernel or {}) if n not in self._desired}

    def _check_name(self, name: str) -> None:
        if not name.startswith(self.prefix) or len(name) > MAX_SET_NAME:
            raise ValueError(f"set {name!r} must start with {self.prefix} and fit 31 characters")

    # -- phase 1: creates and updates ----------------------------------------

    def apply_updates(self) -> IpsetApplyResult:
        """Create and update every wanted set; run before the iptables tables apply."""
        text, stderr = "", ""
        for attempt in range(1, self._max_attempts + 1):
            if self._kernel is None:
                self._resync()
            assert self._kernel is not None
            plan = self._plan(self._kernel)
            text = plan.text()
            if not text:
                self._dirty.clear()
                return IpsetApplyResult()
            result = self._runner.run(["ipset", "restore", "-exist"], text)
            if result.ok:
                self._after_write(self._kernel)
                return IpsetApplyResult(len(text.encode()), plan.written, plan.swapped)
            stderr = result.stderr
            log.error(
                "ipset restore (try %d/%d) failed: %s\ninput was:\n%s",
                attempt,
                self._max_attempts,
                stderr.strip(),
                text,
            )
            self.invalidate()
            if attempt < self._max_attempts:
                self._sleep(0.05 * 2**attempt)
        raise IpsetError("ipset restore kept failing", text, stderr)

    def _resync(self) -> None:
        result = self._runner.run(["ipset", "save"])
        if not result.ok:
            raise IpsetError(f"ipset save failed: {result.stderr.strip()}")
        self._kernel = parse_ipset_save(result.stdout, (self.prefix, self.temp_prefix))
        self._dirty |= set(self._desired) | set(self._kernel)

    def _plan(self, kernel: dict[str, IpsetSpec]) -> _Plan:
        plan = _Plan()
        # Temporary sets left by a crash mid-swap are garbage: clear them first.
        plan.lines += [f"destroy {n}" for n in sorted(kernel) if n.startswith(self.temp_prefix)]
        for name in sorted(self._dirty & set(self._desired)):
            self._plan_set(plan, name, self._desired[name], kernel.get(name))
        return plan

    def _plan_set(self, plan: _Plan, name: str, want: IpsetSpec, have: IpsetSpec | None) -> None:
        if have == want:
            return
        plan.written += 1
        if have is not None and have.set_type != want.set_type:
            # Types cannot be swapped; this fails loudly if a rule still uses the set.
            plan.lines.append(f"destroy {name}")
            have = None
        if have is None:
            plan.lines.append(self._create(name, want.set_type))
            plan.lines += [f"add {name} {m}" for m in sorted(want.members)]
            return
        removed, added = have.members - want.members, want.members - have.members
        if len(removed) + len(added) <= self._small_change:
            plan.lines += [f"del {name} {m.removesuffix(NOMATCH)}" for m in sorted(removed)]
            plan.lines += [f"add {name} {m}" for m in sorted(added)]
            return
        temp = self.temp_prefix + name[len(self.prefix) :]
        plan.swapped += 1
        plan.lines.append(self._create(temp, want.set_type))
        plan.lines += [f"add {temp} {m}" for m in sorted(want.members)]
        plan.lines += [f"swap {temp} {name}", f"destroy {temp}"]

    def _create(self, name: str, set_type: str) -> str:
        return f"create {name} {set_type} family {self._family} maxelem {MAX_SET_SIZE}"

    def _after_write(self, kernel: dict[str, IpsetSpec]) -> None:
        for name in list(kernel):
            if name.startswith(self.temp_prefix):
                del kernel[name]
        for name in self._dirty & set(self._desired):
            kernel[name] = self._desired[name]
        self._dirty.clear()

    # -- phase 2: deletions ---------------------------------------------------

    def apply_deletions(self) -> IpsetApplyResult:
        """Destroy owned sets nobody wants; run after the iptables tables applied.

        A set still referenced by a rule cannot be destroyed; it stays pending
        and is retried on the next call instead of failing the whole apply.
        """
        if self._kernel is None:
            self._resync()
        destroyed = 0
        for name in sorted(self.pending_deletions):
            result = self._runner.run(["ipset", "destroy", name])
            if result.ok:
                destroyed += 1
                assert self._kernel is not None
                self._kernel.pop(name, None)
            else:
                log.warning("ipset destroy %s failed (kept pending): %s", name, result.stderr)
        return IpsetApplyResult(sets_destroyed=destroyed)
