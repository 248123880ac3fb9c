"""The XML layer of the ATOM management API: safe parsing, value codecs, writing.

Service Bus's management REST API speaks ATOM entries whose ``content`` holds a WCF
data-contract document (``QueueDescription``, ``RuleDescription``, ...). This module knows the
wire forms and nothing about raybus's entities:

* ``parse_document`` parses a request body defensively. The body is untrusted (anyone who can
  reach the port can send one), so it is bounded in size, depth and element count, must be
  UTF-8, and may not carry a DTD: entity declarations are how "billion laughs" and external
  entity attacks work, and no Service Bus client sends one. Every failure is an
  ``InvalidArgumentError`` naming what was wrong (the gateway's 400), never an unhandled error.
* ``parse_*``/``format_*`` convert the scalar forms: ISO 8601 durations (``PT1M``; .NET's
  ``TimeSpan.MaxValue`` means "never"), ``xs:dateTime`` with up to 7 fractional digits,
  ``xs:boolean``.
* ``decode_key_values``/``encode_key_values``: the typed ``KeyValueOfstringanyType`` lists
  that carry SQL parameters and correlation-filter properties.
* ``el`` writes elements as text. Output is built by hand rather than with ElementTree so the
  prefixes are the ones Service Bus uses (``i:`` for XML Schema instance, ``d6p1:`` for type
  names inside key values) without registering prefixes process-wide.
"""

from __future__ import annotations

import base64
import re
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from .._models import duration_from_text
from ..exceptions import InvalidArgumentError
from ..management import MAX_DURATION

__all__ = [
    "ATOM_NS",
    "MAX_BODY_BYTES",
    "SB_NS",
    "XSI_NS",
    "child",
    "children",
    "decode_key_values",
    "el",
    "encode_key_values",
    "format_bool",
    "format_datetime",
    "format_duration",
    "local_name",
    "parse_bool",
    "parse_datetime",
    "parse_document",
    "parse_duration",
    "parse_int",
    "xsi_type",
]

ATOM_NS = "http://www.w3.org/2005/Atom"
SB_NS = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"
XS_NS = "http://www.w3.org/2001/XMLSchema"

# A rule with 32 parameters and a 1,024-character filter is a few KiB; nothing legitimate
# comes close to these bounds.
MAX_BODY_BYTES = 256 * 1024
MAX_DEPTH = 16
MAX_ELEMENTS = 4096

# "<!" starts a DTD, an entity or notation declaration, or a comment/CDATA section; only the
# last two are allowed.
_DECLARATION = re.compile(r"<!(?!--|\[CDATA\[)")


def _bad(message: str, argument: str = "body") -> InvalidArgumentError:
    return InvalidArgumentError(message, None, argument)


def parse_document(body: bytes) -> ET.Element:
    """Parse an untrusted request body into its root element (see the module docstring)."""
    if len(body) > MAX_BODY_BYTES:
        raise _bad(f"request body of {len(body)} bytes exceeds the {MAX_BODY_BYTES}-byte limit")
    if not body.strip():
        raise _bad("request body is empty; expected an ATOM entry")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(f"request body is not UTF-8 (byte {exc.start})") from None
    if _DECLARATION.search(text):
        raise _bad("DTDs and entity declarations are not accepted")
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise _bad(f"malformed XML: {exc}") from None
    except (LookupError, ValueError) as exc:  # e.g. an unknown encoding in the declaration
        raise _bad(f"malformed XML: {exc}") from None
    count = 0
    stack = [(root, 1)]
    while stack:
        element, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH or count > MAX_ELEMENTS:
            raise _bad(
                f"XML nested deeper than {MAX_DEPTH} levels or with more than "
                f"{MAX_ELEMENTS} elements"
            )
        stack.extend((c, depth + 1) for c in element)
    return root


def local_name(element: ET.Element) -> str:
    """The tag without its ``{namespace}``."""
    tag = element.tag
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def children(element: ET.Element) -> dict[str, ET.Element]:
    """The child elements by local name. Service Bus documents never repeat a field, so a
    repeated one is an error rather than a silent choice between two values."""
    found: dict[str, ET.Element] = {}
    for c in element:
        name = local_name(c)
        if name in found:
            raise _bad(f"element {name!r} appears twice in {local_name(element)!r}", name)
        found[name] = c
    return found


def child(element: ET.Element, name: str) -> ET.Element | None:
    return children(element).get(name)


def xsi_type(element: ET.Element) -> str | None:
    """The ``i:type`` attribute without its prefix (``d6p1:int`` -> ``int``)."""
    value = element.get(f"{{{XSI_NS}}}type")
    return None if value is None else value.rsplit(":", 1)[-1]


def _text(element: ET.Element) -> str:
    return (element.text or "").strip()


# ------------------------------------------------------------------ scalars


def parse_bool(element: ET.Element) -> bool:
    value = _text(element).lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise _bad(f"{local_name(element)} must be true or false, not {value!r}", local_name(element))


def format_bool(value: bool) -> str:
    return "true" if value else "false"


def parse_int(element: ET.Element) -> int:
    value = _text(element)
    if not re.fullmatch(r"[+-]?\d{1,19}", value):
        raise _bad(f"{local_name(element)} must be an integer, not {value!r}", local_name(element))
    return int(value)


def parse_duration(element: ET.Element) -> timedelta:
    return duration_from_text(_text(element), local_name(element))


# .NET's TimeSpan.MaxValue as Service Bus writes it.
_MAX_DURATION_TEXT = "P10675199DT2H48M5.4775807S"


def format_duration(value: timedelta) -> str:
    """ISO 8601 (``PT1M``, ``P14D``, ``PT0.1S``); ``MAX_DURATION`` as Service Bus writes it."""
    if value >= MAX_DURATION:
        return _MAX_DURATION_TEXT
    sign = "-" if value < timedelta(0) else ""
    value = abs(value)
    days, rest = value.days, value.seconds
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    out = f"{sign}P{days}D" if days else f"{sign}P"
    time_part = ""
    if hours:
        time_part += f"{hours}H"
    if minutes:
        time_part += f"{minutes}M"
    if seconds or value.microseconds:
        frac = f".{value.microseconds:06d}".rstrip("0") if value.microseconds else ""
        time_part += f"{seconds}{frac}S"
    if time_part:
        out += "T" + time_part
    return out if out not in ("P", "-P") else "PT0S"


_DATETIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})?"
)


def datetime_from_text(value: str, what: str) -> datetime:
    """An ``xs:dateTime``; no offset means UTC (as Service Bus reads it)."""
    match = _DATETIME.fullmatch(value.strip())
    if not match:
        raise _bad(f"{what} must be an ISO 8601 date-time, not {value!r}", what)
    year, month, day, hour, minute, second, frac, zone = match.groups()
    tz = timezone.utc
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        tz = timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    try:
        parsed = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int((frac or "0")[:6].ljust(6, "0")),
            tzinfo=tz,
        )
    except ValueError as exc:
        raise _bad(f"{what}: {value!r} is not a valid date-time ({exc})", what) from None
    return parsed.astimezone(timezone.utc)


def parse_datetime(element: ET.Element) -> datetime:
    return datetime_from_text(_text(element), local_name(element))


def format_datetime(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ------------------------------------------------------------------ key values


def _decode_value(element: ET.Element, key: str) -> Any:
    if element.get(f"{{{XSI_NS}}}nil", "").lower() == "true":
        return None
    kind = xsi_type(element) or "string"
    text = element.text or ""
    what = f"value of {key!r}"
    try:
        if kind in ("int", "long", "short", "byte", "unsignedInt", "unsignedShort"):
            return int(text.strip())
        if kind in ("double", "float", "decimal"):
            return float(text.strip())
        if kind == "boolean":
            return parse_bool(element)
        if kind == "dateTime":
            return datetime_from_text(text, what)
        if kind == "duration":
            return duration_from_text(text, what)
        if kind == "guid":
            return uuid.UUID(text.strip())
        if kind == "base64Binary":
            return base64.b64decode(text.strip(), validate=True)
    except InvalidArgumentError:
        raise
    except ValueError:
        raise _bad(f"{what}: {text!r} is not a valid {kind}", key) from None
    if kind == "string":
        return text
    raise _bad(f"{what} has unsupported type {kind!r}", key)


def decode_key_values(parent: ET.Element | None) -> dict[str, Any] | None:
    """``<KeyValueOfstringanyType><Key/><Value i:type="d6p1:int"/>...`` as a dict (None when
    there are none)."""
    if parent is None or len(parent) == 0:
        return None
    result: dict[str, Any] = {}
    for item in parent:
        fields = children(item)
        key_el, value_el = fields.get("Key"), fields.get("Value")
        if key_el is None or value_el is None:
            raise _bad(f"each entry of {local_name(parent)} needs a Key and a Value")
        key = key_el.text or ""
        if key in result:
            raise _bad(f"key {key!r} appears twice in {local_name(parent)}", key)
        result[key] = _decode_value(value_el, key)
    return result


def _value_type(value: Any) -> tuple[str, str]:
    # bool before int: bool is an int subclass.
    if isinstance(value, bool):
        return "boolean", format_bool(value)
    if isinstance(value, int):
        return ("int" if -(2**31) <= value < 2**31 else "long"), str(value)
    if isinstance(value, float):
        text = "INF" if value == float("inf") else "-INF" if value == float("-inf") else repr(value)
        return "double", "NaN" if value != value else text
    if isinstance(value, datetime):
        return "dateTime", format_datetime(value)
    if isinstance(value, timedelta):
        return "duration", format_duration(value)
    if isinstance(value, uuid.UUID):
        return "guid", str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "base64Binary", base64.b64encode(bytes(value)).decode("ascii")
    return "string", str(value)


def encode_key_values(tag: str, values: dict[str, Any] | None) -> str:
    """The inverse of ``decode_key_values``; an empty element when there are no values."""
    items = []
    for key, value in (values or {}).items():
        if value is None:
            # The SDK reads the type attribute of every value, so a null keeps one.
            value_el = el("Value", attrs={"i:type": "d6p1:string", "i:nil": "true"})
        else:
            kind, text = _value_type(value)
            value_el = el("Value", text=text, attrs={"i:type": f"d6p1:{kind}"})
        value_el = value_el.replace("<Value ", f'<Value xmlns:d6p1="{XS_NS}" ', 1)
        items.append(el("KeyValueOfstringanyType", el("Key", text=key), value_el))
    return el(tag, *items)


# ------------------------------------------------------------------ writing

# XML 1.0 cannot carry these characters at all, even escaped.
_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _escape(text: str, quote: bool = False) -> str:
    text = _ILLEGAL.sub("\ufffd", text)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace('"', "&quot;") if quote else text


def el(
    tag: str, *content: str, text: str | None = None, attrs: dict[str, str] | None = None
) -> str:
    """``<tag attrs>text content...</tag>``; ``content`` is already-written XML."""
    attributes = "".join(f' {k}="{_escape(v, True)}"' for k, v in (attrs or {}).items())
    inner = (_escape(text) if text is not None else "") + "".join(content)
    if not inner:
        return f"<{tag}{attributes}/>"
    return f"<{tag}{attributes}>{inner}</{tag}>"


def elements(pairs: Iterable[tuple[str, str | None]]) -> str:
    """Simple text elements, skipping those whose value is None."""
    return "".join(el(name, text=value) for name, value in pairs if value is not None)
