"""Local endpoints (one wired pod interface each), the table that holds them, and
what the CNI server needs from IPAM."""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from cni.vocabulary import handle_id


class Holding(NamedTuple):
    """An address one of this node's handles holds, and what its block records about it
    (``ifname``, ``namespace``, ``pod``: how recovery names a pod it has no record of)."""

    address: ipaddress.IPv4Address
    attrs: Mapping[str, str]


class AddressAllocator(Protocol):
    """What the CNI server needs from IPAM (the real one is ``ipam.IPAMAllocator``).

    ``assign`` must be idempotent per handle: a handle that already holds an
    address gets that address back (this is what makes a repeated ADD return
    the same result). ``handles`` must return only the handles of pods on
    **this node**: GC releases every listed handle the runtime does not name,
    so another node's handles here would free its live pods' addresses.
    ``allocations`` is the same set of handles, each with its (first) address and
    attributes, read at once (recovery after a restart).
    ``ready`` says whether a pool can serve this node (STATUS, ADD gate).
    """

    def assign(self, handle_id: str, attrs: Mapping[str, str]) -> ipaddress.IPv4Address: ...

    def release(self, handle_id: str) -> None: ...

    def handles(self) -> set[str]: ...

    def allocations(self) -> dict[str, Holding]: ...

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
        return handle_id(self.network, self.container_id)


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
