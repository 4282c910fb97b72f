"""CNI_ARGS parsing and the small name/ifname grammars."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni.shim import CNIError, is_valid_name, parse_cni_args, validate_ifname, version_at_least


def test_k8s_args_are_parsed() -> None:
    raw = (
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-5d78c9869d-abcde;"
        "K8S_POD_INFRA_CONTAINER_ID=0123abcd;K8S_POD_UID=9f7c2a5e-1111-2222-3333-444455556666"
    )
    args = parse_cni_args(raw)
    assert args["K8S_POD_NAMESPACE"] == "kube-system"
    assert args["K8S_POD_NAME"] == "coredns-5d78c9869d-abcde"
    assert args["K8S_POD_INFRA_CONTAINER_ID"] == "0123abcd"
    assert args["K8S_POD_UID"] == "9f7c2a5e-1111-2222-3333-444455556666"
    assert args["IgnoreUnknown"] == "1"


@pytest.mark.parametrize("raw", ["", ";", ";;", " ; "])
def test_empty_args_are_empty(raw: str) -> None:
    assert parse_cni_args(raw) == {}


def test_value_may_contain_equals_and_trailing_semicolon() -> None:
    assert parse_cni_args("A=b=c;B=;") == {"A": "b=c", "B": ""}


@pytest.mark.parametrize("raw", ["A", "A=1;B", "=1"])
def test_malformed_args_are_code_4(raw: str) -> None:
    with pytest.raises(CNIError) as err:
        parse_cni_args(raw)
    assert err.value.code == 4


@given(
    st.dictionaries(
        st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=1, max_size=20),
        st.text("abcdefghijklmnopqrstuvwxyz-0123456789.=", max_size=30),
        max_size=6,
    )
)
def test_args_round_trip(args: dict[str, str]) -> None:
    raw = ";".join(f"{k}={v}" for k, v in args.items())
    assert parse_cni_args(raw) == args


@pytest.mark.parametrize("name", ["eth0", "net1", "e", "a" * 15, "veth-x_y.z"])
def test_good_ifnames(name: str) -> None:
    validate_ifname(name)
    assert len(name) <= 15


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 16, "a/b", "a:b", "a b", "a\tb", "é" * 8])
def test_bad_ifnames(name: str) -> None:
    with pytest.raises(CNIError) as err:
        validate_ifname(name)
    assert err.value.code == 4


@pytest.mark.parametrize(
    ("value", "ok"),
    [("k8s-pod-network", True), ("a", True), ("1.2_3-x", True), ("-a", False), ("", False)],
)
def test_name_grammar(value: str, ok: bool) -> None:
    assert is_valid_name(value) is ok


def test_versions_compare_numerically() -> None:
    assert version_at_least("1.1.0", "1.1.0")
    assert version_at_least("0.10.0", "0.4.0")
    assert not version_at_least("1.0.0", "1.1.0")
