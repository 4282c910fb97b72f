"""Kubernetes LabelSelector: parsing, matching and a canonical string.

The canonical string is what ipset names are hashed from, so two selectors
that mean the same thing (``matchLabels: {a: x}`` and ``a In [x]``, or the
same requirement written twice) must give the same string, and two that mean
different things must not.  Matching follows apimachinery's ``labels``
package: requirements are ANDed; ``NotIn`` and ``DoesNotExist`` match a pod
that lacks the key; an empty selector matches everything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policy.errors import PolicyError

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN_RE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def label_key_problem(key: object) -> str | None:
    """Why ``key`` is not a valid label key (qualified name), or None."""
    if not isinstance(key, str) or not key:
        return f"label key {key!r} must be a non-empty string"
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN_RE.match(prefix)):
        return f"label key {key!r} has an invalid prefix (must be a DNS subdomain)"
    if len(name) > 63 or not _NAME_RE.match(name):
        return (
            f"label key {key!r}: name part must be at most 63 characters of "
            "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        )
    return None


def label_value_problem(value: object) -> str | None:
    """Why ``value`` is not a valid label value, or None."""
    if not isinstance(value, str):
        return f"label value {value!r} must be a string"
    if value and (len(value) > 63 or not _NAME_RE.match(value)):
        return (
            f"label value {value!r} must be empty or at most 63 characters of "
            "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        )
    return None


@dataclass(frozen=True, order=True)
class Requirement:
    """One ``key op values`` term; values are sorted and de-duplicated."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a label map satisfies this term (apimachinery semantics)."""
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values

    def canonical(self) -> str:
        """Stable text for hashing; json quoting keeps it unambiguous."""
        key = json.dumps(self.key)
        if self.operator == "Exists":
            return f"has({key})"
        if self.operator == "DoesNotExist":
            return f"!has({key})"
        if self.operator == "In" and len(self.values) == 1:
            return f"{key} == {json.dumps(self.values[0])}"
        if self.operator == "NotIn" and len(self.values) == 1:
            return f"{key} != {json.dumps(self.values[0])}"
        word = "in" if self.operator == "In" else "not in"
        return f"{key} {word} {{{', '.join(json.dumps(v) for v in self.values)}}}"


@dataclass(frozen=True)
class LabelSelector:
    """An AND of requirements, kept sorted so equal selectors compare equal."""

    requirements: tuple[Requirement, ...] = ()

    @property
    def is_empty(self) -> bool:
        """An empty selector selects every object."""
        return not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether all requirements hold for ``labels``."""
        return all(r.matches(labels) for r in self.requirements)

    def canonical(self) -> str:
        """``all()`` for the empty selector, else terms joined by `` && ``."""
        if not self.requirements:
            return "all()"
        return " && ".join(r.canonical() for r in self.requirements)


EVERYTHING = LabelSelector()


def parse_selector(obj: Any, path: str) -> LabelSelector:
    """Parse an API LabelSelector dict; raise PolicyError naming ``path``."""
    if obj is None:
        return EVERYTHING
    if not isinstance(obj, dict):
        raise PolicyError("a label selector must be an object", path=path)
    unknown = set(obj) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise PolicyError(f"unknown selector field(s) {sorted(unknown)}", path=path)
    reqs = _parse_match_labels(obj.get("matchLabels"), f"{path}.matchLabels")
    reqs += _parse_match_expressions(obj.get("matchExpressions"), f"{path}.matchExpressions")
    return LabelSelector(tuple(sorted(set(reqs))))


def _parse_match_labels(obj: Any, path: str) -> list[Requirement]:
    """matchLabels ``{k: v}`` is shorthand for ``k In [v]``."""
    if obj is None:
        return []
    if not isinstance(obj, dict):
        raise PolicyError("matchLabels must be a map of strings", path=path)
    reqs = []
    for key, value in obj.items():
        problem = label_key_problem(key) or label_value_problem(value)
        if problem:
            raise PolicyError(problem, path=path)
        reqs.append(Requirement(key, "In", (value,)))
    return reqs


def _parse_match_expressions(obj: Any, path: str) -> list[Requirement]:
    """Each expression is validated as the apiserver would."""
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise PolicyError("matchExpressions must be a list", path=path)
    return [_parse_expression(e, f"{path}[{i}]") for i, e in enumerate(obj)]


def _parse_expression(obj: Any, path: str) -> Requirement:
    """One ``{key, operator, values}`` entry."""
    if not isinstance(obj, dict):
        raise PolicyError("an expression must be an object", path=path)
    key, op, values = obj.get("key"), obj.get("operator"), obj.get("values")
    problem = label_key_problem(key)
    if problem:
        raise PolicyError(problem, path=f"{path}.key")
    if op not in OPERATORS:
        raise PolicyError(f"operator {op!r} is not one of {', '.join(OPERATORS)}", path=path)
    values = [] if values is None else values
    if not isinstance(values, list):
        raise PolicyError("values must be a list of strings", path=f"{path}.values")
    for value in values:
        problem = label_value_problem(value)
        if problem:
            raise PolicyError(problem, path=f"{path}.values")
    if op in ("In", "NotIn") and not values:
        raise PolicyError(f"operator {op} needs at least one value", path=f"{path}.values")
    if op in ("Exists", "DoesNotExist") and values:
        raise PolicyError(f"operator {op} takes no values", path=f"{path}.values")
    return Requirement(str(key), str(op), tuple(sorted(set(values))))
