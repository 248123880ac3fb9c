"""``AmqpAnnotatedMessage`` in the native clients, without Ray: what a send of one stores (the
AMQP gateway's mapping), what a received message's ``raw_amqp_message`` reads, and the
refusals of bad input."""

from __future__ import annotations

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
