"""A subscription's rules on the wire of the ``$management`` operations ``add-rule``,
``remove-rule`` and ``enumerate-rules`` (what the .NET SDK's ``ServiceBusRuleManager`` and
Java's ``ServiceBusRuleManagerClient`` send), to and from raybus's ``RuleProperties``.

A request describes a rule as maps (``rule-description``: ``sql-filter`` or
``correlation-filter``, and ``sql-rule-action`` or null); an ``enumerate-rules`` answer
describes each as a described list, ``com.microsoft:rule-description:list`` (code
``0x0000013700000004``): the filter, the action, the name and the creation time. The filter
and action are described lists too, by code:

====================================  ======================  ================================
type                                  code                    fields
====================================  ======================  ================================
``com.microsoft:sql-filter:list``     ``0x0000013700000006``  expression, compatibility level
``com.microsoft:true-filter:list``    ``0x0000013700000007``  (none; SQL ``1=1``)
``com.microsoft:false-filter:list``   ``0x0000013700000008``  (none; SQL ``1=0``)
``com.microsoft:correlation-filter``  ``0x0000013700000009``  correlation-id, message-id, to,
                                                              reply-to, label, session-id,
                                                              reply-to-session-id,
                                                              content-type, properties (map)
``com.microsoft:empty-rule-action``   ``0x0000013700000005``  (none)
``com.microsoft:sql-rule-action``     ``0x0000013700000006``  expression, compatibility level
====================================  ======================  ================================

The SQL filter and the SQL action share a code: a reader tells them apart by their place in
the rule's list (first the filter, then the action), as the SDKs do. The SDKs send a true
filter as the SQL filter ``1=1`` and a false one as ``1=0``: raybus keeps those as
``TrueRuleFilter`` / ``FalseRuleFilter``, so a listing shows them as the SDK made them. A SQL
filter's or action's ``parameters`` have no place on this wire (the SDKs send none); a rule
made with parameters through the administration client is listed here without them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .._core.filters import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from ..exceptions import InvalidArgumentError
from ._codec import Described, Int, Timestamp, ULong

__all__ = ["rule_description", "rule_from_request"]

RULE_DESCRIPTION = ULong(0x0000013700000004)
EMPTY_RULE_ACTION = ULong(0x0000013700000005)
SQL_FILTER = ULong(0x0000013700000006)
SQL_RULE_ACTION = ULong(0x0000013700000006)  # the same code as SQL_FILTER (module docstring)
TRUE_FILTER = ULong(0x0000013700000007)
FALSE_FILTER = ULong(0x0000013700000008)
CORRELATION_FILTER = ULong(0x0000013700000009)
# The SQL compatibility level Service Bus reports for its filters and actions.
_COMPATIBILITY_LEVEL = Int(20)

# The correlation filter's wire keys (and fields, in order) and CorrelationRuleFilter's names.
_CORRELATION_KEYS = (
    ("correlation-id", "correlation_id"),
    ("message-id", "message_id"),
    ("to", "to"),
    ("reply-to", "reply_to"),
    ("label", "label"),
    ("session-id", "session_id"),
    ("reply-to-session-id", "reply_to_session_id"),
    ("content-type", "content_type"),
)


def _map(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{what} must be a map, not {type(value).__name__}", None, what)
    return {str(k): v for k, v in value.items()}


def _expression(value: Any, what: str) -> str:
    text = _map(value, what).get("expression")
    if not isinstance(text, str):
        raise InvalidArgumentError(f"{what} needs a string expression, not {text!r}", None, what)
    return text


def _filter_from(description: dict[str, Any]) -> Any:
    sql, correlation = description.get("sql-filter"), description.get("correlation-filter")
    if (sql is None) == (correlation is None):
        raise InvalidArgumentError(
            "rule-description needs one filter: sql-filter or correlation-filter",
            None,
            "rule-description",
        )
    if sql is not None:
        text = _expression(sql, "sql-filter")
        if text.strip() == "1=1":
            return TrueRuleFilter()
        if text.strip() == "1=0":
            return FalseRuleFilter()
        return SqlRuleFilter(text)
    fields = _map(correlation, "correlation-filter")
    properties = fields.get("properties")
    if properties is not None:
        properties = _map(properties, "correlation-filter properties") or None
    return CorrelationRuleFilter(
        **{name: fields.get(key) for key, name in _CORRELATION_KEYS}, properties=properties
    )


def rule_from_request(args: dict[str, Any]) -> RuleProperties:
    """The rule an ``add-rule`` request's body (``rule-name``, ``rule-description``) asks for;
    ``InvalidArgumentError`` (or ``FilterSyntaxError`` for bad SQL) names what is wrong."""
    name: Any = args.get("rule-name")
    description = _map(args.get("rule-description"), "rule-description")
    action = description.get("sql-rule-action")
    return RuleProperties(
        name,  # checked by RuleProperties
        _filter_from(description),
        None if action is None else SqlRuleAction(_expression(action, "sql-rule-action")),
    )


def _filter_described(rule_filter: Any) -> Described:
    if isinstance(rule_filter, TrueRuleFilter):
        return Described(TRUE_FILTER, [])
    if isinstance(rule_filter, FalseRuleFilter):
        return Described(FALSE_FILTER, [])
    if isinstance(rule_filter, CorrelationRuleFilter):
        fields: list[Any] = [getattr(rule_filter, name) for _key, name in _CORRELATION_KEYS]
        fields.append(dict(rule_filter.properties or {}))
        return Described(CORRELATION_FILTER, fields)
    return Described(SQL_FILTER, [rule_filter.sql_expression, _COMPATIBILITY_LEVEL])


def _timestamp(when: datetime | None) -> Timestamp | None:
    return None if when is None else Timestamp(round(when.timestamp() * 1000))


def rule_description(rule: RuleProperties) -> Described:
    """``rule`` as an ``enumerate-rules`` answer describes it (module docstring)."""
    action = (
        Described(EMPTY_RULE_ACTION, [])
        if rule.action is None
        else Described(SQL_RULE_ACTION, [rule.action.sql_expression, _COMPATIBILITY_LEVEL])
    )
    return Described(
        RULE_DESCRIPTION,
        [_filter_described(rule.filter), action, rule.name, _timestamp(rule.created_at_utc)],
    )
