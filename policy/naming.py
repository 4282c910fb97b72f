"""Names of chains and ipsets, and the short hashes inside them.

Names must fit kernel limits (28 characters for an iptables chain, 31 for an
ipset) and be recognisably ours (``cali-`` chains, ``cali40``/``cali60``
sets), so the dataplane's resync never touches what others wrote.  All
hashes are base64url of SHA-224 like Calico's, so they are stable across
runs and Python versions (no ``hash()``).
"""

from __future__ import annotations

import base64
import hashlib
import re

MAX_CHAIN_NAME = 28
MAX_IPSET_NAME = 31
MAX_IFACE_NAME = 15

_IFACE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def short_hash(text: str, length: int) -> str:
    """``length`` characters of base64url(SHA-224(text)), no padding."""
    digest = hashlib.sha224(text.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")[:length]


def policy_chain_name(policy_key: str, direction: str) -> str:
    """``cali-pi-_<hash>`` (ingress) or ``cali-po-_<hash>`` (egress), 28 chars.

    The hash is of the policy's ``namespace/name`` rather than its content, so
    editing a policy rewrites its chain in place and no endpoint chain has to
    change; the ``_`` marks a hashed name as in Calico.
    """
    prefix = {"ingress": "cali-pi-_", "egress": "cali-po-_"}[direction]
    return prefix + short_hash(policy_key, MAX_CHAIN_NAME - len(prefix))


def cluster_policy_chain_name(name: str, direction: str) -> str:
    """``cali-ci-_<hash>`` (ingress) or ``cali-co-_<hash>`` (egress) of a
    ClusterNetworkPolicy, 28 chars; hashed from its name like a NetworkPolicy's."""
    prefix = {"ingress": "cali-ci-_", "egress": "cali-co-_"}[direction]
    return prefix + short_hash(f"clusternetworkpolicy/{name}", MAX_CHAIN_NAME - len(prefix))


def endpoint_chain_names(iface: str) -> tuple[str, str]:
    """(``cali-tw-<iface>``, ``cali-fw-<iface>``) for a host-side veth name."""
    if not iface or len(iface) > MAX_IFACE_NAME or not _IFACE_RE.match(iface):
        raise ValueError(f"{iface!r} is not a valid interface name")
    return f"cali-tw-{iface}", f"cali-fw-{iface}"


def ipset_name(family: int, kind: str, canonical: str) -> str:
    """``cali<family>0<kind>:<hash>``, 31 characters.

    ``kind`` is ``s`` (pod IPs of a selection), ``n`` (named port of a
    selection) or ``e`` (ipBlock excepts); it is part of the hashed text too,
    so sets of different kinds never collide.
    """
    if family not in (4, 6) or len(kind) != 1:
        raise ValueError(f"bad ipset family {family!r} or kind {kind!r}")
    prefix = f"cali{family}0{kind}:"
    return prefix + short_hash(f"{kind}:{canonical}", MAX_IPSET_NAME - len(prefix))
