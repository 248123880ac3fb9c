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
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from ..exceptions import InvalidArgumentError
from ..message import ServiceBusMessage
from ._codec import EncodeError, Symbol, UInt
from ._message import (
    _APP_PROPS,
    _DATA,
    _HEADER,
    _MESSAGE_ANN,
    _PROPERTIES,
    _PROPERTY_FIELDS,
    _SEQUENCE,
    _VALUE,
    Sections,
    _native,
    _section,
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
        if self._body_type is AmqpMessageBodyType.DATA:
            parts.extend(_section(_DATA, s) for s in self._body)
        elif self._body_type is AmqpMessageBodyType.SEQUENCE:
            parts.extend(_section(_SEQUENCE, s) for s in self._body)
        else:
            parts.append(_section(_VALUE, self._body))
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
        msg.annotations = {
            (str(k) if isinstance(k, Symbol) else k): _native(v) for k, v in s.annotations.items()
        }
        msg.application_properties = {str(k): _native(v) for k, v in s.app_properties.items()}
        return msg


def _symbol(key: Any) -> Any:
    """A message annotation's key as AMQP has it: a symbol (the SDK's keys are ``bytes``)."""
    if isinstance(key, bytes):
        return Symbol(key.decode("utf-8"))
    return Symbol(key) if isinstance(key, str) else key
