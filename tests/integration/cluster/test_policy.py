"""NetworkPolicy enforced on real packets between pods on two lab nodes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab.cluster import ClusterSpec, LabCluster


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[LabCluster]:
    cluster = LabCluster.up(tmp_path / "lab", ClusterSpec(nodes=2))
    try:
        for ns in ("x", "y"):
            cluster.create_namespace(ns)
        cluster.create_pod("x", "a", "node1", {"pod": "a"})
        cluster.create_pod("x", "b", "node2", {"pod": "b"})
        cluster.create_pod("y", "c", "node1", {"pod": "c"})
        yield cluster
    finally:
        cluster.down()


def _settles(check: Callable[[], bool], timeout: float = 15.0) -> bool:
    """Policy is enforced within the agent's pass: poll until the matrix holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.3)
    return False


def _matrix(cluster: LabCluster) -> dict[tuple[str, str], bool]:
    pods = ("x/a", "x/b", "y/c")
    return {
        (s, d): cluster.can_reach(s, d, timeout_s=1, attempts=1)
        for s in pods
        for d in pods
        if s != d
    }


def test_default_deny_then_allow_by_label_same_node_and_cross_node(two_nodes: LabCluster) -> None:
    everything = dict.fromkeys(_matrix(two_nodes), True)
    assert _settles(lambda: _matrix(two_nodes) == everything)

    two_nodes.apply_policy(
        {
            "metadata": {"name": "deny-a", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"]},
        }
    )
    expected = {**everything, ("x/b", "x/a"): False, ("y/c", "x/a"): False}
    assert _settles(lambda: _matrix(two_nodes) == expected), _matrix(two_nodes)

    # allow from pods labelled pod=b in any namespace: b (cross-node) gets in, c does not
    two_nodes.apply_policy(
        {
            "metadata": {"name": "allow-b", "namespace": "x"},
            "spec": {
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [
                    {
                        "from": [
                            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "b"}}}
                        ]
                    }
                ],
            },
        }
    )
    expected[("x/b", "x/a")] = True
    assert _settles(lambda: _matrix(two_nodes) == expected), _matrix(two_nodes)

    # relabel c (same node as a) to pod=b: the ipset changes, c gets in
    two_nodes.label_pod("y", "c", {"pod": "b"})
    expected[("y/c", "x/a")] = True
    assert _settles(lambda: _matrix(two_nodes) == expected), _matrix(two_nodes)

    two_nodes.delete_policy("x", "allow-b")
    two_nodes.delete_policy("x", "deny-a")
    assert _settles(lambda: _matrix(two_nodes) == everything), _matrix(two_nodes)
