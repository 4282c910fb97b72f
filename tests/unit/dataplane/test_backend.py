"""Backend choice, as kube-proxy and Felix make it, against the fake kernel."""

from __future__ import annotations

import pytest

from felix.dataplane.backend import LEGACY, LEGACY_IPTC, NFT, detect_backend
from felix.dataplane.runner import SubprocessRunner
from tests.unit.dataplane.fake_kernel import FakeKernel


def test_defaults_to_nft_on_an_empty_node() -> None:
    assert detect_backend(FakeKernel()) == NFT


def test_kubelet_hint_chain_in_legacy_mangle_wins_over_rule_counts() -> None:
    kernel = FakeKernel()
    kernel.iptables["legacy"]["mangle"]["KUBE-IPTABLES-HINT"] = []
    kernel.iptables["nft"]["filter"]["INPUT"] += ["-j ACCEPT"] * 5

    assert detect_backend(kernel) == LEGACY


def test_hint_in_nft_is_checked_first() -> None:
    kernel = FakeKernel()
    kernel.iptables["nft"]["mangle"]["KUBE-KUBELET-CANARY"] = []
    kernel.iptables["legacy"]["mangle"]["KUBE-IPTABLES-HINT"] = []

    assert detect_backend(kernel) == NFT


def test_more_legacy_rules_choose_legacy_and_ties_choose_nft() -> None:
    kernel = FakeKernel()
    kernel.iptables["legacy"]["nat"]["POSTROUTING"] += ["-j MASQUERADE"]
    assert detect_backend(kernel) == LEGACY

    kernel.iptables["nft"]["filter"]["FORWARD"] += ["-j ACCEPT"]
    assert detect_backend(kernel) == NFT


def test_configured_backend_overrides_detection() -> None:
    kernel = FakeKernel()
    kernel.iptables["nft"]["mangle"]["KUBE-IPTABLES-HINT"] = []

    assert detect_backend(kernel, "legacy") == LEGACY
    assert detect_backend(kernel, "legacy-iptc") == LEGACY_IPTC
    assert detect_backend(kernel, "auto") == NFT
    assert kernel.reads == 1
    with pytest.raises(ValueError):
        detect_backend(kernel, "ebpf")


def test_real_runner_runs_commands_and_reports_failures() -> None:
    ok = SubprocessRunner().run(["echo", "hi"])
    missing = SubprocessRunner().run(["/nonexistent/tabby-binary"])
    cat = SubprocessRunner().run(["cat"], stdin="restore input")

    assert ok.ok and ok.stdout == "hi\n"
    assert not missing.ok and missing.returncode == 127
    assert cat.stdout == "restore input"


def test_real_runner_with_a_namespace_runs_inside_it() -> None:
    result = SubprocessRunner(netns="tbt-does-not-exist").run(["echo", "hi"])

    assert not result.ok, "the command ran through ip netns exec, which found no such namespace"
    assert result.argv == ("echo", "hi")
    assert "hi" not in result.stdout
