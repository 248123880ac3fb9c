"""The gateway's AMQP 1.0 codec: every type round-trips with its AMQP type intact (hypothesis),
the encodings match the spec's bytes, and bad input raises DecodeError/EncodeError."""

from __future__ import annotations

import math
import struct
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raybus.amqp._codec import (
    Array,
    Byte,
    Char,
    Decimal,
    DecodeError,
    Described,
    EncodeError,
    Float32,
    Int,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
    decode,
    decode_all,
    encode,
)

_text = st.text(max_size=300)
_symbol = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=40).map(
    Symbol
)
_f32 = st.floats(width=32, allow_nan=False).map(Float32)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(0, 255).map(UByte),
    st.integers(0, 65535).map(UShort),
    st.integers(0, 2**32 - 1).map(UInt),
    st.integers(0, 2**64 - 1).map(ULong),
    st.integers(-128, 127).map(Byte),
    st.integers(-32768, 32767).map(Short),
    st.integers(-(2**31), 2**31 - 1).map(Int),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1).map(Timestamp),
    _f32,
    st.floats(allow_nan=False),
    st.characters().map(Char),
    st.binary(max_size=300),
    _text,
    _symbol,
    st.uuids(),
    st.binary(min_size=4, max_size=4).map(lambda b: Decimal(0x74, b)),
    st.binary(min_size=16, max_size=16).map(lambda b: Decimal(0x94, b)),
)
hashable = st.one_of(scalars.filter(lambda v: not isinstance(v, float) or not math.isnan(v)))


def _arrays() -> st.SearchStrategy[Array]:
    kinds: list[tuple[int, st.SearchStrategy[Any]]] = [
        (0xA3, _symbol),
        (0xB1, _text),
        (0xA0, st.binary(max_size=200)),
        (0x98, st.uuids()),
        (0x81, st.integers(-(2**63), 2**63 - 1)),
        (0x70, st.integers(0, 2**32 - 1).map(UInt)),
        (0x83, st.integers(0, 2**40).map(Timestamp)),
        (0x56, st.booleans()),
    ]
    return st.sampled_from(kinds).flatmap(
        lambda k: st.lists(k[1], max_size=20).map(lambda items: Array(k[0], tuple(items)))
    )


values = st.recursive(
    st.one_of(scalars, _arrays()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(hashable, inner, max_size=6),
        st.builds(Described, st.one_of(_symbol, st.integers(0, 2**64 - 1).map(ULong)), inner),
    ),
    max_leaves=30,
)


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same Python (so AMQP) type, recursively."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, Described):
        return _same(a.descriptor, b.descriptor) and _same(a.value, b.value)
    if isinstance(a, Array):
        return (
            a.code == b.code
            and len(a.items) == len(b.items)
            and all(_same(x, y) for x, y in zip(a.items, b.items, strict=True))
        )
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(values)
def test_every_value_round_trips_with_its_type(value: Any) -> None:
    encoded = encode(value)
    decoded = decode(encoded)
    assert _same(decoded, value)
    assert encode(decoded) == encoded


@settings(max_examples=200, deadline=None)
@given(values)
def test_every_truncation_raises_decode_error(value: Any) -> None:
    encoded = encode(value)
    for cut in range(len(encoded)):
        with pytest.raises(DecodeError):
            decode(encoded[:cut])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_decode_or_raise_decode_error_only(data: bytes) -> None:
    try:
        decode_all(data)
    except DecodeError:
        pass


def test_binary_map_keys_are_hashable_bytes() -> None:
    value = decode(encode({b"key": 1, b"\x00": [b"v"]}))
    assert value == {b"key": 1, b"\x00": [b"v"]}
    assert all(type(k) is bytes for k in value)


def test_encodings_match_the_spec() -> None:
    assert encode(None) == b"\x40"
    assert encode(True) == b"\x41" and encode(False) == b"\x42"
    assert encode(UInt(0)) == b"\x43" and encode(UInt(7)) == b"\x52\x07"
    assert encode(UInt(300)) == b"\x70" + struct.pack(">I", 300)
    assert encode(ULong(0)) == b"\x44" and encode(ULong(9)) == b"\x53\x09"
    assert encode(5) == b"\x55\x05" and encode(-200) == b"\x81" + struct.pack(">q", -200)
    assert encode(2**64 - 1) == b"\x80" + b"\xff" * 8  # beyond long: ulong
    assert encode(Int(-1)) == b"\x54\xff"
    assert encode("é") == b"\xa1\x02\xc3\xa9"
    assert encode(Symbol("ab")) == b"\xa3\x02ab"
    assert encode(b"x" * 256)[:5] == b"\xb0\x00\x00\x01\x00"
    assert encode([]) == b"\x45"
    assert encode([True]) == b"\xc0\x02\x01\x41"
    assert encode({Symbol("k"): None}) == b"\xc1\x05\x02\xa3\x01k\x40"
    assert encode(Described(ULong(0x77), "v")) == b"\x00\x53\x77\xa1\x01v"
    assert encode(Array(0xA3, (Symbol("A"), Symbol("BC")))) == b"\xe0\x07\x02\xa3\x01A\x02BC"
    u = uuid.UUID(int=1)
    assert encode(u) == b"\x98" + u.bytes
    when = datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
    assert decode(encode(when)) == Timestamp(round(when.timestamp() * 1000))
    assert Timestamp(round(when.timestamp() * 1000)).to_datetime() == when


def test_large_compounds_use_the_32_bit_forms() -> None:
    items = list(range(300))
    assert encode(items)[0] == 0xD0
    assert decode(encode(items)) == items
    big = {str(i): i for i in range(200)}
    assert encode(big)[0] == 0xD1 and decode(encode(big)) == big
    arr = Array(0xB1, tuple("x" * 10 for _ in range(100)))
    assert encode(arr)[0] == 0xF0 and _same(decode(encode(arr)), arr)


def test_described_arrays_round_trip() -> None:
    arr = Array(0x81, (Described(Symbol("d"), 1), Described(Symbol("d"), 2)), Symbol("d"))
    assert _same(decode(encode(arr)), arr)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "truncated constructor"),
        (b"\xff", "unknown constructor 0xff"),
        (b"\xa1\x05ab", "truncated"),
        (b"\xa1\x02\xff\xfe", "not valid UTF-8"),
        (b"\xa3\x01\xe9", "not valid UTF-8/ASCII"),
        (b"\xc0\x03\x05\x41\x41", "cannot fit"),
        (b"\xc1\x02\x01\x41", "odd number"),
        (b"\xc0\x04\x01\x41\x41\x41", "does not match"),
        (b"\xc1\x05\x02\xc0\x01\x00\x40", "not hashable"),
        (b"\xe0\x02\x02\x41", "not allowed"),
        (b"\x73\x00\x11\x00\x00", "out of range"),
        (b"\x41\x41", "trailing"),
    ],
)
def test_malformed_input_raises_decode_error_naming_the_problem(data: bytes, problem: str) -> None:
    with pytest.raises(DecodeError, match=problem):
        decode(data)


def test_nesting_beyond_the_limit_is_refused() -> None:
    deep: Any = None
    for _ in range(100):
        deep = [deep]
    with pytest.raises(DecodeError, match="nested deeper"):
        decode(encode(deep))


@pytest.mark.parametrize(
    "value",
    [
        object(),
        UByte(256),
        UInt(-1),
        Int(2**31),
        Short(40000),
        2**64,
        Symbol("é"),
        Char("ab"),
        Decimal(0x74, b"12"),
        Array(0xA0, (b"x" * 300,)),
    ],
)
def test_unencodable_values_raise_encode_error(value: Any) -> None:
    with pytest.raises(EncodeError):
        encode(value)
