"""Turning messages and queue settings into JSON lines and rich tables (pure functions).

A message becomes one JSON object per line (``message_json``): body, ids, sequence number,
delivery count, application properties and times (ISO-8601, UTC). A ``str`` body is printed
as is; a ``bytes`` body as text when it is UTF-8, else base64 with ``"body_encoding":
"base64"``; other AMQP bodies (numbers, lists, maps) as JSON values.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any

from rich.table import Table

from .._models import MAX_DURATION, QueueProperties, QueueRuntimeProperties
from ._parse import format_duration

if TYPE_CHECKING:
    from ..message import ServiceBusReceivedMessage

__all__ = [
    "json_line",
    "message_json",
    "properties_json",
    "properties_table",
    "queues_table",
    "to_jsonable",
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


def properties_json(
    props: QueueProperties, runtime: QueueRuntimeProperties | None = None
) -> dict[str, Any]:
    """Queue settings (durations in seconds, ``null`` = never) and, with ``runtime``, its
    counters under ``"runtime"``."""
    out: dict[str, Any] = {
        f.name: to_jsonable(getattr(props, f.name)) for f in dataclasses.fields(props)
    }
    if runtime is not None:
        rt = {
            f.name: to_jsonable(getattr(runtime, f.name))
            for f in dataclasses.fields(runtime)
            if f.name not in ("name", "extra")
        }
        rt["total_message_count"] = runtime.total_message_count
        out["runtime"] = rt
    return out


def _text(value: Any) -> str:
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    return "-" if value is None else str(value)


def properties_table(
    props: QueueProperties, runtime: QueueRuntimeProperties | None = None
) -> Table:
    table = Table(title=f"queue {props.name}", show_header=False, title_justify="left")
    table.add_column("setting", style="bold")
    table.add_column("value")
    for f in dataclasses.fields(props):
        if f.name != "name":
            table.add_row(f.name, _text(getattr(props, f.name)))
    if runtime is not None:
        table.add_section()
        for f in dataclasses.fields(runtime):
            if f.name not in ("name", "extra"):
                table.add_row(f.name, _text(getattr(runtime, f.name)))
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
