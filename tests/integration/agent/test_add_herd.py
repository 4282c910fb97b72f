"""100 ADDs at once on an empty node (issue 20; Calico's "thundering herd", fixed in
3.31: handles leaked and nodes claimed blocks they did not need).

One node, its agent just started, no block yet; a pool of /26 blocks (64 addresses),
so 100 pods need exactly two. All 100 ADDs are sent together, as kubelet does when a
Deployment lands on a fresh node. Then: every ADD succeeded with its own address, the
node holds two blocks (not three), one handle per pod and nothing else, IPAM's own
check is clean; and after 100 DELs at once nothing is held.
"""

from __future__ import annotations

import ipaddress
from concurrent.futures import ThreadPoolExecutor

import pytest

from datastore.models import BlockAffinity, IPAMHandle
from ipam.report import Snapshot, check
from lab import netns
from tests.helpers import wait_for
from tests.integration.agent.conftest import AgentNode, create_pod

pytestmark = pytest.mark.integration

PODS = 100
BLOCK_ADDRESSES = 64  # the test pool's /26
NETWORK = "k8s-pod-network"


def test_100_adds_at_once_on_an_empty_node_claim_two_blocks_and_leak_no_handle(
    agent_node: AgentNode,
) -> None:
    ds, node = agent_node.datastore, agent_node.node.name
    assert ds.list(BlockAffinity) == [], "not an empty node (nor cluster)"
    names = [f"herd-{i:03d}" for i in range(PODS)]
    pod_ns = {}
    for name in names:
        create_pod(ds, "default", name, node)
        pod_ns[name] = agent_node.lab.ns(name)
        netns.add(pod_ns[name])

    def add(name: str) -> tuple[int, dict]:
        return agent_node.cni("ADD", f"cid{name}", pod_ns[name], pod=("default", name))

    with ThreadPoolExecutor(max_workers=PODS) as pool:
        results = dict(zip(names, pool.map(add, names), strict=True))
    failed = {n: r for n, (code, r) in results.items() if code != 0}
    assert not failed, failed
    addresses = {ipaddress.ip_interface(r["ips"][0]["address"]).ip for _, r in results.values()}
    assert len(addresses) == PODS

    affinities = ds.list(BlockAffinity)  # the agent's node is the only one here
    assert len({a.spec.node for a in affinities}) == 1
    blocks = sorted(a.spec.cidr for a in affinities)
    assert len(blocks) == -(-PODS // BLOCK_ADDRESSES), blocks  # two, not one more
    assert all(a.spec.state == "confirmed" for a in ds.list(BlockAffinity))
    handles = {h.spec.handle_id for h in ds.list(IPAMHandle) if any(h.spec.block.values())}
    assert handles == {f"{NETWORK}.cid{n}" for n in names}
    report = check(Snapshot.load(ds))
    assert (report.problems, report.leaks, report.allocations) == ([], [], PODS)

    def delete(name: str) -> int:
        return agent_node.cni("DEL", f"cid{name}", pod_ns[name], pod=("default", name))[0]

    with ThreadPoolExecutor(max_workers=PODS) as pool:
        assert list(pool.map(delete, names)) == [0] * PODS
    # DEL answers first and releases right after it
    wait_for(lambda: check(Snapshot.load(ds)).allocations == 0, what="every address released")
    assert [h.spec.handle_id for h in ds.list(IPAMHandle) if any(h.spec.block.values())] == []
