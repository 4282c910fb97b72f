"""Tunnel devices for pools that encapsulate: VXLAN (vxlan.tabby) and IPIP (tunl0).

Which tunnels a node needs is a pure function of the pools; the device itself is
made to match its spec through pyroute2 (create if missing, then address, MAC, MTU
and state), so a deleted or changed device is repaired on the next pass. Peers
learn this node's tunnel address and MAC from annotations on its Node object, and
bgp/ programs routes, neighbours and FDB entries toward them.

This kernel build has no ipip module: creating tunl0 fails with "Unknown device
type", which is reported (and the IPIP route decisions are unit-tested in bgp/).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bgp.routes import IPIP_DEVICE, VXLAN_DEVICE
from datastore.models import IPPool

log = logging.getLogger(__name__)

VXLAN_VNI = 4096
VXLAN_PORT = 4789
VXLAN_OVERHEAD = 50
IPIP_OVERHEAD = 20


def needed_tunnels(pools: Iterable[IPPool]) -> set[str]:
    """'vxlan' and/or 'ipip' when an enabled pool asks for that encapsulation."""
    kinds: set[str] = set()
    for pool in pools:
        if pool.spec.disabled:
            continue
        if pool.spec.vxlan_mode != "Never":
            kinds.add("vxlan")
        if pool.spec.ipip_mode != "Never":
            kinds.add("ipip")
    return kinds


def vxlan_mac(node: str) -> str:
    """A stable, locally administered unicast MAC for the node's VXLAN device."""
    digest = hashlib.sha256(node.encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x66, *digest[:5]))


@dataclass(frozen=True)
class VxlanSpec:
    address: ipaddress.IPv4Address  # the node's tunnel address, from IPAM
    local_ip: str  # the node's underlay address (VTEP)
    mac: str
    mtu: int
    device: str = VXLAN_DEVICE


def ensure_vxlan(netlink: Callable[[], Any], spec: VxlanSpec) -> list[str]:
    """Make the VXLAN device match spec; return what was changed (for logs)."""
    changes: list[str] = []
    with netlink() as ipr:
        found = ipr.link_lookup(ifname=spec.device)
        if not found:
            ipr.link(
                "add",
                ifname=spec.device,
                kind="vxlan",
                vxlan_id=VXLAN_VNI,
                vxlan_local=spec.local_ip,
                vxlan_port=VXLAN_PORT,
                vxlan_learning=0,
            )
            changes.append("created")
            found = ipr.link_lookup(ifname=spec.device)
        index = found[0]
        link = ipr.get_links(index)[0]
        if link.get_attr("IFLA_ADDRESS") != spec.mac:
            ipr.link("set", index=index, address=spec.mac)
            changes.append("mac")
        if link.get_attr("IFLA_MTU") != spec.mtu:
            ipr.link("set", index=index, mtu=spec.mtu)
            changes.append("mtu")
        have = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=index, family=2)}
        if str(spec.address) not in have:
            for stale in have:
                ipr.addr("del", index=index, address=stale, prefixlen=32)
            ipr.addr("add", index=index, address=str(spec.address), prefixlen=32)
            changes.append("address")
        if not link["flags"] & 1:  # IFF_UP
            ipr.link("set", index=index, state="up")
            changes.append("up")
    return changes


def ensure_ipip(netlink: Callable[[], Any], address: ipaddress.IPv4Address, mtu: int) -> list[str]:
    """tunl0 with the node's tunnel address (fails here: no ipip module)."""
    with netlink() as ipr:
        if not ipr.link_lookup(ifname=IPIP_DEVICE):
            ipr.link("add", ifname=IPIP_DEVICE, kind="ipip")
        index = ipr.link_lookup(ifname=IPIP_DEVICE)[0]
        ipr.link("set", index=index, mtu=mtu, state="up")
        have = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=index, family=2)}
        if str(address) not in have:
            ipr.addr("add", index=index, address=str(address), prefixlen=32)
            return ["address"]
    return []
