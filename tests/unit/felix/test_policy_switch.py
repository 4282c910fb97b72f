"""$TABBY_POLICY=off: another engine (kube-network-policies, say) enforces NetworkPolicy."""

from __future__ import annotations

import pytest

from felix.agent import parse_args

BASE = ["--node-name", "n", "--kubeconfig", "k"]


def test_policy_is_on_unless_the_environment_or_flag_turns_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TABBY_POLICY", raising=False)
    assert parse_args(BASE).policy is True
    assert parse_args([*BASE, "--no-policy"]).policy is False
    monkeypatch.setenv("TABBY_POLICY", "off")
    assert parse_args(BASE).policy is False
    monkeypatch.setenv("TABBY_POLICY", "on")
    assert parse_args(BASE).policy is True


def test_a_bad_value_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TABBY_POLICY", "disabled")
    with pytest.raises(SystemExit):
        parse_args(BASE)
    assert "$TABBY_POLICY must be on or off, got 'disabled'" in capsys.readouterr().err
