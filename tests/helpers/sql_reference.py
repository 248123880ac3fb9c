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

The tokenizer and parser are in ``sql_reference_parse``; this module evaluates.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from itertools import product
from typing import Any

from sql_reference_parse import (
    EVAL_ERROR,
    FALSE,
    INT64_MAX,
    INT64_MIN,
    LOGIC_POLICIES,
    MAX_TEXT_LENGTH,
    MEMBERSHIP_POLICIES,
    OUTCOMES,
    SYNTAX_ERROR,
    SYSTEM_PROPERTIES,
    TRUE,
    UNKNOWN,
    RefEvalError,
    RefSyntaxError,
    _is_int,
    _parameter_table,
    _Parser,
    parse,
    tokenize,
)

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
