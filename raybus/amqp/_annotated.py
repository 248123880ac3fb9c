"""``AmqpAnnotatedMessage``: a message as its AMQP sections, as ``azure.servicebus.amqp`` has it.

Sending one (``send_messages``, ``schedule_messages``, ``ServiceBusMessageBatch.add_message``)
stores what the AMQP gateway stores for the same sections: it is encoded with raybus's AMQP
codec and mapped by ``raybus.amqp._message.to_raybus``, so the two ways in agree field for field.
The body is kept exact: several data sections, or sequence sections, come back as they were
sent (``raybus.amqp._message``'s raw-body rule). Of the header only ``time_to_live`` is kept,
of the message annotations ``x-opt-partition-key`` and ``x-opt-scheduled-enqueue-time``; the
other annotations, the delivery annotations, the footer and the properties raybus has no field
for (``user_id``, ``content_encoding``, ``absolute_expiry_time``, ``creation_time``,
``group_sequence``) are not stored, as in the gateway.

A received message's ``raw_amqp_message`` is the AMQP message the gateway would deliver for it:
the broker's annotations (``x-opt-sequence-number``, ``x-opt-enqueued-time``,
``x-opt-locked-until``, ...), the header's delivery count and time to live, the properties,
the application properties and the body sections. Where the SDK gives annotation keys and
property values as ``bytes``, raybus gives ``str`` (its application properties do the same),
and the annotations' times are ``datetime``s where the SDK has milliseconds.

An outgoing ``ServiceBusMessage``'s ``raw_amqp_message`` is, as in the SDK, the message itself
as sections: asked for the first time it is built from the message's fields, and from then on
the message reads and writes its fields through it (``_SectionBacked``), so a change on
either side shows on the other and is what a send stores. The fields map as the gateway maps
them: ``session_id`` is ``properties.group_id``, ``reply_to_session_id``
``properties.reply_to_group_id``, ``time_to_live`` ``header.time_to_live`` (milliseconds),
``scheduled_enqueue_time_utc`` and ``partition_key`` the annotations
``x-opt-scheduled-enqueue-time`` and ``x-opt-partition-key``; a ``bytes`` or ``str`` body is
one data section, any other body a value section.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any

from ..exceptions import InvalidArgumentError
from ..message import ReceivedProperties, ServiceBusMessage, _received_properties
from ._codec import EncodeError, Symbol, UInt
from ._message import (
    _APP_PROPS,
    _DATA,
    _HEADER,
    _MESSAGE_ANN,
    _PKEY,
    _PROPERTIES,
    _PROPERTY_FIELDS,
    _SCHED,
    _SEQUENCE,
    _VALUE,
    RAW_BODY_PROPERTY,
    Sections,
    _native,
    _native_body,
    _section,
    _text,
    body_section,
    to_raybus,
)

__all__ = [
    "AmqpAnnotatedMessage",
    "AmqpMessageBodyType",
    "AmqpMessageHeader",
    "AmqpMessageProperties",
]


class AmqpMessageBodyType(str, Enum):
    """Which body sections a message has."""

    DATA = "data"
    SEQUENCE = "sequence"
    VALUE = "value"


# Each body type's section code.
_SECTION_CODES = {
    AmqpMessageBodyType.DATA: _DATA,
    AmqpMessageBodyType.SEQUENCE: _SEQUENCE,
    AmqpMessageBodyType.VALUE: _VALUE,
}


class _Fields:
    """Keyword fields, readable as attributes and as a mapping (``header["priority"]``), as
    the SDK's models are."""

    _names: tuple[str, ...] = ()

    def __init__(self, **fields: Any) -> None:
        unknown = set(fields) - set(self._names)
        if unknown:
            raise InvalidArgumentError(
                f"{type(self).__name__} has no field {sorted(unknown)[0]!r}",
                None,
                type(self).__name__,
            )
        for name in self._names:
            setattr(self, name, fields.get(name))

    def __getitem__(self, key: str) -> Any:
        if key not in self._names:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self._names else default

    def keys(self) -> list[str]:
        return list(self._names)

    def values(self) -> list[Any]:
        return [getattr(self, n) for n in self._names]

    def items(self) -> list[tuple[str, Any]]:
        return [(n, getattr(self, n)) for n in self._names]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Fields)
            and type(other) is type(self)
            and (self.items() == other.items())
        )

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={v!r}" for n, v in self.items() if v is not None)
        return f"{type(self).__name__}({shown})"


class AmqpMessageHeader(_Fields):
    """The header section: ``delivery_count``, ``time_to_live`` (milliseconds), ``durable``,
    ``first_acquirer``, ``priority``."""

    _names = ("delivery_count", "time_to_live", "durable", "first_acquirer", "priority")
    delivery_count: int | None
    time_to_live: int | None
    durable: bool | None
    first_acquirer: bool | None
    priority: int | None


class AmqpMessageProperties(_Fields):
    """The properties section (AMQP 1.0, 3.2.4). ``group_id`` is the session id."""

    _names = _PROPERTY_FIELDS  # in the section's order
    message_id: Any
    user_id: bytes | None
    to: str | None
    subject: str | None
    reply_to: str | None
    correlation_id: Any
    content_type: str | None
    content_encoding: str | None
    absolute_expiry_time: int | None
    creation_time: int | None
    group_id: str | None
    group_sequence: int | None
    reply_to_group_id: str | None


def _model(cls: type[_Fields], value: Any, name: str) -> Any:
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls(**dict(value))
    raise InvalidArgumentError(
        f"{name} must be {cls.__name__} or a mapping, not {type(value).__name__}", None, name
    )


def _data_sections(body: Any) -> list[bytes]:
    sections = body if isinstance(body, list) else [body]
    out = []
    for section in sections:
        if isinstance(section, str):
            out.append(section.encode("utf-8"))
        elif isinstance(section, bytes | bytearray | memoryview):
            out.append(bytes(section))
        else:
            raise InvalidArgumentError(
                f"data_body sections are bytes or str, not {type(section).__name__}",
                None,
                "data_body",
            )
    return out


class AmqpAnnotatedMessage:
    """A message as AMQP sections, for sending what ``ServiceBusMessage`` has no keyword for
    (several data sections, a sequence or value body, header or annotations) and for reading a
    received message's sections (``ServiceBusReceivedMessage.raw_amqp_message``).

    Exactly one of ``data_body`` (bytes or str, or a list of them: one data section each),
    ``sequence_body`` (a list of lists: one sequence section each) and ``value_body`` (one AMQP
    value) must be given; otherwise ``InvalidArgumentError`` (a ``ValueError``).
    """

    def __init__(
        self,
        *,
        data_body: Any = None,
        sequence_body: Any = None,
        value_body: Any = None,
        header: AmqpMessageHeader | Mapping[str, Any] | None = None,
        footer: dict[Any, Any] | None = None,
        properties: AmqpMessageProperties | Mapping[str, Any] | None = None,
        application_properties: dict[str, Any] | None = None,
        annotations: dict[Any, Any] | None = None,
        delivery_annotations: dict[Any, Any] | None = None,
    ) -> None:
        given = [
            kind
            for kind, body in (
                (AmqpMessageBodyType.DATA, data_body),
                (AmqpMessageBodyType.SEQUENCE, sequence_body),
                (AmqpMessageBodyType.VALUE, value_body),
            )
            if body is not None
        ]
        if len(given) != 1:
            raise InvalidArgumentError(
                f"give exactly one of data_body, sequence_body and value_body, not {len(given)}",
                None,
                "body",
            )
        self._body_type = given[0]
        if self._body_type is AmqpMessageBodyType.DATA:
            self._body: Any = _data_sections(data_body)
        elif self._body_type is AmqpMessageBodyType.SEQUENCE:
            if not isinstance(sequence_body, list) or not sequence_body:
                raise InvalidArgumentError(
                    "sequence_body must be a non-empty list", None, "sequence_body"
                )
            sections = sequence_body if isinstance(sequence_body[0], list) else [sequence_body]
            self._body = [list(s) for s in sections]
        else:
            self._body = value_body
        self.header: AmqpMessageHeader | None = _model(AmqpMessageHeader, header, "header")
        self.properties: AmqpMessageProperties | None = _model(
            AmqpMessageProperties, properties, "properties"
        )
        self.footer = footer
        self.application_properties = application_properties
        self.annotations = annotations
        self.delivery_annotations = delivery_annotations

    @property
    def body_type(self) -> AmqpMessageBodyType:
        return self._body_type

    @property
    def body(self) -> Any:
        """The data sections (an iterator of bytes), the sequence sections (an iterator of
        lists) or the value, as the SDK gives them."""
        if self._body_type is AmqpMessageBodyType.VALUE:
            return self._body
        return iter(self._body)

    def __repr__(self) -> str:
        return f"AmqpAnnotatedMessage(body_type={self._body_type.value}, body={self._body!r:.60})"

    # -- to and from the wire

    def _encoded(self) -> bytes:
        """The message as the AMQP gateway would receive it (sections raybus reads only)."""
        parts = []
        ttl = None if self.header is None else self.header.time_to_live
        if ttl is not None:
            if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
                raise InvalidArgumentError(
                    f"header time_to_live is positive milliseconds (an int), not {ttl!r}",
                    None,
                    "header",
                )
            ttl = UInt(min(ttl, 2**32 - 1))
        parts.append(_section(_HEADER, [True, None, ttl]))
        if self.annotations:
            ann = {_symbol(k): v for k, v in self.annotations.items()}
            parts.append(_section(_MESSAGE_ANN, ann))
        if self.properties is not None:
            values = self.properties.values()
            if isinstance(values[6], str):  # content-type is a symbol
                values[6] = Symbol(values[6])
            while values and values[-1] is None:
                values.pop()
            if values:
                parts.append(_section(_PROPERTIES, values))
        if self.application_properties:
            parts.append(_section(_APP_PROPS, dict(self.application_properties)))
        code = _SECTION_CODES[self._body_type]
        if self._body_type is AmqpMessageBodyType.VALUE:
            parts.append(_section(code, self._body))
        else:  # one section each
            parts.extend(_section(code, section) for section in self._body)
        return b"".join(parts)

    def _to_service_bus_message(self) -> ServiceBusMessage:
        """The ``ServiceBusMessage`` that stores these sections (module docstring)."""
        try:
            payload = self._encoded()
        except EncodeError as exc:
            raise InvalidArgumentError(
                f"the message's sections do not encode as AMQP: {exc}", None, "body"
            ) from exc
        return to_raybus(payload)

    @classmethod
    def _from_sections(cls, payload: bytes) -> AmqpAnnotatedMessage:
        """The message an encoded AMQP message is (``raybus.amqp._message.from_received``)."""
        s = Sections(payload)
        kinds = {code for code, _ in s.body}
        values = [_native(v) for _, v in s.body]
        msg = cls.__new__(cls)
        if kinds == {_SEQUENCE}:
            msg._body_type, msg._body = AmqpMessageBodyType.SEQUENCE, values
        elif kinds == {_VALUE} and len(values) == 1:
            msg._body_type, msg._body = AmqpMessageBodyType.VALUE, values[0]
        else:  # data sections (a mix cannot be sent, nor stored)
            msg._body_type, msg._body = AmqpMessageBodyType.DATA, [bytes(v) for v in values]
        h = s.header + [None] * (5 - len(s.header))
        msg.header = AmqpMessageHeader(
            durable=h[0], priority=h[1], time_to_live=h[2], first_acquirer=h[3], delivery_count=h[4]
        )
        msg.properties = AmqpMessageProperties(
            **{k: (str(v) if isinstance(v, Symbol) else v) for k, v in s.properties.items()}
        )
        msg.footer = msg.delivery_annotations = None
        # Names are str; a lookup by the SDK's bytes names works too (ReceivedProperties).
        msg.annotations = ReceivedProperties(
            {(str(k) if isinstance(k, Symbol) else k): _native(v) for k, v in s.annotations.items()}
        )
        msg.application_properties = _received_properties(
            {str(k): _native(v) for k, v in s.app_properties.items()}
        )
        return msg


def _symbol(key: Any) -> Any:
    """A message annotation's key as AMQP has it: a symbol (the SDK's keys are ``bytes``)."""
    if isinstance(key, bytes):
        return Symbol(key.decode("utf-8"))
    return Symbol(key) if isinstance(key, str) else key


# -- an outgoing message's sections (ServiceBusMessage.raw_amqp_message)

_SCHEDULED = str(_SCHED)  # the gateway's annotation keys, as the plain str keys shown here
_PARTITION_KEY = str(_PKEY)
# ServiceBusMessage's fields kept in the properties section, by the section's names.
_IN_PROPERTIES = {
    "message_id": "message_id",
    "correlation_id": "correlation_id",
    "session_id": "group_id",
    "reply_to": "reply_to",
    "reply_to_session_id": "reply_to_group_id",
    "to": "to",
    "subject": "subject",
    "content_type": "content_type",
}


def _set_body(raw: AmqpAnnotatedMessage, body: Any) -> None:
    """``body`` as sections, as the gateway emits a stored body (``body_section``)."""
    code, value = body_section(body)
    if code == _DATA:
        raw._body_type, raw._body = AmqpMessageBodyType.DATA, [value]
    else:
        raw._body_type, raw._body = AmqpMessageBodyType.VALUE, value


def _body_of(raw: AmqpAnnotatedMessage) -> Any:
    """The body a send stores for ``raw``'s sections: ``to_raybus``'s reading of them
    (``_native_body``)."""
    code = _SECTION_CODES[raw._body_type]
    if raw._body_type is AmqpMessageBodyType.VALUE:
        return _native_body([(code, raw._body)])
    return _native_body([(code, section) for section in raw._body])


def _annotation_key(raw: AmqpAnnotatedMessage, name: str) -> Any:
    """The key ``name`` has in ``raw``'s annotations (``str`` or the SDK's ``bytes``), or None."""
    for key in raw.annotations or ():
        if key == name or key == name.encode("ascii"):
            return key
    return None


def _annotation(raw: AmqpAnnotatedMessage, name: str) -> Any:
    key = _annotation_key(raw, name)
    return None if key is None else raw.annotations[key]  # type: ignore[index]


def _set_annotation(raw: AmqpAnnotatedMessage, name: str, value: Any) -> None:
    key = _annotation_key(raw, name)
    if key is not None:
        del raw.annotations[key]  # type: ignore[union-attr]
    if value is not None:
        if raw.annotations is None:
            raw.annotations = {}
        raw.annotations[name] = value


def _check(value: Any, kind: type | tuple[type, ...], name: str) -> None:
    if value is not None and not isinstance(value, kind):
        raise InvalidArgumentError(
            f"{name} must be {getattr(kind, '__name__', kind)}, not {type(value).__name__}",
            None,
            name,
        )


class _SectionField:
    """One ``ServiceBusMessage`` field read from and written to the message's sections."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, message: Any, owner: type | None = None) -> Any:
        if message is None:
            return self
        raw: AmqpAnnotatedMessage = message.__dict__["_raw"]
        name = self.name
        if name == "body":
            return _body_of(raw)
        if name == "application_properties":
            return raw.application_properties
        if name in _IN_PROPERTIES:
            props = raw.properties
            return None if props is None else _text(getattr(props, _IN_PROPERTIES[name]))
        if name == "time_to_live":
            ms = None if raw.header is None else raw.header.time_to_live
            return None if ms is None else timedelta(milliseconds=ms)
        if name == "partition_key":
            return _text(_annotation(raw, _PARTITION_KEY))
        when = _annotation(raw, _SCHEDULED)  # scheduled_enqueue_time_utc
        if isinstance(when, int) and not isinstance(when, bool):  # milliseconds, as AMQP's
            return datetime.fromtimestamp(when / 1000, tz=timezone.utc)
        return when

    def __set__(self, message: Any, value: Any) -> None:
        raw: AmqpAnnotatedMessage = message.__dict__["_raw"]
        name = self.name
        if name == "body":
            _set_body(raw, value)
        elif name == "application_properties":
            _check(value, dict, name)
            raw.application_properties = value
        elif name in _IN_PROPERTIES:
            _check(value, str, name)
            if raw.properties is None:
                raw.properties = AmqpMessageProperties()
            setattr(raw.properties, _IN_PROPERTIES[name], value)
        elif name == "time_to_live":
            _check(value, timedelta, name)
            if raw.header is None:
                raw.header = AmqpMessageHeader()
            raw.header.time_to_live = None if value is None else round(value.total_seconds() * 1000)
        elif name == "partition_key":
            _check(value, str, name)
            _set_annotation(raw, _PARTITION_KEY, value)
        else:  # scheduled_enqueue_time_utc
            _check(value, datetime, name)
            _set_annotation(raw, _SCHEDULED, value)


class _SectionBacked:
    """Mixed into a ``ServiceBusMessage`` class (``_backed``) once a message's
    ``raw_amqp_message`` was asked for: its fields live in that ``AmqpAnnotatedMessage`` (the
    module docstring), and a send stores what the gateway would store for its sections. Its
    record is built anew for each send: the sections can change in place."""

    body = _SectionField("body")
    application_properties = _SectionField("application_properties")
    message_id = _SectionField("message_id")
    correlation_id = _SectionField("correlation_id")
    session_id = _SectionField("session_id")
    reply_to = _SectionField("reply_to")
    reply_to_session_id = _SectionField("reply_to_session_id")
    to = _SectionField("to")
    subject = _SectionField("subject")
    content_type = _SectionField("content_type")
    time_to_live = _SectionField("time_to_live")
    scheduled_enqueue_time_utc = _SectionField("scheduled_enqueue_time_utc")
    partition_key = _SectionField("partition_key")

    @property
    def raw_amqp_message(self) -> AmqpAnnotatedMessage:
        raw: AmqpAnnotatedMessage = self.__dict__["_raw"]
        return raw

    def _to_record(self) -> Any:
        return self.__dict__["_raw"]._to_service_bus_message()._to_record()

    def __reduce__(self) -> tuple[Any, ...]:
        # The class made by _backed is not importable by name: pickle the message's own
        # class and make it section-backed again when loading.
        return (_restore, (type(self).__bases__[1], dict(self.__dict__)))


_BACKED: dict[type[ServiceBusMessage], type] = {}


def _backed(cls: type[ServiceBusMessage]) -> type:
    """``cls`` with its fields kept in the sections, under ``cls``'s name (one per class: an
    application's subclass of ``ServiceBusMessage`` keeps its methods and attributes)."""
    backed = _BACKED.get(cls)
    if backed is None:
        names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        backed = _BACKED[cls] = type(cls.__name__, (_SectionBacked, cls), names)
    return backed


def _restore(cls: type[ServiceBusMessage], state: dict[str, Any]) -> Any:
    message = cls.__new__(cls)
    message.__dict__.update(state)
    object.__setattr__(message, "__class__", _backed(cls))
    return message


_FIELD_NAMES = ("body", "application_properties", *_IN_PROPERTIES)
_FIELD_NAMES += ("time_to_live", "scheduled_enqueue_time_utc", "partition_key")


def body_type_of(message: ServiceBusMessage) -> AmqpMessageBodyType:
    """The AMQP type of ``message``'s body (the SDK's ``body_type``), without making its
    sections: that of sections it holds (``raw_amqp_message`` was asked for, or a body that
    came over AMQP in a form raybus keeps as its bytes), else DATA for a ``bytes`` or ``str``
    body and VALUE for another, as the gateway would emit it (``body_section``)."""
    raw = message.__dict__.get("_raw")
    if raw is not None:
        return raw.body_type  # type: ignore[no-any-return]
    props = message.application_properties
    if props and RAW_BODY_PROPERTY in props:
        return AmqpAnnotatedMessage._from_sections(props[RAW_BODY_PROPERTY]).body_type
    code, _value = body_section(message.body)
    return AmqpMessageBodyType.DATA if code == _DATA else AmqpMessageBodyType.VALUE


def adopt_sections(message: ServiceBusMessage) -> AmqpAnnotatedMessage:
    """Make ``message`` read and write its fields through its sections; return them."""
    raw = AmqpAnnotatedMessage.__new__(AmqpAnnotatedMessage)
    _set_body(raw, message.body)
    ttl = message.time_to_live
    raw.header = AmqpMessageHeader(
        time_to_live=None if ttl is None else round(ttl.total_seconds() * 1000)
    )
    raw.properties = AmqpMessageProperties(
        **{section: getattr(message, field) for field, section in _IN_PROPERTIES.items()}
    )
    raw.application_properties = message.application_properties  # shared, as the SDK's
    raw.annotations = {}
    if message.scheduled_enqueue_time_utc is not None:
        raw.annotations[_SCHEDULED] = message.scheduled_enqueue_time_utc
    if message.partition_key is not None:
        raw.annotations[_PARTITION_KEY] = message.partition_key
    raw.footer = raw.delivery_annotations = None
    state = message.__dict__
    for name in (*_FIELD_NAMES, "_record_cache", "_cached_props"):
        state.pop(name, None)  # the fields now live in the sections
    state["_raw"] = raw
    object.__setattr__(message, "__class__", _backed(type(message)))
    return raw
