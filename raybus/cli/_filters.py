"""Rule options into filters and actions (pure functions; ``_render`` shows them).

A rule has one filter: ``--sql`` (with ``--param name=value``), correlation conditions
(``--correlation key=value`` or the per-field options of ``raybus rule create``), ``--true`` or
``--false``; none means ``--true`` (Service Bus' default). ``--action`` takes SQL ``SET``/
``REMOVE`` statements; ``--param`` values serve the filter and the action alike (a parameter
one of them does not use is ignored).

Correlation keys: the message fields ``correlation_id``, ``message_id``, ``to``, ``reply_to``,
``label`` (or ``subject``), ``session_id``, ``reply_to_session_id`` and ``content_type`` (any
case; ``-`` or no separator instead of ``_``, e.g. ``CorrelationId``; optionally prefixed
``sys.``) match the message's field as a string; any other key, or one prefixed ``user.``, is an
application property, typed like ``--property`` (``n=5`` is the integer 5).

SQL text is compiled here, before the broker is asked: a syntax error raises
``FilterSyntaxError`` (exit code 2) without joining Ray.
"""

from __future__ import annotations

from typing import Any

from .._core.filters.rules import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from ._parse import parse_property

__all__ = [
    "CORRELATION_FIELDS",
    "build_action",
    "build_filter",
    "build_rule",
    "parse_correlation",
    "parse_params",
]

CORRELATION_FIELDS = (
    "correlation_id",
    "message_id",
    "to",
    "reply_to",
    "label",
    "session_id",
    "reply_to_session_id",
    "content_type",
)
# Spellings of each field, squeezed (lower case, no '_' or '-'): correlationid -> correlation_id.
_FIELD_KEYS = {f.replace("_", ""): f for f in CORRELATION_FIELDS} | {"subject": "label"}


def _squeeze(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "")


def parse_params(items: list[str] | None) -> dict[str, Any] | None:
    """``--param name=value`` items into SQL parameters (``@`` optional on the name; values
    typed like ``--property``); ``None`` when there are none. A name given twice (ignoring
    case and ``@``) is refused."""
    if not items:
        return None
    out: dict[str, Any] = {}
    seen: set[str] = set()
    for item in items:
        key, value = parse_property(item)
        name = key.lstrip("@")
        if not name:
            raise ValueError(f"{item!r}: the parameter needs a name (name=value or @name=value)")
        if name.lower() in seen:
            raise ValueError(f"parameter @{name} is given twice")
        seen.add(name.lower())
        out[f"@{name}"] = value
    return out


def parse_correlation(items: list[str] | None) -> tuple[dict[str, str], dict[str, Any]]:
    """``key=value`` items into (message fields, application properties) of a correlation
    filter (see the module docstring for the keys)."""
    fields: dict[str, str] = {}
    props: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{item!r} is not key=value")
        low = key.lower()
        if low.startswith("user.") and len(key) > 5:
            name, value = parse_property(f"{key[5:]}={raw}")
            props[name] = value
            continue
        squeezed = _squeeze(key[4:] if low.startswith("sys.") else key)
        field = _FIELD_KEYS.get(squeezed)
        if field is None and low.startswith("sys."):
            raise ValueError(
                f"{key!r}: a correlation filter matches only "
                f"{', '.join(CORRELATION_FIELDS)} among the message fields"
            )
        if field is None:
            name, value = parse_property(item)
            props[name] = value
        else:
            if field in fields and fields[field] != raw:
                raise ValueError(f"{field} is given twice")
            fields[field] = raw
    return fields, props


def build_filter(
    *,
    sql: str | None = None,
    parameters: dict[str, Any] | None = None,
    correlation: dict[str, str] | None = None,
    properties: dict[str, Any] | None = None,
    true: bool = False,
    false: bool = False,
) -> RuleFilter:
    """The one filter the options describe (``TrueRuleFilter`` when none is given).

    Raises ``ValueError`` for conflicting options and ``FilterSyntaxError`` for bad SQL."""
    given = [
        name
        for name, present in (
            ("--sql", sql is not None),
            ("correlation conditions", bool(correlation) or bool(properties)),
            ("--true", true),
            ("--false", false),
        )
        if present
    ]
    if len(given) > 1:
        raise ValueError(f"give one filter, not {' and '.join(given)}")
    if sql is not None:
        if not sql.strip():
            raise ValueError('--sql needs an expression (e.g. "amount > 100")')
        return SqlRuleFilter(sql, parameters)
    if correlation or properties:
        return CorrelationRuleFilter(**(correlation or {}), properties=properties or None)
    if false:
        return FalseRuleFilter()
    return TrueRuleFilter()


def build_action(
    text: str | None, parameters: dict[str, Any] | None = None
) -> SqlRuleAction | None:
    """The ``--action`` statements (``None`` without ``--action``)."""
    if text is None:
        return None
    if not text.strip():
        raise ValueError("--action needs statements (e.g. \"SET priority = 'high'\")")
    return SqlRuleAction(text, parameters)


def build_rule(
    name: str,
    *,
    sql: str | None = None,
    params: list[str] | None = None,
    correlation: list[str] | None = None,
    fields: dict[str, str | None] | None = None,
    properties: list[str] | None = None,
    true: bool = False,
    false: bool = False,
    action: str | None = None,
) -> RuleProperties:
    """The rule the command-line options describe: ``--sql`` and ``--param`` items,
    ``--correlation key=value`` items, correlation ``fields`` given by their own options
    (``None`` values are ignored), ``--property key=value`` items (application properties),
    ``--true``/``--false``, ``--action``.

    Raises ``ValueError`` for conflicting or malformed options, ``FilterSyntaxError`` for bad
    SQL and ``InvalidArgumentError`` for a bad rule name."""
    parameters = parse_params(params)
    if parameters and sql is None and action is None:
        raise ValueError("--param needs --sql or --action")
    by_field, props = parse_correlation(correlation)
    for key, value in (fields or {}).items():
        if value is None:
            continue
        if key not in CORRELATION_FIELDS:
            raise ValueError(f"{key!r} is not a correlation field")
        if by_field.get(key, value) != value:
            raise ValueError(f"{key} is given twice")
        by_field[key] = value
    for item in properties or []:
        key, value = parse_property(item)
        props[key] = value
    rule_filter = build_filter(
        sql=sql,
        parameters=parameters,
        correlation=by_field,
        properties=props,
        true=true,
        false=false,
    )
    return RuleProperties(name, rule_filter, build_action(action, parameters))
