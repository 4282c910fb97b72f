"""IPAM errors: each says what is wrong and what a person can do about it.

When one of these is raised by the allocator, nothing was changed in the datastore
(or what was changed has been rolled back), so callers may simply report it.
"""

from __future__ import annotations


class IPAMError(Exception):
    """Base for every IPAM failure a caller may want to report as-is."""


class PoolNotFound(IPAMError):
    """A named pool (or the pool holding an address) does not exist."""


class InvalidPool(IPAMError):
    """The pool configuration is unusable (overlap, bad CIDR or block size, bad selector)."""


class PoolExhausted(IPAMError):
    """No free address in the pools this node may use."""


class HandleNotFound(IPAMError):
    """No allocation is recorded under this handle."""


class AddressInUse(IPAMError):
    """A specific address was requested but is already allocated."""


class AddressNotAllocated(IPAMError):
    """A release named an address that is not allocated."""


class BadSequenceNumber(IPAMError):
    """A release carried a stale sequence number: the address was reassigned since (ABA)."""


class BlockCorrupt(IPAMError):
    """A block's invariants do not hold; the message lists what is broken."""


class ConcurrencyExhausted(IPAMError):
    """Compare-and-swap kept losing to other writers; retrying later should succeed."""
