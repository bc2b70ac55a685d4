"""The ``--where`` language of ``flightlog ls`` and ``flightlog.runs(where=...)``.

A tiny, safe grammar parsed here into a tree; :mod:`flightlog.store.index` turns the
tree into SQL whose values are always bound parameters (never pasted into the text)::

    expr   := or
    or     := and ("or" and)*
    and    := not ("and" not)*
    not    := "not" not | "(" expr ")" | FIELD OP VALUE
    OP     := = == != < <= > >= ~ !~        (~ : contains, or glob when the value has * ? [)
    VALUE  := a number, a bare word (sft, qwen2-7b, 2026-11-30) or a quoted string

Errors name the position, so a typo in a long expression is easy to find.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

OPERATORS = ("<=", ">=", "!=", "==", "!~", "=", "<", ">", "~")
KEYWORDS = ("and", "or", "not")

_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<lparen>\()
      | (?P<rparen>\))
      | (?P<op><=|>=|!=|==|!~|=|<|>|~)
      | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
      | (?P<word>[^\s()<>=!~'"]+)
      | (?P<bad>.)""",
    re.VERBOSE,
)


class WhereError(ValueError):
    """A malformed expression; ``str()`` shows the expression with a caret at ``pos``."""

    def __init__(self, message: str, text: str, pos: int) -> None:
        self.message = message
        self.text = text
        self.pos = pos
        super().__init__(f"position {pos + 1}: {message}\n  {text}\n  {' ' * pos}^")


@dataclass(frozen=True)
class Token:
    kind: str  # lparen rparen op string word and or not end
    text: str
    pos: int


@dataclass(frozen=True)
class Compare:
    field: str
    op: str
    value: str
    quoted: bool
    pos: int  # of the field, for error messages
    value_pos: int

    @property
    def number(self) -> float | None:
        """The value as a number, when it is an unquoted number."""
        if self.quoted:
            return None
        try:
            return float(self.value)
        except ValueError:
            return None


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" | "or"
    items: tuple["Node", ...]


@dataclass(frozen=True)
class Not:
    item: "Node"


Node = Union[Compare, BoolOp, Not]


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "bad"
        value = m.group()
        if kind == "space":
            continue
        if kind == "bad":
            raise WhereError(f"unexpected character {value!r}", text, m.start())
        if kind == "string":
            body = value[1:-1]
            value = re.sub(r"\\(.)", r"\1", body)
        elif kind == "word" and value.lower() in KEYWORDS:
            kind = value.lower()
        if kind == "op" and value == "==":
            value = "="
        tokens.append(Token(kind, value, m.start()))
    tokens.append(Token("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0

    def peek(self) -> Token:
        return self.tokens[self.i]

    def take(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def fail(self, message: str, tok: Token) -> WhereError:
        return WhereError(message, self.text, tok.pos)

    def parse(self) -> Node:
        if self.peek().kind == "end":
            raise self.fail("empty expression", self.peek())
        node = self.parse_or()
        tok = self.peek()
        if tok.kind != "end":
            hint = " (missing 'and' or 'or'?)" if tok.kind in ("word", "string", "lparen") else ""
            raise self.fail(f"unexpected {tok.text!r}{hint}", tok)
        return node

    def parse_or(self) -> Node:
        items = [self.parse_and()]
        while self.peek().kind == "or":
            self.take()
            items.append(self.parse_and())
        return items[0] if len(items) == 1 else BoolOp("or", tuple(items))

    def parse_and(self) -> Node:
        items = [self.parse_not()]
        while self.peek().kind == "and":
            self.take()
            items.append(self.parse_not())
        return items[0] if len(items) == 1 else BoolOp("and", tuple(items))

    def parse_not(self) -> Node:
        tok = self.peek()
        if tok.kind == "not":
            self.take()
            return Not(self.parse_not())
        if tok.kind == "lparen":
            self.take()
            node = self.parse_or()
            close = self.peek()
            if close.kind != "rparen":
                raise self.fail(f"expected ')' to close the '(' opened at position {tok.pos + 1}", close)
            self.take()
            return node
        return self.parse_compare()

    def parse_compare(self) -> Compare:
        field = self.take()
        if field.kind != "word":
            what = "end of expression" if field.kind == "end" else repr(field.text)
            raise self.fail(f"expected a field name, got {what}", field)
        op = self.take()
        if op.kind != "op":
            what = "end of expression" if op.kind == "end" else repr(op.text)
            raise self.fail(f"expected an operator ({' '.join(OPERATORS)}) after {field.text!r}, got {what}", op)
        value = self.take()
        if value.kind not in ("word", "string"):
            what = "end of expression" if value.kind == "end" else repr(value.text)
            raise self.fail(f"expected a value after {field.text}{op.text}, got {what}", value)
        return Compare(field.text, op.text, value.text, value.kind == "string", field.pos, value.pos)


def parse(text: str) -> Node:
    """The tree of a ``--where`` expression; raises :class:`WhereError`."""
    if not isinstance(text, str):
        raise TypeError(f"where must be a string, got {type(text).__name__}")
    return _Parser(text).parse()


def compares(node: Node) -> list[Compare]:
    """Every comparison in the tree, left to right (``ls`` shows their fields as columns)."""
    if isinstance(node, Compare):
        return [node]
    if isinstance(node, Not):
        return compares(node.item)
    return [c for item in node.items for c in compares(item)]
