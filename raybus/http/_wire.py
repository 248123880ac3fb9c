"""Messages on the wire of the Service Bus REST runtime API: headers and bodies both ways.

The mapping is Service Bus's (REST "Message headers and properties"):

* **Body**: the HTTP body, as bytes. A message a Python sender sent with a ``str`` body comes
  back UTF-8 encoded; any other non-bytes body (an AMQP value: number, list, dict, ...) comes
  back as JSON.
* **System properties**: the ``BrokerProperties`` header, a JSON object (``MessageId``,
  ``CorrelationId``, ``SessionId``, ``Label``, ``ReplyTo``, ``ReplyToSessionId``, ``To``,
  ``PartitionKey``, ``TimeToLive`` in seconds, ``ScheduledEnqueueTimeUtc`` as an RFC 1123 or
  ISO-8601 date). Unknown names are ignored, as Service Bus does; a known name with a value of
  the wrong type is a 400. On receive the broker adds ``SequenceNumber``,
  ``EnqueuedSequenceNumber``, ``EnqueuedTimeUtc``, ``DeliveryCount`` (1 on the first delivery,
  as the REST API counts; the Python API reports 0), ``LockToken``, ``LockedUntilUtc`` and
  ``State``.
* **Content type**: the ``Content-Type`` header (``BrokerProperties.ContentType`` wins if set).
* **Application properties**: every other request header (standard HTTP, ``x-ms-*`` and proxy
  headers excepted). A value that parses as a JSON string, number or boolean is that value,
  anything else the header text; on receive each property is a header whose value is
  JSON-encoded (strings quoted). HTTP header names are case-insensitive and reach the gateway
  lower-cased, so property names sent over HTTP are lower-case.
* **Batches** (``Content-Type: application/vnd.microsoft.servicebus.json``): a JSON array of
  ``{"Body": "<text>", "BrokerProperties": {...}, "UserProperties": {...}}``.
"""

from __future__ import annotations

import base64
import json
import math
import re
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any

from ..message import ServiceBusMessage, ServiceBusReceivedMessage

__all__ = [
    "BATCH_CONTENT_TYPE",
    "HttpError",
    "batch_messages",
    "http_date",
    "received_body",
    "received_headers",
    "single_message",
]

BATCH_CONTENT_TYPE = "application/vnd.microsoft.servicebus.json"

# Request headers that are never application properties.
_NOT_PROPERTIES = frozenset(
    {
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "authorization",
        "brokerproperties",
        "cache-control",
        "connection",
        "content-encoding",
        "content-length",
        "content-md5",
        "content-type",
        "cookie",
        "date",
        "expect",
        "forwarded",
        "host",
        "keep-alive",
        "origin",
        "pragma",
        "referer",
        "te",
        "trailer",
        "traceparent",
        "tracestate",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "via",
        "x-request-id",
    }
)
_NOT_PROPERTY_PREFIXES = ("x-ms-", "x-forwarded-", "proxy-", "sec-")
# Response headers an application property may not become (besides the request headers
# above, which include the hop-by-hop ones that would change the response's framing).
_RESERVED_RESPONSE = _NOT_PROPERTIES | {
    "location",
    "retry-after",
    "server",
    "set-cookie",
    "www-authenticate",
}
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

_STRING_FIELDS = {
    "MessageId": "message_id",
    "CorrelationId": "correlation_id",
    "SessionId": "session_id",
    "Label": "subject",
    "ReplyTo": "reply_to",
    "ReplyToSessionId": "reply_to_session_id",
    "To": "to",
    "PartitionKey": "partition_key",
    "ContentType": "content_type",
}


class HttpError(Exception):
    """A request the gateway answers with ``status`` and ``reason`` without reaching the
    broker (bad input, unknown route, oversize body)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason


def _bad(reason: str) -> HttpError:
    return HttpError(400, reason)


def _parse_time(value: Any, where: str) -> datetime:
    if not isinstance(value, str) or not value.strip():
        raise _bad(f"{where} must be a date string (RFC 1123 or ISO-8601)")
    text = value.strip()
    try:
        at = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        try:
            at = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise _bad(f"{where} {value!r} is not an RFC 1123 or ISO-8601 date") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


def _message_options(props: Any, where: str) -> dict[str, Any]:
    """``ServiceBusMessage`` keyword arguments from a BrokerProperties object."""
    if not isinstance(props, dict):
        raise _bad(f"{where} must be a JSON object")
    out: dict[str, Any] = {}
    for name, field in _STRING_FIELDS.items():
        value = props.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise _bad(f"{where}.{name} must be a string, not {type(value).__name__}")
        out[field] = value
    ttl = props.get("TimeToLive")
    if ttl is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0:
            raise _bad(f"{where}.TimeToLive must be a positive number of seconds")
        if math.isfinite(ttl) and ttl < timedelta.max.total_seconds():
            out["time_to_live"] = timedelta(seconds=ttl)
    at = props.get("ScheduledEnqueueTimeUtc")
    if at is not None:
        out["scheduled_enqueue_time_utc"] = _parse_time(at, f"{where}.ScheduledEnqueueTimeUtc")
    return out


def _header_value(text: str) -> Any:
    """An application property from a header: a JSON scalar if it is one, else the text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, str | bool | int | float) and not (
        isinstance(value, float) and not math.isfinite(value)
    ):
        return value
    return text


def _application_properties(headers: list[tuple[str, str]]) -> dict[str, Any] | None:
    props: dict[str, Any] = {}
    for name, value in headers:
        key = name.lower()
        if key in _NOT_PROPERTIES or key.startswith(_NOT_PROPERTY_PREFIXES):
            continue
        props[key] = _header_value(value)
    return props or None


def _parse_json(text: str | bytes, where: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise _bad(f"{where} is not valid JSON") from None


def _build(body: Any, options: dict[str, Any], props: dict[str, Any] | None) -> ServiceBusMessage:
    try:
        return ServiceBusMessage(body, application_properties=props, **options)
    except ValueError as exc:  # InvalidArgumentError: raybus's own validation, with its reason
        raise _bad(str(exc)) from None


def single_message(
    headers: list[tuple[str, str]], content_type: str | None, body: bytes
) -> ServiceBusMessage:
    """The message of a single send: body, ``BrokerProperties`` and custom headers."""
    options: dict[str, Any] = {}
    broker = [v for k, v in headers if k.lower() == "brokerproperties"]
    if len(broker) > 1:
        raise _bad("send one BrokerProperties header")
    if broker:
        options = _message_options(_parse_json(broker[0], "BrokerProperties"), "BrokerProperties")
    if content_type and "content_type" not in options:
        options["content_type"] = content_type
    return _build(body, options, _application_properties(headers))


def batch_messages(body: bytes) -> list[ServiceBusMessage]:
    """The messages of a JSON batch send (``application/vnd.microsoft.servicebus.json``)."""
    items = _parse_json(body, "the batch")
    if not isinstance(items, list) or not items:
        raise _bad("a batch must be a non-empty JSON array of messages")
    out = []
    for i, item in enumerate(items):
        where = f"message {i}"
        if not isinstance(item, dict):
            raise _bad(f"{where} of the batch must be a JSON object")
        text = item.get("Body", "")
        if not isinstance(text, str):
            raise _bad(f"{where}: Body must be a string")
        broker = item.get("BrokerProperties")
        options = _message_options({} if broker is None else broker, f"{where}.BrokerProperties")
        user = item.get("UserProperties")
        user = {} if user is None else user
        if not isinstance(user, dict):
            raise _bad(f"{where}: UserProperties must be a JSON object")
        for key, value in user.items():
            if value is not None and not isinstance(value, str | bool | int | float):
                raise _bad(f"{where}: UserProperties[{key!r}] must be a string, number or bool")
        out.append(_build(text.encode("utf-8"), options, dict(user) or None))
    return out


def http_date(at: datetime | None) -> str | None:
    return None if at is None else format_datetime(at.astimezone(timezone.utc), usegmt=True)


def _json_value(value: Any) -> Any:
    """``value`` as JSON can hold it: dates as RFC 1123, bytes as base64, the rest as text."""
    if isinstance(value, datetime):
        return http_date(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, str | int | float | bool | type(None) | list | dict):
        return value
    return str(value)


def _broker_properties(msg: ServiceBusReceivedMessage) -> dict[str, Any]:
    props: dict[str, Any] = {
        "DeliveryCount": msg.delivery_count + 1,
        "EnqueuedSequenceNumber": msg.enqueued_sequence_number,
        "EnqueuedTimeUtc": http_date(msg.enqueued_time_utc),
        "SequenceNumber": msg.sequence_number,
        "State": msg.state.name.capitalize(),
    }
    if msg.lock_token is not None:
        props["LockToken"] = msg.lock_token
        props["LockedUntilUtc"] = http_date(msg.locked_until_utc)
    for name, field in _STRING_FIELDS.items():
        value = getattr(msg, field)
        if value is not None and name != "ContentType":
            props[name] = value
    if msg.time_to_live is not None:
        props["TimeToLive"] = msg.time_to_live.total_seconds()
    if msg.scheduled_enqueue_time_utc is not None:
        props["ScheduledEnqueueTimeUtc"] = http_date(msg.scheduled_enqueue_time_utc)
    if msg.dead_letter_source is not None:
        props["DeadLetterSource"] = msg.dead_letter_source
    return props


def _content_type(value: str | None) -> str:
    """The message's content type if it can be a header value (printable ASCII), else the
    generic one: a Python sender may have set anything."""
    if value and value.isascii() and value.isprintable():
        return value
    return "application/octet-stream"


def received_headers(msg: ServiceBusReceivedMessage) -> dict[str, str]:
    """Response headers of a received message: ``BrokerProperties``, ``Content-Type`` and one
    header per application property (JSON-encoded, so ASCII without line breaks; names that
    are not HTTP tokens, or that are standard or hop-by-hop headers, are left out)."""
    headers = {
        "BrokerProperties": json.dumps(_broker_properties(msg), separators=(",", ":")),
        "Content-Type": _content_type(msg.content_type),
    }
    props = dict(msg.application_properties or {})  # a dead letter's reason among them
    for name, value in props.items():
        if not isinstance(name, str) or not _TOKEN.match(name):
            continue
        lowered = name.lower()
        if lowered in _RESERVED_RESPONSE or lowered.startswith(_NOT_PROPERTY_PREFIXES):
            continue
        headers[name] = json.dumps(_json_value(value))  # ASCII: header-safe
    return headers


def received_body(msg: ServiceBusReceivedMessage) -> bytes:
    body = msg.body
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body, default=_json_value).encode("utf-8")
