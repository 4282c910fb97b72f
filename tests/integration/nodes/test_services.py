"""Services beside Tabby on real nodes: kube-proxy's own filter rules still decide.

- a Service with no endpoints refuses a pod's connect at once (kube-proxy's REJECT is
  reached), with and without an egress NetworkPolicy on the client;
- NodePort: a pod reaches a Service through another node's address;
- hairpin: a pod reaches itself through its own Service.

The module runs once with kube-proxy in iptables mode (its REJECT sits in the filter
table's FORWARD chain beside Tabby's, so the order of the two is what is tested) and
once in nftables mode (kube-proxy's own table rejects before any iptables chain).
Tabby runs with its default settings (allow action Accept).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.kubecluster import KubeCluster, KubeSpec
from tests.helpers import settles
from tests.integration.nodes.conftest import LabPool, service_answers, shared_lab, web_service

pytestmark = pytest.mark.integration

NS = "proxy"  # the lab is shared with other modules: a namespace of our own
REFUSED_WITHIN_S = 0.1

# Run in the pod's netns: connect once, print "<errno name> <seconds>".
CONNECT = """
import errno, socket, sys, time
s = socket.socket()
s.settimeout(float(sys.argv[3]))
t = time.monotonic()
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    name = "CONNECTED"
except socket.timeout:
    name = "TIMEOUT"
except OSError as e:
    name = errno.errorcode.get(e.errno, str(e.errno))
print(name, time.monotonic() - t)
"""


@pytest.fixture(scope="module", params=["iptables", "nftables"])
def kube_cluster(lab_pool: LabPool, request: pytest.FixtureRequest) -> Iterator[KubeCluster]:
    """Three real nodes, kube-proxy in the given mode, Tabby with its default settings:
    test_real_nodes.py's lab, then test_lifecycle.py's (namespace `proxy` is this
    module's own)."""
    yield from shared_lab(lab_pool, KubeSpec(nodes=3, proxy_mode=request.param))


def _apply(cluster: KubeCluster, body: dict[str, object]) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))


def empty_service(cluster: KubeCluster) -> str:
    """Service `empty` on port 80 whose selector matches no pod; its ClusterIP."""
    _apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "empty", "namespace": NS},
            "spec": {"selector": {"app": "nobody"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    found = json.loads(cluster.kubectl("-n", NS, "get", "svc", "empty", "-o", "json"))
    return str(found["spec"]["clusterIP"])


def connect(
    cluster: KubeCluster, pod: str, address: str, port: int, wait_s: float = 3
) -> tuple[str, float]:
    """One TCP connect from the pod's netns: the errno name (or CONNECTED) and seconds."""
    got = cluster.exec(pod, ["python3", "-c", CONNECT, address, str(port), str(wait_s)])
    assert got.returncode == 0, got.stderr
    name, seconds = got.stdout.split()
    return name, float(seconds)


def refused_quickly(cluster: KubeCluster, pod: str, address: str) -> tuple[str, float]:
    """The best of a few connects (kube-proxy may still be writing its REJECT at first)."""
    results: list[tuple[str, float]] = []

    def refused() -> bool:
        results.append(connect(cluster, pod, address, 80))
        name, seconds = results[-1]
        return name == "ECONNREFUSED" and seconds < REFUSED_WITHIN_S

    settles(refused, timeout=20)
    return results[-1]


def filter_rules(cluster: KubeCluster, node: str) -> str:
    """The node's filter FORWARD chain as iptables-save prints it (for a failure message)."""
    netns = cluster.node(node).netns
    saved = subprocess.run(
        ["ip", "netns", "exec", netns, "iptables-save", "-t", "filter"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return "\n".join(line for line in saved.splitlines() if line.startswith("-A FORWARD"))


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> str:
    node = kube_cluster.nodes[0].name
    return kube_cluster.create_pod(NS, "client", node, {"app": "client"}).key


def test_a_service_without_endpoints_refuses_at_once(
    kube_cluster: KubeCluster, client: str
) -> None:
    address = empty_service(kube_cluster)
    name, seconds = refused_quickly(kube_cluster, client, address)
    rules = filter_rules(kube_cluster, kube_cluster.pods[client].node)
    print(f"\n[{kube_cluster.spec.proxy_mode}] no endpoints: {name} in {seconds * 1000:.1f} ms")
    print(rules)
    assert name == "ECONNREFUSED", f"{name} after {seconds:.3f}s\n{rules}"
    assert seconds < REFUSED_WITHIN_S, seconds


def test_tabbys_verdict_sits_below_kube_proxys_rules(
    kube_cluster: KubeCluster, client: str
) -> None:
    """Tabby's jump first (denies drop before anything), its ACCEPT last."""
    forward = filter_rules(kube_cluster, kube_cluster.pods[client].node).splitlines()
    assert "-j cali-FORWARD" in forward[0], forward
    assert "0x10000/0x10000" in forward[-1] and forward[-1].endswith("-j ACCEPT"), forward
    kube = [i for i, line in enumerate(forward) if "-j KUBE-" in line]
    if kube_cluster.spec.proxy_mode == "iptables":
        assert kube and min(kube) > 0 and max(kube) < len(forward) - 1, forward
    else:
        assert not kube, forward


def test_refused_with_an_egress_policy_on_the_client(
    kube_cluster: KubeCluster, client: str
) -> None:
    address = empty_service(kube_cluster)
    kube_cluster.apply_policy(
        {
            "metadata": {"name": "client-egress", "namespace": NS},
            "spec": {
                "podSelector": {"matchLabels": {"app": "client"}},
                "policyTypes": ["Egress"],
                "egress": [{"ports": [{"protocol": "TCP", "port": 80}]}],
            },
        }
    )
    try:
        # Every DaemonSet agent (its own RBAC) reports the policy programmed.
        waited = subprocess.run(
            [str(Path(sys.executable).with_name("tabbyctl")), "--kubeconfig",
             str(kube_cluster.kubeconfig), "policy", "wait", "networkpolicy/client-egress",
             "-n", NS, "--timeout", "60s", "-o", "json"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert waited.returncode == 0, waited.stdout + waited.stderr
        realized = json.loads(waited.stdout)
        assert realized["currentNodes"] >= 1
        # tabby-controllers (its Deployment, its RBAC) shows the same on the object.
        shown = f"{realized['currentNodes']}-of-{realized['desiredNodes']}"

        def label() -> str:
            return kube_cluster.kubectl(
                "-n", NS, "get", "networkpolicy", "client-egress",
                "-o", r"jsonpath={.metadata.labels.policy\.tabby\.dev/realized}",
            ).strip()  # fmt: skip

        assert settles(lambda: label() == shown, timeout=30), label()
        # the policy is in force: a port it does not allow times out (dropped)
        node = kube_cluster.nodes[1].ip
        assert settles(lambda: connect(kube_cluster, client, node, 81)[0] == "TIMEOUT", timeout=20)
        name, seconds = refused_quickly(kube_cluster, client, address)
        mode = kube_cluster.spec.proxy_mode
        print(f"\n[{mode}] no endpoints, egress policy: {name} in {seconds * 1000:.1f} ms")
        assert name == "ECONNREFUSED", f"{name} after {seconds:.3f}s"
        assert seconds < REFUSED_WITHIN_S, seconds
    finally:
        kube_cluster.delete_policy(NS, "client-egress")


def test_a_nodeport_answers_through_another_nodes_address(
    kube_cluster: KubeCluster, client: str
) -> None:
    server_node, other = kube_cluster.nodes[1].name, kube_cluster.nodes[1]
    kube_cluster.create_pod(NS, "web-np", server_node, {"app": "web"})
    web_service(kube_cluster, NS)
    kube_cluster.kubectl("-n", NS, "patch", "svc", "web", "-p", '{"spec":{"type":"NodePort"}}')
    found = json.loads(kube_cluster.kubectl("-n", NS, "get", "svc", "web", "-o", "json"))
    node_port = found["spec"]["ports"][0]["nodePort"]

    def answers() -> str:
        url = f"http://{other.ip}:{node_port}/hostname"
        got = kube_cluster.exec(client, ["curl", "-s", "-m", "2", url])
        return got.stdout.strip()

    assert settles(lambda: answers() == "web-np", timeout=30), answers()


def test_a_pod_reaches_itself_through_its_service(kube_cluster: KubeCluster) -> None:
    pod = kube_cluster.create_pod(NS, "self", kube_cluster.nodes[0].name, {"app": "self"})
    _apply(
        kube_cluster,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "self", "namespace": NS},
            "spec": {"selector": {"app": "self"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    found = json.loads(kube_cluster.kubectl("-n", NS, "get", "svc", "self", "-o", "json"))
    address = str(found["spec"]["clusterIP"])
    got = lambda: service_answers(kube_cluster, pod.key, address, tries=3)  # noqa: E731
    assert settles(lambda: got() == {"self"}, timeout=30), got()


HOST_PORT = 10180


def test_a_hostnetwork_endpoint_on_the_pods_node_answers_but_bgp_does_not(
    kube_cluster: KubeCluster, client: str
) -> None:
    """Upstream's "internalTrafficPolicy=Local Pod and Node, to Pod (hostNetwork)" shape:
    a hostNetwork server on the client's own node answers through its Service (kube-proxy
    DNATs to the node) and directly (the manifests' endpoint-to-host action, Accept);
    the node's BGP port never does. Before the fix the default Drop timed both out."""
    node = kube_cluster.pods[client].node
    body = kube_cluster.pod_manifest(NS, "host-web", node, {"app": "host-web"})
    [server] = body["spec"]["containers"]
    server["args"] = ["netexec", f"--http-port={HOST_PORT}", "--udp-port=-1"]
    server["ports"] = [{"containerPort": HOST_PORT}]
    server["readinessProbe"] = {"tcpSocket": {"port": HOST_PORT}, "periodSeconds": 1}
    body["spec"]["hostNetwork"] = True
    _apply(kube_cluster, body)
    kube_cluster.kubectl("-n", NS, "wait", "--for=condition=Ready", "pod/host-web", "--timeout=60s")
    _apply(
        kube_cluster,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "host-web", "namespace": NS},
            "spec": {
                "selector": {"app": "host-web"},
                "internalTrafficPolicy": "Local",
                "ports": [{"port": 80, "targetPort": HOST_PORT}],
            },
        },
    )
    found = json.loads(kube_cluster.kubectl("-n", NS, "get", "svc", "host-web", "-o", "json"))
    node_ip = kube_cluster.node(node).ip

    def hostname(address: str) -> str:
        got = kube_cluster.exec(client, ["curl", "-s", "-m", "2", f"http://{address}/hostname"])
        return got.stdout.strip()

    service = f"{found['spec']['clusterIP']}:80"
    assert settles(lambda: hostname(service) == node, timeout=30), hostname(service)
    assert hostname(f"{node_ip}:{HOST_PORT}") == node
    name, _ = connect(kube_cluster, client, node_ip, 179)
    assert name == "TIMEOUT", f"the node's BGP port answered a pod: {name}"


KUBELET_PORT = 10250  # listens on every address of the node


def test_no_pod_reaches_another_nodes_bgp_port_with_or_without_policies(
    kube_cluster: KubeCluster, client: str
) -> None:
    """Issue 40 probe 3: the client's connect to the other node's 179 completed the
    handshake with its ExaBGP. Now its own node drops it (`felix.bgp_guard`) before any
    policy, in both kube-proxy modes; the other node's kubelet port still answers, so
    the drop is port 179's alone."""
    own = kube_cluster.pods[client].node
    other = next(n for n in kube_cluster.nodes if n.name != own)
    assert connect(kube_cluster, client, other.ip, KUBELET_PORT)[0] == "CONNECTED"
    name, _ = connect(kube_cluster, client, other.ip, 179, wait_s=1)
    assert name == "TIMEOUT", f"{other.name}'s BGP port answered a pod: {name}"
    kube_cluster.apply_policy(
        {
            "metadata": {"name": "client-egress-all", "namespace": NS},
            "spec": {
                "podSelector": {"matchLabels": {"app": "client"}},
                "policyTypes": ["Egress"],
                "egress": [{}],
            },
        }
    )
    try:
        waited = subprocess.run(
            [str(Path(sys.executable).with_name("tabbyctl")), "--kubeconfig",
             str(kube_cluster.kubeconfig), "policy", "wait", "networkpolicy/client-egress-all",
             "-n", NS, "--timeout", "60s"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert waited.returncode == 0, waited.stdout + waited.stderr
        # An egress policy that allows everything opens nothing the guard closes.
        assert connect(kube_cluster, client, other.ip, KUBELET_PORT)[0] == "CONNECTED"
        for node in kube_cluster.nodes:  # a dropped SYN: no answer within 1 s is final
            name, _ = connect(kube_cluster, client, node.ip, 179, wait_s=1)
            assert name == "TIMEOUT", f"{node.name}'s BGP port answered a pod: {name}"
    finally:
        kube_cluster.delete_policy(NS, "client-egress-all")
