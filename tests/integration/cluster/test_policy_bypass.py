"""Issue 21 item 1: a tenant cannot open a denied pair by forging a Pod's address.

Real apiserver (RBAC on), two lab nodes running tabby-node, real packets. A
tenant who may create and patch Pods in namespace ``x`` (nothing else) creates
Pods that are never scheduled, carry the labels the policy trusts, and claim a
denied client's address (or 8.8.8.8) in the ``tabby.dev/podIP`` annotation; it
also rewrites the annotation of its own running, trusted pod. The pair stays
denied on both the same node and across nodes, and no forged address reaches
any ipset. The apiserver refuses the tenant a write to ``pods/status``: the
status (which policy does trust) is kubelet's to write.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datastore import kinds
from datastore.client import Datastore
from datastore.errors import DatastoreError
from datastore.transport import HttpTransport
from lab.cluster import ClusterSpec, LabCluster
from tests.helpers import settles
from tests.integration.cluster.conftest import cluster_up

TENANT = "mallory"
POLICY = {
    "metadata": {"name": "db-from-trusted", "namespace": "x"},
    "spec": {
        "podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "trusted"}}}]}],
    },
}


class TenantTransport(HttpTransport):
    """The admin's connection, acting as user ``mallory`` (Kubernetes impersonation)."""

    def _auth_headers(self) -> dict[str, str]:
        return {**super()._auth_headers(), "Impersonate-User": TENANT}


def _tenant(cluster: LabCluster) -> Datastore:
    """A Datastore as the tenant, who may create, read and patch Pods in ``x`` only."""
    admin = cluster.datastore()
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "pod-editor", "namespace": "x"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "verbs": ["create", "get", "list", "watch", "patch", "update", "delete"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "pod-editor", "namespace": "x"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-editor"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": TENANT}],
    }
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/x"
    admin.transport.request("POST", f"{rbac}/roles", body=role)
    admin.transport.request("POST", f"{rbac}/rolebindings", body=binding)
    return Datastore(TenantTransport.from_kubeconfig(str(cluster.kubeconfig)))


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[LabCluster]:
    with cluster_up(tmp_path, ClusterSpec(nodes=2)) as cluster:
        cluster.create_namespace("x")
        cluster.create_pod("x", "db", "node1", {"app": "db"})
        cluster.create_pod("x", "near", "node1", {"role": "untrusted"})  # denied, same node
        cluster.create_pod("x", "far", "node2", {"role": "untrusted"})  # denied, cross-node
        cluster.create_pod("x", "friend", "node2", {"role": "trusted"})  # allowed
        cluster.create_pod("x", "probe", "node2", {"role": "untrusted"})  # relabelled later
        yield cluster


def _reach(cluster: LabCluster) -> dict[str, bool]:
    """Which client reaches the db pod (one ICMP echo each)."""
    clients = ("x/near", "x/far", "x/friend", "x/probe")
    return {c: cluster.can_reach(c, "x/db", timeout_s=1, attempts=1) for c in clients}


def _rogue(name: str, address: str, **spec: Any) -> dict[str, Any]:
    """A Pod no scheduler will place (none runs in the lab), trusted labels, forged IP."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "x",
            "labels": {"role": "trusted"},
            "annotations": {"tabby.dev/podIP": f"{address}/32"},
        },
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
        # the apiserver drops a status sent with the Pod: kubelet writes it via pods/status
        "status": {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}]},
    }


def _ipset_members(cluster: LabCluster, node: str) -> set[str]:
    """Every member of every ipset in a node's namespace (``add <set> <member>`` lines)."""
    argv = ["ip", "netns", "exec", cluster.node(node).netns, "ipset", "save"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    return {line.split()[2] for line in out.splitlines() if line.startswith("add ")}


def test_forged_pod_addresses_never_open_a_denied_pair(lab: LabCluster) -> None:
    lab.apply_policy(POLICY)
    denied = {"x/near": False, "x/far": False, "x/friend": True, "x/probe": False}
    assert settles(lambda: _reach(lab) == denied), _reach(lab)

    tenant = _tenant(lab)
    near, far = lab.pods["x/near"].ip, lab.pods["x/far"].ip
    tenant.create_raw(kinds.POD, _rogue("rogue-near", near))
    tenant.create_raw(kinds.POD, _rogue("rogue-far", far))
    tenant.create_raw(kinds.POD, _rogue("rogue-dns", "8.8.8.8"))
    # bound to a node by the tenant itself, but never wired there
    tenant.create_raw(kinds.POD, _rogue("rogue-bound", far, nodeName="node2"))
    # the tenant's own running, trusted pod claims another address
    forged = {"metadata": {"annotations": {"tabby.dev/podIP": f"{near}/32"}}}
    tenant.patch_raw(kinds.POD, "friend", forged, "x")
    status = {"status": {"podIP": far, "podIPs": [{"ip": far}]}}
    with pytest.raises(DatastoreError) as refused:
        tenant.transport.request(
            "PATCH",
            kinds.POD.object_path("rogue-far", "x") + "/status",
            body=status,
            content_type="application/merge-patch+json",
        )
    assert refused.value.status == 403, refused.value
    pending = tenant.get_raw(kinds.POD, "rogue-far", "x")
    assert not (pending.get("status") or {}).get("podIP"), "the apiserver kept a tenant's status"

    # A later pod event on the same watch proves the agents saw the rogue Pods:
    # once probe is let in, the pass that did it had them in its cache too.
    lab.label_pod("x", "probe", {"role": "trusted"})
    expected = {**denied, "x/probe": True}
    assert settles(lambda: _reach(lab)["x/probe"]), _reach(lab)
    assert _reach(lab) == expected

    for node in ("node1", "node2"):
        members = _ipset_members(lab, node)
        if node == "node1":  # the db pod's node holds the policy's set: probe is in it
            assert lab.pods["x/probe"].ip in members, members
        leaked = {near, far, "8.8.8.8"} & {m.split(",")[0].split("/")[0] for m in members}
        assert not leaked, f"forged addresses in an ipset on {node}: {sorted(leaked)}"


def test_after_a_restart_re_adopted_pods_keep_their_own_address_not_their_annotation(
    lab: LabCluster,
) -> None:
    lab.create_pod("x", "insider", "node1", {"role": "trusted"})  # the tenant's own pod
    lab.apply_policy(POLICY)
    clients = ("x/near", "x/far", "x/friend", "x/insider")
    expected = {"x/near": False, "x/far": False, "x/friend": True, "x/insider": True}

    def reach() -> dict[str, bool]:
        return {c: lab.can_reach(c, "x/db", timeout_s=1, attempts=1) for c in clients}

    assert settles(lambda: reach() == expected), reach()
    far = lab.pods["x/far"].ip
    tenant = _tenant(lab)
    forged = {"metadata": {"annotations": {"tabby.dev/podIP": f"{far}/32"}}}
    tenant.patch_raw(kinds.POD, "insider", forged, "x")

    lab.restart_agent("node1")
    # db and insider are re-adopted with the addresses Tabby gave them: policy holds
    assert settles(lambda: reach() == expected), reach()
    members = _ipset_members(lab, "node1")
    assert lab.pods["x/insider"].ip in members and far not in members, members

    # The agent comes back without its journal (the records of every pod it wired): it
    # re-adopts db and insider from their routes and IPAM alone, so policy still holds.
    journal = lab.run_dir("node1") / "cni-inflight"
    assert any(journal.glob("*.ep")), "the agent keeps a record per wired pod"
    lab.restart_agent("node1", while_down=lambda: shutil.rmtree(journal))
    assert settles(lambda: reach() == expected), reach()
    members = _ipset_members(lab, "node1")
    assert lab.pods["x/insider"].ip in members and far not in members, members
