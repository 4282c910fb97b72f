"""The truth table's cases: policies and changes, each step followed by a full matrix.

A case is a list of steps; a step is a list of actions (apply or delete a
policy, change a pod's or a namespace's labels) after which every cell is
probed and compared with the oracle. Policies are built from the world because
ipBlocks name real pod addresses. Every case starts from no policy and the
original labels. The ``tags`` say which feature of issue #6 a case covers; the
bench checks that all of :data:`FEATURES` are covered.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.truthtable.world import NAME_LABEL, World

Obj = dict[str, Any]

FEATURES = (
    "default-deny",
    "podSelector-matchLabels",
    "podSelector-matchExpressions",
    "namespaceSelector",
    "and-vs-or",
    "empty-vs-absent",
    "ipBlock-except",
    "ipBlock-noncanonical",
    "tcp-udp-sctp",
    "numeric-port",
    "named-port",
    "named-port-egress-no-peers",
    "endPort",
    "policyTypes-defaults",
    "union",
    "egress-and-ingress",
    "label-change",
    "namespace-label-change",
    "policy-update",
    "policy-delete",
    # ClusterNetworkPolicy (issue 19)
    "cnp-admin-deny-over-np-allow",
    "cnp-admin-accept-over-np-deny",
    "cnp-pass",
    "cnp-baseline",
    "cnp-named-port",
    "cnp-networks",
)


@dataclass(frozen=True)
class Action:
    """One change: ``apply`` (policy), ``delete`` (ns, name), ``label_pod``, ``label_ns``."""

    kind: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Step:
    what: str
    actions: tuple[Action, ...] = ()


@dataclass(frozen=True)
class Case:
    name: str
    tags: tuple[str, ...]
    build: Callable[[World], list[Step]] = field(repr=False)


# ---------------------------------------------------------------- builders


def np(ns: str, name: str, spec: Obj) -> Obj:
    return {"metadata": {"namespace": ns, "name": name}, "spec": spec}


def labels(**kv: str) -> Obj:
    return {"matchLabels": kv}


def ns_is(name: str) -> Obj:
    return {"matchLabels": {NAME_LABEL: name}}


def apply(policy: Obj) -> Action:
    return Action("apply", (policy,))


def delete(ns: str, name: str) -> Action:
    return Action("delete", (ns, name))


def apply_cnp(policy: Obj) -> Action:
    return Action("apply_cnp", (policy,))


def delete_cnp(name: str) -> Action:
    return Action("delete_cnp", (name,))


def cnp(name: str, tier: str, priority: int, subject: Obj, **rules: Any) -> Obj:
    """A ClusterNetworkPolicy; ``rules`` are its ``ingress`` and ``egress`` lists."""
    spec = {"tier": tier, "priority": priority, "subject": subject, **rules}
    return {"metadata": {"name": name}, "spec": spec}


def label_pod(key: str, **kv: str | None) -> Action:
    return Action("label_pod", (key, kv))


def label_ns(name: str, **kv: str | None) -> Action:
    return Action("label_ns", (name, kv))


def noncanonical(ip: str, prefix: int) -> str:
    """The network around ``ip`` written with host bits set (``10.244.0.1/16``), as old
    e2e binaries send it: the API accepts it and it must be masked, not rejected."""
    net = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
    assert prefix < 32, "a /32 has no host bits"
    return f"{net.network_address + 1}/{prefix}"


# ---------------------------------------------------------------- cases


def _baseline(_: World) -> list[Step]:
    return [Step("no policy: everything open")]


def _default_deny(_: World) -> list[Step]:
    ingress = np("x", "deny-in", {"podSelector": {}, "policyTypes": ["Ingress"]})
    egress = np("x", "deny-out", {"podSelector": {}, "policyTypes": ["Egress"]})
    return [
        Step("x: deny all ingress", (apply(ingress),)),
        Step("x: deny all egress too", (apply(egress),)),
        Step("x: ingress deny deleted, egress deny stays", (delete("x", "deny-in"),)),
    ]


def _match_labels(_: World) -> list[Step]:
    spec = {
        "podSelector": labels(pod="a"),
        "ingress": [{"from": [{"podSelector": labels(pod="b")}]}],
    }
    return [Step("x/a from pod=b of its own namespace", (apply(np("x", "a-from-b", spec)),))]


def _match_expressions(_: World) -> list[Step]:
    first = {
        "podSelector": {
            "matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "b"]}]
        },
        "ingress": [
            {
                "from": [
                    {
                        "namespaceSelector": {},
                        "podSelector": {
                            "matchExpressions": [
                                {"key": "pod", "operator": "NotIn", "values": ["b"]},
                                {"key": "pod", "operator": "Exists"},
                            ]
                        },
                    }
                ]
            }
        ],
    }
    second = {
        "podSelector": {
            "matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "b"]}]
        },
        "ingress": [
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchExpressions": [
                                {"key": NAME_LABEL, "operator": "In", "values": ["y", "z"]}
                            ]
                        },
                        "podSelector": {
                            "matchExpressions": [{"key": "role", "operator": "DoesNotExist"}]
                        },
                    }
                ]
            }
        ],
    }
    return [
        Step(
            "x/a,x/b (In) from pods NotIn [b] and Exists, any namespace",
            (apply(np("x", "expr", first)),),
        ),
        Step(
            "updated: from namespaces In [y,z], pods without role",
            (apply(np("x", "expr", second)),),
        ),
        Step("y/c gets role=db after the policy exists", (label_pod("y/c", role="db"),)),
        Step("x/c gets pod=a: now selected by the policy", (label_pod("x/c", pod="a"),)),
    ]


def _namespace_selector(_: World) -> list[Step]:
    by_name = {
        "podSelector": labels(pod="a"),
        "ingress": [{"from": [{"namespaceSelector": ns_is("x")}]}],
    }
    by_team = {
        "podSelector": labels(pod="a"),
        "ingress": [{"from": [{"namespaceSelector": labels(team="blue")}]}],
    }
    return [
        Step("y/a from namespace x (name label)", (apply(np("y", "from-x", by_name)),)),
        Step("y/a from namespaces team=blue (none yet)", (apply(np("y", "from-x", by_team)),)),
        Step("namespace z gets team=blue", (label_ns("z", team="blue"),)),
    ]


def _and_or(_: World) -> list[Step]:
    both = {
        "podSelector": labels(pod="a"),
        "ingress": [{"from": [{"namespaceSelector": ns_is("y"), "podSelector": labels(pod="b")}]}],
    }
    either = {
        "podSelector": labels(pod="a"),
        "ingress": [
            {"from": [{"namespaceSelector": ns_is("y")}, {"podSelector": labels(pod="b")}]}
        ],
    }
    return [
        Step("x/a from (ns y AND pod=b): one peer", (apply(np("x", "andor", both)),)),
        Step("x/a from (ns y) OR (pod=b of x): two peers", (apply(np("x", "andor", either)),)),
    ]


def _empty_absent(_: World) -> list[Step]:
    def spec(ingress: list[Obj]) -> Obj:
        return {"podSelector": labels(pod="c"), "policyTypes": ["Ingress"], "ingress": ingress}

    return [
        Step(
            "z/c from podSelector {}: all pods of z",
            (apply(np("z", "ea", spec([{"from": [{"podSelector": {}}]}]))),),
        ),
        Step(
            "z/c from namespaceSelector {}: all pods",
            (apply(np("z", "ea", spec([{"from": [{"namespaceSelector": {}}]}]))),),
        ),
        Step("z/c rule without from: everything", (apply(np("z", "ea", spec([{}]))),)),
        Step("z/c with ingress []: nothing", (apply(np("z", "ea", spec([]))),)),
    ]


def _ip_block(world: World) -> list[Step]:
    pool_wide = noncanonical(world.ip("x/a"), 16)
    ingress = {
        "podSelector": labels(pod="a"),
        "ingress": [
            {
                "from": [
                    {
                        "ipBlock": {
                            "cidr": pool_wide,
                            "except": [f"{world.ip('x/b')}/32", f"{world.ip('y/c')}/32"],
                        }
                    }
                ]
            }
        ],
    }
    target = world.ip("z/b")
    egress = {
        "podSelector": labels(pod="c"),
        "policyTypes": ["Egress"],
        "egress": [
            {"to": [{"ipBlock": {"cidr": noncanonical(target, 30)}}], "ports": [{"port": 81}]}
        ],
    }
    everything_but_pods = {
        "podSelector": labels(pod="a"),
        "ingress": [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]}}]}],
    }
    return [
        Step(f"z/a from {pool_wide} except x/b and y/c", (apply(np("z", "ipb", ingress)),)),
        Step(
            f"x/c egress only to {noncanonical(target, 30)} TCP 81",
            (apply(np("x", "ipb-out", egress)),),
        ),
        Step(
            "z/a from 0.0.0.0/0 except the pool: no pod",
            (apply(np("z", "ipb", everything_but_pods)),),
        ),
    ]


def _protocols(_: World) -> list[Step]:
    def spec(ports: list[Obj]) -> Obj:
        return {"podSelector": labels(pod="a"), "ingress": [{"ports": ports}]}

    return [
        Step(
            "x/a: UDP 81 and SCTP 80 only (TCP isolated)",
            (
                apply(
                    np(
                        "x",
                        "proto",
                        spec([{"protocol": "UDP", "port": 81}, {"protocol": "SCTP", "port": 80}]),
                    )
                ),
            ),
        ),
        Step("x/a: every SCTP port", (apply(np("x", "proto", spec([{"protocol": "SCTP"}]))),)),
        Step(
            "x/a: port 81 (protocol defaults to TCP)",
            (apply(np("x", "proto", spec([{"port": 81}]))),),
        ),
    ]


def _named_ingress(_: World) -> list[Step]:
    spec = {
        "podSelector": labels(pod="b"),
        "ingress": [
            {
                "ports": [
                    {"protocol": "UDP", "port": "serve-81-udp"},
                    {"port": "alt"},  # y/b names 81/TCP alt
                    {"protocol": "UDP", "port": "serve-80-tcp"},  # protocol mismatch: nothing
                ]
            }
        ],
    }
    return [
        Step(
            "y/b: named ports serve-81-udp, alt, and a mismatched one",
            (apply(np("y", "named", spec)),),
        )
    ]


def _named_egress(_: World) -> list[Step]:
    spec = {
        "podSelector": labels(pod="a"),
        "policyTypes": ["Egress"],
        "egress": [
            {"ports": [{"port": "alt"}]},
            {"ports": [{"protocol": "SCTP", "port": "serve-81-sctp"}]},
        ],
    }
    return [
        Step(
            "x/a egress, no peers: alt (per destination) and serve-81-sctp",
            (apply(np("x", "named-out", spec)),),
        )
    ]


def _end_port(_: World) -> list[Step]:
    spec = {
        "podSelector": labels(pod="c"),
        "ingress": [
            {
                "ports": [
                    {"protocol": "TCP", "port": 80, "endPort": 81},
                    {"protocol": "UDP", "port": 81, "endPort": 90},
                    {"protocol": "SCTP", "port": 70, "endPort": 80},
                ]
            }
        ],
    }
    return [Step("z/c: TCP 80-81, UDP 81-90, SCTP 70-80", (apply(np("z", "range", spec)),))]


def _policy_types(_: World) -> list[Step]:
    only_egress_rules = {
        "podSelector": labels(pod="a"),
        "egress": [{"to": [{"podSelector": labels(pod="b")}]}],
    }
    egress_type_with_ingress_rules = {
        "podSelector": labels(pod="a"),
        "policyTypes": ["Egress"],
        "ingress": [{"from": [{"podSelector": labels(pod="c")}]}],
        "egress": [],
    }
    empty_egress = {
        "podSelector": labels(pod="a"),
        "ingress": [{"from": [{"podSelector": {}}]}],
        "egress": [],
    }
    return [
        Step(
            "y/a: egress rules, no policyTypes: Ingress+Egress",
            (apply(np("y", "types", only_egress_rules)),),
        ),
        Step(
            "y/a: policyTypes [Egress], ingress rules ignored",
            (apply(np("y", "types", egress_type_with_ingress_rules)),),
        ),
        Step(
            "y/a: no policyTypes and egress []: Ingress only",
            (apply(np("y", "types", empty_egress)),),
        ),
    ]


def _union(_: World) -> list[Step]:
    from_a = {
        "podSelector": labels(pod="b"),
        "ingress": [{"from": [{"podSelector": labels(pod="a")}]}],
    }
    from_z = {
        "podSelector": labels(pod="b"),
        "ingress": [{"from": [{"namespaceSelector": ns_is("z")}]}],
    }
    return [
        Step(
            "x/b: two policies, union", (apply(np("x", "u1", from_a)), apply(np("x", "u2", from_z)))
        ),
        Step("one deleted", (delete("x", "u1"),)),
        Step("both deleted: open again", (delete("x", "u2"),)),
    ]


def _deny_plus_allow(_: World) -> list[Step]:
    deny = np("x", "deny", {"podSelector": {}, "policyTypes": ["Ingress"]})
    allow = np(
        "x",
        "allow",
        {
            "podSelector": labels(pod="a"),
            "ingress": [{"from": [{"namespaceSelector": ns_is("y")}], "ports": [{"port": 80}]}],
        },
    )
    return [Step("x: default deny + x/a from y on TCP 80", (apply(deny), apply(allow)))]


def _both_directions(_: World) -> list[Step]:
    out = np(
        "x",
        "out",
        {
            "podSelector": labels(pod="a"),
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": ns_is("y")}]}],
        },
    )
    into = np(
        "y",
        "in",
        {
            "podSelector": labels(pod="b"),
            "ingress": [{"from": [{"namespaceSelector": ns_is("z")}]}],
        },
    )
    return [Step("x/a egress to y only; y/b ingress from z only", (apply(out), apply(into)))]


def _target_relabel(_: World) -> list[Step]:
    deny = np("y", "deny-a", {"podSelector": labels(pod="a"), "policyTypes": ["Ingress"]})
    return [
        Step("y/a isolated", (apply(deny),)),
        Step("y/b relabelled pod=a: isolated too", (label_pod("y/b", pod="a"),)),
        Step("y/a relabelled pod=q: no longer selected", (label_pod("y/a", pod="q"),)),
    ]


CASES: tuple[Case, ...] = (
    Case("baseline", (), _baseline),
    Case("default-deny", ("default-deny", "policy-delete"), _default_deny),
    Case("match-labels", ("podSelector-matchLabels",), _match_labels),
    Case(
        "match-expressions",
        ("podSelector-matchExpressions", "policy-update", "label-change"),
        _match_expressions,
    ),
    Case(
        "namespace-selector", ("namespaceSelector", "namespace-label-change"), _namespace_selector
    ),
    Case("and-vs-or", ("and-vs-or", "policy-update"), _and_or),
    Case("empty-vs-absent", ("empty-vs-absent",), _empty_absent),
    Case("ip-block", ("ipBlock-except", "ipBlock-noncanonical"), _ip_block),
    Case("protocols", ("tcp-udp-sctp", "numeric-port"), _protocols),
    Case("named-ingress", ("named-port",), _named_ingress),
    Case("named-egress", ("named-port-egress-no-peers",), _named_egress),
    Case("end-port", ("endPort",), _end_port),
    Case("policy-types", ("policyTypes-defaults",), _policy_types),
    Case("union", ("union", "policy-delete"), _union),
    Case("deny-plus-allow", ("default-deny", "numeric-port"), _deny_plus_allow),
    Case("both-directions", ("egress-and-ingress",), _both_directions),
    Case("target-relabel", ("label-change",), _target_relabel),
)


ADMIN_NAMES = ("no-y-to-xa", "pass-yb", "z-in-80")
TIER_FEATURES = (
    "cnp-admin-deny-over-np-allow",
    "cnp-admin-accept-over-np-deny",
    "cnp-pass",
    "cnp-baseline",
)
X_A = {"pods": {"namespaceSelector": ns_is("x"), "podSelector": labels(pod="a")}}
Y_B = {"pods": {"namespaceSelector": ns_is("y"), "podSelector": labels(pod="b")}}
TCP_80 = [{"tcp": {"destinationPort": {"number": 80}}}]


def _cluster_tiers(_: World) -> list[Step]:
    """The tiers around a NetworkPolicy that admits only namespace y into x."""
    from_y_rule = {"from": [{"namespaceSelector": ns_is("y")}]}
    from_y = np("x", "from-y", {"podSelector": {}, "ingress": [from_y_rule]})
    deny_from_y = {"action": "Deny", "from": [{"namespaces": ns_is("y")}]}
    deny_y = cnp("no-y-to-xa", "Admin", 10, X_A, ingress=[deny_from_y])
    pass_yb = cnp("pass-yb", "Admin", 5, X_A, ingress=[{"action": "Pass", "from": [Y_B]}])
    accept_z = {"action": "Accept", "from": [{"namespaces": ns_is("z")}], "protocols": TCP_80}
    z_on_80 = cnp("z-in-80", "Admin", 1, {"namespaces": ns_is("x")}, ingress=[accept_z])
    deny_all = {"action": "Deny", "from": [{"namespaces": {}}]}
    baseline = cnp("isolate", "Baseline", 1, {"namespaces": {}}, ingress=[deny_all])
    return [
        Step("NetworkPolicy: x admits only y", (apply(from_y),)),
        Step("Admin Deny y -> x/a beats the NetworkPolicy's allow", (apply_cnp(deny_y),)),
        Step("an earlier Admin Pass hands y/b back to the NetworkPolicy", (apply_cnp(pass_yb),)),
        Step("Admin Accept z -> x on tcp/80 beats its deny", (apply_cnp(z_on_80),)),
        Step("Baseline Deny for pods no NetworkPolicy selects (y, z)", (apply_cnp(baseline),)),
        Step("the NetworkPolicy deleted: x falls to the Baseline too", (delete("x", "from-y"),)),
        Step("Admin policies deleted", tuple(delete_cnp(n) for n in ADMIN_NAMES)),
    ]


def _cluster_egress(world: World) -> list[Step]:
    """Egress: a network (one pod's address) and a named port resolved per pod."""
    to_yc_rule = {"action": "Deny", "to": [{"networks": [f"{world.ip('y/c')}/32"]}]}
    to_yc = cnp("no-yc", "Admin", 1, {"namespaces": ns_is("x")}, egress=[to_yc_rule])
    alt_rule = {
        "action": "Deny",
        "to": [{"namespaces": ns_is("z")}],
        "protocols": [{"destinationNamedPort": "alt"}],
    }
    alt = cnp("no-alt", "Admin", 2, {"namespaces": {}}, egress=[alt_rule])
    return [
        Step("Admin Deny egress from x to y/c's address", (apply_cnp(to_yc),)),
        Step("Admin Deny egress to z's named port alt", (apply_cnp(alt),)),
        Step("the network rule deleted", (delete_cnp("no-yc"),)),
    ]


CLUSTER_CASES = (
    Case("cnp-tiers", TIER_FEATURES, _cluster_tiers),
    Case("cnp-egress", ("cnp-networks", "cnp-named-port"), _cluster_egress),
)
CASES = (*CASES, *CLUSTER_CASES)

# What the integration test runs: a few cases that still cross both directions,
# Services, named ports and SCTP.
QUICK = ("default-deny", "named-egress", "target-relabel", "cnp-tiers")


def uncovered(cases: tuple[Case, ...] = CASES) -> set[str]:
    """Features of issue #6 that no case covers (should be empty)."""
    return set(FEATURES) - {t for c in cases for t in c.tags}
