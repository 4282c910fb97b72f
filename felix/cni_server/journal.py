"""The ADD journal: what a restarted agent needs to know about calls it was serving."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from cni.vocabulary import handle_id
from felix.cni_server.endpoints import Endpoint
from felix.cni_server.request import CNIRequest

log = logging.getLogger(__name__)

T = TypeVar("T", bound="PendingAdd")


@dataclass(frozen=True)
class PendingAdd:
    """An ADD that had started and not yet answered when its marker was written."""

    network: str
    container_id: str
    ifname: str
    netns: str
    namespace: str = ""  # the Pod, whose podIP annotation the ADD may have set
    pod: str = ""

    @property
    def handle_id(self) -> str:
        return handle_id(self.network, self.container_id)


@dataclass(frozen=True)
class PendingDel(PendingAdd):
    """A DEL that was answered before its deferred teardown (felix.teardown) finished."""

    host_ifname: str = ""


class AddJournal:
    """One marker file per ADD in flight, so a restarted agent knows what to undo.

    A SIGKILLed agent cannot roll back the ADDs it was serving, and their callers
    were told they failed (the connection closed without an answer). The kernel
    and IPAM alone cannot tell such a fully wired but unanswered pod from one
    that succeeded, so the marker is the only witness. It is removed *before*
    the answer is written: a kill between the two leaves a pod that is wired
    but reported failed (the runtime's DEL after a failed ADD removes it), never
    one reported wired that recovery then tears down. No fsync: the journal
    protects against the agent dying, not the machine (run dirs are tmpfs).
    """

    SUFFIX = ".add"
    DEL_SUFFIX = ".del"
    ENDPOINT_SUFFIX = ".ep"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _path(self, network: str, container_id: str, ifname: str, suffix: str = SUFFIX) -> Path:
        key = hashlib.sha1(f"{network}\0{container_id}\0{ifname}".encode()).hexdigest()
        return self.directory / f"{key}{suffix}"

    def _write(self, entry: PendingAdd, suffix: str) -> None:
        path = self._path(entry.network, entry.container_id, entry.ifname, suffix)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry.__dict__))
        tmp.replace(path)

    def begin(self, request: CNIRequest) -> None:
        """Record the ADD before it touches IPAM or the kernel (atomic rename)."""
        self._write(pending_add(request), self.SUFFIX)

    def end(self, request: CNIRequest) -> None:
        """The ADD is answered (or rolled back by itself): nothing left to undo."""
        self._path(request.network, request.container_id, request.ifname).unlink(missing_ok=True)

    def begin_delete(self, request: CNIRequest, host_ifname: str) -> PendingDel:
        """Record a DEL whose teardown runs after its answer."""
        base = pending_add(request)
        entry = PendingDel(**base.__dict__, host_ifname=host_ifname)
        self._write(entry, self.DEL_SUFFIX)
        return entry

    def pending(self) -> list[PendingAdd]:
        """Every marked ADD; a half-written temp file (killed mid-write) is dropped."""
        for tmp in self.directory.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        return self._read(self.SUFFIX, PendingAdd)

    def pending_deletes(self) -> list[PendingDel]:
        """Every DEL whose teardown had not finished."""
        return self._read(self.DEL_SUFFIX, PendingDel)

    def _read(self, suffix: str, kind: type[T]) -> list[T]:
        found = []
        for path in sorted(self.directory.glob(f"*{suffix}")):
            try:
                found.append(kind(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                log.warning("dropping unreadable marker %s", path)
                path.unlink(missing_ok=True)
        return found

    def record(self, endpoint: Endpoint) -> None:
        """Remember a wired attachment until its DEL: what a restarted agent re-adopts
        (CHECK, resync repair) and the owner recovery asks about."""
        path = self._path(
            endpoint.network, endpoint.container_id, endpoint.ifname, self.ENDPOINT_SUFFIX
        )
        tmp = path.with_suffix(".eptmp")
        tmp.write_text(json.dumps({**endpoint.__dict__, "address": str(endpoint.address)}))
        tmp.replace(path)

    def drop(self, network: str, container_id: str, ifname: str) -> None:
        """The attachment is gone (DEL, rollback, GC): forget its record."""
        self._path(network, container_id, ifname, self.ENDPOINT_SUFFIX).unlink(missing_ok=True)

    def endpoints(self) -> list[Endpoint]:
        """Every recorded attachment; an unreadable record is dropped (logged)."""
        for tmp in self.directory.glob("*.eptmp"):
            tmp.unlink(missing_ok=True)
        found = []
        for path in sorted(self.directory.glob(f"*{self.ENDPOINT_SUFFIX}")):
            try:
                raw = json.loads(path.read_text())
                raw["address"] = ipaddress.IPv4Address(raw["address"])
                found.append(Endpoint(**raw))
            except (OSError, ValueError, TypeError, KeyError):
                log.warning("dropping unreadable endpoint record %s", path)
                path.unlink(missing_ok=True)
        return found

    def forget(self, entry: PendingAdd) -> None:
        """Drop a marker once its ADD has been undone (or its DEL finished)."""
        suffix = self.DEL_SUFFIX if isinstance(entry, PendingDel) else self.SUFFIX
        self._path(entry.network, entry.container_id, entry.ifname, suffix).unlink(missing_ok=True)


def pending_add(request: CNIRequest) -> PendingAdd:
    return PendingAdd(
        request.network,
        request.container_id,
        request.ifname,
        request.netns,
        request.pod.namespace,
        request.pod.name,
    )
