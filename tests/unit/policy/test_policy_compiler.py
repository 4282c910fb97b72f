"""Shape of the compiled chains and sets: names, rules, hashes, endpoints,
and the incremental story (pods change set members, never chains)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import pytest

from policy import (
    Chain,
    ContainerPort,
    IPSetSpec,
    NamedPortSet,
    NetSet,
    PodSelection,
    Rule,
    SelectorSet,
    compile_policy,
    desired_state,
    endpoint_chains,
    ipset_members,
    make_namespace,
    make_pod,
    parse_namespace,
    parse_pod,
    parse_policy,
)
from policy.compiler import CLEAR_ACCEPT, CONNTRACK_ACCEPT, RETURN_IF_ACCEPTED, SET_ACCEPT
from policy.selectors import EVERYTHING, parse_selector
from tests.unit.policy.policy_world import iface_of, np_dict, ns_dict, pod_dict

MARK = ("--set-xmark", "0x10000/0x10000")
B64URL = re.compile(r"^[A-Za-z0-9_-]+$")


def compiled(spec: dict[str, Any], ns: str = "x", name: str = "p", family: int = 4) -> Any:
    """Compile a policy given its spec."""
    return compile_policy(parse_policy(np_dict(ns, name, spec)), family)


def chain_name(chain: Chain | None) -> str:
    """The name of a chain that must exist."""
    assert chain is not None
    return chain.name


# ------------------------------------------------------------ names


def test_policy_chain_names_are_28_chars_stable_and_per_policy() -> None:
    both = {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    a = compiled(both)
    assert a.ingress.name.startswith("cali-pi-_") and len(a.ingress.name) == 28
    assert a.egress.name.startswith("cali-po-_") and len(a.egress.name) == 28
    assert compiled(both).ingress.name == a.ingress.name
    assert compiled(both, name="q").ingress.name != a.ingress.name
    assert compiled(both, ns="y").ingress.name != a.ingress.name
    # the name depends on identity, not content: edits rewrite the chain in place
    assert compiled({"ingress": [{}]}).ingress.name == a.ingress.name


def test_only_isolated_directions_get_chains() -> None:
    c = compiled({"podSelector": {}})
    assert c.ingress is not None and c.egress is None
    assert c.chains == (c.ingress,)
    c = compiled({"policyTypes": ["Egress"], "ingress": [{}]})
    assert c.ingress is None and c.egress is not None


def test_ipset_names_fit_and_say_what_they_are() -> None:
    sel = PodSelection("x", None, EVERYTHING)
    names = {
        SelectorSet(4, sel).name: "cali40s:",
        SelectorSet(6, sel).name: "cali60s:",
        NamedPortSet(4, sel, "TCP", "http").name: "cali40n:",
        NetSet(4, (ipaddress.ip_network("10.1.0.0/16"),)).name: "cali40e:",
    }
    for name, prefix in names.items():
        assert name.startswith(prefix) and len(name) == 31
        assert B64URL.match(name[len(prefix) :])
    assert NamedPortSet(4, sel, "UDP", "http").name != NamedPortSet(4, sel, "TCP", "http").name
    assert SelectorSet(4, PodSelection("y", None, EVERYTHING)).name != SelectorSet(4, sel).name


def test_equal_selections_share_one_set_across_policies() -> None:
    peer = {"podSelector": {"matchLabels": {"app": "db", "tier": "1"}}}
    same = {
        "podSelector": {
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["1"]},
                {"key": "app", "operator": "In", "values": ["db"]},
            ]
        }
    }
    a = compiled({"ingress": [{"from": [peer]}]}, name="a")
    b = compiled({"ingress": [{"from": [same]}]}, name="b")
    assert [s.name for s in a.ipsets] == [s.name for s in b.ipsets]
    assert len(a.ipsets) == 1


# ------------------------------------------------------------ policy rules


def test_selector_peer_with_port_becomes_one_mark_rule() -> None:
    c = compiled(
        {
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                    "ports": [{"port": 80}],
                }
            ]
        }
    )
    selection = PodSelection("x", None, parse_selector({"matchLabels": {"app": "web"}}, "t"))
    set_name = SelectorSet(4, selection).name
    assert c.ingress.rules == (
        Rule(
            (
                "-p",
                "tcp",
                "-m",
                "tcp",
                "--dport",
                "80",
                "-m",
                "set",
                "--match-set",
                set_name,
                "src",
            ),
            "MARK",
            MARK,
        ),
        RETURN_IF_ACCEPTED,
    )
    assert c.ipsets == (SelectorSet(4, selection),)


def test_peers_times_ports_and_return_after_each_policy_rule() -> None:
    c = compiled(
        {
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [{"podSelector": {}}, {"namespaceSelector": {}}],
                    "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53}],
                },
                {"ports": [{"protocol": "SCTP", "port": 9000, "endPort": 9005}]},
            ],
        }
    )
    rules = c.egress.rules
    assert len(rules) == 4 + 1 + 1 + 1
    assert rules[4] == RETURN_IF_ACCEPTED and rules[6] == RETURN_IF_ACCEPTED
    assert all(
        r.target == "MARK" and r.target_args == MARK for i, r in enumerate(rules) if i not in (4, 6)
    )
    assert all(r.match[-1] == "dst" for r in rules[:4])
    assert rules[5].match == ("-p", "sctp", "-m", "sctp", "--dport", "9000:9005")


def test_empty_rule_list_compiles_to_an_empty_chain_and_empty_rule_to_match_all() -> None:
    assert compiled({"ingress": []}).ingress.rules == ()
    assert compiled({"ingress": [{}]}).ingress.rules == (Rule((), "MARK", MARK), RETURN_IF_ACCEPTED)


def test_ip_block_uses_address_match_and_negated_except_set() -> None:
    c = compiled(
        {
            "ingress": [
                {
                    "from": [
                        {"ipBlock": {"cidr": "10.0.0.9/8", "except": ["10.1.0.0/16"]}},
                        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}},
                        {"ipBlock": {"cidr": "0.0.0.0/0"}},
                    ]
                }
            ]
        }
    )
    r1, r2, r3, _ = c.ingress.rules
    e1 = NetSet(4, (ipaddress.ip_network("10.1.0.0/16"),)).name
    e2 = NetSet(4, (ipaddress.ip_network("10.0.0.0/8"),)).name
    assert r1.match == ("-s", "10.0.0.0/8", "-m", "set", "!", "--match-set", e1, "src")
    assert r2.match == ("-m", "set", "!", "--match-set", e2, "src")  # hash:net has no /0
    assert r3.match == ()
    assert ipset_members(c.ipsets, [], []) == {e1: {"10.1.0.0/16"}, e2: {"10.0.0.0/8"}}


def test_other_family_ip_blocks_never_widen_a_rule() -> None:
    spec = {"ingress": [{"from": [{"ipBlock": {"cidr": "fd00::/8", "except": ["fd00:1::/32"]}}]}]}
    assert compiled(spec, family=4).ingress.rules == ()
    v6 = compiled(spec, family=6)
    assert v6.ingress.rules[0].match[:2] == ("-s", "fd00::/8")
    assert [s.name[:8] for s in v6.ipsets] == ["cali60e:"]


def test_named_ports_use_ip_port_sets_on_the_destination() -> None:
    c = compiled(
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"ports": [{"port": "http"}]}],
            "egress": [
                {"ports": [{"port": "dns", "protocol": "UDP"}]},
                {"to": [{"namespaceSelector": {}}], "ports": [{"port": "db"}]},
            ],
        }
    )
    target = PodSelection("x", None, parse_selector({"matchLabels": {"app": "web"}}, "t"))
    everyone = PodSelection(None, EVERYTHING, EVERYTHING)
    http = NamedPortSet(4, target, "TCP", "http")
    dns = NamedPortSet(4, everyone, "UDP", "dns")
    db = NamedPortSet(4, everyone, "TCP", "db")
    assert c.ingress.rules[0].match == (
        "-p",
        "tcp",
        "-m",
        "set",
        "--match-set",
        http.name,
        "dst,dst",
    )
    assert c.egress.rules[0].match == ("-p", "udp", "-m", "set", "--match-set", dns.name, "dst,dst")
    # the pod peer is folded into the named-port set: no separate selector set
    assert c.egress.rules[2].match == ("-p", "tcp", "-m", "set", "--match-set", db.name, "dst,dst")
    assert set(c.ipsets) == {http, dns, db}


# ------------------------------------------------------------ rule hashes


def test_rule_hash_is_short_stable_and_content_sensitive() -> None:
    a = Rule(("-p", "tcp"), "MARK", MARK)
    assert a.hash == Rule(("-p", "tcp"), "MARK", MARK).hash
    assert len(a.hash) == 16 and B64URL.match(a.hash)
    others = [
        Rule(("-p", "udp"), "MARK", MARK),
        Rule(("-p", "tcp"), "DROP"),
        Rule(("-p", "tcp", "MARK"), "", MARK),
        Rule(("-p",), "tcp", ("MARK", *MARK)),
    ]
    assert len({a.hash, *(o.hash for o in others)}) == 5


def test_chain_rule_ids_depend_on_position_and_chain() -> None:
    r1, r2, r3 = Rule((), "ACCEPT"), Rule((), "DROP"), Rule(("-p", "udp"), "RETURN")
    base = Chain("cali-x", (r1, r2, r3)).rule_ids()
    assert len(set(base)) == 3
    assert Chain("cali-x", (r1, r2, r3)).rule_ids() == base
    assert Chain("cali-y", (r1, r2, r3)).rule_ids()[0] != base[0]
    inserted = Chain("cali-x", (r1, r3, r2, r3)).rule_ids()
    assert inserted[0] == base[0] and inserted[1] != base[1] and inserted[3] != base[2]


def test_render_gives_restore_lines_with_comment_ids() -> None:
    chain = Chain("cali-x", (Rule(("-p", "tcp"), "MARK", MARK), Rule((), "cali-y")))
    ids = chain.rule_ids()
    assert chain.render() == [
        f'-A cali-x -p tcp -m comment --comment "tabby:{ids[0]}" -j MARK --set-xmark '
        "0x10000/0x10000",
        f'-A cali-x -m comment --comment "tabby:{ids[1]}" -j cali-y',
    ]
    assert chain.jump_targets() == {"cali-y"}


# ------------------------------------------------------------ endpoint chains

WEB = make_pod("x", "web", labels={"app": "web"}, ips=["10.0.0.5", "fd00::5"])


def test_endpoint_without_policies_allows_after_conntrack_and_anti_spoofing() -> None:
    eps = endpoint_chains(WEB, [], "cali0123456789a")
    assert eps.to_workload.name == "cali-tw-cali0123456789a"
    assert eps.from_workload.name == "cali-fw-cali0123456789a"
    assert eps.to_workload.rules[0] == CONNTRACK_ACCEPT
    assert eps.to_workload.rules[-2:] == (CLEAR_ACCEPT, SET_ACCEPT)
    assert eps.from_workload.rules[0] == Rule(("!", "-s", "10.0.0.5/32"), "DROP")
    assert eps.from_workload.rules[1] == CONNTRACK_ACCEPT
    assert eps.from_workload.rules[-2:] == (CLEAR_ACCEPT, SET_ACCEPT)
    v6 = endpoint_chains(WEB, [], "cali0123456789a", family=6)
    assert v6.from_workload.rules[0] == Rule(("!", "-s", "fd00::5/128"), "DROP")
    no_v6 = endpoint_chains(make_pod("x", "v4only", ips=["10.0.0.6"]), [], "caliX", family=6)
    assert no_v6.from_workload.rules[0] == Rule((), "DROP")


def test_endpoint_jumps_to_selecting_policies_in_order_then_drops() -> None:
    raw: list[tuple[str, str, dict[str, Any]]] = [
        ("x", "zz", {"podSelector": {}}),
        ("x", "aa", {"podSelector": {"matchLabels": {"app": "web"}}, "egress": [{}]}),
        ("x", "other", {"podSelector": {"matchLabels": {"app": "db"}}}),
        ("y", "elsewhere", {"podSelector": {}}),
        ("x", "egress-only", {"podSelector": {}, "policyTypes": ["Egress"]}),
    ]
    pols = [parse_policy(np_dict(ns, name, spec)) for ns, name, spec in raw]
    by_name = {p.name: compile_policy(p) for p in pols}
    eps = endpoint_chains(WEB, pols, "caliweb")
    tw, fw = eps.to_workload.rules, eps.from_workload.rules
    assert [r.target for r in tw if r.target.startswith("cali-")] == [
        chain_name(by_name["aa"].ingress),
        chain_name(by_name["zz"].ingress),
    ]
    assert [r.target for r in fw if r.target.startswith("cali-")] == [
        chain_name(by_name["aa"].egress),
        chain_name(by_name["egress-only"].egress),
    ]
    for rules in (tw, fw):
        jumps = [i for i, r in enumerate(rules) if r.target.startswith("cali-")]
        assert all(rules[i + 1] == RETURN_IF_ACCEPTED for i in jumps)
        assert rules[-1] == Rule((), "DROP")


def test_bad_interface_name_is_refused() -> None:
    with pytest.raises(ValueError, match="interface"):
        endpoint_chains(WEB, [], "cali-much-too-long-name")


# ------------------------------------------------------------ members


def test_members_of_each_set_kind() -> None:
    db = PodSelection(
        None,
        parse_selector({"matchLabels": {"team": "a"}}, "t"),
        parse_selector({"matchLabels": {"app": "db"}}, "t"),
    )
    pods = [
        make_pod(
            "x",
            "db1",
            labels={"app": "db"},
            ips=["10.0.0.1", "fd00::1"],
            ports=[ContainerPort("sql", 5432)],
        ),
        make_pod(
            "y",
            "db2",
            labels={"app": "db"},
            ips=["10.0.0.2"],
            ports=[ContainerPort("sql", 5433), ContainerPort("dns", 53, "UDP")],
        ),
        make_pod(
            "x",
            "hostdb",
            labels={"app": "db"},
            ips=["172.18.0.2"],
            host_network=True,
            ports=[ContainerPort("sql", 5432)],
        ),
        make_pod("z", "db3", labels={"app": "db"}, ips=["10.0.0.3"]),  # unknown namespace
    ]
    nss = [make_namespace("x", {"team": "a"}), make_namespace("y", {"team": "b"})]
    specs: list[IPSetSpec] = [
        SelectorSet(4, db),
        SelectorSet(6, db),
        SelectorSet(4, PodSelection(None, EVERYTHING, EVERYTHING)),
        NamedPortSet(4, PodSelection(None, EVERYTHING, EVERYTHING), "TCP", "sql"),
        NamedPortSet(6, PodSelection(None, EVERYTHING, EVERYTHING), "TCP", "sql"),
        NamedPortSet(4, PodSelection(None, EVERYTHING, EVERYTHING), "TCP", "dns"),
    ]
    members = ipset_members(specs, pods, nss)
    assert [members[s.name] for s in specs] == [
        {"10.0.0.1"},
        {"fd00::1"},
        {"10.0.0.1", "10.0.0.2", "10.0.0.3"},
        {"10.0.0.1,tcp:5432", "10.0.0.2,tcp:5433"},
        {"fd00::1,tcp:5432"},
        set(),  # dns is UDP on db2
    ]


# ------------------------------------------------------------ node state, incremental


NSS = [ns_dict("x", {"team": "a"}), ns_dict("y")]
POLICIES = [
    np_dict(
        "x",
        "web",
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": {"app": "fe"}}},
                        {"namespaceSelector": {"matchLabels": {"team": "b"}}},
                    ],
                    "ports": [{"port": "http"}],
                }
            ],
            "egress": [{"ports": [{"port": "dns", "protocol": "UDP"}]}],
        },
    ),
    np_dict("y", "unrelated", {"podSelector": {}}),
]
WEB_POD = pod_dict("x", "web", "10.0.0.5", {"app": "web"}, [("http", 8080, "TCP")])
FE_POD = pod_dict("x", "fe", "10.0.0.6", {"app": "fe"})


def node(
    pods: list[dict[str, Any]], nss: list[dict[str, Any]] = NSS, local: tuple[str, ...] = ("x/web",)
) -> Any:
    """Desired state of a node whose local endpoints are ``local``."""
    parsed = [parse_pod(p) for p in pods]
    endpoints = {iface_of(p.namespace, p.name): p for p in parsed if p.key in local}
    return desired_state(
        [parse_policy(p) for p in POLICIES], parsed, [parse_namespace(n) for n in nss], endpoints
    )


def test_node_carries_only_policies_of_local_endpoints_and_consistent_references() -> None:
    state = node([WEB_POD, FE_POD])
    web = compile_policy(parse_policy(POLICIES[0]))
    unrelated = compile_policy(parse_policy(POLICIES[1]))
    assert chain_name(web.ingress) in state.chains and chain_name(web.egress) in state.chains
    assert chain_name(unrelated.ingress) not in state.chains
    for chain in state.chains.values():
        assert chain.jump_targets() <= set(state.chains)
        for rule in chain.rules:
            for i, tok in enumerate(rule.match):
                if tok == "--match-set":
                    assert rule.match[i + 1] in state.ipsets
    assert set(state.members) == set(state.ipsets)


def test_pods_and_labels_change_members_never_chains() -> None:
    before = node([WEB_POD, FE_POD])
    fe2 = pod_dict("y", "fe2", "10.0.1.7", {"app": "fe"}, [("http", 80, "TCP")])
    web2 = pod_dict("x", "web2", "10.0.1.8", {"app": "web"}, [("http", 9090, "TCP")])
    after = node([WEB_POD, FE_POD, fe2, web2])
    assert after.chains == before.chains
    assert after.ipsets == before.ipsets
    assert after.members != before.members
    relabelled = node([WEB_POD, FE_POD], nss=[ns_dict("x", {"team": "b"}), ns_dict("y")])
    assert relabelled.chains == before.chains
    assert relabelled.members != before.members
    changed = {n for n in before.members if relabelled.members[n] != before.members[n]}
    assert len(changed) == 1  # the namespaceSelector set now holds x's pods


def test_a_new_local_endpoint_adds_its_chains_and_leaves_the_rest_alone() -> None:
    fe_local = node([WEB_POD, FE_POD], local=("x/web", "x/fe"))
    before = node([WEB_POD, FE_POD])
    added = set(fe_local.chains) - set(before.chains)
    assert added == {f"cali-tw-{iface_of('x', 'fe')}", f"cali-fw-{iface_of('x', 'fe')}"}
    assert all(fe_local.chains[name] == chain for name, chain in before.chains.items())
