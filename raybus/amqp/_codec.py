"""The AMQP 1.0 type system (spec part 1): encode and decode every primitive, described and
compound type.

Why our own codec: python-qpid-proton's decoder returns unhashable ``memoryview`` objects for
binary map keys (a map body ``{b"k": 1}`` killed its reactor) and its Python API hides a
transfer's message format; the gateway also must re-emit a sender's bytes unchanged, which is
easiest when the codec is small, strict and ours.

Values decode to Python values that remember their AMQP type, so that encoding a decoded value
gives back the same bytes (up to the choice between a short and a long constructor, which is
canonical here: the shortest that fits):

=====================  ==========================================================
AMQP                   Python
=====================  ==========================================================
null, boolean          ``None``, ``bool``
ubyte ushort uint      ``UByte``, ``UShort``, ``UInt``, ``ULong`` (``int`` subclasses)
ulong
byte short int         ``Byte``, ``Short``, ``Int`` (``int`` subclasses)
long                   ``int`` (a plain ``int`` above the long range encodes as ulong)
float, double          ``Float32`` (a ``float`` subclass), ``float``
char                   ``Char`` (a one-character ``str`` subclass)
timestamp              ``Timestamp`` (``int`` milliseconds since the epoch); ``datetime``
                       encodes as a timestamp too
decimal32/64/128       ``Decimal`` (its code and raw bytes: raybus does no decimal maths)
uuid                   ``uuid.UUID``
binary, string, symbol ``bytes``, ``str``, ``Symbol`` (a ``str`` subclass)
list, map              ``list``, ``dict`` (a map with an unhashable key is a DecodeError)
array                  ``Array`` (element constructor code, optional descriptor, items)
described              ``Described`` (descriptor, value)
=====================  ==========================================================

Every malformed or truncated input raises ``DecodeError`` naming the offset and the problem; a
value that has no AMQP encoding raises ``EncodeError``. Neither leaves anything half done.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

__all__ = [
    "Array",
    "Byte",
    "Char",
    "Decimal",
    "DecodeError",
    "Described",
    "EncodeError",
    "Float32",
    "Int",
    "Short",
    "Symbol",
    "Timestamp",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
    "decode",
    "decode_all",
    "decode_value",
    "encode",
]


class DecodeError(ValueError):
    """Bytes that are not a valid AMQP encoding (truncated, unknown constructor, bad sizes).
    The connection that sent them is closed with ``amqp:decode-error``."""

    def __init__(self, message: str, offset: int = -1) -> None:
        super().__init__(message, offset)
        self.message = message
        self.offset = offset

    def __str__(self) -> str:
        return f"{self.message} (at byte {self.offset})" if self.offset >= 0 else self.message


class EncodeError(TypeError):
    """A Python value with no AMQP encoding (or out of its type's range)."""


class Symbol(str):
    """An AMQP symbol (ASCII)."""

    __slots__ = ()


class Char(str):
    """An AMQP char (one Unicode code point)."""

    __slots__ = ()


class UByte(int):
    __slots__ = ()


class UShort(int):
    __slots__ = ()


class UInt(int):
    __slots__ = ()


class ULong(int):
    __slots__ = ()


class Byte(int):
    __slots__ = ()


class Short(int):
    __slots__ = ()


class Int(int):
    __slots__ = ()


class Timestamp(int):
    """Milliseconds since the Unix epoch."""

    __slots__ = ()

    def to_datetime(self) -> datetime:
        return datetime.fromtimestamp(int(self) / 1000, tz=timezone.utc)


class Float32(float):
    __slots__ = ()


@dataclass(frozen=True)
class Decimal:
    """An IEEE 754 decimal, kept as its raw bytes (code 0x74, 0x84 or 0x94)."""

    code: int
    raw: bytes


@dataclass(frozen=True)
class Described:
    """A described value: ``descriptor`` (usually a ``ULong`` code or a ``Symbol``) and value."""

    descriptor: Any
    value: Any


@dataclass(frozen=True)
class Array:
    """An AMQP array: ``items`` all encoded with one constructor ``code`` (and, for an array
    of described values, one ``descriptor``)."""

    code: int
    items: tuple[Any, ...]
    descriptor: Any = None


# ------------------------------------------------------------------------------------ decoding

_FIXED = {  # code -> (struct format or None, size)
    0x50: ("B", 1),
    0x51: ("b", 1),
    0x52: ("B", 1),
    0x53: ("B", 1),
    0x54: ("b", 1),
    0x55: ("b", 1),
    0x56: ("B", 1),
    0x60: (">H", 2),
    0x61: (">h", 2),
    0x70: (">I", 4),
    0x71: (">i", 4),
    0x72: (">f", 4),
    0x73: (">I", 4),
    0x80: (">Q", 8),
    0x81: (">q", 8),
    0x82: (">d", 8),
    0x83: (">q", 8),
}
_FIXED_TYPE: dict[int, Callable[[Any], Any]] = {
    0x50: UByte,
    0x51: Byte,
    0x52: UInt,
    0x53: ULong,
    0x54: Int,
    0x55: int,
    0x56: bool,
    0x60: UShort,
    0x61: Short,
    0x70: UInt,
    0x71: Int,
    0x72: Float32,
    0x73: lambda cp: Char(chr(cp)),
    0x80: ULong,
    0x81: int,
    0x82: float,
    0x83: Timestamp,
}
_EMPTY: dict[int, Any] = {
    0x40: None,
    0x41: True,
    0x42: False,
    0x43: UInt(0),
    0x44: ULong(0),
    0x45: [],
}
_DECIMAL_SIZE = {0x74: 4, 0x84: 8, 0x94: 16}
_VARIABLE = {0xA0: 1, 0xA1: 1, 0xA3: 1, 0xB0: 4, 0xB1: 4, 0xB3: 4}
_COMPOUND = {0xC0: 1, 0xC1: 1, 0xD0: 4, 0xD1: 4}
_ARRAY = {0xE0: 1, 0xF0: 4}
_MAX_DEPTH = 64  # nesting deeper than this is an attack, not a message


def _need(buf: bytes | memoryview, pos: int, n: int, what: str) -> None:
    if n < 0 or pos + n > len(buf):
        raise DecodeError(f"truncated {what}: needs {n} bytes, {len(buf) - pos} left", pos)


def _size(buf: bytes | memoryview, pos: int, width: int, what: str) -> tuple[int, int]:
    _need(buf, pos, width, what)
    n = buf[pos] if width == 1 else struct.unpack_from(">I", buf, pos)[0]
    return n, pos + width


def _payload(buf: bytes | memoryview, code: int, pos: int, depth: int) -> tuple[Any, int]:
    """Decode the value that follows constructor ``code`` at ``pos``."""
    if code in _EMPTY:
        empty = _EMPTY[code]
        return ([] if code == 0x45 else empty), pos
    fixed = _FIXED.get(code)
    if fixed is not None:
        fmt, n = fixed
        _need(buf, pos, n, f"value of type 0x{code:02x}")
        (raw,) = struct.unpack_from(fmt, buf, pos)
        if code == 0x73 and raw > 0x10FFFF:
            raise DecodeError(f"char code point {raw} is out of range", pos)
        return _FIXED_TYPE[code](raw), pos + n
    if code == 0x98:
        _need(buf, pos, 16, "uuid")
        return uuid.UUID(bytes=bytes(buf[pos : pos + 16])), pos + 16
    if code in _DECIMAL_SIZE:
        n = _DECIMAL_SIZE[code]
        _need(buf, pos, n, "decimal")
        return Decimal(code, bytes(buf[pos : pos + n])), pos + n
    width = _VARIABLE.get(code)
    if width is not None:
        n, pos = _size(buf, pos, width, "size")
        _need(buf, pos, n, "binary/string/symbol")
        raw = bytes(buf[pos : pos + n])
        pos += n
        if code in (0xA0, 0xB0):
            return raw, pos
        try:
            return (
                raw.decode("utf-8") if code in (0xA1, 0xB1) else Symbol(raw.decode("ascii"))
            ), pos
        except UnicodeDecodeError:
            raise DecodeError("string or symbol is not valid UTF-8/ASCII", pos - n) from None
    width = _COMPOUND.get(code)
    if width is not None:
        return _compound(buf, code, pos, width, depth)
    width = _ARRAY.get(code)
    if width is not None:
        return _array(buf, pos, width, depth)
    raise DecodeError(f"unknown constructor 0x{code:02x}", pos - 1)


def _compound(
    buf: bytes | memoryview, code: int, pos: int, width: int, depth: int
) -> tuple[Any, int]:
    size, pos = _size(buf, pos, width, "list/map size")
    _need(buf, pos, size, "list/map")
    end = pos + size
    count, pos = _size(buf, pos, width, "list/map count")
    if count > size:  # every item takes at least one byte
        raise DecodeError(f"count {count} cannot fit in {size} bytes", pos)
    items = []
    for _ in range(count):
        item, pos = decode_value(buf, pos, end, depth + 1)
        items.append(item)
    if pos != end:
        raise DecodeError(f"list/map size {size} does not match its items", pos)
    if code in (0xC0, 0xD0):
        return items, pos
    if count % 2:
        raise DecodeError(f"map with an odd number of items ({count})", pos)
    out: dict[Any, Any] = {}
    for k, v in zip(items[::2], items[1::2], strict=True):
        try:
            out[k] = v
        except TypeError:
            raise DecodeError(f"map key of type {type(k).__name__} is not hashable", pos) from None
    return out, pos


def _array(buf: bytes | memoryview, pos: int, width: int, depth: int) -> tuple[Any, int]:
    size, pos = _size(buf, pos, width, "array size")
    _need(buf, pos, size, "array")
    end = pos + size
    count, pos = _size(buf, pos, width, "array count")
    _need(buf, pos, 1, "array constructor")
    code, pos = buf[pos], pos + 1
    descriptor = None
    if code == 0x00:
        descriptor, pos = decode_value(buf, pos, end, depth + 1)
        _need(buf, pos, 1, "array constructor")
        code, pos = buf[pos], pos + 1
    if count and (code == 0x00 or code in _EMPTY):
        # Zero-width element types (true, uint0, ...) are legal only via their fixed forms;
        # refusing them also bounds the loop below by the array's size.
        raise DecodeError(f"array element constructor 0x{code:02x} is not allowed", pos - 1)
    if count > size:
        raise DecodeError(f"array count {count} cannot fit in {size} bytes", pos)
    items = []
    sub = buf[:end]
    for _ in range(count):
        item, pos = _payload(sub, code, pos, depth + 1)
        items.append(item if descriptor is None else Described(descriptor, item))
    if pos != end:
        raise DecodeError(f"array size {size} does not match its items", pos)
    return Array(code, tuple(items), descriptor), pos


def decode_value(
    buf: bytes | memoryview, pos: int = 0, end: int | None = None, depth: int = 0
) -> tuple[Any, int]:
    """Decode one value at ``pos``; returns (value, position after it). Raises ``DecodeError``."""
    if depth > _MAX_DEPTH:
        raise DecodeError(f"values nested deeper than {_MAX_DEPTH}", pos)
    if end is not None and end < len(buf):
        buf = buf[:end]
    _need(buf, pos, 1, "constructor")
    code = buf[pos]
    pos += 1
    if code == 0x00:
        descriptor, pos = decode_value(buf, pos, None, depth + 1)
        value, pos = decode_value(buf, pos, None, depth + 1)
        return Described(descriptor, value), pos
    return _payload(buf, code, pos, depth)


def decode(buf: bytes | memoryview) -> Any:
    """Decode exactly one value that fills ``buf``."""
    value, pos = decode_value(buf)
    if pos != len(buf):
        raise DecodeError(f"{len(buf) - pos} trailing bytes after the value", pos)
    return value


def decode_all(buf: bytes | memoryview) -> list[tuple[Any, int, int]]:
    """Decode a sequence of values: [(value, start, end), ...] (message sections)."""
    out = []
    pos = 0
    while pos < len(buf):
        start = pos
        value, pos = decode_value(buf, pos)
        out.append((value, start, pos))
    return out


# ------------------------------------------------------------------------------------ encoding


def _var(small: int, large: int, raw: bytes) -> bytes:
    n = len(raw)
    if n < 256:
        return bytes((small, n)) + raw
    return bytes((large,)) + struct.pack(">I", n) + raw


def _sized(count: int, body: bytes, wide: bool | None) -> tuple[bool, bytes]:
    """Size, count and body of a list, map or array (without its constructor); ``wide`` None
    picks the 8-bit form when it fits. Returns (wide, bytes)."""
    if wide is None:
        wide = len(body) + 1 >= 256 or count >= 256
    if wide:
        return True, struct.pack(">II", len(body) + 4, count) + body
    if len(body) + 1 >= 256 or count >= 256:
        raise EncodeError("compound array element too large for its 8-bit constructor")
    return False, bytes((len(body) + 1, count)) + body


def _compound_body(value: Any) -> tuple[int, bytes]:
    if isinstance(value, dict):
        return 2 * len(value), b"".join(encode(k) + encode(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return len(value), b"".join(encode(v) for v in value)
    raise EncodeError(f"{type(value).__name__} is not a list or map")


def _int_range(value: int, lo: int, hi: int, name: str) -> None:
    if not lo <= value <= hi:
        raise EncodeError(f"{value} is out of range for AMQP {name}")


def _encode_int(value: int) -> bytes:
    t = type(value)
    v = int(value)
    if t is UInt:
        _int_range(v, 0, 2**32 - 1, "uint")
        if v == 0:
            return b"\x43"
        return bytes((0x52, v)) if v < 256 else b"\x70" + struct.pack(">I", v)
    if t is ULong:
        _int_range(v, 0, 2**64 - 1, "ulong")
        if v == 0:
            return b"\x44"
        return bytes((0x53, v)) if v < 256 else b"\x80" + struct.pack(">Q", v)
    if t is Int:
        _int_range(v, -(2**31), 2**31 - 1, "int")
        return b"\x54" + struct.pack("b", v) if -128 <= v < 128 else b"\x71" + struct.pack(">i", v)
    if t is UByte:
        _int_range(v, 0, 255, "ubyte")
        return bytes((0x50, v))
    if t is Byte:
        _int_range(v, -128, 127, "byte")
        return b"\x51" + struct.pack("b", v)
    if t is UShort:
        _int_range(v, 0, 65535, "ushort")
        return b"\x60" + struct.pack(">H", v)
    if t is Short:
        _int_range(v, -32768, 32767, "short")
        return b"\x61" + struct.pack(">h", v)
    if t is Timestamp:
        _int_range(v, -(2**63), 2**63 - 1, "timestamp")
        return b"\x83" + struct.pack(">q", v)
    if -128 <= v < 128:
        return b"\x55" + struct.pack("b", v)
    if -(2**63) <= v < 2**63:
        return b"\x81" + struct.pack(">q", v)
    _int_range(v, 0, 2**64 - 1, "long/ulong")
    return b"\x80" + struct.pack(">Q", v)


_ELEMENT_PACK = {  # fixed-width array element encodings: code -> struct format
    0x50: "B",
    0x51: "b",
    0x52: "B",
    0x53: "B",
    0x54: "b",
    0x55: "b",
    0x56: "B",
    0x60: ">H",
    0x61: ">h",
    0x70: ">I",
    0x71: ">i",
    0x72: ">f",
    0x80: ">Q",
    0x81: ">q",
    0x82: ">d",
    0x83: ">q",
}
_TEXT_CODES = {0xA0: "", 0xB0: "", 0xA1: "utf-8", 0xB1: "utf-8", 0xA3: "ascii", 0xB3: "ascii"}


def _element(code: int, value: Any) -> bytes:
    """One array element's payload (no constructor), for element constructor ``code``."""
    if isinstance(value, Described):
        value = value.value
    try:
        fmt = _ELEMENT_PACK.get(code)
        if fmt is not None:
            v = _millis(value) if code == 0x83 and isinstance(value, datetime) else value
            return struct.pack(fmt, v)
        if code == 0x73:
            return struct.pack(">I", ord(value))
        if code == 0x98:
            return bytes(value.bytes)
        if code in _DECIMAL_SIZE:
            if len(value.raw) != _DECIMAL_SIZE[code]:
                raise EncodeError("decimal element of the wrong size")
            return bytes(value.raw)
        if code in _TEXT_CODES:
            enc = _TEXT_CODES[code]
            raw = str(value).encode(enc) if enc else bytes(value)
            if code < 0xB0:
                if len(raw) > 255:
                    raise EncodeError("array element too long for an 8-bit size")
                return bytes((len(raw),)) + raw
            return struct.pack(">I", len(raw)) + raw
        if code in (0xC0, 0xC1, 0xD0, 0xD1):
            count, body = _compound_body(value)
            return _sized(count, body, code >= 0xD0)[1]
        if code in (0xE0, 0xF0):
            if not isinstance(value, Array):
                raise EncodeError("array element of an array must be an Array")
            count, body = _array_body(value)
            return _sized(count, body, code == 0xF0)[1]
    except (struct.error, TypeError, AttributeError, UnicodeEncodeError) as exc:
        raise EncodeError(f"cannot encode {value!r} as array element 0x{code:02x}: {exc}") from None
    raise EncodeError(f"array element constructor 0x{code:02x} is not supported")


def _array_body(value: Array) -> tuple[int, bytes]:
    ctor = bytes((value.code,))
    if value.descriptor is not None:
        ctor = b"\x00" + encode(value.descriptor) + ctor
    return len(value.items), ctor + b"".join(_element(value.code, v) for v in value.items)


def _millis(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return round(value.timestamp() * 1000)


def encode(value: Any) -> bytes:
    """The AMQP encoding of ``value`` (see the module docstring for the type mapping)."""
    if value is None:
        return b"\x40"
    if value is True:
        return b"\x41"
    if value is False:
        return b"\x42"
    if isinstance(value, int):
        return _encode_int(value)
    if isinstance(value, Symbol):
        try:
            return _var(0xA3, 0xB3, value.encode("ascii"))
        except UnicodeEncodeError:
            raise EncodeError(f"symbol {value!r} is not ASCII") from None
    if isinstance(value, Char):
        if len(value) != 1:
            raise EncodeError(f"char must be one character, not {value!r}")
        return b"\x73" + struct.pack(">I", ord(value))
    if isinstance(value, str):
        try:
            return _var(0xA1, 0xB1, value.encode("utf-8"))
        except UnicodeEncodeError:
            raise EncodeError("string is not encodable as UTF-8") from None
    if isinstance(value, bytes | bytearray | memoryview):
        return _var(0xA0, 0xB0, bytes(value))
    if isinstance(value, Float32):
        return b"\x72" + struct.pack(">f", value)
    if isinstance(value, float):
        return b"\x82" + struct.pack(">d", value)
    if isinstance(value, Described):
        return b"\x00" + encode(value.descriptor) + encode(value.value)
    if isinstance(value, list | tuple):
        if not value:
            return b"\x45"
        wide, raw = _sized(*_compound_body(value), None)
        return (b"\xd0" if wide else b"\xc0") + raw
    if isinstance(value, dict):
        wide, raw = _sized(*_compound_body(value), None)
        return (b"\xd1" if wide else b"\xc1") + raw
    if isinstance(value, uuid.UUID):
        return b"\x98" + value.bytes
    if isinstance(value, datetime):
        return b"\x83" + struct.pack(">q", _millis(value))
    if isinstance(value, Array):
        wide, raw = _sized(*_array_body(value), None)
        return (b"\xf0" if wide else b"\xe0") + raw
    if isinstance(value, Decimal):
        if _DECIMAL_SIZE.get(value.code) != len(value.raw):
            raise EncodeError(f"decimal code 0x{value.code:02x} needs matching raw bytes")
        return bytes((value.code,)) + value.raw
    raise EncodeError(f"{type(value).__name__} has no AMQP encoding")
