"""Compile a SQL rule action (``SET``/``REMOVE`` statements) into steps applied to a record.

The statements' expressions are compiled by ``compiler`` exactly as filter expressions are;
this module adds the assignment semantics (see the package docstring, "Actions").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..record import MessageRecord, snapshot
from . import values as v
from .compiler import Compiler, Fn
from .nodes import Action, Remove
from .parser import parse_action

__all__ = ["CompiledAction", "compile_action"]

_Step = Callable[[MessageRecord], None]


class CompiledAction:
    """A SQL rule action ready to apply; build it with ``compile_action``."""

    __slots__ = ("_steps", "parameters", "text")

    def __init__(self, text: str, parameters: dict[str, Any] | None, steps: list[_Step]) -> None:
        self.text = text
        self.parameters = parameters
        self._steps = steps

    def apply(self, record: MessageRecord) -> None:
        """Run the statements in order on ``record`` (each sees the effects of the earlier
        ones).

        All or nothing: on ``FilterEvaluationError`` the record is left unchanged. On success
        ``record.application_properties`` is replaced by a new dict (the old one, which
        snapshots of the same message share, is never mutated) and the string system fields
        are updated. ``record.size`` is not recomputed.
        """
        scratch = snapshot(record)
        props = record.application_properties
        scratch.application_properties = dict(props) if props is not None else None
        for step in self._steps:
            step(scratch)
        record.application_properties = scratch.application_properties
        for field in _SYSTEM_FIELDS:
            setattr(record, field, getattr(scratch, field))

    def __reduce__(self) -> tuple[Any, ...]:
        return (compile_action, (self.text, self.parameters))

    def __repr__(self) -> str:
        return f"CompiledAction({self.text!r})"


_SYSTEM_FIELDS = tuple(sorted(set(v.SETTABLE_SYSTEM_FIELDS.values())))


def _set_user(name: str, value: Fn) -> _Step:
    lname = name.lower()

    def step(r: MessageRecord) -> None:
        x = value(r)
        props = r.application_properties
        if props is None:
            r.application_properties = {name: x}
            return
        for key in props:
            if type(key) is str and key.lower() == lname:
                props[key] = x
                return
        props[name] = x

    return step


def _set_system(name: str, value: Fn) -> _Step:
    lname = name.lower()
    field = v.SETTABLE_SYSTEM_FIELDS.get(lname)

    def step(r: MessageRecord) -> None:
        x = value(r)
        if field is None:
            if lname == "scheduledenqueuetimeutc":
                return  # ignored in a subscription, as Service Bus ignores it (the value ran)
            if lname in v.SYSTEM_PROPERTIES:
                raise v.evaluation_error(
                    "ReadOnlySystemProperty", f"system property {name!r} cannot be SET"
                )
            raise v.evaluation_error(
                "MissingSystemProperty", f"there is no system property {name!r}"
            )
        if x is not None and v.kind(x) != v.STR:
            raise v.type_mismatch(f"SET sys.{name}", x)
        setattr(r, field, None if x is None else str(x))

    return step


def _remove_user(name: str) -> _Step:
    lname = name.lower()

    def step(r: MessageRecord) -> None:
        props = r.application_properties
        if props:
            for key in [k for k in props if type(k) is str and k.lower() == lname]:
                del props[key]

    return step


def compile_action(text: str, parameters: dict[str, Any] | None = None) -> CompiledAction:
    """Parse and compile a SQL rule action; raises ``FilterSyntaxError`` for bad text, a
    missing or invalid parameter, or ``REMOVE`` of a system property."""
    compiler = Compiler(text, parameters)
    action: Action = parse_action(text)
    steps: list[_Step] = []
    for stmt in action.statements:
        if isinstance(stmt, Remove):
            steps.append(_remove_user(stmt.target.name))
            continue
        value = compiler.compile(stmt.value)
        if stmt.target.scope == "sys":
            steps.append(_set_system(stmt.target.name, value))
        else:
            steps.append(_set_user(stmt.target.name, value))
    return CompiledAction(text, dict(parameters) if parameters else None, steps)
