"""Compile a parsed filter expression into nested Python closures.

``compile_filter`` parses the text once, resolves ``@parameters`` and builds one closure per
syntax node (with inline fast paths for the common cases: a string or integer property compared
with a constant, IN over constant strings or integers, LIKE with a constant pattern). Evaluating
a ``CompiledFilter`` never re-parses. It pickles as its text and parameters and is compiled
again on unpickling (closures do not pickle). ``actions`` reuses ``Compiler`` for the
expressions of SQL rule actions.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import Any

from ..record import MessageRecord
from . import values as v
from .lexer import INT64_MAX, INT64_MIN, syntax_error
from .nodes import (
    Arith,
    BoolOp,
    Call,
    Compare,
    Exists,
    In,
    IsNull,
    Like,
    Literal,
    Node,
    Not,
    Param,
    Prop,
    Unary,
)
from .parser import parse

__all__ = ["CompiledFilter", "Compiler", "Fn", "compile_filter"]

Fn = Callable[[MessageRecord], Any]
_ORDER = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_PARAM_TYPES = (type(None), bool, int, float, str, bytes, bytearray, uuid.UUID, datetime)
_NO_CONST = object()


def _not_boolean(value: Any, where: str) -> Exception:
    return v.evaluation_error(
        "NotBoolean", f"{where} needs a boolean, not a {v.KIND_NAMES[v.kind(value)]}"
    )


def _normalize_parameters(text: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """Parameters keyed by lower-cased name without ``@``, with checked, normalized values."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise syntax_error(text, None, "parameters must be a dict of name to value")
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if not isinstance(key, str) or not key.lstrip("@"):
            raise syntax_error(text, None, f"parameter name {key!r} is not a non-empty str")
        name = key[1:].lower() if key.startswith("@") else key.lower()
        if name in out:
            raise syntax_error(text, None, f"parameter {key!r} is given twice (names ignore case)")
        if not isinstance(value, _PARAM_TYPES):
            raise syntax_error(
                text, None, f"parameter {key!r} has unsupported type {type(value).__name__}"
            )
        if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
            raise syntax_error(text, None, f"parameter {key!r} does not fit a 64-bit integer")
        out[name] = v.normalize_value(value)
    return out


class Compiler:
    """Compiles expression nodes of one text, with its parameters resolved."""

    def __init__(self, text: str, parameters: dict[str, Any] | None) -> None:
        self.text = text
        self.params = _normalize_parameters(text, parameters)

    def const(self, node: Node) -> Any:
        """The value of a literal or parameter node, else ``_NO_CONST``."""
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Param):
            return self.param(node)
        return _NO_CONST

    def param(self, node: Param) -> Any:
        if node.name not in self.params:
            raise syntax_error(self.text, node.pos, f"parameter @{node.name} was not supplied")
        return self.params[node.name]

    def compile(self, node: Node) -> Fn:
        method: Callable[[Any], Fn] = getattr(self, "c_" + type(node).__name__)
        return method(node)

    # ------------------------------------------------------------------ leaves

    def c_Literal(self, node: Literal) -> Fn:
        value = node.value
        return lambda r: value

    def c_Param(self, node: Param) -> Fn:
        value = self.param(node)
        return lambda r: value

    def c_Prop(self, node: Prop) -> Fn:
        if node.scope == "sys":
            return v.system_getter(node.name)
        return _user_getter(node.name.lower())

    def c_Call(self, node: Call) -> Fn:
        if node.name == "newid":
            return lambda r: uuid.uuid4()
        arg = node.args[0]
        name = self.const(arg)
        if isinstance(name, str):
            return _named_getter(name)
        if name is None:
            return lambda r: None
        argf = self.compile(arg)

        def dynamic(r: MessageRecord) -> Any:
            n = argf(r)
            if n is None:
                return None
            if v.kind(n) != v.STR:
                raise v.type_mismatch("property()", n)
            return _named_getter(str(n))(r)

        return dynamic

    def c_Exists(self, node: Exists) -> Fn:
        if node.prop.scope == "sys":
            get = v.system_getter(node.prop.name)
            return lambda r: get(r) is not None
        lname = node.prop.name.lower()
        return lambda r: v.user_lookup(r.application_properties, lname) is not v.MISSING

    # ------------------------------------------------------------------ operators

    def c_Unary(self, node: Unary) -> Fn:
        f, op = self.compile(node.operand), node.op

        def unary(r: MessageRecord) -> Any:
            a = f(r)
            if type(a) is int and op == "-" and -INT64_MAX <= a <= INT64_MAX:
                return -a
            return v.unary(op, a)

        return unary

    def c_Not(self, node: Not) -> Fn:
        f = self.compile(node.operand)
        return lambda r: v.negate(f(r))

    def c_BoolOp(self, node: BoolOp) -> Fn:
        fns = tuple(self.compile(x) for x in node.operands)
        # All operands are evaluated, left to right, whatever the earlier ones gave: errors and
        # non-boolean operands are reported even where the result is already decided, so
        # `a AND b` and `b AND a` always have the same outcome.
        if node.op == "AND":
            dominant, other = False, True
        else:
            dominant, other = True, False
        where = node.op

        def boolop(r: MessageRecord) -> Any:
            result: Any = other
            for f in fns:
                x = f(r)
                if x is dominant:
                    result = dominant
                elif x is None:
                    if result is other:
                        result = None
                elif x is not other:
                    raise _not_boolean(x, where)
            return result

        return boolop

    def c_Arith(self, node: Arith) -> Fn:
        first = self.compile(node.first)
        rest = tuple((_ARITH[op], self.compile(x)) for op, x in node.rest)
        if len(rest) == 1:
            [(op1, f1)] = rest
            return lambda r: op1(first(r), f1(r))

        def chain(r: MessageRecord) -> Any:
            acc = first(r)
            for op, f in rest:
                acc = op(acc, f(r))
            return acc

        return chain

    def c_Compare(self, node: Compare) -> Fn:
        op, fn = node.op, _ORDER[node.op]
        left = self.compile(node.left)
        c = self.const(node.right)
        if type(c) is str:

            def str_const(r: MessageRecord) -> Any:
                a = left(r)
                if type(a) is str:
                    return fn(a, c)
                return v.compare(op, a, c)

            return str_const
        if type(c) is int or type(c) is float:
            cf = float(c)

            def num_const(r: MessageRecord) -> Any:
                a = left(r)
                t = type(a)
                if t is type(c):
                    return fn(a, c)
                if t is int or t is float:
                    try:
                        return fn(float(a), cf)
                    except OverflowError:  # an int far beyond Int64: let compare() report it
                        pass
                return v.compare(op, a, c)

            return num_const
        right = self.compile(node.right)
        return lambda r: v.compare(op, left(r), right(r))

    def c_IsNull(self, node: IsNull) -> Fn:
        f, negated = self.compile(node.operand), node.negated
        return lambda r: (f(r) is None) is not negated

    def c_In(self, node: In) -> Fn:
        operand = self.compile(node.operand)
        negated = node.negated
        consts = [self.const(x) for x in node.items]
        if all(c is not _NO_CONST for c in consts):
            has_null = any(c is None for c in consts)
            present = [c for c in consts if c is not None]
            for t in (str, int):
                if present and all(type(c) is t for c in present):
                    return _in_fast(operand, t, frozenset(present), has_null, negated, consts)
        items = tuple(self.compile(x) for x in node.items)

        def in_general(r: MessageRecord) -> Any:
            x = operand(r)
            return _in_result(x, [f(r) for f in items], negated)

        return in_general

    def c_Like(self, node: Like) -> Fn:
        operand = self.compile(node.operand)
        negated, escape = node.negated, node.escape
        pattern = self.const(node.pattern)
        if isinstance(pattern, str):
            match = v.like_matcher(pattern, escape)

            def like_const(r: MessageRecord) -> Any:
                x = operand(r)
                if type(x) is str:
                    return match(x) is not negated
                return _like(x, pattern, escape, negated)

            return like_const
        pf = self.compile(node.pattern)
        return lambda r: _like(operand(r), pf(r), escape, negated)


# ---------------------------------------------------------------------- helpers


def _user_getter(lname: str) -> Fn:
    def user(r: MessageRecord) -> Any:
        props = r.application_properties
        if props:
            for key, value in props.items():
                if type(key) is str and key.lower() == lname:
                    t = type(value)
                    if t is str or t is int or t is float or t is bool or value is None:
                        return value
                    return v.normalize_value(value)
        return None

    return user


@lru_cache(maxsize=256)
def _named_getter(name: str) -> Fn:
    """The getter for ``property(name)``: ``sys.X`` a system property, ``user.X`` or a plain
    name a user property (the name is used as is: no brackets or quotes are interpreted)."""
    lower = name.lower()
    if lower.startswith("sys."):
        return v.system_getter(name[4:])
    if lower.startswith("user."):
        return _user_getter(lower[5:])
    return _user_getter(lower)


def _arith_op(op: str) -> Callable[[Any, Any], Any]:
    int_op = {"+": operator.add, "-": operator.sub, "*": operator.mul}.get(op)
    if int_op is None:
        return lambda a, b: v.arith(op, a, b)

    def fast(a: Any, b: Any) -> Any:
        if type(a) is int and type(b) is int:
            result = int_op(a, b)
            if INT64_MIN <= result <= INT64_MAX:
                return result
        return v.arith(op, a, b)

    return fast


_ARITH = {op: _arith_op(op) for op in ("+", "-", "*", "/", "%")}


def _in_result(x: Any, items: list[Any], negated: bool) -> bool | None:
    if x is None:
        return None
    found = has_null = False
    for item in items:
        if item is None:
            has_null = True
        elif v.compare("=", x, item):
            found = True
    if found:
        return not negated
    if has_null:
        return None
    return negated


def _in_fast(
    operand: Fn, t: type, present: frozenset[Any], has_null: bool, negated: bool, consts: list[Any]
) -> Fn:
    miss: bool | None = None if has_null else negated
    hit = not negated

    def in_const(r: MessageRecord) -> Any:
        x = operand(r)
        if type(x) is t:
            return hit if x in present else miss
        return _in_result(x, consts, negated)

    return in_const


def _like(x: Any, pattern: Any, escape: str | None, negated: bool) -> bool | None:
    if x is None or pattern is None:
        return None
    if v.kind(x) != v.STR or v.kind(pattern) != v.STR:
        raise v.type_mismatch("LIKE", x, pattern)
    return v.like_matcher(str(pattern), escape)(str(x)) is not negated


# ---------------------------------------------------------------------- public classes


class CompiledFilter:
    """A filter expression ready to evaluate; build it with ``compile_filter``.

    Evaluation is pure apart from ``newid()`` and never changes the record. It pickles as its
    text and parameters.
    """

    __slots__ = ("_fn", "parameters", "text")

    def __init__(self, text: str, parameters: dict[str, Any] | None, fn: Fn) -> None:
        self.text = text
        self.parameters = parameters
        self._fn = fn

    def evaluate(self, record: MessageRecord) -> bool | None:
        """TRUE, FALSE, or ``None`` for UNKNOWN; raises ``FilterEvaluationError``."""
        result = self._fn(record)
        if result is True or result is False or result is None:
            return result
        raise _not_boolean(result, "a filter")

    def matches(self, record: MessageRecord) -> bool:
        """True only when the filter evaluates to TRUE; raises ``FilterEvaluationError``."""
        return self.evaluate(record) is True

    def __reduce__(self) -> tuple[Any, ...]:
        return (compile_filter, (self.text, self.parameters))

    def __repr__(self) -> str:
        return f"CompiledFilter({self.text!r})"


def compile_filter(text: str, parameters: dict[str, Any] | None = None) -> CompiledFilter:
    """Parse and compile a SQL filter; raises ``FilterSyntaxError`` for bad text, a missing or
    invalid parameter."""
    compiler = Compiler(text, parameters)
    fn = compiler.compile(parse(text))
    return CompiledFilter(text, dict(parameters) if parameters else None, fn)
