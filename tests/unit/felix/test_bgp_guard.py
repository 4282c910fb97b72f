"""Pods never reach any node's BGP port (issue 40 probe 3): the rendered rules and set.

Before, only the pod's own node's 179 was dropped (cali-wl-to-host); a pod's connect
to another node's 179 completed the handshake with that node's ExaBGP.
"""

from __future__ import annotations

from typing import Any

import pytest

from felix.agent import parse_args
from felix.bgp_guard import ALL_HOSTS_SET, node_addresses, parse_pod_to_node_bgp
from felix.policy_dataplane import (
    FORWARD,
    FROM_DISPATCH,
    TO_DISPATCH,
    WL_TO_HOST,
    BGPGuard,
    FilterState,
    fixed_state,
)

OTHER_NODES_DROP = ("-i", "cali+", "-p", "tcp", "--dport", "179",
                    "-m", "set", "--match-set", ALL_HOSTS_SET, "dst",
                    "-m", "comment", "--comment", "a node's BGP port", "-j", "DROP")  # fmt: skip
OWN_NODE_DROP = ("-p", "tcp", "--dport", "179", "-m", "comment", "--comment",
                 "the node's BGP port", "-j", "DROP")  # fmt: skip
HOSTS = frozenset({"172.31.0.11", "172.31.0.12"})


def _args(state: FilterState, chain: str) -> list[tuple[str, ...]]:
    return [r.args for r in state.chains[chain]]


def test_by_default_forward_drops_bgp_to_every_node_before_any_policy() -> None:
    state = fixed_state(["caliaaaa"], "ACCEPT", "ACCEPT", BGPGuard(hosts=HOSTS))
    forward = _args(state, FORWARD)
    assert forward[1] == OTHER_NODES_DROP  # after clearing the mark, before the dispatch
    assert forward[2:] == [("-i", "cali+", "-j", FROM_DISPATCH), ("-o", "cali+", "-j", TO_DISPATCH)]
    assert state.ipsets[ALL_HOSTS_SET] == ("hash:ip", HOSTS)
    assert OWN_NODE_DROP in _args(state, WL_TO_HOST)  # the own node, whatever its address


@pytest.mark.parametrize("allow", ["ACCEPT", "RETURN"])
def test_the_guard_holds_whatever_the_allow_action(allow: Any) -> None:
    state = fixed_state([], "DROP", allow, BGPGuard(hosts=HOSTS))
    assert OTHER_NODES_DROP in _args(state, FORWARD)
    assert OWN_NODE_DROP in _args(state, WL_TO_HOST)


def test_allow_removes_both_rules_and_the_set() -> None:
    state = fixed_state(["caliaaaa"], "ACCEPT", "ACCEPT", BGPGuard("ALLOW", HOSTS))
    assert not any("179" in rule for rule in _args(state, FORWARD) + _args(state, WL_TO_HOST))
    assert ALL_HOSTS_SET not in state.ipsets


def _node(addresses: list[dict[str, str]], annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "n", "annotations": annotations},
        "status": {"addresses": addresses},
    }


def test_node_addresses_are_every_dialable_address_of_every_node() -> None:
    nodes = [
        _node(
            [
                {"type": "InternalIP", "address": "172.31.0.11"},
                {"type": "ExternalIP", "address": "203.0.113.7"},
                {"type": "Hostname", "address": "node-1"},
                {"type": "InternalIP", "address": "fd00::11"},  # v6: not in an inet set
            ],
            {
                "tabby.dev/ipv4-address": "10.0.0.11/24",
                "tabby.dev/ipv4-vxlan-tunnel-addr": "10.244.1.0",
                "tabby.dev/ipv4-ipip-tunnel-addr": "10.244.1.1",
                "other.dev/address": "192.0.2.1",
            },
        ),
        _node([{"type": "InternalIP", "address": "172.31.0.12"}], {}),
        {"metadata": {"name": "bare"}},
        _node([{"type": "InternalIP", "address": "not-an-ip"}], {"tabby.dev/ipv4-address": "x"}),
    ]
    assert node_addresses(nodes) == {
        "172.31.0.11",
        "203.0.113.7",
        "10.0.0.11",
        "10.244.1.0",
        "10.244.1.1",
        "172.31.0.12",
    }


def test_the_switch_parses_any_case_and_refuses_anything_else(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse_pod_to_node_bgp(" allow ") == "ALLOW"
    assert parse_pod_to_node_bgp("Drop") == "DROP"
    with pytest.raises(ValueError, match=r"Drop .* or Allow .* not 'off'"):
        parse_pod_to_node_bgp("off")
    base = ["--node-name", "n", "--kubeconfig", "k"]
    monkeypatch.delenv("TABBY_POD_TO_NODE_BGP", raising=False)
    assert parse_args(base).pod_to_node_bgp == "DROP"
    monkeypatch.setenv("TABBY_POD_TO_NODE_BGP", "Allow")
    assert parse_args(base).pod_to_node_bgp == "ALLOW"
    monkeypatch.setenv("TABBY_POD_TO_NODE_BGP", "open")
    with pytest.raises(SystemExit):
        parse_args(base)
    assert "pod-to-node BGP must be Drop" in capsys.readouterr().err


def test_node_addresses_are_parsed_again_only_when_a_node_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from felix import bgp_guard

    parsed: list[int] = []
    real = bgp_guard.node_addresses
    monkeypatch.setattr(bgp_guard, "node_addresses", lambda nodes: parsed.append(1) or real(nodes))
    cache = bgp_guard.NodeAddresses()
    node = _node([{"type": "InternalIP", "address": "172.31.0.11"}], {})
    node["metadata"]["resourceVersion"] = "1"
    assert cache([node]) == {"172.31.0.11"}
    assert cache([node]) == {"172.31.0.11"} and len(parsed) == 1  # the same version: cached
    changed = _node([{"type": "InternalIP", "address": "172.31.0.12"}], {})
    changed["metadata"]["resourceVersion"] = "2"
    assert cache([changed]) == {"172.31.0.12"} and len(parsed) == 2
    assert cache([]) == frozenset() and len(parsed) == 3  # a node gone
