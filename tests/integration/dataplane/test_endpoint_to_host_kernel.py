"""A pod's traffic to its own node on real packets, both iptables backends (issue 21 item 7).

Two fresh namespaces: a node (a "cali" veth to the pod, its own address on loopback,
TCP listeners on 179 as BGP's port and 10250 as any other host port) and a pod behind
it. Before the fix every host port answered the pod; now the default DROP
refuses them, ACCEPT lets them through, RETURN hands the decision to the host's own
INPUT rules, and the node's own connections to the pod (health checks) work whatever
the action.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from felix.dataplane.backend import Backend
from felix.dataplane.runner import SubprocessRunner
from felix.policy_dataplane import PolicyDataplane
from lab import netns
from policy import parse_pod, parse_policy

pytestmark = pytest.mark.integration

POD_IP, POD_SIDE = "10.244.1.5", "10.244.1.1"
NODE_IP = "192.0.2.1"
IFACE = "calie2e0000001"
BGP, KUBELET, OTHER, POD_PORT = 179, 10250, 9100, 8080

LISTEN = """
import socket, sys
socks = []
for port in sys.argv[2:]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(port)))
    s.listen(16)
    socks.append(s)
print("ready", flush=True)
import selectors
sel = selectors.DefaultSelector()
for s in socks:
    sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        key.fileobj.accept()[0].close()
"""

CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()
except OSError as exc:
    print(exc)
    sys.exit(1)
"""


def _listen(where: str, address: str, *ports: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", where, sys.executable, "-c", LISTEN, address, *map(str, ports)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _connects(where: str, address: str, port: int) -> bool:
    argv = ["ip", "netns", "exec", where, sys.executable, "-c", CONNECT, address, str(port)]
    return subprocess.run(argv, capture_output=True, timeout=20, check=False).returncode == 0


def _backend_name(backend: Backend) -> str:
    return "legacy-iptc" if backend.reader == "iptc" else backend.name


@pytest.fixture
def wired(ns: str, peer: str) -> Iterator[tuple[str, str]]:
    """Node `ns` with a pod `peer` on a cali veth, and listeners on both sides."""
    netns.ip(ns, "link", "add", IFACE, "type", "veth", "peer", "name", "eth0", "netns", peer)
    netns.ip(ns, "addr", "add", f"{POD_SIDE}/24", "dev", IFACE)
    netns.ip(ns, "link", "set", IFACE, "up")
    netns.ip(ns, "link", "set", "lo", "up")
    netns.ip(ns, "addr", "add", f"{NODE_IP}/32", "dev", "lo")  # the node's own address
    netns.ip(peer, "addr", "add", f"{POD_IP}/24", "dev", "eth0")
    netns.ip(peer, "link", "set", "eth0", "up")
    netns.ip(peer, "route", "add", "default", "via", POD_SIDE)
    host = _listen(ns, "0.0.0.0", BGP, KUBELET, OTHER)
    pod = _listen(peer, POD_IP, POD_PORT)
    try:
        yield ns, peer
    finally:
        for proc in (host, pod):
            proc.kill()
            proc.wait()


POD = parse_pod(
    {
        "metadata": {"name": "a", "namespace": "x", "labels": {"app": "a"}},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"podIP": POD_IP},
    }
)
DENY_EGRESS = parse_policy(
    {
        "metadata": {"name": "deny-egress", "namespace": "x"},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"]},
    }
)


def _apply(dp: PolicyDataplane, *, deny_egress: bool = False) -> None:
    dp.apply([DENY_EGRESS] if deny_egress else [], [POD], [], {IFACE: POD})


def _settled(check: object, want: bool, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check() == want:  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def test_default_drop_refuses_host_ports_and_keeps_health_checks(
    wired: tuple[str, str], backend: Backend
) -> None:
    node, pod = wired
    assert _connects(pod, NODE_IP, BGP)  # nothing programmed yet: the hole as it was
    dp = PolicyDataplane(SubprocessRunner(netns=node), _backend_name(backend))
    _apply(dp)
    for address in (NODE_IP, POD_SIDE):
        assert not _connects(pod, address, BGP), f"pod reached {address}:{BGP}"
        assert not _connects(pod, address, KUBELET), f"pod reached {address}:{KUBELET}"
    assert dp.endpoint_to_host == "DROP"  # the default
    # the node's own connections to the pod (kubelet probes): replies pass
    assert _connects(node, POD_IP, POD_PORT)
    _apply(dp, deny_egress=True)  # even when the pod's egress is denied
    assert _connects(node, POD_IP, POD_PORT)
    # resync repairs a flushed chain
    netns.ns_exec(node, [f"iptables-{backend.name}", "-t", "filter", "-F", "cali-wl-to-host"])
    assert _connects(pod, NODE_IP, BGP)
    dp.apply([], [POD], [], {IFACE: POD}, resync=True)
    assert not _connects(pod, NODE_IP, BGP)


SERVICE_IP = "10.96.7.7"


def test_default_drop_still_lets_a_service_reach_its_endpoint_on_the_node(
    wired: tuple[str, str], backend: Backend
) -> None:
    """kube-proxy's DNAT of a Service to a hostNetwork endpoint on the pod's own node
    (the `kubernetes` Service on a control-plane node; upstream's "internalTrafficPolicy
    =Local Pod and Node, to Pod (hostNetwork)" spec): allowed, unless egress policy
    denies it; the same port dialled directly stays dropped."""
    node, pod = wired
    dnat = ["-t", "nat", "-A", "PREROUTING", "-d", SERVICE_IP, "-p", "tcp", "--dport", "80",
            "-j", "DNAT", "--to-destination", f"{NODE_IP}:{KUBELET}"]  # fmt: skip
    netns.ns_exec(node, [f"iptables-{backend.name}", *dnat])
    dp = PolicyDataplane(SubprocessRunner(netns=node), _backend_name(backend))
    _apply(dp)
    assert _connects(pod, SERVICE_IP, 80), "the Service's host endpoint was dropped"
    assert not _connects(pod, NODE_IP, KUBELET), "the host port was reached directly"
    _apply(dp, deny_egress=True)
    assert not _connects(pod, SERVICE_IP, 80), "egress policy was bypassed through a Service"


def test_accept_lets_allowed_traffic_through_and_return_defers_to_host_rules(
    wired: tuple[str, str], backend: Backend
) -> None:
    node, pod = wired
    # the host's own firewall: no kubelet port from pods (after Tabby's hook in INPUT)
    host_rule = ["-A", "INPUT", "-i", "cali+", "-p", "tcp", "--dport", str(KUBELET), "-j", "DROP"]
    netns.ns_exec(node, [f"iptables-{backend.name}", *host_rule])

    accept = PolicyDataplane(SubprocessRunner(netns=node), _backend_name(backend), "Accept")
    _apply(accept)
    assert _connects(pod, NODE_IP, KUBELET)  # Tabby accepts before the host's rule
    assert _connects(pod, NODE_IP, OTHER)
    assert not _connects(pod, NODE_IP, BGP), "pod reached the node's BGP port under Accept"
    _apply(accept, deny_egress=True)  # egress policy still applies first
    assert not _connects(pod, NODE_IP, OTHER)
    assert _connects(node, POD_IP, POD_PORT)

    ret = PolicyDataplane(SubprocessRunner(netns=node), _backend_name(backend), "Return")
    _apply(ret)
    assert not _connects(pod, NODE_IP, KUBELET)  # the host's rule decides
    assert _connects(pod, NODE_IP, OTHER)
    assert not _connects(pod, NODE_IP, BGP), "pod reached the node's BGP port under Return"
    assert _connects(node, POD_IP, POD_PORT)
