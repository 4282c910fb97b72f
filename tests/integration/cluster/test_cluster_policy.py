"""ClusterNetworkPolicy tiers enforced by real agents on real packets (issue 19): two
lab nodes, pods on both, the policies created through the apiserver.

One scenario walks the tiers in the order a cluster administrator would use them:
a NetworkPolicy isolates x/a; an Admin Deny overrides its allow; a Pass hands the
decision back to it; an Admin Accept overrides its deny; a Baseline Deny holds for
pods no NetworkPolicy selects; deleting everything restores the default.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datastore import kinds
from datastore.errors import NotFound
from datastore.informer import ABSENT_RETRY_S
from lab.cluster import ClusterSpec, LabCluster
from lab.controlplane import CRD_PATH
from tests.helpers import settles

pytestmark = pytest.mark.integration

PODS = ("x/a", "x/b", "y/c")


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[LabCluster]:
    cluster = LabCluster.up(tmp_path / "lab", ClusterSpec(nodes=2))
    try:
        cluster.create_namespace("x", {"team": "x"})
        cluster.create_namespace("y", {"team": "y"})
        cluster.create_pod("x", "a", "node1", {"pod": "a"})
        cluster.create_pod("x", "b", "node2", {"pod": "b"})
        cluster.create_pod("y", "c", "node1", {"pod": "c"})
        yield cluster
    finally:
        cluster.down()


def _matrix(cluster: LabCluster) -> dict[tuple[str, str], bool]:
    return {
        (s, d): cluster.can_reach(s, d, timeout_s=1, attempts=1)
        for s in PODS
        for d in PODS
        if s != d
    }


def _settles(
    cluster: LabCluster, expected: dict[tuple[str, str], bool], deadline: float | None = None
) -> None:
    """Policy is enforced within the agents' passes: poll until the matrix holds."""
    deadline = deadline or time.monotonic() + 15
    seen = _matrix(cluster)
    while seen != expected and time.monotonic() < deadline:
        time.sleep(0.3)
        seen = _matrix(cluster)
    wrong = {pair: seen[pair] for pair in expected if seen[pair] != expected[pair]}
    assert not wrong, f"pairs not as expected (src, dst) -> reachable: {wrong}"


def cnp(name: str, tier: str, priority: int, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    subject = {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "a"}}}}
    spec = {"tier": tier, "priority": priority, "subject": subject, "ingress": ingress}
    return {"metadata": {"name": name}, "spec": spec}


FROM_Y = [{"namespaces": {"matchLabels": {"team": "y"}}}]
NP_FROM_Y = {
    "metadata": {"name": "from-y", "namespace": "x"},
    "spec": {
        "podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "y"}}}]}],
    },
}


def test_admin_and_baseline_tiers_around_a_networkpolicy(two_nodes: LabCluster) -> None:
    lab = two_nodes
    everything = dict.fromkeys(_matrix(lab), True)
    _settles(lab, everything)

    # NetworkPolicy: x/a admits only namespace y.
    lab.apply_policy(NP_FROM_Y)
    _settles(lab, {**everything, ("x/b", "x/a"): False})

    # Admin Deny from y beats the NetworkPolicy's allow.
    lab.apply_cluster_policy(cnp("no-y", "Admin", 10, [{"action": "Deny", "from": FROM_Y}]))
    _settles(lab, {**everything, ("x/b", "x/a"): False, ("y/c", "x/a"): False})

    # A Pass at a higher precedence hands y back to the NetworkPolicy.
    lab.apply_cluster_policy(cnp("pass-y", "Admin", 5, [{"action": "Pass", "from": FROM_Y}]))
    _settles(lab, {**everything, ("x/b", "x/a"): False})

    # An Admin Accept of everything overrides the NetworkPolicy's deny of x/b.
    lab.apply_cluster_policy(
        cnp("open", "Admin", 1, [{"action": "Accept", "from": [{"namespaces": {}}]}])
    )
    _settles(lab, everything)

    # Without the Admin tier and the NetworkPolicy, a Baseline Deny from y holds.
    for name in ("open", "pass-y", "no-y"):
        lab.delete_cluster_policy(name)
    lab.delete_policy("x", "from-y")
    lab.apply_cluster_policy(cnp("base", "Baseline", 1, [{"action": "Deny", "from": FROM_Y}]))
    _settles(lab, {**everything, ("y/c", "x/a"): False})

    # ... until a NetworkPolicy selects x/a: then it decides (it allows y).
    lab.apply_policy(NP_FROM_Y)
    _settles(lab, {**everything, ("x/b", "x/a"): False})

    lab.delete_policy("x", "from-y")
    lab.delete_cluster_policy("base")
    _settles(lab, everything)


def test_agents_work_without_the_crd_and_enforce_it_once_installed(
    two_nodes: LabCluster,
) -> None:
    """A cluster without the ClusterNetworkPolicy CRD (an older install, or one that
    leaves it out): an agent started there becomes ready, wires pods and enforces
    NetworkPolicy; once the CRD is installed, every agent enforces its policies."""
    lab = two_nodes
    assert lab.cp is not None
    kind = kinds.CLUSTERNETWORKPOLICY
    crd = f"{CRD_PATH}/{kind.plural}.{kind.group}"
    transport = lab.datastore().transport
    transport.request("DELETE", crd)
    assert settles(lambda: not _served(lab, kind), timeout=60), "the CRD was not deleted"
    lab.restart_agent("node2")  # returns once its CNI socket answers: it is ready
    lab.create_pod("x", "d", "node2", {"pod": "d"})
    assert lab.can_reach("x/d", "x/a") and lab.can_reach("y/c", "x/d")
    everything = dict.fromkeys(_matrix(lab), True)
    lab.apply_policy(NP_FROM_Y)
    _settles(lab, {**everything, ("x/b", "x/a"): False})

    lab.cp.install_crds()
    lab.apply_cluster_policy(cnp("no-y", "Admin", 10, [{"action": "Deny", "from": FROM_Y}]))
    deadline = time.monotonic() + ABSENT_RETRY_S + 15  # the agents look for it again
    _settles(lab, {**everything, ("x/b", "x/a"): False, ("y/c", "x/a"): False}, deadline)


def _served(lab: LabCluster, kind: kinds.ResourceKind) -> bool:
    try:
        lab.datastore().list_raw(kind)
    except NotFound:
        return False
    return True
