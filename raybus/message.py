"""Messages: what a sender builds, what a receiver gets, and send batches.

``ServiceBusMessage`` validates at construction (AMQP types, id lengths, property sizes) and
again when sent, so a message changed after construction cannot slip past the rules. Its fields
map one to one onto the AMQP 1.0 message format.
"""

from __future__ import annotations

import operator
import os
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from ._clock import from_timestamp, to_timestamp
from ._core.record import MessageRecord, encoded_size
from ._core.store import LockTokens
from .enums import ServiceBusMessageState
from .exceptions import InvalidArgumentError, MessageSizeExceededError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from .amqp._annotated import AmqpAnnotatedMessage, AmqpMessageBodyType

__all__ = [
    "DataBody",
    "PropertyText",
    "ReceivedProperties",
    "ServiceBusMessage",
    "ServiceBusMessageBatch",
    "ServiceBusReceivedMessage",
    "TextBody",
]

_IMMUTABLE_BODIES = (bytes, str, int, float, type(None))
T = TypeVar("T")

_FIELDS = (
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

_fields_of = operator.attrgetter(*_FIELDS)
_FIELD_SET = frozenset(_FIELDS)


# Message ids in UUID form, as the SDK gives a message without one (``uuid4()``), at about a
# fifth of its cost (a sender builds one per message); a forked child draws a prefix of its
# own, so its ids never repeat its parent's.
_message_ids = LockTokens()
os.register_at_fork(after_in_child=_message_ids.restart)
_TTLS: dict[float, timedelta] = {}  # a queue's messages mostly share its default time to live


def _time_to_live(seconds: float | None) -> timedelta | None:
    """A received message's time to live as a timedelta (shared: timedeltas are immutable)."""
    if seconds is None or seconds == float("inf"):
        return None
    ttl = _TTLS.get(seconds)
    if ttl is None:
        ttl = timedelta(seconds=seconds)
        if len(_TTLS) < 1024:
            _TTLS[seconds] = ttl
    return ttl


class DataBody(bytes):
    """A received message's ``bytes`` body, readable as the Azure SDK's body too.

    It is the bytes sent (``==``, ``len``, ``decode``, slicing and the buffer protocol as for
    ``bytes``), and, like the SDK's body of a data message (an iterator of its data sections),
    it iterates as one section: ``b"".join(msg.body)``, ``next(msg.body)``,
    ``list(msg.body)[0]`` and ``for section in msg.body`` give the bytes sent, so code written
    for the SDK reads it unchanged. Iterating it therefore does not give ints, as iterating
    ``bytes`` does: index it (``body[i]``) or take ``bytes(body)`` for that. A message sent
    with it as its body sends plain ``bytes``."""

    __slots__ = ()

    def __iter__(self) -> Iterator[bytes]:  # type: ignore[override]
        return iter((bytes(self),))

    def __next__(self) -> bytes:
        return bytes(self)


class TextBody(str):
    """A received message's ``str`` body, readable as the Azure SDK's body too.

    It is the string sent; like the SDK's body of a string message (sent as one UTF-8 data
    section), it iterates as that one section: ``b"".join(msg.body)`` and ``next(msg.body)``
    give the UTF-8 bytes. Iterating it therefore does not give characters: take
    ``str(body)`` for that. A message sent with it as its body sends a plain ``str``."""

    __slots__ = ()

    def __iter__(self) -> Iterator[bytes]:  # type: ignore[override]
        return iter((self.encode("utf-8"),))

    def __next__(self) -> bytes:
        return self.encode("utf-8")


def _received_body(body: Any) -> Any:
    """The body a received message shows: bytes and str as ``DataBody`` and ``TextBody``,
    any other AMQP value as it is (the SDK's body of a value message is the value)."""
    cls = body.__class__
    if cls is bytes:
        return DataBody(body)
    if cls is str:
        return TextBody(body)
    return body


class PropertyText(str):
    """A ``str`` value of a received message's application properties, readable as the Azure
    SDK's value too.

    The SDK gives a received string property as ``bytes`` (its AMQP layer's habit; its docs
    say so since 2026), so code written for it decodes the value or compares it with
    ``bytes``. This is the string sent, and also answers that code: ``decode()`` gives the
    string, and it compares equal to its UTF-8 bytes (``value == b"order"``). Its hash is the
    string's, so it finds ``str`` keys in dicts and sets, not ``bytes`` ones. A message sent
    with it as a property value sends a plain ``str``."""

    __slots__ = ()

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return str.__str__(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, bytes):
            return self.encode("utf-8") == other
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__


def _property_name(key: Any) -> Any:
    """A property name given as ``bytes`` (as the SDK reads and writes them) as its ``str``;
    anything else as it is."""
    if isinstance(key, bytes):
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return key  # no such name: the lookup misses, a send is refused naming it
    return key


class ReceivedProperties(dict):  # type: ignore[type-arg]
    """A received message's ``application_properties``: a ``dict`` of the names and values
    sent, that also answers the Azure SDK's reading of them.

    The SDK gives received properties ``bytes`` names and ``bytes`` string values, so code
    written for it reads ``props[b"order_id"]`` or ``props.get(b"order_id")`` and decodes the
    value. Here the names are ``str`` (as sent; iterating gives ``str``), and a lookup,
    ``in``, ``get``, ``pop``, ``setdefault``, ``update``, assignment or deletion by a ``bytes``
    name means its UTF-8 ``str`` (a ``copy()`` reads the same); a ``str`` value is a
    ``PropertyText``, which also decodes and compares as the SDK's bytes. Code comparing the
    names themselves with ``bytes`` (iterating ``props.keys()``) sees ``str``: README
    "Deviations"."""

    __slots__ = ()

    def __missing__(self, key: Any) -> Any:
        name = _property_name(key)
        if name is not key and dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, _property_name(key))

    def get(self, key: Any, default: Any = None) -> Any:
        return dict.get(self, _property_name(key), default)

    def pop(self, key: Any, *default: Any) -> Any:
        return dict.pop(self, _property_name(key), *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        return dict.setdefault(self, _property_name(key), default)

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, _property_name(key), value)

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, _property_name(key))

    def update(self, *others: Any, **names: Any) -> None:
        for key, value in dict(*others, **names).items():
            self[key] = value

    def copy(self) -> ReceivedProperties:
        return ReceivedProperties(self)


def _received_properties(props: dict[str, Any] | None) -> ReceivedProperties | None:
    """The application properties a received message shows (``ReceivedProperties``, its own
    copy: changing it changes neither the broker's record nor another reader's)."""
    if props is None:
        return None
    return ReceivedProperties(
        {k: PropertyText(v) if v.__class__ is str else v for k, v in props.items()}
    )


def _received_application_properties(record: MessageRecord) -> ReceivedProperties | None:
    """A received message's application properties: its record's, and a dead letter's
    reason and description as ``DeadLetterReason`` and ``DeadLetterErrorDescription``, where
    Service Bus keeps them (the SDK reads ``dead_letter_reason`` from there; the broker's
    values win over properties of those names)."""
    props = record.application_properties
    reason, description = record.dead_letter_reason, record.dead_letter_error_description
    if reason is not None or description is not None:
        props = dict(props or {})
        if reason is not None:
            props["DeadLetterReason"] = reason
        if description is not None:
            props["DeadLetterErrorDescription"] = description
    return _received_properties(props)


def sendable_properties(
    props: dict[Any, Any], field: str = "application_properties"
) -> dict[Any, Any]:
    """Application properties as a send (or a settlement's ``properties_to_modify``) stores
    them: a copy (the broker must not share the caller's dict), with ``bytes`` names as their
    UTF-8 ``str`` (the SDK takes either) and ``str`` subclasses (a received ``PropertyText``)
    as plain ``str``, so no class of raybus's or the application's crosses to the broker. A
    name given both ways is refused, naming ``field``."""
    plain = dict(props)
    for key, value in plain.items():
        if key.__class__ is not str or (value.__class__ is not str and isinstance(value, str)):
            break
    else:
        return plain  # the common case: str names, plain values
    out: dict[Any, Any] = {}
    for key, value in plain.items():
        name = _property_name(key)
        if isinstance(name, str):
            name = str.__str__(name)
        if name in out:
            raise InvalidArgumentError(
                f"{field}: the name {name!r} is given twice (as str and bytes)", None, field
            )
        out[name] = str.__str__(value) if isinstance(value, str) else value
    return out


def _text_field(name: str, value: bytes) -> str:
    """A system string field given as ``bytes``, as the SDK takes them (its getters read them
    back decoded): the UTF-8 ``str``. ``InvalidArgumentError`` naming ``name`` if it is not
    UTF-8 (the SDK would keep the bytes; raybus stores these fields as strings)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgumentError(
            f"{name} must be a str, or bytes in UTF-8; {value[:20]!r} is not UTF-8", None, name
        ) from None


def _sendable_body(body: Any) -> Any:
    """A body as the broker keeps it: plain ``bytes`` for any bytes-like value (a received
    ``DataBody`` resent, a ``bytearray``, a ``memoryview``) and plain ``str`` for a ``str``
    subclass, so no class of raybus's or the application's crosses to the broker."""
    cls = body.__class__
    if cls is bytes or cls is str:
        return body
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return str.__str__(body)
    return body


class _Field(Generic[T]):
    """A received message's field: its record's ``source`` (through ``convert``), read when
    first asked for and kept in the message's ``__dict__``. Having no ``__set__``, it is
    asked only once: the kept value, or one assigned (as to a sent message's field), is
    found in ``__dict__`` first."""

    __slots__ = ("convert", "name", "source")

    def __init__(self, source: str | None, convert: Callable[[Any], Any] | None = None) -> None:
        self.source = source  # None: ``convert`` reads the whole record
        self.convert = convert
        self.name = source or ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, message: Any, owner: Any = None) -> T:
        # Reached only while the message's __dict__ has no such field yet.
        if message is None:  # on the class: the descriptor itself
            return cast(T, self)
        record = message.__dict__["_record"]
        value = record if self.source is None else getattr(record, self.source)
        if self.convert is not None:
            value = self.convert(value)
        message.__dict__[self.name] = value
        return cast(T, value)


class ServiceBusMessage:
    """A message to send.

    ``body`` is ``bytes``, ``str`` or any AMQP-encodable value (None, bool, int, float, str,
    bytes, UUID, datetime, and lists/dicts of those). ``application_properties`` values must be
    AMQP primitives (no lists or dicts); their names are ``str``, or ``bytes`` (UTF-8, as the
    SDK takes them: stored as the ``str``). The string fields (``message_id`` ...
    ``partition_key``) are ``str``, or UTF-8 ``bytes``, which they hold and read as the ``str``
    (as the SDK's getters decode them). ``time_to_live`` is capped by the entity's default;
    ``scheduled_enqueue_time_utc`` makes it a scheduled message. A message built without a
    ``message_id`` gets a unique one in UUID form, as the SDK gives it (so sending the same
    message twice to an entity with duplicate detection stores it once, and consumers can
    key on the id). Raises ``InvalidArgumentError`` (a ``ValueError``) naming the bad field.
    """

    body: Any
    application_properties: dict[str, Any] | None
    message_id: str | None
    correlation_id: str | None
    session_id: str | None
    reply_to: str | None
    reply_to_session_id: str | None
    to: str | None
    subject: str | None
    content_type: str | None
    time_to_live: timedelta | None
    scheduled_enqueue_time_utc: datetime | None
    partition_key: str | None

    def __init__(
        self,
        body: Any,
        *,
        application_properties: dict[str, Any] | None = None,
        message_id: str | None = None,
        correlation_id: str | None = None,
        session_id: str | None = None,
        reply_to: str | None = None,
        reply_to_session_id: str | None = None,
        to: str | None = None,
        subject: str | None = None,
        content_type: str | None = None,
        time_to_live: timedelta | None = None,
        scheduled_enqueue_time_utc: datetime | None = None,
        partition_key: str | None = None,
    ) -> None:
        # Written to __dict__ directly: __setattr__ below would drop the cache each time.
        self.__dict__.update(
            body=body,
            application_properties=application_properties,
            message_id=_message_ids.next() if message_id is None else message_id,
            correlation_id=correlation_id,
            session_id=session_id,
            reply_to=reply_to,
            reply_to_session_id=reply_to_session_id,
            to=to,
            subject=subject,
            content_type=content_type,
            time_to_live=time_to_live,
            scheduled_enqueue_time_utc=scheduled_enqueue_time_utc,
            partition_key=partition_key,
        )
        try:
            self._to_record()  # validate now: bad input fails where it was written
        except InvalidArgumentError:
            if not self._decode_fields():
                raise
            self._to_record()

    def __setattr__(self, name: str, value: Any) -> None:
        if value.__class__ is bytes and name in _FIELD_SET:
            value = _text_field(name, value)
        # Any change invalidates the validated record, so the next send validates again.
        self.__dict__.pop("_record_cache", None)
        object.__setattr__(self, name, value)

    def _decode_fields(self) -> bool:
        """Turn the system string fields given as ``bytes`` into their UTF-8 ``str`` (as the
        SDK reads them back); whether there were any. Looked for only when validation
        fails, so a message built with ``str`` fields pays nothing for it."""
        state = self.__dict__
        found = False
        for name in _FIELDS:
            value = state.get(name)
            if value.__class__ is bytes:
                state[name] = _text_field(name, value)
                found = True
        return found

    def _to_record(self) -> MessageRecord:
        """The validated broker record (size computed), cached until a field changes.

        The record is shared by every send of this message; callers must not change it.
        """
        state = self.__dict__
        props = self.application_properties
        cached: MessageRecord | None = state.get("_record_cache")
        # The properties dict can change in place, without __setattr__: compare it too.
        if cached is not None and state["_cached_props"] == props:
            return cached
        rec = self._build_record()
        if isinstance(self.body, _IMMUTABLE_BODIES):  # a list body could change in place
            state["_record_cache"] = rec
            state["_cached_props"] = dict(props) if isinstance(props, dict) else props
        return rec

    def _build_record(self) -> MessageRecord:
        ttl = self.time_to_live
        if ttl is not None:
            if not isinstance(ttl, timedelta):
                raise InvalidArgumentError(
                    f"time_to_live must be a timedelta, not {type(ttl).__name__}",
                    None,
                    "time_to_live",
                )
            if ttl.total_seconds() <= 0:
                raise InvalidArgumentError(
                    f"time_to_live must be positive, not {ttl}", None, "time_to_live"
                )
        at = self.scheduled_enqueue_time_utc
        if at is not None and not isinstance(at, datetime):
            raise InvalidArgumentError(
                "scheduled_enqueue_time_utc must be a datetime", None, "scheduled_enqueue_time_utc"
            )
        props = self.application_properties
        if props is not None and isinstance(props, dict):
            props = sendable_properties(props)
        body = _sendable_body(self.body)
        # Positional, in MessageRecord's field order (_FIELDS are its fields 2-10): a call
        # with 13 keywords took twice as long, and this runs for every message built.
        rec = MessageRecord(  # type: ignore[call-arg]  # mypy cannot count the 9 in *
            body,
            props,
            *_fields_of(self),
            None if ttl is None else ttl.total_seconds(),
            None if at is None else to_timestamp(at),
        )
        encoded_size(rec)
        return rec

    @property
    def size_in_bytes(self) -> int:
        """The message's encoded size, as counted against size limits."""
        return self._to_record().size

    @property
    def body_type(self) -> AmqpMessageBodyType:
        """The body's AMQP type, as the SDK's: ``DATA`` for a ``bytes`` or ``str`` body (read
        as data sections: ``b"".join(msg.body)`` works on a received one), ``VALUE`` for
        another, ``SEQUENCE`` for a body that came as sequence sections."""
        from .amqp._annotated import body_type_of

        return body_type_of(self)

    @property
    def raw_amqp_message(self) -> AmqpAnnotatedMessage:
        """The message as AMQP sections (advanced use), as in the SDK: the same object each
        time, and the message's fields read and write through it from then on, so changing
        either changes what a send stores (``raybus.amqp._annotated``)."""
        from .amqp._annotated import adopt_sections

        return adopt_sections(self)

    def __str__(self) -> str:
        body = self.body
        if isinstance(body, bytes):
            return body.decode("utf-8", errors="replace")
        return str(body)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(message_id={self.message_id!r}, body={self.body!r:.60})"


class ServiceBusReceivedMessage(ServiceBusMessage):
    """A message as received (or peeked), with the broker's properties. Settle it through the
    receiver that received it. A ``bytes`` or ``str`` body comes as a ``DataBody`` or
    ``TextBody``: the value sent, which also reads as the Azure SDK's body does
    (``b"".join(msg.body)``)."""

    _record: MessageRecord
    _entity: str
    _kind: str  # "locked" (peek-lock), "deleted" (receive-and-delete) or "peeked"
    _settled: bool
    auto_renew_error: BaseException | None

    def __init__(self, record: MessageRecord, *, entity: str, kind: str) -> None:
        # Not calling super().__init__: the broker already validated this message. The
        # message's own fields are read from the record when first asked for (``_Field``):
        # filling all thirteen took 1.8 us a message, most of a receiver's own per-message
        # work besides settling, and a handler reads a few of them.
        self.__dict__.update(
            _record=record,
            _entity=entity,
            _kind=kind,
            _settled=kind != "locked",
            auto_renew_error=None,
        )

    body: _Field[Any] = _Field("body", _received_body)
    application_properties: _Field[dict[str, Any] | None] = _Field(
        None, _received_application_properties
    )
    message_id: _Field[str | None] = _Field("message_id")
    correlation_id: _Field[str | None] = _Field("correlation_id")
    session_id: _Field[str | None] = _Field("session_id")
    reply_to: _Field[str | None] = _Field("reply_to")
    reply_to_session_id: _Field[str | None] = _Field("reply_to_session_id")
    to: _Field[str | None] = _Field("to")
    subject: _Field[str | None] = _Field("subject")
    content_type: _Field[str | None] = _Field("content_type")
    partition_key: _Field[str | None] = _Field("partition_key")
    time_to_live: _Field[timedelta | None] = _Field("time_to_live", _time_to_live)
    scheduled_enqueue_time_utc: _Field[datetime | None] = _Field(
        "scheduled_enqueue_time", from_timestamp
    )

    @property
    def sequence_number(self) -> int:
        return self._record.sequence_number

    @property
    def enqueued_sequence_number(self) -> int:
        return self._record.enqueued_sequence_number

    @property
    def enqueued_time_utc(self) -> datetime | None:
        return from_timestamp(self._record.enqueued_time)

    @property
    def delivery_count(self) -> int:
        """Earlier deliveries that ended without settlement (0 on the first delivery)."""
        return self._record.delivery_count

    @property
    def lock_token(self) -> str | None:
        return self._record.lock_token if self._kind == "locked" else None

    @property
    def locked_until_utc(self) -> datetime | None:
        if self._kind != "locked":
            return None
        return from_timestamp(self._record.locked_until)

    @property
    def expires_at_utc(self) -> datetime | None:
        return from_timestamp(self._record.expires_at)

    @property
    def dead_letter_reason(self) -> str | None:
        return self._record.dead_letter_reason

    @property
    def dead_letter_error_description(self) -> str | None:
        return self._record.dead_letter_error_description

    @property
    def dead_letter_source(self) -> str | None:
        return self._record.dead_letter_source

    @property
    def state(self) -> ServiceBusMessageState:
        return ServiceBusMessageState(self._record.state)

    @property
    def partition_id(self) -> int:
        """The partition that holds the message (top 16 bits of the sequence number)."""
        return self._record.sequence_number >> 48

    @property
    def raw_amqp_message(self) -> AmqpAnnotatedMessage:
        """The message as AMQP sections: what raybus's AMQP gateway delivers for it, the
        broker's annotations included (``raybus.amqp._annotated``). A new object each time;
        changing it changes nothing of the message."""
        from .amqp._annotated import AmqpAnnotatedMessage
        from .amqp._message import from_received

        payload = from_received(self, locked=self._kind == "locked")
        return AmqpAnnotatedMessage._from_sections(payload)

    def __repr__(self) -> str:
        return (
            f"ServiceBusReceivedMessage(sequence_number={self.sequence_number}, "
            f"message_id={self.message_id!r}, delivery_count={self.delivery_count}, "
            f"body={self.body!r:.60})"
        )


def outgoing(message: Any) -> ServiceBusMessage | None:
    """``message`` as the ``ServiceBusMessage`` a send stores: itself, or an
    ``AmqpAnnotatedMessage``'s sections mapped as the AMQP gateway maps them; None for
    anything else."""
    if isinstance(message, ServiceBusMessage):
        return message
    from .amqp._annotated import AmqpAnnotatedMessage

    if isinstance(message, AmqpAnnotatedMessage):
        return message._to_service_bus_message()
    return None


#: A batch's size when built without one (azure-servicebus's MAX_MESSAGE_LENGTH_BYTES).
DEFAULT_BATCH_BYTES = 1024 * 1024


class ServiceBusMessageBatch:
    """Messages that are sent together, all or nothing, within a size limit.

    Create with ``sender.create_message_batch()`` (limited to the entity's message size), or
    as the SDK's, ``ServiceBusMessageBatch(max_size_in_bytes=None)`` (1 MiB when not given, the
    SDK's default; as a list, a send limits it per message: Deviations). ``add_message`` raises
    ``MessageSizeExceededError`` when the message would not fit (the batch is unchanged).
    """

    def __init__(self, max_size_in_bytes: int | None = None) -> None:
        if max_size_in_bytes is None:
            max_size_in_bytes = DEFAULT_BATCH_BYTES
        if (
            isinstance(max_size_in_bytes, bool)
            or not isinstance(max_size_in_bytes, int)
            or max_size_in_bytes <= 0
        ):
            raise InvalidArgumentError(
                f"max_size_in_bytes must be a positive int, not {max_size_in_bytes!r}",
                None,
                "max_size_in_bytes",
            )
        self.max_size_in_bytes = max_size_in_bytes
        self._records: list[MessageRecord] = []
        self._size = 0

    def add_message(self, message: ServiceBusMessage | AmqpAnnotatedMessage) -> None:
        sendable = outgoing(message)
        if sendable is None:
            raise InvalidArgumentError(
                "a batch holds ServiceBusMessage or AmqpAnnotatedMessage objects, not "
                f"{type(message).__name__}",
                None,
                "message",
            )
        rec = sendable._to_record()
        if self._size + rec.size > self.max_size_in_bytes:
            raise MessageSizeExceededError(
                f"the message ({rec.size} bytes) does not fit the batch "
                f"({self._size} of {self.max_size_in_bytes} bytes used)",
                None,
                self._size + rec.size,
                self.max_size_in_bytes,
            )
        self._records.append(rec)
        self._size += rec.size

    @property
    def size_in_bytes(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[MessageRecord]:
        return iter(self._records)
