"""Seeded NetworkPolicies and namespace labels over the truth-table world.

Pure. The policies name the world's labels (``pod: a|b|c`` on pods, the automatic
name label and the soak's ``team`` label on namespaces), its ports (80, 81, the
named ``serve-*`` ports and the per-pod ``alt``) and its protocols, so that every
one of them selects something the probes see. A handful of names per namespace
means most applies edit a policy that exists.
"""

from __future__ import annotations

import random
from typing import Any

from tests.truthtable.world import NAME_LABEL, NAMESPACES, POD_NAMES, PORTS

POLICY_NAMES = ("soak-1", "soak-2", "soak-3")
TEAM_LABEL = "team"
TEAMS = ("red", "blue")
PROTOCOLS = ("TCP", "UDP")  # SCTP cells are probed too; rules on it stay for the truth table

Obj = dict[str, Any]


def policy(seed: int) -> Obj:
    """A NetworkPolicy in one of the world's namespaces, named from :data:`POLICY_NAMES`."""
    rng = random.Random(seed)
    namespace = rng.choice(NAMESPACES)
    types = rng.choice((["Ingress"], ["Egress"], ["Ingress", "Egress"]))
    spec: Obj = {"podSelector": _pod_selector(rng, allow_empty=True), "policyTypes": types}
    if "Ingress" in types:
        spec["ingress"] = [_rule(rng, "from") for _ in range(rng.randint(0, 2))]
    if "Egress" in types:
        spec["egress"] = [_rule(rng, "to") for _ in range(rng.randint(0, 2))]
    meta = {"namespace": namespace, "name": rng.choice(POLICY_NAMES)}
    return {"metadata": meta, "spec": spec}


def namespace_labels(seed: int, current: dict[str, str]) -> dict[str, str | None]:
    """A patch of the ``team`` label: set, changed, or removed (never the name label)."""
    rng = random.Random(seed)
    choices: list[str | None] = [t for t in TEAMS if t != current.get(TEAM_LABEL)]
    if TEAM_LABEL in current:
        choices.append(None)
    return {TEAM_LABEL: rng.choice(choices)}


def _pod_selector(rng: random.Random, *, allow_empty: bool) -> Obj:
    roll = rng.random()
    if allow_empty and roll < 0.3:
        return {}
    if roll < 0.7:
        return {"matchLabels": {"pod": rng.choice(POD_NAMES)}}
    values = rng.sample(POD_NAMES, rng.randint(1, 2))
    operator = rng.choice(("In", "NotIn"))
    return {"matchExpressions": [{"key": "pod", "operator": operator, "values": values}]}


def _namespace_selector(rng: random.Random) -> Obj:
    roll = rng.random()
    if roll < 0.2:
        return {}
    if roll < 0.6:
        return {"matchLabels": {NAME_LABEL: rng.choice(NAMESPACES)}}
    return {"matchLabels": {TEAM_LABEL: rng.choice(TEAMS)}}


def _peer(rng: random.Random) -> Obj:
    roll = rng.random()
    if roll < 0.35:
        return {"podSelector": _pod_selector(rng, allow_empty=True)}
    if roll < 0.65:
        return {"namespaceSelector": _namespace_selector(rng)}
    return {
        "namespaceSelector": _namespace_selector(rng),
        "podSelector": _pod_selector(rng, allow_empty=False),
    }


def _port(rng: random.Random) -> Obj:
    protocol = rng.choice(PROTOCOLS)
    roll = rng.random()
    if roll < 0.5:
        return {"protocol": protocol, "port": rng.choice(PORTS)}
    if roll < 0.75:
        port = rng.choice(PORTS)
        return {"protocol": protocol, "port": f"serve-{port}-{protocol.lower()}"}
    if roll < 0.85:
        return {"protocol": "TCP", "port": "alt"}
    return {"protocol": protocol}


def _rule(rng: random.Random, peers_key: str) -> Obj:
    rule: Obj = {}
    if rng.random() < 0.8:
        rule[peers_key] = [_peer(rng) for _ in range(rng.randint(1, 2))]
    if rng.random() < 0.6:
        rule["ports"] = [_port(rng) for _ in range(rng.randint(1, 2))]
    return rule
