"""ClusterNetworkPolicy parsing (policy/cluster_policy.py): the API's shapes become typed
values, the API's fail-closed rule is applied, and every input the CRD's schema would
refuse is refused with the field's path."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from policy.cluster_compiler import parse_node
from policy.cluster_policy import (
    ANY_PEER,
    Action,
    ClusterPolicyRule,
    DomainNames,
    Networks,
    NodeSelection,
    Tier,
    UnknownPeer,
    evaluation_order,
    parse_cluster_policy,
    priority_ties,
)
from policy.errors import PolicyError
from policy.model import PodSelection, PortSpec
from policy.selectors import EVERYTHING, parse_selector


def cnp(name: str = "p", **spec: Any) -> dict[str, Any]:
    body = {"tier": "Admin", "priority": 5, "subject": {"namespaces": {}}} | spec
    return {"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": name}, "spec": body}  # fmt: skip


TEAM_X = {"matchLabels": {"team": "x"}}
AB = {"matchLabels": {"a": "b"}}


def test_subjects_and_peers_become_pod_selections() -> None:
    policy = parse_cluster_policy(
        cnp(
            subject={"pods": {"namespaceSelector": TEAM_X, "podSelector": AB}},
            ingress=[{"name": "from-x", "action": "Deny", "from": [{"namespaces": TEAM_X},
                      {"pods": {"podSelector": {}}}]}],
        )
    )  # fmt: skip
    x = parse_selector(TEAM_X, "")
    assert policy.subject == PodSelection(None, x, parse_selector(AB, ""))
    [rule] = policy.ingress
    every_pod = PodSelection(None, EVERYTHING, EVERYTHING)
    assert rule == ClusterPolicyRule(Action.DENY, (PodSelection(None, x), every_pod), (), "from-x")
    assert (policy.tier, policy.priority, policy.egress) == (Tier.ADMIN, 5, ())


def test_egress_peers_and_protocols() -> None:
    policy = parse_cluster_policy(
        cnp(egress=[
            {"action": "Accept", "to": [{"nodes": {}}, {"networks": ["10.0.0.0/8", "fd00::/8"]}],
             "protocols": [{"tcp": {"destinationPort": {"number": 443}}},
                           {"udp": {"destinationPort": {"range": {"start": 50, "end": 60}}}}]},
            {"action": "Pass", "to": [{"namespaces": {}}],
             "protocols": [{"destinationNamedPort": "http"}]},
        ])
    )  # fmt: skip
    first, second = policy.egress
    assert first.peers == (
        NodeSelection(EVERYTHING),
        Networks((ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"))),
    )
    assert first.ports == (PortSpec("TCP", 443), PortSpec("UDP", 50, 60))
    # A named port has no protocol of its own: the container port's decides.
    assert second.ports == tuple(PortSpec(p, "http") for p in ("TCP", "UDP", "SCTP"))


def test_an_unknown_peer_fails_closed() -> None:
    future = {"serviceAccounts": {"names": ["x"]}}  # or an egress-only kind on ingress
    policy = parse_cluster_policy(
        cnp(ingress=[{"action": "Accept", "from": [future]}, {"action": "Pass", "from": [future]}])
    )
    accept, passing = policy.ingress
    assert accept.peers == (UnknownPeer(("serviceAccounts",)),)
    assert accept.effective() is None  # matches nothing
    assert passing.effective() == ClusterPolicyRule(Action.DENY, (ANY_PEER,), ())
    assert policy.egress == ()


def test_domain_names_parse_and_known_rules_are_their_own_effect() -> None:
    policy = parse_cluster_policy(
        cnp(egress=[{"action": "Accept", "to": [{"domainNames": ["*.example.com"]}]}])
    )
    [rule] = policy.egress
    assert rule.peers == (DomainNames(("*.example.com",)),)
    assert rule.effective() is rule


def test_order_and_ties() -> None:
    parsed = [
        parse_cluster_policy(cnp(name, tier=tier, priority=prio))
        for name, tier, prio in [("b", "Admin", 5), ("z", "Baseline", 0), ("a", "Admin", 5),
                                 ("c", "Admin", 1)]
    ]  # fmt: skip
    assert [p.name for p in evaluation_order(parsed)] == ["c", "a", "b", "z"]
    assert priority_ties(parsed) == {(Tier.ADMIN, 5): ["a", "b"]}


INVALID: list[tuple[str, Any, str]] = [
    ("no spec", {"metadata": {"name": "p"}}, "spec"),
    ("tier", cnp(tier="Middle"), "spec.tier"),
    ("priority above 1000", cnp(priority=1001), "spec.priority"),
    ("priority as text", cnp(priority="5"), "spec.priority"),
    ("priority as bool", cnp(priority=True), "spec.priority"),
    ("two subjects", cnp(subject={"namespaces": {}, "pods": {"podSelector": {}}}), "spec.subject"),
    ("no subject", cnp(subject={}), "spec.subject"),
    ("pods without podSelector", cnp(subject={"pods": {"namespaceSelector": {}}}),
     "spec.subject.pods.podSelector"),
    ("bad selector", cnp(subject={"namespaces": {"matchLabels": {"a": 1}}}),
     "spec.subject.namespaces.matchLabels"),
    ("action", cnp(ingress=[{"action": "Allow", "from": [{"namespaces": {}}]}]),
     "spec.ingress[0].action"),
    ("no peers", cnp(ingress=[{"action": "Deny", "from": []}]), "spec.ingress[0].from"),
    ("26 rules", cnp(ingress=[{"action": "Deny", "from": [{"namespaces": {}}]}] * 26),
     "spec.ingress"),
    ("host bits", cnp(egress=[{"action": "Deny", "to": [{"networks": ["10.0.0.1/8"]}]}]),
     "spec.egress[0].to[0].networks[0]"),
    ("empty protocols", cnp(ingress=[{"action": "Deny", "from": [{"namespaces": {}}],
                                      "protocols": []}]), "spec.ingress[0].protocols"),
    ("empty range", cnp(ingress=[{"action": "Deny", "from": [{"namespaces": {}}], "protocols": [
        {"tcp": {"destinationPort": {"range": {"start": 9, "end": 9}}}}]}]),
     "spec.ingress[0].protocols[0].tcp.destinationPort.range"),
    ("port 0", cnp(ingress=[{"action": "Deny", "from": [{"namespaces": {}}], "protocols": [
        {"udp": {"destinationPort": {"number": 0}}}]}]),
     "spec.ingress[0].protocols[0].udp.destinationPort.number"),
    ("tcp without a port", cnp(ingress=[{"action": "Deny", "from": [{"namespaces": {}}],
                                         "protocols": [{"tcp": {}}]}]),
     "spec.ingress[0].protocols[0].tcp.destinationPort"),
    ("named port towards networks", cnp(egress=[{"action": "Deny", "to": [
        {"networks": ["10.0.0.0/8"]}], "protocols": [{"destinationNamedPort": "http"}]}]),
     "spec.egress[0]"),
    ("rule name over 100", cnp(ingress=[{"name": "n" * 101, "action": "Deny",
                                         "from": [{"namespaces": {}}]}]), "spec.ingress[0].name"),
    ("wrong kind", {**cnp(), "kind": "NetworkPolicy"}, "kind"),
]  # fmt: skip


@pytest.mark.parametrize(("obj", "path"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_input_names_the_field(obj: Any, path: str) -> None:
    with pytest.raises(PolicyError) as refused:
        parse_cluster_policy(obj)
    assert refused.value.path == path, str(refused.value)
    assert str(refused.value).startswith("clusternetworkpolicy p: ") or path == "spec"


def test_a_node_gives_its_labels_and_ip_addresses() -> None:
    node = parse_node({
        "metadata": {"name": "n1", "labels": {"role": "cp"}},
        "status": {"addresses": [{"type": "Hostname", "address": "n1"},
                                 {"type": "InternalIP", "address": "172.31.0.11"},
                                 {"type": "ExternalIP", "address": "fd00::11"}]},
    })  # fmt: skip
    assert node.name == "n1" and node.label_items == (("role", "cp"),)
    assert [str(ip) for ip in node.ips] == ["172.31.0.11", "fd00::11"]
    assert parse_node({"metadata": {"name": "bare"}}).ips == ()


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ({"metadata": {"name": "n", "labels": {"a": 1}}}, "metadata.labels"),
        ({"metadata": {"name": "n"}, "status": {"addresses": "x"}}, "status.addresses"),
        ({"metadata": {"name": "n"}, "status": {"addresses": [{"type": "InternalIP"}]}},
         "status.addresses[0]"),
    ],
)  # fmt: skip
def test_a_bad_node_names_the_field(obj: Any, path: str) -> None:
    with pytest.raises(PolicyError) as refused:
        parse_node(obj)
    assert refused.value.path == path and str(refused.value).startswith("node n: ")
