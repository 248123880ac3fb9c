"""``AmqpAnnotatedMessage`` in the native clients, without Ray: what a send of one stores (the
AMQP gateway's mapping), what a received message's ``raw_amqp_message`` reads, and the
refusals of bad input."""

from __future__ import annotations

import pickle
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from raybus import ServiceBusMessage, ServiceBusMessageBatch
from raybus.aio._sender import _records
from raybus.amqp import (
    AmqpAnnotatedMessage,
    AmqpMessageBodyType,
    AmqpMessageHeader,
    AmqpMessageProperties,
)
from raybus.amqp._message import RAW_BODY_PROPERTY
from raybus.exceptions import InvalidArgumentError
from raybus.message import ServiceBusReceivedMessage, outgoing


def received(message: Any, kind: str = "locked") -> ServiceBusReceivedMessage:
    """``message`` as a receiver gets it after raybus stored it (numbers and times stamped)."""
    sendable = outgoing(message)
    assert sendable is not None
    rec = sendable._to_record()
    rec.sequence_number = rec.enqueued_sequence_number = 42
    rec.enqueued_time, rec.delivery_count = 1_700_000_000.0, 2
    rec.lock_token, rec.locked_until = "tok", 1_700_000_030.0
    return ServiceBusReceivedMessage(rec, entity="q", kind=kind)


# ---------------------------------------------------------------- building one


@pytest.mark.parametrize(
    "bodies",
    [{}, {"data_body": b"a", "value_body": 1}, {"sequence_body": [[1]], "value_body": 2}],
    ids=["none", "data-and-value", "sequence-and-value"],
)
def test_exactly_one_body_is_required(bodies: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError, match="exactly one of data_body") as info:
        AmqpAnnotatedMessage(**bodies)
    assert isinstance(info.value, ValueError)  # as the SDK raises


def test_data_sections_are_bytes_and_str_is_encoded_as_utf8() -> None:
    m = AmqpAnnotatedMessage(data_body=["hé", b"\x00\x01"])
    assert m.body_type is AmqpMessageBodyType.DATA
    assert list(m.body) == ["hé".encode(), b"\x00\x01"]
    assert list(AmqpAnnotatedMessage(data_body=b"one").body) == [b"one"]
    with pytest.raises(InvalidArgumentError, match="data_body sections are bytes or str"):
        AmqpAnnotatedMessage(data_body=[b"ok", 3])


def test_a_sequence_body_is_one_list_or_a_list_of_sections_and_a_value_is_itself() -> None:
    assert list(AmqpAnnotatedMessage(sequence_body=[1, 2]).body) == [[1, 2]]
    assert list(AmqpAnnotatedMessage(sequence_body=[[1], [2, 3]]).body) == [[1], [2, 3]]
    with pytest.raises(InvalidArgumentError, match="sequence_body"):
        AmqpAnnotatedMessage(sequence_body=[])
    m = AmqpAnnotatedMessage(value_body={"a": 1})
    assert (m.body_type, m.body) == (AmqpMessageBodyType.VALUE, {"a": 1})


def test_header_and_properties_take_a_model_or_a_mapping_and_refuse_unknown_fields() -> None:
    m = AmqpAnnotatedMessage(
        value_body=1, header={"time_to_live": 5000}, properties={"message_id": "m"}
    )
    assert m.header == AmqpMessageHeader(time_to_live=5000)
    assert m.header is not None and m.header["time_to_live"] == 5000
    assert m.properties is not None and m.properties.message_id == "m"
    assert m.properties.get("subject") is None
    with pytest.raises(InvalidArgumentError, match="AmqpMessageHeader has no field 'ttl'"):
        AmqpAnnotatedMessage(value_body=1, header={"ttl": 5})
    with pytest.raises(InvalidArgumentError, match="properties must be AmqpMessageProperties"):
        AmqpAnnotatedMessage(value_body=1, properties=[("message_id", "m")])  # type: ignore[arg-type]


# ---------------------------------------------------------------- sending one


def test_a_send_stores_the_fields_the_gateway_maps() -> None:
    at = datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    m = AmqpAnnotatedMessage(
        data_body=b"payload",
        header=AmqpMessageHeader(time_to_live=90_000, priority=4),
        properties=AmqpMessageProperties(
            message_id="m-1",
            correlation_id="c-1",
            to="orders",
            subject="new",
            reply_to="replies",
            content_type="application/json",
            group_id="session-7",
            reply_to_group_id="rs",
        ),
        application_properties={"amount": 250, "who": "ann"},
        annotations={"x-opt-partition-key": "session-7", "x-opt-scheduled-enqueue-time": at},
    )
    sb = outgoing(m)
    assert isinstance(sb, ServiceBusMessage)
    assert (sb.body, sb.message_id, sb.correlation_id) == (b"payload", "m-1", "c-1")
    assert (sb.to, sb.subject, sb.reply_to) == ("orders", "new", "replies")
    assert (sb.content_type, sb.session_id, sb.reply_to_session_id) == (
        "application/json",
        "session-7",
        "rs",
    )
    assert sb.time_to_live == timedelta(seconds=90)
    assert sb.partition_key == "session-7"
    assert sb.scheduled_enqueue_time_utc == at
    assert sb.application_properties == {"amount": 250, "who": "ann"}


def test_a_send_takes_one_a_list_mixed_with_service_bus_messages_and_a_batch() -> None:
    one = AmqpAnnotatedMessage(value_body=7)
    assert [r.body for r in _records(one)] == [7]
    assert [r.body for r in _records([ServiceBusMessage(b"x"), one])] == [b"x", 7]
    batch = ServiceBusMessageBatch(1024)
    batch.add_message(one)
    batch.add_message(ServiceBusMessage(b"y"))
    assert [r.body for r in batch] == [7, b"y"]


def test_anything_else_is_refused_by_name_and_a_batch_is_left_as_it_was() -> None:
    with pytest.raises(InvalidArgumentError, match="or AmqpAnnotatedMessage objects, not int"):
        _records([AmqpAnnotatedMessage(value_body=1), 5])  # type: ignore[list-item]
    batch = ServiceBusMessageBatch(1024)
    with pytest.raises(InvalidArgumentError, match="not dict"):
        batch.add_message({"body": b"x"})  # type: ignore[arg-type]
    assert len(batch) == 0


def test_a_header_time_to_live_that_is_not_positive_milliseconds_is_refused() -> None:
    for ttl in (0, -5, 1.5, True):
        m = AmqpAnnotatedMessage(value_body=1, header={"time_to_live": ttl})
        with pytest.raises(InvalidArgumentError, match="header time_to_live"):
            outgoing(m)


def test_sections_that_do_not_encode_are_refused_naming_the_body() -> None:
    m = AmqpAnnotatedMessage(value_body=object())
    with pytest.raises(InvalidArgumentError, match="do not encode as AMQP") as info:
        outgoing(m)
    assert info.value.argument == "body"


# ---------------------------------------------------------------- reading one back


@pytest.mark.parametrize(
    "message",
    [
        AmqpAnnotatedMessage(data_body=[b"one", b"two"]),
        AmqpAnnotatedMessage(data_body=b"only"),
        AmqpAnnotatedMessage(sequence_body=[[1, "a"], [2, "b"]]),
        AmqpAnnotatedMessage(value_body={"k": [1, 2]}),
    ],
    ids=["two-data-sections", "one-data-section", "two-sequences", "value"],
)
def test_the_body_sections_sent_are_the_sections_received(message: AmqpAnnotatedMessage) -> None:
    raw = received(message).raw_amqp_message
    assert raw.body_type is message.body_type
    if message.body_type is AmqpMessageBodyType.VALUE:
        assert raw.body == message.body
    else:
        assert list(raw.body) == list(message.body)
    assert RAW_BODY_PROPERTY not in (raw.application_properties or {})


def test_several_data_sections_read_natively_as_their_bytes_joined() -> None:
    msg = received(AmqpAnnotatedMessage(data_body=[b"one", b"two"]))
    assert bytes(msg.body) == b"onetwo"


def test_a_received_messages_sections_are_read_by_the_sdks_bytes_names_too() -> None:
    """The SDK's annotations and application properties have ``bytes`` names (and string
    values): code reading them so reads the same sections here."""
    sent = ServiceBusMessage(b"b", application_properties={"kind": "new", "n": 1})
    raw = received(sent).raw_amqp_message
    assert raw.annotations is not None and raw.application_properties is not None
    assert (
        raw.annotations[b"x-opt-sequence-number"]
        == 42
        == raw.annotations.get(b"x-opt-sequence-number")
    )
    assert b"x-opt-enqueued-time" in raw.annotations and "x-opt-enqueued-time" in raw.annotations
    assert (
        raw.application_properties[b"kind"].decode() == "new" == raw.application_properties["kind"]
    )
    assert (
        raw.application_properties.get(b"kind") == b"new" and raw.application_properties[b"n"] == 1
    )
    again = received(raw)  # sent as it was read: plain str names and values
    assert again._record.application_properties == {"kind": "new", "n": 1}
    assert type(again._record.application_properties["kind"]) is str


def test_a_received_message_shows_the_brokers_annotations_header_and_properties() -> None:
    sent = ServiceBusMessage(
        b"b",
        message_id="m",
        session_id="s",
        content_type="text/plain",
        time_to_live=timedelta(seconds=30),
        application_properties={"p": 1},
    )
    raw = received(sent).raw_amqp_message
    assert raw.annotations is not None
    assert raw.annotations["x-opt-sequence-number"] == 42
    assert raw.annotations["x-opt-enqueued-time"] == datetime.fromtimestamp(
        1_700_000_000, timezone.utc
    )
    assert raw.annotations["x-opt-locked-until"] == datetime.fromtimestamp(
        1_700_000_030, timezone.utc
    )
    assert raw.header is not None
    assert (raw.header.delivery_count, raw.header.time_to_live) == (2, 30_000)
    assert raw.properties is not None
    assert (raw.properties.message_id, raw.properties.group_id) == ("m", "s")
    assert raw.properties.content_type == "text/plain"
    assert raw.application_properties == {"p": 1}
    assert list(raw.body) == [b"b"]


def test_a_peeked_message_has_no_lock_annotation_and_the_view_is_a_copy() -> None:
    msg = received(ServiceBusMessage(b"b"), kind="peeked")
    raw = msg.raw_amqp_message
    assert raw.annotations is not None and "x-opt-locked-until" not in raw.annotations
    raw.application_properties = {"changed": True}
    assert msg.raw_amqp_message.application_properties == {}


def test_annotation_keys_may_be_bytes_as_the_sdk_writes_them() -> None:
    m = AmqpAnnotatedMessage(value_body=1, annotations={b"x-opt-partition-key": "pk"})
    sb = outgoing(m)
    assert sb is not None and sb.partition_key == "pk"


def test_a_dead_lettered_message_shows_its_reason_in_the_application_properties() -> None:
    sendable = outgoing(ServiceBusMessage(b"b", application_properties={"p": 1}))
    assert sendable is not None
    rec = sendable._to_record()
    rec.sequence_number, rec.enqueued_time = 7, 1_700_000_000.0
    rec.dead_letter_reason, rec.dead_letter_error_description = "too old", "why not"
    dead = ServiceBusReceivedMessage(rec, entity="q/$deadletterqueue", kind="peeked")
    raw = dead.raw_amqp_message
    assert raw.application_properties == {
        "p": 1,
        "DeadLetterReason": "too old",
        "DeadLetterErrorDescription": "why not",
    }


# ---------------------------------------------------------------- an outgoing message's sections


def _every_field(body: Any = b"body") -> ServiceBusMessage:
    return ServiceBusMessage(
        body,
        application_properties={"p": 1},
        message_id="m",
        correlation_id="c",
        session_id="s",
        reply_to="r",
        reply_to_session_id="rs",
        to="t",
        subject="sub",
        content_type="text/plain",
        time_to_live=timedelta(seconds=30),
        scheduled_enqueue_time_utc=datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
        partition_key="s",
    )


def test_an_outgoing_messages_sections_hold_its_fields_and_are_one_object() -> None:
    msg = _every_field()
    props = msg.application_properties
    raw = msg.raw_amqp_message
    assert raw is msg.raw_amqp_message
    assert (raw.body_type, list(raw.body)) == (AmqpMessageBodyType.DATA, [b"body"])
    assert raw.header is not None and raw.header.time_to_live == 30_000
    assert raw.properties is not None
    assert (raw.properties.message_id, raw.properties.group_id) == ("m", "s")
    assert (raw.properties.reply_to, raw.properties.reply_to_group_id) == ("r", "rs")
    assert (raw.properties.to, raw.properties.subject) == ("t", "sub")
    assert (raw.properties.correlation_id, raw.properties.content_type) == ("c", "text/plain")
    assert raw.annotations == {
        "x-opt-scheduled-enqueue-time": datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
        "x-opt-partition-key": "s",
    }
    assert raw.application_properties is props  # shared, as the SDK shares it
    assert isinstance(msg, ServiceBusMessage)
    assert repr(msg) == "ServiceBusMessage(message_id='m', body=b'body')"


@pytest.mark.parametrize(
    "body", [b"body", 7, {"k": [1, "a"]}, None], ids=["bytes", "int", "map", "none"]
)
def test_asking_for_the_sections_changes_nothing_a_send_stores(body: Any) -> None:
    before = _every_field(body)._to_record()
    msg = _every_field(body)
    raw = msg.raw_amqp_message
    after = msg._to_record()
    assert after == before
    expected = AmqpMessageBodyType.DATA if isinstance(body, bytes) else AmqpMessageBodyType.VALUE
    assert raw.body_type is expected
    assert msg.body == body


def test_a_str_body_becomes_one_data_section_of_its_utf8_as_in_the_sdk() -> None:
    msg = ServiceBusMessage("héllo")
    assert list(msg.raw_amqp_message.body) == ["héllo".encode()]
    assert msg.body == "héllo".encode() and msg._to_record().body == "héllo".encode()


def test_changes_to_the_sections_are_the_messages_fields_and_what_a_send_stores() -> None:
    msg = _every_field()
    raw = msg.raw_amqp_message
    assert raw.properties is not None and raw.header is not None and raw.annotations is not None
    raw.properties.message_id = "m2"
    raw.properties.group_id = raw.annotations["x-opt-partition-key"] = "s2"
    raw.header.time_to_live = 1_500
    del raw.annotations["x-opt-scheduled-enqueue-time"]
    raw.annotations[b"x-opt-scheduled-enqueue-time"] = datetime(2031, 1, 1, tzinfo=timezone.utc)
    msg.application_properties["q"] = "added in place"
    assert (msg.message_id, msg.session_id, msg.partition_key) == ("m2", "s2", "s2")
    assert msg.time_to_live == timedelta(milliseconds=1_500)
    assert msg.scheduled_enqueue_time_utc == datetime(2031, 1, 1, tzinfo=timezone.utc)
    rec = msg._to_record()
    assert (rec.message_id, rec.session_id, rec.partition_key) == ("m2", "s2", "s2")
    assert rec.time_to_live == 1.5
    assert rec.scheduled_enqueue_time == datetime(2031, 1, 1, tzinfo=timezone.utc).timestamp()
    assert rec.application_properties == {"p": 1, "q": "added in place"}


def test_changes_to_the_fields_are_written_to_the_sections() -> None:
    msg = _every_field()
    raw = msg.raw_amqp_message
    msg.session_id = msg.partition_key = "s3"
    msg.reply_to_session_id = None
    msg.time_to_live = timedelta(seconds=2)
    msg.scheduled_enqueue_time_utc = None
    msg.body = {"now": "a value"}
    msg.application_properties = {"fresh": True}
    assert raw.properties is not None and raw.header is not None
    assert (raw.properties.group_id, raw.properties.reply_to_group_id) == ("s3", None)
    assert raw.annotations == {"x-opt-partition-key": "s3"}
    assert raw.header.time_to_live == 2_000
    assert (raw.body_type, raw.body) == (AmqpMessageBodyType.VALUE, {"now": "a value"})
    assert raw.application_properties == {"fresh": True}
    rec = msg._to_record()
    assert (rec.session_id, rec.reply_to_session_id, rec.scheduled_enqueue_time) == (
        "s3",
        None,
        None,
    )
    assert (rec.body, rec.application_properties) == ({"now": "a value"}, {"fresh": True})


def test_a_field_set_replaces_or_removes_an_annotation_written_with_a_bytes_key() -> None:
    """The SDK writes annotation keys as ``bytes``: a field set through the message finds the
    annotation under either spelling, so no stale copy is left to win over the new value."""
    msg = ServiceBusMessage(b"b")
    raw = msg.raw_amqp_message
    raw.annotations = {
        b"x-opt-partition-key": "k1",
        b"x-opt-scheduled-enqueue-time": datetime(2030, 1, 1, tzinfo=timezone.utc),
        b"x-other": 7,
    }
    assert msg.partition_key == "k1"
    msg.partition_key = "k2"
    msg.scheduled_enqueue_time_utc = None
    assert raw.annotations == {b"x-other": 7, "x-opt-partition-key": "k2"}
    assert msg._to_record().partition_key == "k2"
    msg.partition_key = None
    assert raw.annotations == {b"x-other": 7}
    rec = msg._to_record()
    assert (rec.partition_key, rec.scheduled_enqueue_time) == (None, None)


def test_a_bad_field_is_refused_by_name_and_the_sections_keep_what_they_had() -> None:
    msg = _every_field()
    raw = msg.raw_amqp_message
    for name, bad in [
        ("message_id", 5),
        ("time_to_live", 30),
        ("scheduled_enqueue_time_utc", "tomorrow"),
        ("application_properties", [("p", 1)]),
    ]:
        with pytest.raises(InvalidArgumentError, match=name) as err:
            setattr(msg, name, bad)
        assert err.value.argument == name
    assert raw.properties is not None and raw.properties.message_id == "m"
    assert raw.header is not None and raw.header.time_to_live == 30_000
    assert msg.application_properties == {"p": 1}
    raw.header.time_to_live = -1
    with pytest.raises(InvalidArgumentError, match="time_to_live"):
        msg._to_record()


def test_a_message_backed_by_its_sections_pickles_and_sends_in_a_list_and_a_batch() -> None:
    msg = _every_field()
    msg.raw_amqp_message.application_properties = {"p": 2}
    copy = pickle.loads(pickle.dumps(msg))
    assert copy.raw_amqp_message is not msg.raw_amqp_message
    assert copy._to_record() == msg._to_record()
    (rec,) = _records([msg])
    assert rec.application_properties == {"p": 2}
    batch = ServiceBusMessageBatch(1 << 20)
    batch.add_message(msg)
    assert [r.message_id for r in batch] == ["m"] and batch.size_in_bytes == rec.size


class Order(ServiceBusMessage):
    """An application's own message class."""

    def describe(self) -> str:
        return f"order {self.message_id} for {self.customer}"


def test_an_applications_subclass_keeps_its_class_methods_and_attributes() -> None:
    msg = Order(b"o", message_id="o-1")
    msg.customer = "ada"
    raw = msg.raw_amqp_message
    assert raw.properties is not None
    raw.properties.message_id = "o-2"
    assert isinstance(msg, Order) and type(msg).__name__ == "Order"
    assert msg.describe() == "order o-2 for ada"
    copy = pickle.loads(pickle.dumps(msg))
    assert isinstance(copy, Order) and copy.describe() == "order o-2 for ada"
    assert copy.raw_amqp_message.properties.message_id == "o-2"
    assert type(copy) is type(msg)
