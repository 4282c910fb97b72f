"""GoBGP (Debian's gobgpd) as an external eBGP peer of two Tabby nodes.

GoBGP runs in a lab namespace of its own (never the host's), with its gRPC API on
that namespace's loopback; the `gobgp` CLI is run inside the same namespace.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from datastore.models import BGPPeer
from tests.helpers import wait_for
from tests.integration.bgp.bgp_netns import Lab, daemon, stop_daemon
from tests.integration.bgp.test_bgp_exabgp import Agent, node, start_agent

pytestmark = pytest.mark.integration

GOBGP_AS = 64514
GOBGP_IP = "10.99.0.6"
API = "127.0.0.1:50051"

GOBGP_CONF = f"""\
[global.config]
  as = {GOBGP_AS}
  router-id = "{GOBGP_IP}"
  local-address-list = ["{GOBGP_IP}"]
{{neighbors}}"""

NEIGHBOR = """
[[neighbors]]
  [neighbors.config]
    neighbor-address = "{address}"
    peer-as = 64512
  [neighbors.timers.config]
    hold-time = 30
    keepalive-interval = 10
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "ipv4-unicast"
"""


def gobgp(ns: str, *args: str) -> str:
    """The `gobgp` CLI inside GoBGP's namespace, talking to its API on loopback."""
    host, port = API.split(":")
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "gobgp", "-u", host, "-p", port, *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout


def gobgp_rib(ns: str) -> dict[str, list[str]]:
    """`gobgp -j global rib`: prefix -> next hops of its paths."""
    try:
        raw: dict[str, list[dict[str, Any]]] = json.loads(gobgp(ns, "-j", "global", "rib") or "{}")
    except (subprocess.CalledProcessError, ValueError):
        return {}  # the API is not up yet
    return {prefix: [_next_hop(path) for path in paths] for prefix, paths in raw.items()}


def _next_hop(path: dict[str, Any]) -> str:
    for attr in path.get("attrs") or []:
        if "nexthop" in attr:
            return str(attr["nexthop"])
    return ""


def gobgp_established(ns: str, address: str) -> bool:
    try:
        neighbor = json.loads(gobgp(ns, "-j", "neighbor", address))
    except (subprocess.CalledProcessError, ValueError):
        return False  # the API is not up yet (or answered nothing)
    state = (neighbor.get("state") or {}).get("session_state")
    return state in (6, "established", "ESTABLISHED")


def gobgp_beside_two_nodes(lab: Lab, tmp_path: Path, neighbor: str) -> tuple[str, list[str]]:
    """Nodes a (.1) and b (.2) and GoBGP's namespace (.6) with *neighbor* (a template
    of `address`) for each node: GoBGP's namespace and its command line."""
    if shutil.which("gobgpd") is None or shutil.which("gobgp") is None:
        pytest.skip("gobgpd and gobgp (Debian package gobgpd) are not installed")
    lab.add_node("a", 1)
    lab.add_node("b", 2)
    tor_ns = lab.add_node("tor", 6)
    conf = tmp_path / "gobgpd.toml"
    neighbors = "".join(neighbor.format(address=a) for a in ("10.99.0.1", "10.99.0.2"))
    conf.write_text(GOBGP_CONF.format(neighbors=neighbors))
    return tor_ns, ["gobgpd", "-f", str(conf), "--api-hosts", API, "--pprof-disable", "-p"]


def test_gobgp_as_external_peer(lab: Lab, tmp_path: Path) -> None:
    tor_ns, argv = gobgp_beside_two_nodes(lab, tmp_path, NEIGHBOR)
    with daemon(tor_ns, argv) as proc:
        tor = BGPPeer.model_validate(
            {"metadata": {"name": "tor"}, "spec": {"peerIP": GOBGP_IP, "asNumber": GOBGP_AS}}
        )
        nodes = [node("a", "10.99.0.1/24"), node("b", "10.99.0.2/24")]
        agents = [
            start_agent(lab, tmp_path, n, nodes=nodes, blocks=[block], peers=[tor])
            for n, block in (("a", "10.244.1.0/26"), ("b", "10.244.2.0/26"))
        ]
        a, b = agents
        wait_for(lambda: gobgp_established(tor_ns, "10.99.0.1"), what="GoBGP session to a")
        wait_for(lambda: gobgp_established(tor_ns, "10.99.0.2"), what="GoBGP session to b")
        # The nodes' own mesh session comes up on its own connect retries, possibly
        # after both sessions to GoBGP: its routes are what the test later checks kept.
        wait_for(
            lambda: (
                "10.244.1.0/26 via 10.99.0.1 proto 81" in b.kernel()
                and "10.244.2.0/26 via 10.99.0.2 proto 81" in a.kernel()
            ),
            timeout=60,
            what="each node's block in the other's kernel over the mesh",
        )

        # GoBGP receives each node's block, with the node as next hop
        wait_for(
            lambda: (
                gobgp_rib(tor_ns).get("10.244.1.0/26") == ["10.99.0.1"]
                and gobgp_rib(tor_ns).get("10.244.2.0/26") == ["10.99.0.2"]
            ),
            what="both blocks in `gobgp global rib`",
        )
        assert "10.244.1.0/26" in gobgp(tor_ns, "global", "rib")

        # a prefix GoBGP announces lands in both kernels with Tabby's BGP protocol
        gobgp(tor_ns, "global", "rib", "add", "172.18.0.0/16")
        for agent in agents:
            wait_for(
                lambda agent=agent: f"172.18.0.0/16 via {GOBGP_IP} proto 81" in agent.kernel(),
                what=f"GoBGP's prefix in {agent.name}'s kernel",
            )
            assert f"172.18.0.0/16 via {GOBGP_IP} dev eth0 proto 81" in lab.routes(agent.ns)
        _assert_mesh_routes_kept(a, b)

        # GoBGP withdraws its prefix, then goes away: nothing of it stays in any kernel
        gobgp(tor_ns, "global", "rib", "del", "172.18.0.0/16")
        for agent in agents:
            wait_for(
                lambda agent=agent: not any("172.18" in r for r in agent.kernel()),
                what=f"withdraw at {agent.name}",
            )
        gobgp(tor_ns, "global", "rib", "add", "172.19.0.0/16")
        wait_for(lambda: f"172.19.0.0/16 via {GOBGP_IP} proto 81" in a.kernel(), what="re-add")
        stop_daemon(proc)
        for agent in agents:
            wait_for(
                lambda agent=agent: not any(GOBGP_IP in r for r in agent.kernel()),
                what=f"dead GoBGP's routes gone at {agent.name}",
            )


def _assert_mesh_routes_kept(a: Agent, b: Agent) -> None:
    """GoBGP's view of the blocks never replaces the nodes' own mesh routes to each other."""
    assert "10.244.1.0/26 via 10.99.0.1 proto 81" in b.kernel()
    assert "10.244.2.0/26 via 10.99.0.2 proto 81" in a.kernel()
    assert not any(str(r.prefix) == "10.244.1.0/26" for r in a.speaker.learned_routes())
