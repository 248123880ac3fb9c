"""The tokenizer and recursive-descent parser of the reference SQL filter evaluator
(``sql_reference``; tests only): the outcome classes, keywords, system property names, the
two reference exceptions, and ``parse`` (text and parameters to a tree of plain tuples).
Written from the semantics documents alone, without reading ``raybus._core.filters``.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any

TRUE, FALSE, UNKNOWN = "TRUE", "FALSE", "UNKNOWN"
SYNTAX_ERROR, EVAL_ERROR = "SYNTAX_ERROR", "EVAL_ERROR"
OUTCOMES = (TRUE, FALSE, UNKNOWN, SYNTAX_ERROR, EVAL_ERROR)
LOGIC_POLICIES = ("strict", "lazy", "absorbing")
MEMBERSHIP_POLICIES = ("strict", "lazy")

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_TEXT_LENGTH = 1024

KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "IS", "NULL", "IN", "LIKE", "ESCAPE", "EXISTS", "TRUE", "FALSE"}
    | {"SET", "REMOVE"}
)
FUNCTIONS = frozenset({"newid", "property", "p"})

# sys.<name> (lower case) -> (MessageRecord field, is a time in epoch seconds)
SYSTEM_PROPERTIES: dict[str, tuple[str, bool]] = {
    "messageid": ("message_id", False),
    "correlationid": ("correlation_id", False),
    "to": ("to", False),
    "replyto": ("reply_to", False),
    "label": ("subject", False),
    "subject": ("subject", False),
    "sessionid": ("session_id", False),
    "replytosessionid": ("reply_to_session_id", False),
    "contenttype": ("content_type", False),
    "partitionkey": ("partition_key", False),
    "sequencenumber": ("sequence_number", False),
    "deliverycount": ("delivery_count", False),
    "enqueuedtimeutc": ("enqueued_time", True),
    "scheduledenqueuetimeutc": ("scheduled_enqueue_time", True),
    "timetolive": ("time_to_live", False),
    "size": ("size", False),
}


class RefSyntaxError(Exception):
    """The text does not compile (bad token, grammar, literal, escape or missing parameter)."""


class RefEvalError(Exception):
    """Evaluation failed; ``args[0]`` is a short kind such as ``"TypeMismatch"``."""


# --------------------------------------------------------------------------------------------
# Tokenizer. A token is (kind, value, position):
#   "int" / "float" / "str"      literal values
#   "kw"                         upper-cased keyword
#   "ident"                      regular identifier (original spelling), maybe a function name
#   "prop"                       (scope, name): scope is "user" or "sys"; from a scoped name or a
#                                [delimited] / "quoted" identifier
#   "param"                      parameter name without "@", lower-cased
#   "op"                         ( ) , = <> != < <= > >= + - * / %
#   "eof"
# --------------------------------------------------------------------------------------------

Token = tuple[str, Any, int]
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_DIGITS = "0123456789"
_OPERATORS = ("<>", "<=", ">=", "!=", "=", "<", ">", "(", ")", ",", "+", "-", "*", "/", "%")


def _read_enclosed(text: str, pos: int, close: str) -> tuple[str, int]:
    """Read ``[..]``, ``".."`` or ``'..'`` starting at ``pos``; a doubled ``close`` escapes it."""
    out = []
    i = pos + 1
    while True:
        if i >= len(text):
            raise RefSyntaxError(f"unterminated {text[pos]} at {pos}")
        c = text[i]
        if c == close:
            if i + 1 < len(text) and text[i + 1] == close:
                out.append(close)
                i += 2
                continue
            return "".join(out), i + 1
        out.append(c)
        i += 1


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c in " \t\r\n":
            i += 1
            continue
        start = i
        if c in _DIGITS or (c == "." and i + 1 < len(text) and text[i + 1] in _DIGITS):
            m = _NUMBER.match(text, i)
            assert m is not None
            literal = m.group(0)
            i = m.end()
            if "." in literal or "e" in literal.lower():
                tokens.append(("float", float(literal), start))
            else:
                value = int(literal)
                if value > INT64_MAX:
                    raise RefSyntaxError(f"integer literal {literal} does not fit Int64")
                tokens.append(("int", value, start))
            continue
        if c == "'":
            value, i = _read_enclosed(text, i, "'")
            tokens.append(("str", value, start))
            continue
        if c == "[":
            value, i = _read_enclosed(text, i, "]")
            tokens.append(("prop", ("user", value), start))
            continue
        if c == '"':
            value, i = _read_enclosed(text, i, '"')
            tokens.append(("prop", ("user", value), start))
            continue
        if c == "@":
            m = _WORD.match(text, i + 1)
            if m is None:
                raise RefSyntaxError(f"'@' without a parameter name at {i}")
            tokens.append(("param", m.group(0).lower(), start))
            i = m.end()
            continue
        m = _WORD.match(text, i)
        if m is not None:
            word = m.group(0)
            i = m.end()
            if word.lower() in ("sys", "user") and i < len(text) and text[i] == ".":
                scope = word.lower()
                i += 1
                if i < len(text) and text[i] in '["':
                    name, i = _read_enclosed(text, i, "]" if text[i] == "[" else '"')
                else:
                    m2 = _WORD.match(text, i)
                    if m2 is None:
                        raise RefSyntaxError(f"a property name must follow '{word}.' at {i}")
                    name, i = m2.group(0), m2.end()
                tokens.append(("prop", (scope, name), start))
            elif word.upper() in KEYWORDS:
                tokens.append(("kw", word.upper(), start))
            else:
                tokens.append(("ident", word, start))
            continue
        for op in _OPERATORS:
            if text.startswith(op, i):
                tokens.append(("op", op, start))
                i += len(op)
                break
        else:
            raise RefSyntaxError(f"unexpected character {c!r} at {i}")
    tokens.append(("eof", None, len(text)))
    return tokens


# --------------------------------------------------------------------------------------------
# Parser. AST nodes are tuples whose first element names the node:
#   ("lit", value)  ("param", name)  ("prop", scope, name)  ("newid",)  ("pfunc", name_expr)
#   ("neg", x)  ("pos", x)  ("arith", op, left, right)
#   ("cmp", op, left, right)  ("isnull", x, negated)  ("in", x, [items], negated)
#   ("like", x, pattern, escape_or_None, negated)  ("exists", scope, name)
#   ("not", x)  ("and", left, right)  ("or", left, right)
# --------------------------------------------------------------------------------------------

_COMPARISONS = ("=", "<>", "!=", "<", "<=", ">", ">=")


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.i = 0
        self.params: set[str] = set()

    def peek(self, offset: int = 0) -> Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def take(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at(self, kind: str, value: Any = None, offset: int = 0) -> bool:
        tok = self.peek(offset)
        return tok[0] == kind and (value is None or tok[1] == value)

    def expect(self, kind: str, value: Any = None) -> Token:
        if not self.at(kind, value):
            tok = self.peek()
            raise RefSyntaxError(f"expected {value or kind} at {tok[2]}, found {tok[1]!r}")
        return self.take()

    def parse_filter(self) -> tuple[Any, ...]:
        node = self.or_expr()
        self.expect("eof")
        return node

    def or_expr(self) -> tuple[Any, ...]:
        node = self.and_expr()
        while self.at("kw", "OR"):
            self.take()
            node = ("or", node, self.and_expr())
        return node

    def and_expr(self) -> tuple[Any, ...]:
        node = self.not_expr()
        while self.at("kw", "AND"):
            self.take()
            node = ("and", node, self.not_expr())
        return node

    def not_expr(self) -> tuple[Any, ...]:
        if self.at("kw", "NOT"):
            self.take()
            return ("not", self.not_expr())
        return self.predicate()

    def predicate(self) -> tuple[Any, ...]:
        if self.at("kw", "EXISTS"):
            self.take()
            self.expect("op", "(")
            ref = self.property_reference()
            self.expect("op", ")")
            return ("exists", ref[1], ref[2])
        left = self.additive()
        tok = self.peek()
        if tok[0] == "op" and tok[1] in _COMPARISONS:
            self.take()
            op = "<>" if tok[1] == "!=" else tok[1]
            return ("cmp", op, left, self.additive())
        if self.at("kw", "IS"):
            self.take()
            negated = False
            if self.at("kw", "NOT"):
                self.take()
                negated = True
            self.expect("kw", "NULL")
            return ("isnull", left, negated)
        negated = False
        if self.at("kw", "NOT") and (self.at("kw", "IN", 1) or self.at("kw", "LIKE", 1)):
            self.take()
            negated = True
        if self.at("kw", "IN"):
            self.take()
            self.expect("op", "(")
            items = [self.additive()]
            while self.at("op", ","):
                self.take()
                items.append(self.additive())
            self.expect("op", ")")
            return ("in", left, items, negated)
        if self.at("kw", "LIKE"):
            self.take()
            pattern = self.additive()
            escape = None
            if self.at("kw", "ESCAPE"):
                self.take()
                tok = self.expect("str")
                if len(tok[1]) != 1:
                    raise RefSyntaxError(f"ESCAPE needs exactly one character at {tok[2]}")
                escape = tok[1]
            return ("like", left, pattern, escape, negated)
        return left

    def additive(self) -> tuple[Any, ...]:
        node = self.multiplicative()
        while self.at("op", "+") or self.at("op", "-"):
            op = self.take()[1]
            node = ("arith", op, node, self.multiplicative())
        return node

    def multiplicative(self) -> tuple[Any, ...]:
        node = self.unary()
        while self.at("op", "*") or self.at("op", "/") or self.at("op", "%"):
            op = self.take()[1]
            node = ("arith", op, node, self.unary())
        return node

    def unary(self) -> tuple[Any, ...]:
        if self.at("op", "-"):
            self.take()
            return ("neg", self.unary())
        if self.at("op", "+"):
            self.take()
            return ("pos", self.unary())
        return self.primary()

    def property_reference(self) -> tuple[Any, ...]:
        tok = self.peek()
        if tok[0] == "prop":
            self.take()
            return ("prop", tok[1][0], tok[1][1])
        if tok[0] == "ident":
            self.take()
            return ("prop", "user", tok[1])
        raise RefSyntaxError(f"expected a property name at {tok[2]}")

    def primary(self) -> tuple[Any, ...]:
        tok = self.peek()
        kind, value, _pos = tok
        if kind in ("int", "float", "str"):
            self.take()
            return ("lit", value)
        if kind == "kw" and value in ("TRUE", "FALSE", "NULL"):
            self.take()
            return ("lit", {"TRUE": True, "FALSE": False, "NULL": None}[value])
        if kind == "param":
            self.take()
            self.params.add(value)
            return ("param", value)
        if kind == "ident" and value.lower() in FUNCTIONS and self.at("op", "(", 1):
            self.take()
            self.take()
            if value.lower() == "newid":
                self.expect("op", ")")
                return ("newid",)
            argument = self.additive()
            self.expect("op", ")")
            return ("pfunc", argument)
        if kind in ("ident", "prop"):
            return self.property_reference()
        if kind == "op" and value == "(":
            self.take()
            node = self.or_expr()
            self.expect("op", ")")
            return node
        raise RefSyntaxError(f"unexpected {value!r} at {tok[2]}")


def _parameter_table(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """Parameter values by lower-case name without ``@`` (keys may be given with or without)."""
    table: dict[str, Any] = {}
    for key, value in (parameters or {}).items():
        table.setdefault(key.lstrip("@").lower(), value)
    return table


def parse(text: str, parameters: dict[str, Any] | None = None) -> tuple[Any, ...]:
    """The AST of a filter; raises ``RefSyntaxError`` for anything that must not compile."""
    if len(text) > MAX_TEXT_LENGTH:
        raise RefSyntaxError(f"the filter has {len(text)} characters; at most 1024 are allowed")
    parser = _Parser(tokenize(text))
    tree = parser.parse_filter()
    supplied = _parameter_table(parameters)
    for name in sorted(parser.params):
        if name not in supplied:
            raise RefSyntaxError(f"parameter @{name} was not supplied")
        if not _valid_parameter(supplied[name]):
            raise RefSyntaxError(f"parameter @{name} has an unsupported value")
    return tree


def _valid_parameter(value: Any) -> bool:
    """Parameter values are "any of the value types above (int/float/str/bool/None/uuid/
    datetime)"; an int must fit Int64."""
    if _is_int(value):
        return INT64_MIN <= value <= INT64_MAX
    return value is None or isinstance(value, bool | float | str | uuid.UUID | datetime)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
