"""Parsing and validating NetworkPolicy, Pod and Namespace dicts."""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy import (
    ContainerPort,
    IPBlock,
    PodSelection,
    PolicyError,
    PolicyRule,
    PortSpec,
    parse_namespace,
    parse_pod,
    parse_policy,
)
from policy.selectors import EVERYTHING
from tests.unit.policy.policy_world import np_dict, ns_dict, pod_dict


def parse(spec: dict[str, Any], ns: str = "x") -> Any:
    """Parse a policy with the given spec."""
    return parse_policy(np_dict(ns, "p", spec))


# ------------------------------------------------------------ policyTypes defaults


@pytest.mark.parametrize(
    ("spec", "ingress", "egress"),
    [
        ({}, (), None),
        ({"ingress": []}, (), None),
        ({"egress": []}, (), None),  # empty egress list does not add Egress
        ({"egress": [{}]}, (), "rules"),  # non-empty egress adds Egress; Ingress stays
        ({"policyTypes": []}, (), None),  # empty list = default
        ({"policyTypes": ["Egress"]}, None, ()),
        ({"policyTypes": ["Egress"], "ingress": [{}]}, None, ()),  # ingress ignored
        ({"policyTypes": ["Ingress", "Egress"]}, (), ()),
        ({"policyTypes": ["Ingress"], "egress": [{}]}, (), None),  # egress ignored
    ],
)
def test_policy_types_defaults(spec: dict[str, Any], ingress: Any, egress: Any) -> None:
    pol = parse(spec)
    assert pol.ingress == ingress
    if egress == "rules":
        assert pol.egress == (PolicyRule(),)
    else:
        assert pol.egress == egress


def test_empty_rule_is_allow_all_and_absent_lists_are_any() -> None:
    pol = parse({"ingress": [{}, {"from": [], "ports": []}]})
    assert pol.ingress is not None
    assert [r.peers for r in pol.ingress] == [(), ()]
    assert [r.ports for r in pol.ingress] == [(), ()]


# ------------------------------------------------------------ peers


def test_peer_forms_resolve_namespaces() -> None:
    pol = parse(
        {
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": {"a": "b"}}},
                        {"namespaceSelector": {}},
                        {"namespaceSelector": {"matchLabels": {"t": "1"}}, "podSelector": {}},
                        {"podSelector": {}},
                    ]
                }
            ]
        },
        ns="web",
    )
    assert pol.ingress is not None
    own, all_ns, anded, own_all = pol.ingress[0].peers
    assert isinstance(own, PodSelection) and own.namespace == "web"
    assert own.namespace_selector is None and own.pod_selector.matches({"a": "b"})
    assert isinstance(all_ns, PodSelection) and all_ns.namespace is None
    assert all_ns.namespace_selector == EVERYTHING and all_ns.pod_selector == EVERYTHING
    assert isinstance(anded, PodSelection) and anded.namespace is None
    assert anded.namespace_selector is not None and not anded.namespace_selector.is_empty
    assert own_all == PodSelection("web", None, EVERYTHING)


def test_ip_block_is_masked_and_excepts_sorted() -> None:
    pol = parse(
        {
            "ingress": [
                {
                    "from": [
                        {
                            "ipBlock": {
                                "cidr": "10.0.0.5/8",
                                "except": ["10.2.3.4/16", "10.1.0.0/16", "10.1.0.0/16"],
                            }
                        }
                    ]
                }
            ]
        }
    )
    assert pol.ingress is not None
    block = pol.ingress[0].peers[0]
    assert isinstance(block, IPBlock)
    assert block.cidr == ipaddress.ip_network("10.0.0.0/8")
    assert block.excepts == (
        ipaddress.ip_network("10.1.0.0/16"),
        ipaddress.ip_network("10.2.0.0/16"),
    )
    assert block.contains(ipaddress.ip_address("10.3.0.1"))
    assert not block.contains(ipaddress.ip_address("10.2.9.9"))
    assert not block.contains(ipaddress.ip_address("11.0.0.1"))
    assert not block.contains(ipaddress.ip_address("::1"))


def test_ports_defaults_named_and_ranges() -> None:
    pol = parse(
        {
            "ingress": [
                {
                    "ports": [
                        {},
                        {"port": 80},
                        {"port": "http", "protocol": "UDP"},
                        {"port": 1000, "endPort": 2000, "protocol": "SCTP"},
                        {"protocol": "UDP", "port": None},
                    ]
                }
            ]
        }
    )
    assert pol.ingress is not None
    assert pol.ingress[0].ports == (
        PortSpec("TCP"),
        PortSpec("TCP", 80),
        PortSpec("UDP", "http"),
        PortSpec("SCTP", 1000, 2000),
        PortSpec("UDP"),
    )
    assert pol.ingress[0].ports[2].is_named


# ------------------------------------------------------------ malformed corpus

GOOD = np_dict("x", "p", {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]})

MALFORMED: list[tuple[Any, str]] = [
    (None, "must be a JSON object"),
    ([], "must be a JSON object"),
    ("policy", "must be a JSON object"),
    ({}, "metadata is required"),
    ({"metadata": []}, "metadata"),
    ({"metadata": {"namespace": "x"}}, "metadata.name"),
    ({"metadata": {"name": "p"}}, "metadata.namespace"),
    ({"metadata": {"name": "p", "namespace": "X_bad"}}, "DNS label"),
    ({"metadata": {"name": "Bad Name", "namespace": "x"}}, "DNS subdomain"),
    ({"metadata": {"name": 5, "namespace": "x"}}, "metadata.name"),
    ({**GOOD, "kind": "Pod"}, "kind"),
    ({**GOOD, "apiVersion": "extensions/v1beta1"}, "apiVersion"),
    ({**GOOD, "spec": None}, "spec is required"),
    ({**GOOD, "spec": []}, "spec"),
    ({**GOOD, "spec": {"podSelector": "app=web"}}, "spec.podSelector"),
    ({**GOOD, "spec": {"policyTypes": "Ingress"}}, "spec.policyTypes"),
    ({**GOOD, "spec": {"policyTypes": ["ingress"]}}, "not Ingress or Egress"),
    ({**GOOD, "spec": {"policyTypes": ["Ingress", "Ingress"]}}, "duplicate"),
    ({**GOOD, "spec": {"ingress": {}}}, "spec.ingress"),
    ({**GOOD, "spec": {"ingress": ["x"]}}, "spec.ingress[0]"),
    ({**GOOD, "spec": {"ingress": [{"to": []}]}}, "unknown field"),
    ({**GOOD, "spec": {"egress": [{"from": []}]}}, "unknown field"),
    ({**GOOD, "spec": {"ingress": [{"from": {}}]}}, "spec.ingress[0].from"),
    ({**GOOD, "spec": {"ingress": [{"from": ["x"]}]}}, "peer must be an object"),
    ({**GOOD, "spec": {"ingress": [{"from": [{}]}]}}, "must set podSelector"),
    ({**GOOD, "spec": {"ingress": [{"from": [{"podSelecter": {}}]}]}}, "unknown field"),
    (
        {
            **GOOD,
            "spec": {
                "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]
            },
        },
        "cannot be combined",
    ),
    ({**GOOD, "spec": {"ingress": [{"from": [{"ipBlock": "10.0.0.0/8"}]}]}}, "ipBlock"),
    ({**GOOD, "spec": {"ingress": [{"from": [{"ipBlock": {}}]}]}}, "cidr"),
    ({**GOOD, "spec": {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0"}}]}]}}, "CIDR"),
    ({**GOOD, "spec": {"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]}}, "CIDR"),
    ({**GOOD, "spec": {"ingress": [{"from": [{"ipBlock": {"cidr": "nope/8"}}]}]}}, "CIDR"),
    ({**GOOD, "spec": {"ingress": [{"from": [{"ipBlock": {"cidr": 10}}]}]}}, "CIDR"),
    (
        {
            **GOOD,
            "spec": {
                "ingress": [
                    {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}}]}
                ]
            },
        },
        "strict subset",
    ),
    (
        {
            **GOOD,
            "spec": {
                "ingress": [
                    {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}]}
                ]
            },
        },
        "strict subset",
    ),
    (
        {
            **GOOD,
            "spec": {
                "ingress": [
                    {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::/16"]}}]}
                ]
            },
        },
        "strict subset",
    ),
    (
        {
            **GOOD,
            "spec": {
                "ingress": [
                    {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": "10.1.0.0/16"}}]}
                ]
            },
        },
        "except",
    ),
    ({**GOOD, "spec": {"ingress": [{"ports": {}}]}}, "ports"),
    ({**GOOD, "spec": {"ingress": [{"ports": [80]}]}}, "port must be an object"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"protocol": "ICMP"}]}]}}, "protocol"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"protocol": "tcp"}]}]}}, "protocol"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": 0}]}]}}, "1-65535"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": 65536}]}]}}, "1-65535"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": True}]}]}}, "1-65535"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": 80.5}]}]}}, "1-65535"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": "80"}]}]}}, "without quotes"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": "HTTP"}]}]}}, "port name"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": "a--b"}]}]}}, "port name"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": "-http"}]}]}}, "port name"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": "a" * 16}]}]}}, "port name"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": "http", "endPort": 90}]}]}}, "numeric"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"endPort": 90}]}]}}, "numeric"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": 90, "endPort": 80}]}]}}, "endPort"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": 90, "endPort": 70000}]}]}}, "endPort"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"port": 90, "endPort": "100"}]}]}}, "endPort"),
    ({**GOOD, "spec": {"ingress": [{"ports": [{"prot": "TCP"}]}]}}, "unknown field"),
    (
        {**GOOD, "spec": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}},
        "at least one value",
    ),
]


@pytest.mark.parametrize(("obj", "fragment"), MALFORMED)
def test_malformed_policies_raise_policy_error_with_a_useful_message(
    obj: Any, fragment: str
) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(obj)
    assert fragment in str(info.value)


def test_error_names_the_object_and_the_field() -> None:
    bad = np_dict("shop", "web", {"ingress": [{"ports": [{"port": 0}]}]})
    with pytest.raises(PolicyError) as info:
        parse_policy(bad)
    assert str(info.value).startswith("networkpolicy shop/web: spec.ingress[0].ports[0].port: ")
    assert info.value.obj == "networkpolicy shop/web"
    assert info.value.path == "spec.ingress[0].ports[0].port"


def _mutations(obj: Any) -> list[Any]:
    """Every JSON path in ``obj`` (to replace values at)."""
    paths: list[Any] = [()]
    if isinstance(obj, dict):
        for k, v in obj.items():
            paths += [(k, *p) for p in _mutations(v)]
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            paths += [(i, *p) for p in _mutations(v)]
    return paths


RICH = np_dict(
    "x",
    "rich",
    {
        "podSelector": {
            "matchLabels": {"a": "b"},
            "matchExpressions": [{"key": "c", "operator": "In", "values": ["d"]}],
        },
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [
                    {"podSelector": {}, "namespaceSelector": {"matchLabels": {"t": "1"}}},
                    {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
                ],
                "ports": [{"port": "http"}, {"port": 80, "endPort": 90, "protocol": "UDP"}],
            }
        ],
        "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"protocol": "SCTP"}]}],
    },
)
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70000),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_mutations(RICH)), JUNK)
def test_any_corrupted_field_gives_policy_error_or_a_policy(
    path: tuple[Any, ...], junk: Any
) -> None:
    obj = copy.deepcopy(RICH)
    if not path:
        obj = junk
    else:
        target = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = junk
    try:
        parse_policy(obj)
    except PolicyError as err:
        assert str(err)


# ------------------------------------------------------------ pods and namespaces


def test_pod_parsing() -> None:
    pod = parse_pod(
        pod_dict("x", "a", "10.0.0.7", {"app": "web"}, [("http", 8080, "TCP"), ("dns", 53, "UDP")])
    )
    assert pod.namespace == "x" and pod.name == "a" and pod.labels == {"app": "web"}
    assert pod.ips == (ipaddress.ip_address("10.0.0.7"),)
    assert pod.ports == (ContainerPort("http", 8080, "TCP"), ContainerPort("dns", 53, "UDP"))
    assert pod.named_port("http", "TCP") == 8080
    assert pod.named_port("http", "UDP") is None
    assert pod.named_port("dns", "UDP") == 53


def test_pod_dual_stack_finished_and_host_network() -> None:
    raw = pod_dict("x", "a", "10.0.0.7")
    raw["status"]["podIPs"] = [{"ip": "10.0.0.7"}, {"ip": "fd00::7"}]
    pod = parse_pod(raw)
    assert [str(ip) for ip in pod.ips_of(4)] == ["10.0.0.7"]
    assert [str(ip) for ip in pod.ips_of(6)] == ["fd00::7"]
    raw["status"]["phase"] = "Succeeded"
    assert parse_pod(raw).ips == ()
    host = parse_pod(pod_dict("x", "h", "172.18.0.2", host_network=True))
    assert host.ips and host.ips_of(4) == ()
    pending = pod_dict("x", "p", "10.0.0.1")
    pending["status"] = {"phase": "Pending"}
    assert parse_pod(pending).ips == ()


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda p: p["status"].update(podIPs=[{"ip": "10.0.0.999"}]), "not an IP"),
        (lambda p: p["status"].update(podIPs=[{"ip": 167772161}]), "not an IP"),
        (lambda p: p["status"].update(podIPs="10.0.0.1"), "status.podIPs"),
        (lambda p: p["metadata"].update(labels=["a"]), "metadata.labels"),
        (lambda p: p["metadata"].update(labels={"a": 1}), "string"),
        (lambda p: p["spec"].update(containers={}), "spec.containers"),
        (lambda p: p["spec"].update(containers=[{"ports": [{"containerPort": 0}]}]), "1-65535"),
        (
            lambda p: p["spec"].update(
                containers=[{"ports": [{"containerPort": 80, "protocol": "ICMP"}]}]
            ),
            "protocol",
        ),
        (lambda p: p["spec"].update(hostNetwork="yes"), "spec.hostNetwork"),
    ],
)
def test_malformed_pods_raise_policy_error(mutate: Any, fragment: str) -> None:
    raw = pod_dict("x", "a", "10.0.0.1", ports=[("http", 80, "TCP")])
    mutate(raw)
    with pytest.raises(PolicyError) as info:
        parse_pod(raw)
    assert fragment in str(info.value)
    assert str(info.value).startswith("pod x/a")


def test_namespace_always_has_its_name_label() -> None:
    ns = parse_namespace({"metadata": {"name": "shop", "labels": {"team": "a"}}})
    assert ns.labels == {"team": "a", "kubernetes.io/metadata.name": "shop"}
    assert parse_namespace(ns_dict("x")).labels == {"kubernetes.io/metadata.name": "x"}
    with pytest.raises(PolicyError):
        parse_namespace({"metadata": {"name": "x", "labels": "team=a"}})
    with pytest.raises(PolicyError):
        parse_namespace({"metadata": {}})


RICH_POD = pod_dict("x", "a", "10.0.0.1", {"app": "web"}, [("http", 80, "TCP"), ("dns", 53, "UDP")])
RICH_NS = ns_dict("x", {"team": "a"})


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(
        [(RICH_POD, p) for p in _mutations(RICH_POD)] + [(RICH_NS, p) for p in _mutations(RICH_NS)]
    ),
    JUNK,
)
def test_any_corrupted_pod_or_namespace_gives_policy_error_or_a_value(
    case: tuple[dict[str, Any], tuple[Any, ...]], junk: Any
) -> None:
    original, path = case
    obj: Any = copy.deepcopy(original)
    if not path:
        obj = junk
    else:
        target = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = junk
    parser = parse_pod if original is RICH_POD else parse_namespace
    try:
        parser(obj)
    except PolicyError as err:
        assert str(err)
