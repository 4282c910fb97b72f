"""natOutgoing as a pure function: which pools are masqueraded, to where."""

from __future__ import annotations

from felix.nat_outgoing import ALL_POOLS, MASQ_POOLS, NAT_OUTGOING, POSTROUTING, PoolNat, nat_state


def test_only_natoutgoing_pools_are_masqueraded_and_never_towards_a_pool() -> None:
    state = nat_state([PoolNat("10.244.0.0/16", True), PoolNat("10.245.0.5/16", False)])
    assert state.ipsets[MASQ_POOLS] == ("hash:net", frozenset({"10.244.0.0/16"}))
    assert state.ipsets[ALL_POOLS] == ("hash:net", frozenset({"10.244.0.0/16", "10.245.0.0/16"}))
    (rule,) = state.chains[NAT_OUTGOING]
    assert rule.args == (
        "-m", "set", "--match-set", MASQ_POOLS, "src",
        "-m", "set", "!", "--match-set", ALL_POOLS, "dst",
        "-j", "MASQUERADE",
    )  # fmt: skip
    assert [r.args for r in state.chains[POSTROUTING]] == [("-j", NAT_OUTGOING)]
    assert [r.args for r in state.hooks["POSTROUTING"]] == [("-j", POSTROUTING)]


def test_without_a_natoutgoing_pool_there_is_no_masquerade_rule() -> None:
    state = nat_state([PoolNat("10.244.0.0/16", False)])
    assert state.chains[NAT_OUTGOING] == ()
    assert state.ipsets[MASQ_POOLS] == ("hash:net", frozenset())
    assert nat_state([]).chains[NAT_OUTGOING] == ()


def test_ipv6_pools_are_left_to_an_ipv6_table() -> None:
    state = nat_state([PoolNat("fd00:10::/64", True)])
    assert state.chains[NAT_OUTGOING] == ()
    assert state.ipsets[ALL_POOLS] == ("hash:net", frozenset())
