"""Which addresses each Pod stands for in policy, re-derived only for pods a change reaches.

A pod's policy addresses come from three inputs (:mod:`policy.membership`): its
API object (status, phase, deletion), what IPAM records (the address book), and
what this node's agent wired for it. :class:`PodResolver` keeps all three and,
after each change, re-derives only the pods it can affect:

- a Pod object changed: that pod;
- an address changed owner in IPAM: the old and the new owner, and every pod whose
  status claims that address (a stale status loses it when IPAM gives it away);
- a pod was wired or unwired on this node: that pod.

:meth:`PodResolver.take` returns what changed as ``(key, Pod or None)`` for
:class:`felix.calc.PolicyCalculator`: None for a pod that is gone or invalid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from felix.calc.members import PodKey
from policy import Pod, PolicyError
from policy.membership import AddressBook, LocalAddress, Owner, trusted_pod
from policy.model import IPAddress

RawPod = dict[str, Any]


def _status_ips(raw: RawPod) -> set[str]:
    """The addresses a Pod's status claims, as text (for the index only)."""
    status = raw.get("status")
    if not isinstance(status, dict):
        return set()
    found: set[str] = set()
    if isinstance(status.get("podIP"), str):
        found.add(status["podIP"])
    for entry in status.get("podIPs") or ():
        if isinstance(entry, dict) and isinstance(entry.get("ip"), str):
            found.add(entry["ip"])
    return found


class PodResolver:
    """Pod objects + address book + wired addresses -> policy Pods, per change (pure)."""

    def __init__(self, on_invalid: Callable[[PolicyError], None] = lambda _e: None) -> None:
        self._on_invalid = on_invalid
        self._raw: dict[PodKey, RawPod] = {}
        self._book = AddressBook()
        self._wired: dict[PodKey, LocalAddress] = {}
        self._claims: dict[str, set[PodKey]] = {}  # status address -> pods claiming it
        self._resolved: dict[PodKey, Pod] = {}
        self._dirty: set[PodKey] = set()

    # -- inputs ------------------------------------------------------------------------
    def update_pod(self, key: PodKey, raw: RawPod | None) -> None:
        """A Pod object appeared, changed or (None) went away."""
        old = self._raw.get(key)
        for ip in _status_ips(old) if old is not None else ():
            self._claims.get(ip, set()).discard(key)
        if raw is None:
            self._raw.pop(key, None)
        else:
            self._raw[key] = raw
            for ip in _status_ips(raw):
                self._claims.setdefault(ip, set()).add(key)
        self._dirty.add(key)

    def update_book(self, book: AddressBook) -> None:
        """IPAM's owners now; pods whose addresses may follow are re-derived."""
        old, new = self._book.owners(), book.owners()
        if old is new:
            return
        self._book = book
        for ip in _changed(old, new):
            for owner in (old.get(ip), new.get(ip)):
                if owner is not None:
                    self._dirty.add((owner.namespace, owner.pod))
            self._dirty.update(self._claims.get(str(ip), ()))

    def update_wired(self, wired: Mapping[PodKey, LocalAddress]) -> None:
        """The pods wired on this node now, with the address each was given."""
        if wired == self._wired:
            return
        for key in self._wired.keys() | wired.keys():
            if self._wired.get(key) != wired.get(key):
                self._dirty.add(key)
        self._wired = dict(wired)

    # -- outputs -----------------------------------------------------------------------
    def knows(self, key: PodKey) -> bool:
        """Whether the Pod object is here (else the agent reads it from the apiserver)."""
        return key in self._raw

    def take(self) -> list[tuple[PodKey, Pod | None]]:
        """Pods whose policy view changed since the last call (None: gone or invalid)."""
        dirty, self._dirty = self._dirty, set()
        changes: list[tuple[PodKey, Pod | None]] = []
        for key in sorted(dirty):
            pod = self._resolve(key)
            if self._resolved.get(key) == pod:
                continue
            if pod is None:
                self._resolved.pop(key, None)
            else:
                self._resolved[key] = pod
            changes.append((key, pod))
        return changes

    def resolved(self) -> Mapping[PodKey, Pod]:
        """Every valid pod as policy sees it (after :meth:`take`)."""
        return self._resolved

    def _resolve(self, key: PodKey) -> Pod | None:
        raw = self._raw.get(key)
        if raw is None:
            return None
        try:
            return trusted_pod(raw, self._book, self._wired.get(key))
        except PolicyError as exc:
            self._on_invalid(exc)
            return None


def _changed(old: Mapping[IPAddress, Owner], new: Mapping[IPAddress, Owner]) -> Iterable[IPAddress]:
    """Addresses whose owner differs between two books."""
    for ip in old.keys() | new.keys():
        if old.get(ip) != new.get(ip):
            yield ip
