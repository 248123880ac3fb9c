"""A received message reads its fields from the broker's record when first asked for: each
field is the record's, an assigned field changes the message (and what it sends again) but
never the record it settles by, and the message pickles whole."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta

import pytest

from raybus import ServiceBusMessage
from raybus._core.record import MessageRecord, encoded_size
from raybus.exceptions import InvalidArgumentError
from raybus.message import ServiceBusReceivedMessage

FIELDS = {
    "message_id": "m-1",
    "correlation_id": "c-1",
    "session_id": "s-1",
    "reply_to": "replies",
    "reply_to_session_id": "rs-1",
    "to": "orders",
    "subject": "new",
    "content_type": "application/json",
    "partition_key": "s-1",
}


def received(**changes: object) -> ServiceBusReceivedMessage:
    rec = MessageRecord(
        body=b"payload",
        application_properties={"amount": 10},
        time_to_live=30.0,
        scheduled_enqueue_time=1_800_000_000.0,
        sequence_number=7,
        lock_token="token-7",
        **FIELDS,  # type: ignore[arg-type]
    )
    for name, value in changes.items():
        setattr(rec, name, value)
    encoded_size(rec)
    return ServiceBusReceivedMessage(rec, entity="orders", kind="locked")


def test_every_field_is_the_records() -> None:
    msg = received()
    assert msg.body == b"payload"
    assert msg.application_properties == {"amount": 10}
    assert {name: getattr(msg, name) for name in FIELDS} == FIELDS
    assert msg.time_to_live == timedelta(seconds=30)
    assert msg.scheduled_enqueue_time_utc == datetime.fromtimestamp(1_800_000_000.0, UTC)
    assert (msg.sequence_number, msg.lock_token) == (7, "token-7")
    never_set = received(time_to_live=None, scheduled_enqueue_time=None, subject=None)
    assert never_set.time_to_live is None
    assert never_set.scheduled_enqueue_time_utc is None
    assert never_set.subject is None


def test_an_assigned_field_changes_the_message_and_its_resend_not_its_record() -> None:
    msg = received()
    assert msg._to_record().subject == "new"  # validated once, cached
    msg.subject = "changed"
    msg.body = b"other"
    assert (msg.subject, msg.body) == ("changed", b"other")
    resent = msg._to_record()
    assert (resent.subject, resent.body, resent.message_id) == ("changed", b"other", "m-1")
    assert (msg._record.subject, msg._record.body) == ("new", b"payload")
    assert msg.lock_token == "token-7"


def test_a_received_message_pickles_with_its_fields_read_or_not() -> None:
    msg = received()
    msg.subject = "changed"
    copy = pickle.loads(pickle.dumps(msg))
    assert (copy.subject, copy.body, copy.message_id) == ("changed", b"payload", "m-1")
    assert copy.lock_token == "token-7"


def test_the_fields_are_the_sent_messages_fields() -> None:
    """Nothing a sent message has is missing from a received one (the SDK's received message
    is a message): each of ``ServiceBusMessage``'s fields is served from the record."""
    sent = ServiceBusMessage(b"x")
    msg = received()
    for name in vars(sent):
        if not name.startswith("_"):
            assert name in type(msg).__dict__, name
            getattr(msg, name)


def test_a_field_read_on_the_class_is_its_descriptor_and_reads_nothing() -> None:
    """``help()`` and ``inspect`` read the fields on the class, where there is no record."""
    field = ServiceBusReceivedMessage.body
    assert type(field).__name__ == "_Field"
    assert field is ServiceBusReceivedMessage.__dict__["body"]


def test_a_received_bytes_body_reads_as_the_sdks_body_and_as_the_bytes_sent() -> None:
    """Code written for the Azure SDK reads a data body as an iterator of sections; raybus's
    own code reads it as the bytes sent. Both work on the same body."""
    body = received().body
    assert isinstance(body, bytes) and body == b"payload" and len(body) == 7
    assert b"".join(body) == b"payload"
    assert next(body) == b"payload" and next(body) == b"payload"  # each time, as a new one
    assert list(body) == [b"payload"] and [s for s in body] == [b"payload"]
    assert str(b"".join(body), encoding="utf-8") == "payload" == body.decode()
    assert body[0] == ord("p") and body[1:3] == b"ay" and bytes(body) == b"payload"
    assert pickle.loads(pickle.dumps(body)) == b"payload"


def test_a_received_str_body_reads_as_the_sdks_utf8_section_and_as_the_str_sent() -> None:
    """The SDK sends a ``str`` body as one UTF-8 data section, and its receiver reads bytes
    back: ``b"".join(msg.body)`` gives them here too."""
    body = received(body="héllo").body
    assert isinstance(body, str) and body == "héllo" and body.upper() == "HÉLLO"
    assert b"".join(body) == "héllo".encode() == next(body)
    assert list(body) == ["héllo".encode()]
    assert str(body) == "héllo" and type(str(body)) is str


def test_a_received_value_body_is_the_value() -> None:
    assert received(body=[1, "two"]).body == [1, "two"]
    assert received(body=42).body == 42
    assert received(body=None).body is None


def test_a_received_body_resent_is_sent_as_plain_bytes_or_str() -> None:
    """What crosses to the broker holds no raybus class (a partition need not import the
    client's modules to read it), and a resent message is the same message."""
    for sent in (b"payload", "héllo"):
        msg = received(body=sent)
        assert type(msg.body) is not type(sent)  # the SDK-shaped body
        again = msg._to_record()
        assert type(again.body) is type(sent) and again.body == sent
        copy = ServiceBusMessage(msg.body)
        assert type(copy._to_record().body) is type(sent)
        assert copy.size_in_bytes == ServiceBusMessage(sent).size_in_bytes
    assert type(ServiceBusMessage(bytearray(b"ab"))._to_record().body) is bytes


def test_received_properties_read_as_the_sdks_bytes_and_as_the_strs_sent() -> None:
    """The SDK gives received properties ``bytes`` names and string values, so code written
    for it reads ``props[b"order_id"].decode()``; raybus's own code reads the ``str`` sent.
    Both work on the same properties, and iterating gives the names sent."""
    msg = received(application_properties={"order_id": "12345", "amount": 10, "raw": b"\x00"})
    props = msg.application_properties
    assert props is not None and props is msg.application_properties  # read once, kept
    assert props["order_id"] == "12345" and props[b"order_id"].decode() == "12345"
    assert props.get(b"order_id") == b"12345" and props.get(b"order_id") != b"12346"
    assert props.get("order_id") == "12345" and props[b"amount"] == 10 == props.get(b"amount")
    assert props[b"raw"] == b"\x00"  # a bytes value is the bytes sent
    assert b"amount" in props and "amount" in props and b"missing" not in props
    assert props.get(b"missing") is None and props.get(b"\xff", 7) == 7
    with pytest.raises(KeyError):
        props[b"missing"]
    with pytest.raises(KeyError):
        props[b"\xff"]  # not UTF-8: no such name
    assert list(props) == ["order_id", "amount", "raw"]
    assert props == {"order_id": "12345", "amount": 10, "raw": b"\x00"}
    assert {"12345": "found"}[props[b"order_id"]] == "found"  # hashes as the str
    assert type(props[b"order_id"].decode()) is str and props[b"order_id"].upper() == "12345"
    # Changed by either name, as a dict; the broker's record is not the message's dict.
    props[b"note"] = "n"
    assert props.pop(b"note") == "n" and props.setdefault(b"extra", 1) == 1
    del props[b"extra"]
    assert props.pop(b"gone", None) is None and list(props) == ["order_id", "amount", "raw"]
    copied = props.copy()
    copied.update({b"more": 1})
    assert copied[b"order_id"] == b"12345" and list(copied)[-1] == "more" and "more" not in props
    assert msg._record.application_properties == {"order_id": "12345", "amount": 10, "raw": b"\x00"}
    again = pickle.loads(pickle.dumps(props))
    assert again[b"order_id"] == b"12345" and type(again) is type(props)
    assert received(application_properties=None).application_properties is None


def test_received_properties_resent_are_sent_as_plain_strs() -> None:
    """A received message sent again, or its properties copied into a new message, sends plain
    ``str`` names and values: nothing of raybus's crosses to the broker."""
    msg = received(application_properties={"order_id": "12345", "amount": 10})
    for props in (
        msg._to_record().application_properties,
        ServiceBusMessage("b", application_properties=dict(msg.application_properties or {}))
        ._to_record()
        .application_properties,
    ):
        assert props == {"order_id": "12345", "amount": 10}
        assert [type(k) for k in props] == [str, str] and type(props["order_id"]) is str


def test_a_sent_messages_property_names_may_be_bytes_as_in_the_sdk() -> None:
    """The SDK takes ``bytes`` names too: stored as their UTF-8 ``str``. A name given both
    ways, or bytes that are not UTF-8, is refused naming the properties, and the caller's
    dict is left as it was."""
    given = {b"order_id": "1", "amount": 2, b"raw": b"\x01"}
    msg = ServiceBusMessage("b", application_properties=given)
    assert msg._to_record().application_properties == {"order_id": "1", "amount": 2, "raw": b"\x01"}
    assert list(given) == [b"order_id", "amount", b"raw"]  # the caller's dict is not changed
    assert (
        msg.size_in_bytes
        == ServiceBusMessage(
            "b", application_properties={"order_id": "1", "amount": 2, "raw": b"\x01"}
        ).size_in_bytes
    )
    with pytest.raises(InvalidArgumentError, match="given twice") as err:
        ServiceBusMessage("b", application_properties={b"k": 1, "k": 2})
    assert err.value.argument == "application_properties"
    with pytest.raises(InvalidArgumentError) as err:
        ServiceBusMessage("b", application_properties={b"\xff": 1})
    assert err.value.argument == "application_properties"
