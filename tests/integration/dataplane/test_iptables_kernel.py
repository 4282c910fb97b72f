"""Table and IpsetManager against the real kernel, in a fresh namespace, for every backend."""

from __future__ import annotations

import subprocess

import pytest

from felix.dataplane import apply_in_order
from felix.dataplane.backend import LEGACY, LEGACY_IPTC, NFT, Backend, detect_backend
from felix.dataplane.ipsets import IpsetManager
from felix.dataplane.iptables import Rule, Table, read_kernel_view
from felix.dataplane.runner import SubprocessRunner
from lab import netns

pytestmark = pytest.mark.integration

SET = "cali40s:peers"


def r(*args: str) -> Rule:
    return Rule(tuple(args))


def table(runner: SubprocessRunner, backend: Backend, name: str = "filter") -> Table:
    return Table(name, runner, backend, refresh_interval=None, sleep=lambda _s: None)


def iptables(ns: str, backend: Backend, *args: str) -> None:
    """A change made behind Tabby's back, with the same backend's own CLI."""
    netns.ns_exec(ns, [f"iptables-{backend.name}", *args])


def chain_rules(ns: str, backend: Backend, chain: str, table_name: str = "filter") -> list[str]:
    """Rule lines of one chain as iptables-save prints them, without the hash comment."""
    out = netns.ns_exec(ns, backend.save_argv(table_name))
    rules = [line for line in out.splitlines() if line.startswith(f"-A {chain} ")]
    return [_strip_hash(line.split(maxsplit=2)[2]) for line in rules]


def _strip_hash(rule: str) -> str:
    words = rule.split()
    if "--comment" in words:
        i = words.index("--comment")
        if words[i + 1].strip('"').startswith("tby:"):
            del words[i - 2 : i + 2]
    return " ".join(words)


def forward_setup(t: Table) -> None:
    t.set_chain("cali-FORWARD", [r("-i", "cali+", "-j", "cali-from-wl"), r("-j", "ACCEPT")])
    t.set_chain("cali-from-wl", [r("-p", "tcp", "--dport", "80", "-j", "ACCEPT"), r("-j", "DROP")])
    t.insert_hooks("FORWARD", [r("-j", "cali-FORWARD")])


def test_apply_programs_chains_and_hooks(
    ns: str, runner: SubprocessRunner, backend: Backend
) -> None:
    iptables(ns, backend, "-A", "FORWARD", "-s", "192.0.2.1/32", "-j", "DROP")
    t = table(runner, backend)
    forward_setup(t)

    t.apply()

    assert chain_rules(ns, backend, "FORWARD") == ["-j cali-FORWARD", "-s 192.0.2.1/32 -j DROP"]
    assert chain_rules(ns, backend, "cali-from-wl") == [
        "-p tcp -m tcp --dport 80 -j ACCEPT",
        "-j DROP",
    ]
    other = LEGACY if backend.name == "nft" else NFT
    assert "cali-" not in netns.ns_exec(ns, other.save_argv("filter"))
    t.invalidate()
    assert t.apply().bytes_written == 0, "what the kernel reports back matches what was written"


def test_resync_repairs_drift_and_leaves_foreign_rules_alone(
    ns: str, runner: SubprocessRunner, backend: Backend
) -> None:
    t = table(runner, backend)
    forward_setup(t)
    t.apply()
    iptables(ns, backend, "-D", "FORWARD", "1")  # the hook, deleted
    iptables(ns, backend, "-R", "cali-from-wl", "2", "-j", "ACCEPT")  # a rule, modified
    iptables(ns, backend, "-I", "FORWARD", "1", "-s", "192.0.2.1/32", "-j", "DROP")
    iptables(ns, backend, "-N", "KUBE-FORWARD")
    iptables(ns, backend, "-A", "KUBE-FORWARD", "-j", "ACCEPT")

    t.invalidate()
    t.apply()

    assert chain_rules(ns, backend, "FORWARD") == ["-j cali-FORWARD", "-s 192.0.2.1/32 -j DROP"]
    assert chain_rules(ns, backend, "cali-from-wl")[1] == "-j DROP"
    assert chain_rules(ns, backend, "KUBE-FORWARD") == ["-j ACCEPT"]


def test_incremental_change_writes_far_less_and_keeps_other_chains(
    ns: str, runner: SubprocessRunner, backend: Backend
) -> None:
    t = table(runner, backend)
    for i in range(40):
        t.set_chain(
            f"cali-pi-{i}", [r("-s", f"10.0.{i}.{j}/32", "-j", "ACCEPT") for j in range(10)]
        )
    full = t.apply().bytes_written

    t.set_chain("cali-pi-3", [r("-s", f"10.0.3.{j}/32", "-j", "ACCEPT") for j in range(9)])
    small = t.apply().bytes_written

    assert small * 50 < full
    assert len(chain_rules(ns, backend, "cali-pi-3")) == 9
    assert len(chain_rules(ns, backend, "cali-pi-4")) == 10
    t.invalidate()
    assert t.apply().bytes_written == 0


def test_removing_chains_and_hooks_leaves_the_kernel_as_found(
    ns: str, runner: SubprocessRunner, backend: Backend
) -> None:
    before = chain_rules(ns, backend, "FORWARD")
    t = table(runner, backend)
    forward_setup(t)
    t.apply()

    t.insert_hooks("FORWARD", [])
    t.remove_chain("cali-FORWARD")
    t.remove_chain("cali-from-wl")
    t.apply()

    assert chain_rules(ns, backend, "FORWARD") == before
    assert "cali-" not in netns.ns_exec(ns, backend.save_argv("filter"))


def test_nat_append_hook_goes_below_foreign_rules(
    ns: str, runner: SubprocessRunner, backend: Backend
) -> None:
    iptables(ns, backend, "-t", "nat", "-A", "POSTROUTING", "-o", "eth9", "-j", "MASQUERADE")
    t = table(runner, backend, "nat")
    t.set_chain("cali-POSTROUTING", [r("-j", "RETURN")])
    t.append_hooks("POSTROUTING", [r("-j", "cali-POSTROUTING")])
    t.apply()

    assert chain_rules(ns, backend, "POSTROUTING", "nat") == [
        "-o eth9 -j MASQUERADE",
        "-j cali-POSTROUTING",
    ]


def test_ipsets_update_atomically_and_delete_after_iptables(
    ns: str, runner: SubprocessRunner, backend: Backend
) -> None:
    ipsets = IpsetManager(runner, small_change=2)
    t = table(runner, backend)
    netns.ns_exec(ns, ["ipset", "create", "kube-foreign", "hash:ip"])
    ipsets.set_members(SET, "hash:net", ["10.0.0.1/32", "10.1.0.0/16"])
    t.set_chain("cali-pi-x", [r("-m", "set", "--match-set", SET, "src", "-j", "DROP")])
    apply_in_order(ipsets, [t])

    ipsets.set_members(SET, "hash:net", [f"10.2.{i}.0/24" for i in range(8)])
    swapped = ipsets.apply_updates()
    saved = netns.ns_exec(ns, ["ipset", "save"])

    assert swapped.sets_swapped == 1
    assert {ln.split()[2] for ln in saved.splitlines() if ln.startswith(f"add {SET} ")} == {
        f"10.2.{i}.0/24" for i in range(8)
    }
    assert "cali4t" not in saved and "kube-foreign" in saved

    ipsets.remove(SET)
    assert ipsets.apply_deletions().sets_destroyed == 0, "a rule still uses the set"
    t.remove_chain("cali-pi-x")
    result = apply_in_order(ipsets, [t])
    assert result.ipset_deletions.sets_destroyed == 1
    saved = netns.ns_exec(ns, ["ipset", "save"])
    assert SET not in saved and "kube-foreign" in saved


def test_backend_detection_follows_kubelet_hint_chains(ns: str, runner: SubprocessRunner) -> None:
    assert detect_backend(runner) == NFT
    iptables(ns, LEGACY, "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
    assert detect_backend(runner).name == "legacy"


def _ping(src: str, dst: str) -> bool:
    argv = ["ip", "netns", "exec", src, "ping", "-c1", "-W1", "-q", dst]
    return subprocess.run(argv, capture_output=True, check=False, timeout=10).returncode == 0


def test_drop_rule_blocks_real_packets_and_removal_restores_them(
    ns: str, peer: str, runner: SubprocessRunner, backend: Backend
) -> None:
    link = f"tv{ns[4:]}"
    netns.ip(ns, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", peer)
    netns.ip(ns, "addr", "add", "10.250.0.1/24", "dev", link)
    netns.ip(peer, "addr", "add", "10.250.0.2/24", "dev", "eth0")
    netns.ip(ns, "link", "set", link, "up")
    netns.ip(peer, "link", "set", "eth0", "up")
    assert _ping(peer, "10.250.0.1"), "the pair works before any rule"

    ipsets = IpsetManager(runner)
    t = table(runner, backend)
    ipsets.set_members(SET, "hash:ip", ["10.250.0.2"])
    t.set_chain("cali-INPUT", [r("-m", "set", "--match-set", SET, "src", "-j", "DROP")])
    t.insert_hooks("INPUT", [r("-j", "cali-INPUT")])
    apply_in_order(ipsets, [t])
    assert not _ping(peer, "10.250.0.1"), "the peer is in the set: dropped"

    ipsets.set_members(SET, "hash:ip", ["10.250.0.99"])
    apply_in_order(ipsets, [t])
    assert _ping(peer, "10.250.0.1"), "the peer left the set: allowed again"

    ipsets.set_members(SET, "hash:ip", ["10.250.0.2"])
    apply_in_order(ipsets, [t])
    assert not _ping(peer, "10.250.0.1")
    t.insert_hooks("INPUT", [])
    t.remove_chain("cali-INPUT")
    ipsets.remove(SET)
    apply_in_order(ipsets, [t])
    assert _ping(peer, "10.250.0.1"), "rules and set removed: allowed"


def test_libiptc_reader_sees_what_iptables_save_sees(ns: str, runner: SubprocessRunner) -> None:
    # A hash may start with "-"; python-iptables' `parameters` cuts such values short.
    iptables(ns, LEGACY, "-N", "cali-x")
    iptables(ns, LEGACY, "-A", "cali-x", "-m", "comment", "--comment", "tby:--kDqR3JID94uCSj")
    iptables(ns, LEGACY, "-A", "cali-x", "-m", "comment", "--comment", "note", "-j", "ACCEPT")
    iptables(ns, LEGACY, "-I", "INPUT", "-j", "cali-x")

    via_iptc = read_kernel_view(runner, LEGACY_IPTC, "filter")

    assert via_iptc == read_kernel_view(runner, LEGACY, "filter")
    assert via_iptc["cali-x"] == ["--kDqR3JID94uCSj", None]
    assert via_iptc["INPUT"] == [None]


@pytest.mark.parametrize(
    ("table_name", "hook"),
    [("raw", "PREROUTING"), ("mangle", "POSTROUTING"), ("nat", "OUTPUT"), ("filter", "INPUT")],
)
def test_every_table_takes_chains_and_hooks(
    ns: str, runner: SubprocessRunner, backend: Backend, table_name: str, hook: str
) -> None:
    t = table(runner, backend, table_name)
    t.set_chain(f"cali-{hook}", [r("-j", "RETURN")])
    t.insert_hooks(hook, [r("-j", f"cali-{hook}")])
    t.apply()
    t.invalidate()

    assert t.apply().bytes_written == 0
    assert chain_rules(ns, backend, hook, table_name) == [f"-j cali-{hook}"]


def test_ipv6_table(ns: str, runner: SubprocessRunner, backend: Backend) -> None:
    v6 = backend.v6()
    t = table(runner, v6)
    t.set_chain("cali-INPUT", [r("-s", "fd00::1/128", "-j", "DROP")])
    t.insert_hooks("INPUT", [r("-j", "cali-INPUT")])
    t.apply()
    t.invalidate()

    assert t.apply().bytes_written == 0
    assert chain_rules(ns, v6, "cali-INPUT") == ["-s fd00::1/128 -j DROP"]
    assert "cali-INPUT" not in netns.ns_exec(ns, backend.save_argv("filter"))
