"""The message as the broker stores it, and the AMQP value rules every message must obey.

A ``MessageRecord`` is what crosses from a sender to a partition actor and back to a receiver:
one flat, slotted object per message, cheap to pickle in batches. The user-facing classes in
``raybus.message`` wrap it.

The fields map one to one onto the AMQP 1.0 message format (properties section, application
properties, message annotations), so an AMQP gateway can translate without loss.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from ..exceptions import InvalidArgumentError, MessageSizeExceededError

__all__ = [
    "ACTIVE",
    "DEFERRED",
    "MAX_ID_LENGTH",
    "MAX_PROPERTIES_SIZE",
    "MAX_PROPERTY_SIZE",
    "ROW_ALLOWANCE",
    "SCHEDULED",
    "MessageRecord",
    "active_expiry",
    "check_application_properties",
    "check_body",
    "check_settled_header",
    "encoded_size",
    "encoded_sizes",
    "from_wire",
    "snapshot",
    "stamp_accepted",
    "to_wire",
    "wire_sizes",
]

# ServiceBusMessageState values (see raybus.enums).
ACTIVE, DEFERRED, SCHEDULED = 0, 1, 2
SESSION_ID_IS_NULL = "Session ID is null"  # dead-letter reason: no session id, session queue
# Set by a topic's router on a copy that must go straight to the subscription's dead-letter
# sub-queue (its rules failed to evaluate); never a stored state. Senders cannot set it.
ARRIVE_DEAD_LETTERED = 3

MAX_ID_LENGTH = 128  # message_id, session_id, partition_key (Service Bus limit)
MAX_PROPERTIES_SIZE = 64 * 1024  # all system + application properties together
MAX_PROPERTY_SIZE = 32 * 1024  # any single property

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # AMQP long .. ulong
_FIXED_OVERHEAD = 24  # header + section descriptors of the AMQP encoding, approximately

_SIMPLE_TYPES = (type(None), bool, int, float, str, bytes, uuid.UUID, datetime)
_STRING_FIELDS = (
    "message_id",
    "correlation_id",
    "session_id",
    "reply_to",
    "reply_to_session_id",
    "to",
    "subject",
    "content_type",
    "partition_key",
)


@dataclass(slots=True)
class MessageRecord:
    """One message: what the sender set, and what the broker assigned.

    Times are float seconds since the epoch; ``expires_at`` is ``inf`` when the message never
    expires. ``size`` is the message's encoded size in bytes, computed once at the sender.
    """

    body: Any = None
    application_properties: dict[str, Any] | None = None
    message_id: str | None = None
    correlation_id: str | None = None
    session_id: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    to: str | None = None
    subject: str | None = None
    content_type: str | None = None
    partition_key: str | None = None
    time_to_live: float | None = None
    scheduled_enqueue_time: float | None = None
    size: int = 0
    # Assigned by the broker.
    sequence_number: int = 0
    enqueued_sequence_number: int = 0
    enqueued_time: float = 0.0
    expires_at: float = float("inf")
    delivery_count: int = 0
    state: int = ACTIVE
    lock_token: str | None = None
    locked_until: float = 0.0
    dead_letter_reason: str | None = None
    dead_letter_error_description: str | None = None
    dead_letter_source: str | None = None
    transfer_hops: int = 0  # times auto-forwarded (Service Bus dead-letters past 4)
    # A topic's copy made by a rule's action: what duplicate detection keys it on in the
    # subscription (``raybus._core.slots.dedup_id``), set by the fan-out; None otherwise.
    copy_of: Any = None


# Records cross actor boundaries as plain tuples: Ray serialises lists of tuples of primitives
# several times faster than lists of objects (measured: 100 records of 1 KiB, 1.4 ms vs 2.7 ms
# per call including the call itself).
WireRecord = tuple[Any, ...]
_WIRE_FIELDS = tuple(f.name for f in fields(MessageRecord))
_to_wire = operator.attrgetter(*_WIRE_FIELDS)


_SIZE_AT = _WIRE_FIELDS.index("size")
# What a row costs on the wire beyond its message's encoded size: the tuple, the broker's
# fields (numbers, times, a lock token) and pickling's framing (measured about 150 bytes).
ROW_ALLOWANCE = 192


_size_of = operator.itemgetter(_SIZE_AT)


def encoded_sizes(rows: Iterable[WireRecord]) -> int:
    """The messages' encoded sizes (as size limits count them) of ``rows``, summed."""
    return sum(map(_size_of, rows))


def wire_sizes(rows: Iterable[WireRecord]) -> list[int]:
    """About how many bytes each of ``rows`` takes in a remote call (``raybus._core.wire``):
    its message's encoded size plus the allowance."""
    return [size + ROW_ALLOWANCE for size in map(_size_of, rows)]


def to_wire(records: Iterable[MessageRecord]) -> list[WireRecord]:
    """Records as tuples, for a remote call."""
    return [_to_wire(r) for r in records]


def snapshot(record: MessageRecord) -> MessageRecord:
    """A shallow copy (several times faster than ``copy.copy`` for a slotted dataclass)."""
    return MessageRecord(*_to_wire(record))


def from_wire(rows: Iterable[WireRecord]) -> list[MessageRecord]:
    """Tuples from a remote call back into records."""
    return [MessageRecord(*row) for row in rows]


def stamp_accepted(
    rec: MessageRecord, seq: int, now: float, default_ttl: float, session_queue: bool
) -> tuple[str | None, str | None] | None:
    """Give a message the broker's fields as a partition accepts it under number ``seq`` at
    ``now`` (state, times, time to live; no lock, no delivery). Returns the dead-letter
    reason and description when it must go straight to the dead-letter sub-queue (the
    router marked it, or a session queue got it without a session id), else None.

    A pure function of its arguments and the record as sent: a partition's send and the
    replay of a committed transaction's share (``raybus._core.journal``) both use it, so the
    replayed message is exactly the one stored.
    """
    dead = None
    if rec.state == ARRIVE_DEAD_LETTERED:
        dead = (rec.dead_letter_reason, rec.dead_letter_error_description)
    rec.sequence_number = rec.enqueued_sequence_number = seq
    rec.delivery_count = 0
    rec.lock_token = None
    rec.locked_until = 0.0
    if rec.dead_letter_source is None:
        rec.dead_letter_reason = rec.dead_letter_error_description = None
    # Only a forwarded dead letter arrives with a dead_letter_source: it keeps that and its
    # reason and description (Service Bus keeps them in its application properties).
    ttl = default_ttl if rec.time_to_live is None else min(rec.time_to_live, default_ttl)
    rec.time_to_live = ttl
    at = rec.scheduled_enqueue_time
    if dead is not None or (session_queue and rec.session_id is None):
        rec.state, rec.enqueued_time, rec.expires_at = ACTIVE, now, float("inf")
        return dead or (
            SESSION_ID_IS_NULL,
            "The queue requires sessions and the message has no session id.",
        )
    if at is not None and at > now:
        rec.state, rec.enqueued_time, rec.expires_at = SCHEDULED, at, at + ttl
    else:
        rec.state, rec.enqueued_time = ACTIVE, now
        rec.expires_at = active_expiry(rec)
    return None


def active_expiry(rec: MessageRecord) -> float:
    """When an active message expires: its enqueue time plus its time to live (``inf`` for
    none). The one rule for a message accepted now and a scheduled one becoming active."""
    return rec.enqueued_time + (rec.time_to_live or float("inf"))


def _value_size(value: Any, where: str, *, nested: bool) -> int:
    """Encoded size of one AMQP value; raises ``InvalidArgumentError`` for non-AMQP values."""
    if value is None or isinstance(value, bool):
        return 1
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise InvalidArgumentError(
                f"{where}: integer {value} does not fit a 64-bit AMQP long/ulong",
                None,
                where,
            )
        return 9
    if isinstance(value, float):
        return 9
    if isinstance(value, str):
        return 5 + len(value.encode("utf-8"))
    if isinstance(value, bytes | bytearray | memoryview):
        return 5 + len(value)
    if isinstance(value, uuid.UUID):
        return 17
    if isinstance(value, datetime):
        return 9
    if nested and isinstance(value, list | tuple):
        return 9 + sum(_value_size(v, f"{where}[{i}]", nested=True) for i, v in enumerate(value))
    if nested and isinstance(value, dict):
        total = 9
        for k, v in value.items():
            total += _value_size(k, f"{where} key", nested=True)
            total += _value_size(v, f"{where}[{k!r}]", nested=True)
        return total
    kind = "an AMQP primitive" if not nested else "AMQP-encodable"
    raise InvalidArgumentError(
        f"{where}: a value of type {type(value).__name__} is not {kind} "
        f"(allowed: None, bool, int, float, str, bytes, UUID, datetime"
        f"{', list, dict' if nested else ''})",
        None,
        where,
    )


def check_body(body: Any) -> int:
    """Validate a message body and return its encoded size in bytes."""
    if body.__class__ is bytes:  # the common body, without the chain of type checks
        return 5 + len(body)
    return _value_size(body, "body", nested=True)


def check_application_properties(
    props: dict[str, Any] | None, field: str = "application_properties"
) -> int:
    """Validate application properties (string keys, primitive values); return their size.
    ``field`` is what the errors name (a settlement's ``properties_to_modify``)."""
    if props is None:
        return 0
    if not isinstance(props, dict):
        raise InvalidArgumentError(
            f"{field} must be a dict, not {type(props).__name__}", None, field
        )
    total = 0
    for key, value in props.items():
        if not isinstance(key, str):
            raise InvalidArgumentError(
                f"{field}: key {key!r} is a {type(key).__name__}, not a str", None, field
            )
        size = len(key.encode("utf-8")) + _value_size(value, f"{field}[{key!r}]", nested=False)
        if size > MAX_PROPERTY_SIZE:
            raise MessageSizeExceededError(
                f"application property {key!r} is {size} bytes; one property may have at most "
                f"{MAX_PROPERTY_SIZE}",
                None,
                size,
                MAX_PROPERTY_SIZE,
            )
        total += size
    return total


_strings = operator.attrgetter(*_STRING_FIELDS)
_others = operator.attrgetter(*_STRING_FIELDS[1:])  # all but message_id, the first
_NO_OTHERS = (None,) * (len(_STRING_FIELDS) - 1)


def check_string_fields(record: MessageRecord) -> int:
    """Validate the system string properties; return their encoded size."""
    if _others(record) == _NO_OTHERS:  # the common case: a message id at most
        mid = record.message_id
        if mid is None:
            return 0
        # An ASCII id (as every one a message is given) of a valid length: its UTF-8 is
        # itself, far below a property's limit.
        if mid.__class__ is str and 0 < len(mid) <= MAX_ID_LENGTH and mid.isascii():
            return 5 + len(mid)
    values = _strings(record)
    total = 0
    for name, value in zip(_STRING_FIELDS, values, strict=True):
        if value is None:
            continue
        if not isinstance(value, str):
            raise InvalidArgumentError(
                f"{name} must be a str, not {type(value).__name__}", None, name
            )
        if name in ("message_id", "session_id", "partition_key"):
            if len(value) > MAX_ID_LENGTH:
                raise InvalidArgumentError(
                    f"{name} is {len(value)} characters; at most {MAX_ID_LENGTH} are allowed",
                    None,
                    name,
                )
            if name in ("message_id", "session_id") and not value:
                raise InvalidArgumentError(f"{name} must not be empty", None, name)
        size = 5 + len(value.encode("utf-8"))
        if size > MAX_PROPERTY_SIZE:
            raise MessageSizeExceededError(
                f"{name} is {size} bytes; one property may have at most {MAX_PROPERTY_SIZE}",
                None,
                size,
                MAX_PROPERTY_SIZE,
            )
        total += size
    return total


# A dead letter's reason and description, as Service Bus keeps them: application properties.
_DEAD_LETTER_NAMES = (
    ("DeadLetterReason", "reason"),
    ("DeadLetterErrorDescription", "error_description"),
)


def check_settled_header(
    record: MessageRecord,
    properties: dict[str, Any] | None,
    dead_letter: tuple[str | None, str | None] | None,
    entity: str | None = None,
) -> None:
    """Refuse a settlement that would leave ``record`` with more header than a send may carry.

    The header after it: the record's system properties, its application properties with
    ``properties`` (a settlement's ``properties_to_modify``) merged in, and its dead-letter
    reason and description, ``dead_letter`` when it is dead-lettered (else the ones it has;
    Service Bus keeps them as the application properties ``DeadLetterReason`` and
    ``DeadLetterErrorDescription``). Each within 32 KB, all within 64 KB, as a send checks:
    ``MessageSizeExceededError`` naming what is too big, and the caller changes nothing.
    """
    merged = {**(record.application_properties or {}), **(properties or {})}
    try:
        total = check_string_fields(record) + check_application_properties(merged)
    except MessageSizeExceededError as e:  # a property given to the settlement
        raise MessageSizeExceededError(e.message, entity, e.size, e.max_size) from None
    if dead_letter is None:
        dead_letter = (record.dead_letter_reason, record.dead_letter_error_description)
    for (name, field), text in zip(_DEAD_LETTER_NAMES, dead_letter, strict=True):
        if text is None:
            continue
        size = len(name) + _value_size(text, field, nested=False)
        if size > MAX_PROPERTY_SIZE:
            raise MessageSizeExceededError(
                f"the dead-letter {field} is {size} bytes as a property; one property may "
                f"have at most {MAX_PROPERTY_SIZE}",
                entity,
                size,
                MAX_PROPERTY_SIZE,
            )
        total += size
    if total > MAX_PROPERTIES_SIZE:
        raise MessageSizeExceededError(
            f"the settlement would leave the message with {total} bytes of properties; at most "
            f"{MAX_PROPERTIES_SIZE} are allowed",
            entity,
            total,
            MAX_PROPERTIES_SIZE,
        )


def encoded_size(record: MessageRecord) -> int:
    """Validate a record's contents and return (and store in ``record.size``) its size.

    Raises ``InvalidArgumentError`` for values AMQP cannot carry and
    ``MessageSizeExceededError`` when the properties exceed Service Bus's 64 KiB header limit.
    """
    props = check_string_fields(record) + check_application_properties(
        record.application_properties
    )
    if props > MAX_PROPERTIES_SIZE:
        raise MessageSizeExceededError(
            f"message properties take {props} bytes; at most {MAX_PROPERTIES_SIZE} are allowed",
            None,
            props,
            MAX_PROPERTIES_SIZE,
        )
    record.size = _FIXED_OVERHEAD + props + check_body(record.body)
    return record.size
