"""Realization status on three real agents (issue 19): each agent publishes the policy
versions it has programmed (NodePolicyStatus), and `tabbyctl policy wait` returns when
every node has the current generation, or times out naming the node behind and why.
tabby-controllers' policy status controller (run here in-process) shows the same on
the policy objects: a ClusterNetworkPolicy's Realized condition, in the REALIZED column
the apiserver prints for `kubectl get cnp`, and a NetworkPolicy's label and annotation.

Three lab nodes; pods on node1 and node2, none on node3 (so a policy applies to at
most two of them, and node3 must still have programmed each generation). The lab's
Nodes have no kubelet: the test sets their Ready condition as the node controller
would, and takes node3 down (agent stopped, Ready=False) for one change.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controllers.policy_status import PolicyStatusController
from datastore import kinds
from lab.cluster import ClusterSpec, LabCluster
from policy.realization import REALIZED_ANNOTATION, REALIZED_LABEL, parse_report
from tests.helpers import settles

pytestmark = pytest.mark.integration

TABBYCTL = str(Path(sys.executable).with_name("tabbyctl"))


@pytest.fixture
def three_nodes(tmp_path: Path) -> Iterator[LabCluster]:
    cluster = LabCluster.up(tmp_path / "lab", ClusterSpec(nodes=3))
    try:
        cluster.create_namespace("x", {"team": "x"})
        cluster.create_pod("x", "a", "node1", {"pod": "a"})
        cluster.create_pod("x", "b", "node2", {"pod": "b"})
        for node in ("node1", "node2", "node3"):
            _set_ready(cluster, node, "True")
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def status_controller(three_nodes: LabCluster) -> Iterator[PolicyStatusController]:
    controller = PolicyStatusController(three_nodes.datastore())
    controller.start()
    try:
        assert controller.wait_synced(timeout=30)
        yield controller
    finally:
        controller.stop()


def _networkpolicy_shows(lab: LabCluster) -> tuple[str, str]:
    """The NetworkPolicy's realized label and annotation (what `kubectl get -L` shows)."""
    meta = lab.datastore().get_raw(kinds.NETWORKPOLICY, "only-a", "x")["metadata"]
    label = (meta.get("labels") or {}).get(REALIZED_LABEL, "")
    return label, (meta.get("annotations") or {}).get(REALIZED_ANNOTATION, "")


def _cnp_column(lab: LabCluster, name: str) -> str:
    """The REALIZED cell the apiserver prints for `kubectl get cnp NAME` (a server-side
    Table, as kubectl asks for it)."""
    table = lab.datastore().transport.request(
        "GET",
        kinds.CLUSTERNETWORKPOLICY.object_path(name),
        accept="application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    columns = [c["name"] for c in table["columnDefinitions"]]
    return str(table["rows"][0]["cells"][columns.index("Realized")])


def _set_ready(cluster: LabCluster, node: str, status: str) -> None:
    """The Node's Ready condition, as the node controller writes it."""
    condition = {
        "type": "Ready",
        "status": status,
        "reason": "KubeletReady" if status == "True" else "NodeStatusUnknown",
        "message": "" if status == "True" else "Kubelet stopped posting node status.",
        "lastHeartbeatTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    cluster.datastore().transport.request(
        "PATCH",
        kinds.NODE.object_path(node) + "/status",
        body={"status": {"conditions": [condition]}},
        content_type="application/strategic-merge-patch+json",
    )


def _wait(cluster: LabCluster, ref: str, timeout: str, *extra: str) -> tuple[int, Any, str]:
    proc = subprocess.run(
        [TABBYCTL, "--kubeconfig", str(cluster.kubeconfig), "policy", "wait", ref, *extra,
         "--timeout", timeout, "-o", "json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def _np(generation_marker: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "only-a", "namespace": "x"},
        "spec": {
            "podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": generation_marker}}}]}],
        },
    }


def test_policy_wait_follows_every_agent(
    three_nodes: LabCluster, status_controller: PolicyStatusController
) -> None:
    lab = three_nodes
    began = time.monotonic()
    lab.apply_policy(_np("b"))
    code, data, err = _wait(lab, "networkpolicy/only-a", "30s", "-n", "x")
    realized_s = time.monotonic() - began
    assert code == 0, (data, err)
    # Only node1 runs a pod the policy selects; node2 and node3 have programmed it too.
    assert (data["desiredNodes"], data["currentNodes"], data["generation"]) == (1, 1, 1)
    print(f"NetworkPolicy created -> realized on every node: {realized_s:.2f} s")
    shown = ("1-of-1", "1/1 nodes run generation 1")
    assert settles(lambda: _networkpolicy_shows(lab) == shown, timeout=30), _networkpolicy_shows(
        lab
    )
    print(f"NetworkPolicy created -> its label shows 1-of-1: {time.monotonic() - began:.2f} s")

    began = time.monotonic()
    lab.apply_cluster_policy(
        {
            "metadata": {"name": "deny-from-c"},
            "spec": {
                "tier": "Admin",
                "priority": 10,
                "subject": {"namespaces": {"matchLabels": {"team": "x"}}},
                "ingress": [
                    {
                        "action": "Deny",
                        "from": [
                            {
                                "pods": {
                                    "namespaceSelector": {},
                                    "podSelector": {"matchLabels": {"pod": "c"}},
                                }
                            }
                        ],
                    }
                ],
            },
        }
    )
    code, data, err = _wait(lab, "clusternetworkpolicy/deny-from-c", "30s")
    assert code == 0, (data, err)
    assert (data["desiredNodes"], data["currentNodes"]) == (2, 2)  # pods on node1, node2
    print(f"ClusterNetworkPolicy created -> realized: {time.monotonic() - began:.2f} s")
    column = "2/2 nodes run generation 1"
    assert settles(lambda: _cnp_column(lab, "deny-from-c") == column, timeout=30), _cnp_column(
        lab, "deny-from-c"
    )
    print(f"ClusterNetworkPolicy created -> REALIZED column: {time.monotonic() - began:.2f} s")
    cnp = lab.datastore().get_raw(kinds.CLUSTERNETWORKPOLICY, "deny-from-c")
    (condition,) = cnp["status"]["conditions"]
    assert (condition["status"], condition["reason"]) == ("True", "AllNodesRealized")
    assert condition["observedGeneration"] == cnp["metadata"]["generation"] == 1

    # Every agent's report says so, too.
    reports = [parse_report(r) for r in lab.datastore().list_raw(kinds.NODEPOLICYSTATUS)[0]]
    assert sorted(r.node for r in reports) == ["node1", "node2", "node3"]
    applied = {r.node: r.applied for r in reports}
    assert applied["node1"] == {"np/x/only-a", "cnp/deny-from-c"}
    assert applied["node2"] == {"cnp/deny-from-c"} and applied["node3"] == frozenset()

    def while_node3_is_down() -> None:
        _set_ready(lab, "node3", "Unknown")
        lab.apply_policy(_np("c"))  # generation 2, which node3's agent cannot see
        code, data, err = _wait(lab, "networkpolicy/only-a", "3s", "-n", "x")
        assert code == 1, (data, err)
        assert [p["node"] for p in data["pending"]] == ["node3"]
        reason = data["pending"][0]["reason"]
        assert reason.startswith("has programmed generation 1, not generation 2 yet")
        assert "node not Ready: Ready=Unknown" in reason
        assert "timed out after 3s: node3 has programmed generation 1" in err
        assert data["currentNodes"] == 1  # node1 has generation 2
        behind = ("1-of-2", "1/2 nodes run generation 2; behind: node3")
        assert settles(lambda: _networkpolicy_shows(lab) == behind, timeout=30), (
            _networkpolicy_shows(lab)
        )

    lab.restart_agent("node3", while_down=while_node3_is_down)
    _set_ready(lab, "node3", "True")
    code, data, err = _wait(lab, "networkpolicy/only-a", "30s", "-n", "x")
    assert code == 0 and data["generation"] == 2, (data, err)
    shown = ("1-of-1", "1/1 nodes run generation 2")
    assert settles(lambda: _networkpolicy_shows(lab) == shown, timeout=30), _networkpolicy_shows(
        lab
    )
