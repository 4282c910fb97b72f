"""The node agent's side of the CNI contract: a unix-socket server and its handlers.

``cni/shim.py`` forwards every CNI call here as one JSON message; this module
validates it again (with the shim's own validators), runs the handler and
answers ``{"result": ...}`` or ``{"error": {code, msg, details}}``.

Contract per command:

- **ADD** answers only after, in order: the agent is ready (else code 11), the
  address is assigned to handle ``<network>.<containerID>`` (idempotent, so a
  repeated ADD gets the same address), the veth/addresses/routes/sysctls are
  wired (:mod:`felix.wiring`), the endpoint is in :attr:`CNIHandlers.endpoints`,
  the ``on_endpoint_added`` hook has returned and the Pod is annotated
  (``tabby.dev/podIP``, ``tabby.dev/containerID``; that apiserver write runs
  beside the hook, both are waited for). The hook is where the policy
  dataplane plugs in: it should return once the endpoint's chains are
  programmed, so a pod never sends a packet before its policy exists. Any
  failure rolls back the host veth and the address (also those of an earlier
  identical ADD: the runtime follows a failed ADD with DEL anyway).
- **DEL** never needs the agent to be synced; it removes the veth (inside the
  pod netns; by host name only if this container still owns it), releases the
  handle and clears the Pod's podIP annotation. Missing pieces are fine.
- **CHECK** compares the kernel with what ADD built and names each difference
  (code 100); an unknown container is code 3.
- **STATUS** is code 50 until :meth:`CNIHandlers.set_synced` and the allocator
  says a pool can serve.
- **GC** releases every handle and endpoint of this network whose container is
  not in ``cni.dev/attachments``; it carries on past errors and reports them.

Calls for one container id are serialized; different containers run in
parallel (one thread per connection).

**Restart after a crash** (SIGKILL, OOM): an ADD cut off mid-way cannot roll
itself back, and its caller saw a failure. With an :class:`AddJournal`, every
ADD leaves a marker for as long as it runs (removed just before the answer is
sent), and every answered ADD leaves a record of its endpoint until its DEL.
:func:`recover_after_restart`, run at start-up before the socket serves, undoes
every ADD still marked, re-adopts each recorded endpoint whose owner is alive
(sandbox netns present, Pod not gone), frees the others, and deletes ``cali``
veths nobody owns. A pod whose route was deleted keeps its veth and address:
routes, sysctls and veth state are desired state that :meth:`CNIHandlers.repair`
(the agent's periodic resync) puts back.

One host veth per container: an ADD for a second ``CNI_IFNAME`` of a wired
container is refused (code 4) rather than taking over the first's veth.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import ipaddress
import json
import logging
import os
import signal
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pyroute2.netlink.exceptions import NetlinkError

from cni import results
from cni.shim import (
    COMMANDS,
    ERR_CHECK_FAILED,
    ERR_DECODING,
    ERR_INTERNAL,
    ERR_INVALID_ENV,
    ERR_NOT_AVAILABLE,
    ERR_TRY_AGAIN_LATER,
    ERR_UNKNOWN_CONTAINER,
    MAX_MESSAGE,
    CNIError,
    parse_cni_args,
    validate_config,
    validate_env,
    version_result,
)
from felix import wiring
from felix.constants import HOST_IFACE_PREFIX, TABBY_POD_ROUTE_PROTO
from felix.events import sanitize
from felix.teardown import Teardowns

log = logging.getLogger(__name__)

DEFAULT_MTU = 1500
ANNOTATION_POD_IP = "tabby.dev/podIP"
ANNOTATION_CONTAINER_ID = "tabby.dev/containerID"
READ_TIMEOUT_S = 30.0
ANNOTATION_THREADS = 8  # Pod annotations written at once (a burst of ADDs)
T = TypeVar("T", bound="PendingAdd")


class AddressAllocator(Protocol):
    """What the CNI server needs from IPAM (the real one is ``ipam.IPAMAllocator``).

    ``assign`` must be idempotent per handle: a handle that already holds an
    address gets that address back (this is what makes a repeated ADD return
    the same result). ``handles`` must return only the handles of pods on
    **this node**: GC releases every listed handle the runtime does not name,
    so another node's handles here would free its live pods' addresses.
    ``ready`` says whether a pool can serve this node (STATUS, ADD gate).
    """

    def assign(self, handle_id: str, attrs: Mapping[str, str]) -> ipaddress.IPv4Address: ...

    def release(self, handle_id: str) -> None: ...

    def handles(self) -> set[str]: ...

    def ready(self) -> bool: ...


@dataclass(frozen=True)
class PodKey:
    """Which Pod (and which of its sandboxes) an annotation update is about."""

    namespace: str
    name: str
    uid: str | None
    container_id: str


# (pod, annotations) -> None. On DEL the annotations are {podIP: ""}; the
# implementation must skip that patch when the Pod's tabby.dev/containerID is
# not pod.container_id (a late DEL of an old sandbox).
PodAnnotator = Callable[[PodKey, Mapping[str, str]], None]


@dataclass(frozen=True)
class Endpoint:
    """One wired pod interface, as the dataplane and later CNI calls see it."""

    network: str
    container_id: str
    ifname: str
    netns: str
    host_ifname: str
    address: ipaddress.IPv4Address
    mtu: int
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None

    @property
    def handle_id(self) -> str:
        """The IPAM handle: Calico's ``<network>.<containerID>``."""
        return f"{self.network}.{self.container_id}"


class EndpointTable:
    """Thread-safe in-memory table of local endpoints, keyed by (container, ifname).

    Host veth names repeat when a pod gets a new sandbox, so the table also
    records which attachment currently owns each name: the latest ADD wins,
    and a late DEL of the old sandbox must not delete the new one's veth.
    """

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], Endpoint] = {}
        self._owner: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def add(self, endpoint: Endpoint) -> None:
        """Insert or replace one attachment; it now owns its host veth name."""
        key = (endpoint.container_id, endpoint.ifname)
        with self._lock:
            self._by_key[key] = endpoint
            self._owner[endpoint.host_ifname] = key

    def remove(self, container_id: str, ifname: str) -> Endpoint | None:
        """Drop one attachment; returns what was there."""
        key = (container_id, ifname)
        with self._lock:
            endpoint = self._by_key.pop(key, None)
            if endpoint is not None and self._owner.get(endpoint.host_ifname) == key:
                del self._owner[endpoint.host_ifname]
            return endpoint

    def get(self, container_id: str, ifname: str) -> Endpoint | None:
        """The endpoint of one attachment, if known."""
        with self._lock:
            return self._by_key.get((container_id, ifname))

    def owner_of(self, host_ifname: str) -> Endpoint | None:
        """The attachment that last wired this host veth name, if still present."""
        with self._lock:
            key = self._owner.get(host_ifname)
            return self._by_key.get(key) if key else None

    def owns_host(self, endpoint: Endpoint) -> bool:
        """Whether *endpoint* (not a newer sandbox of its pod) owns its host veth."""
        return self.owner_of(endpoint.host_ifname) is endpoint

    def all(self) -> list[Endpoint]:
        """A snapshot of every endpoint."""
        with self._lock:
            return list(self._by_key.values())


class KeyedLocks:
    """One lock per key, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[threading.Lock, int]] = {}
        self._guard = threading.Lock()

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Serialize the block against other holders of *key*."""
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


@dataclass(frozen=True)
class CNIRequest:
    """A validated call as the agent sees it."""

    command: str
    env: dict[str, str]
    args: dict[str, str]
    config: dict[str, Any]

    @property
    def container_id(self) -> str:
        return self.env.get("CNI_CONTAINERID", "")

    @property
    def ifname(self) -> str:
        return self.env.get("CNI_IFNAME", "")

    @property
    def netns(self) -> str:
        return self.env.get("CNI_NETNS", "")

    @property
    def network(self) -> str:
        return str(self.config["name"])

    @property
    def version(self) -> str:
        return str(self.config["cniVersion"])

    @property
    def handle_id(self) -> str:
        return f"{self.network}.{self.container_id}"


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
        return f"{self.network}.{self.container_id}"


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
        self._write(_pending_add(request), self.SUFFIX)

    def end(self, request: CNIRequest) -> None:
        """The ADD is answered (or rolled back by itself): nothing left to undo."""
        self._path(request.network, request.container_id, request.ifname).unlink(missing_ok=True)

    def begin_delete(self, request: CNIRequest, host_ifname: str) -> PendingDel:
        """Record a DEL whose teardown runs after its answer."""
        base = _pending_add(request)
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


def _pending_add(request: CNIRequest) -> PendingAdd:
    return PendingAdd(
        request.network,
        request.container_id,
        request.ifname,
        request.netns,
        request.args.get("K8S_POD_NAMESPACE", ""),
        request.args.get("K8S_POD_NAME", ""),
    )


def _short(text: str, limit: int = 16) -> str:
    """A user-supplied string fit for a message, log line or Event (see felix.events)."""
    return sanitize(text, limit)


def parse_request(message: object) -> CNIRequest:
    """Re-validate what the shim sent; the socket is root-only but not trusted blindly."""
    if not isinstance(message, dict):
        raise CNIError(ERR_DECODING, "request must be a JSON object")
    command = message.get("command")
    env = message.get("env")
    if command not in COMMANDS or not isinstance(env, dict):
        raise CNIError(ERR_INVALID_ENV, f"request has no valid command/env (command={command!r})")
    config = validate_config(str(command), message.get("config"))
    clean_env = validate_env(str(command), {str(k): str(v) for k, v in env.items()})
    args = parse_cni_args(clean_env.get("CNI_ARGS", ""))
    return CNIRequest(str(command), clean_env, args, config)


def _noop_endpoint(_endpoint: Endpoint) -> None:
    return None


def _noop_phases(_phases: Mapping[str, float]) -> None:
    return None


class PhaseClock:
    """How long each step of one request took: where an ADD's time goes, for its log
    line and the agent's ``tabby_cni_add_phase_seconds`` metric."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The time since the previous lap (or the start) belongs to ``phase``."""
        now = time.perf_counter()
        self.seconds[phase] = now - self._last
        self._last = now

    def summary(self) -> str:
        """``assign 12, wire 9, ...`` in milliseconds."""
        return ", ".join(f"{name} {sec * 1000:.0f}" for name, sec in self.seconds.items())


def _noop_annotate(_pod: PodKey, _annotations: Mapping[str, str]) -> None:
    return None


class CNIHandlers:
    """ADD/DEL/CHECK/STATUS/GC against an allocator, the kernel and injected hooks."""

    def __init__(
        self,
        allocator: AddressAllocator,
        *,
        annotate: PodAnnotator = _noop_annotate,
        on_endpoint_added: Callable[[Endpoint], None] = _noop_endpoint,
        on_endpoint_removed: Callable[[Endpoint], None] = _noop_endpoint,
        observe_add_phases: Callable[[Mapping[str, float]], None] = _noop_phases,
        node_netns: str | None = None,
        default_mtu: int = DEFAULT_MTU,
        journal: AddJournal | None = None,
    ) -> None:
        self.allocator = allocator
        self.journal = journal
        self.annotate = annotate
        self.on_endpoint_added = on_endpoint_added
        self.on_endpoint_removed = on_endpoint_removed
        self.observe_add_phases = observe_add_phases
        self.node_netns = node_netns
        self.default_mtu = default_mtu
        self.endpoints = EndpointTable()
        self.teardowns = Teardowns()
        self._locks = KeyedLocks()
        self._annotations = ThreadPoolExecutor(
            ANNOTATION_THREADS, thread_name_prefix="annotate-pod"
        )
        self._synced = threading.Event()

    def close(self, timeout: float = 10.0) -> None:
        """Finish the deferred DEL teardowns (bounded) and stop their workers."""
        self.teardowns.close(timeout)
        self._annotations.shutdown(wait=False)

    # -- readiness ---------------------------------------------------------------

    def set_synced(self, synced: bool = True) -> None:
        """The agent calls this once its caches and dataplane are in sync."""
        if synced:
            self._synced.set()
        else:
            self._synced.clear()

    def not_ready_reason(self) -> str | None:
        """Why ADD cannot be served now, or None."""
        if not self._synced.is_set():
            return "tabby agent has not finished its initial sync"
        try:
            pool_ok = self.allocator.ready()
        except Exception as exc:
            return f"IPAM is not reachable: {exc}"
        return None if pool_ok else "no IP pool can serve an address on this node"

    # -- dispatch -----------------------------------------------------------------

    def handle(self, request: CNIRequest) -> dict[str, Any] | None:
        """Run one validated request; CNIError carries the spec code."""
        if request.command == "VERSION":
            return version_result(json.dumps(request.config).encode())
        if request.command == "STATUS":
            self.status(request)
            return None
        if request.command == "GC":
            self.gc(request)
            return None
        # The same pod's earlier DEL may still be tearing down its veth.
        self.teardowns.wait(self._host_ifname(request))
        with self._locks.hold(request.container_id):
            if request.command == "ADD":
                return self.add(request)
            if request.command == "DEL":
                self.delete(request)
            else:
                self.check(request)
            return None

    # -- ADD -------------------------------------------------------------------------

    @staticmethod
    def _host_ifname(request: CNIRequest) -> str:
        namespace = request.args.get("K8S_POD_NAMESPACE")
        pod = request.args.get("K8S_POD_NAME")
        if namespace and pod:
            return wiring.host_ifname_for(namespace, pod)
        return wiring.host_ifname_for_container(request.container_id)

    def _endpoint(self, request: CNIRequest, address: ipaddress.IPv4Address) -> Endpoint:
        namespace = request.args.get("K8S_POD_NAMESPACE") or None
        pod = request.args.get("K8S_POD_NAME") or None
        host = self._host_ifname(request)
        return Endpoint(
            network=request.network,
            container_id=request.container_id,
            ifname=request.ifname,
            netns=request.netns,
            host_ifname=host,
            address=address,
            mtu=int(request.config.get("mtu") or self.default_mtu),
            namespace=namespace,
            pod=pod,
            pod_uid=request.args.get("K8S_POD_UID") or None,
        )

    def _pod_key(self, ep: Endpoint) -> PodKey | None:
        if not (ep.namespace and ep.pod):
            return None
        return PodKey(ep.namespace, ep.pod, ep.pod_uid, ep.container_id)

    def _attrs(self, request: CNIRequest) -> dict[str, str]:
        """What each address records in its block (the container ID is in the handle).

        Kept short: every allocation rewrites the whole block, and the apiserver's
        cost per write grows with the block's size.
        """
        attrs = {"ifname": request.ifname}
        for key, name in (("K8S_POD_NAMESPACE", "namespace"), ("K8S_POD_NAME", "pod")):
            if request.args.get(key):
                attrs[name] = request.args[key]
        return attrs

    def _assign(self, request: CNIRequest) -> ipaddress.IPv4Address:
        try:
            return self.allocator.assign(request.handle_id, self._attrs(request))
        except CNIError:
            raise
        except Exception as exc:
            raise CNIError(
                ERR_TRY_AGAIN_LATER,
                f"could not assign an address to {request.network}.{_short(request.container_id)}",
                _short(str(exc), 512),
            ) from None

    def _wire(self, ep: Endpoint) -> wiring.Wired:
        spec = wiring.PodWiring(ep.host_ifname, ep.ifname, ep.netns, ep.address, ep.mtu)
        try:
            return wiring.wire(spec, self.node_netns)
        except wiring.NetnsMissing as exc:
            raise CNIError(ERR_UNKNOWN_CONTAINER, str(exc)) from None
        except wiring.WiringError as exc:
            raise CNIError(ERR_INTERNAL, f"could not wire {ep.ifname}", str(exc)) from None

    def add(self, request: CNIRequest) -> dict[str, Any]:
        """Assign, wire, annotate, register, wait for the dataplane hook, answer.

        With a journal, the ADD is marked from before the address is assigned
        until its answer is ready, so a restart undoes it if the agent dies now.
        """
        reason = self.not_ready_reason()
        if reason:
            raise CNIError(ERR_TRY_AGAIN_LATER, reason)
        if self.journal is None:
            return self._add(request)
        self.journal.begin(request)
        try:
            return self._add(request)
        finally:
            self.journal.end(request)

    def _refuse_second_interface(self, request: CNIRequest) -> None:
        """One host veth per pod: a second CNI_IFNAME would take over the first's veth.

        The host veth name comes from the Pod (or the container id), not from the
        interface, so wiring ``eth1`` for a container already wired on ``eth0``
        would delete eth0's veth and hand back eth0's address (one handle per
        container). Refused with a permanent error; a repeated ADD of the same
        (container, interface) is unaffected.
        """
        for ep in self.endpoints.all():
            if ep.container_id == request.container_id and ep.ifname != request.ifname:
                raise CNIError(
                    ERR_INVALID_ENV,
                    f"container {_short(request.container_id)} is already attached on "
                    f"{ep.ifname} (network {ep.network}); Tabby wires one interface per "
                    f"container, so CNI_IFNAME={request.ifname} is refused",
                    f"DEL the {ep.ifname} attachment first, or use another plugin for "
                    "additional interfaces",
                )

    def _add(self, request: CNIRequest) -> dict[str, Any]:
        started = time.monotonic()
        clock = PhaseClock()
        self._refuse_second_interface(request)
        address = self._assign(request)
        clock.lap("assign")
        ep = self._endpoint(request, address)
        try:
            wired = self._wire(ep)
            clock.lap("wire")
            # The Pod's annotation (an apiserver write) runs beside the programming.
            annotated = self._annotate_beside(ep)
            try:
                self.endpoints.add(ep)
                if self.journal is not None:
                    self.journal.record(ep)
                self.on_endpoint_added(ep)
                clock.lap("program")
            finally:
                if annotated is not None:  # done before anything after it (a DEL's clear)
                    futures_wait([annotated])
            if annotated is not None:
                annotated.result()  # its failure fails the ADD, as before
            clock.lap("annotate")
        except CNIError:
            self._rollback(ep)
            raise
        except Exception as exc:
            log.exception("ADD %s failed; rolled back", request.container_id[:12])
            self._rollback(ep)
            raise results.internal_error(exc) from exc
        own = results.add_result(
            host_ifname=wired.host_ifname,
            host_mac=wired.host_mac,
            pod_ifname=wired.pod_ifname,
            pod_mac=wired.pod_mac,
            sandbox=ep.netns,
            address=ipaddress.IPv4Interface(f"{address}/32"),
            mtu=ep.mtu,
        )
        merged = results.merge_prev(request.config.get("prevResult"), own)
        self.observe_add_phases(clock.seconds)
        log.info(
            "ADD %s %s -> %s on %s in %.0f ms (%s)",
            request.container_id[:12],
            request.ifname,
            address,
            ep.host_ifname,
            (time.monotonic() - started) * 1000,
            clock.summary(),
            extra={
                "container_id": request.container_id,
                "phases_ms": {k: round(v * 1000, 2) for k, v in clock.seconds.items()},
            },
        )
        return results.convert(merged, request.version)

    def _annotate_beside(self, ep: Endpoint) -> Future[None] | None:
        """Start the Pod's annotation (address, container) on the annotation threads."""
        key = self._pod_key(ep)
        if key is None:
            return None
        values = {ANNOTATION_POD_IP: f"{ep.address}/32", ANNOTATION_CONTAINER_ID: ep.container_id}
        return self._annotations.submit(self.annotate, key, values)

    def _rollback(self, ep: Endpoint) -> None:
        """Undo a failed ADD so that nothing leaks (the runtime's DEL may never come).

        Only the host end is deleted (its peer goes with it): the pod's
        ``ifname`` may be someone else's interface, which is why wiring failed.
        """
        registered = self.endpoints.remove(ep.container_id, ep.ifname)
        if registered is not None:
            try:
                self.on_endpoint_removed(registered)  # its chains go with the next pass
            except Exception:
                log.exception("rollback: the endpoint-removed hook failed")
        if self.journal is not None:
            self.journal.drop(ep.network, ep.container_id, ep.ifname)
        owner = self.endpoints.owner_of(ep.host_ifname)
        try:
            if owner is None:
                wiring.unwire(ep.ifname, None, ep.host_ifname, self.node_netns)
        except Exception:
            log.exception("rollback: could not unwire %s", ep.host_ifname)
        try:
            self.allocator.release(ep.handle_id)
        except Exception:
            log.exception("rollback: could not release %s", ep.handle_id)

    # -- DEL -------------------------------------------------------------------------

    def delete(self, request: CNIRequest) -> None:
        """Tear down whatever is left of the attachment; repeatable.

        A wired endpoint of this agent is unlisted and answered at once, its
        veth and address freed right after (:mod:`felix.teardown`); anything
        else (an attachment the agent does not know) is torn down before the
        answer.
        """
        started = time.monotonic()
        ep = self.endpoints.get(request.container_id, request.ifname)
        if self.journal is not None:
            self.journal.drop(request.network, request.container_id, request.ifname)
        if ep is not None and self.endpoints.owns_host(ep):
            self.endpoints.remove(request.container_id, request.ifname)
            marker = self.journal.begin_delete(request, ep.host_ifname) if self.journal else None
            self.teardowns.submit(ep.host_ifname, lambda: self._tear_down(request, ep, marker))
            log.info(
                "DEL %s %s answered in %.1f ms; teardown of %s queued",
                request.container_id[:12],
                request.ifname,
                (time.monotonic() - started) * 1000,
                ep.host_ifname,
            )
            return
        try:
            wiring.unwire(request.ifname, request.netns or None, None, self.node_netns)
        except Exception as exc:
            raise CNIError(
                ERR_TRY_AGAIN_LATER, f"could not unwire {request.ifname}", str(exc)
            ) from None
        self._release(request)
        self.endpoints.remove(request.container_id, request.ifname)
        self._clear_annotation(request)
        if ep is not None:
            self.on_endpoint_removed(ep)
        log.info(
            "DEL %s %s in %.0f ms",
            request.container_id[:12],
            request.ifname,
            (time.monotonic() - started) * 1000,
        )

    def _release(self, request: CNIRequest) -> None:
        try:
            self.allocator.release(request.handle_id)
        except Exception as exc:
            raise CNIError(
                ERR_TRY_AGAIN_LATER,
                f"could not release {request.network}.{_short(request.container_id)}",
                _short(str(exc), 512),
            ) from None

    def _tear_down(self, request: CNIRequest, ep: Endpoint, marker: PendingDel | None) -> None:
        """The deferred half of DEL: veth (and its route) first, then the address."""
        started = time.monotonic()
        wiring.unwire(ep.ifname, None, ep.host_ifname, self.node_netns)
        self._release(request)
        self._clear_annotation(request)
        self.on_endpoint_removed(ep)
        if marker is not None and self.journal is not None:
            self.journal.forget(marker)
        log.info(
            "DEL %s %s torn down in %.0f ms",
            request.container_id[:12],
            request.ifname,
            (time.monotonic() - started) * 1000,
        )

    def _clear_annotation(self, request: CNIRequest) -> None:
        namespace = request.args.get("K8S_POD_NAMESPACE")
        pod = request.args.get("K8S_POD_NAME")
        if not (namespace and pod):
            return
        key = PodKey(namespace, pod, request.args.get("K8S_POD_UID"), request.container_id)
        try:
            self.annotate(key, {ANNOTATION_POD_IP: ""})
        except Exception:
            log.warning(
                "DEL %s: could not clear podIP of %s/%s",
                _short(request.container_id),
                namespace,
                pod,
            )

    # -- CHECK -----------------------------------------------------------------------

    def _expected_address(self, request: CNIRequest) -> ipaddress.IPv4Address:
        ep = self.endpoints.get(request.container_id, request.ifname)
        prev = request.config.get("prevResult")
        prev_addr = results.pod_address(results.normalize(prev), request.ifname) if prev else None
        if ep is not None:
            if prev_addr and ipaddress.ip_interface(prev_addr).ip != ep.address:
                raise CNIError(
                    ERR_CHECK_FAILED,
                    f"prevResult gives {request.ifname} {prev_addr}, "
                    f"the agent assigned {ep.address}",
                )
            return ep.address
        if prev_addr:
            return ipaddress.IPv4Interface(prev_addr).ip
        raise CNIError(
            ERR_UNKNOWN_CONTAINER,
            f"no attachment {_short(request.container_id)}/{request.ifname} on this node",
        )

    def check(self, request: CNIRequest) -> None:
        """Verify the kernel still looks as ADD left it; name every difference."""
        address = self._expected_address(request)
        ep = self._endpoint(request, address)
        spec = wiring.PodWiring(ep.host_ifname, ep.ifname, ep.netns, address, ep.mtu)
        problems = wiring.check(spec, self.node_netns)
        if problems:
            raise CNIError(
                ERR_CHECK_FAILED,
                f"{request.ifname} of {request.container_id[:12]} is not wired as expected",
                "; ".join(problems),
            )

    # -- resync ----------------------------------------------------------------------

    def repair(self) -> list[str]:
        """Put back what drifted from the wiring of each endpoint; returns the veths repaired.

        The desired state is the endpoint table (what ADD wired and DEL has not
        removed): a deleted pod /32 route, a reset ``proxy_arp`` or a downed veth
        is re-applied by the convergent :func:`felix.wiring.wire`. Each repair
        holds its container's lock, and skips an endpoint that a DEL or a newer
        sandbox took over meanwhile. Must not be called while holding a lock an
        ADD waits for (the agent calls it outside its dataplane pass).
        """
        endpoints = [ep for ep in self.endpoints.all() if self.endpoints.owns_host(ep)]
        specs = {
            ep.host_ifname: wiring.PodWiring(
                ep.host_ifname, ep.ifname, ep.netns, ep.address, ep.mtu
            )
            for ep in endpoints
        }
        drift = wiring.drifted(list(specs.values()), self.node_netns)
        repaired = []
        for ep in endpoints:
            if ep.host_ifname not in drift:
                continue
            with self._locks.hold(ep.container_id):
                if self.endpoints.get(ep.container_id, ep.ifname) is not ep:
                    continue
                if not self.endpoints.owns_host(ep):
                    continue
                try:
                    wiring.wire(specs[ep.host_ifname], self.node_netns)
                except Exception as exc:
                    log.warning("resync: could not repair %s: %s", ep.host_ifname, exc)
                    continue
            log.warning(
                "resync repaired %s (%s/%s): %s",
                ep.host_ifname,
                ep.namespace,
                ep.pod,
                "; ".join(drift[ep.host_ifname]),
            )
            repaired.append(ep.host_ifname)
        return repaired

    # -- STATUS / GC -----------------------------------------------------------------

    def status(self, _request: CNIRequest) -> None:
        """Ready for ADD, or code 50 with the reason."""
        reason = self.not_ready_reason()
        if reason:
            raise CNIError(ERR_NOT_AVAILABLE, reason)

    def _stale(self, network: str, keep: set[str]) -> set[str]:
        prefix = network + "."
        stale = {
            h[len(prefix) :]
            for h in self.allocator.handles()
            if h.startswith(prefix) and h[len(prefix) :] not in keep
        }
        stale |= {
            e.container_id
            for e in self.endpoints.all()
            if e.network == network and e.container_id not in keep
        }
        return stale

    def _collect(self, network: str, container_id: str) -> None:
        with self._locks.hold(container_id):
            for ep in self.endpoints.all():
                if ep.container_id == container_id and ep.network == network:
                    host = ep.host_ifname if self.endpoints.owns_host(ep) else None
                    wiring.unwire(ep.ifname, ep.netns, host, self.node_netns)
                    self.endpoints.remove(ep.container_id, ep.ifname)
                    if self.journal is not None:
                        self.journal.drop(ep.network, ep.container_id, ep.ifname)
                    self.on_endpoint_removed(ep)
            self.allocator.release(f"{network}.{container_id}")

    def collect_garbage(self, network: str, live_container_ids: set[str]) -> list[str]:
        """Release every handle/endpoint of *network* whose container is not live.

        CNI GC calls this with the runtime's attachments; the agent should also
        call it at start-up with the sandboxes it knows are alive (e.g. from its
        Pod informer), which is what frees addresses whose DEL found the agent
        down (the shim lets such a DEL succeed). Returns the errors, if any.
        """
        errors = []
        for container_id in sorted(self._stale(network, live_container_ids)):
            try:
                self._collect(network, container_id)
                log.info("GC released %s.%s", network, container_id)
            except Exception as exc:
                errors.append(f"{_short(container_id)}: {_short(str(exc), 256)}")
        return errors

    def gc(self, request: CNIRequest) -> None:
        """CNI GC: keep what ``cni.dev/attachments`` lists, release the rest."""
        keep = {a["containerID"] for a in request.config.get("cni.dev/attachments") or []}
        errors = self.collect_garbage(request.network, keep)
        if errors:
            raise CNIError(
                ERR_INTERNAL, f"GC failed for {len(errors)} attachment(s)", "; ".join(errors)
            )


# --- recovery after a restart ---------------------------------------------------------


@dataclass
class RecoveryReport:
    """What :func:`recover_after_restart` found and did (logged; tests read it)."""

    rolled_back: list[str] = field(default_factory=list)  # handles of unanswered ADDs
    released: list[str] = field(default_factory=list)  # handles with no routed veth
    kept: list[str] = field(default_factory=list)  # handles of wired pods
    removed_links: list[str] = field(default_factory=list)  # orphan cali veths
    adopted: list[str] = field(default_factory=list)  # recorded endpoints re-adopted
    repaired: list[str] = field(default_factory=list)  # host veths whose wiring drifted
    errors: list[str] = field(default_factory=list)


def _pod_routes(node_netns: str | None) -> tuple[dict[str, str], set[str]]:
    """(address -> cali veth it is routed through, every cali veth) in the node.

    Only Tabby's own routes count (protocol 80, /32, out of a ``cali`` veth):
    wiring installs that route last, so its presence means ``wire`` finished.
    """
    routed: dict[str, str] = {}
    with wiring._ipr(node_netns) as ipr:
        names = {
            link["index"]: link.get_attr("IFLA_IFNAME")
            for link in ipr.get_links()
            if (link.get_attr("IFLA_IFNAME") or "").startswith(HOST_IFACE_PREFIX)
            and wiring._kind(link) == "veth"
        }
        for route in ipr.get_routes(family=socket.AF_INET, table=wiring.MAIN_TABLE):
            oif = route.get_attr("RTA_OIF")
            if route["proto"] == TABBY_POD_ROUTE_PROTO and route["dst_len"] == 32 and oif in names:
                routed[str(route.get_attr("RTA_DST"))] = names[oif]
    return routed, set(names.values())


def _address_of(allocator: AddressAllocator, handle_id: str) -> str | None:
    """The address a handle holds: ``lookup`` where the allocator has one, else the
    idempotent ``assign`` (the protocol's contract: an existing handle gets its
    address back; a handle emptied meanwhile gets a fresh one, which the caller
    then releases because nothing routes it)."""
    lookup = getattr(allocator, "lookup", None)
    if callable(lookup):
        found = lookup(handle_id)
        return str(found) if found is not None else None
    return str(allocator.assign(handle_id, {}))


def _undo_pending(handlers: CNIHandlers, node_netns: str | None, report: RecoveryReport) -> None:
    """Roll back every ADD the dead agent never answered, finish every DEL it answered.

    An unanswered ADD's caller saw it fail. Deleting the pod side in the
    sandbox's netns takes the host end and its route with it (a veth pair is
    created in one netlink call, so there is no half pair); a netns that is
    gone took the pair with it. An answered DEL whose teardown was cut short
    names its host veth, which no newer sandbox can have taken: ADDs for that
    host interface wait for its teardown. Either way the Pod's podIP
    annotation is cleared as a DEL would (the annotator skips it when a newer
    sandbox owns the Pod), so no peer keeps the released address in its policy.
    """
    if handlers.journal is None:
        return
    entries: list[PendingAdd] = [*handlers.journal.pending(), *handlers.journal.pending_deletes()]
    for entry in entries:
        host = entry.host_ifname if isinstance(entry, PendingDel) else None
        try:
            wiring.unwire(entry.ifname, entry.netns or None, host or None, node_netns)
            handlers.allocator.release(entry.handle_id)
            if entry.namespace and entry.pod:
                key = PodKey(entry.namespace, entry.pod, None, entry.container_id)
                handlers.annotate(key, {ANNOTATION_POD_IP: ""})
            handlers.journal.forget(entry)
            report.rolled_back.append(entry.handle_id)
        except Exception as exc:
            report.errors.append(f"roll back {entry.handle_id}: {exc}")


def _delete_link(node_netns: str | None, ifname: str) -> None:
    with wiring._ipr(node_netns) as ipr:
        try:
            ipr.link("del", ifname=ifname)
        except NetlinkError as exc:
            if exc.code != errno.ENODEV:
                raise


# Whether an endpoint's Pod still exists: False when the apiserver has no Pod of that
# namespace/name (or one with another UID), None when it cannot be told.
OwnerAlive = Callable[[Endpoint], "bool | None"]


def _netns_present(netns: str) -> bool:
    return bool(netns) and os.path.exists(wiring._netns_path(netns))


def _adopt_recorded(
    handlers: CNIHandlers,
    netns: str | None,
    owner_alive: OwnerAlive | None,
    report: RecoveryReport,
) -> tuple[set[str], set[str]]:
    """Re-adopt every recorded attachment whose owner is alive; undo the others.

    Kept: the sandbox netns is still there and its Pod is not known to be gone.
    Whether the pod's route or veth is still in the kernel does not matter (a
    deleted route is drift, repaired right after). Returns (handles, host veths)
    kept.
    """
    assert handlers.journal is not None
    undone = set(report.rolled_back)
    kept: list[Endpoint] = []
    dropped: list[Endpoint] = []
    for ep in handlers.journal.endpoints():
        if ep.handle_id in undone:
            handlers.journal.drop(ep.network, ep.container_id, ep.ifname)
        elif _netns_present(ep.netns) and (owner_alive is None or owner_alive(ep) is not False):
            kept.append(ep)
        else:
            dropped.append(ep)
    kept_links = {ep.host_ifname for ep in kept}
    for ep in kept:
        handlers.endpoints.add(ep)
        report.adopted.append(ep.handle_id)
    for ep in dropped:
        host = None if ep.host_ifname in kept_links else ep.host_ifname
        try:
            pod_netns = ep.netns if _netns_present(ep.netns) else None
            wiring.unwire(ep.ifname, pod_netns, host, netns)
            handlers.allocator.release(ep.handle_id)
            if ep.namespace and ep.pod:
                key = PodKey(ep.namespace, ep.pod, ep.pod_uid, ep.container_id)
                handlers.annotate(key, {ANNOTATION_POD_IP: ""})
            handlers.journal.drop(ep.network, ep.container_id, ep.ifname)
            report.released.append(ep.handle_id)
        except Exception as exc:
            report.errors.append(f"endpoint {ep.handle_id[:64]}: {exc}")
    return {ep.handle_id for ep in kept}, kept_links


def recover_after_restart(
    handlers: CNIHandlers,
    node_netns: str | None = None,
    owner_alive: OwnerAlive | None = None,
) -> RecoveryReport:
    """Make the node consistent again after the agent died; run before serving CNI.

    1. ADDs marked in the journal are undone (wiring and address).
    2. Every recorded attachment (:meth:`AddJournal.record`) is decided by its
       owner: kept and put back in the endpoint table (so CHECK, DEL and resync
       know it) while its sandbox netns exists and its Pod is not gone
       (*owner_alive*); otherwise its veth and address are freed as a DEL would.
    3. Handles of **this node** with no record (wired by an agent before records
       existed) are kept when their address is routed through a ``cali`` veth,
       else released.
    4. Every ``cali`` veth no kept attachment owns is deleted.
    5. Kept attachments whose route, sysctls or veth drifted are repaired.

    A pod's route being gone never costs it its address or veth. Errors are
    collected, not raised: a node that cannot be fully cleaned must still serve
    its healthy pods.
    """
    netns = node_netns if node_netns is not None else handlers.node_netns
    report = RecoveryReport()
    _undo_pending(handlers, netns, report)
    kept_handles: set[str] = set()
    owners: set[str] = set()
    if handlers.journal is not None:
        kept_handles, owners = _adopt_recorded(handlers, netns, owner_alive, report)
    routed, links = _pod_routes(netns)
    released = set(report.released)
    for handle_id in sorted(handlers.allocator.handles()):
        if handle_id in kept_handles:
            report.kept.append(handle_id)
            continue
        if handle_id in released:
            continue
        try:
            address = _address_of(handlers.allocator, handle_id)
            if address is not None and address in routed:
                owners.add(routed[address])
                report.kept.append(handle_id)
                continue
            handlers.allocator.release(handle_id)
            report.released.append(handle_id)
        except Exception as exc:
            report.errors.append(f"handle {handle_id}: {exc}")
    for ifname in sorted(links - owners):
        try:
            _delete_link(netns, ifname)
            report.removed_links.append(ifname)
        except Exception as exc:
            report.errors.append(f"veth {ifname}: {exc}")
    try:
        report.repaired = handlers.repair()
    except Exception as exc:
        report.errors.append(f"repair: {exc}")
    log.info(
        "recovery after restart: %d ADDs rolled back, %d endpoints re-adopted, "
        "%d handles released, %d kept, %d orphan veths removed, %d repaired, %d errors",
        len(report.rolled_back),
        len(report.adopted),
        len(report.released),
        len(report.kept),
        len(report.removed_links),
        len(report.repaired),
        len(report.errors),
        extra={"recovery": report.__dict__},
    )
    return report


# --- the socket server ---------------------------------------------------------------


def _read_request(conn: socket.socket) -> bytes:
    conn.settimeout(READ_TIMEOUT_S)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_MESSAGE:
            raise CNIError(ERR_DECODING, "request is too large")
        chunks.append(chunk)


def answer(handlers: CNIHandlers, raw: bytes) -> dict[str, Any]:
    """Turn raw request bytes into the answer object (never raises)."""
    version = "1.1.0"
    try:
        try:
            message = json.loads(raw)
        except ValueError as exc:
            raise CNIError(ERR_DECODING, "request is not JSON", str(exc)) from None
        request = parse_request(message)
        version = request.version
        return {"result": handlers.handle(request)}
    except CNIError as exc:
        return {"error": exc.to_dict(version)}
    except Exception as exc:
        log.exception("CNI request failed")
        return {"error": results.internal_error(exc).to_dict(version)}


class _Handler(socketserver.BaseRequestHandler):
    server: CNIServer

    def handle(self) -> None:
        conn: socket.socket = self.request
        try:
            raw = _read_request(conn)
        except (OSError, CNIError) as exc:
            log.warning("dropping CNI connection: %s", exc)
            return
        reply = answer(self.server.handlers, raw)
        try:
            conn.sendall(json.dumps(reply).encode())
        except OSError as exc:
            log.warning("CNI client went away before the answer: %s", exc)


class CNIServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Threaded server on a root-only socket (dir 0700, socket 0600)."""

    daemon_threads = True
    allow_reuse_address = False
    request_queue_size = 256  # a burst of pod starts must queue, not be refused

    def __init__(self, path: str, handlers: CNIHandlers) -> None:
        self.handlers = handlers
        self.path = path
        _prepare_socket_path(path)
        super().__init__(path, _Handler)
        os.chmod(path, 0o600)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, name="cni-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and remove the socket file."""
        self.shutdown()
        self.server_close()
        if os.path.exists(self.path):
            os.unlink(self.path)


def _prepare_socket_path(path: str) -> None:
    """Dir 0700 owned by us; a stale socket from a dead agent is replaced."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)
        else:
            raise RuntimeError(f"another agent is already serving {path}")
        finally:
            probe.close()


_MAIN_PID = os.getpid()


def _exit_on_signal(signum: int, _frame: object) -> None:
    """SIGTERM ends the agent; in a forked helper (pyroute2) it must not unwind."""
    if os.getpid() != _MAIN_PID:
        os._exit(128 + signum)
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Standalone agent for tests and the lab: a local pool, no datastore."""
    from felix.pool_allocator import PoolAllocator

    parser = argparse.ArgumentParser(description="Tabby CNI server with a local address pool")
    parser.add_argument("--socket", default="/run/tabby/cni.sock")
    parser.add_argument("--pool", required=True, help="IPv4 CIDR to assign pod addresses from")
    parser.add_argument("--mtu", type=int, default=DEFAULT_MTU)
    parser.add_argument("--not-synced", action="store_true", help="start not ready (STATUS 50)")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    handlers = CNIHandlers(PoolAllocator(opts.pool), default_mtu=opts.mtu)
    handlers.set_synced(not opts.not_synced)
    server = CNIServer(opts.socket, handlers)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    log.info("serving CNI on %s (pool %s)", opts.socket, opts.pool)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        handlers.close()
        if os.path.exists(opts.socket):
            os.unlink(opts.socket)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
