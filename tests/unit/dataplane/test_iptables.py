"""Table against a stateful fake kernel: assert on the resulting rules, not on calls."""

from __future__ import annotations

import logging

import pytest

from felix.dataplane.backend import LEGACY, LEGACY_IPTC, NFT, Backend
from felix.dataplane.iptables import IptablesError, Rule, Table, parse_save, rule_hashes
from tests.unit.dataplane.fake_kernel import FakeKernel

BACKENDS = [NFT, LEGACY, LEGACY_IPTC]
ACCEPT = Rule(("-j", "ACCEPT"))
DROP = Rule(("-j", "DROP"))
JUMP_FWD = Rule(("-j", "cali-FORWARD"))
FOREIGN = "-s 192.0.2.1/32 -j DROP"


def r(*args: str) -> Rule:
    return Rule(tuple(args))


@pytest.fixture(params=BACKENDS, ids=lambda b: f"{b.name}-{b.reader}")
def backend(request: pytest.FixtureRequest) -> Backend:
    backend: Backend = request.param
    return backend


@pytest.fixture
def kernel() -> FakeKernel:
    return FakeKernel()


def table(kernel: FakeKernel, backend: Backend, name: str = "filter") -> Table:
    return Table(name, kernel, backend, refresh_interval=None, sleep=lambda _s: None)


def forward_setup(t: Table) -> None:
    t.set_chain("cali-FORWARD", [r("-i", "cali+", "-j", "cali-from-wl"), ACCEPT])
    t.set_chain("cali-from-wl", [r("-p", "tcp", "--dport", "80", "-j", "ACCEPT"), r("-j", "DROP")])
    t.insert_hooks("FORWARD", [JUMP_FWD])


def test_apply_programs_chains_and_hooks_above_foreign_rules(
    kernel: FakeKernel, backend: Backend
) -> None:
    kernel.iptables[backend.name]["filter"]["FORWARD"].append(FOREIGN)
    t = table(kernel, backend)
    forward_setup(t)

    result = t.apply()

    assert result.bytes_written > 0 and result.attempts == 1
    assert kernel.rules(backend.name, "filter", "FORWARD") == ["-j cali-FORWARD", FOREIGN]
    assert kernel.rules(backend.name, "filter", "cali-from-wl") == [
        "-p tcp --dport 80 -j ACCEPT",
        "-j DROP",
    ]
    other = "legacy" if backend.name == "nft" else "nft"
    assert "cali-FORWARD" not in kernel.iptables[other]["filter"]


def test_second_apply_without_changes_writes_nothing(kernel: FakeKernel, backend: Backend) -> None:
    t = table(kernel, backend)
    forward_setup(t)
    t.apply()
    writes = len(kernel.restore_inputs)

    assert t.apply().bytes_written == 0
    t.invalidate()
    assert t.apply().bytes_written == 0, "a re-read of an unchanged kernel finds no drift"
    assert len(kernel.restore_inputs) == writes


def test_incremental_change_writes_far_less_than_full_rewrite(kernel: FakeKernel) -> None:
    t = table(kernel, NFT)
    for i in range(100):
        t.set_chain(
            f"cali-pi-{i}", [r("-s", f"10.0.{i}.{j}/32", "-j", "ACCEPT") for j in range(20)]
        )
    full = t.apply().bytes_written

    t.set_chain("cali-pi-7", [*t._chains["cali-pi-7"], r("-j", "DROP")])
    appended = t.apply()
    rules = [r("-s", f"10.0.7.{j}/32", "-j", "ACCEPT") for j in range(20)]
    rules[19] = r("-s", "10.9.9.9/32", "-j", "ACCEPT")
    t.set_chain("cali-pi-7", rules)
    replaced = t.apply()

    assert appended.chains_written == 1 and replaced.chains_written == 1
    assert appended.bytes_written * 100 < full
    assert replaced.bytes_written * 100 < full
    assert kernel.rules("nft", "filter", "cali-pi-7")[-1] == "-s 10.9.9.9/32 -j ACCEPT"
    assert len(kernel.rules("nft", "filter", "cali-pi-7")) == 20


def test_changed_rule_in_the_middle_is_found_and_tail_kept_in_order(kernel: FakeKernel) -> None:
    t = table(kernel, NFT)
    t.set_chain("cali-x", [r("-s", f"10.0.0.{i}", "-j", "ACCEPT") for i in range(5)])
    t.apply()

    t.set_chain("cali-x", [r("-s", f"10.0.0.{i}", "-j", "ACCEPT") for i in (0, 1, 9, 3)])
    t.apply()

    assert kernel.rules("nft", "filter", "cali-x") == [
        f"-s 10.0.0.{i} -j ACCEPT" for i in (0, 1, 9, 3)
    ]


def test_remove_chain_and_its_hook_in_one_transaction(kernel: FakeKernel, backend: Backend) -> None:
    t = table(kernel, backend)
    forward_setup(t)
    t.apply()

    t.remove_chain("cali-FORWARD")
    t.remove_chain("cali-from-wl")
    t.insert_hooks("FORWARD", [])
    t.apply()

    chains = kernel.iptables[backend.name]["filter"]
    assert "cali-FORWARD" not in chains and "cali-from-wl" not in chains
    assert chains["FORWARD"] == []
    assert len(kernel.restore_inputs) == 2


def test_resync_repairs_deleted_and_modified_rules_and_leaves_foreign_alone(
    kernel: FakeKernel, backend: Backend
) -> None:
    t = table(kernel, backend)
    forward_setup(t)
    t.apply()
    filt = kernel.iptables[backend.name]["filter"]
    # `iptables -R cali-from-wl 2 -j ACCEPT`: a replaced rule loses its hash comment.
    # (An edit that copies our comment verbatim is invisible by design: bodies are not parsed.)
    filt["cali-from-wl"][1] = "-j ACCEPT"
    del filt["FORWARD"][0]  # hook deleted
    filt["FORWARD"].append(FOREIGN)
    filt["cali-FORWARD"].append("-s 198.51.100.1/32 -j ACCEPT")  # intruder in our chain
    filt["KUBE-FORWARD"] = ["-j ACCEPT"]

    assert t.apply().bytes_written == 0, "without a re-read the cache believes all is well"
    t.invalidate()
    t.apply()

    assert kernel.rules(backend.name, "filter", "FORWARD") == ["-j cali-FORWARD", FOREIGN]
    assert kernel.rules(backend.name, "filter", "cali-from-wl")[1] == "-j DROP"
    assert kernel.rules(backend.name, "filter", "cali-FORWARD") == [
        "-i cali+ -j cali-from-wl",
        "-j ACCEPT",
    ]
    assert filt is not kernel.iptables[backend.name]["filter"]
    assert kernel.iptables[backend.name]["filter"]["KUBE-FORWARD"] == ["-j ACCEPT"]


def test_hook_pushed_down_by_a_foreign_insert_moves_back_to_the_top(kernel: FakeKernel) -> None:
    t = table(kernel, NFT)
    forward_setup(t)
    t.apply()
    kernel.iptables["nft"]["filter"]["FORWARD"].insert(0, FOREIGN)

    t.invalidate()
    t.apply()

    assert kernel.rules("nft", "filter", "FORWARD") == ["-j cali-FORWARD", FOREIGN]


def test_resync_removes_stale_owned_chains_and_hooks(kernel: FakeKernel, backend: Backend) -> None:
    old = table(kernel, backend)
    forward_setup(old)
    old.insert_hooks("INPUT", [r("-j", "cali-INPUT")])
    old.set_chain("cali-INPUT", [ACCEPT])
    old.apply()
    kernel.iptables[backend.name]["filter"]["INPUT"].append(FOREIGN)

    restarted = table(kernel, backend)  # a new agent that only wants FORWARD
    forward_setup(restarted)
    restarted.apply()

    chains = kernel.iptables[backend.name]["filter"]
    assert "cali-INPUT" not in chains
    assert kernel.rules(backend.name, "filter", "INPUT") == [FOREIGN]
    assert kernel.rules(backend.name, "filter", "FORWARD") == ["-j cali-FORWARD"]


def test_append_hooks_go_below_foreign_rules(kernel: FakeKernel) -> None:
    t = table(kernel, NFT, "nat")
    kernel.iptables["nft"]["nat"]["POSTROUTING"].append("-j MASQUERADE")
    t.set_chain("cali-POSTROUTING", [r("-j", "RETURN")])
    t.append_hooks("POSTROUTING", [r("-j", "cali-POSTROUTING")])
    t.insert_hooks("PREROUTING", [r("-j", "cali-POSTROUTING")])
    t.apply()

    assert kernel.rules("nft", "nat", "POSTROUTING") == ["-j MASQUERADE", "-j cali-POSTROUTING"]
    assert kernel.rules("nft", "nat", "PREROUTING") == ["-j cali-POSTROUTING"]
    t.invalidate()
    assert t.apply().bytes_written == 0


def test_failed_restore_is_retried_after_a_re_read(kernel: FakeKernel) -> None:
    t = table(kernel, NFT)
    forward_setup(t)
    kernel.fail_next.add("iptables-restore")

    result = t.apply()

    assert result.attempts == 2
    assert kernel.rules("nft", "filter", "FORWARD") == ["-j cali-FORWARD"]


def test_persistent_failure_raises_with_the_exact_input_logged(
    kernel: FakeKernel, caplog: pytest.LogCaptureFixture
) -> None:
    t = table(kernel, NFT)
    t.set_chain("cali-bad", [r("-j", "cali-missing")])  # jump to a chain nobody creates

    with caplog.at_level(logging.ERROR), pytest.raises(IptablesError) as err:
        t.apply()

    assert "-j cali-missing" in err.value.restore_input
    assert "cali-missing" in err.value.stderr
    assert caplog.text.count("input was:\n" + err.value.restore_input) == 3  # once per try
    assert "cali-bad" not in kernel.iptables["nft"]["filter"]


def test_refresh_interval_re_reads_the_kernel(kernel: FakeKernel) -> None:
    now = [0.0]
    t = Table("filter", kernel, NFT, refresh_interval=10, clock=lambda: now[0])
    forward_setup(t)
    t.apply()
    del kernel.iptables["nft"]["filter"]["FORWARD"][0]

    now[0] = 5
    t.apply()
    assert kernel.rules("nft", "filter", "FORWARD") == []
    now[0] = 11
    t.apply()
    assert kernel.rules("nft", "filter", "FORWARD") == ["-j cali-FORWARD"]


def test_args_with_spaces_survive_the_round_trip(kernel: FakeKernel) -> None:
    t = table(kernel, NFT)
    t.set_chain("cali-x", [r("-m", "comment", "--comment", 'Policy "a b"', "-j", "ACCEPT")])
    t.apply()
    t.invalidate()

    assert t.apply().bytes_written == 0
    assert kernel.rules("nft", "filter", "cali-x") == [
        '-m comment --comment "Policy \\"a b\\"" -j ACCEPT'
    ]


def test_hashes_depend_on_chain_and_content_not_on_what_is_above() -> None:
    a = rule_hashes("cali-a", [ACCEPT, DROP])
    b = rule_hashes("cali-b", [ACCEPT, DROP])

    assert a[0] != a[1] and a[0] != b[0]
    assert all(len(h) == 16 for h in a + b)
    assert rule_hashes("cali-a", [ACCEPT, DROP]) == a
    assert rule_hashes("cali-a", [r("-s", "10.0.0.1", "-j", "RETURN"), ACCEPT, DROP])[1:] == a


def test_a_rule_inserted_or_removed_is_one_insert_or_one_delete(kernel: FakeKernel) -> None:
    """A new endpoint's jump in a dispatch chain is one -I, never a rewrite of the rules
    below it: on nf_tables a commit that deletes or replaces a rule costs an RCU grace
    period (about 10 ms), one that only adds does not."""
    t = table(kernel, NFT)
    jumps = [r("-i", f"cali{i}", "-j", "RETURN") for i in (1, 3, 5)]
    t.set_chain("cali-x", [*jumps, DROP])
    t.apply()

    t.set_chain("cali-x", [jumps[0], r("-i", "cali2", "-j", "RETURN"), *jumps[1:], DROP])
    t.apply()
    added = kernel.restore_inputs[-1].splitlines()
    assert [line.split()[:3] for line in added if line.startswith("-")] == [["-I", "cali-x", "2"]]
    assert kernel.rules("nft", "filter", "cali-x") == [
        "-i cali1 -j RETURN",
        "-i cali2 -j RETURN",
        "-i cali3 -j RETURN",
        "-i cali5 -j RETURN",
        "-j DROP",
    ]

    t.set_chain("cali-x", [jumps[0], *jumps[1:], DROP])
    t.apply()
    removed = kernel.restore_inputs[-1].splitlines()
    assert [line for line in removed if line.startswith("-")] == ["-D cali-x 2"]
    t.invalidate()
    assert t.apply().bytes_written == 0


def test_parse_save_reads_only_names_and_tabby_hashes() -> None:
    text = (
        "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j DNAT --to 1.2.3.4\nCOMMIT\n"
        "*filter\n:INPUT ACCEPT [0:0]\n:cali-x - [0:0]\n"
        '-A INPUT -m comment --comment "tby:AAAAAAAAAAAAAAAA" -j cali-x\n'
        '-A INPUT -m comment --comment "kube rule" -j ACCEPT\n'
        "-A cali-x -m comment --comment tby:BBBBBBBBBBBBBBBB -j ACCEPT\nCOMMIT\n"
    )

    assert parse_save(text, "filter") == {
        "INPUT": ["AAAAAAAAAAAAAAAA", None],
        "cali-x": ["BBBBBBBBBBBBBBBB"],
    }
    assert parse_save(text, "nat") == {"PREROUTING": [None]}


@pytest.mark.parametrize("name", ["KUBE-SERVICES", "cali-" + "x" * 24])
def test_set_chain_refuses_foreign_or_too_long_names(kernel: FakeKernel, name: str) -> None:
    with pytest.raises(ValueError):
        table(kernel, NFT).set_chain(name, [ACCEPT])


def test_hooks_cannot_target_owned_chains(kernel: FakeKernel) -> None:
    with pytest.raises(ValueError):
        table(kernel, NFT).insert_hooks("cali-FORWARD", [ACCEPT])


def test_ipv6_tables_are_separate_from_ipv4(kernel: FakeKernel, backend: Backend) -> None:
    v6 = Table("filter", kernel, backend.v6(), refresh_interval=None)
    v6.set_chain("cali-INPUT", [r("-s", "fd00::1", "-j", "DROP")])
    v6.insert_hooks("INPUT", [r("-j", "cali-INPUT")])
    v6.apply()
    v6.invalidate()

    assert v6.apply().bytes_written == 0
    assert backend.v6().restore_argv()[0].startswith("ip6tables-")
    assert kernel.rules(f"{backend.name}6", "filter", "cali-INPUT") == ["-s fd00::1 -j DROP"]
    assert "cali-INPUT" not in kernel.iptables[backend.name]["filter"]


def test_replace_chains_owns_exactly_the_given_chains(kernel: FakeKernel) -> None:
    t = table(kernel, NFT)
    t.replace_chains({"cali-a": [ACCEPT], "cali-b": [ACCEPT]})
    t.apply()

    t.replace_chains({"cali-b": [r("-j", "DROP")], "cali-c": []})
    t.apply()

    filt = kernel.iptables["nft"]["filter"]
    assert {c for c in filt if c.startswith("cali-")} == {"cali-b", "cali-c"}
    assert kernel.rules("nft", "filter", "cali-b") == ["-j DROP"]
    assert filt["cali-c"] == []
