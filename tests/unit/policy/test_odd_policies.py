"""Issue 20, bad input: NetworkPolicies the apiserver accepts but that are odd.

Empty selectors everywhere, every port of every protocol, an ipBlock of the whole
address space with 256 holes, 500 rules, one rule with 200 peers, a matchExpressions
list of 500 values, and all of them at once. Each compiles (ipset names within the
kernel's 31 characters, chains no longer than their rules need), and for every pod pair
on several ports the compiled chains, the independent oracle and ``tabbyctl policy
explain``'s verdict agree (``World.verdict``). The apiserver's acceptance of each is
checked against the real one in tests/integration/datastore/test_object_corpus.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from policy import NetSet
from tests.unit.policy.policy_world import World, np_dict, ns_dict, pod_dict

NAMESPACES = [ns_dict("a", {"team": "red"}), ns_dict("b", {"team": "blue"})]
PODS = [
    pod_dict("a", "web", "10.0.1.2", {"app": "web", "i": "7"}, [("http", 8080, "TCP")]),
    pod_dict("a", "db", "10.0.1.3", {"app": "db"}),
    pod_dict("b", "client", "10.0.2.2", {"app": "client", "i": "499"}),
    pod_dict("b", "job", "10.0.2.3", {}),
]
PAIRS = [(s["metadata"], d["metadata"]) for s in PODS for d in PODS if s is not d]
PROTOCOLS = ("TCP", "UDP", "SCTP")
PROBES = [("TCP", 80), ("TCP", 8080), ("TCP", 65535), ("UDP", 53), ("SCTP", 9)]

ODD_POLICIES: dict[str, dict[str, Any]] = {
    "empty-everything": {"podSelector": {}, "ingress": [{}], "egress": [{}]},
    "deny-all-both-ways": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    "every-port": {
        "podSelector": {},
        "ingress": [{"ports": [{"protocol": p, "port": 1, "endPort": 65535} for p in PROTOCOLS]}],
    },
    "whole-space-with-256-holes": {
        "podSelector": {"matchLabels": {"app": "web"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [
                    {
                        "ipBlock": {
                            "cidr": "0.0.0.0/0",
                            "except": [f"10.{i}.0.0/16" for i in range(256) if i != 1],
                        }
                    }
                ]
            }
        ],
        "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.2.3/32"]}}]}],
    },
    "500-rules": {
        "podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [
            {
                "from": [{"podSelector": {"matchLabels": {"i": str(i)}}, "namespaceSelector": {}}],
                "ports": [{"protocol": "TCP", "port": 8000 + i}],
            }
            for i in range(500)
        ],
    },
    "200-peers-in-one-rule": {
        "podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [
            {
                "from": [
                    {"podSelector": {"matchLabels": {"i": str(i)}}, "namespaceSelector": {}}
                    for i in range(200)
                ]
            }
        ],
    },
    "500-values": {
        "podSelector": {
            "matchExpressions": [
                {"key": "i", "operator": "In", "values": [str(i) for i in range(500)]}
            ]
        },
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "red"}}}]}],
    },
    "named-port-nobody-has": {
        "podSelector": {},
        "ingress": [{"ports": [{"protocol": "TCP", "port": "no-such-port"}]}],
    },
}


@pytest.mark.parametrize("name", [*ODD_POLICIES, "all-at-once"])
def test_odd_policies_compile_and_every_verdict_agrees(name: str) -> None:
    chosen = ODD_POLICIES if name == "all-at-once" else {name: ODD_POLICIES[name]}
    namespace = {"whole-space-with-256-holes": "a", "500-rules": "a", "200-peers-in-one-rule": "a"}
    policies = [np_dict(namespace.get(n, ns["metadata"]["name"]), n, spec)
                for n, spec in chosen.items() for ns in NAMESPACES
                if n not in namespace or ns["metadata"]["name"] == "a"]  # fmt: skip
    world = World(policies, PODS, NAMESPACES)
    assert all(len(set_name) <= 31 for set_name in world.state.ipsets)
    rules = sum(len(chain.rules) for chain in world.state.chains.values())
    assert rules < 3 * 1000 * len(chosen), rules  # a rule per rule and peer, not a product
    for src, dst in PAIRS:
        for proto, port in PROBES:
            world.verdict(f"{src['namespace']}/{src['name']}",
                          f"{dst['namespace']}/{dst['name']}", proto, port)  # fmt: skip


def test_the_255_holes_in_the_whole_space_become_one_set() -> None:
    policy = np_dict("a", "holes", ODD_POLICIES["whole-space-with-256-holes"])
    world = World([policy], PODS, NAMESPACES)
    holes = [s for s in world.state.ipsets.values() if isinstance(s, NetSet) and len(s.nets) > 1]
    assert len(holes) == 1 and len(world.state.members[holes[0].name]) == 255
