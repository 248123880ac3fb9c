"""An independent reference evaluator for the Service Bus SQL filter language (tests only).

Written from the semantics documents alone (``service-bus-semantics.md`` section 1.8 and the
shared "raybus SQL filter semantics" decisions), without reading ``raybus._core.filters``, so that
the differential test in ``tests/unit/test_sql_differential.py`` compares two independent readings
of the same rules. Clarity over speed: a hand-written tokenizer, a recursive-descent parser into
plain tuples, and a tree-walking evaluator with explicit three-valued logic.

The evaluator answers with an *outcome class*: ``"TRUE"``, ``"FALSE"``, ``"UNKNOWN"``,
``"SYNTAX_ERROR"`` (text, literal or parameter problems found before evaluation) or
``"EVAL_ERROR"`` (type mismatch, division by zero, Int64 overflow, missing system property,
non-boolean predicate).

One question the documents leave open is *when* an evaluation error counts: does ``FALSE AND
1/0 = 1`` fail, or is the right side never looked at? The evaluator therefore takes two policy
knobs, and ``reference_outcomes`` reports the outcome under every combination:

``logic`` (AND / OR)
    ``"strict"``: both operands are always evaluated and any error propagates.
    ``"lazy"``: left to right; a FALSE left side of AND (TRUE of OR) skips the right side.
    ``"absorbing"``: both evaluated; a FALSE operand of AND (TRUE of OR) wins even over an error
    on the other side.
``membership`` (``x IN (...)``)
    ``"strict"``: x and every element are evaluated and compared; any error propagates.
    ``"lazy"``: a NULL x answers UNKNOWN at once; elements are compared left to right and the
    first equal one answers TRUE (later elements are not evaluated).

``x IN (a, b)`` compares with the ``=`` rules (so ``1 IN ('a')`` is a type mismatch), following
SQL-92's definition of IN as ``x = a OR x = b``.

Other choices where the documents are silent (the differential test does not generate these,
except the NULL-first rule, which the 3-valued-logic sentence "Comparisons, arithmetic, LIKE with a
NULL operand → UNKNOWN" arguably decides): a NULL operand is checked before operand types
(``NULL + 'a'`` and ``TRUE < NULL`` are UNKNOWN); a NULL (or missing property) used as a predicate
is UNKNOWN; ``x IS NULL`` accepts any expression; ``-9223372036854775808 % -1`` is 0 (the result
fits Int64); an escape character followed by any character makes that character literal, and a
trailing one keeps its own meaning; ``p(name)``/``property(name)`` with a NULL name is UNKNOWN and
with a non-string name a type mismatch; ``newid``, ``property`` and ``p`` not followed by ``(``
are ordinary user property names; ``user.[x]`` / ``sys."x"`` are accepted; ``[]`` is the empty
name; a decimal literal too large for a Double is infinity; a naive datetime compared with an
aware one is a type mismatch; parameter keys differing only in case: the first wins.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from itertools import product
from typing import Any

__all__ = [
    "EVAL_ERROR",
    "FALSE",
    "LOGIC_POLICIES",
    "MEMBERSHIP_POLICIES",
    "OUTCOMES",
    "SYNTAX_ERROR",
    "TRUE",
    "UNKNOWN",
    "RefEvalError",
    "RefSyntaxError",
    "parse",
    "reference_evaluate",
    "reference_outcomes",
    "reference_value",
]

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


# --------------------------------------------------------------------------------------------
# Values: None is NULL. bool is checked before int everywhere (bool is an int in Python).
# --------------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, uuid.UUID):
        return "uuid"
    if isinstance(value, datetime):
        return "datetime"
    if isinstance(value, bytes | bytearray):
        return "bytes"
    return "other"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise RefEvalError("Overflow")
    return value


def _truncating_quotient(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def _float_divide(x: float, y: float) -> float:
    if y == 0.0:
        if x == 0.0 or math.isnan(x):
            return math.nan
        return math.copysign(math.inf, x) * math.copysign(1.0, y)
    return x / y


def _float_remainder(x: float, y: float) -> float:
    """C#'s double ``%``: IEEE fmod (sign of the dividend), NaN for x=±inf or y=0."""
    if math.isnan(x) or math.isnan(y) or math.isinf(x) or y == 0.0:
        return math.nan
    if math.isinf(y):
        return x
    return math.fmod(x, y)


def arithmetic(op: str, a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    ka, kb = _kind(a), _kind(b)
    if op == "+" and ka == "str" and kb == "str":
        return a + b
    if ka != "number" or kb != "number":
        raise RefEvalError("TypeMismatch")
    if _is_int(a) and _is_int(b):
        if op == "+":
            return _checked(a + b)
        if op == "-":
            return _checked(a - b)
        if op == "*":
            return _checked(a * b)
        if b == 0:
            raise RefEvalError("DivideByZero")
        q = _truncating_quotient(a, b)
        if op == "/":
            return _checked(q)
        return _checked(a - b * q)
    x, y = float(a), float(b)
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if op == "/":
        return _float_divide(x, y)
    return _float_remainder(x, y)


def negate(a: Any) -> Any:
    if a is None:
        return None
    if _kind(a) != "number":
        raise RefEvalError("TypeMismatch")
    return _checked(-a) if _is_int(a) else -a


def unary_plus(a: Any) -> Any:
    if a is None:
        return None
    if _kind(a) != "number":
        raise RefEvalError("TypeMismatch")
    return a


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda x, y: x == y,
    "<>": lambda x, y: x != y,
    "<": lambda x, y: x < y,
    "<=": lambda x, y: x <= y,
    ">": lambda x, y: x > y,
    ">=": lambda x, y: x >= y,
}


def compare(op: str, a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    ka, kb = _kind(a), _kind(b)
    equality_only = op in ("=", "<>")
    if ka == "number" and kb == "number":
        if not (_is_int(a) and _is_int(b)):
            a, b = float(a), float(b)  # int and float: the int is promoted to Double
        return _ORDER[op](a, b)
    if ka == kb == "datetime" and (a.tzinfo is None) != (b.tzinfo is None):
        raise RefEvalError("TypeMismatch")  # naive vs aware: undocumented, Python can't order
    if ka == kb and ka in ("str", "datetime"):
        return _ORDER[op](a, b)
    if ka == kb and ka in ("bool", "bytes", "uuid") and equality_only:
        return _ORDER[op](bytes(a) if ka == "bytes" else a, bytes(b) if kb == "bytes" else b)
    if {ka, kb} == {"uuid", "str"} and equality_only:
        return _ORDER[op](str(a).lower(), str(b).lower())
    raise RefEvalError("TypeMismatch")


def like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    parts = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape and i + 1 < len(pattern):
            parts.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "%":
            parts.append(".*")
        elif c == "_":
            parts.append(".")
        else:
            parts.append(re.escape(c))
        i += 1
    return re.compile("".join(parts), re.DOTALL)


def like(subject: Any, pattern: Any, escape: str | None) -> bool | None:
    if subject is None or pattern is None:
        return None
    if _kind(subject) != "str" or _kind(pattern) != "str":
        raise RefEvalError("TypeMismatch")
    return like_regex(pattern, escape).fullmatch(subject) is not None


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


# --------------------------------------------------------------------------------------------
# Evaluator
# --------------------------------------------------------------------------------------------


class _Evaluator:
    def __init__(
        self, record: Any, parameters: dict[str, Any], logic: str, membership: str
    ) -> None:
        self.record = record
        self.parameters = parameters
        self.logic = logic
        self.membership = membership

    # -- properties --------------------------------------------------------------------------
    def user_lookup(self, name: str) -> tuple[bool, Any]:
        """(present, value); names match case-insensitively, the first key in dict order wins."""
        wanted = name.lower()
        for key, value in (self.record.application_properties or {}).items():
            if key.lower() == wanted:
                return True, value
        return False, None

    def system_value(self, name: str) -> Any:
        entry = SYSTEM_PROPERTIES.get(name.lower())
        if entry is None:
            raise RefEvalError("MissingSystemProperty")
        field, is_time = entry
        value = getattr(self.record, field)
        if is_time and value is not None:
            return datetime.fromtimestamp(value, tz=timezone.utc)
        return value

    def property_value(self, scope: str, name: str) -> Any:
        if scope == "sys":
            return self.system_value(name)
        return self.user_lookup(name)[1]

    # -- expressions -------------------------------------------------------------------------
    def value(self, node: tuple[Any, ...]) -> Any:
        tag = node[0]
        if tag == "lit":
            return node[1]
        if tag == "param":
            return self.parameters[node[1]]
        if tag == "prop":
            return self.property_value(node[1], node[2])
        if tag == "newid":
            return uuid.uuid4()
        if tag == "pfunc":
            name = self.value(node[1])
            if name is None:
                return None
            if _kind(name) != "str":
                raise RefEvalError("TypeMismatch")
            if name.lower().startswith("sys."):
                return self.system_value(name[4:])
            if name.lower().startswith("user."):
                name = name[5:]
            return self.user_lookup(name)[1]
        if tag == "neg":
            return negate(self.value(node[1]))
        if tag == "pos":
            return unary_plus(self.value(node[1]))
        if tag == "arith":
            left = self.value(node[2])
            right = self.value(node[3])
            return arithmetic(node[1], left, right)
        if tag == "cmp":
            left = self.value(node[2])
            right = self.value(node[3])
            return compare(node[1], left, right)
        if tag == "isnull":
            is_null = self.value(node[1]) is None
            return is_null != node[2]
        if tag == "exists":
            if node[1] == "sys":
                return self.system_value(node[2]) is not None
            return self.user_lookup(node[2])[0]
        if tag == "like":
            subject = self.value(node[1])
            pattern = self.value(node[2])
            result = like(subject, pattern, node[3])
            return _not(result) if node[4] else result
        if tag == "in":
            result = self.membership_test(node[1], node[2])
            return _not(result) if node[3] else result
        if tag == "not":
            return _not(self.truth(node[1]))
        if tag == "and":
            return self.junction(node[1], node[2], dominant=False)
        if tag == "or":
            return self.junction(node[1], node[2], dominant=True)
        raise AssertionError(f"unknown node {node!r}")

    def truth(self, node: tuple[Any, ...]) -> bool | None:
        """A predicate's value: bool, or None for UNKNOWN; anything else is an error."""
        value = self.value(node)
        if value is None or isinstance(value, bool):
            return value
        raise RefEvalError("NotBoolean")

    def _attempt(self, node: tuple[Any, ...]) -> tuple[bool | None, RefEvalError | None]:
        try:
            return self.truth(node), None
        except RefEvalError as exc:
            return None, exc

    def junction(
        self, left: tuple[Any, ...], right: tuple[Any, ...], *, dominant: bool
    ) -> bool | None:
        """AND (``dominant=False``: FALSE decides) or OR (``dominant=True``: TRUE decides)."""
        if self.logic == "lazy":
            a = self.truth(left)
            if a is dominant:
                return dominant
            b = self.truth(right)
            if b is dominant:
                return dominant
            return None if (a is None or b is None) else not dominant
        a, a_error = self._attempt(left)
        b, b_error = self._attempt(right)
        if self.logic == "absorbing" and (a is dominant or b is dominant):
            return dominant
        if a_error is not None:
            raise a_error
        if b_error is not None:
            raise b_error
        if a is dominant or b is dominant:
            return dominant
        return None if (a is None or b is None) else not dominant

    def membership_test(self, subject: tuple[Any, ...], items: list[Any]) -> bool | None:
        x = self.value(subject)
        if self.membership == "lazy":
            if x is None:
                return None
            saw_unknown = False
            for item in items:
                result = compare("=", x, self.value(item))
                if result is True:
                    return True
                if result is None:
                    saw_unknown = True
            return None if saw_unknown else False
        values = [self.value(item) for item in items]
        results = [compare("=", x, v) for v in values]
        if x is None:
            return None
        if True in results:
            return True
        return None if None in results else False


def _outcome(
    tree: tuple[Any, ...], record: Any, parameters: dict[str, Any], logic: str, membership: str
) -> str:
    try:
        result = _Evaluator(record, parameters, logic, membership).truth(tree)
    except RefEvalError:
        return EVAL_ERROR
    return UNKNOWN if result is None else (TRUE if result else FALSE)


def reference_evaluate(
    text: str,
    record: Any,
    parameters: dict[str, Any] | None = None,
    *,
    logic: str = "strict",
    membership: str = "strict",
) -> str:
    """The outcome class of ``text`` on ``record``: TRUE, FALSE, UNKNOWN, SYNTAX_ERROR or
    EVAL_ERROR (under the given error-propagation policies; see the module docstring)."""
    try:
        tree = parse(text, parameters)
    except RefSyntaxError:
        return SYNTAX_ERROR
    return _outcome(tree, record, _parameter_table(parameters), logic, membership)


def reference_outcomes(
    text: str, record: Any, parameters: dict[str, Any] | None = None
) -> dict[tuple[str, str], str]:
    """The outcome under every (logic, membership) policy pair. When all agree, the documents
    decide the outcome; when they differ, only the unspecified error-propagation order does."""
    try:
        tree = parse(text, parameters)
    except RefSyntaxError:
        return dict.fromkeys(_policy_pairs(), SYNTAX_ERROR)
    table = _parameter_table(parameters)
    return {
        (logic, membership): _outcome(tree, record, table, logic, membership)
        for logic, membership in _policy_pairs()
    }


def reference_value(
    expression: str, record: Any, parameters: dict[str, Any] | None = None
) -> tuple[str, Any]:
    """Evaluate an arithmetic *expression* (not a predicate): ``("VALUE", value)``, or
    ``(SYNTAX_ERROR, None)`` / ``(EVAL_ERROR, None)``. ``newid()`` gives a fresh GUID."""
    try:
        if len(expression) > MAX_TEXT_LENGTH:
            raise RefSyntaxError("too long")
        parser = _Parser(tokenize(expression))
        tree = parser.additive()
        parser.expect("eof")
        supplied = _parameter_table(parameters)
        if any(name not in supplied for name in parser.params):
            raise RefSyntaxError("parameter not supplied")
    except RefSyntaxError:
        return SYNTAX_ERROR, None
    try:
        return "VALUE", _Evaluator(record, supplied, "strict", "strict").value(tree)
    except RefEvalError:
        return EVAL_ERROR, None


def _policy_pairs() -> Iterator[tuple[str, str]]:
    return iter(product(LOGIC_POLICIES, MEMBERSHIP_POLICIES))
