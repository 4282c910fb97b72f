"""Property tests for ClusterNetworkPolicy tiers: for random namespaces, pods,
NetworkPolicies and ClusterNetworkPolicies (both tiers, every action, every peer kind,
ties of priority), the compiled chains run by the simulator give the oracle's verdict
for every pair of endpoints and probe."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy.cluster_compiler import compile_cluster_policy
from policy.cluster_policy import parse_cluster_policy
from tests.unit.policy.policy_world import World
from tests.unit.policy.test_policy_properties import (
    EXTERNALS,
    NS_SELECTORS,
    POD_SELECTORS,
    PORT_NAMES,
    PROBES,
    check_every_pair,
    worlds,
)

# 10.9.9.9 (one of the probed outside addresses) is a Node's, so `nodes` peers matter.
NODES = [
    {"metadata": {"name": "n1", "labels": {"role": "a"}},
     "status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"},
                              {"type": "Hostname", "address": "n1"}]}},
    {"metadata": {"name": "n2", "labels": {"role": "b"}},
     "status": {"addresses": [{"type": "InternalIP", "address": "172.31.0.12"}]}},
]  # fmt: skip
OUTSIDE = [*EXTERNALS, "172.31.0.12"]  # n2's address too
NETWORKS = ["10.0.0.0/16", "10.0.1.0/24", "10.0.2.1/32", "0.0.0.0/0", "10.9.9.9/32", "fd00::/8"]
HAS_ROLE = {"matchExpressions": [{"key": "role", "operator": "Exists"}]}
NODE_SELECTORS = st.sampled_from([{}, {"matchLabels": {"role": "a"}}, HAS_ROLE])


def pod_peer(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        return {"namespaces": draw(NS_SELECTORS)}
    pods: dict[str, Any] = {"podSelector": draw(POD_SELECTORS)}
    if draw(st.booleans()):
        pods["namespaceSelector"] = draw(NS_SELECTORS)
    return {"pods": pods}


@st.composite
def peer(draw: st.DrawFn, direction: str) -> dict[str, Any]:
    """Mostly pod peers; for egress also networks and nodes; rarely a peer Tabby does
    not implement (domainNames) or does not know (fails closed)."""
    kind = draw(st.sampled_from(range(10)))
    if kind == 9:
        return {"serviceAccounts": {"names": ["x"]}}
    if direction == "egress" and kind == 8:
        return {"domainNames": ["example.com"]}
    if direction == "egress" and kind in (5, 6):
        return {"networks": draw(st.lists(st.sampled_from(NETWORKS), min_size=1, max_size=2,
                                          unique=True))}  # fmt: skip
    if direction == "egress" and kind == 7:
        return {"nodes": draw(NODE_SELECTORS)}
    return pod_peer(draw)


@st.composite
def protocol(draw: st.DrawFn, named: bool) -> dict[str, Any]:
    proto, port = draw(st.sampled_from(PROBES))
    kind = draw(st.sampled_from(["number", "range", "named"] if named else ["number", "range"]))
    if kind == "named":
        return {"destinationNamedPort": draw(st.sampled_from(PORT_NAMES))}
    if kind == "range":
        start = draw(st.sampled_from([port - 1, port]))
        return {proto.lower(): {"destinationPort": {"range": {"start": start, "end": start + 1}}}}
    return {proto.lower(): {"destinationPort": {"number": port}}}


@st.composite
def cnp_rule(draw: st.DrawFn, direction: str) -> dict[str, Any]:
    peer_key = "from" if direction == "ingress" else "to"
    peers = draw(st.lists(peer(direction), min_size=1, max_size=2))
    rule: dict[str, Any] = {"action": draw(st.sampled_from(["Accept", "Deny", "Pass"])),
                            peer_key: peers}  # fmt: skip
    named_ok = not any(set(p) & {"networks", "nodes", "domainNames"} for p in peers)
    if draw(st.booleans()):
        rule["protocols"] = draw(st.lists(protocol(named_ok), min_size=1, max_size=2))
    return rule


@st.composite
def cluster_policy(draw: st.DrawFn, index: int) -> dict[str, Any]:
    subject = (
        {"namespaces": draw(NS_SELECTORS)}
        if draw(st.booleans())
        else {"pods": {"namespaceSelector": draw(NS_SELECTORS), "podSelector": draw(POD_SELECTORS)}}
    )
    spec: dict[str, Any] = {
        "tier": draw(st.sampled_from(["Admin", "Baseline"])),
        "priority": draw(st.integers(0, 2)),  # ties are frequent: the order by name is tested
        "subject": subject,
    }
    for direction in ("ingress", "egress"):
        if draw(st.sampled_from(range(4))):
            spec[direction] = draw(st.lists(cnp_rule(direction), min_size=1, max_size=3))
    return {"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": f"cnp{index}"}, "spec": spec}  # fmt: skip


@st.composite
def tiered_worlds(draw: st.DrawFn) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """A world of tests/unit/policy/test_policy_properties.py (its NetworkPolicies
    dropped now and then) with 1-3 ClusterNetworkPolicies."""
    nps, pods, namespaces = draw(worlds(focused=False))
    if draw(st.booleans()):
        nps = nps[:1] if draw(st.booleans()) else []
    cnps = [draw(cluster_policy(i)) for i in range(draw(st.integers(1, 3)))]
    return nps, pods, namespaces, cnps


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiered_worlds())
def test_tiered_chains_agree_with_the_oracle(
    world: tuple[list[Any], list[Any], list[Any], list[Any]],
) -> None:
    nps, pods, namespaces, cnps = world
    w = World(nps, pods, namespaces, cluster_policies=cnps, nodes=NODES)
    check_every_pair(w, pods, OUTSIDE)


@settings(max_examples=100, deadline=None)
@given(cluster_policy(0))
def test_compiling_twice_is_identical_and_names_fit(raw: dict[str, Any]) -> None:
    policy = parse_cluster_policy(raw)
    first, second = compile_cluster_policy(policy), compile_cluster_policy(policy)
    assert first == second
    assert all(len(c.name) <= 28 for c in first.chains)
    assert all(len(s.name) <= 31 for s in first.ipsets)
