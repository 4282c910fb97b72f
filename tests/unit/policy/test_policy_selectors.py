"""LabelSelector parsing, matching and canonical form."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy import LabelSelector, PolicyError, Requirement, parse_selector


def sel(obj: dict[str, Any] | None) -> LabelSelector:
    """Parse with a fixed path."""
    return parse_selector(obj, "spec.podSelector")


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    """One matchExpressions entry."""
    out: dict[str, Any] = {"key": key, "operator": op}
    if values:
        out["values"] = list(values)
    return out


def test_empty_and_absent_selectors_match_everything() -> None:
    objs: list[dict[str, Any] | None] = [None, {}, {"matchLabels": {}}, {"matchExpressions": []}]
    for obj in objs:
        assert sel(obj).is_empty
        assert sel(obj).matches({})
        assert sel(obj).matches({"a": "b"})
        assert sel(obj).canonical() == "all()"


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({"matchLabels": {"app": "web"}}, {"app": "web", "x": "y"}, True),
        ({"matchLabels": {"app": "web"}}, {"app": "db"}, False),
        ({"matchLabels": {"app": "web"}}, {}, False),
        ({"matchExpressions": [expr("app", "In", "web", "db")]}, {"app": "db"}, True),
        ({"matchExpressions": [expr("app", "In", "web")]}, {}, False),
        ({"matchExpressions": [expr("app", "NotIn", "web")]}, {"app": "db"}, True),
        ({"matchExpressions": [expr("app", "NotIn", "web")]}, {"app": "web"}, False),
        # NotIn matches objects without the key (apimachinery semantics).
        ({"matchExpressions": [expr("app", "NotIn", "web")]}, {}, True),
        ({"matchExpressions": [expr("app", "Exists")]}, {"app": ""}, True),
        ({"matchExpressions": [expr("app", "Exists")]}, {"other": "x"}, False),
        ({"matchExpressions": [expr("app", "DoesNotExist")]}, {}, True),
        ({"matchExpressions": [expr("app", "DoesNotExist")]}, {"app": "x"}, False),
        # matchLabels and matchExpressions are ANDed.
        (
            {"matchLabels": {"a": "1"}, "matchExpressions": [expr("b", "Exists")]},
            {"a": "1"},
            False,
        ),
        (
            {"matchLabels": {"a": "1"}, "matchExpressions": [expr("b", "Exists")]},
            {"a": "1", "b": "2"},
            True,
        ),
    ],
)
def test_matching(selector: dict[str, Any], labels: dict[str, str], expected: bool) -> None:
    assert sel(selector).matches(labels) is expected


def test_equivalent_selectors_share_a_canonical_form() -> None:
    a = sel({"matchLabels": {"app": "web", "tier": "1"}})
    b = sel({"matchExpressions": [expr("tier", "In", "1"), expr("app", "In", "web")]})
    c = sel({"matchLabels": {"app": "web"}, "matchExpressions": [expr("tier", "In", "1", "1")]})
    assert a == b == c
    assert a.canonical() == b.canonical() == c.canonical() == '"app" == "web" && "tier" == "1"'


def test_different_selectors_have_different_canonical_forms() -> None:
    forms = {
        sel(obj).canonical()
        for obj in (
            {},
            {"matchLabels": {"app": "web"}},
            {"matchExpressions": [expr("app", "NotIn", "web")]},
            {"matchExpressions": [expr("app", "In", "web", "db")]},
            {"matchExpressions": [expr("app", "Exists")]},
            {"matchExpressions": [expr("app", "DoesNotExist")]},
        )
    }
    assert len(forms) == 6
    # json quoting keeps one value containing a comma apart from two values
    # (such values cannot come from the API, but the form must not depend on that).
    one = LabelSelector((Requirement("app", "In", ("a,b",)),))
    two = LabelSelector((Requirement("app", "In", ("a", "b")),))
    assert one.canonical() != two.canonical()


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        ([], "must be an object"),
        ({"matchLabel": {"a": "b"}}, "unknown selector field"),
        ({"matchLabels": ["a"]}, "map of strings"),
        ({"matchLabels": {"a": 1}}, "must be a string"),
        ({"matchLabels": {"-bad": "x"}}, "name part"),
        ({"matchLabels": {"a": "not valid!"}}, "label value"),
        ({"matchLabels": {"a" * 64: "x"}}, "name part"),
        ({"matchLabels": {"Bad_Prefix/a": "x"}}, "invalid prefix"),
        ({"matchExpressions": {"key": "a"}}, "must be a list"),
        ({"matchExpressions": ["a"]}, "must be an object"),
        ({"matchExpressions": [expr("a", "Equals", "x")]}, "operator"),
        ({"matchExpressions": [expr("a", "In")]}, "at least one value"),
        ({"matchExpressions": [expr("a", "Exists", "x")]}, "takes no values"),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]}, "list"),
        ({"matchExpressions": [{"operator": "Exists"}]}, "label key"),
    ],
)
def test_invalid_selectors_raise_policy_error(obj: Any, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        sel(obj)
    assert fragment in str(info.value)
    assert "spec.podSelector" in str(info.value)


def test_prefixed_keys_are_accepted() -> None:
    s = sel({"matchLabels": {"kubernetes.io/metadata.name": "default"}})
    assert s.matches({"kubernetes.io/metadata.name": "default"})


KEYS = st.sampled_from(["a", "b"])
VALUES = st.sampled_from(["1", "2", "3"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            KEYS,
            st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
            st.lists(VALUES, min_size=1, max_size=3),
        ),
        max_size=3,
    ),
    st.dictionaries(KEYS, VALUES),
)
def test_matching_is_order_independent_and_agrees_with_canonical_equality(
    terms: list[tuple[str, str, list[str]]], labels: dict[str, str]
) -> None:
    exprs = [expr(k, op, *(vals if op in ("In", "NotIn") else [])) for k, op, vals in terms]
    forward = sel({"matchExpressions": exprs})
    backward = sel({"matchExpressions": list(reversed(exprs))})
    assert forward == backward
    assert forward.canonical() == backward.canonical()
    assert forward.matches(labels) == backward.matches(labels)
    expected = all(
        (op == "In" and labels.get(k) in vals)
        or (op == "NotIn" and labels.get(k) not in vals)
        or (op == "Exists" and k in labels)
        or (op == "DoesNotExist" and k not in labels)
        for k, op, vals in terms
    )
    assert forward.matches(labels) is expected
