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
