"""Subscription rules as azure-servicebus models them, and the copies a message fans out to.

``SqlRuleFilter``, ``CorrelationRuleFilter``, ``TrueRuleFilter``, ``FalseRuleFilter``,
``SqlRuleAction`` and ``RuleProperties`` keep the azure-servicebus names and fields. They are
frozen dataclasses validated on construction (a bad SQL text raises ``FilterSyntaxError``, a
bad field ``InvalidArgumentError``) and pickle as their fields only: SQL is compiled again,
lazily, on first use after unpickling, so rules can be shipped to router actors.

``fan_out`` implements Service Bus's copy semantics for one subscription.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeAlias

from ..._models import SdkDict
from ...exceptions import FilterEvaluationError, InvalidArgumentError
from ..record import MessageRecord
from .actions import CompiledAction, compile_action
from .compiler import CompiledFilter, compile_filter

__all__ = [
    "DEFAULT_RULE_NAME",
    "MAX_RULE_NAME_LENGTH",
    "CorrelationRuleFilter",
    "FalseRuleFilter",
    "RuleFilter",
    "RuleProperties",
    "SqlRuleAction",
    "SqlRuleFilter",
    "TrueRuleFilter",
    "fan_out",
    "matches",
]

DEFAULT_RULE_NAME = "$Default"
MAX_RULE_NAME_LENGTH = 50


def _check_sql(owner: str, text: Any, parameters: Any) -> dict[str, Any] | None:
    if not isinstance(text, str):
        raise InvalidArgumentError(
            f"{owner}.sql_expression must be a str, not {type(text).__name__}",
            None,
            "sql_expression",
        )
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise InvalidArgumentError(
            f"{owner}.parameters must be a dict, not {type(parameters).__name__}",
            None,
            "parameters",
        )
    return dict(parameters)


class _LazySql:
    """Pickles without the compiled form (closures don't pickle); compiles again on demand."""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_compiled", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


@dataclass(frozen=True)
class SqlRuleFilter(_LazySql):
    """A SQL-92-subset filter over system and user properties (never the body).

    The text is compiled on construction: bad text raises ``FilterSyntaxError``.
    ``evaluate`` returns TRUE/FALSE/``None`` (UNKNOWN) or raises ``FilterEvaluationError``.
    """

    sql_expression: str
    parameters: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        params = _check_sql("SqlRuleFilter", self.sql_expression, self.parameters)
        object.__setattr__(self, "parameters", params)
        object.__setattr__(self, "_compiled", compile_filter(self.sql_expression, params))

    @property
    def compiled(self) -> CompiledFilter:
        compiled: CompiledFilter | None = self.__dict__.get("_compiled")
        if compiled is None:
            compiled = compile_filter(self.sql_expression, self.parameters)
            object.__setattr__(self, "_compiled", compiled)
        return compiled

    def evaluate(self, record: MessageRecord) -> bool | None:
        return self.compiled.evaluate(record)

    def matches(self, record: MessageRecord) -> bool:
        return self.compiled.evaluate(record) is True


@dataclass(frozen=True)
class TrueRuleFilter(SqlRuleFilter):
    """Matches every message (SQL ``1=1``); the filter of the ``$Default`` rule. A
    ``SqlRuleFilter``, as the SDK's is (built without arguments; it matches without
    evaluating its text). Code telling filters apart asks for this class before
    ``SqlRuleFilter``."""

    sql_expression: str = field(default="1=1", init=False, repr=False)
    parameters: dict[str, Any] | None = field(default=None, init=False, repr=False)

    def evaluate(self, record: MessageRecord) -> bool | None:
        return True

    def matches(self, record: MessageRecord) -> bool:
        return True


@dataclass(frozen=True)
class FalseRuleFilter(SqlRuleFilter):
    """Matches no message (SQL ``1=0``); a ``SqlRuleFilter``, as the SDK's is (see
    ``TrueRuleFilter``)."""

    sql_expression: str = field(default="1=0", init=False, repr=False)
    parameters: dict[str, Any] | None = field(default=None, init=False, repr=False)

    def evaluate(self, record: MessageRecord) -> bool | None:
        return False

    def matches(self, record: MessageRecord) -> bool:
        return False


# CorrelationRuleFilter field -> MessageRecord field.
_CORRELATION_FIELDS = (
    ("correlation_id", "correlation_id"),
    ("message_id", "message_id"),
    ("to", "to"),
    ("reply_to", "reply_to"),
    ("label", "subject"),
    ("session_id", "session_id"),
    ("reply_to_session_id", "reply_to_session_id"),
    ("content_type", "content_type"),
)


def _same_value(actual: Any, expected: Any) -> bool:
    # A bool never equals a number (Python's True == 1 does); numbers compare by value.
    return (type(actual) is bool) is (type(expected) is bool) and bool(actual == expected)


@dataclass(frozen=True)
class CorrelationRuleFilter:
    """Exact, case-sensitive equality on each given field, all AND-ed (cheaper than SQL).

    ``label`` is matched against the message's subject. Each key of ``properties`` must be an
    application property of the message (same key, case-sensitive) with an equal value (a bool
    never equals a number; 1 equals 1.0). At least one condition is required. Never raises on
    evaluation.
    """

    correlation_id: str | None = None
    message_id: str | None = None
    to: str | None = None
    reply_to: str | None = None
    label: str | None = None
    session_id: str | None = None
    reply_to_session_id: str | None = None
    content_type: str | None = None
    properties: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        checks = []
        for name, record_field in _CORRELATION_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise InvalidArgumentError(
                    f"CorrelationRuleFilter.{name} must be a str, not {type(value).__name__}",
                    None,
                    name,
                )
            checks.append((record_field, value))
        props = self.properties
        if props is not None:
            if not isinstance(props, dict) or not all(isinstance(k, str) for k in props):
                raise InvalidArgumentError(
                    "CorrelationRuleFilter.properties must be a dict with str keys",
                    None,
                    "properties",
                )
            object.__setattr__(self, "properties", dict(props))
        if not checks and not props:
            raise InvalidArgumentError(
                "a CorrelationRuleFilter needs at least one field or property to match "
                "(use TrueRuleFilter to match everything)",
                None,
                "properties",
            )
        object.__setattr__(self, "_checks", tuple(checks))

    def evaluate(self, record: MessageRecord) -> bool | None:
        return self.matches(record)

    def matches(self, record: MessageRecord) -> bool:
        checks: tuple[tuple[str, str], ...] = self.__dict__["_checks"]
        for record_field, expected in checks:
            if getattr(record, record_field) != expected:
                return False
        if self.properties:
            actual = record.application_properties
            if not actual:
                return False
            for key, expected in self.properties.items():
                if key not in actual or not _same_value(actual[key], expected):
                    return False
        return True


RuleFilter: TypeAlias = SqlRuleFilter | CorrelationRuleFilter | TrueRuleFilter | FalseRuleFilter
_FILTER_TYPES = (SqlRuleFilter, CorrelationRuleFilter, TrueRuleFilter, FalseRuleFilter)


@dataclass(frozen=True)
class SqlRuleAction(_LazySql):
    """``SET``/``REMOVE`` statements applied to a subscription's copy of a message.

    Compiled on construction (bad text raises ``FilterSyntaxError``). ``apply`` is all or
    nothing (see ``CompiledAction.apply``).
    """

    sql_expression: str
    parameters: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        params = _check_sql("SqlRuleAction", self.sql_expression, self.parameters)
        object.__setattr__(self, "parameters", params)
        object.__setattr__(self, "_compiled", compile_action(self.sql_expression, params))

    @property
    def compiled(self) -> CompiledAction:
        compiled: CompiledAction | None = self.__dict__.get("_compiled")
        if compiled is None:
            compiled = compile_action(self.sql_expression, self.parameters)
            object.__setattr__(self, "_compiled", compiled)
        return compiled

    def apply(self, record: MessageRecord) -> None:
        self.compiled.apply(record)


@dataclass(eq=True)
class RuleProperties(SdkDict):
    """A named rule of a subscription: a filter and an optional action.

    ``name`` is 1 to 50 characters and not blank; names are unique per subscription (checked
    by the subscription, not here). As in the SDK, ``filter`` and ``action`` may be assigned
    (``rule.filter = SqlRuleFilter(...)``, then ``update_rule(topic, sub, rule)``); an
    assignment is checked as the constructor checks it, and a bad value changes nothing. The
    broker keeps its own copy: a change reaches it through ``update_rule``. ``name`` and
    ``created_at_utc`` are fixed (the name is the rule's key; the time is the broker's).
    """

    name: str
    filter: RuleFilter
    action: SqlRuleAction | None = None
    created_at_utc: datetime | None = None

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_RULE_NAME_LENGTH:
            raise InvalidArgumentError(
                f"a rule name must be a non-blank str of at most {MAX_RULE_NAME_LENGTH} "
                f"characters, not {name!r}",
                None,
                "name",
            )
        _check_rule_filter(name, self.filter)
        _check_rule_action(name, self.action)
        if self.created_at_utc is not None and not isinstance(self.created_at_utc, datetime):
            raise InvalidArgumentError(
                f"rule {name!r}: created_at_utc must be a datetime or None",
                None,
                "created_at_utc",
            )
        object.__setattr__(self, "_built", True)

    def __setattr__(self, field: str, value: Any) -> None:
        if self.__dict__.get("_built"):
            if field == "filter":
                _check_rule_filter(self.name, value)
            elif field == "action":
                _check_rule_action(self.name, value)
            else:
                raise AttributeError(
                    f"rule {self.name!r}: {field} cannot be changed (only filter and action)"
                )
        object.__setattr__(self, field, value)

    __hash__ = None  # type: ignore[assignment]  # mutable, so unhashable


def _check_rule_filter(name: str, value: Any) -> None:
    if not isinstance(value, _FILTER_TYPES):
        raise InvalidArgumentError(
            f"rule {name!r}: filter must be a SqlRuleFilter, CorrelationRuleFilter, "
            f"TrueRuleFilter or FalseRuleFilter, not {type(value).__name__}",
            None,
            "filter",
        )


def _check_rule_action(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, SqlRuleAction):
        raise InvalidArgumentError(
            f"rule {name!r}: action must be a SqlRuleAction or None, not {type(value).__name__}",
            None,
            "action",
        )


def matches(filter: RuleFilter, record: MessageRecord) -> bool | None:
    """The three-valued result of ``filter`` on ``record`` (``None`` = UNKNOWN, which does not
    match). Raises ``FilterEvaluationError`` for SQL filters only."""
    return filter.evaluate(record)


Copy: TypeAlias = tuple[str | None, CompiledAction | None]


def fan_out(
    rules: Sequence[RuleProperties], record: MessageRecord
) -> tuple[list[Copy], FilterEvaluationError | None]:
    """The copies of ``record`` one subscription receives under Service Bus semantics.

    Rules without an action are OR-ed and give at most one copy, ``(None, None)``, listed
    first; each matching rule with an action gives its own copy ``(rule name, action)``, in
    rule order (the caller applies the action to that copy and stamps the rule name). So five
    matching rules of which two have actions give three copies; no rules, or no match, give
    none. Filters are evaluated in rule order; the first one that raises ends the fan-out with
    ``([], error)`` (its message names the rule; its ``type_name`` is kept) and the caller
    dead-letters the message on this subscription. The record is not changed.
    """
    plain = False
    with_action: list[Copy] = []
    for rule in rules:
        try:
            result = rule.filter.evaluate(record)
        except FilterEvaluationError as e:
            return [], FilterEvaluationError(
                f"rule {rule.name!r}: {e.message}", e.entity, e.type_name
            )
        if result is True:
            if rule.action is None:
                plain = True
            else:
                with_action.append((rule.name, rule.action.compiled))
    copies: list[Copy] = [(None, None)] if plain else []
    copies.extend(with_action)
    return copies, None
