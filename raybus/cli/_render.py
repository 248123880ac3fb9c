"""Turning messages, entity settings and rules into JSON lines and rich tables (pure functions).

A message becomes one JSON object per line (``message_json``): body, ids, sequence number,
delivery count, application properties and times (ISO-8601, UTC). A ``str`` body is printed
as is; a ``bytes`` body as text when it is UTF-8, else base64 with ``"body_encoding":
"base64"``; other AMQP bodies (numbers, lists, maps) as JSON values.

Settings of queues, topics and subscriptions (``properties_json``/``properties_table``) show
durations in seconds in JSON (``null`` = never) and as ``1m30s`` in tables. A rule's filter is
one readable line in tables (``filter_text``: ``SQL: amount > @min [@min=100]``,
``correlation: label='order', user.tier='vip'``, ``TRUE ...``) and an object with a ``type``
(``sql``, ``correlation``, ``true``, ``false``) in JSON (``rule_json``).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from .._core.filters.rules import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from .._models import MAX_DURATION, QueueProperties
from .._topic_models import SubscriptionProperties, TopicProperties
from ._filters import CORRELATION_FIELDS
from ._parse import format_duration

if TYPE_CHECKING:
    from ..message import ServiceBusReceivedMessage

__all__ = [
    "action_text",
    "filter_json",
    "filter_kind",
    "filter_text",
    "json_line",
    "message_json",
    "properties_json",
    "properties_table",
    "queues_table",
    "rule_json",
    "rule_table",
    "rules_table",
    "subscriptions_table",
    "to_jsonable",
    "topics_table",
]

_STATES = {0: "active", 1: "deferred", 2: "scheduled"}


def to_jsonable(value: Any) -> Any:
    """``value`` with datetimes, UUIDs, bytes, durations and enums made JSON-friendly."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return None if value >= MAX_DURATION else value.total_seconds()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode("ascii")
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    return str(value)


def _body(body: Any) -> tuple[Any, str | None]:
    if isinstance(body, bytes | bytearray | memoryview):
        raw = bytes(body)
        try:
            return raw.decode("utf-8"), None
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode("ascii"), "base64"
    return to_jsonable(body), None


def message_json(msg: ServiceBusReceivedMessage) -> dict[str, Any]:
    """One received (or peeked) message as a JSON-ready dict."""
    body, encoding = _body(msg.body)
    out: dict[str, Any] = {"body": body}
    if encoding:
        out["body_encoding"] = encoding
    ttl = msg.time_to_live
    out.update(
        message_id=msg.message_id,
        sequence_number=msg.sequence_number,
        partition_id=msg.partition_id,
        delivery_count=msg.delivery_count,
        state=_STATES.get(int(msg.state), str(msg.state)),
        session_id=msg.session_id,
        partition_key=msg.partition_key,
        correlation_id=msg.correlation_id,
        subject=msg.subject,
        content_type=msg.content_type,
        reply_to=msg.reply_to,
        reply_to_session_id=msg.reply_to_session_id,
        to=msg.to,
        application_properties=to_jsonable(msg.application_properties or {}),
        enqueued_time_utc=to_jsonable(msg.enqueued_time_utc),
        scheduled_enqueue_time_utc=to_jsonable(msg.scheduled_enqueue_time_utc),
        expires_at_utc=to_jsonable(msg.expires_at_utc),
        time_to_live=None if ttl is None else ttl.total_seconds(),
        lock_token=msg.lock_token,
        locked_until_utc=to_jsonable(msg.locked_until_utc),
        dead_letter_reason=msg.dead_letter_reason,
        dead_letter_error_description=msg.dead_letter_error_description,
        dead_letter_source=msg.dead_letter_source,
    )
    return out


def json_line(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)


# Not settings: identity fields and internals, and an entity's access rules (their keys are
# shown by ``raybus authorization-rule list`` only).
_NOT_SHOWN = frozenset({"name", "topic_name", "extra", "authorization_rules"})


def properties_json(
    props: Any, runtime: Any = None, *, rules: list[RuleProperties] | None = None
) -> dict[str, Any]:
    """The settings of a queue, topic or subscription (durations in seconds, ``null`` = never);
    with ``runtime``, its counters under ``"runtime"``; with ``rules``, those under
    ``"rules"`` (``rule_json``)."""
    out: dict[str, Any] = {
        f.name: to_jsonable(getattr(props, f.name))
        for f in dataclasses.fields(props)
        if f.name != "authorization_rules"
    }
    if runtime is not None:
        rt = {
            f.name: to_jsonable(getattr(runtime, f.name))
            for f in dataclasses.fields(runtime)
            if f.name not in _NOT_SHOWN
        }
        total = getattr(runtime, "total_message_count", None)
        if total is not None:
            rt["total_message_count"] = total
        out["runtime"] = rt
    if rules is not None:
        out["rules"] = [rule_json(r) for r in rules]
    return out


def _text(value: Any) -> str:
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    # Table cells are rich markup: user text such as "[@min=100]" must show as written.
    return "-" if value is None else escape(str(value))


def _kind(props: Any) -> str:
    if isinstance(props, TopicProperties):
        return "topic"
    if isinstance(props, SubscriptionProperties):
        return "subscription"
    return "queue"


def properties_table(
    props: Any, runtime: Any = None, *, rules: list[RuleProperties] | None = None
) -> Table:
    """A queue's, topic's or subscription's settings, then its counters, then its rules."""
    title = f"{_kind(props)} {getattr(props, 'path', props.name)}"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("setting", style="bold")
    table.add_column("value")
    for f in dataclasses.fields(props):
        if f.name not in _NOT_SHOWN:
            table.add_row(f.name, _text(getattr(props, f.name)))
    if runtime is not None:
        table.add_section()
        for f in dataclasses.fields(runtime):
            if f.name not in _NOT_SHOWN:
                table.add_row(f.name, _text(getattr(runtime, f.name)))
    if rules is not None:
        table.add_section()
        for rule in rules:
            action = "" if rule.action is None else f"; action: {action_text(rule.action)}"
            table.add_row(escape(f"rule {rule.name}"), escape(filter_text(rule.filter) + action))
        if not rules:
            table.add_row("rules", "none (the subscription receives nothing)")
    return table


def queues_table(queues: list[QueueProperties]) -> Table:
    table = Table(title="queues", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for col in ("parts", "lock", "max dlv", "ttl", "sessions", "dedup"):
        table.add_column(col, justify="right" if col in ("parts", "max dlv") else "left")
    for q in queues:
        table.add_row(
            q.name,
            _text(q.status),
            str(q.partition_count),
            _text(q.lock_duration),
            str(q.max_delivery_count),
            _text(q.default_message_time_to_live),
            "yes" if q.requires_session else "no",
            "yes" if q.requires_duplicate_detection else "no",
        )
    return table


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def topics_table(topics: list[TopicProperties]) -> Table:
    table = Table(title="topics", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for col in ("ttl", "dedup", "max size", "max msg", "idle delete"):
        table.add_column(col, justify="right" if col.startswith("max") else "left")
    for t in topics:
        table.add_row(
            t.name,
            _text(t.status),
            _text(t.default_message_time_to_live),
            _yes(t.requires_duplicate_detection),
            f"{t.max_size_in_megabytes} MB",
            f"{t.max_message_size_in_kilobytes} KiB",
            _text(t.auto_delete_on_idle),
        )
    return table


def subscriptions_table(topic: str, subs: list[SubscriptionProperties]) -> Table:
    table = Table(title=f"subscriptions of {topic}", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for col in ("parts", "lock", "max dlv", "ttl", "sessions", "forward to"):
        table.add_column(col, justify="right" if col in ("parts", "max dlv") else "left")
    for s in subs:
        table.add_row(
            s.name,
            _text(s.status),
            str(s.partition_count),
            _text(s.lock_duration),
            str(s.max_delivery_count),
            _text(s.default_message_time_to_live),
            _yes(s.requires_session),
            _text(s.forward_to),
        )
    return table


def filter_kind(f: RuleFilter) -> str:
    """``sql``, ``correlation``, ``true`` or ``false`` (the last two are also SQL filters:
    asked first)."""
    if isinstance(f, TrueRuleFilter):
        return "true"
    if isinstance(f, FalseRuleFilter):
        return "false"
    return "sql" if isinstance(f, SqlRuleFilter) else "correlation"


def _literal(value: Any) -> str:
    """A value as it would be written in SQL (strings quoted)."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if value is None:
        return "NULL"
    return str(to_jsonable(value))


def _params_text(parameters: dict[str, Any] | None) -> str:
    if not parameters:
        return ""
    inner = ", ".join(f"@{k.lstrip('@')}={_literal(v)}" for k, v in parameters.items())
    return f" [{inner}]"


def filter_text(f: RuleFilter) -> str:
    """One readable line: ``SQL: amount > @min [@min=100]``, ``correlation: label='order',
    user.tier='vip'``, ``TRUE (matches every message)``, ``FALSE (matches no message)``."""
    kind = filter_kind(f)
    if kind == "true":
        return "TRUE (matches every message)"
    if kind == "false":
        return "FALSE (matches no message)"
    if isinstance(f, SqlRuleFilter):
        return f"SQL: {f.sql_expression}{_params_text(f.parameters)}"
    parts = [
        f"{name}={_literal(getattr(f, name))}"
        for name in CORRELATION_FIELDS
        if getattr(f, name) is not None
    ]
    parts += [f"user.{k}={_literal(v)}" for k, v in (f.properties or {}).items()]
    return "correlation: " + ", ".join(parts)


def filter_json(f: RuleFilter) -> dict[str, Any]:
    """``{"type": ..., ...}``: ``sql_expression`` (and ``parameters``) for SQL, true and
    false filters; every field (``null`` if unset) and ``properties`` for correlation ones."""
    kind = filter_kind(f)
    out: dict[str, Any] = {"type": kind}
    if isinstance(f, CorrelationRuleFilter):
        for name in CORRELATION_FIELDS:
            out[name] = getattr(f, name)
        out["properties"] = to_jsonable(f.properties or {})
        return out
    out["sql_expression"] = f.sql_expression
    if kind == "sql":
        out["parameters"] = to_jsonable(f.parameters or {})
    return out


def action_json(action: SqlRuleAction | None) -> dict[str, Any] | None:
    if action is None:
        return None
    return {
        "sql_expression": action.sql_expression,
        "parameters": to_jsonable(action.parameters or {}),
    }


def action_text(action: SqlRuleAction | None) -> str:
    if action is None:
        return "-"
    return f"{action.sql_expression}{_params_text(action.parameters)}"


def rule_json(rule: RuleProperties) -> dict[str, Any]:
    return {
        "name": rule.name,
        "filter": filter_json(rule.filter),
        "action": action_json(rule.action),
        "created_at_utc": to_jsonable(rule.created_at_utc),
    }


def rules_table(topic: str, subscription: str, rules: list[RuleProperties]) -> Table:
    table = Table(title=f"rules of {topic}/Subscriptions/{subscription}", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("filter")
    table.add_column("action")
    for rule in rules:
        table.add_row(
            escape(rule.name), escape(filter_text(rule.filter)), escape(action_text(rule.action))
        )
    if not rules:
        table.caption = "no rules: the subscription receives nothing"
    return table


def rule_table(topic: str, subscription: str, rule: RuleProperties) -> Table:
    table = Table(
        title=escape(f"rule {rule.name} of {topic}/Subscriptions/{subscription}"),
        show_header=False,
        title_justify="left",
    )
    table.add_column("setting", style="bold")
    table.add_column("value")
    table.add_row("filter", escape(filter_text(rule.filter)))
    table.add_row("action", escape(action_text(rule.action)))
    table.add_row("created_at_utc", _text(rule.created_at_utc))
    return table
