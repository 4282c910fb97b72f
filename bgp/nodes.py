"""A node's BGP facts, read from a raw Kubernetes Node dict.

Config (who peers with whom) and routes (how to reach a peer's blocks) both need
the same few facts per node; parsing them once, tolerantly, keeps a node with a
bad annotation from breaking everyone else's config: it is reported and skipped.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bgp import annotations as ann

log = logging.getLogger(__name__)

MAX_ASN = 2**32 - 1


class NodeFactsError(ValueError):
    """A Node annotation that Tabby cannot use; the message names node and annotation."""


@dataclass(frozen=True)
class NodeFacts:
    """What BGP needs to know about one node.

    `as_number` is None when the node has no override (the cluster default applies).
    """

    name: str
    address: ipaddress.IPv4Interface
    as_number: int | None = None
    rr_cluster_id: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    ipip_tunnel_addr: ipaddress.IPv4Address | None = None
    vxlan_tunnel_addr: ipaddress.IPv4Address | None = None
    vxlan_tunnel_mac: str | None = None

    @property
    def ip(self) -> ipaddress.IPv4Address:
        return self.address.ip

    @property
    def is_route_reflector(self) -> bool:
        return self.rr_cluster_id is not None

    def asn(self, default: int) -> int:
        """The node's AS: its own override, else the cluster default."""
        return self.as_number if self.as_number is not None else default


def node_facts(node: Mapping[str, Any]) -> NodeFacts | None:
    """Facts of one Node dict; None when the node has no Tabby address yet (not ready).

    Raises NodeFactsError for a present but unusable annotation.
    """
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    raw_addr = annotations.get(ann.IPV4_ADDRESS)
    if not raw_addr:
        return None
    return NodeFacts(
        name=name,
        address=_interface(name, raw_addr),
        as_number=_asn(name, annotations.get(ann.AS_NUMBER)),
        rr_cluster_id=_cluster_id(name, annotations.get(ann.RR_CLUSTER_ID)),
        labels=dict(meta.get("labels") or {}),
        ipip_tunnel_addr=_address(name, ann.IPIP_TUNNEL_ADDR, annotations),
        vxlan_tunnel_addr=_address(name, ann.VXLAN_TUNNEL_ADDR, annotations),
        vxlan_tunnel_mac=annotations.get(ann.VXLAN_TUNNEL_MAC) or None,
    )


def parse_nodes(nodes: Iterable[Mapping[str, Any]]) -> dict[str, NodeFacts]:
    """Facts for every usable node, by name; bad nodes are logged and left out."""
    out: dict[str, NodeFacts] = {}
    for node in nodes:
        try:
            facts = node_facts(node)
        except NodeFactsError as err:
            log.warning("skipping node: %s", err)
            continue
        if facts is not None:
            out[facts.name] = facts
    return out


def _interface(name: str, raw: str) -> ipaddress.IPv4Interface:
    try:
        iface = ipaddress.IPv4Interface(raw.strip())
    except ValueError as err:
        raise NodeFactsError(f"node {name}: {ann.IPV4_ADDRESS}={raw!r}: {err}") from None
    if "/" not in raw:
        raise NodeFactsError(
            f"node {name}: {ann.IPV4_ADDRESS}={raw!r} needs a prefix length (e.g. 10.0.0.1/24)"
        )
    return iface


def _asn(name: str, raw: str | None) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise NodeFactsError(f"node {name}: {ann.AS_NUMBER}={raw!r} is not a number") from None
    if not 1 <= value <= MAX_ASN:
        raise NodeFactsError(f"node {name}: {ann.AS_NUMBER}={value} is out of range")
    return value


def _cluster_id(name: str, raw: str | None) -> str | None:
    """Cluster IDs go into CLUSTER_LIST, which ExaBGP wants as dotted quads."""
    if raw is None or raw.strip() == "":
        return None
    try:
        return str(ipaddress.IPv4Address(raw.strip()))
    except ValueError:
        raise NodeFactsError(
            f"node {name}: {ann.RR_CLUSTER_ID}={raw!r} must be a dotted quad (e.g. 244.0.0.1)"
        ) from None


def _address(name: str, key: str, annotations: Mapping[str, str]) -> ipaddress.IPv4Address | None:
    raw = annotations.get(key)
    if not raw:
        return None
    try:
        return ipaddress.IPv4Address(raw.strip().split("/")[0])
    except ValueError:
        raise NodeFactsError(f"node {name}: {key}={raw!r} is not an IPv4 address") from None
