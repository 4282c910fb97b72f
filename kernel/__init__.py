"""The one seam between Tabby and the kernel's netlink, in any network namespace.

Two clients, one way to reach a namespace (:mod:`kernel.netns`):

- :func:`fast_rtnl`: Tabby's own small rtnetlink client (:mod:`kernel.rtnl`) for the
  fixed-shape messages of the CNI hot path (a pod's veth, address and routes),
  packed with :mod:`struct` and sent in batches;
- :func:`iproute`: pyroute2's ``IPRoute`` for everything else (checks, drift
  repair, recovery, tunnels, BGP routes, neighbours and FDB entries).

Both open their socket with the calling thread inside the namespace and close it
when the block ends. Code that must be testable without a kernel takes a
:data:`NetlinkFactory` (:func:`iproute_factory`) instead of opening one itself.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pyroute2 import IPRoute
from pyroute2 import config as pyroute2_config

from kernel.netns import NetnsMissing, in_netns, netns_exists, netns_path
from kernel.rtnl import Rtnl

__all__ = [
    "NetlinkFactory",
    "NetnsMissing",
    "fast_rtnl",
    "in_netns",
    "iproute",
    "iproute_factory",
    "netns_exists",
    "netns_path",
    "open_iproute",
]

# pyroute2's IPRoute(netns=...) (never used by Tabby) opens its socket in a forked
# child and stops it with SIGTERM. A child that inherits a Python SIGTERM handler
# which raises unwinds the *copied* request thread's stack and shuts down sockets
# it shares with the parent, e.g. a CNI connection (seen in tests). Make such
# children take SIGTERM's default action, should a library ever fork one.
pyroute2_config.disable_mp_signal = True

# Opens a pyroute2 IPRoute (usable as a context manager) in a fixed namespace.
NetlinkFactory = Callable[[], Any]


def open_iproute(netns: str | None = None) -> Any:
    """A pyroute2 ``IPRoute`` bound to *netns* (``None``: the caller's own); the
    caller closes it. Raises :class:`NetnsMissing`."""
    if netns is None:
        return IPRoute()
    with in_netns(netns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, socket.NETLINK_ROUTE)
    return IPRoute(fileno=sock.detach())


@contextmanager
def iproute(netns: str | None = None) -> Iterator[Any]:
    """An ``IPRoute`` in *netns* for the block, closed after it."""
    ipr = open_iproute(netns)
    try:
        yield ipr
    finally:
        ipr.close()


@contextmanager
def fast_rtnl(netns: str | None = None) -> Iterator[Rtnl]:
    """A fast-path :class:`kernel.rtnl.Rtnl` socket in *netns* for the block."""
    with in_netns(netns):
        sock = Rtnl.open()
    with sock:
        yield sock


def iproute_factory(netns: str | None = None) -> NetlinkFactory:
    """A factory of ``IPRoute`` handles in *netns* (``None``: the agent's own)."""
    return lambda: open_iproute(netns)
