"""The ATOM API's XML layer: safe parsing of untrusted bodies and the scalar/key-value codecs.

No Ray. What the Azure SDK itself reads back is checked in ``test_atom_models`` and the
integration suite; here each codec is checked against the wire forms Service Bus uses.
"""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest

from raybus._models import MAX_DURATION
from raybus.exceptions import InvalidArgumentError
from raybus.http._atom_xml import (
    MAX_BODY_BYTES,
    decode_key_values,
    el,
    encode_key_values,
    format_datetime,
    format_duration,
    parse_bool,
    parse_datetime,
    parse_document,
    parse_duration,
    parse_int,
)


def _element(tag: str, text: str) -> ET.Element:
    element = ET.Element(tag)
    element.text = text
    return element


# ------------------------------------------------------------------ hostile and malformed


BILLION_LAUGHS = (
    b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    b'<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">'
    b'<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>'
    b"<entry>&lol3;</entry>"
)
EXTERNAL_ENTITY = (
    b'<?xml version="1.0"?><!DOCTYPE e [<!ENTITY x SYSTEM "file:///etc/passwd">]><entry>&x;</entry>'
)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (BILLION_LAUGHS, "DTD"),
        (EXTERNAL_ENTITY, "DTD"),
        (b'<!DOCTYPE entry SYSTEM "http://example.invalid/x.dtd"><entry/>', "DTD"),
        (b"", "empty"),
        (b"   ", "empty"),
        (b"<entry><content></entry>", "malformed XML"),
        (b"<entry>&undefined;</entry>", "malformed XML"),
        (b"not xml at all", "malformed XML"),
        (b"<a/><b/>", "malformed XML"),
        (b'<?xml version="1.0" encoding="Atf-8"?><entry/>', "malformed XML"),
        (b'<?xml version="1.0" encoding="utf-16"?><entry/>', "malformed XML"),
        ("<entry>\u00e9</entry>".encode("latin-1"), "not UTF-8"),
        (b"<a>" * 40 + b"</a>" * 40, "deeper"),
        (b"<a>" + b"<b/>" * 5000 + b"</a>", "elements"),
        (b"<a>" + b"x" * MAX_BODY_BYTES + b"</a>", "exceeds"),
    ],
)
def test_hostile_or_malformed_bodies_raise_invalid_argument_naming_the_problem(
    body: bytes, reason: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_document(body)
    assert reason in info.value.message
    assert info.value.argument == "body"


def test_comments_and_cdata_are_allowed() -> None:
    root = parse_document(b"<?xml version='1.0'?><!-- hi --><a><![CDATA[<x>]]></a>")
    assert root.text == "<x>"


# ------------------------------------------------------------------ scalars


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT1M", timedelta(minutes=1)),
        ("PT30S", timedelta(seconds=30)),
        ("PT0.1S", timedelta(milliseconds=100)),
        ("P1DT2H3M4.5S", timedelta(days=1, hours=2, minutes=3, seconds=4.5)),
        ("P2W", timedelta(days=14)),
        ("P14D", timedelta(days=14)),
        ("PT300S", timedelta(minutes=5)),
        ("PT0S", timedelta(0)),
        ("P10675199DT2H48M5.4775807S", MAX_DURATION),
        ("P99999999D", MAX_DURATION),
        (" PT1H ", timedelta(hours=1)),
    ],
)
def test_durations_parse_from_iso_8601(text: str, expected: timedelta) -> None:
    assert parse_duration(_element("LockDuration", text)) == expected


@pytest.mark.parametrize(
    "text", ["P1Y", "P1M", "PT", "P", "1M", "PTXS", "", "P1DT", "-", "PT1.S", "-P9999999999999D"]
)
def test_bad_durations_name_the_element(text: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_duration(_element("LockDuration", text))
    assert info.value.argument == "LockDuration"


@pytest.mark.parametrize(
    "value",
    [
        timedelta(0),
        timedelta(milliseconds=100),
        timedelta(seconds=30),
        timedelta(minutes=10),
        timedelta(hours=1, seconds=1, microseconds=5),
        timedelta(days=7),
        timedelta(days=3, hours=4),
        MAX_DURATION,
    ],
)
def test_durations_round_trip(value: timedelta) -> None:
    assert parse_duration(_element("D", format_duration(value))) == value


def test_durations_are_written_as_service_bus_writes_them() -> None:
    assert format_duration(timedelta(minutes=1)) == "PT1M"
    assert format_duration(timedelta(days=14)) == "P14D"
    assert format_duration(timedelta(0)) == "PT0S"
    assert format_duration(MAX_DURATION) == "P10675199DT2H48M5.4775807S"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30T11:12:47Z", datetime(2026, 11, 30, 11, 12, 47, tzinfo=timezone.utc)),
        (
            "2026-11-30T11:12:47.1234567Z",
            datetime(2026, 11, 30, 11, 12, 47, 123456, tzinfo=timezone.utc),
        ),
        ("2026-11-30T12:12:47+01:00", datetime(2026, 11, 30, 11, 12, 47, tzinfo=timezone.utc)),
        ("2026-11-30T11:12:47", datetime(2026, 11, 30, 11, 12, 47, tzinfo=timezone.utc)),
    ],
)
def test_datetimes_parse_to_utc(text: str, expected: datetime) -> None:
    assert parse_datetime(_element("CreatedAt", text)) == expected


@pytest.mark.parametrize("text", ["2026-13-01T00:00:00Z", "yesterday", "2026-11-30", ""])
def test_bad_datetimes_raise(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_datetime(_element("CreatedAt", text))


def test_datetimes_round_trip() -> None:
    value = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)
    assert parse_datetime(_element("X", format_datetime(value))) == value


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("False", False), ("1", True)])
def test_booleans(text: str, expected: bool) -> None:
    assert parse_bool(_element("RequiresSession", text)) is expected


@pytest.mark.parametrize(
    ("parse", "text"), [(parse_bool, "yes"), (parse_int, "1.5"), (parse_int, "ten")]
)
def test_bad_scalars_name_the_element(parse: object, text: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse(_element("MaxDeliveryCount", text))  # type: ignore[operator]
    assert "MaxDeliveryCount" in info.value.message


# ------------------------------------------------------------------ key values


def _round_trip(values: dict[str, object]) -> dict[str, object] | None:
    xml = encode_key_values("Parameters", values)
    wrapped = (
        '<r xmlns:i="http://www.w3.org/2001/XMLSchema-instance" '
        'xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect">'
        f"{xml}</r>"
    )
    return decode_key_values(parse_document(wrapped.encode())[0])


def test_key_values_keep_their_types() -> None:
    values: dict[str, object] = {
        "@s": "text <&>",
        "@i": 5,
        "@long": 2**40,
        "@neg": -(2**31),
        "@f": 1.5,
        "@inf": float("inf"),
        "@b": True,
        "@when": datetime(2020, 1, 1, tzinfo=timezone.utc),
        "@span": timedelta(minutes=1),
        "@id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "@raw": b"\x00\x01",
        "@none": None,
        "@empty": "",
    }
    decoded = _round_trip(values)
    assert decoded == values
    assert decoded is not None
    assert type(decoded["@b"]) is bool and type(decoded["@i"]) is int


def test_no_key_values_decode_to_none() -> None:
    assert _round_trip({}) is None


def test_key_values_as_the_sdk_writes_them() -> None:
    # The SDK's wire form: its own prefix for the value's type, the schema namespace declared
    # on each value.
    xml = (
        b'<Parameters xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"'
        b' xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><KeyValueOfstringanyType>'
        b'<Key>@p</Key><Value xsi:type="d6p1:long" '
        b'xmlns:d6p1="http://www.w3.org/2001/XMLSchema">1099511627776</Value>'
        b"</KeyValueOfstringanyType></Parameters>"
    )
    assert decode_key_values(parse_document(xml)) == {"@p": 2**40}


@pytest.mark.parametrize(
    ("inner", "reason"),
    [
        ("<KeyValueOfstringanyType><Key>a</Key></KeyValueOfstringanyType>", "Key and a Value"),
        (
            '<KeyValueOfstringanyType><Key>a</Key><Value i:type="d:int">x</Value>'
            "</KeyValueOfstringanyType>",
            "not a valid int",
        ),
        (
            '<KeyValueOfstringanyType><Key>a</Key><Value i:type="d:QName">x</Value>'
            "</KeyValueOfstringanyType>",
            "unsupported type",
        ),
        (
            "<KeyValueOfstringanyType><Key>a</Key><Value>1</Value></KeyValueOfstringanyType>"
            "<KeyValueOfstringanyType><Key>a</Key><Value>2</Value></KeyValueOfstringanyType>",
            "twice",
        ),
    ],
)
def test_bad_key_values_raise(inner: str, reason: str) -> None:
    xml = f'<P xmlns:i="http://www.w3.org/2001/XMLSchema-instance">{inner}</P>'
    with pytest.raises(InvalidArgumentError) as info:
        decode_key_values(parse_document(xml.encode()))
    assert reason in info.value.message


def test_written_text_is_escaped_and_illegal_characters_replaced() -> None:
    xml = el("UserMetadata", text='a<b>&"c"\x00', attrs={"k": 'x"<'})
    parsed = parse_document(xml.encode())
    assert parsed.text == 'a<b>&"c"\ufffd'
    assert parsed.get("k") == 'x"<'
