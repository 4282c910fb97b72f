"""The agent's side of policy membership: IPAM blocks → :class:`policy.AddressBook`.

Only Tabby writes IPAMBlocks (tenants cannot), so the owner attributes stored
with each allocation (``namespace``, ``pod``, ``node``, ``uid`` where recorded)
say which pod an address was given to. :mod:`policy.membership` decides from
them, the Pod's status and the local endpoint table which addresses a pod
stands for; this module only reads the blocks, once per block version (every
ADD runs a policy pass, and most blocks have not changed since the last one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from ipaddress import IPv4Address
from typing import Any

from datastore.models import IPAMBlock
from ipam.block import AllocationBlock
from policy.membership import AddressBook, Owner

log = logging.getLogger(__name__)

Entries = list[tuple[IPv4Address, Owner]]


def block_owners(raw: dict[str, Any]) -> Entries:
    """(address, owner) for every pod allocation of one IPAMBlock; raises if unreadable.

    Allocations without a pod (tunnel addresses, an ADD without K8S_POD_NAME) own
    no pod membership and are left out.
    """
    block = AllocationBlock.from_spec(IPAMBlock.from_wire(raw).spec)
    out: Entries = []
    for alloc in block.iter_allocations():
        attrs = alloc.attrs
        namespace, pod = attrs.get("namespace", ""), attrs.get("pod", "")
        if namespace and pod:
            owner = Owner(
                namespace,
                pod,
                node=attrs.get("node", ""),
                uid=attrs.get("uid", ""),
                ifname=attrs.get("ifname", ""),
            )
            out.append((alloc.ip, owner))
    return out


def holds_address(blocks: Iterable[dict[str, Any]], address: IPv4Address, handle_id: str) -> bool:
    """Whether the blocks (an informer snapshot) give `address` to `handle_id`.

    The agent remembers its tunnel address; IPAM can take it away behind its back
    (the GC releases a deleted Node's addresses while its agent still runs). A
    remembered address no block grants any more must be asked for again, or the
    next pod is given the address the tunnel device still holds.
    """
    for raw in blocks:
        try:
            block = AllocationBlock.from_spec(IPAMBlock.from_wire(raw).spec)
        except Exception:  # an unreadable block grants nothing (reported elsewhere)
            continue
        if address in block.cidr:
            return any(
                a.ip == address and a.handle_id == handle_id for a in block.iter_allocations()
            )
    return False


class IPAMOwners:
    """Builds the address book from the blocks informer's objects, cached per version.

    A block that cannot be read is reported once per resourceVersion and
    contributes nothing (its pods keep their status addresses, rule 3 of
    :mod:`policy.membership`), so one bad object never stops the policy pass.
    """

    def __init__(self, on_invalid: Callable[[], None] = lambda: None) -> None:
        self._cache: dict[str, tuple[str, Entries]] = {}
        self._on_invalid = on_invalid
        self._book = AddressBook()

    def book(self, blocks: Iterable[dict[str, Any]]) -> AddressBook:
        """The address book of these blocks (the informer's current snapshot)."""
        seen: dict[str, tuple[str, Entries]] = {}
        changed = False
        for raw in blocks:
            meta = raw.get("metadata") or {}
            name, version = str(meta.get("name", "")), str(meta.get("resourceVersion", ""))
            cached = self._cache.get(name)
            if cached is None or cached[0] != version or not version:
                cached = (version, self.read(raw))
                changed = True
            seen[name] = cached
        if changed or seen.keys() != self._cache.keys():
            self._book = AddressBook(entry for _, entries in seen.values() for entry in entries)
        self._cache = seen
        return self._book

    def read(self, raw: dict[str, Any]) -> Entries:
        """One block's owners, uncached; an unreadable block is reported and gives none."""
        try:
            return block_owners(raw)
        except Exception as exc:  # any malformed field: report it, never fail the pass
            self._on_invalid()
            name = (raw.get("metadata") or {}).get("name")
            log.warning("IPAM block %s is unreadable; its owners are not used: %s", name, exc)
            return []
