"""Property tests: for random namespaces, pods and policies, the compiled
chains (run by the simulator over the computed ipset members) give the same
verdict as the independent oracle for every pair of endpoints and probe."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy import compile_policy, parse_policy
from tests.unit.policy.policy_world import World, np_dict, ns_dict, pod_dict

NS_NAMES = ["x", "y", "z"]
LABEL_KEYS = ["pod", "role"]
LABEL_VALUES = ["a", "b", "c"]
PORT_NAMES = ["http", "dns", "metrics"]
PROTOCOLS = ["TCP", "UDP", "SCTP"]
PORTS = [53, 80, 81]
EXTERNALS = ["192.168.7.7", "10.9.9.9"]
PROBES = [("TCP", 80), ("TCP", 81), ("UDP", 53), ("UDP", 80), ("SCTP", 81)]

labels = st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES), max_size=2)


@st.composite
def selectors(draw: st.DrawFn, keys: list[str] = LABEL_KEYS) -> dict[str, Any]:
    """Empty, one matchLabels term, one expression, or both (rarely
    contradictory, so that most policies select some pods)."""
    kind = draw(st.sampled_from(["empty", "labels", "expr", "expr", "both"]))
    out: dict[str, Any] = {}
    if kind in ("labels", "both"):
        out["matchLabels"] = {draw(st.sampled_from(keys)): draw(st.sampled_from(LABEL_VALUES))}
    if kind in ("expr", "both"):
        op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
        expr: dict[str, Any] = {"key": draw(st.sampled_from(keys)), "operator": op}
        if op in ("In", "NotIn"):
            expr["values"] = draw(st.lists(st.sampled_from(LABEL_VALUES), min_size=1, max_size=2))
        out["matchExpressions"] = [expr]
    return out


POD_SELECTORS = selectors()
TEAM_SELECTORS = selectors(keys=["team"])


@st.composite
def ns_selectors(draw: st.DrawFn) -> dict[str, Any]:
    """Namespace selectors, including on the automatic name label."""
    if draw(st.booleans()):
        return {"matchLabels": {"kubernetes.io/metadata.name": draw(st.sampled_from(NS_NAMES))}}
    return draw(TEAM_SELECTORS)


@st.composite
def ip_blocks(draw: st.DrawFn) -> dict[str, Any]:
    """CIDRs around the pod range, sometimes non-canonical, with excepts inside."""
    if draw(st.integers(0, 9)) == 0:
        return {"cidr": "fd00::/8"}
    prefix = draw(st.sampled_from([0, 8, 16, 24, 32]))
    host = f"10.0.{draw(st.integers(0, 3))}.{draw(st.integers(1, 4))}"
    block: dict[str, Any] = {"cidr": f"{host}/{prefix}" if prefix else "0.0.0.0/0"}
    if prefix < 32 and draw(st.booleans()):
        excepts = []
        for _ in range(draw(st.integers(1, 2))):
            eprefix = draw(st.sampled_from([p for p in (16, 24, 30, 32) if p > prefix]))
            ehost = f"10.0.{draw(st.integers(0, 3))}.{draw(st.integers(1, 4))}"
            if prefix == 0 or ehost.split(".")[: prefix // 8] == host.split(".")[: prefix // 8]:
                excepts.append(f"{ehost}/{eprefix}")
        if excepts:
            block["except"] = excepts
    return block


NS_SELECTORS = ns_selectors()
IP_BLOCKS = ip_blocks()


@st.composite
def peers(draw: st.DrawFn) -> dict[str, Any]:
    """podSelector, namespaceSelector, both, or an ipBlock."""
    kind = draw(st.sampled_from(["pod", "ns", "both", "ip"]))
    if kind == "ip":
        return {"ipBlock": draw(IP_BLOCKS)}
    peer: dict[str, Any] = {}
    if kind in ("pod", "both"):
        peer["podSelector"] = draw(POD_SELECTORS)
    if kind in ("ns", "both"):
        peer["namespaceSelector"] = draw(NS_SELECTORS)
    return peer


@st.composite
def ports(draw: st.DrawFn) -> dict[str, Any]:
    """Protocol (maybe defaulted) with no port, a number, a range or a name."""
    port: dict[str, Any] = {}
    if draw(st.booleans()):
        port["protocol"] = draw(st.sampled_from(PROTOCOLS))
    kind = draw(st.sampled_from(["none", "number", "range", "name"]))
    if kind == "number":
        port["port"] = draw(st.sampled_from(PORTS))
    elif kind == "range":
        start = draw(st.sampled_from(PORTS))
        port["port"], port["endPort"] = start, draw(st.integers(start, 90))
    elif kind == "name":
        port["port"] = draw(st.sampled_from(PORT_NAMES))
    return port


PORT_LISTS = st.lists(ports(), min_size=1, max_size=2)
PEER_LISTS = st.lists(peers(), min_size=1, max_size=2)


@st.composite
def rules(draw: st.DrawFn, peer_key: str) -> dict[str, Any]:
    """A rule whose ports/peers may be absent, empty or populated."""
    rule: dict[str, Any] = {}
    for key, strategy in (("ports", PORT_LISTS), (peer_key, PEER_LISTS)):
        shape = draw(st.sampled_from(["absent", "empty", "some"]))
        if shape == "empty":
            rule[key] = []
        elif shape == "some":
            rule[key] = draw(strategy)
    return rule


RULE_LISTS = {k: st.lists(rules(k), min_size=1, max_size=2) for k in ("from", "to")}
SINGLE_PORT = st.lists(ports(), min_size=1, max_size=1)
SINGLE_PEER = st.lists(peers(), min_size=1, max_size=1)


@st.composite
def policies(draw: st.DrawFn, index: int) -> dict[str, Any]:
    """A policy with every combination of policyTypes and rule shapes."""
    spec: dict[str, Any] = {"podSelector": draw(POD_SELECTORS)}
    types = draw(st.sampled_from([None, [], ["Ingress"], ["Egress"], ["Ingress", "Egress"]]))
    if types is not None:
        spec["policyTypes"] = types
    for key, peer_key in (("ingress", "from"), ("egress", "to")):
        shape = draw(st.sampled_from(["absent", "empty", "some", "some"]))
        if shape == "empty":
            spec[key] = []
        elif shape == "some":
            spec[key] = draw(RULE_LISTS[peer_key])
    return np_dict(draw(st.sampled_from(NS_NAMES)), f"p{index}", spec)


@st.composite
def focused_policies(draw: st.DrawFn) -> dict[str, Any]:
    """One direction, one rule, at most one peer and one port: every verdict
    that isolation makes depends on that single peer/port pair, so mistakes
    in any one feature show up in many probes."""
    key, peer_key, ptype = draw(
        st.sampled_from([("ingress", "from", "Ingress"), ("egress", "to", "Egress")])
    )
    # Mostly one port and one peer; sometimes "any" (an empty list).
    rule = {
        "ports": draw(SINGLE_PORT) if draw(st.integers(0, 4)) else [],
        peer_key: draw(SINGLE_PEER) if draw(st.integers(0, 4)) else [],
    }
    spec = {"podSelector": draw(POD_SELECTORS), "policyTypes": [ptype], key: [rule]}
    return np_dict(draw(st.sampled_from(NS_NAMES)), "focused", spec)


@st.composite
def worlds(draw: st.DrawFn, focused: bool) -> tuple[list[Any], list[Any], list[Any]]:
    """Namespaces, 2-5 pods with named ports, 1-3 policies (1 when focused)."""
    namespaces = [
        ns_dict(n, draw(st.dictionaries(st.just("team"), st.sampled_from(LABEL_VALUES))))
        for n in NS_NAMES
    ]
    pods = []
    for i in range(draw(st.integers(2, 5))):
        named = draw(NAMED_PORTS)
        pods.append(
            pod_dict(
                draw(st.sampled_from(NS_NAMES)),
                f"pod{i}",
                f"10.0.{i % 4}.{i // 4 + 1}",
                draw(labels),
                [(name, port, proto) for name, (proto, port) in named.items()],
            )
        )
    if focused:
        return [draw(focused_policies())], pods, namespaces
    pols = [draw(policies(i)) for i in range(draw(st.integers(1, 3)))]
    return pols, pods, namespaces


# Named ports map to probed (protocol, port) pairs so that they can matter.
NAMED_PORTS = st.dictionaries(st.sampled_from(PORT_NAMES), st.sampled_from(PROBES), max_size=2)


def check_all_pairs(world: tuple[list[Any], list[Any], list[Any]]) -> None:
    """Every ordered pair of distinct endpoints, every probe: simulator == oracle."""
    pols, pods, namespaces = world
    check_every_pair(World(pols, pods, namespaces), pods, EXTERNALS)


def check_every_pair(w: World, pods: list[Any], outside: list[str]) -> None:
    """Every referenced chain and set exists; then for every ordered pair of distinct
    endpoints (pods, and addresses ``outside`` them) and every probe, the chains, the
    oracle and the explanation agree (:meth:`World.verdict`)."""
    for chain in w.state.chains.values():
        assert chain.jump_targets() <= set(w.state.chains)
        for rule in chain.rules:
            sets = [rule.match[i + 1] for i, t in enumerate(rule.match) if t == "--match-set"]
            assert set(sets) <= set(w.state.ipsets)
    names = [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods]
    for src in names + outside:
        for dst in names + outside:
            if src == dst or (src in outside and dst in outside):
                continue
            for proto, port in PROBES:
                w.verdict(src, dst, proto, port)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(focused=False))
def test_compiled_chains_agree_with_oracle(world: tuple[list[Any], list[Any], list[Any]]) -> None:
    check_all_pairs(world)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(focused=True))
def test_single_rule_policies_agree_with_oracle(
    world: tuple[list[Any], list[Any], list[Any]],
) -> None:
    check_all_pairs(world)


@settings(max_examples=150, deadline=None)
@given(policies(0))
def test_compiling_twice_is_identical_and_names_fit(raw: dict[str, Any]) -> None:
    for _ in range(1):
        first, second = compile_policy(parse_policy(raw)), compile_policy(parse_policy(raw))
        assert first == second
        hashes = [[r.hash for r in c.rules] for c in first.chains]
        assert hashes == [[r.hash for r in c.rules] for c in second.chains]
        assert all(len(c.name) <= 28 for c in first.chains)
        assert all(len(s.name) <= 31 for s in first.ipsets)
