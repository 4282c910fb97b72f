"""Tunnel devices as a dataplane manager: VXLAN (vxlan.tabby) and IPIP (tunl0)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Set
from dataclasses import dataclass
from ipaddress import IPv4Address

from pyroute2.netlink.exceptions import NetlinkError

from bgp.annotations import IPIP_TUNNEL_ADDR, VXLAN_TUNNEL_ADDR, VXLAN_TUNNEL_MAC
from datastore.models import IPPool
from felix.managers.bgp import Objects
from felix.pod_members import holds_address
from felix.tunnels import (
    IPIP_OVERHEAD,
    VXLAN_OVERHEAD,
    VxlanSpec,
    ensure_ipip,
    ensure_vxlan,
    needed_tunnels,
    vxlan_mac,
)
from ipam.pools import tunnel_handle_id
from kernel import NetlinkFactory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TunnelNode:
    """What this node's tunnels are made of."""

    name: str
    ip: str  # the node's underlay address (CIDR form; the VTEP is its address part)
    mtu: int  # of the node's uplink


class TunnelManager:
    """Makes the tunnel devices of encapsulating pools and publishes their facts.

    Each device gets an address from IPAM (a tunnel handle of this node), is made to
    match its spec through netlink on every pass (create if missing, then address,
    MAC, MTU and state: ``apply`` already starts from the kernel, so ``resync`` is the
    same), and its address (and MAC) go on this node's Node object for the peers.
    A remembered tunnel address that IPAM no longer grants this node is asked for
    again, or the next pod would get the address the device still holds.
    """

    name = "tunnels"

    def __init__(
        self,
        node: TunnelNode,
        objects: Objects,
        tunnel_address: Callable[[str], IPv4Address],
        annotate_node: Callable[[dict[str, str]], None],
        netlink: NetlinkFactory,
    ) -> None:
        self.node = node
        self._objects = objects
        self._tunnel_address = tunnel_address
        self._annotate_node = annotate_node
        self._netlink = netlink
        self.addresses: dict[str, IPv4Address] = {}  # kind -> this node's tunnel address
        self.ipip_failed = False  # the kernel cannot make tunl0 (no ipip module)

    def on_update(self, reasons: Set[str]) -> None:
        del reasons  # every pass checks the devices against the pools

    def apply(self) -> None:
        needed = needed_tunnels(IPPool.from_wire(o) for o in self._objects("pools"))
        if not needed or not self.node.ip:
            return
        if "vxlan" in needed:
            self._vxlan()
        if "ipip" in needed and not self.ipip_failed:
            try:
                self._ipip()
            except NetlinkError as exc:
                self.ipip_failed = True
                log.error("cannot create tunl0 (is the ipip module available?): %s", exc)

    def resync(self) -> None:
        self.apply()

    def _address(self, kind: str) -> IPv4Address:
        address = self.addresses.get(kind)
        if address is None or not self._held(address, kind):
            address = self.addresses[kind] = self._tunnel_address(kind)
        return address

    def _held(self, address: IPv4Address, kind: str) -> bool:
        """Our remembered tunnel address is still ours in IPAM (the blocks cache)."""
        handle = tunnel_handle_id(kind, self.node.name)
        if holds_address(self._objects("blocks"), address, handle):
            return True
        log.warning("%s tunnel address %s is no longer allocated to this node", kind, address)
        return False

    def _vxlan(self) -> None:
        address = self._address("vxlan")
        mac = vxlan_mac(self.node.name)
        local_ip = self.node.ip.split("/")[0]
        spec = VxlanSpec(address, local_ip, mac, self.node.mtu - VXLAN_OVERHEAD)
        changed = ensure_vxlan(self._netlink, spec)
        if changed:
            log.info("VXLAN device %s: %s", spec.device, ", ".join(changed))
        self._annotate_node({VXLAN_TUNNEL_ADDR: str(address), VXLAN_TUNNEL_MAC: mac})

    def _ipip(self) -> None:
        address = self._address("ipip")
        ensure_ipip(self._netlink, address, self.node.mtu - IPIP_OVERHEAD)
        self._annotate_node({IPIP_TUNNEL_ADDR: str(address)})
