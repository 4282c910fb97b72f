"""The incremental policy calculation equals the from-scratch one after any changes.

Random sequences of pod, namespace, policy, ClusterNetworkPolicy, Node and
local-endpoint changes go into a
:class:`PolicyCalculator` one at a time; at random points, and at the end, its
chains, set specs and members must equal :func:`policy.desired_state` computed from
everything that exists at that moment.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from felix.calc import PodKey, PolicyCalculator
from policy import (
    DesiredState,
    Namespace,
    NetworkPolicy,
    Pod,
    desired_state,
    make_namespace,
    make_pod,
    parse_namespace,
    parse_pod,
    parse_policy,
)
from policy.cluster_compiler import NodeAddresses, make_node
from policy.cluster_policy import ClusterNetworkPolicy, parse_cluster_policy
from tests.unit.policy.policy_world import np_dict, ns_dict, pod_dict
from tests.unit.policy.test_cluster_policy_properties import cluster_policy
from tests.unit.policy.test_policy_properties import (
    LABEL_VALUES,
    NAMED_PORTS,
    NS_NAMES,
    labels,
    policies,
    worlds,
)

POD_KEYS = [(ns, f"pod{i}") for ns in NS_NAMES for i in range(2)]
IFACES = ["cali0", "cali1", "cali2"]
ROLE_A = {"matchLabels": {"r": "a"}}
IPS = ["10.0.0.1", "10.0.0.2", "10.0.1.1", "10.0.2.1", "10.0.3.1"]  # shared now and then


@st.composite
def pod_change(draw: st.DrawFn) -> tuple[str, Any]:
    ns, name = draw(st.sampled_from(POD_KEYS))
    if draw(st.integers(0, 4)) == 0:
        return ("pod", ((ns, name), None))
    named = draw(NAMED_PORTS)
    ports = [(port_name, port, proto) for port_name, (proto, port) in named.items()]
    obj = pod_dict(ns, name, draw(st.sampled_from(IPS)), draw(labels), ports)
    if draw(st.integers(0, 6)) == 0:
        obj["spec"]["hostNetwork"] = True
    return ("pod", ((ns, name), parse_pod(obj)))


@st.composite
def namespace_change(draw: st.DrawFn) -> tuple[str, Any]:
    name = draw(st.sampled_from(NS_NAMES))
    if draw(st.integers(0, 4)) == 0:
        return ("namespace", (name, None))
    team = draw(st.dictionaries(st.just("team"), st.sampled_from(LABEL_VALUES)))
    return ("namespace", (name, parse_namespace(ns_dict(name, team))))


@st.composite
def policy_change(draw: st.DrawFn) -> tuple[str, Any]:
    obj = draw(policies(draw(st.integers(0, 3))))
    policy = parse_policy(obj)
    if draw(st.integers(0, 4)) == 0:
        return ("policy", (policy.key, None))
    return ("policy", (policy.key, policy))


@st.composite
def endpoint_change(draw: st.DrawFn) -> tuple[str, Any]:
    iface = draw(st.sampled_from(IFACES))
    pod = None if draw(st.integers(0, 4)) == 0 else draw(st.sampled_from(POD_KEYS))
    return ("endpoint", (iface, pod))


@st.composite
def cluster_policy_change(draw: st.DrawFn) -> tuple[str, Any]:
    policy = parse_cluster_policy(draw(cluster_policy(draw(st.integers(0, 2)))))
    if draw(st.integers(0, 4)) == 0:
        return ("cluster_policy", (policy.name, None))
    return ("cluster_policy", (policy.name, policy))


@st.composite
def nodes_change(draw: st.DrawFn) -> tuple[str, Any]:
    """The Nodes as a whole: 10.9.9.9 (a probed outside address) moves between them."""
    roles = draw(st.lists(st.sampled_from(["a", "b"]), min_size=0, max_size=2))
    nodes = tuple(make_node(f"n{i}", {"role": r}, [f"10.9.9.{9 + i}"]) for i, r in enumerate(roles))
    return ("nodes", (None, nodes))


# Weighted towards the cheap changes that move pods between sets.
CHANGES = st.sampled_from(range(9)).flatmap(
    lambda i: [
        pod_change(),
        pod_change(),
        namespace_change(),
        namespace_change(),
        policy_change(),
        endpoint_change(),
        cluster_policy_change(),
        cluster_policy_change(),
        nodes_change(),
    ][i]
)


class Everything:
    """What exists, for the from-scratch computation."""

    def __init__(self) -> None:
        self.pods: dict[PodKey, Pod] = {}
        self.namespaces: dict[str, Namespace] = {}
        self.policies: dict[str, NetworkPolicy] = {}
        self.endpoints: dict[str, PodKey] = {}
        self.cluster_policies: dict[str, ClusterNetworkPolicy] = {}
        self.nodes: tuple[NodeAddresses, ...] = ()

    def apply(self, calc: PolicyCalculator, change: tuple[str, Any]) -> None:
        kind, (key, value) = change
        if kind == "nodes":
            self.nodes = value
            calc.update_nodes(value)
            return
        table: dict[Any, Any] = {
            "pod": self.pods,
            "namespace": self.namespaces,
            "policy": self.policies,
            "endpoint": self.endpoints,
            "cluster_policy": self.cluster_policies,
        }[kind]
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
        getattr(calc, f"update_{kind}")(key, value)

    def from_scratch(self) -> DesiredState:
        local = {i: self.pods[k] for i, k in self.endpoints.items() if k in self.pods}
        return desired_state(
            self.policies.values(),
            self.pods.values(),
            self.namespaces.values(),
            local,
            cluster_policies=self.cluster_policies.values(),
            nodes=self.nodes,
        )


def assert_same(calc: PolicyCalculator, world: Everything) -> None:
    expected = world.from_scratch()
    got = calc.desired()
    assert dict(got.chains) == dict(expected.chains)
    assert dict(got.ipsets) == dict(expected.ipsets)
    assert dict(got.members) == dict(expected.members)
    local = {i: world.pods[k] for i, k in world.endpoints.items() if k in world.pods}
    assert dict(calc.local_pods()) == local


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(CHANGES, st.booleans()), min_size=1, max_size=60))
def test_incremental_equals_from_scratch_after_any_changes(
    changes: list[tuple[tuple[str, Any], bool]],
) -> None:
    calc, world = PolicyCalculator(), Everything()
    for change, check_now in changes:
        world.apply(calc, change)
        if check_now:
            assert_same(calc, world)
    assert_same(calc, world)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    worlds(focused=False),
    st.lists(st.one_of(namespace_change(), pod_change()), min_size=1, max_size=12),
)
def test_relabels_in_a_wired_world_keep_every_set_equal_to_from_scratch(
    world: tuple[list[Any], list[Any], list[Any]], changes: list[tuple[str, Any]]
) -> None:
    """Every pod wired here and policies in force: namespace and pod changes then
    move pods between sets (the case where a missed re-evaluation shows)."""
    pols, pods, namespaces = world
    calc, everything = PolicyCalculator(), Everything()
    for obj in namespaces:
        ns = parse_namespace(obj)
        everything.apply(calc, ("namespace", (ns.name, ns)))
    for obj in pols:
        policy = parse_policy(obj)
        everything.apply(calc, ("policy", (policy.key, policy)))
    for index, obj in enumerate(pods):
        pod = parse_pod(obj)
        everything.apply(calc, ("pod", ((pod.namespace, pod.name), pod)))
        everything.apply(calc, ("endpoint", (f"cali{index}", (pod.namespace, pod.name))))
    assert_same(calc, everything)
    for change in changes:
        everything.apply(calc, change)
        assert_same(calc, everything)


def test_a_pod_change_touches_only_the_sets_of_its_namespace_and_cluster_wide_ones() -> None:
    """The membership index re-evaluates a changed pod, not the cluster."""
    calc = PolicyCalculator()
    for ns in ("x", "y"):
        calc.update_namespace(ns, make_namespace(ns))
    policy = parse_policy(
        np_dict(
            "x",
            "allow-role-a",
            {
                "podSelector": {},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"r": "a"}}}]}],
            },
        )
    )
    calc.update_policy(policy.key, policy)
    calc.update_pod(("x", "server"), make_pod("x", "server", ips=["10.0.0.9"]))
    calc.update_endpoint("cali0", ("x", "server"))
    for i in range(200):
        calc.update_pod(
            ("y", f"bystander{i}"), make_pod("y", f"b{i}", ips=[f"10.1.{i // 250}.{i % 250 + 1}"])
        )
    (set_name,) = calc.desired().ipsets
    assert calc.desired().members[set_name] == frozenset()
    calc.members.take_changed()
    calc.update_pod(("x", "client"), make_pod("x", "client", labels={"r": "a"}, ips=["10.0.0.7"]))
    assert calc.members.take_changed() == {set_name}
    assert calc.desired().members[set_name] == {"10.0.0.7"}
    calc.update_pod(("y", "b3"), make_pod("y", "b3", labels={"r": "a"}, ips=["10.1.0.4"]))
    assert calc.members.take_changed() == set()  # a pod of y is never in x's set


def test_an_address_two_pods_claim_stays_until_both_are_gone() -> None:
    calc = PolicyCalculator()
    policy = parse_policy(
        np_dict("x", "p", {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]})
    )
    calc.update_policy(policy.key, policy)
    calc.update_pod(("x", "server"), make_pod("x", "server", ips=["10.0.0.9"]))
    calc.update_endpoint("cali0", ("x", "server"))
    calc.update_pod(("x", "old"), make_pod("x", "old", ips=["10.0.0.5"]))
    calc.update_pod(("x", "new"), make_pod("x", "new", ips=["10.0.0.5"]))
    (set_name,) = calc.desired().ipsets
    calc.update_pod(("x", "old"), None)
    assert "10.0.0.5" in calc.desired().members[set_name]
    calc.update_pod(("x", "new"), None)
    assert calc.desired().members[set_name] == {"10.0.0.9"}


def test_a_policy_no_local_pod_uses_costs_no_chain_and_no_set() -> None:
    calc = PolicyCalculator()
    policy = parse_policy(
        np_dict("x", "p", {"podSelector": {"matchLabels": {"app": "db"}}, "ingress": []})
    )
    calc.update_policy(policy.key, policy)
    calc.update_pod(("x", "web"), make_pod("x", "web", labels={"app": "web"}, ips=["10.0.0.2"]))
    calc.update_endpoint("cali0", ("x", "web"))
    assert not any(name.startswith("cali-pi-") for name in calc.desired().chains)
    calc.update_pod(("x", "web"), make_pod("x", "web", labels={"app": "db"}, ips=["10.0.0.2"]))
    assert any(name.startswith("cali-pi-") for name in calc.desired().chains)
    calc.update_endpoint("cali0", None)
    assert calc.desired().chains == {}


def test_a_namespace_relabel_moves_its_pods_in_and_out_of_namespace_selected_sets() -> None:
    calc = PolicyCalculator()
    peer = {"namespaceSelector": {"matchLabels": {"team": "a"}}}
    policy = parse_policy(np_dict("x", "p", {"podSelector": {}, "ingress": [{"from": [peer]}]}))
    calc.update_policy(policy.key, policy)
    calc.update_pod(("x", "server"), make_pod("x", "server", ips=["10.0.0.9"]))
    calc.update_endpoint("cali0", ("x", "server"))
    calc.update_pod(("y", "client"), make_pod("y", "client", ips=["10.0.1.1"]))
    (set_name,) = calc.desired().ipsets
    assert calc.desired().members[set_name] == frozenset()
    calc.update_namespace("y", make_namespace("y", {"team": "a"}))
    assert calc.desired().members[set_name] == {"10.0.1.1"}
    calc.update_namespace("y", None)
    assert calc.desired().members[set_name] == frozenset()
