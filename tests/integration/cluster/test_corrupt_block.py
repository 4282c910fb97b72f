"""One malformed IPAMBlock must not stall every node (issue 21, item 4).

The scenario as an operator met it: a 2-node mesh lab with a pod on each node, then
an IPAMBlock whose fields disagree (allocations longer than the block, an inverted
`unallocated` range) is written straight to the apiserver, the way it was accepted
before the CRD's CEL rules (the test strips them from its own apiserver first, so
the runtime path is what is tested). Each agent must report it a bounded number of
times and keep its CPU low (no pass rerun in a hot loop), stay ready, keep routing,
and `tabbyctl ipam check` must name the block, exit 1 and still check the rest.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datastore import kinds
from ipam.block import decode_allocations, decode_ordinals, encode_ordinals
from lab.cluster import ClusterSpec, LabCluster
from lab.process import ManagedProcess
from tests.helpers import settles
from tests.integration.cluster.conftest import cluster_up

pytestmark = pytest.mark.integration

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/ipamblocks.crd.tabby.dev"
BAD_NAME = "10-244-99-0-26"
BAD_CIDR = "10.244.99.0/26"
WINDOW_S = 6.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


@pytest.fixture
def mesh2(tmp_path: Path) -> Iterator[LabCluster]:
    with cluster_up(tmp_path, ClusterSpec(nodes=2, subnets=1, bgp="mesh")) as cluster:
        yield cluster


def _agent(cluster: LabCluster, node: str) -> ManagedProcess:
    assert cluster.lab is not None
    return next(p for p in cluster.lab.processes if p.name == f"tabby-node-{node}")


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of pid and every descendant alive now."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        todo += parents.get(current, [])
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def _strip_cel(cluster: LabCluster) -> None:
    """Put the IPAMBlock CRD back as it was before its CEL rules (cidr rule kept)."""
    transport = cluster.datastore().transport
    crd = transport.request("GET", CRD_PATH)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec.pop("x-kubernetes-validations", None)
    for name, prop in spec["properties"].items():
        if name != "cidr":
            prop.pop("x-kubernetes-validations", None)
    transport.request("PUT", CRD_PATH, body=crd)


def _write_bad_block(cluster: LabCluster) -> None:
    body: dict[str, Any] = {
        "apiVersion": "crd.tabby.dev/v1",
        "kind": "IPAMBlock",
        "metadata": {"name": BAD_NAME},
        "spec": {
            "cidr": BAD_CIDR,
            "affinity": "host:node9",
            "allocations": "0,-*69",  # 70 entries for a 64-address block
            "unallocated": "9-3",  # an inverted range
            "attributes": ["1 h?node=node9"],
            "sequenceNumber": 1,
        },
    }
    ds = cluster.datastore()
    deadline = time.monotonic() + 20
    while True:  # the CRD's new schema takes a moment to be served
        try:
            ds.create_raw(kinds.IPAMBLOCK, body)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _ready(cluster: LabCluster, node: str) -> dict[str, Any]:
    status = json.loads((cluster.run_dir(node) / "status.json").read_text())
    return status  # type: ignore[no-any-return]


def _tabbyctl(cluster: LabCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tabbyctl.main", "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_one_corrupt_block_is_reported_once_and_every_node_keeps_working(
    mesh2: LabCluster,
) -> None:
    pods = {n.name: mesh2.create_pod("default", f"pod-{n.name}", n.name) for n in mesh2.nodes}
    assert mesh2.can_reach("default/pod-node1", "default/pod-node2")
    _strip_cel(mesh2)
    agents = {n.name: _agent(mesh2, n.name) for n in mesh2.nodes}
    ready = settles(
        lambda: all(_ready(mesh2, n)["ready"] for n in agents), timeout=30.0, interval=0.2
    )
    assert ready, "not ready at start"
    log_size = {n: a.log_path.stat().st_size for n, a in agents.items()}
    cpu_before = {n: _tree_cpu_s(a.pid or 0) for n, a in agents.items()}
    began = time.monotonic()

    _write_bad_block(mesh2)
    time.sleep(WINDOW_S)

    elapsed = time.monotonic() - began
    figures = []
    for node, agent in agents.items():
        cpu = (_tree_cpu_s(agent.pid or 0) - cpu_before[node]) / elapsed
        with open(agent.log_path, "rb") as handle:
            handle.seek(log_size[node])
            new = handle.read().decode(errors="replace")
        lines = new.splitlines()
        tracebacks = sum("Traceback" in line for line in lines)
        figures.append(
            f"{node}: {len(lines)} log lines ({len(new) / elapsed / 1024:.1f} KiB/s), "
            f"{tracebacks} tracebacks, CPU {100 * cpu:.1f}% over {elapsed:.1f}s"
        )
        print(figures[-1])
        about = [line for line in lines if BAD_NAME in line or BAD_CIDR in line]
        assert about, f"{node} never reported the corrupt block:\n{new[-2000:]}"
        assert len(lines) < 5 and tracebacks == 0, f"{node} log floods:\n{new[-3000:]}"
        assert cpu < 0.05, figures[-1]
        status = _ready(mesh2, node)
        assert status["ready"], f"{node} not ready: {status['conditions']}"

    # everything else keeps working: routes, traffic, new pods
    assert mesh2.can_reach("default/pod-node1", "default/pod-node2")
    late = mesh2.create_pod("default", "pod-late", "node2")
    assert late.ip not in {p.ip for p in pods.values()}
    assert mesh2.can_reach("default/pod-node1", late.key)

    # the operator's check names the bad block, exits 1, and still checks the rest
    checked = _tabbyctl(mesh2, "ipam", "check")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert re.search(rf"\[corrupt-block\].*{re.escape(BAD_CIDR)}", checked.stdout), checked.stdout
    assert "Checked 3 allocated address(es)." in checked.stdout, checked.stdout
    shown = _tabbyctl(mesh2, "ipam", "show", "--show-blocks")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert BAD_NAME in shown.stderr and "10.244." in shown.stdout, shown.stdout + shown.stderr


def test_a_node_whose_own_block_is_corrupt_allocates_elsewhere_not_a_duplicate(
    mesh2: LabCluster,
) -> None:
    """A free list naming an address a pod holds (no schema can see it): the node's next
    pod must not get that address again; the block is skipped and another one serves."""
    first = mesh2.create_pod("default", "pod-first", "node1")
    ds = mesh2.datastore()
    raw = next(
        b
        for b in ds.list_raw(kinds.IPAMBLOCK)[0]
        if b["spec"].get("affinity") == "host:node1"
        and ipaddress.ip_address(first.ip) in ipaddress.ip_network(b["spec"]["cidr"])
    )
    size = ipaddress.ip_network(raw["spec"]["cidr"]).num_addresses
    held = [
        o
        for o, i in enumerate(decode_allocations(raw["spec"]["allocations"], size))
        if i is not None
    ]
    free = list(decode_ordinals(raw["spec"]["unallocated"], size))
    raw["spec"]["unallocated"] = encode_ordinals([held[0], *free[:-1]])  # count unchanged
    ds.replace_raw(kinds.IPAMBLOCK, raw)

    second = mesh2.create_pod("default", "pod-second", "node1")
    assert second.ip != first.ip, "the corrupt block handed out an address a pod holds"
    assert ipaddress.ip_address(second.ip) not in ipaddress.ip_network(raw["spec"]["cidr"])
    other = mesh2.create_pod("default", "pod-other", "node2")
    assert mesh2.can_reach(second.key, other.key) and mesh2.can_reach(first.key, other.key)
    checked = _tabbyctl(mesh2, "ipam", "check")
    assert checked.returncode == 1 and raw["spec"]["cidr"] in checked.stdout, checked.stdout
