"""`tabbyctl diagnose pod` against a real 2-node lab: each injected fault is named by its step.

One cluster serves all faults (bring-up is the expensive part); the faults are
injected from the least to the most destructive, each on its own pod where it
could disturb the next, and diagnose is run right after each injection, before
the agent's periodic resync could repair it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from datastore.models import IPPool
from felix.wiring import host_ifname_for
from ipam.allocator import IPAMAllocator
from lab import netns
from lab.cluster import ClusterSpec, LabCluster
from tabbyctl.diagnose import diagnose
from tabbyctl.main import Context

pytestmark = pytest.mark.integration


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[LabCluster]:
    cluster = LabCluster.up(tmp_path / "lab", ClusterSpec(nodes=2))
    try:
        cluster.create_namespace("x")
        cluster.create_pod("x", "a", "node1", {"pod": "a"})
        cluster.create_pod("x", "b", "node2", {"pod": "b"})
        cluster.create_pod("x", "r", "node1", {"pod": "r"})
        cluster.create_pod("x", "v", "node1", {"pod": "v"})
        yield cluster
    finally:
        cluster.down()


def run(cluster: LabCluster, *args: str) -> tuple[int, dict[str, Any]]:
    """Invoke the command as a user would (through --lab), return exit code and JSON."""
    result = CliRunner().invoke(
        diagnose,
        ["pod", *args, "--lab", str(cluster.workdir), "-o", "json"],
        obj=Context(str(cluster.kubeconfig)),
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(result.output)


def results(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["result"] for c in report["checks"]}


def failing(report: dict[str, Any]) -> list[str]:
    return [c["name"] for c in report["checks"] if c["result"] == "FAIL"]


def wait_for(check: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return False


def test_diagnose_names_each_injected_fault(lab: LabCluster) -> None:
    # healthy: every step OK once BGP has spread the blocks
    assert wait_for(lambda: run(lab, "x/a", "--to", "x/b")[0] == 0), run(lab, "x/a")[1]
    code, report = run(lab, "x/a", "--to", "x/b", "--port", "80/TCP")
    assert code == 0
    got = results(report)
    for name in (
        "pod",
        "pod netns",
        "host veth",
        "pod eth0",
        "pod default route",
        "host route",
        "ipam allocation",
        "ipam affinity",
        "ipam pool",
        "route on node2",
        "bgp sessions",
        "policy egress (x/a)",
        "policy ingress (x/b)",
    ):
        assert got.get(name) == "OK", (name, report)

    # explicit options instead of --lab find the same picture (no route check without others)
    node1 = lab.node("node1")
    explicit = CliRunner().invoke(
        diagnose,
        [
            "pod",
            "x/a",
            "--node-netns",
            node1.netns,
            "--pod-netns",
            lab.pods["x/a"].netns,
            "--other-node-netns",
            f"node2={lab.node('node2').netns}",
            "--run-dir",
            str(lab.run_dir("node1")),
            "-o",
            "json",
        ],
        obj=Context(str(lab.kubeconfig)),
    )
    assert explicit.exit_code == 0, explicit.output
    # and searching /run/netns finds the pod and node namespaces by themselves
    searched = CliRunner().invoke(
        diagnose, ["pod", "x/a", "-o", "json"], obj=Context(str(lab.kubeconfig))
    )
    # (another lab on this machine may hold the same IP and pod name: then it must say
    # so and name ours among the candidates rather than guess)
    found = {c["name"]: c for c in json.loads(searched.output)["checks"]}
    assert lab.pods["x/a"].netns in found["pod netns"]["detail"], found
    if "namespaces have" not in found["pod netns"]["detail"]:
        assert found["pod netns"]["result"] == "OK", found
    assert node1.netns in found["node netns"]["detail"], found
    if found["node netns"]["result"] == "OK":
        assert found["host route"]["result"] == "OK", found

    # traffic denied by a policy: the ingress step fails and names the policy
    lab.apply_policy(
        {
            "metadata": {"name": "deny-b", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"pod": "b"}}, "policyTypes": ["Ingress"]},
        }
    )
    code, report = run(lab, "x/a", "--to", "x/b", "--port", "80/TCP")
    assert code == 1 and failing(report) == ["policy ingress (x/b)"], report
    assert "x/deny-b" in json.dumps(report)
    lab.delete_policy("x", "deny-b")

    # deleted host route
    pod_r = lab.pods["x/r"]
    netns.ip(node1.netns, "route", "del", f"{pod_r.ip}/32")
    code, report = run(lab, "x/r")
    assert code == 1 and failing(report) == ["host route"], report

    # deleted veth (the pod's eth0 goes with it)
    netns.ip(node1.netns, "link", "del", host_ifname_for("x", "v"))
    code, report = run(lab, "x/v")
    assert code == 1 and failing(report)[0] == "host veth", report
    assert "pod eth0" in failing(report)

    # stale IPAM data: an allocation for a pod that does not exist (what a node lost
    # mid-DEL leaves); diagnose of another pod warns and names its handle, without failing
    ghost = "k8s-pod-network.ghost"
    IPAMAllocator(lab.datastore(), "node1", config_ttl=0).auto_assign(
        ghost, {"namespace": "x", "pod": "ghost", "node": "node1"}
    )
    code, report = run(lab, "x/a")
    stale = next(c for c in report["checks"] if c["name"] == "ipam stale")
    assert code == 0 and stale["result"] == "WARN", report
    assert ghost in stale["detail"]

    # competing CNI configs in the conf dir
    conf_dir = lab.workdir / "net.d"
    conf_dir.mkdir()
    for conf in ("05-other.conflist", "10-tabby.conflist"):
        (conf_dir / conf).write_text("{}")
    code, report = run(lab, "x/a", "--cni-conf-dir", str(conf_dir))
    cni = next(c for c in report["checks"] if c["name"] == "cni config")
    assert cni["result"] == "WARN" and "05-other.conflist" in cni["detail"], report

    # missing pool: IPAM names it
    ds = lab.datastore()
    ds.delete(ds.get(IPPool, "default-ipv4-ippool"), check_version=False)
    code, report = run(lab, "x/a")
    assert code == 1 and "ipam pool" in failing(report), report
    assert failing(report)[0] == "ipam pool", report

    # a peer's BGP session down: stop node2's agent (and its ExaBGP)
    assert lab.lab is not None
    agent2 = next(p for p in lab.lab.processes if p.name == "tabby-node-node2")
    agent2.stop()
    assert wait_for(lambda: results(run(lab, "x/a")[1]).get("bgp sessions") == "FAIL"), run(
        lab, "x/a"
    )[1]
