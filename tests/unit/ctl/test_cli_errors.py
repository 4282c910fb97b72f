"""tabbyctl's exit codes: 2 for input a person must fix, 1 only for problems found."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tabbyctl.main import cli


def test_a_missing_kubeconfig_is_bad_input_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    for argv in (["ipam", "check"], ["ipam", "show"]):
        result = CliRunner().invoke(cli, ["--kubeconfig", str(missing), *argv])
        assert result.exit_code == 2, (argv, result.output)
        assert f"kubeconfig {missing} not found" in result.output
