"""Issue 20, bad input: generated IPPools, BGPPeers and BGPConfigurations against the
real kube-apiserver with Tabby's CRDs (and the pool-overlap admission policy), and
the odd NetworkPolicies of tests/unit/policy/test_odd_policies.py, which it accepts.

Each generated object is created through the apiserver. Rejected: the error must
name the field it is about (``spec.<field>``), or the rule it broke, and nothing is
stored. Accepted: the agent's readers must take it without failing in a way they do
not report: the typed model parses it, and what the agent then computes from it
(which tunnels a pool needs, its node selector; the BGP plan of a node that has a
peer or a configuration like it) runs to the end, with at most a reported problem.
Every accepted object is deleted again. The counts are printed (``-s``) and recorded
in docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bgp.annotations import IPV4_ADDRESS
from bgp.config import compute_plan
from datastore import kinds
from datastore.client import Datastore
from datastore.errors import DatastoreError, NotFound
from datastore.models import BGPConfiguration, BGPPeer, IPPool
from felix.tunnels import needed_tunnels
from ipam.selector import SelectorError, parse_selector
from policy import parse_policy
from tests.unit.policy.policy_world import np_dict
from tests.unit.policy.test_odd_policies import ODD_POLICIES

pytestmark = pytest.mark.integration

TEXT = st.text(max_size=30) | st.sampled_from(["", " ", "all()", "has(x", "x == ", "!!", "a/b"])
ANY = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | TEXT
NODES = [
    {"metadata": {"name": n, "labels": {"rack": n}, "annotations": {IPV4_ADDRESS: ip}}}
    for n, ip in (("n1", "172.31.9.1/24"), ("n2", "172.31.9.2/24"))
]


def mostly(valid: st.SearchStrategy[Any], junk: st.SearchStrategy[Any] = ANY) -> Any:
    """Seven draws in eight from ``valid``: enough objects pass to exercise the readers."""
    return st.sampled_from(range(8)).flatmap(lambda i: junk if i == 7 else valid)


CIDRS = ["10.201.0.0/16", "10.202.0.0/20", "10.203.64.0/18", "10.204.8.0/24", "10.205.0.0/26"]
JUNK_CIDRS = ["10.201.0.1/16", "0.0.0.0/0", "127.0.0.0/8", "fd00::/64", "10.1.0.0/33", "nope"]
SELECTORS = ["all()", "", "has(rack)", "rack == 'n1'", "rack in {'n1', 'n2'}", "!has(x)"]
POOL_SPEC = st.fixed_dictionaries(
    {"cidr": mostly(st.sampled_from(CIDRS), st.sampled_from(JUNK_CIDRS) | ANY)},
    optional={
        "blockSize": mostly(st.integers(26, 32), st.integers(-1, 40) | ANY),
        "ipipMode": mostly(st.sampled_from(["Never", "Always", "CrossSubnet"])),
        "vxlanMode": mostly(st.just("Never"), st.sampled_from(["Always", "CrossSubnet"]) | ANY),
        "natOutgoing": mostly(st.booleans()),
        "disabled": mostly(st.booleans()),
        "nodeSelector": mostly(st.sampled_from(SELECTORS), TEXT),
    },
)
PEER_IPS = ["172.31.9.9", "172.31.9.9:1179", "10.0.0.1"]
PEER_SPEC = st.one_of(
    st.fixed_dictionaries(  # an explicit peer
        {
            "peerIP": mostly(
                st.sampled_from(PEER_IPS), st.sampled_from(["1.2.3.4:0", "::1"]) | TEXT
            ),
            "asNumber": mostly(st.sampled_from([64512, 65000, 4200000000]), st.integers(-1, 2**33)),
        },
        optional={
            "node": mostly(st.sampled_from(["n1", "n2"]), TEXT),
            "nodeSelector": mostly(st.sampled_from(SELECTORS), TEXT),
            "sourceAddress": mostly(st.sampled_from(["UseNodeIP", "None"]), TEXT),
        },
    ),
    st.fixed_dictionaries(  # other nodes, by selector (route reflectors)
        {"peerSelector": mostly(st.sampled_from(SELECTORS), TEXT)},
        optional={
            "nodeSelector": mostly(st.sampled_from(SELECTORS), TEXT),
            "peerIP": ANY,
            "asNumber": ANY,
        },
    ),
)
CONFIG_SPEC = st.fixed_dictionaries(
    {},
    optional={
        "asNumber": mostly(st.sampled_from([64512, 65000, 1, 4294967295]), st.integers(-1, 2**33)),
        "nodeToNodeMeshEnabled": mostly(st.booleans()),
        "listenPort": mostly(st.sampled_from([179, 1179, 65535]), st.integers(-1, 70_000)),
        "logSeverityScreen": mostly(st.sampled_from(["Debug", "Info", "Warning", "Error"]), TEXT),
    },
)


def _pool_consumers(raw: dict[str, Any]) -> None:
    pool = IPPool.from_wire(raw)
    needed_tunnels([pool])
    ipaddress.ip_network(pool.spec.cidr)
    with contextlib.suppress(SelectorError):  # reported by the agent, pool unused
        parse_selector(pool.spec.node_selector)


def _peer_consumers(raw: dict[str, Any]) -> None:
    peer = BGPPeer.from_wire(raw)
    for node in ("n1", "n2"):
        compute_plan(None, NODES, [peer], node)


def _config_consumers(raw: dict[str, Any]) -> None:
    config = BGPConfiguration.from_wire(raw)
    compute_plan(config, NODES, [], "n1")


CASES: list[tuple[kinds.ResourceKind, st.SearchStrategy[Any], Callable[[dict[str, Any]], None]]] = [
    (kinds.IPPOOL, POOL_SPEC, _pool_consumers),
    (kinds.BGPPEER, PEER_SPEC, _peer_consumers),
    (kinds.BGPCONFIGURATION, CONFIG_SPEC, _config_consumers),
]
COUNTS: Counter[str] = Counter()
CHECKS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


@pytest.mark.parametrize(("kind", "specs", "consume"), CASES, ids=[c[0].kind for c in CASES])
def test_generated_objects_are_refused_by_field_or_usable_by_the_agent(
    datastore: Datastore,
    kind: kinds.ResourceKind,
    specs: st.SearchStrategy[Any],
    consume: Callable[[dict[str, Any]], None],
) -> None:
    name = "default" if kind is kinds.BGPCONFIGURATION else f"tbt-corpus-{kind.plural}"

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=CHECKS)
    @given(specs)
    def one(spec: dict[str, Any]) -> None:
        body = {"apiVersion": "crd.tabby.dev/v1", "kind": kind.kind, "metadata": {"name": name}}
        COUNTS[f"{kind.kind} tried"] += 1
        try:
            stored = datastore.create_raw(kind, {**body, "spec": spec})
        except DatastoreError as exc:
            assert exc.status in (0, 400, 422), exc  # 0: refused before sending (NaN)
            message = str(exc)
            assert "spec" in message or "denied" in message, message
            with pytest.raises(NotFound):
                datastore.get_raw(kind, name)
            COUNTS[f"{kind.kind} rejected"] += 1
            return
        try:
            consume(stored)
            COUNTS[f"{kind.kind} accepted and used"] += 1
        finally:
            datastore.delete_raw(kind, name)

    with contextlib.suppress(NotFound):
        datastore.delete_raw(kind, name)
    one()
    print(f"\n{kind.kind}: {dict(sorted(c for c in COUNTS.items() if c[0].startswith(kind.kind)))}")
    assert COUNTS[f"{kind.kind} tried"] >= 150
    assert COUNTS[f"{kind.kind} rejected"] > 0 and COUNTS[f"{kind.kind} accepted and used"] > 0


@pytest.mark.parametrize("name", sorted(ODD_POLICIES))
def test_the_odd_policies_are_ones_the_apiserver_accepts(datastore: Datastore, name: str) -> None:
    """What tests/unit/policy/test_odd_policies.py compiles is what a user can create."""
    body = np_dict("default", f"tbt-odd-{name}", ODD_POLICIES[name])
    stored = datastore.create_raw(kinds.NETWORKPOLICY, body)
    try:
        assert stored["spec"]["podSelector"] == ODD_POLICIES[name]["podSelector"]
        assert parse_policy(stored).key == f"default/tbt-odd-{name}"
    finally:
        datastore.delete_raw(kinds.NETWORKPOLICY, f"tbt-odd-{name}", "default")
