"""Calico-style label selector expressions: parse once, evaluate against label maps.

Used by IPPool.nodeSelector and BGPPeer nodeSelector/peerSelector. The grammar is
Calico's (a subset large enough for node selection):

    expr    := or
    or      := and ('||' and)*
    and     := unary ('&&' unary)*
    unary   := '!' unary | primary
    primary := '(' expr ')' | 'all()' | 'has(' KEY ')'
             | KEY ('==' | '!=') VALUE
             | KEY ['not'] 'in' '{' [VALUE (',' VALUE)*] '}'
             | KEY ('starts with' | 'ends with' | 'contains') VALUE

VALUE is a single- or double-quoted string without escapes. As in Calico, `!=` and
`not in` also match when the label is absent, and an empty expression means `all()`.
Every node renders back (`str()`) to a canonical expression that parses to an equal
node, so selectors can be compared and hashed (ipset names, peer identities).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "All",
    "And",
    "Compare",
    "Has",
    "In",
    "Not",
    "Or",
    "Selector",
    "SelectorError",
    "parse_selector",
]

_MAX_KEY = 512


class SelectorError(ValueError):
    """A selector expression that does not parse; the message points at the spot."""


class Selector:
    """A parsed selector: `matches(labels)` says whether a label map is selected."""

    def matches(self, labels: Mapping[str, str]) -> bool:
        raise NotImplementedError

    def __str__(self) -> str:
        raise NotImplementedError


def _quote(value: str) -> str:
    """Quote a value so it parses back: single quotes unless the value holds one."""
    return f'"{value}"' if "'" in value else f"'{value}'"


@dataclass(frozen=True)
class All(Selector):
    """Matches every label map."""

    def matches(self, labels: Mapping[str, str]) -> bool:
        return True

    def __str__(self) -> str:
        return "all()"


@dataclass(frozen=True)
class Has(Selector):
    """The label is present (any value)."""

    key: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.key in labels

    def __str__(self) -> str:
        return f"has({self.key})"


_COMPARE_OPS = ("==", "!=", "starts with", "ends with", "contains")


@dataclass(frozen=True)
class Compare(Selector):
    """key <op> 'value'; `!=` also matches an absent label (Calico semantics)."""

    key: str
    op: str
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.key)
        if self.op == "!=":
            return actual != self.value
        if actual is None:
            return False
        if self.op == "==":
            return actual == self.value
        if self.op == "starts with":
            return actual.startswith(self.value)
        if self.op == "ends with":
            return actual.endswith(self.value)
        return self.value in actual

    def __str__(self) -> str:
        return f"{self.key} {self.op} {_quote(self.value)}"


@dataclass(frozen=True)
class In(Selector):
    """key in {...}; negated (`not in`) also matches an absent label."""

    key: str
    values: frozenset[str]
    negated: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.key)
        inside = actual is not None and actual in self.values
        return not inside if self.negated else inside

    def __str__(self) -> str:
        body = ", ".join(_quote(v) for v in sorted(self.values))
        return f"{self.key} {'not in' if self.negated else 'in'} {{{body}}}"


@dataclass(frozen=True)
class Not(Selector):
    operand: Selector

    def matches(self, labels: Mapping[str, str]) -> bool:
        return not self.operand.matches(labels)

    def __str__(self) -> str:
        if isinstance(self.operand, Has):
            return f"!{self.operand}"
        return f"!({self.operand})"


@dataclass(frozen=True)
class And(Selector):
    operands: tuple[Selector, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(op.matches(labels) for op in self.operands)

    def __str__(self) -> str:
        return " && ".join(_wrap(op) for op in self.operands)


@dataclass(frozen=True)
class Or(Selector):
    operands: tuple[Selector, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return any(op.matches(labels) for op in self.operands)

    def __str__(self) -> str:
        return " || ".join(_wrap(op) for op in self.operands)


def _wrap(node: Selector) -> str:
    """Parenthesise a nested and/or so the canonical text parses back to the same tree."""
    return f"({node})" if isinstance(node, (And, Or)) else str(node)


# -- tokenizer ----------------------------------------------------------------------
_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<str>'[^']*'|"[^"]*")
      | (?P<op>&&|\|\||==|!=|[!(){},])
      | (?P<word>[A-Za-z0-9_][A-Za-z0-9_./-]*)
    )""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Token:
    kind: str  # "str" | "op" | "word" | "end"
    text: str
    pos: int


def _tokenize(expr: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        match = _TOKEN_RE.match(expr, pos)
        if not match or match.lastgroup is None:
            start = len(expr) - len(expr[pos:].lstrip())
            raise SelectorError(
                f"unexpected character {expr[start]!r} at position {start} in selector {expr!r}"
            )
        kind = match.lastgroup
        text = match.group(kind)
        tokens.append(_Token(kind, text, match.start(kind)))
        pos = match.end()
    tokens.append(_Token("end", "", len(expr)))
    return tokens


# -- parser -------------------------------------------------------------------------
class _Parser:
    """Recursive descent over the token list; one method per grammar rule."""

    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.tokens = _tokenize(expr)
        self.i = 0

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        token = self.peek()
        self.i += 1
        return token

    def error(self, what: str, token: _Token | None = None) -> SelectorError:
        token = token or self.peek()
        found = "end of input" if token.kind == "end" else repr(token.text)
        return SelectorError(
            f"{what} at position {token.pos} in selector {self.expr!r}, found {found}"
        )

    def expect_op(self, op: str) -> None:
        token = self.take()
        if token.kind != "op" or token.text != op:
            raise self.error(f"expected {op!r}", token)

    def parse(self) -> Selector:
        node = self.parse_or()
        if self.peek().kind != "end":
            raise self.error("expected '&&', '||' or end of selector")
        return node

    def parse_or(self) -> Selector:
        operands = [self.parse_and()]
        while self._at_op("||"):
            self.take()
            operands.append(self.parse_and())
        return operands[0] if len(operands) == 1 else Or(tuple(operands))

    def parse_and(self) -> Selector:
        operands = [self.parse_unary()]
        while self._at_op("&&"):
            self.take()
            operands.append(self.parse_unary())
        return operands[0] if len(operands) == 1 else And(tuple(operands))

    def parse_unary(self) -> Selector:
        if self._at_op("!"):
            self.take()
            return Not(self.parse_unary())
        return self.parse_primary()

    def parse_primary(self) -> Selector:
        token = self.peek()
        if self._at_op("("):
            self.take()
            node = self.parse_or()
            self.expect_op(")")
            return node
        if token.kind != "word":
            raise self.error("expected a label key, 'all()', 'has(...)', '!' or '('")
        if token.text in ("all", "has") and self._at_op("(", ahead=1):
            return self.parse_function()
        return self.parse_comparison()

    def parse_function(self) -> Selector:
        name = self.take().text
        self.expect_op("(")
        if name == "all":
            self.expect_op(")")
            return All()
        key = self.parse_key()
        self.expect_op(")")
        return Has(key)

    def parse_key(self) -> str:
        token = self.take()
        if token.kind != "word":
            raise self.error("expected a label key", token)
        if len(token.text) > _MAX_KEY:
            raise self.error(f"label key longer than {_MAX_KEY} characters", token)
        return token.text

    def parse_comparison(self) -> Selector:
        key = self.parse_key()
        token = self.peek()
        if token.kind == "op" and token.text in ("==", "!="):
            self.take()
            return Compare(key, token.text, self.parse_value())
        if token.kind == "word":
            return self.parse_word_operator(key)
        raise self.error(f"expected an operator after label key {key!r}")

    def parse_word_operator(self, key: str) -> Selector:
        first = self.take().text
        if first == "in":
            return In(key, self.parse_set())
        if first == "contains":
            return Compare(key, "contains", self.parse_value())
        second = self.peek()
        two = f"{first} {second.text}" if second.kind == "word" else first
        if two == "not in":
            self.take()
            return In(key, self.parse_set(), negated=True)
        if two in ("starts with", "ends with"):
            self.take()
            return Compare(key, two, self.parse_value())
        raise self.error(f"unknown operator after label key {key!r}", self.tokens[self.i - 1])

    def parse_value(self) -> str:
        token = self.take()
        if token.kind != "str":
            raise self.error("expected a quoted value", token)
        return token.text[1:-1]

    def parse_set(self) -> frozenset[str]:
        self.expect_op("{")
        values: list[str] = []
        if self._at_op("}"):
            self.take()
            return frozenset()
        values.append(self.parse_value())
        while self._at_op(","):
            self.take()
            values.append(self.parse_value())
        self.expect_op("}")
        return frozenset(values)

    def _at_op(self, op: str, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == "op" and token.text == op


def parse_selector(expr: str) -> Selector:
    """Parse a selector expression; raise SelectorError saying where it went wrong.

    An empty (or blank) expression selects everything, as in Calico.
    """
    if not isinstance(expr, str):
        raise SelectorError(f"selector must be a string, got {type(expr).__name__}")
    if not expr.strip():
        return All()
    return _Parser(expr).parse()
