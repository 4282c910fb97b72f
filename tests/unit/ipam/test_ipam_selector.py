"""Selector parsing and evaluation, with Calico's semantics for absent labels."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipam.selector import (
    All,
    And,
    Compare,
    Has,
    In,
    Not,
    Or,
    Selector,
    SelectorError,
    parse_selector,
)

LABELS = {"role": "worker", "zone": "eu-1", "kubernetes.io/hostname": "node-1", "gpu": ""}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("all()", True),
        ("", True),
        ("   ", True),
        ("has(role)", True),
        ("has(missing)", False),
        ("!has(missing)", True),
        ("!has(role)", False),
        ("role == 'worker'", True),
        ('role == "worker"', True),
        ("role == 'master'", False),
        ("missing == 'x'", False),
        ("role != 'master'", True),
        ("role != 'worker'", False),
        ("missing != 'x'", True),
        ("zone in {'eu-1', 'eu-2'}", True),
        ("zone in {'us-1'}", False),
        ("zone in {}", False),
        ("missing in {'a'}", False),
        ("zone not in {'us-1'}", True),
        ("zone not in {'eu-1'}", False),
        ("missing not in {'a'}", True),
        ("role == 'worker' && zone == 'eu-1'", True),
        ("role == 'worker' && zone == 'us-1'", False),
        ("role == 'x' || zone == 'eu-1'", True),
        ("role == 'x' || zone == 'y'", False),
        ("!(role == 'x')", True),
        ("!!has(role)", True),
        ("(role == 'x' || has(zone)) && !has(missing)", True),
        ("role == 'x' || has(zone) && has(missing)", False),
        ("kubernetes.io/hostname == 'node-1'", True),
        ("gpu == ''", True),
        ("zone starts with 'eu'", True),
        ("zone ends with '-2'", False),
        ("zone contains 'u-'", True),
        ("missing contains 'u'", False),
        ("all() && has(role)", True),
    ],
)
def test_matches(expr: str, expected: bool) -> None:
    assert parse_selector(expr).matches(LABELS) is expected


def test_precedence_and_binds_tighter_than_or() -> None:
    node = parse_selector("has(a) || has(b) && has(c)")
    assert node == Or((Has("a"), And((Has("b"), Has("c")))))


def test_parse_tree_shapes() -> None:
    assert parse_selector("all()") == All()
    assert parse_selector("a in {'x','y'}") == In("a", frozenset({"x", "y"}))
    assert parse_selector("a not in {'x'}") == In("a", frozenset({"x"}), negated=True)
    assert parse_selector("!has(a)") == Not(Has("a"))
    assert parse_selector("a=='b'") == Compare("a", "==", "b")
    # a key that happens to be a keyword is still a key
    assert parse_selector("in == 'x'") == Compare("in", "==", "x")
    assert parse_selector("all == 'x'") == Compare("all", "==", "x")


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("role ==", "expected a quoted value"),
        ("role == worker", "expected a quoted value"),
        ("role = 'x'", "unexpected character '='"),
        ("has(role", "expected ')'"),
        ("has()", "expected a label key"),
        ("(has(a)", "expected ')'"),
        ("has(a))", "expected '&&', '||' or end"),
        ("has(a) has(b)", "expected '&&', '||' or end"),
        ("role in 'x'", "expected '{'"),
        ("role in {'x',}", "expected a quoted value"),
        ("role", "expected an operator"),
        ("role like 'x'", "unknown operator"),
        ("&& has(a)", "expected a label key"),
        ("has(a) &&", "expected a label key"),
        ("role == 'unterminated", "unexpected character"),
        ("role not 'x'", "unknown operator"),
    ],
)
def test_errors_are_clear(expr: str, fragment: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_selector(expr)
    assert fragment in str(info.value)
    assert "position" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_non_string_rejected() -> None:
    with pytest.raises(SelectorError, match="must be a string"):
        parse_selector(None)  # type: ignore[arg-type]


def test_overlong_key_rejected() -> None:
    with pytest.raises(SelectorError, match="longer than 512"):
        parse_selector("has(" + "k" * 513 + ")")


# -- property tests ------------------------------------------------------------------
keys = st.sampled_from(["a", "b", "role", "kubernetes.io/hostname", "x_y-z"])
values = st.sampled_from(["", "1", "worker", "eu-1", "it's", 'say "hi"'])
label_maps = st.dictionaries(keys, st.sampled_from(["", "1", "worker", "eu-1", "it's"]))

leaves: st.SearchStrategy[Selector] = st.one_of(
    st.just(All()),
    keys.map(Has),
    st.builds(Compare, keys, st.sampled_from(["==", "!=", "starts with", "ends with"]), values),
    st.builds(In, keys, st.frozensets(values, max_size=3), st.booleans()),
)
selectors = st.recursive(
    leaves,
    lambda inner: st.one_of(
        inner.map(Not),
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: And(tuple(xs))),
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: Or(tuple(xs))),
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(selectors)
def test_round_trip_canonical_text(node: Selector) -> None:
    text = str(node)
    reparsed = parse_selector(text)
    assert reparsed == node
    assert str(reparsed) == text


@settings(max_examples=200, deadline=None)
@given(selectors, label_maps)
def test_semantics_match_reference(node: Selector, labels: dict[str, str]) -> None:
    assert parse_selector(str(node)).matches(labels) == _reference(node, labels)


def _reference(node: Selector, labels: dict[str, str]) -> bool:
    """An independent evaluator over the tree, written from Calico's documentation."""
    if isinstance(node, All):
        return True
    if isinstance(node, Has):
        return node.key in labels
    if isinstance(node, Compare):
        if node.op == "!=":
            return labels.get(node.key) != node.value
        value = labels.get(node.key)
        if value is None:
            return False
        return {
            "==": value == node.value,
            "starts with": value.startswith(node.value),
            "ends with": value.endswith(node.value),
            "contains": node.value in value,
        }[node.op]
    if isinstance(node, In):
        present = node.key in labels and labels[node.key] in node.values
        return not present if node.negated else present
    if isinstance(node, Not):
        return not _reference(node.operand, labels)
    if isinstance(node, And):
        return all(_reference(op, labels) for op in node.operands)
    assert isinstance(node, Or)
    return any(_reference(op, labels) for op in node.operands)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="ab()!&|={}',\" hasl", max_size=30))
def test_garbage_only_raises_selector_error(expr: str) -> None:
    try:
        node = parse_selector(expr)
    except SelectorError:
        return
    assert isinstance(node, Selector)
    assert parse_selector(str(node)) == node
