"""A request body with NaN or an infinity is refused before it is sent, naming the field:
Python's encoder would write ``NaN``/``Infinity``, which the apiserver cannot parse
(found by the object corpus, tests/integration/datastore/test_object_corpus.py)."""

from __future__ import annotations

import json
import math

import pytest

from datastore.errors import Invalid
from datastore.transport import encode_body


def test_a_finite_body_is_plain_json() -> None:
    body = {"spec": {"asNumber": 64512, "ratio": 0.5, "peers": [{"ip": "10.0.0.1"}]}}
    assert json.loads(encode_body(body, "POST", "/x")) == body


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"spec": {"asNumber": math.inf}}, "spec.asNumber"),
        ({"spec": {"peers": [{"port": 1}, {"port": -math.inf}]}}, "spec.peers[1].port"),
        ({"spec": {"mtu": math.nan}}, "spec.mtu"),
        (math.nan, "the body"),
    ],
)
def test_nan_and_infinity_are_refused_with_the_field_named(body: object, where: str) -> None:
    with pytest.raises(Invalid) as err:
        encode_body(body, "POST", "/apis/crd.tabby.dev/v1/bgpconfigurations")
    assert str(err.value).startswith(f"POST /apis/crd.tabby.dev/v1/bgpconfigurations: {where} ")
    assert "JSON" in str(err.value)
