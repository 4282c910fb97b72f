"""BGP passwords (TCP MD5, issue 40) on real sessions: the node-to-node mesh between
two Tabby nodes (ExaBGP) and an external peer (Debian's gobgpd), each in a namespace
of its own.

The passwords come as the agent gives them to bgp/ (the keys of the Secret
tabby-bgp-passwords, `BGPInputs.passwords`): with the right one the sessions come up,
with a wrong one the kernel drops every segment (counted in TcpExt TCPMD5Failure of
the receiving namespace) and the session stays down, and `tabbyctl node status` says
so; fixed, they come up again.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from bgp.config import BGP_SECRET
from datastore.models import BGPConfiguration, BGPPeer
from tabbyctl.node import md5_counters, status_rows
from tests.helpers import wait_for
from tests.integration.bgp.bgp_netns import Lab, daemon
from tests.integration.bgp.test_bgp_exabgp import Agent, node, start_agent
from tests.integration.bgp.test_bgp_gobgp import (
    GOBGP_AS,
    GOBGP_IP,
    gobgp_beside_two_nodes,
    gobgp_established,
)

pytestmark = pytest.mark.integration

TOR_PASSWORD = "t0r-s3cret"
# test_bgp_gobgp's neighbor with a password and a short connect retry
NEIGHBOR = """
[[neighbors]]
  [neighbors.config]
    neighbor-address = "{address}"
    peer-as = 64512
    auth-password = "{password}"
  [neighbors.timers.config]
    connect-retry = 2
    hold-time = 30
    keepalive-interval = 10
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "ipv4-unicast"
"""
A, B = "10.99.0.1", "10.99.0.2"


def md5_failures(ns: str, tmp: Path) -> int:
    """TCP segments the namespace's kernel dropped for a wrong or missing MD5 signature."""
    text = subprocess.run(
        ["ip", "netns", "exec", ns, "cat", "/proc/net/netstat"],
        capture_output=True, text=True, check=True, timeout=10,
    ).stdout  # fmt: skip
    path = tmp / f"netstat-{ns}"
    path.write_text(text)
    counters = md5_counters(path)
    return counters["TCPMD5Failure"] + counters["TCPMD5NotFound"]


def state(agent: Agent, address: str) -> str:
    for peer in agent.speaker.status_document()["peers"]:
        if peer["address"] == address:
            return str(peer["state"])
    return "absent"


def info(agent: Agent, address: str, tmp: Path) -> str:
    """The INFO column `tabbyctl node status` prints on that node for that peer."""
    doc: dict[str, Any] = agent.speaker.status_document()
    path = tmp / f"netstat-{agent.ns}"
    md5_failures(agent.ns, tmp)  # writes the namespace's counters to path
    rows = status_rows(doc, md5=md5_counters(path))
    return next(row[4] for row in rows if row[0] == address)


def test_passwords_on_the_mesh_and_an_external_peer(lab: Lab, tmp_path: Path) -> None:
    neighbor = NEIGHBOR.replace("{password}", TOR_PASSWORD)
    tor_ns, argv = gobgp_beside_two_nodes(lab, tmp_path, neighbor)
    ref = {"name": BGP_SECRET}
    config = BGPConfiguration.model_validate(
        {
            "metadata": {"name": "default"},
            "spec": {"nodeMeshPassword": {"secretKeyRef": {**ref, "key": "mesh"}}},
        }
    )
    tor = BGPPeer.model_validate(
        {
            "metadata": {"name": "tor"},
            "spec": {
                "peerIP": GOBGP_IP,
                "asNumber": GOBGP_AS,
                "password": {"secretKeyRef": {**ref, "key": "tor"}},
            },
        }
    )
    wrong = {"mesh": "m3sh", "tor": "not-the-tor-password"}
    with daemon(tor_ns, argv):
        nodes = [node("a", f"{A}/24"), node("b", f"{B}/24")]
        a, b = (
            start_agent(
                lab, tmp_path, n, nodes=nodes, blocks=[block], peers=[tor], config=config,
                passwords=wrong,
            )
            for n, block in (("a", "10.244.1.0/26"), ("b", "10.244.2.0/26"))
        )  # fmt: skip
        # The mesh's password matches on both nodes: up, routes carried.
        wait_for(lambda: state(a, B) == state(b, A) == "up", timeout=60, what="mesh up")
        wait_for(lambda: "10.244.2.0/26 via 10.99.0.2 proto 81" in a.kernel(), what="b's block")

        # The external peer's does not: every segment is dropped by the kernels, the
        # sessions stay down, and node status says why.
        wait_for(lambda: md5_failures(tor_ns, tmp_path) >= 4, timeout=60, what="MD5 drops")
        assert not gobgp_established(tor_ns, A) and not gobgp_established(tor_ns, B)
        assert state(a, GOBGP_IP) != "up" and state(b, GOBGP_IP) != "up"
        wait_for(lambda: md5_failures(a.ns, tmp_path) > 0, timeout=60, what="drops at a")
        assert "TCP MD5 password 'tor'" in info(a, GOBGP_IP, tmp_path)
        assert "segments failed the MD5 check" in info(a, GOBGP_IP, tmp_path)

        # The Secret fixed: both sessions to GoBGP come up.
        fixed = {**wrong, "tor": TOR_PASSWORD}
        a.update(passwords=fixed)
        b.update(passwords=fixed)
        for address in (A, B):
            wait_for(
                lambda address=address: gobgp_established(tor_ns, address),
                timeout=60,
                what=f"GoBGP session to {address}",
            )
        wait_for(lambda: state(a, GOBGP_IP) == state(b, GOBGP_IP) == "up", what="tor up")

        # One node's mesh password goes wrong (a Secret rotated on one node only): the
        # mesh session goes down and stays down; rotated there too, it comes back.
        # b dials (the higher address); a, passive, drops b's segments signed with the
        # old key.
        before = md5_failures(a.ns, tmp_path)
        a.update(passwords={**fixed, "mesh": "r0tated"})
        wait_for(lambda: state(a, B) != "up" and state(b, A) != "up", timeout=60, what="down")
        wait_for(lambda: md5_failures(a.ns, tmp_path) > before, timeout=60, what="drops at a")
        assert state(a, B) != "up", "the mesh came up with different passwords"
        b.update(passwords={**fixed, "mesh": "r0tated"})
        wait_for(lambda: state(a, B) == state(b, A) == "up", timeout=90, what="mesh up again")
        assert gobgp_established(tor_ns, A) and gobgp_established(tor_ns, B)
