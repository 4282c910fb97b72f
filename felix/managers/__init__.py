"""Dataplane managers: one shape for every part of the node Tabby keeps in the kernel.

Each manager owns one part and nothing else:

- :class:`EndpointWiring`: pod veths, their /32 routes and sysctls (written by CNI
  ADD and DEL; the manager repairs drift);
- :class:`PolicyManager`: the filter table's chains and the ipsets of NetworkPolicy
  (and natOutgoing's nat chains, through the same ipset owner);
- :class:`NatOutgoingManager`: natOutgoing alone, when another engine enforces policy;
- :class:`TunnelManager`: the VXLAN and IPIP devices of encapsulating pools;
- :class:`BGPManager`: BGP's routes (learned, blackholes), neighbours and FDB entries.

Every manager has the same three methods (:class:`DataplaneManager`):

- ``on_update(reasons)``: note what changed (informer kinds, endpoint events); no I/O;
- ``apply()``: write what changed since the last apply;
- ``resync()``: read the kernel afresh and repair whatever drifted (a deleted route,
  a flushed chain, a changed sysctl); the agent's loop calls it on a timer.

The agent (:mod:`felix.agent`) drives them in one order per pass: endpoints, policy
(or natOutgoing alone), tunnels, BGP. All netlink goes through :mod:`kernel`.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Protocol

from felix.managers.bgp import BGPManager
from felix.managers.endpoints import EndpointWiring
from felix.managers.nat import NatOutgoingDataplane, NatOutgoingManager
from felix.managers.policy import PolicyManager, PolicySources
from felix.managers.tunnels import TunnelManager


class DataplaneManager(Protocol):
    """The one shape of a dataplane manager."""

    name: str

    def on_update(self, reasons: Set[str]) -> None:
        """Note what changed (no I/O): the next apply writes what it affects."""

    def apply(self) -> None:
        """Write what changed since the last apply; raise if the kernel refused."""

    def resync(self) -> None:
        """Read the kernel afresh and repair every difference from the desired state."""


def drive(manager: DataplaneManager, resync: bool) -> None:
    """One manager's part of a pass: the full resync on the timer, else the changes."""
    if resync:
        manager.resync()
    else:
        manager.apply()


__all__ = [
    "BGPManager",
    "DataplaneManager",
    "EndpointWiring",
    "NatOutgoingDataplane",
    "NatOutgoingManager",
    "PolicyManager",
    "PolicySources",
    "TunnelManager",
    "drive",
]
