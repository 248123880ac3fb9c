"""Run-time semantics of filter values: kinds, comparison, arithmetic, LIKE, property lookup.

Everything here follows the package docstring (``raybus._core.filters``); the compiler builds
closures that call these functions (or inline fast paths equivalent to them). All failures are
``FilterEvaluationError`` with a ``type_name`` naming the kind of failure.
"""

from __future__ import annotations

import math
import operator
import re
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from ...exceptions import FilterEvaluationError
from ..record import MessageRecord
from .lexer import INT64_MAX, INT64_MIN

__all__ = [
    "MISSING",
    "SETTABLE_SYSTEM_FIELDS",
    "SYSTEM_PROPERTIES",
    "arith",
    "compare",
    "evaluation_error",
    "like_matcher",
    "negate",
    "normalize_value",
    "system_getter",
    "type_mismatch",
    "user_lookup",
]

# Value kinds.
NULL, BOOL, NUM, STR, GUID, TIME, BYTES, OTHER = range(8)
KIND_NAMES = ("NULL", "bool", "number", "string", "uuid", "datetime", "bytes", "other")


class _Missing:
    """Sentinel: a user property that is not present (distinct from one holding None)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def evaluation_error(type_name: str, message: str) -> FilterEvaluationError:
    return FilterEvaluationError(f"{type_name}: {message}", None, type_name)


def kind(value: Any) -> int:
    t = type(value)
    if t is str:
        return STR
    if t is int or t is float:
        return NUM
    if t is bool:
        return BOOL
    if value is None:
        return NULL
    if isinstance(value, str):
        return STR
    if isinstance(value, int | float):  # IntEnum and friends (bool is handled above)
        return NUM
    if isinstance(value, uuid.UUID):
        return GUID
    if isinstance(value, datetime):
        return TIME
    if isinstance(value, bytes | bytearray | memoryview):
        return BYTES
    return OTHER


def type_mismatch(what: str, *values: Any) -> FilterEvaluationError:
    kinds = ", ".join(KIND_NAMES[kind(v)] for v in values)
    return evaluation_error("TypeMismatch", f"{what} is not defined for ({kinds})")


def normalize_value(value: Any) -> Any:
    """A value as the evaluator sees it: naive datetimes become UTC, bytearray/memoryview
    become bytes, int/str subclasses become plain int/str. Other values are returned as is."""
    t = type(value)
    if t is str or t is int or t is float or t is bool or value is None:
        return value
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


# ---------------------------------------------------------------------------- comparison

_ORDER_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def compare(op: str, a: Any, b: Any) -> bool | None:
    """``a op b`` under three-valued logic; ``None`` is UNKNOWN."""
    if a is None or b is None:
        return None
    ka, kb = kind(a), kind(b)
    fn = _ORDER_OPS[op]
    if ka == NUM and kb == NUM:
        a, b = normalize_value(a), normalize_value(b)
        if type(a) is not type(b):  # C#: long promoted to double
            a, b = _float(a), _float(b)
        return fn(a, b)
    equality = op in ("=", "<>")
    if ka == kb and ka in (STR, TIME):
        return fn(normalize_value(a), normalize_value(b))
    if equality and ka == kb and ka in (BOOL, BYTES, GUID):
        return fn(normalize_value(a), normalize_value(b))
    if equality and {ka, kb} == {GUID, STR}:
        return fn(str(a).lower(), str(b).lower())
    raise type_mismatch(f"comparison {op}", a, b)


def negate(value: Any) -> bool | None:
    """``NOT value``."""
    if value is True:
        return False
    if value is False:
        return True
    if value is None:
        return None
    raise evaluation_error("NotBoolean", f"NOT needs a boolean, not a {KIND_NAMES[kind(value)]}")


# ---------------------------------------------------------------------------- arithmetic


def _float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError as e:  # only for ints far beyond Int64 smuggled in as properties
        raise evaluation_error("Overflow", "the number does not fit a double") from e


def _checked(value: int) -> int:
    if INT64_MIN <= value <= INT64_MAX:
        return value
    raise evaluation_error("Overflow", "the integer result does not fit a 64-bit integer")


def _int_div(a: int, b: int) -> int:
    if b == 0:
        raise evaluation_error("DivideByZero", "integer division by zero")
    q = abs(a) // abs(b)
    return _checked(-q if (a < 0) != (b < 0) else q)


def _int_mod(a: int, b: int) -> int:
    if b == 0:
        raise evaluation_error("DivideByZero", "integer remainder by zero")
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _float_div(a: float, b: float) -> float:
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _float_mod(a: float, b: float) -> float:
    try:
        return math.fmod(a, b)  # C# % on doubles: the sign of the dividend
    except ValueError:  # x % 0, inf % y: NaN per IEEE
        return math.nan


_INT_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: _checked(a + b),
    "-": lambda a, b: _checked(a - b),
    "*": lambda a, b: _checked(a * b),
    "/": _int_div,
    "%": _int_mod,
}
_FLOAT_OPS: dict[str, Callable[[float, float], float]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _float_div,
    "%": _float_mod,
}


def arith(op: str, a: Any, b: Any) -> Any:
    """``a op b`` for ``+ - * / %``; ``None`` if either side is NULL."""
    if a is None or b is None:
        return None
    ka, kb = kind(a), kind(b)
    if ka == NUM and kb == NUM:
        a, b = normalize_value(a), normalize_value(b)
        if type(a) is int and type(b) is int:
            return _INT_OPS[op](a, b)
        return _FLOAT_OPS[op](_float(a), _float(b))
    if op == "+" and ka == STR and kb == STR:
        return str(a) + str(b)
    raise type_mismatch(f"arithmetic {op}", a, b)


def unary(op: str, a: Any) -> Any:
    """Unary ``+``/``-``; ``None`` for NULL; numbers only."""
    if a is None:
        return None
    if kind(a) != NUM:
        raise type_mismatch(f"unary {op}", a)
    a = normalize_value(a)
    if op == "+":
        return a
    return _checked(-a) if type(a) is int else -a


# ---------------------------------------------------------------------------- LIKE

_STAR = object()


def _like_tokens(pattern: str, escape: str | None) -> list[Any]:
    """The pattern as a list of: a literal character (str), ``None`` for ``_``, ``_STAR``
    for ``%``. The escape character makes the next character literal; a trailing escape
    character stands for itself."""
    out: list[Any] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == escape:
            if i + 1 < n:
                out.append(pattern[i + 1])
                i += 2
                continue
            out.append(c)
        elif c == "%":
            if not out or out[-1] is not _STAR:
                out.append(_STAR)
        elif c == "_":
            out.append(None)
        else:
            out.append(c)
        i += 1
    return out


def _segment_regex(segment: list[Any]) -> re.Pattern[str]:
    return re.compile("".join("." if c is None else re.escape(c) for c in segment), re.DOTALL)


@lru_cache(maxsize=512)
def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """A function telling whether a whole string matches a LIKE pattern (case-sensitive).

    Runs in O(len(value) x len(pattern)) at worst: the pattern is split at ``%`` into
    fixed-length segments, matched as prefix, suffix and leftmost occurrences in between (never
    a backtracking regex over the whole pattern, which could take exponential time).
    """
    tokens = _like_tokens(pattern, escape)
    segments: list[list[Any]] = [[]]
    for t in tokens:
        if t is _STAR:
            segments.append([])
        else:
            segments[-1].append(t)
    if len(segments) == 1:
        if all(c is not None for c in segments[0]):
            literal = "".join(segments[0])
            return lambda s: s == literal
        whole = _segment_regex(segments[0])
        return lambda s: whole.fullmatch(s) is not None
    first, last, middle = segments[0], segments[-1], [m for m in segments[1:-1] if m]
    first_rx, last_rx = _segment_regex(first), _segment_regex(last)
    middle_rx = [(_segment_regex(m), len(m)) for m in middle]
    fixed = len(first) + len(last)
    if not middle and all(c is not None for c in first + last):
        prefix, suffix = "".join(first), "".join(last)
        return lambda s: len(s) >= fixed and s.startswith(prefix) and s.endswith(suffix)

    def match(s: str) -> bool:
        end = len(s) - len(last)
        if end < len(first) or first_rx.match(s) is None or last_rx.match(s, end) is None:
            return False
        pos = len(first)
        for rx, _size in middle_rx:
            m = rx.search(s, pos, end)
            if m is None:
                return False
            pos = m.end()
        return True

    return match


# ---------------------------------------------------------------------------- properties


def user_lookup(props: dict[str, Any] | None, lname: str) -> Any:
    """The value of the user property whose lower-cased name is ``lname`` (the first such key
    in dict order), or ``MISSING``."""
    if not props:
        return MISSING
    for key, value in props.items():
        if type(key) is str and key.lower() == lname:
            return value
    return MISSING


def _utc(seconds: float | None) -> datetime | None:
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=timezone.utc)
    except (OverflowError, OSError, ValueError) as e:
        raise evaluation_error("TypeMismatch", f"time {seconds!r} is not a valid date") from e


SYSTEM_PROPERTIES: dict[str, Callable[[MessageRecord], Any]] = {
    "messageid": operator.attrgetter("message_id"),
    "correlationid": operator.attrgetter("correlation_id"),
    "to": operator.attrgetter("to"),
    "replyto": operator.attrgetter("reply_to"),
    "label": operator.attrgetter("subject"),
    "subject": operator.attrgetter("subject"),
    "sessionid": operator.attrgetter("session_id"),
    "replytosessionid": operator.attrgetter("reply_to_session_id"),
    "contenttype": operator.attrgetter("content_type"),
    "partitionkey": operator.attrgetter("partition_key"),
    "sequencenumber": operator.attrgetter("sequence_number"),
    "deliverycount": operator.attrgetter("delivery_count"),
    "enqueuedtimeutc": lambda r: _utc(r.enqueued_time),
    "scheduledenqueuetimeutc": lambda r: _utc(r.scheduled_enqueue_time),
    "timetolive": operator.attrgetter("time_to_live"),
    "size": operator.attrgetter("size"),
}

# The string system properties an action may SET, and the record field each one is.
SETTABLE_SYSTEM_FIELDS: dict[str, str] = {
    "messageid": "message_id",
    "correlationid": "correlation_id",
    "to": "to",
    "replyto": "reply_to",
    "label": "subject",
    "subject": "subject",
    "sessionid": "session_id",
    "replytosessionid": "reply_to_session_id",
    "contenttype": "content_type",
}


def _missing_system(name: str) -> Callable[[MessageRecord], Any]:
    def fail(record: MessageRecord) -> Any:
        raise evaluation_error("MissingSystemProperty", f"there is no system property {name!r}")

    return fail


def system_getter(name: str) -> Callable[[MessageRecord], Any]:
    """A function reading system property ``name`` (any case) as a filter value; for an
    unknown name, a function that raises ``MissingSystemProperty``."""
    getter = SYSTEM_PROPERTIES.get(name.lower())
    if getter is None:
        return _missing_system(name)
    return lambda record: normalize_value(getter(record))
