"""Who peers with whom, and the ExaBGP config text (pure)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from bgp import annotations as ann
from bgp.config import (
    GLOBAL,
    MESH,
    NODE_SPECIFIC,
    ROUTE_REFLECTOR,
    BGPPlan,
    DesiredPeer,
    RenderOptions,
    compute_plan,
    parse_peer_ip,
    render_exabgp_config,
)
from bgp.nodes import NodeFactsError, node_facts, parse_nodes
from datastore.models import BGPConfiguration, BGPPeer

A = ipaddress.IPv4Address
HELPER = ["/usr/bin/python3", "/opt/tabby/bgp/api_helper.py", "/run/tabby/n1/api.sock"]


def node(name: str, address: str, labels: dict[str, str] | None = None, **extra: str) -> dict:
    annotations = {ann.IPV4_ADDRESS: address, **{getattr(ann, k): v for k, v in extra.items()}}
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations}}


def config(**spec: Any) -> BGPConfiguration:
    return BGPConfiguration.model_validate({"metadata": {"name": "default"}, "spec": spec})


def peer(name: str, **spec: Any) -> BGPPeer:
    return BGPPeer.model_validate({"metadata": {"name": name}, "spec": spec})


def plan_for(me: str, nodes: list[dict], peers: list[BGPPeer] | None = None, **cfg: Any) -> BGPPlan:
    plan = compute_plan(config(**cfg), nodes, peers or [], me)
    assert plan is not None
    return plan


def summary(plan: BGPPlan) -> list[tuple[str, int, str, bool, bool]]:
    return [(str(p.address), p.as_number, p.peer_type, p.passive, p.rr_client) for p in plan.peers]


NODES = [
    node("n3", "10.0.0.3/24"),
    node("n1", "10.0.0.1/24"),
    node("n2", "10.0.0.2/24"),
]


def test_full_mesh_by_default_lower_address_is_passive() -> None:
    plan = plan_for("n2", NODES)
    assert plan.local.router_id == A("10.0.0.2")
    assert plan.local.as_number == 64512
    assert summary(plan) == [
        ("10.0.0.1", 64512, MESH, False, False),  # n2 > n1: n2 dials
        ("10.0.0.3", 64512, MESH, True, False),  # n3 > n2: n2 waits
    ]
    assert [p.node for p in plan.peers] == ["n1", "n3"]


def test_mesh_disabled_gives_no_peers() -> None:
    assert plan_for("n1", NODES, node_to_node_mesh_enabled=False).peers == ()


def test_node_without_address_has_no_plan_and_is_not_a_peer() -> None:
    nodes = [*NODES, {"metadata": {"name": "n9", "annotations": {}}}]
    assert compute_plan(config(), nodes, [], "n9") is None
    assert [p.node for p in plan_for("n1", nodes).peers] == ["n2", "n3"]


def test_bad_annotations_skip_that_node_only() -> None:
    nodes = [*NODES, node("bad", "10.0.0.9"), node("bad2", "10.0.0.10/24", AS_NUMBER="x")]
    assert [p.node for p in plan_for("n1", nodes).peers] == ["n2", "n3"]
    with pytest.raises(NodeFactsError, match="prefix length"):
        node_facts(node("bad", "10.0.0.9"))
    with pytest.raises(NodeFactsError, match="dotted quad"):
        node_facts(node("rr", "10.0.0.9/24", RR_CLUSTER_ID="cluster-a"))


def test_per_node_as_number() -> None:
    nodes = [node("n1", "10.0.0.1/24", AS_NUMBER="64601"), node("n2", "10.0.0.2/24")]
    plan1 = plan_for("n1", nodes, as_number=64500)
    assert plan1.local.as_number == 64601
    assert summary(plan1) == [("10.0.0.2", 64500, MESH, True, False)]
    assert plan_for("n2", nodes, as_number=64500).peers[0].as_number == 64601


def test_route_reflectors_replace_the_mesh() -> None:
    nodes = [
        node("rr1", "10.0.0.10/24", RR_CLUSTER_ID="244.0.0.1"),
        node("rr2", "10.0.0.11/24", RR_CLUSTER_ID="244.0.0.1"),
        node("rr3", "10.0.0.12/24", RR_CLUSTER_ID="244.0.0.2"),
        *NODES,
    ]
    client = plan_for("n1", nodes)
    assert [(str(p.address), p.peer_type, p.rr_client) for p in client.peers] == [
        ("10.0.0.10", ROUTE_REFLECTOR, False),
        ("10.0.0.11", ROUTE_REFLECTOR, False),
        ("10.0.0.12", ROUTE_REFLECTOR, False),
    ]
    reflector = plan_for("rr1", nodes)
    assert reflector.local.rr_cluster_id == "244.0.0.1"
    assert [(str(p.address), p.rr_client) for p in reflector.peers] == [
        ("10.0.0.1", True),
        ("10.0.0.2", True),
        ("10.0.0.3", True),
        ("10.0.0.11", False),  # same cluster: a non-client
        ("10.0.0.12", True),  # another cluster: a client, as Calico's template does
    ]
    assert all(p.peer_type == ROUTE_REFLECTOR for p in reflector.peers)


def test_rr_client_only_over_ibgp() -> None:
    nodes = [
        node("rr", "10.0.0.10/24", RR_CLUSTER_ID="244.0.0.1"),
        node("n1", "10.0.0.1/24", AS_NUMBER="64999"),
    ]
    assert summary(plan_for("rr", nodes)) == [("10.0.0.1", 64999, ROUTE_REFLECTOR, False, False)]


def test_global_and_node_specific_peers() -> None:
    peers = [
        peer("tor", peer_ip="10.0.0.254", as_number=64513),
        peer("only-n1", node="n1", peer_ip="192.168.5.5:1179", as_number=65000),
        peer("zone-a", node_selector="zone == 'a'", peer_ip="192.168.6.6", as_number=65001),
    ]
    nodes = [node("n1", "10.0.0.1/24", {"zone": "a"}), node("n2", "10.0.0.2/24", {"zone": "b"})]
    plan1 = plan_for("n1", nodes, peers)
    assert [(str(p.address), p.as_number, p.peer_type, p.port) for p in plan1.peers] == [
        ("10.0.0.2", 64512, MESH, 179),
        ("10.0.0.254", 64513, GLOBAL, 179),
        ("192.168.5.5", 65000, NODE_SPECIFIC, 1179),
        ("192.168.6.6", 65001, NODE_SPECIFIC, 179),
    ]
    assert not any(p.passive for p in plan1.peers if p.node is None)  # externals are dialled
    plan2 = plan_for("n2", nodes, peers)
    assert [str(p.address) for p in plan2.peers] == ["10.0.0.1", "10.0.0.254"]


def test_peer_selector_uses_each_nodes_as_and_explicit_wins_over_mesh() -> None:
    nodes = [
        node("n1", "10.0.0.1/24", {"rr": "true"}),
        node("n2", "10.0.0.2/24", AS_NUMBER="64700"),
        node("n3", "10.0.0.3/24"),
    ]
    peers = [
        peer("to-rr", node_selector="!has(rr)", peer_selector="has(rr)"),
        peer("from-rr", node_selector="has(rr)", peer_selector="!has(rr)", as_number=1),
    ]
    plan = plan_for("n1", nodes, peers, node_to_node_mesh_enabled=True)
    assert summary(plan) == [
        ("10.0.0.2", 64700, NODE_SPECIFIC, True, False),
        ("10.0.0.3", 64512, NODE_SPECIFIC, True, False),
    ]
    assert plan.problems == (
        "bgppeer/from-rr: asNumber is ignored with peerSelector (each node's AS is used)",
    )
    assert summary(plan_for("n3", nodes, peers)) == [
        ("10.0.0.1", 64512, NODE_SPECIFIC, False, False),
        ("10.0.0.2", 64700, MESH, False, False),  # n3 > n2: n3 dials
    ]


def test_bad_bgppeers_are_reported_not_fatal() -> None:
    peers = [
        peer("no-as", peer_ip="192.168.1.1"),
        peer("both", peer_ip="192.168.1.2", peer_selector="all()", as_number=1),
        peer("v6", peer_ip="fd00::1", as_number=1),
        peer("bad-sel", node_selector="zone ==", peer_ip="192.168.1.3", as_number=1),
        peer("nothing", as_number=1),
        peer("good", peer_ip="192.168.1.4", as_number=65000),
    ]
    plan = plan_for("n1", NODES, peers)
    assert [str(p.address) for p in plan.peers] == ["10.0.0.2", "10.0.0.3", "192.168.1.4"]
    names = sorted(problem.split(":")[0] for problem in plan.problems)
    assert names == [
        "bgppeer/bad-sel",
        "bgppeer/both",
        "bgppeer/no-as",
        "bgppeer/nothing",
        "bgppeer/v6",
    ]


def test_global_peer_naming_this_node_or_another_node() -> None:
    peers = [peer("self", peer_ip="10.0.0.1", as_number=64512), peer("n3", peer_ip="10.0.0.3")]
    plan = plan_for("n1", NODES, peers, node_to_node_mesh_enabled=False)
    assert summary(plan) == [("10.0.0.3", 64512, GLOBAL, True, False)]
    assert plan.peers[0].node == "n3"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("10.1.1.1", ("10.1.1.1", 179)), ("10.1.1.1:1790", ("10.1.1.1", 1790))],
)
def test_parse_peer_ip(raw: str, expected: tuple[str, int]) -> None:
    address, port = parse_peer_ip(raw)
    assert (str(address), port) == expected


# the same forms the BGPPeer CRD refuses (tests/integration/bgp/test_bgppeer_peer_ip.py)
@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("10.1.1", "is not an IPv4 address"),
        (" 10.1.1.1:1790 ", "is not an IPv4 address"),
        ("host.example:179", "is not an IPv4 address"),
        ("10.1.1.1:0", "not a number from 1 to 65535"),
        ("10.1.1.1:65536", "not a number from 1 to 65535"),
        ("10.1.1.1:x", "not a number from 1 to 65535"),
        ("10.1.1.1:", "not a number from 1 to 65535"),
        ("10.1.1.1:\u00b2", "not a number from 1 to 65535"),
        ("fd00::1", "IPv6 peers are not supported"),
        ("[fd00::1]:179", "IPv6 peers are not supported"),
    ],
)
def test_parse_peer_ip_rejects_with_a_clear_message(raw: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_peer_ip(raw)


def test_a_bad_peer_ip_is_that_peers_problem_only() -> None:
    peers = [
        peer("typo", peer_ip="10.0.0.300:179", as_number=65000),
        peer("good", peer_ip="192.168.1.4:1179", as_number=65000),
    ]
    plan = plan_for("n1", NODES, peers)
    assert ("192.168.1.4", 1179) in [(str(p.address), p.port) for p in plan.peers]
    [problem] = plan.problems
    assert problem.startswith("bgppeer/typo: peerIP '10.0.0.300:179'"), problem


EXPECTED = """\
# Generated by Tabby for node n2. Do not edit: rewritten on change.
process tabby-api {
    run /usr/bin/python3 /opt/tabby/bgp/api_helper.py /run/tabby/n1/api.sock;
    encoder json;
}

template {
    neighbor tabby-peer {
        router-id 10.0.0.2;
        local-address 10.0.0.2;
        local-as 64512;
        hold-time 30;
        listen 179;
        family {
            ipv4 unicast;
        }
        capability {
            route-refresh;
            graceful-restart 120;
        }
        manual-eor true;
        api {
            processes [ tabby-api ];
            receive {
                parsed;
                update;
                open;
            }
            neighbor-changes;
        }
    }
}

neighbor 10.0.0.1 {
    inherit tabby-peer;
    description "node-to-node mesh n1";
    peer-as 64512;
}

neighbor 10.0.0.3 {
    inherit tabby-peer;
    description "node-to-node mesh n3";
    peer-as 64512;
    passive true;
}

neighbor 192.168.5.5 {
    inherit tabby-peer;
    description "global";
    peer-as 65000;
    connect 1179;
}
"""


def test_render_matches_golden_text_and_is_deterministic() -> None:
    peers = [peer("x", peer_ip="192.168.5.5:1179", as_number=65000)]
    text = render_exabgp_config(plan_for("n2", NODES, peers), HELPER)
    assert text == EXPECTED
    shuffled = plan_for("n2", list(reversed(NODES)), peers)
    assert render_exabgp_config(shuffled, HELPER) == text


def test_render_options_and_rr_client_label() -> None:
    nodes = [node("rr", "10.0.0.10/24", RR_CLUSTER_ID="244.0.0.1"), *NODES]
    text = render_exabgp_config(
        plan_for("rr", nodes, listen_port=1790),
        HELPER,
        RenderOptions(hold_time=9, graceful_restart=None, route_refresh=False),
    )
    assert "capability" not in text
    assert "hold-time 9;" in text
    assert "listen 1790;" in text
    assert 'description "route reflector n1 rr-client";' in text


@pytest.mark.parametrize(
    "argv", [[], ["python3", "x"], ["/bin/p", "a b"], ["/bin/p", "x;y"], ["/bin/p", ""]]
)
def test_render_refuses_helper_argv_exabgp_would_mangle(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        render_exabgp_config(plan_for("n1", NODES), argv)


def test_plan_lookup_and_parse_nodes() -> None:
    plan = plan_for("n1", NODES)
    found = plan.peer("10.0.0.3")
    assert isinstance(found, DesiredPeer)
    assert found.node == "n3"
    assert plan.peer("10.9.9.9") is None
    assert sorted(parse_nodes(NODES)) == ["n1", "n2", "n3"]
