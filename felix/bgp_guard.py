"""Pods never speak to a node's BGP port: the guard's rules and the node addresses.

A pod that reaches port 179 of a node can try to open a BGP session with that
node's ExaBGP. Anti-spoofing keeps a pod from using a peer's address, so this is
exposure rather than a hijack, but no workload has a reason to speak BGP to a node
(issue 40). The policy dataplane (`felix.policy_dataplane`) therefore drops, at the
pod's own node and before any policy or other program's rule:

- in cali-FORWARD, TCP to port 179 of any address in the set ``cali40all-hosts``
  (every node's InternalIP and ExternalIP, its BGP address and tunnel addresses,
  from the Node objects), so neither another node's address nor a Service that
  kube-proxy DNAT'ed to one gets through; and
- in cali-wl-to-host, TCP to port 179 of the pod's own node, whatever address.

The switch is ``TABBY_POD_TO_NODE_BGP`` (``pod_to_node_bgp`` in tabby-config):
``Drop`` (default) or ``Allow`` for clusters whose pods peer with their nodes on
purpose; with ``Allow`` both rules are gone and policy and the endpoint-to-host
action decide, as for any other port.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from bgp import annotations as ann
from bgp.config import DEFAULT_PORT as BGP_PORT

__all__ = [
    "ALL_HOSTS_SET",
    "BGP_PORT",
    "DEFAULT_POD_TO_NODE_BGP",
    "PodToNodeBGP",
    "node_addresses",
    "parse_pod_to_node_bgp",
]

PodToNodeBGP = Literal["DROP", "ALLOW"]
POD_TO_NODE_BGP_CHOICES: tuple[PodToNodeBGP, ...] = ("DROP", "ALLOW")
DEFAULT_POD_TO_NODE_BGP: PodToNodeBGP = "DROP"
ALL_HOSTS_SET = "cali40all-hosts"  # hash:ip, every node address Tabby knows
OTHER_NODES_COMMENT = "a node's BGP port"

# Node.status.addresses types that carry an address a pod could dial.
_ADDRESS_TYPES = ("InternalIP", "ExternalIP")
_ANNOTATIONS = (ann.IPV4_ADDRESS, ann.IPIP_TUNNEL_ADDR, ann.VXLAN_TUNNEL_ADDR)


def parse_pod_to_node_bgp(value: str) -> PodToNodeBGP:
    """``Drop``/``Allow`` in any case, or a ValueError naming the choices."""
    for choice in POD_TO_NODE_BGP_CHOICES:
        if value.strip().upper() == choice:
            return choice
    raise ValueError(
        "pod-to-node BGP must be Drop (pods never reach a node's port 179) or Allow "
        f"(policy decides, as for any port), not {value!r}"
    )


def node_addresses(nodes: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Every IPv4 address of every Node (status and Tabby's annotations), pure.

    A malformed value is skipped: the guard covers every address it can read, and the
    BGP side reports a bad annotation (``bgp.nodes``).
    """
    found: set[str] = set()
    for node in nodes:
        status = node.get("status") or {}
        for entry in status.get("addresses") or ():
            if isinstance(entry, Mapping) and entry.get("type") in _ADDRESS_TYPES:
                found.update(_ipv4(entry.get("address")))
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        for key in _ANNOTATIONS:
            found.update(_ipv4(annotations.get(key)))
    return frozenset(found)


class NodeAddresses:
    """:func:`node_addresses`, recomputed only when some Node's resourceVersion changed.

    The policy manager asks on every dataplane pass, an ADD's included; reading the
    versions costs a pass far less than parsing every node's addresses again.
    """

    def __init__(self) -> None:
        self._key: tuple[tuple[str, str], ...] | None = None
        self._value: frozenset[str] = frozenset()

    def __call__(self, nodes: Iterable[Mapping[str, Any]]) -> frozenset[str]:
        listed = list(nodes)
        key = tuple(_version(node) for node in listed)
        if key != self._key:
            self._key, self._value = key, node_addresses(listed)
        return self._value


def _version(node: Mapping[str, Any]) -> tuple[str, str]:
    meta = node.get("metadata") or {}
    return str(meta.get("name", "")), str(meta.get("resourceVersion", ""))


def _ipv4(raw: object) -> list[str]:
    """The address of ``10.0.0.1`` or ``10.0.0.1/24`` as a one-item list; [] if not IPv4."""
    if not isinstance(raw, str):
        return []
    try:
        interface = ipaddress.ip_interface(raw.strip())
    except ValueError:
        return []
    return [str(interface.ip)] if interface.version == 4 else []
