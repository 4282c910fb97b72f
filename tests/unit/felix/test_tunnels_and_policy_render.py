"""Pure parts of the agent's dataplane: which tunnels a node needs, the filter-table tree."""

from __future__ import annotations

from datastore.models import IPPool, IPPoolSpec, Meta
from felix.policy_dataplane import (
    FORWARD,
    FROM_DISPATCH,
    INPUT,
    TO_DISPATCH,
    dispatch_tree,
    render,
)
from felix.tunnels import needed_tunnels, vxlan_mac
from policy import desired_state, parse_pod, parse_policy


def _pool(**spec: object) -> IPPool:
    return IPPool(metadata=Meta(name="p"), spec=IPPoolSpec(cidr="10.244.0.0/16", **spec))  # type: ignore[arg-type]


def test_tunnels_follow_enabled_pools_only() -> None:
    assert needed_tunnels([_pool()]) == set()
    assert needed_tunnels([_pool(vxlan_mode="CrossSubnet")]) == {"vxlan"}
    assert needed_tunnels([_pool(ipip_mode="Always"), _pool(vxlan_mode="Always")]) == {
        "ipip",
        "vxlan",
    }
    assert needed_tunnels([_pool(vxlan_mode="Always", disabled=True)]) == set()


def test_vxlan_mac_is_stable_unicast_and_locally_administered() -> None:
    mac = vxlan_mac("node1")
    assert mac == vxlan_mac("node1") != vxlan_mac("node2")
    first = int(mac.split(":")[0], 16)
    assert first & 0x02 and not first & 0x01


def _pod(name: str, ip: str, labels: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "x", "labels": labels},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"podIP": ip},
    }


def test_render_dispatches_known_endpoints_and_fails_closed_for_unknown_ones() -> None:
    a = parse_pod(_pod("a", "10.244.0.1", {"app": "a"}))
    b = parse_pod(_pod("b", "10.244.0.2", {"app": "b"}))
    deny = parse_policy(
        {
            "metadata": {"name": "deny", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"app": "a"}}},
        }
    )
    local = {"caliaaaa": a, "calibbbb": b}
    state = render(desired_state([deny], [a, b], [], local), local, "DROP")

    from_wl = [r.args for r in state.chains[FROM_DISPATCH]]
    assert ("-i", "calia+", "-g", f"{FROM_DISPATCH}-a") in from_wl
    leaf = [r.args for r in state.chains[f"{FROM_DISPATCH}-a"]]
    assert leaf[0] == ("-i", "caliaaaa", "-g", "cali-fw-caliaaaa")
    for chain in (FROM_DISPATCH, f"{FROM_DISPATCH}-a", TO_DISPATCH, f"{TO_DISPATCH}-b"):
        # an unknown cali interface is dropped, in the root or in a leaf
        assert state.chains[chain][-1].args[-2:] == ("-j", "DROP")
    to_wl = [r.args for r in state.chains[f"{TO_DISPATCH}-b"]]
    assert ("-o", "calibbbb", "-g", "cali-tw-calibbbb") in to_wl
    assert state.hooks["FORWARD"][0].args == ("-j", FORWARD)
    assert state.hooks["INPUT"][0].args == ("-j", INPUT)
    assert state.chains[INPUT][0].args == ("-i", "cali+", "-g", "cali-wl-to-host")
    assert "cali-tw-caliaaaa" in state.chains and "cali-fw-calibbbb" in state.chains


def test_dispatch_tree_has_a_leaf_per_character_and_only_one_leaf_changes_per_endpoint() -> None:
    ifaces = [f"cali{c}{i:010x}" for c in "0123456789abcdef" for i in range(7)]
    tree = dispatch_tree(ifaces, "-i", "cali-fw-", FROM_DISPATCH)
    assert len(tree) == 17  # the root and 16 leaves
    assert len(tree[FROM_DISPATCH]) == 17  # 16 jumps and the drop
    assert all(len(tree[f"{FROM_DISPATCH}-{c}"]) == 8 for c in "0123456789abcdef")
    grown = dispatch_tree([*ifaces, "cali3ffffffffff"], "-i", "cali-fw-", FROM_DISPATCH)
    changed = {name for name in grown if grown[name] != tree.get(name)}
    assert changed == {f"{FROM_DISPATCH}-3"}
    odd = dispatch_tree(["cali-x", "eth9"], "-o", "cali-tw-", TO_DISPATCH)
    assert [r.args for r in odd[TO_DISPATCH]][:2] == [
        ("-o", "cali-x", "-g", "cali-tw-cali-x"),
        ("-o", "eth9", "-g", "cali-tw-eth9"),
    ]
    assert list(odd) == [TO_DISPATCH]
