"""The soak's generated policies: valid for the apiserver's schema, and they bite."""

from __future__ import annotations

from tests.soak.policies import POLICY_NAMES, TEAM_LABEL, TEAMS, namespace_labels, policy
from tests.truthtable.world import NAME_LABEL, NAMESPACES, World

PEER_KEYS = {"podSelector", "namespaceSelector"}


def _world() -> World:
    world = World.create(["node1", "node2", "node3"])
    for i, key in enumerate(sorted(world.pods)):
        world.set_ip(key, f"10.244.0.{i + 1}")
    return world


def test_the_same_seed_gives_the_same_policy() -> None:
    assert policy(42) == policy(42)
    assert len({str(policy(s)) for s in range(50)}) > 40


def test_policies_are_well_formed_networkpolicies() -> None:
    for seed in range(500):
        obj = policy(seed)
        meta, spec = obj["metadata"], obj["spec"]
        assert meta["namespace"] in NAMESPACES and meta["name"] in POLICY_NAMES
        assert spec["policyTypes"] in (["Ingress"], ["Egress"], ["Ingress", "Egress"])
        for direction, peers_key in (("ingress", "from"), ("egress", "to")):
            assert (direction in spec) == (direction.capitalize() in spec["policyTypes"])
            for rule in spec.get(direction, []):
                assert set(rule) <= {peers_key, "ports"}
                for peer in rule.get(peers_key, []):
                    assert peer and set(peer) <= PEER_KEYS
                for port in rule.get("ports", []):
                    assert port["protocol"] in ("TCP", "UDP")


def test_generated_policies_change_what_the_oracle_allows() -> None:
    """A generator whose policies select nothing would make a soak that proves nothing."""
    world = _world()
    open_before = sum(world.expected().values())
    changed = 0
    for seed in range(40):
        world.policies.clear()
        world.apply_policy(policy(seed))
        changed += sum(world.expected().values()) != open_before
    assert changed >= 30, changed


def test_relabels_toggle_the_team_label_and_never_touch_the_name_label() -> None:
    seen = set()
    labels = {NAME_LABEL: "x"}
    for seed in range(60):
        patch = namespace_labels(seed, labels)
        assert set(patch) == {TEAM_LABEL}
        assert patch[TEAM_LABEL] != labels.get(TEAM_LABEL)
        seen.add(patch[TEAM_LABEL])
        labels = {k: v for k, v in {**labels, **patch}.items() if v is not None}
        assert labels[NAME_LABEL] == "x"
    assert seen == {*TEAMS, None}
