"""DEL after the agent lost its journal (issue 20; a Calico failure mode: the records
of what a node wired are gone, e.g. /run wiped, and the runtime's DEL then finds
nothing to undo, so the address leaks and the veth stays).

A one-node lab: two pods wired, the agent stopped, its journal (the record per wired
pod) deleted, the agent started again. The DELs the runtime sends next must still
remove each pod's veth and route and release its address, and the pod left alone
keeps its own.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from datastore.models import IPAMHandle
from felix.wiring import host_ifname_for
from ipam.report import Snapshot, check
from lab import netns
from lab.cluster import ClusterSpec, LabCluster
from tests.helpers import wait_for
from tests.integration.cluster.conftest import cluster_up

pytestmark = pytest.mark.integration

NETWORK = "k8s-pod-network"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[LabCluster]:
    with cluster_up(tmp_path, ClusterSpec(nodes=1)) as cluster:
        yield cluster


def _held(lab: LabCluster) -> set[str]:
    handles = lab.datastore().list(IPAMHandle)
    return {h.spec.handle_id for h in handles if any(h.spec.block.values())}


def test_a_del_after_the_journal_was_lost_still_unwires_and_releases(lab: LabCluster) -> None:
    gone = lab.create_pod("x", "gone", "node1")
    kept = lab.create_pod("x", "kept", "node1")
    node_ns = lab.node("node1").netns
    journal = lab.run_dir("node1") / "cni-inflight"
    assert any(journal.glob("*.ep")), "the agent keeps a record per wired pod"

    lab.restart_agent("node1", while_down=lambda: shutil.rmtree(journal))
    lab.delete_pod("x", "gone")  # DEL, the sandbox removed, then the Pod object

    veth = host_ifname_for("x", "gone")
    wait_for(lambda: veth not in netns.ip(node_ns, "-o", "link", "show"), what="veth gone")
    wait_for(lambda: f"{NETWORK}.{gone.container_id}" not in _held(lab), what="address released")
    assert netns.ip(node_ns, "route", "show", f"{gone.ip}/32").strip() == ""
    assert _held(lab) == {f"{NETWORK}.{kept.container_id}"}
    assert f"{kept.ip}/32" in netns.ip(kept.netns, "-4", "addr", "show", "eth0")
    assert host_ifname_for("x", "kept") in netns.ip(node_ns, "route", "show", f"{kept.ip}/32")
    report = check(Snapshot.load(lab.datastore()))
    assert (report.problems, report.leaks) == ([], [])
