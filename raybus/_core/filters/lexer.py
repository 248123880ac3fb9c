"""Tokens of the Service Bus SQL filter and action language.

``tokenize(text)`` turns a filter or action text into a list of ``Token`` ending with an
``EOF`` token, or raises ``FilterSyntaxError`` carrying the 0-based offset of the first
character it cannot read. It never raises anything else, whatever the text.

Keywords (``AND OR NOT IS NULL IN LIKE ESCAPE EXISTS TRUE FALSE``) are recognised
case-insensitively. ``SET``/``REMOVE`` and the function names ``newid``/``property``/``p`` are
*not* keywords here: they stay identifiers and the parser gives them meaning only where they
can have one (statement starts, before ``(``), so ``p = 1`` tests a user property named ``p``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ...exceptions import FilterSyntaxError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "KEYWORDS",
    "MAX_TEXT_LENGTH",
    "Token",
    "syntax_error",
    "tokenize",
]

MAX_TEXT_LENGTH = 1024
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "IS", "NULL", "IN", "LIKE", "ESCAPE", "EXISTS", "TRUE", "FALSE"}
)

# Token kinds.
INT, FLOAT, STRING, IDENT, PARAM, KEYWORD, OP, EOF = (
    "INT",
    "FLOAT",
    "STRING",
    "IDENT",
    "PARAM",
    "KEYWORD",
    "OP",
    "EOF",
)


@dataclass(frozen=True, slots=True)
class Token:
    """One token. ``value`` depends on ``kind``:

    * ``INT``/``FLOAT``: the number; ``STRING``: the unescaped text;
    * ``IDENT``: ``(scope, name, bare)`` where scope is ``"sys"``, ``"user"`` or ``None``
      (unscoped) and ``bare`` is True for a regular identifier without scope (the only kind that
      may be a function name or ``SET``/``REMOVE``);
    * ``PARAM``: the parameter name without ``@``, lower-cased;
    * ``KEYWORD``: the upper-cased keyword; ``OP``: the operator text (``!=`` becomes ``<>``);
    * ``EOF``: ``None``.
    """

    kind: str
    value: Any
    pos: int


def syntax_error(text: str, position: int | None, message: str) -> FilterSyntaxError:
    """A ``FilterSyntaxError`` whose message names the position."""
    where = f" at position {position}" if position is not None else ""
    return FilterSyntaxError(f"SQL syntax error{where}: {message}", None, text, position)


_WS = re.compile(r"\s+")
_NUMBER = re.compile(
    r"(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+|[0-9]+"
)
_REGULAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SCOPE = re.compile(r"(sys|user)\.", re.IGNORECASE)
_NAME_CHAR = re.compile(r"[A-Za-z0-9_]")
_OPERATORS = ("<>", "!=", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",", ";")


def _quoted(text: str, pos: int, close: str, what: str) -> tuple[str, int]:
    """Read a ``'string'``, ``[delimited]`` or ``"quoted"`` token starting at ``pos`` (the
    opening character); a doubled closing character is an escaped one. Returns the unescaped
    content and the offset after the closing character."""
    parts: list[str] = []
    i = pos + 1
    n = len(text)
    while True:
        j = text.find(close, i)
        if j < 0:
            raise syntax_error(text, pos, f"unterminated {what}")
        parts.append(text[i:j])
        if j + 1 < n and text[j + 1] == close:
            parts.append(close)
            i = j + 2
            continue
        return "".join(parts), j + 1


def _identifier(text: str, pos: int) -> tuple[str, int]:
    """A regular, ``[delimited]`` or ``"quoted"`` name at ``pos``."""
    ch = text[pos] if pos < len(text) else ""
    if ch == "[":
        name, end = _quoted(text, pos, "]", "delimited identifier")
    elif ch == '"':
        name, end = _quoted(text, pos, '"', "quoted identifier")
    else:
        m = _REGULAR.match(text, pos)
        if m is None:
            raise syntax_error(text, pos, "expected a property name")
        return m.group(), m.end()
    if not name:
        raise syntax_error(text, pos, "empty identifier")
    return name, end


def _number(text: str, pos: int, m: re.Match[str]) -> Token:
    lexeme = m.group()
    if m.end() < len(text) and _NAME_CHAR.match(text, m.end()):
        raise syntax_error(text, pos, f"invalid number {text[pos : m.end() + 1]!r}")
    if any(c in lexeme for c in ".eE"):
        value = float(lexeme)
        if math.isinf(value):
            raise syntax_error(text, pos, f"number {lexeme} is out of the range of a double")
        return Token(FLOAT, value, pos)
    ivalue = int(lexeme)
    if ivalue > INT64_MAX:
        raise syntax_error(text, pos, f"integer {lexeme} does not fit a 64-bit integer")
    return Token(INT, ivalue, pos)


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``; raises ``FilterSyntaxError`` (and only that) when it can't."""
    if len(text) > MAX_TEXT_LENGTH:
        raise syntax_error(
            text,
            MAX_TEXT_LENGTH,
            f"the expression is {len(text)} characters long; at most {MAX_TEXT_LENGTH} are allowed",
        )
    tokens: list[Token] = []
    pos = 0
    n = len(text)
    while True:
        m = _WS.match(text, pos)
        if m is not None:
            pos = m.end()
        if pos >= n:
            tokens.append(Token(EOF, None, n))
            return tokens
        ch = text[pos]
        if ch == "'":
            value, end = _quoted(text, pos, "'", "string literal")
            tokens.append(Token(STRING, value, pos))
            pos = end
            continue
        if ch.isascii() and (ch.isdigit() or (ch == "." and pos + 1 < n)):
            nm = _NUMBER.match(text, pos)
            if nm is not None:
                tokens.append(_number(text, pos, nm))
                pos = nm.end()
                continue
        if ch == "@":
            pm = _REGULAR.match(text, pos + 1)
            if pm is None:
                raise syntax_error(text, pos, "expected a parameter name after '@'")
            tokens.append(Token(PARAM, pm.group().lower(), pos))
            pos = pm.end()
            continue
        if ch in '["' or _REGULAR.match(text, pos):
            scope: str | None = None
            start = pos
            sm = _SCOPE.match(text, pos)
            if sm is not None:
                scope = sm.group(1).lower()
                pos = sm.end()
            name, end = _identifier(text, pos)
            bare = scope is None and ch not in '["'
            if bare and name.upper() in KEYWORDS:
                tokens.append(Token(KEYWORD, name.upper(), start))
            else:
                tokens.append(Token(IDENT, (scope, name, bare), start))
            pos = end
            continue
        for op in _OPERATORS:
            if text.startswith(op, pos):
                tokens.append(Token(OP, "<>" if op == "!=" else op, pos))
                pos += len(op)
                break
        else:
            raise syntax_error(text, pos, f"unexpected character {ch!r}")
