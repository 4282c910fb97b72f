"""`tabbyctl cni install`: the static executables copied, a clear error without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cni import install
from tabbyctl.main import cli


def _source(tmp_path: Path, *names: str) -> Path:
    source = tmp_path / "image-cni"
    source.mkdir()
    for name in names:
        (source / name).write_bytes(b"\x7fELF " + name.encode())
    return source


def _install(tmp_path: Path, source: Path, *extra: str) -> tuple[int, str]:
    argv = ["cni", "install", f"--from={source}", f"--bin-dir={tmp_path / 'bin'}"]
    result = CliRunner().invoke(cli, [*argv, f"--conf-dir={tmp_path / 'net.d'}", *extra])
    return result.exit_code, result.output


def test_the_three_executables_are_copied_and_the_conflist_chains_them(tmp_path: Path) -> None:
    source = _source(tmp_path, "tabby", "portmap", "bandwidth")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tabby").write_text("#!/usr/bin/python3 -IS\nan older shim\n")
    code, out = _install(tmp_path, source)
    assert code == 0, out
    for name in ("tabby", "portmap", "bandwidth"):
        assert (tmp_path / "bin" / name).read_bytes() == (source / name).read_bytes()
        assert (tmp_path / "bin" / name).stat().st_mode & 0o777 == 0o755
        assert f"installed {tmp_path / 'bin' / name}" in out
    conflist = json.loads((tmp_path / "net.d" / install.CONFLIST_NAME).read_text())
    assert [p["type"] for p in conflist["plugins"]] == ["tabby", "portmap", "bandwidth"]
    assert "not found" not in out


def test_without_the_executable_nothing_is_written_and_the_error_says_what_to_do(
    tmp_path: Path,
) -> None:
    code, out = _install(tmp_path, _source(tmp_path, "portmap"))
    assert code == 2
    assert f"no tabby executable in {tmp_path / 'image-cni'}" in out
    assert "hack/build-cni.sh" in out
    assert not (tmp_path / "bin").exists() and not (tmp_path / "net.d").exists()


def test_a_chained_plugin_neither_carried_nor_on_the_node_is_a_warning(tmp_path: Path) -> None:
    code, out = _install(tmp_path, _source(tmp_path, "tabby", "portmap"))
    assert code == 0, out
    assert "chained plugins not found" in out and "bandwidth" in out
    code, out = _install(tmp_path, tmp_path / "image-cni", "--no-bandwidth")
    assert code == 0 and "not found" not in out


def test_an_unchained_plugin_is_not_copied(tmp_path: Path) -> None:
    source = _source(tmp_path, "tabby", "portmap", "bandwidth")
    code, out = _install(tmp_path, source, "--no-portmap")
    assert code == 0, out
    assert not (tmp_path / "bin" / "portmap").exists()


@pytest.mark.parametrize("chained", [(), ("portmap",), install.CHAINED])
def test_install_executables_returns_what_it_wrote(
    tmp_path: Path, chained: tuple[str, ...]
) -> None:
    source = _source(tmp_path, "tabby", *install.CHAINED)
    written = install.install_executables(tmp_path / "bin", source, chained)
    assert [p.name for p in written] == ["tabby", *chained]
