"""How an AMQP 1.0 message maps onto a raybus message and back.

raybus stores ``MessageRecord`` fields (body, application properties, the system properties);
the gateway translates at its edge and holds nothing itself.

Into raybus (``to_raybus``):

* properties: message-id, correlation-id (as strings), to, subject, reply-to, content-type,
  group-id (session id), reply-to-group-id; header ttl -> ``time_to_live``; message annotations
  ``x-opt-partition-key`` and ``x-opt-scheduled-enqueue-time``. Other annotations, user-id,
  content-encoding, group-sequence and footers are not kept (raybus has no field for them).
* application properties keep their AMQP types (``UInt`` and friends are ``int`` subclasses; a
  timestamp becomes a ``datetime``), so they re-encode as sent.
* the body a native receiver sees: one data section -> its ``bytes`` (several -> joined); one
  value section -> its value; sequence sections -> lists. The body is **kept exact**: when
  encoding that native body again (``encode_body``) would not give back the sender's body
  sections byte for byte (several data sections, sequences, arrays, described values,
  ...), the original encoded body sections also travel in the application property
  ``RAW_BODY_PROPERTY`` (``x-raybus-amqp-body``), which the gateway strips and re-emits
  verbatim. A body natives cannot hold (a described value) reaches them as those raw bytes.

Out of raybus (``from_received``, from the received message's public fields): the same
fields back, the broker's annotations (``x-opt-sequence-number``, ``x-opt-enqueued-time``,
``x-opt-locked-until``, ...), header delivery-count, ``DeadLetterReason`` /
``DeadLetterErrorDescription`` application properties for dead-lettered messages. A native
``bytes`` body becomes one data section, ``str`` a data section of its UTF-8 bytes (what the
Azure SDK does with a ``str`` body), anything else an amqp-value section.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..exceptions import InvalidArgumentError
from ..message import ServiceBusMessage, ServiceBusReceivedMessage
from ._codec import (
    Array,
    DecodeError,
    Described,
    Symbol,
    Timestamp,
    UInt,
    ULong,
    decode_all,
    encode,
)

__all__ = [
    "BATCH_FORMAT",
    "RAW_BODY_PROPERTY",
    "body_section",
    "encode_body",
    "from_received",
    "split_batch",
    "to_raybus",
]

BATCH_FORMAT = 0x80013700  # Service Bus batch: each data section holds one encoded message
RAW_BODY_PROPERTY = "x-raybus-amqp-body"

# Annotation keys, made once (from_received runs for every delivered message).
_SEQ = Symbol("x-opt-sequence-number")
_ENQ = Symbol("x-opt-enqueued-time")
_ENQ_SEQ = Symbol("x-opt-enqueue-sequence-number")
_STATE = Symbol("x-opt-message-state")
_LOCKED = Symbol("x-opt-locked-until")
_SCHED = Symbol("x-opt-scheduled-enqueue-time")
_PKEY = Symbol("x-opt-partition-key")
_DLSRC = Symbol("x-opt-deadletter-source")
_HEADER, _DELIVERY_ANN, _MESSAGE_ANN, _PROPERTIES, _APP_PROPS = 0x70, 0x71, 0x72, 0x73, 0x74
_DATA, _SEQUENCE, _VALUE, _FOOTER = 0x75, 0x76, 0x77, 0x78
_BODY = (_DATA, _SEQUENCE, _VALUE)
_PROPERTY_FIELDS = (
    "message_id",
    "user_id",
    "to",
    "subject",
    "reply_to",
    "correlation_id",
    "content_type",
    "content_encoding",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
    "reply_to_group_id",
)


def _section_code(value: Any) -> int | None:
    if isinstance(value, Described) and isinstance(value.descriptor, int):
        return int(value.descriptor)
    if isinstance(value, Described) and isinstance(value.descriptor, str):
        names = {
            "amqp:header:list": _HEADER,
            "amqp:delivery-annotations:map": _DELIVERY_ANN,
            "amqp:message-annotations:map": _MESSAGE_ANN,
            "amqp:properties:list": _PROPERTIES,
            "amqp:application-properties:map": _APP_PROPS,
            "amqp:data:binary": _DATA,
            "amqp:amqp-sequence:list": _SEQUENCE,
            "amqp:amqp-value:*": _VALUE,
            "amqp:footer:map": _FOOTER,
        }
        return names.get(value.descriptor)
    return None


class Sections:
    """A message's decoded sections, and the raw bytes of its body sections."""

    def __init__(self, payload: bytes | memoryview) -> None:
        self.header: list[Any] = []
        self.annotations: dict[Any, Any] = {}
        self.properties: dict[str, Any] = {}
        self.app_properties: dict[Any, Any] = {}
        self.body: list[tuple[int, Any]] = []
        body_start = body_end = -1
        for value, start, end in decode_all(payload):
            code = _section_code(value)
            if code is None:
                raise DecodeError("a message section is not a described section", start)
            inner = value.value
            if code in _BODY:
                if body_start < 0:
                    body_start = start
                body_end = end
                self.body.append((code, inner))
            elif code == _HEADER and isinstance(inner, list):
                self.header = inner
            elif code == _MESSAGE_ANN and isinstance(inner, dict):
                self.annotations = inner
            elif code == _PROPERTIES and isinstance(inner, list):
                self.properties = dict(zip(_PROPERTY_FIELDS, inner, strict=False))
            elif code == _APP_PROPS and isinstance(inner, dict):
                self.app_properties = inner
        self.raw_body = bytes(payload[body_start:body_end]) if body_start >= 0 else b""


def _native(value: Any) -> Any:
    """A decoded value as raybus stores it: timestamps become datetimes, arrays lists."""
    if isinstance(value, Timestamp):
        return value.to_datetime()
    if isinstance(value, Array):
        return [_native(v) for v in value.items]
    if isinstance(value, list):
        return [_native(v) for v in value]
    if isinstance(value, dict):
        return {_native(k): _native(v) for k, v in value.items()}
    return value


def _native_body(sections: list[tuple[int, Any]]) -> Any:
    if not sections:
        return None
    codes = {code for code, _ in sections}
    if codes == {_DATA}:
        return b"".join(bytes(v) for _, v in sections)
    if codes == {_VALUE} and len(sections) == 1:
        return _native(sections[0][1])
    if codes == {_SEQUENCE}:
        lists = [_native(v) for _, v in sections]
        return lists[0] if len(lists) == 1 else lists
    return [_native(v) for _, v in sections]


def body_section(body: Any) -> tuple[int, Any]:
    """The one body section raybus emits for a native body, as (section code, value): bytes
    and text a data section (text as its UTF-8 bytes), anything else an AMQP value."""
    if isinstance(body, bytes | bytearray | memoryview):
        return _DATA, bytes(body)
    if isinstance(body, str):
        return _DATA, body.encode("utf-8")
    return _VALUE, body


def encode_body(body: Any) -> bytes:
    """The body sections raybus emits for a native body (see the module docstring)."""
    code, value = body_section(body)
    return encode(Described(ULong(code), value))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def to_raybus(payload: bytes | memoryview) -> ServiceBusMessage:
    """An encoded AMQP message as a raybus message (``DecodeError``/``InvalidArgumentError``
    when it is malformed or breaks raybus's message rules)."""
    s = Sections(payload)
    props: dict[str, Any] = {}
    for key, value in s.app_properties.items():
        if not isinstance(key, str):
            raise InvalidArgumentError(
                f"application property key {key!r} is not a string", None, "application_properties"
            )
        props[str(key)] = value.to_datetime() if isinstance(value, Timestamp) else value
    body = _native_body(s.body)
    try:
        exact = encode_body(body) == s.raw_body
    except (TypeError, ValueError):
        exact = False
    if not exact:
        props[RAW_BODY_PROPERTY] = s.raw_body
    p = s.properties
    ttl = s.header[2] if len(s.header) > 2 else None
    ann = s.annotations
    scheduled = ann.get(_SCHED)
    if isinstance(scheduled, Timestamp):
        scheduled = scheduled.to_datetime()
    partition_key = ann.get(_PKEY)
    kwargs: dict[str, Any] = {
        "application_properties": props or None,
        "message_id": _text(p.get("message_id")),
        "correlation_id": _text(p.get("correlation_id")),
        "session_id": _text(p.get("group_id")),
        "reply_to": _text(p.get("reply_to")),
        "reply_to_session_id": _text(p.get("reply_to_group_id")),
        "to": _text(p.get("to")),
        "subject": _text(p.get("subject")),
        "content_type": _text(p.get("content_type")),
        "time_to_live": timedelta(milliseconds=int(ttl)) if ttl else None,
        "scheduled_enqueue_time_utc": scheduled if isinstance(scheduled, datetime) else None,
        "partition_key": _text(partition_key),
    }
    try:
        return ServiceBusMessage(body, **kwargs)
    except InvalidArgumentError as exc:
        if not str(exc.argument or "").startswith("body"):
            raise
    # A body natives cannot hold (a described value): they get the raw sections as bytes.
    kwargs["application_properties"] = {**props, RAW_BODY_PROPERTY: s.raw_body}
    return ServiceBusMessage(s.raw_body, **kwargs)


def split_batch(payload: bytes | memoryview) -> list[bytes]:
    """The messages inside a batch envelope (message-format 0x80013700)."""
    s = Sections(payload)
    out = []
    for code, value in s.body:
        if code != _DATA or not isinstance(value, bytes):
            raise DecodeError("a batch envelope holds only data sections")
        out.append(value)
    return out


def _ts(seconds: float | None) -> Timestamp | None:
    if seconds is None or seconds == float("inf") or seconds <= 0:
        return None
    return Timestamp(round(seconds * 1000))


def _section(code: int, value: Any) -> bytes:
    return encode(Described(ULong(code), value))


def _dt(when: datetime | None) -> Timestamp | None:
    return None if when is None else _ts(when.timestamp())


def from_received(msg: ServiceBusReceivedMessage, *, locked: bool) -> bytes:
    """The AMQP encoding of a received (or peeked) message as the peer gets it."""
    ttl = msg.time_to_live
    ttl_ms = None if ttl is None else round(ttl.total_seconds() * 1000)
    # The header's ttl is a uint of milliseconds (up to 49.7 days): a longer one is left out,
    # as the SDK leaves out an unset one (its expires_at_utc is enqueued time plus this ttl,
    # so a capped one read as a wrong, earlier expiry); absolute-expiry-time carries it.
    header_ttl = UInt(ttl_ms) if ttl_ms is not None and ttl_ms < 2**32 else None
    parts = [_section(_HEADER, [True, None, header_ttl, None, UInt(msg.delivery_count)])]
    enqueued = _dt(msg.enqueued_time_utc)
    ann: dict[Any, Any] = {
        _SEQ: msg.sequence_number,
        _ENQ: enqueued,
        _ENQ_SEQ: msg.enqueued_sequence_number,
        _STATE: int(msg.state),
    }
    locked_until = _dt(msg.locked_until_utc) if locked else None
    if locked_until is not None:
        ann[_LOCKED] = locked_until
    scheduled = _dt(msg.scheduled_enqueue_time_utc)
    if scheduled is not None:
        ann[_SCHED] = scheduled
    if msg.partition_key is not None:
        ann[_PKEY] = msg.partition_key
    if msg.dead_letter_source is not None:
        ann[_DLSRC] = msg.dead_letter_source
    parts.append(_section(_MESSAGE_ANN, ann))
    props = [
        msg.message_id,
        None,
        msg.to,
        msg.subject,
        msg.reply_to,
        msg.correlation_id,
        None if msg.content_type is None else Symbol(msg.content_type),
        None,
        _dt(msg.expires_at_utc),
        enqueued,
        msg.session_id,
        None,
        msg.reply_to_session_id,
    ]
    while props and props[-1] is None:
        props.pop()
    parts.append(_section(_PROPERTIES, props))
    app = dict(msg.application_properties or {})
    raw = app.pop(RAW_BODY_PROPERTY, None)  # (a dead letter's reason is among them)
    if app:
        parts.append(_section(_APP_PROPS, app))
    parts.append(raw if isinstance(raw, bytes) else encode_body(msg.body))
    return b"".join(parts)
