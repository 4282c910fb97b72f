"""Lifecycle on real nodes: what kubelet, the DaemonSet controller and node deletion do.

- a sandbox kubelet recreates (its pause process killed) is networked again, once;
- the tabby-node pod replaced by the DaemonSet controller drops no established flow
  and never lets a denied client through meanwhile;
- a Node deleted and registered again is cleaned up (IPAM, BGP) and rejoins.

This module's nodes run kube-proxy in nftables mode (test_real_nodes uses iptables),
so Tabby's iptables rules are also checked beside kube-proxy's nftables tables.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from datastore import kinds
from lab.kubecluster import TABBY_NAMESPACE, KubeCluster, KubeSpec
from tests.helpers import settles
from tests.integration.nodes.conftest import LabPool, service_answers, shared_lab, web_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kube_cluster(lab_pool: LabPool) -> Iterator[KubeCluster]:
    """Three real nodes, kube-proxy in nftables mode: test_services.py's second lab,
    which this module ends (it deletes a node)."""
    yield from shared_lab(lab_pool, KubeSpec(nodes=3, proxy_mode="nftables"))


def test_a_clusterip_service_works_with_kube_proxy_in_nftables_mode(
    kube_cluster: KubeCluster,
) -> None:
    for node in kube_cluster.nodes[:2]:
        kube_cluster.create_pod("nft", f"web-{node.name}", node.name, {"app": "web"})
    address = web_service(kube_cluster, "nft")
    client = kube_cluster.create_pod("nft", "client", kube_cluster.nodes[-1].name)
    tables = subprocess.run(
        ["ip", "netns", "exec", kube_cluster.nodes[-1].netns, "nft", "list", "tables"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "kube-proxy" in tables, tables

    backends = {f"web-{n.name}" for n in kube_cluster.nodes[:2]}
    answers = lambda: service_answers(kube_cluster, client.key, address)  # noqa: E731
    assert settles(lambda: answers() == backends, timeout=30), answers()


AGENT_SELECTOR = "app.kubernetes.io/name=tabby-node"


def _json(cluster: KubeCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json"))


def _ipam_check(cluster: KubeCluster) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tabbyctl.main", "--kubeconfig", str(cluster.kubeconfig)]
    return subprocess.run(
        [*argv, "ipam", "check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _sandboxes(cluster: KubeCluster, pod: str) -> list[str]:
    info = cluster.pods[pod]
    runtime = cluster.kube_node(info.node).containerd
    return runtime.crictl(
        "pods", "-q", "--namespace", info.namespace, "--name", f"^{info.name}$", "--state", "ready"
    ).split()


def _tcp_open(cluster: KubeCluster, src: str, ip: str, port: int = 8080) -> bool:
    probe = cluster.exec(src, ["curl", "-s", "-m", "1", "-o", "/dev/null", f"http://{ip}:{port}/"])
    return probe.returncode == 0


def test_a_recreated_sandbox_is_networked_again_without_a_duplicate_address(
    kube_cluster: KubeCluster,
) -> None:
    node = kube_cluster.nodes[0].name
    pod = kube_cluster.create_pod("life", "phoenix", node)
    peer = kube_cluster.create_pod("life", "witness", kube_cluster.nodes[-1].name)
    (old_sandbox,) = _sandboxes(kube_cluster, pod.key)
    os.kill(kube_cluster.sandbox_pid(pod.key), signal.SIGKILL)

    def renewed() -> bool:
        current = _sandboxes(kube_cluster, pod.key)
        return bool(current) and current != [old_sandbox]

    assert settles(renewed, timeout=90), "kubelet did not recreate the sandbox"
    kube_cluster.kubectl("-n", "life", "wait", "--for=condition=Ready", "pod/phoenix")
    again = kube_cluster._pod_from_api("life", "phoenix")
    kube_cluster.pods[pod.key] = again
    assert again.ip.startswith("10.244.")
    assert settles(lambda: kube_cluster.can_reach(peer.key, pod.key), timeout=20), (
        kube_cluster.network_diagnostics([node, peer.node], [peer.key, pod.key])
    )
    # One address per pod: the dead sandbox's was released (CNI DEL), none leaked.
    assert settles(lambda: _ipam_check(kube_cluster).returncode == 0, timeout=30), _ipam_check(
        kube_cluster
    ).stdout


FLOW = r"""
import socket, sys, time
ip, seconds = sys.argv[1], float(sys.argv[2])
s = socket.create_connection((ip, 8080), timeout=2)
ok = errors = 0
end = time.time() + seconds
while time.time() < end:
    try:
        s.sendall(b"GET /echo?msg=x HTTP/1.1\r\nHost: f\r\n\r\n")
        data = s.recv(4096)
        if not data:
            raise OSError("closed")
        ok += 1
    except OSError as exc:
        errors += 1
        print("error", exc, flush=True)
        s = socket.create_connection((ip, 8080), timeout=2)
    time.sleep(0.1)
print(f"ok={ok} errors={errors}", flush=True)
"""

INTRUDER = r"""
import socket, sys, time
ip, seconds = sys.argv[1], float(sys.argv[2])
tries = through = 0
end = time.time() + seconds
while time.time() < end:
    tries += 1
    s = socket.socket()
    s.settimeout(0.2)
    try:
        s.connect((ip, 8080))
        through += 1
    except OSError:
        pass
    finally:
        s.close()
    time.sleep(0.05)
print(f"tries={tries} through={through}", flush=True)
"""


def _in_pod(cluster: KubeCluster, pod: str, script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*cluster.netns_argv(pod), sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _agent_pod(cluster: KubeCluster, node: str) -> dict[str, Any]:
    pods = _json(cluster, "-n", TABBY_NAMESPACE, "get", "pods", "-l", AGENT_SELECTOR)["items"]
    (pod,) = [p for p in pods if p["spec"]["nodeName"] == node]
    return dict(pod)


def test_replacing_the_tabby_node_pod_keeps_flows_and_opens_no_window(
    kube_cluster: KubeCluster,
) -> None:
    server_node, client_node = kube_cluster.nodes[-1].name, kube_cluster.nodes[0].name
    server = kube_cluster.create_pod("guard", "server", server_node, {"app": "guarded"})
    friend = kube_cluster.create_pod("guard", "friend", client_node, {"role": "friend"})
    intruder = kube_cluster.create_pod("guard", "intruder", server_node, {"role": "intruder"})
    kube_cluster.apply_policy(
        {
            "metadata": {"name": "friends-only", "namespace": "guard"},
            "spec": {
                "podSelector": {"matchLabels": {"app": "guarded"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "friend"}}}]}],
            },
        }
    )
    assert settles(lambda: not _tcp_open(kube_cluster, intruder.key, server.ip), timeout=20)
    assert _tcp_open(kube_cluster, friend.key, server.ip)

    seconds = "45"
    flow = _in_pod(kube_cluster, friend.key, FLOW, server.ip, seconds)
    probe = _in_pod(kube_cluster, intruder.key, INTRUDER, server.ip, seconds)
    try:
        time.sleep(2)
        old = _agent_pod(kube_cluster, server_node)
        kube_cluster.kubectl("-n", TABBY_NAMESPACE, "delete", "pod", old["metadata"]["name"])

        def replaced() -> bool:
            new = _agent_pod(kube_cluster, server_node)
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in new.get("status", {}).get("conditions", [])
            )
            return new["metadata"]["uid"] != old["metadata"]["uid"] and ready

        assert settles(replaced, timeout=40, interval=1), "the DaemonSet did not replace it"
        flow_out, _ = flow.communicate(timeout=90)
        probe_out, _ = probe.communicate(timeout=90)
    finally:
        for proc in (flow, probe):
            proc.kill()
            proc.wait()
    assert flow_out.strip().endswith("errors=0"), flow_out
    assert "ok=" in flow_out and int(flow_out.split("ok=")[1].split()[0]) > 100, flow_out
    assert probe_out.strip().endswith("through=0"), probe_out
    kube_cluster.delete_policy("guard", "friends-only")


def test_a_deleted_node_is_cleaned_up_and_rejoins(kube_cluster: KubeCluster) -> None:
    gone = kube_cluster.nodes[-1].name
    observer = kube_cluster.nodes[0].name
    # GC passes every few seconds instead of 7.5 min: what an operator sets to watch it.
    kube_cluster.kubectl(
        "-n", TABBY_NAMESPACE, "set", "env", "deploy/tabby-controllers", "GC_INTERVAL_SECONDS=3"
    )
    kube_cluster.kubectl(
        "-n", TABBY_NAMESPACE, "rollout", "status", "deploy/tabby-controllers", "--timeout=120s"
    )
    ds = kube_cluster.datastore()

    def affinities_of(node: str) -> list[str]:
        items, _ = ds.list_raw(kinds.BLOCKAFFINITY)
        return [a["metadata"]["name"] for a in items if a["spec"].get("node") == node]

    assert affinities_of(gone), "the node had no block before"
    kube_node = kube_cluster.kube_node(gone)
    kube_node.stop_kubelet()
    kube_cluster.kubectl("delete", "node", gone)

    def peers(node: str) -> int:
        status = kube_cluster.run_dir(node) / "bgp-status.json"
        try:
            doc = json.loads(status.read_text())
        except (OSError, ValueError):
            return -1
        return sum(1 for p in doc.get("peers", []) if p.get("info") == "Established")

    expected_peers = len(kube_cluster.nodes) - 1
    assert settles(lambda: peers(observer) == expected_peers - 1, timeout=60), peers(observer)
    assert settles(lambda: not affinities_of(gone), timeout=60), (
        "tabby-controllers did not release the deleted node's affinities"
    )

    # As after a reinstall, and whatever the timing: the pods bound to the deleted Node
    # (tabby-node's among them) are gone before it registers again, so kubelet tears
    # them down and the DaemonSet starts a new agent. The operator deletes them, as the
    # pod GC would after its fixed 40 s quarantine.
    def pods_on(node: str) -> list[str]:
        items = _json(
            kube_cluster, "get", "pods", "-A", "--field-selector", f"spec.nodeName={node}"
        )
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in items["items"]]

    kube_cluster.kubectl(
        "delete", "pods", "-A", "--field-selector", f"spec.nodeName={gone}",
        "--force", "--grace-period=0", "--wait=false",
    )  # fmt: skip
    assert settles(lambda: not pods_on(gone), timeout=150), pods_on(gone)
    kube_node.start_kubelet()
    kube_node.wait_ready(kube_cluster.kubectl_argv(), timeout=120)
    kube_cluster.wait_daemonset()
    assert settles(lambda: peers(observer) == expected_peers, timeout=60), (
        kube_cluster.network_diagnostics([observer, gone])
    )
    assert settles(lambda: peers(gone) == expected_peers, timeout=60), (
        kube_cluster.network_diagnostics([observer, gone])
    )
    newcomer = kube_cluster.create_pod("rejoin", "newcomer", gone)
    local = kube_cluster.create_pod("rejoin", "local", observer)
    assert settles(lambda: kube_cluster.can_reach(local.key, newcomer.key), timeout=30), (
        kube_cluster.network_diagnostics([observer, gone], [local.key, newcomer.key])
    )
    assert settles(lambda: _ipam_check(kube_cluster).returncode == 0, timeout=60), _ipam_check(
        kube_cluster
    ).stdout
