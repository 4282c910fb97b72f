"""Realization status on three real agents (issue 19): each agent publishes the policy
versions it has programmed (NodePolicyStatus), and `tabbyctl policy wait` returns when
every node has the current generation, or times out naming the node behind and why.

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

from datastore import kinds
from lab.cluster import ClusterSpec, LabCluster
from policy.realization import parse_report

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


def test_policy_wait_follows_every_agent(three_nodes: LabCluster) -> None:
    lab = three_nodes
    began = time.monotonic()
    lab.apply_policy(_np("b"))
    code, data, err = _wait(lab, "networkpolicy/only-a", "30s", "-n", "x")
    realized_s = time.monotonic() - began
    assert code == 0, (data, err)
    # Only node1 runs a pod the policy selects; node2 and node3 have programmed it too.
    assert (data["desiredNodes"], data["currentNodes"], data["generation"]) == (1, 1, 1)
    print(f"NetworkPolicy created -> realized on every node: {realized_s:.2f} s")

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

    lab.restart_agent("node3", while_down=while_node3_is_down)
    _set_ready(lab, "node3", "True")
    code, data, err = _wait(lab, "networkpolicy/only-a", "30s", "-n", "x")
    assert code == 0 and data["generation"] == 2, (data, err)
