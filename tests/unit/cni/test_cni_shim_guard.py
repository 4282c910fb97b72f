"""The shim's last-resort guard and error mapping (issue 21 item 8), without an agent."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import pytest

from cni import shim


def test_main_prints_error_json_whatever_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(*_args: Any) -> tuple[int, str]:
        raise MemoryError("out of memory")

    monkeypatch.setattr(shim, "run", boom)
    monkeypatch.setenv("CNI_COMMAND", "ADD")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"{}")))
    assert shim.main() == 1
    answer = json.loads(capsys.readouterr().out)
    assert answer["code"] == shim.ERR_INTERNAL
    assert "MemoryError: out of memory" in answer["details"]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", shim.ERR_TRY_AGAIN_LATER),
        (b'{"result": {"cniVers', shim.ERR_TRY_AGAIN_LATER),
        (b"[1, 2}", shim.ERR_INTERNAL),
        (b"[1]", shim.ERR_INTERNAL),
    ],
)
def test_answer_cut_off_is_retryable_garbage_is_not(raw: bytes, code: int) -> None:
    with pytest.raises(shim.CNIError) as err:
        shim._decode_answer("/run/tabby/cni.sock", raw)
    assert err.value.code == code


def test_deep_json_is_a_value_error_not_a_recursion_error() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        shim.loads("[" * 100_000 + "]" * 100_000)
    assert shim.caller_version(b"[" * 100_000) == shim.SUPPORTED_VERSIONS[-1]
