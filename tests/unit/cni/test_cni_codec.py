"""The shim's JSON codec (on the C core of json) agrees with the json module."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni import shim

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(values)
def test_dumps_matches_json(value: object) -> None:
    assert shim.dumps(value) == json.dumps(value)


@given(values)
def test_loads_round_trips(value: object) -> None:
    text = json.dumps(value, indent=2, ensure_ascii=False)
    assert shim.loads(text) == value
    assert shim.loads(f" \n{text}\t\r\n".encode()) == value


@pytest.mark.parametrize(
    "raw", [b"", b"   ", b"{", b"[1,]", b'{"a" 1}', b"{} {}", b"nul", b'"\x01"', b"\xff", b"01"]
)
def test_loads_rejects_what_json_rejects(raw: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(raw)
    with pytest.raises(ValueError):
        shim.loads(raw)


def test_dumps_refuses_unknown_types() -> None:
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        shim.dumps({"a": {1}})
    assert shim.dumps({"a": [1, 2]}) == '{"a": [1, 2]}'  # still fine afterwards


def test_constants_like_json() -> None:
    assert shim.loads("[NaN, Infinity]")[1] == float("inf")
