"""An in-process, single-node address allocator for tests and the datastore-less lab.

It satisfies :class:`felix.cni_server.AddressAllocator` with a plain pool and a
dict of handles, so CNI tests exercise the agent without an apiserver. The
cluster-wide block-affinity IPAM (``ipam/``) replaces it in a real node agent.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Mapping

from felix.cni_server.endpoints import Holding


class PoolExhausted(Exception):
    """No free address is left in the pool."""


class PoolAllocator:
    """Hands out host addresses of one CIDR; one address per handle, idempotently."""

    def __init__(self, cidr: str, reserved: int = 1) -> None:
        self._net = ipaddress.IPv4Network(cidr)
        hosts = list(self._net.hosts())
        self._free = hosts[reserved:]  # skip the first address(es), as a gateway would
        self._by_handle: dict[str, ipaddress.IPv4Address] = {}
        self._attrs: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def assign(self, handle_id: str, attrs: Mapping[str, str]) -> ipaddress.IPv4Address:
        """The handle's address; a new one only if the handle holds none."""
        with self._lock:
            if handle_id in self._by_handle:
                return self._by_handle[handle_id]
            if not self._free:
                raise PoolExhausted(f"pool {self._net} has no free address")
            address = self._free.pop(0)
            self._by_handle[handle_id] = address
            self._attrs[handle_id] = dict(attrs)
            return address

    def allocations(self) -> dict[str, Holding]:
        """Every handle with its address and the attributes it was assigned with."""
        with self._lock:
            return {
                h: Holding(address, dict(self._attrs.get(h, {})))
                for h, address in self._by_handle.items()
            }

    def release(self, handle_id: str) -> None:
        """Free the handle's address; an unknown handle is fine (DEL repeats)."""
        with self._lock:
            address = self._by_handle.pop(handle_id, None)
            self._attrs.pop(handle_id, None)
            if address is not None:
                self._free.append(address)  # reused last, like Calico's unallocated FIFO

    def handles(self) -> set[str]:
        """Every handle holding an address (GC compares them with live attachments)."""
        with self._lock:
            return set(self._by_handle)

    def ready(self) -> bool:
        """A pool can serve when it has a free address."""
        with self._lock:
            return bool(self._free)
