"""ClusterNetworkPolicy tiers, each verdict written from the API reference
(sigs.k8s.io/network-policy-api v0.3.0, apis/v1beta1), and asked twice: of the
independent oracle and of the compiled chains run by the simulator (World.verdict
fails when they disagree)."""

from __future__ import annotations

from typing import Any

from tests.unit.policy.policy_world import World, np_dict, ns_dict, pod_dict

SERVE = [("http", 80, "TCP"), ("dns", 53, "UDP")]
NAMESPACES = [ns_dict("x", {"team": "a"}), ns_dict("y", {"team": "b"}), ns_dict("mon")]
PODS = {
    "x/a": pod_dict("x", "a", "10.0.1.1", {"pod": "a"}, SERVE),
    "x/b": pod_dict("x", "b", "10.0.1.2", {"pod": "b"}, SERVE),
    "y/a": pod_dict("y", "a", "10.0.2.1", {"pod": "a"}, SERVE),
    "mon/p": pod_dict("mon", "p", "10.0.3.1", {"app": "prom"}),
    "x/host": pod_dict("x", "host", "172.31.0.11", {"pod": "a"}, host_network=True),
}
NODES = [
    {"metadata": {"name": "n1", "labels": {"role": "worker"}},
     "status": {"addresses": [{"type": "InternalIP", "address": "172.31.0.11"},
                              {"type": "Hostname", "address": "n1"}]}},
    {"metadata": {"name": "cp", "labels": {"role": "control-plane"}},
     "status": {"addresses": [{"type": "InternalIP", "address": "172.31.0.2"}]}},
]  # fmt: skip
ALL = {"namespaces": {}}
TEAM_A = {"namespaces": {"matchLabels": {"team": "a"}}}


def cnp(name: str, tier: str, priority: int, **spec: Any) -> dict[str, Any]:
    subject = spec.pop("subject", ALL)
    body = {"tier": tier, "priority": priority, "subject": subject, **spec}
    return {"metadata": {"name": name}, "spec": body}


def rule(action: str, *peers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"action": action, "from": list(peers), **extra}


def egress(action: str, *peers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"action": action, "to": list(peers), **extra}


def allowed(
    src: str,
    dst: str,
    cnps: list[dict[str, Any]],
    nps: list[dict[str, Any]] | None = None,
    proto: str = "TCP",
    port: int = 80,
) -> bool:
    world = World(nps or [], list(PODS.values()), NAMESPACES, cluster_policies=cnps, nodes=NODES)
    return world.verdict(src, dst, proto, port)


DENY_ALL_INGRESS_NP = np_dict("x", "deny", {"podSelector": {}, "policyTypes": ["Ingress"]})
ALLOW_FROM_Y_NP = np_dict("x", "from-y", {"podSelector": {}, "ingress": [
    {"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]})  # fmt: skip


def test_admin_accept_overrides_a_networkpolicy_deny() -> None:
    accept = cnp("scrape", "Admin", 1, ingress=[rule("Accept", {"pods": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}},
        "podSelector": {}}})])  # fmt: skip
    assert not allowed("mon/p", "x/a", [], [DENY_ALL_INGRESS_NP])
    assert allowed("mon/p", "x/a", [accept], [DENY_ALL_INGRESS_NP])
    assert not allowed("y/a", "x/a", [accept], [DENY_ALL_INGRESS_NP])  # not the Accept's peer


def test_admin_deny_beats_a_networkpolicy_allow() -> None:
    deny = cnp("no-y", "Admin", 1, subject=TEAM_A, ingress=[rule("Deny", {"namespaces": {
        "matchLabels": {"team": "b"}}})])  # fmt: skip
    assert allowed("y/a", "x/a", [], [ALLOW_FROM_Y_NP])
    assert not allowed("y/a", "x/a", [deny], [ALLOW_FROM_Y_NP])
    assert allowed("x/b", "x/a", [deny])  # outside the rule's peers: no decision


def test_pass_skips_the_admin_tier_to_networkpolicy() -> None:
    passing = cnp("pass-a", "Admin", 1, ingress=[rule("Pass", TEAM_A)])
    deny_later = cnp("deny-all", "Admin", 2, ingress=[rule("Deny", ALL)])
    assert not allowed("x/b", "x/a", [deny_later])
    assert allowed("x/b", "x/a", [passing, deny_later])  # Pass, then no NP: default allow
    assert not allowed("x/b", "x/a", [passing, deny_later], [DENY_ALL_INGRESS_NP])
    assert not allowed("y/a", "x/a", [passing, deny_later])  # y is not passed


def test_an_admin_pass_reaches_the_baseline_tier() -> None:
    passing = cnp("pass-all", "Admin", 1, ingress=[rule("Pass", ALL)])
    baseline_deny = cnp("tenants", "Baseline", 1, ingress=[rule("Deny", ALL)])
    assert not allowed("y/a", "x/a", [passing, baseline_deny])
    assert allowed("y/a", "x/a", [passing, baseline_deny], [ALLOW_FROM_Y_NP])


def test_priority_orders_policies_and_rule_order_orders_rules() -> None:
    deny = cnp("deny", "Admin", 5, ingress=[rule("Deny", ALL)])
    accept = cnp("accept", "Admin", 6, ingress=[rule("Accept", ALL)])
    assert not allowed("x/b", "x/a", [accept, deny])
    assert allowed("x/b", "x/a", [cnp("accept", "Admin", 4, ingress=[rule("Accept", ALL)]), deny])
    first_wins = cnp("both", "Admin", 1, ingress=[rule("Accept", TEAM_A), rule("Deny", ALL)])
    assert allowed("x/b", "x/a", [first_wins])
    assert not allowed("y/a", "x/a", [first_wins])


def test_baseline_applies_only_where_no_networkpolicy_selects() -> None:
    baseline_deny = cnp("tenants", "Baseline", 1, ingress=[rule("Deny", ALL)])
    assert not allowed("y/a", "x/a", [baseline_deny])
    assert allowed("y/a", "x/a", [baseline_deny], [ALLOW_FROM_Y_NP])  # NP allow overrides
    assert not allowed("x/b", "x/a", [baseline_deny], [ALLOW_FROM_Y_NP])  # NP decides: deny
    baseline_accept = cnp("open", "Baseline", 1, ingress=[rule("Accept", ALL)])
    assert not allowed("x/b", "x/a", [baseline_accept], [ALLOW_FROM_Y_NP])
    baseline_pass = cnp("pass", "Baseline", 1, ingress=[rule("Pass", ALL)])
    assert allowed("y/a", "x/a", [baseline_pass, cnp("deny", "Baseline", 2, ingress=[
        rule("Deny", ALL)])])  # fmt: skip


def test_egress_accept_still_needs_the_destinations_ingress() -> None:
    out = cnp("out", "Admin", 1, egress=[egress("Accept", ALL)])
    assert allowed("x/a", "x/b", [out])
    assert not allowed("x/b", "x/a", [out], [DENY_ALL_INGRESS_NP])


def test_networks_cover_pods_and_the_outside() -> None:
    deny = cnp("no-10", "Admin", 1, egress=[egress("Deny", {"networks": ["10.0.2.0/24"]})])
    assert not allowed("x/a", "y/a", [deny])
    assert allowed("x/a", "x/b", [deny])
    assert allowed("x/a", "192.168.7.7", [deny])
    world = cnp("no-out", "Admin", 1, egress=[egress("Deny", {"networks": ["0.0.0.0/0"]})])
    assert not allowed("x/a", "192.168.7.7", [world])
    assert not allowed("x/a", "x/b", [world])


def test_nodes_peers_match_node_addresses() -> None:
    deny_cp = cnp("no-cp", "Admin", 1, egress=[egress("Deny", {"nodes": {
        "matchLabels": {"role": "control-plane"}}})])  # fmt: skip
    assert not allowed("x/a", "172.31.0.2", [deny_cp])
    assert allowed("x/a", "172.31.0.11", [deny_cp])
    all_nodes = cnp("no-nodes", "Admin", 1, egress=[egress("Deny", {"nodes": {}})])
    assert not allowed("x/a", "172.31.0.11", [all_nodes])
    assert allowed("x/a", "192.168.7.7", [all_nodes])


def test_host_network_pods_are_neither_subjects_nor_pod_peers() -> None:
    deny = cnp("deny", "Admin", 1, ingress=[rule("Deny", ALL)])
    assert allowed("x/a", "x/host", [deny])  # not a subject
    assert allowed("x/host", "y/a", [cnp("d", "Admin", 1, ingress=[rule("Deny", TEAM_A)])])


def test_protocols_numbers_ranges_and_named_ports() -> None:
    web = cnp("web", "Admin", 1, ingress=[rule("Deny", ALL, protocols=[
        {"tcp": {"destinationPort": {"number": 80}}},
        {"udp": {"destinationPort": {"range": {"start": 50, "end": 60}}}}])])  # fmt: skip
    assert not allowed("x/b", "x/a", [web], proto="TCP", port=80)
    assert allowed("x/b", "x/a", [web], proto="TCP", port=81)
    assert not allowed("x/b", "x/a", [web], proto="UDP", port=53)
    for edge in (50, 60):  # a range includes both ends
        assert not allowed("x/b", "x/a", [web], proto="UDP", port=edge)
    assert allowed("x/b", "x/a", [web], proto="UDP", port=61)
    assert allowed("x/b", "x/a", [web], proto="UDP", port=80)
    named = cnp("named", "Admin", 1, ingress=[rule("Deny", ALL, protocols=[
        {"destinationNamedPort": "dns"}])])  # fmt: skip
    assert not allowed("x/b", "x/a", [named], proto="UDP", port=53)
    assert allowed("x/b", "x/a", [named], proto="TCP", port=53)  # dns is a UDP port
    assert allowed("x/b", "x/a", [named], proto="TCP", port=80)


def test_unknown_peers_fail_closed() -> None:
    future = {"serviceAccounts": {"names": ["x"]}}
    accept = cnp("a", "Admin", 1, ingress=[rule("Accept", future)])
    assert not allowed("x/b", "x/a", [accept], [DENY_ALL_INGRESS_NP])  # matches nothing
    for action in ("Deny", "Pass"):
        assert not allowed("y/a", "x/a", [cnp("d", "Admin", 1, ingress=[rule(action, future)])])


def test_domain_names_match_nothing() -> None:
    by_name = egress("Accept", {"domainNames": ["example.com"]})
    names = cnp("dns", "Admin", 1, egress=[by_name, egress("Deny", {"networks": ["0.0.0.0/0"]})])
    assert not allowed("x/a", "192.168.7.7", [names])
