"""tabby-node end to end on a lab node: the plugin, real IPAM in the apiserver, the kernel."""

from __future__ import annotations

import ipaddress
import json
import stat
import subprocess
import sys

from datastore import kinds
from datastore.models import BlockAffinity, IPAMHandle, IPPool
from lab import netns
from tests.helpers import settles, wait_for
from tests.integration.agent.conftest import AgentNode, create_pod


def _pod_ns(agent_node: AgentNode, name: str) -> str:
    ns = agent_node.lab.ns(f"pod-{name}")
    netns.add(ns)
    return ns


def test_add_wires_the_pod_with_an_address_from_the_nodes_block_and_del_releases_it(
    agent_node: AgentNode,
) -> None:
    ds = agent_node.datastore
    create_pod(ds, "default", "web", agent_node.node.name)
    pod_ns = _pod_ns(agent_node, "web")
    code, result = agent_node.cni("ADD", "c0ffee01", pod_ns)
    assert code == 0, result
    address = ipaddress.ip_interface(result["ips"][0]["address"])
    assert address.ip in ipaddress.ip_network("10.100.0.0/16")

    # the pod side: eth0 with its /32 and a default route via 169.254.1.1
    assert f"{address.ip}/32" in netns.ip(pod_ns, "-4", "addr", "show", "eth0")
    assert "default via 169.254.1.1 dev eth0" in netns.ip(pod_ns, "route", "show")
    # the node side: a /32 route to the pod through its cali veth, Tabby's protocol
    routes = netns.ip(agent_node.node.netns, "route", "show", f"{address.ip}/32")
    assert "dev cali" in routes and "proto 80" in routes

    # IPAM in the datastore: the node's affine block holds it, under a handle
    affinities = [a for a in ds.list(BlockAffinity) if a.spec.state == "confirmed"]
    assert any(address.ip in ipaddress.ip_network(a.spec.cidr) for a in affinities)
    assert any(h.spec.handle_id.endswith(".c0ffee01") for h in ds.list(IPAMHandle))
    annotations = ds.get_raw(kinds.POD, "web", "default")["metadata"]["annotations"]
    assert annotations["tabby.dev/podIP"] == f"{address.ip}/32"

    # a repeated ADD answers the same; the operator sees the endpoint
    assert agent_node.cni("ADD", "c0ffee01", pod_ns) == (0, result)

    def listed() -> list[str]:
        listing = subprocess.run(
            [
                sys.executable,
                "-m",
                "tabbyctl.main",
                "endpoints",
                "--run-dir",
                str(agent_node.run_dir),
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return [e["ip"] for e in json.loads(listing)["endpoints"]]

    # status.json is written by the agent's loop right after the ADD's pass, not
    # inside it (off the ADD's path): wait for it, then hold it to exactly this pod.
    wait_for(lambda: listed() != [], timeout=10, what="the endpoint in tabbyctl endpoints")
    assert listed() == [str(address.ip)]

    # What the agent keeps on the node (socket, journal, status) is root's alone.
    run = agent_node.run_dir
    modes = {
        name: stat.S_IMODE((run / name).lstat().st_mode) for name in ("cni.sock", "cni-inflight")
    }
    assert (stat.S_IMODE(run.stat().st_mode), modes) == (
        0o700,
        {"cni.sock": 0o600, "cni-inflight": 0o700},
    )
    for path in run.rglob("*"):
        info = path.lstat()
        assert info.st_uid == 0 and not info.st_mode & 0o022, (path, oct(info.st_mode))

    code, body = agent_node.health("/readyz")
    assert code == 200, body
    code, metrics = agent_node.health("/metrics")
    assert 'tabby_cni_request_seconds_count{command="ADD",result="ok"} 2.0' in metrics

    assert agent_node.cni("DEL", "c0ffee01", pod_ns)[0] == 0
    # DEL answers first; the veth and then the address go right after it
    wait_for(
        lambda: "cali" not in netns.ip(agent_node.node.netns, "link", "show"), what="veth gone"
    )
    wait_for(
        lambda: (
            not any(
                h.spec.handle_id.endswith(".c0ffee01") and any(h.spec.block.values())
                for h in ds.list(IPAMHandle)
            )
        ),
        what="address released",
    )
    assert agent_node.cni("DEL", "c0ffee01", pod_ns)[0] == 0  # idempotent


def test_a_failed_add_is_reported_to_the_pod_owner_as_an_event(agent_node: AgentNode) -> None:
    ds = agent_node.datastore
    create_pod(ds, "default", "starved", agent_node.node.name)
    for pool in ds.list(IPPool):
        pool.spec.disabled = True  # no pool may serve: ADD must fail, and say so
        ds.update(pool)
    pod_ns = _pod_ns(agent_node, "starved")
    answers: list[tuple[int, dict[str, object]]] = []

    def refused_for_want_of_a_pool() -> bool:
        """One ADD. Until the agent's pool cache shows every pool disabled it may still
        succeed (then it is undone), and the ADD after that DEL may be told to try again
        while the DEL's deferred teardown runs (code 11 naming the interface): both are
        passing states, so each attempt is judged, not only the first failure."""
        code, answer = agent_node.cni("ADD", "5ad0001", pod_ns, pod=("default", "starved"))
        answers.append((code, answer))
        if code == 0:
            agent_node.cni("DEL", "5ad0001", pod_ns, pod=("default", "starved"))
        return code != 0 and answer.get("code") == 11 and "pool" in str(answer.get("msg"))

    refused = settles(refused_for_want_of_a_pool, timeout=60, interval=0.3)
    assert refused, f"no ADD refused for want of a pool; the last answers: {answers[-5:]}"

    def events() -> list[dict[str, object]]:
        items, _ = ds.list_raw(kinds.EVENT, "default")
        return [e for e in items if e["involvedObject"]["name"] == "starved"]

    wait_for(lambda: bool(events()), timeout=30, what="an Event on the starved pod")
    event = next(e for e in events() if "no IP pool can serve" in str(e["message"]))
    assert event["reason"] == "FailedCreatePodNetwork" and event["type"] == "Warning"
    assert "no IP pool can serve" in str(event["message"])
    assert "cali" not in netns.ip(agent_node.node.netns, "link", "show")  # nothing half-wired
