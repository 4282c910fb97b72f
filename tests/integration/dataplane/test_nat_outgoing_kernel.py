"""natOutgoing on real packets: a pod talking to an address outside every pool.

Three fresh namespaces: a node, a pod behind it and an "external" host on the
node's other link (which has no route to the pod network, like the internet).
The external side records the source address of what arrives.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from felix.dataplane.backend import Backend
from felix.dataplane.runner import SubprocessRunner
from felix.managers.nat import NatOutgoingDataplane
from felix.nat_outgoing import NAT_OUTGOING, PoolNat
from felix.policy_dataplane import PolicyDataplane
from lab import netns
from tests.helpers import udp_source_seen

pytestmark = pytest.mark.integration

POD_IP, NODE_POD_SIDE = "10.244.1.5", "10.244.1.1"
EXTERNAL_IP, NODE_IP = "192.0.2.2", "192.0.2.1"
PORT = 9999


@pytest.fixture
def external() -> Iterator[str]:
    name = f"tbt-dpx{secrets.token_hex(3)}"
    netns.add(name)
    try:
        yield name
    finally:
        netns.delete(name)


def _veth(node: str, node_if: str, node_addr: str, other: str, other_addr: str) -> None:
    netns.ip(node, "link", "add", node_if, "type", "veth", "peer", "name", "eth0", "netns", other)
    netns.ip(node, "addr", "add", node_addr, "dev", node_if)
    netns.ip(node, "link", "set", node_if, "up")
    netns.ip(other, "addr", "add", other_addr, "dev", "eth0")
    netns.ip(other, "link", "set", "eth0", "up")


def _source_seen(pod: str, external: str, source_port: int) -> str:
    """Send from the pod until the external listener reports a datagram's source."""
    return udp_source_seen(pod, (POD_IP, source_port), external, (EXTERNAL_IP, PORT))


def _backend_name(backend: Backend) -> str:
    return "legacy-iptc" if backend.reader == "iptc" else backend.name


def test_natoutgoing_pool_leaves_with_the_node_address_and_others_keep_theirs(
    ns: str, peer: str, external: str, backend: Backend
) -> None:
    _veth(ns, "tpod0", f"{NODE_POD_SIDE}/24", peer, f"{POD_IP}/24")
    _veth(ns, "eth1", f"{NODE_IP}/24", external, f"{EXTERNAL_IP}/24")
    netns.ip(peer, "route", "add", "default", "via", NODE_POD_SIDE)
    netns.sysctl(ns, "net.ipv4.ip_forward", "1")
    dataplane = PolicyDataplane(SubprocessRunner(netns=ns), _backend_name(backend))

    dataplane.apply([], [], [], {}, pools=[PoolNat("10.244.0.0/16", True)])
    assert _source_seen(peer, external, 40001) == NODE_IP

    dataplane.apply([], [], [], {}, pools=[PoolNat("10.244.0.0/16", False)])
    saved = netns.ns_exec(ns, backend.save_argv("nat"))
    assert f"-A {NAT_OUTGOING}" not in saved and "MASQUERADE" not in saved
    assert _source_seen(peer, external, 40002) == POD_IP

    # drift: someone flushes the nat table; the resync puts the rule back
    dataplane.apply([], [], [], {}, pools=[PoolNat("10.244.0.0/16", True)])
    netns.ns_exec(ns, [f"iptables-{backend.name}", "-t", "nat", "-F", NAT_OUTGOING])
    dataplane.apply([], [], [], {}, pools=[PoolNat("10.244.0.0/16", True)], resync=True)
    assert _source_seen(peer, external, 40003) == NODE_IP


def test_with_policy_off_natoutgoing_is_written_alone_and_repaired(
    ns: str, peer: str, external: str, backend: Backend
) -> None:
    """$TABBY_POLICY=off (another engine enforces policy): pods of a natOutgoing pool
    must still leave with the node's address, and the filter table is not Tabby's."""
    _veth(ns, "tpod0", f"{NODE_POD_SIDE}/24", peer, f"{POD_IP}/24")
    _veth(ns, "eth1", f"{NODE_IP}/24", external, f"{EXTERNAL_IP}/24")
    netns.ip(peer, "route", "add", "default", "via", NODE_POD_SIDE)
    netns.sysctl(ns, "net.ipv4.ip_forward", "1")
    nat = NatOutgoingDataplane(SubprocessRunner(netns=ns), _backend_name(backend))

    nat.apply([PoolNat("10.244.0.0/16", True)])
    assert _source_seen(peer, external, 40011) == NODE_IP
    assert "cali" not in netns.ns_exec(ns, backend.save_argv("filter"))

    netns.ns_exec(ns, [f"iptables-{backend.name}", "-t", "nat", "-F", NAT_OUTGOING])
    nat.apply([PoolNat("10.244.0.0/16", True)], resync=True)
    assert _source_seen(peer, external, 40012) == NODE_IP
