"""IpsetManager and the two-phase apply order against the stateful fake kernel."""

from __future__ import annotations

import pytest

from felix.dataplane import apply_in_order
from felix.dataplane.backend import NFT
from felix.dataplane.ipsets import IpsetError, IpsetManager, normalize_members
from felix.dataplane.iptables import Rule, Table
from tests.unit.dataplane.fake_kernel import FakeKernel

SET = "cali40s:web"


@pytest.fixture
def kernel() -> FakeKernel:
    return FakeKernel()


@pytest.fixture
def ipsets(kernel: FakeKernel) -> IpsetManager:
    return IpsetManager(kernel, small_change=4, sleep=lambda _s: None)


def test_new_set_is_created_with_its_members(kernel: FakeKernel, ipsets: IpsetManager) -> None:
    ipsets.set_members(SET, "hash:ip", ["10.0.0.1", "10.0.0.2"])

    result = ipsets.apply_updates()

    assert kernel.ipsets[SET][0] == "hash:ip"
    assert kernel.members(SET) == {"10.0.0.1", "10.0.0.2"}
    assert result.sets_written == 1 and result.bytes_written > 0
    assert ipsets.apply_updates().bytes_written == 0


def test_small_change_is_a_delta_and_large_change_a_swap(
    kernel: FakeKernel, ipsets: IpsetManager
) -> None:
    ipsets.set_members(SET, "hash:ip", [f"10.0.0.{i}" for i in range(10)])
    ipsets.apply_updates()

    ipsets.set_members(SET, "hash:ip", [f"10.0.0.{i}" for i in range(1, 11)])
    small = ipsets.apply_updates()
    assert small.sets_swapped == 0
    assert kernel.members(SET) == {f"10.0.0.{i}" for i in range(1, 11)}

    ipsets.set_members(SET, "hash:ip", [f"10.1.0.{i}" for i in range(10)])
    large = ipsets.apply_updates()
    assert large.sets_swapped == 1
    assert kernel.members(SET) == {f"10.1.0.{i}" for i in range(10)}
    assert set(kernel.ipsets) == {SET}, "the temporary set is gone after the swap"


def test_members_are_normalised_like_ipset_save() -> None:
    assert normalize_members("hash:net", ["10.0.0.1/32", "10.1.2.3/16", "0.0.0.0/0"]) == {
        "10.0.0.1",
        "10.1.0.0/16",
        "0.0.0.0/1",
        "128.0.0.0/1",
    }
    assert normalize_members("hash:ip,port", ["10.0.0.1,TCP:080"]) == {"10.0.0.1,tcp:80"}
    assert normalize_members("hash:net", ["10.2.0.0/24 nomatch"]) == {"10.2.0.0/24 nomatch"}


def test_resync_repairs_drift_and_leaves_foreign_sets_alone(
    kernel: FakeKernel, ipsets: IpsetManager
) -> None:
    kernel.ipsets["kube-set"] = ("hash:ip", {"192.0.2.1"})
    ipsets.set_members(SET, "hash:net", ["10.0.0.0/24", "10.0.1.0/24"])
    ipsets.apply_updates()
    kernel.ipsets[SET][1].discard("10.0.1.0/24")
    kernel.ipsets[SET][1].add("10.9.0.0/16")
    kernel.ipsets["cali4ts:web"] = ("hash:net", {"10.7.0.0/16"})  # left by a crash mid-swap

    assert ipsets.apply_updates().bytes_written == 0, "no re-read, no repair"
    ipsets.invalidate()
    ipsets.apply_updates()

    assert kernel.members(SET) == {"10.0.0.0/24", "10.0.1.0/24"}
    assert "cali4ts:web" not in kernel.ipsets
    assert kernel.ipsets["kube-set"] == ("hash:ip", {"192.0.2.1"})


def test_type_change_recreates_the_set(kernel: FakeKernel, ipsets: IpsetManager) -> None:
    ipsets.set_members(SET, "hash:ip", ["10.0.0.1"])
    ipsets.apply_updates()
    ipsets.set_members(SET, "hash:net", ["10.0.0.0/8"])
    ipsets.apply_updates()

    assert kernel.ipsets[SET] == ("hash:net", {"10.0.0.0/8"})


def test_apply_in_order_creates_sets_before_rules_and_deletes_after(
    kernel: FakeKernel, ipsets: IpsetManager
) -> None:
    filt = Table("filter", kernel, NFT, refresh_interval=None)
    uses_set = Rule(("-m", "set", "--match-set", SET, "src", "-j", "ACCEPT"))
    ipsets.set_members(SET, "hash:ip", ["10.0.0.1"])
    filt.set_chain("cali-pi-web", [uses_set])

    apply_in_order(ipsets, [filt])  # the fake rejects a rule naming a missing set
    assert kernel.rules("nft", "filter", "cali-pi-web") == [
        f"-m set --match-set {SET} src -j ACCEPT"
    ]

    ipsets.remove(SET)
    filt.remove_chain("cali-pi-web")
    result = apply_in_order(ipsets, [filt])

    assert result.ipset_deletions.sets_destroyed == 1
    assert SET not in kernel.ipsets
    assert "cali-pi-web" not in kernel.iptables["nft"]["filter"]


def test_set_still_referenced_stays_pending(kernel: FakeKernel, ipsets: IpsetManager) -> None:
    ipsets.set_members(SET, "hash:ip", ["10.0.0.1"])
    ipsets.apply_updates()
    kernel.iptables["nft"]["filter"]["INPUT"].append(f"-m set --match-set {SET} src -j DROP")

    ipsets.remove(SET)
    assert ipsets.apply_deletions().sets_destroyed == 0
    assert ipsets.pending_deletions == {SET}

    kernel.iptables["nft"]["filter"]["INPUT"].clear()
    assert ipsets.apply_deletions().sets_destroyed == 1
    assert SET not in kernel.ipsets and not ipsets.pending_deletions


def test_persistent_restore_failure_raises_with_input(
    kernel: FakeKernel, ipsets: IpsetManager
) -> None:
    ipsets.set_members(SET, "hash:ip", ["10.0.0.1"])
    kernel.fail_next.add("ipset-restore")
    ipsets.apply_updates()  # one failure is retried
    assert kernel.members(SET) == {"10.0.0.1"}

    manager = IpsetManager(kernel, max_attempts=1)
    manager.set_members(SET, "hash:net", ["10.0.0.0/8"])
    kernel.iptables["nft"]["filter"]["INPUT"].append(f"-m set --match-set {SET} src -j DROP")
    with pytest.raises(IpsetError) as err:
        manager.apply_updates()  # a type change of a set in use cannot work
    assert f"destroy {SET}" in err.value.restore_input


@pytest.mark.parametrize(
    ("name", "set_type"),
    [("kube-x", "hash:ip"), ("cali40" + "x" * 26, "hash:ip"), (SET, "list:set")],
)
def test_bad_names_and_types_are_refused(ipsets: IpsetManager, name: str, set_type: str) -> None:
    with pytest.raises(ValueError):
        ipsets.set_members(name, set_type, [])


def test_replace_sets_wants_exactly_the_given_sets(
    kernel: FakeKernel, ipsets: IpsetManager
) -> None:
    other = "cali40s:db"
    ipsets.replace_sets({SET: ("hash:ip", ["10.0.0.1"]), other: ("hash:ip", ["10.0.0.2"])})
    ipsets.apply_updates()

    ipsets.replace_sets({other: ("hash:ip", ["10.0.0.3"])})
    ipsets.apply_updates()
    ipsets.apply_deletions()

    assert set(kernel.ipsets) == {other}
    assert kernel.members(other) == {"10.0.0.3"}


def test_the_same_frozen_members_are_parsed_once(
    kernel: FakeKernel, ipsets: IpsetManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that hands over the very same members object (the calculation did not
    touch the set) costs no parsing; new members, a new type or a removal do."""
    from felix.dataplane import ipsets as module

    parsed: list[str] = []
    real = module.normalize_members
    monkeypatch.setattr(module, "normalize_members", lambda t, m: parsed.append(t) or real(t, m))
    members = frozenset({"10.0.0.1", "10.0.0.2"})
    ipsets.set_members(SET, "hash:ip", members)
    ipsets.set_members(SET, "hash:ip", members)
    assert len(parsed) == 1
    ipsets.set_members(SET, "hash:ip", frozenset({"10.0.0.1"}))
    assert len(parsed) == 2
    ipsets.remove(SET)
    ipsets.set_members(SET, "hash:ip", members)
    assert len(parsed) == 3
    ipsets.apply_updates()
    assert kernel.members(SET) == {"10.0.0.1", "10.0.0.2"}
    mutable = {"10.0.0.3"}
    ipsets.set_members(SET, "hash:ip", mutable)
    mutable.add("10.0.0.4")
    ipsets.set_members(SET, "hash:ip", mutable)  # a mutable input is parsed every time
    ipsets.apply_updates()
    assert kernel.members(SET) == {"10.0.0.3", "10.0.0.4"}
