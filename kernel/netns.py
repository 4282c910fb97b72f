"""Network namespaces: where a netlink socket or a /proc/sys write goes.

A netlink socket stays bound to the namespace it was created in, and
``/proc/sys/net`` follows the calling thread's namespace. So entering a
namespace is one thread's ``setns(2)`` around a ``socket()`` call or a sysctl
write, then straight back; it costs microseconds, where pyroute2's own
``IPRoute(netns=...)`` forks a helper process per socket (~35 ms in a large
agent). One lock serializes the entering, so no two threads swap namespaces
under each other's feet.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pyroute2.netns import setns

NETNS_DIR = "/var/run/netns"
_setns_lock = threading.Lock()


class NetnsMissing(Exception):
    """The named network namespace does not exist (a pod's sandbox already gone)."""


def netns_path(netns: str) -> str:
    """A namespace's file: a path as is, a name under ``/var/run/netns``."""
    return netns if netns.startswith("/") else f"{NETNS_DIR}/{netns}"


def netns_exists(netns: str) -> bool:
    return bool(netns) and os.path.exists(netns_path(netns))


@contextmanager
def in_netns(netns: str | None) -> Iterator[None]:
    """Run the block with this thread in *netns* (``None``: where it already is).

    Raises :class:`NetnsMissing` when the namespace's file is not there (or the
    name is empty).
    """
    if netns is None:
        yield
        return
    if not netns:
        raise NetnsMissing("no network namespace named (an empty name)")
    with _setns_lock:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            try:
                target = os.open(netns_path(netns), os.O_RDONLY)
            except FileNotFoundError:
                raise NetnsMissing(f"network namespace {netns} does not exist") from None
            try:
                setns(target)
            finally:
                os.close(target)
            try:
                yield
            finally:
                setns(own)  # if this fails the thread is unusable: let it raise
        finally:
            os.close(own)
