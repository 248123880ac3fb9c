"""A received message reads its fields from the broker's record when first asked for: each
field is the record's, an assigned field changes the message (and what it sends again) but
never the record it settles by, and the message pickles whole."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta

from raybus import ServiceBusMessage
from raybus._core.record import MessageRecord, encoded_size
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
