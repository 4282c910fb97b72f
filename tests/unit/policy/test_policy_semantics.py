"""The tricky cases from research/netpol.md, each with a verdict written
from the spec.  ``World.verdict`` also checks that the compiled chains (run by
the simulator) and the independent oracle agree."""

from __future__ import annotations

from typing import Any

from tests.unit.policy.policy_sim import Packet
from tests.unit.policy.policy_world import World, iface_of, np_dict, ns_dict, pod_dict

SERVE = [("serve-80-tcp", 80, "TCP"), ("serve-81-udp", 81, "UDP"), ("serve-81-sctp", 81, "SCTP")]
EXTERNAL = "192.168.7.7"

NAMESPACES = [ns_dict("x", {"team": "a"}), ns_dict("y", {"team": "b"}), ns_dict("z")]
PODS = [
    pod_dict("x", "a", "10.0.1.1", {"pod": "a"}, SERVE),
    pod_dict("x", "b", "10.0.1.2", {"pod": "b"}, SERVE),
    pod_dict("x", "c", "10.0.1.3", {"pod": "c"}, SERVE),
    pod_dict("y", "a", "10.0.2.1", {"pod": "a"}, SERVE),
    pod_dict("y", "b", "10.0.2.2", {"pod": "b"}, SERVE),
    # z/a serves its "serve-80-tcp" on 8080: named ports resolve per pod.
    pod_dict("z", "a", "10.0.3.1", {"pod": "a"}, [("serve-80-tcp", 8080, "TCP")]),
]


def world(*policies: dict[str, Any]) -> World:
    """The standard pods and namespaces with ``policies``."""
    return World(list(policies), PODS, NAMESPACES)


def on_a(spec: dict[str, Any], ns: str = "x", name: str = "p") -> dict[str, Any]:
    """A policy in ``ns`` selecting pod=a."""
    return np_dict(ns, name, {"podSelector": {"matchLabels": {"pod": "a"}}, **spec})


def test_no_policy_allows_everything() -> None:
    w = world()
    assert w.verdict("x/a", "y/b")
    assert w.verdict(EXTERNAL, "x/a", "UDP", 81)
    assert w.verdict("x/a", EXTERNAL, "SCTP", 81)


def test_default_deny_ingress_isolates_only_ingress() -> None:
    w = world(np_dict("x", "deny", {"podSelector": {}, "policyTypes": ["Ingress"]}))
    assert not w.verdict("y/a", "x/a")
    assert not w.verdict("x/b", "x/a")
    assert not w.verdict(EXTERNAL, "x/c")
    assert w.verdict("x/a", "y/a")
    assert w.verdict("x/a", EXTERNAL)
    assert w.verdict("y/a", "y/b")


def test_empty_ingress_list_denies_but_empty_rule_allows() -> None:
    assert not world(on_a({"ingress": []})).verdict("x/b", "x/a")
    assert world(on_a({"ingress": [{}]})).verdict("x/b", "x/a")
    assert world(on_a({"ingress": [{}]})).verdict(EXTERNAL, "x/a", "SCTP", 81)


def test_egress_rules_without_policy_types_isolate_both_directions() -> None:
    w = world(on_a({"egress": [{"to": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}))
    assert w.verdict("x/a", "x/b")
    assert not w.verdict("x/a", "x/c")
    # policyTypes defaulted to [Ingress, Egress]; there are no ingress rules.
    assert not w.verdict("x/b", "x/a")


def test_empty_egress_list_without_policy_types_does_not_isolate_egress() -> None:
    w = world(on_a({"egress": []}))
    assert w.verdict("x/a", "y/b")
    assert not w.verdict("x/b", "x/a")


def test_rules_of_a_type_not_listed_are_ignored() -> None:
    w = world(on_a({"policyTypes": ["Egress"], "ingress": [], "egress": [{}]}))
    assert w.verdict("x/b", "x/a")  # ingress not isolated despite ingress: []
    assert w.verdict("x/a", "z/a", "TCP", 8080)


def test_egress_only_policy_never_restricts_ingress_of_others() -> None:
    w = world(on_a({"policyTypes": ["Egress"]}))
    assert not w.verdict("x/a", "x/b")
    assert not w.verdict("x/a", EXTERNAL)
    assert w.verdict("x/b", "x/a")
    assert w.verdict("y/a", "y/b")


def test_bare_pod_selector_peer_means_own_namespace() -> None:
    w = world(on_a({"ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}))
    assert w.verdict("x/b", "x/a")
    assert not w.verdict("y/b", "x/a")
    assert not w.verdict("x/c", "x/a")


def test_empty_namespace_selector_means_all_pods_but_not_external() -> None:
    w = world(on_a({"ingress": [{"from": [{"namespaceSelector": {}}]}]}))
    assert w.verdict("y/b", "x/a")
    assert w.verdict("z/a", "x/a")
    assert not w.verdict(EXTERNAL, "x/a")


def test_absent_and_empty_from_mean_everyone_including_external() -> None:
    for rule in ({"ports": [{"port": 80}]}, {"from": [], "ports": [{"port": 80}]}):
        w = world(on_a({"ingress": [rule]}))
        assert w.verdict(EXTERNAL, "x/a")
        assert w.verdict("y/b", "x/a")
        assert not w.verdict("y/b", "x/a", "TCP", 81)


def test_selectors_in_one_peer_are_anded_in_two_peers_ored() -> None:
    anded = {
        "namespaceSelector": {"matchLabels": {"team": "b"}},
        "podSelector": {"matchLabels": {"pod": "b"}},
    }
    w = world(on_a({"ingress": [{"from": [anded]}]}))
    assert w.verdict("y/b", "x/a")
    assert not w.verdict("y/a", "x/a")
    assert not w.verdict("x/b", "x/a")
    ored = [
        {"namespaceSelector": {"matchLabels": {"team": "b"}}},
        {"podSelector": {"matchLabels": {"pod": "b"}}},
    ]
    w = world(on_a({"ingress": [{"from": ored}]}))
    assert w.verdict("y/a", "x/a")
    assert w.verdict("x/b", "x/a")
    assert not w.verdict("x/c", "x/a")
    assert not w.verdict("z/a", "x/a")


def test_match_expressions_on_namespace_name_label() -> None:
    sel = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["y"]}
        ]
    }
    w = world(on_a({"ingress": [{"from": [{"namespaceSelector": sel}]}]}))
    assert w.verdict("z/a", "x/a")
    assert w.verdict("x/b", "x/a")
    assert not w.verdict("y/b", "x/a")


def test_ip_block_matches_pod_ips_and_except_carves_out() -> None:
    block = {"cidr": "10.0.1.5/16", "except": ["10.0.1.2/32"]}  # non-canonical cidr
    w = world(on_a({"ingress": [{"from": [{"ipBlock": block}]}]}))
    assert w.verdict("x/c", "x/a")
    assert w.verdict("y/b", "x/a")
    assert not w.verdict("x/b", "x/a")
    assert w.verdict("z/a", "x/a")
    assert not w.verdict(EXTERNAL, "x/a")


def test_excepted_address_can_be_allowed_by_another_rule_or_policy() -> None:
    block = {"cidr": "10.0.0.0/8", "except": ["10.0.1.0/24"]}
    w = world(
        on_a({"ingress": [{"from": [{"ipBlock": block}]}]}, name="p1"),
        on_a({"ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}, name="p2"),
    )
    assert w.verdict("x/b", "x/a")  # excepted by p1, allowed by p2
    assert not w.verdict("x/c", "x/a")
    assert w.verdict("y/a", "x/a")


def test_egress_ip_block_all_with_except() -> None:
    block = {"cidr": "0.0.0.0/0", "except": ["10.0.2.0/24"]}
    w = world(on_a({"policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": block}]}]}))
    assert w.verdict("x/a", EXTERNAL)
    assert w.verdict("x/a", "x/b")
    assert not w.verdict("x/a", "y/b")


def test_ipv6_block_in_ipv4_world_matches_nothing() -> None:
    w = world(on_a({"ingress": [{"from": [{"ipBlock": {"cidr": "fd00::/8"}}]}]}))
    assert not w.verdict("x/b", "x/a")
    assert not w.verdict(EXTERNAL, "x/a")


def test_named_port_ingress_resolves_on_the_server_with_protocol() -> None:
    w = world(on_a({"ingress": [{"ports": [{"port": "serve-80-tcp"}]}]}))
    assert w.verdict("x/b", "x/a", "TCP", 80)
    assert not w.verdict("x/b", "x/a", "TCP", 81)
    # protocol must match too: serve-81-udp is UDP, the rule's default is TCP.
    w = world(on_a({"ingress": [{"ports": [{"port": "serve-81-udp"}]}]}))
    assert not w.verdict("x/b", "x/a", "TCP", 81)
    assert not w.verdict("x/b", "x/a", "UDP", 81)
    w = world(on_a({"ingress": [{"ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}]}))
    assert w.verdict("x/b", "x/a", "UDP", 81)
    assert w.verdict(EXTERNAL, "x/a", "UDP", 81)


def test_named_port_egress_without_peers_resolves_per_destination_pod() -> None:
    w = world(on_a({"policyTypes": ["Egress"], "egress": [{"ports": [{"port": "serve-80-tcp"}]}]}))
    assert w.verdict("x/a", "y/b", "TCP", 80)
    assert w.verdict("x/a", "z/a", "TCP", 8080)
    assert not w.verdict("x/a", "z/a", "TCP", 80)
    assert not w.verdict("x/a", "y/b", "TCP", 8080)
    assert not w.verdict("x/a", EXTERNAL, "TCP", 80)  # no pod, no name


def test_named_port_egress_with_pod_and_ip_block_peers() -> None:
    peers = [{"podSelector": {"matchLabels": {"pod": "b"}}}, {"ipBlock": {"cidr": "10.0.3.0/24"}}]
    w = world(
        on_a(
            {
                "policyTypes": ["Egress"],
                "egress": [{"to": peers, "ports": [{"port": "serve-80-tcp"}]}],
            }
        )
    )
    assert w.verdict("x/a", "x/b", "TCP", 80)
    assert not w.verdict("x/a", "y/b", "TCP", 80)  # pod=b, but in y
    assert w.verdict("x/a", "z/a", "TCP", 8080)  # via the ipBlock
    assert not w.verdict("x/a", "z/a", "TCP", 80)


def test_end_port_range_is_inclusive() -> None:
    w = world(on_a({"ingress": [{"ports": [{"port": 80, "endPort": 81}]}]}))
    assert w.verdict("x/b", "x/a", "TCP", 80)
    assert w.verdict("x/b", "x/a", "TCP", 81)
    assert not w.verdict("x/b", "x/a", "TCP", 82)
    assert not w.verdict("x/b", "x/a", "UDP", 81)


def test_sctp_only_policy_still_isolates_tcp() -> None:
    w = world(on_a({"ingress": [{"ports": [{"protocol": "SCTP", "port": 81}]}]}))
    assert w.verdict("x/b", "x/a", "SCTP", 81)
    assert not w.verdict("x/b", "x/a", "TCP", 81)
    assert not w.verdict("x/b", "x/a", "UDP", 81)


def test_protocol_without_port_allows_every_port_of_it() -> None:
    w = world(on_a({"ingress": [{"ports": [{"protocol": "UDP"}]}]}))
    assert w.verdict("x/b", "x/a", "UDP", 81)
    assert w.verdict("x/b", "x/a", "UDP", 5353)
    assert not w.verdict("x/b", "x/a", "TCP", 80)


def test_policies_are_a_union() -> None:
    w = world(
        on_a({"ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}, name="p1"),
        on_a({"ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "c"}}}]}]}, name="p2"),
        np_dict("x", "deny-all", {"podSelector": {}}),
    )
    assert w.verdict("x/b", "x/a")
    assert w.verdict("x/c", "x/a")
    assert not w.verdict("y/a", "x/a")
    assert not w.verdict("x/a", "x/b")


def test_both_ends_are_evaluated() -> None:
    deny_egress = np_dict("x", "deny-egress", {"podSelector": {}, "policyTypes": ["Egress"]})
    allow_ingress = np_dict("y", "allow", {"podSelector": {}, "ingress": [{}]})
    w = world(deny_egress, allow_ingress)
    assert not w.verdict("x/a", "y/a")
    assert w.verdict("z/a", "y/a")
    deny_ingress = np_dict("y", "deny", {"podSelector": {}})
    allow_egress = np_dict("x", "allow", {"podSelector": {}, "egress": [{}]})
    w = world(deny_ingress, allow_egress)
    assert not w.verdict("x/a", "y/a")
    assert w.verdict("x/a", "z/a")


def test_replies_of_allowed_connections_pass_isolated_directions() -> None:
    w = world(np_dict("x", "deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}))
    assert not w.verdict("x/a", "y/a")
    reply = Packet("10.0.2.1", "10.0.1.1", "tcp", 40000, ctstate="ESTABLISHED")
    assert w.sim.forward(reply, iface_of("y", "a"), iface_of("x", "a"))
    invalid = Packet("10.0.2.1", "10.0.1.1", "tcp", 40000, ctstate="INVALID")
    assert not w.sim.forward(invalid, iface_of("y", "a"), iface_of("z", "a"))


def test_spoofed_source_is_dropped_even_without_policy() -> None:
    w = world()
    honest = Packet("10.0.1.1", "10.0.2.1", "tcp", 80)
    spoofed = Packet("10.0.1.2", "10.0.2.1", "tcp", 80)
    assert w.sim.forward(honest, iface_of("x", "a"), iface_of("y", "a"))
    assert not w.sim.forward(spoofed, iface_of("x", "a"), iface_of("y", "a"))
    spoofed_reply = Packet("10.0.9.9", "10.0.2.1", "tcp", 80, ctstate="ESTABLISHED")
    assert not w.sim.forward(spoofed_reply, iface_of("x", "a"), None)


def test_host_network_pods_are_not_selected_as_peers() -> None:
    host = pod_dict("x", "h", "172.18.0.2", {"pod": "b"}, host_network=True)
    policy = on_a({"ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]})
    w = World([policy], [*PODS, host], NAMESPACES)
    assert not w.verdict("x/h", "x/a")
    assert w.verdict("x/b", "x/a")
    assert all("172.18.0.2" not in m for m in w.state.members.values())


def test_named_port_ingress_with_pod_peer_keeps_both_conditions() -> None:
    peer = {"podSelector": {"matchLabels": {"pod": "b"}}}
    w = world(on_a({"ingress": [{"from": [peer], "ports": [{"port": "serve-80-tcp"}]}]}))
    assert w.verdict("x/b", "x/a", "TCP", 80)
    assert not w.verdict("x/c", "x/a", "TCP", 80)
    assert not w.verdict("y/b", "x/a", "TCP", 80)
    assert not w.verdict("x/b", "x/a", "TCP", 81)


def test_ipv6_family_compiles_ip_blocks_named_ports_and_selectors() -> None:
    pods = [
        pod_dict("x", "a", "fd00::1:1", {"pod": "a"}, SERVE),
        pod_dict("x", "b", "fd00::1:2", {"pod": "b"}),
        pod_dict("y", "b", "fd00::2:2", {"pod": "b"}),
        pod_dict("y", "c", "fd00::2:3", {"pod": "c"}),
    ]
    policy = on_a(
        {
            "ingress": [
                {"from": [{"ipBlock": {"cidr": "fd00::2:0/112", "except": ["fd00::2:3/128"]}}]},
                {
                    "from": [{"podSelector": {}}],
                    "ports": [{"port": "serve-81-udp", "protocol": "UDP"}],
                },
                {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},  # IPv4: matches nothing here
            ]
        }
    )
    w = World([policy], pods, NAMESPACES, family=6)
    assert w.verdict("y/b", "x/a")
    assert not w.verdict("y/c", "x/a")
    assert w.verdict("x/b", "x/a", "UDP", 81)
    assert not w.verdict("x/b", "x/a", "TCP", 80)
    assert not w.verdict("fd00:9::9", "x/a")
    assert w.verdict("x/a", "y/c", "SCTP", 81)  # y/c is not isolated
