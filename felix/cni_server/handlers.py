"""The CNI commands: ADD, DEL, CHECK, STATUS and GC against an allocator, the
kernel and the hooks the agent injects (policy programming, Pod annotations)."""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from contextlib import contextmanager
from typing import Any

from cni import results
from cni.shim import (
    ERR_CHECK_FAILED,
    ERR_INTERNAL,
    ERR_INVALID_ENV,
    ERR_NOT_AVAILABLE,
    ERR_TRY_AGAIN_LATER,
    ERR_UNKNOWN_CONTAINER,
    CNIError,
    version_result,
)
from cni.vocabulary import ANNOTATION_CONTAINER_ID, ANNOTATION_POD_IP
from felix import wiring
from felix.cni_server.endpoints import (
    AddressAllocator,
    Endpoint,
    EndpointTable,
    PodAnnotator,
    PodKey,
)
from felix.cni_server.journal import AddJournal, PendingDel
from felix.cni_server.request import CNIRequest, short
from felix.teardown import Teardowns

log = logging.getLogger(__name__)

DEFAULT_MTU = 1500
ANNOTATION_THREADS = 8  # Pod annotations written at once (a burst of ADDs)


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
        host_ifname = self._host_ifname(request)
        if not self.teardowns.wait(host_ifname):
            raise CNIError(
                ERR_TRY_AGAIN_LATER,
                f"the teardown of {host_ifname} for an earlier sandbox of this pod is still "
                "failing (it is retried; see the agent's log)",
            )
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
        ref = request.pod
        if ref.namespace and ref.name:
            return wiring.host_ifname_for(ref.namespace, ref.name)
        return wiring.host_ifname_for_container(request.container_id)

    def _endpoint(self, request: CNIRequest, address: ipaddress.IPv4Address) -> Endpoint:
        ref = request.pod
        host = self._host_ifname(request)
        return Endpoint(
            network=request.network,
            container_id=request.container_id,
            ifname=request.ifname,
            netns=request.netns,
            host_ifname=host,
            address=address,
            mtu=int(request.config.get("mtu") or self.default_mtu),
            namespace=ref.namespace or None,
            pod=ref.name or None,
            pod_uid=ref.uid or None,
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
        ref = request.pod
        if ref.namespace:
            attrs["namespace"] = ref.namespace
        if ref.name:
            attrs["pod"] = ref.name
        if ref.uid:  # GC tells a re-created pod of the same name from this one
            attrs["uid"] = ref.uid
        return attrs

    def _assign(self, request: CNIRequest) -> ipaddress.IPv4Address:
        try:
            return self.allocator.assign(request.handle_id, self._attrs(request))
        except CNIError:
            raise
        except Exception as exc:
            raise CNIError(
                ERR_TRY_AGAIN_LATER,
                f"could not assign an address to {request.network}.{short(request.container_id)}",
                short(str(exc), 512),
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
                    f"container {short(request.container_id)} is already attached on "
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
                f"could not release {request.network}.{short(request.container_id)}",
                short(str(exc), 512),
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
        namespace, pod, uid = request.pod
        if not (namespace and pod):
            return
        key = PodKey(namespace, pod, uid or None, request.container_id)
        try:
            self.annotate(key, {ANNOTATION_POD_IP: ""})
        except Exception:
            log.warning(
                "DEL %s: could not clear podIP of %s/%s",
                short(request.container_id),
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
            f"no attachment {short(request.container_id)}/{request.ifname} on this node",
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
        is re-applied by the convergent :func:`felix.wiring.wire` (only the node's
        side for a pod whose sandbox is not known to the agent). Each repair
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
                    if ep.netns:
                        wiring.wire(specs[ep.host_ifname], self.node_netns)
                    else:  # re-adopted from its route: the sandbox is not known
                        wiring.wire_host_side(specs[ep.host_ifname], self.node_netns)
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
                errors.append(f"{short(container_id)}: {short(str(exc), 256)}")
        return errors

    def gc(self, request: CNIRequest) -> None:
        """CNI GC: keep what ``cni.dev/attachments`` lists, release the rest."""
        keep = {a["containerID"] for a in request.config.get("cni.dev/attachments") or []}
        errors = self.collect_garbage(request.network, keep)
        if errors:
            raise CNIError(
                ERR_INTERNAL, f"GC failed for {len(errors)} attachment(s)", "; ".join(errors)
            )
