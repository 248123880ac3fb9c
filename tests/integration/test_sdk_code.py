"""Code written for azure-servicebus, run against raybus: the SDK's client options, its
asyncio ``list_*`` methods iterated with ``async for``, ``get_namespace_properties``.
(Found by running the SDK's own samples against raybus with only the imports changed.)"""

from __future__ import annotations

import ssl

import pytest

import raybus
from raybus import ServiceBusMessage, TransportType, aio
from raybus.exceptions import InvalidArgumentError
from raybus.management import (
    ApiVersion,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
)


def test_the_sdks_client_options_are_accepted_and_the_client_works(namespace: str) -> None:
    conn = (
        f"Endpoint=sb://{namespace}.servicebus.windows.net/;SharedAccessKeyName=r;SharedAccessKey=k"
    )
    admin = ServiceBusAdministrationClient.from_connection_string(
        conn, api_version=ApiVersion.V2021_05, logging_enable=True
    )
    admin.create_queue("q")
    with raybus.ServiceBusClient.from_connection_string(
        conn,
        logging_enable=True,
        transport_type=TransportType.AmqpOverWebsocket,
        user_agent="orders",
        try_timeout=10,
        ssl_context=ssl.create_default_context(),
        uamqp_transport=False,
    ) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("through"))
        with client.get_queue_receiver("q", max_wait_time=5) as receiver:
            (msg,) = receiver.receive_messages()
            receiver.complete_message(msg)
    assert str(msg) == "through"


async def test_aio_lists_are_iterated_with_async_for_as_the_sdks_and_still_awaited(
    namespace: str,
) -> None:
    aadmin = aio.ServiceBusAdministrationClient(namespace)
    await aadmin.create_queue("sq", requires_session=True)
    await aadmin.create_topic("t")
    await aadmin.create_subscription("t", "s", requires_session=True)
    async with aio.ServiceBusClient(namespace) as client:
        async with client.get_queue_sender("sq") as sender:
            await sender.send_messages(ServiceBusMessage("m", session_id="s1"))
        assert [s async for s in client.list_queue_sessions("sq")] == ["s1"]
        assert await client.list_queue_sessions("sq") == ["s1"]
        assert [s async for s in client.list_subscription_sessions("t", "s")] == []
    assert [q.name async for q in aadmin.list_queues()] == ["sq"]
    assert [q.name for q in await aadmin.list_queues()] == ["sq"]
    runtime = [r async for r in aadmin.list_queues_runtime_properties()]
    assert [(r.name, r.active_message_count) for r in runtime] == [("sq", 1)]
    assert [t.name async for t in aadmin.list_topics()] == ["t"]
    assert [t.name async for t in aadmin.list_topics_runtime_properties()] == ["t"]
    assert [s.name async for s in aadmin.list_subscriptions("t")] == ["s"]
    assert [s.name async for s in aadmin.list_subscriptions_runtime_properties("t")] == ["s"]
    assert [r.name async for r in aadmin.list_rules("t", "s")] == ["$Default"]
    props = await aadmin.get_namespace_properties()
    assert props.name == namespace


def test_a_rule_changed_in_place_and_passed_to_update_rule_as_in_the_sdk(namespace: str) -> None:
    admin = ServiceBusAdministrationClient(namespace)
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    admin.delete_rule("t", "s", "$Default")
    admin.create_rule("t", "s", "r", filter=SqlRuleFilter("color = 'red'"))
    rule = admin.get_rule("t", "s", "r")
    rule.filter = SqlRuleFilter("color = @c", parameters={"@c": "blue"})
    rule.action = SqlRuleAction("SET priority = 'high'")
    admin.update_rule("t", "s", rule)
    stored = admin.get_rule("t", "s", "r")
    assert (stored.filter, stored.action) == (rule.filter, rule.action)
    with raybus.ServiceBusClient(namespace) as client:
        with client.get_topic_sender("t") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage("red", application_properties={"color": "red"}),
                    ServiceBusMessage("blue", application_properties={"color": "blue"}),
                ]
            )
        with client.get_subscription_receiver("t", "s", max_wait_time=3) as receiver:
            got = receiver.receive_messages(10, max_wait_time=3)
            receiver.complete_messages(got)
    assert [(str(m), m.application_properties["priority"]) for m in got] == [("blue", "high")]
    # An assignment is checked as the constructor checks it; a bad one changes nothing.
    with pytest.raises(InvalidArgumentError) as err:
        rule.filter = "color = 'red'"  # type: ignore[assignment]
    assert err.value.argument == "filter" and rule.filter == stored.filter
    with pytest.raises(InvalidArgumentError):
        rule.action = "SET x = 1"  # type: ignore[assignment]
    with pytest.raises(AttributeError, match="only filter and action"):
        rule.name = "other"


def test_amqp_annotated_messages_are_sent_scheduled_and_read_back_as_sections(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    """The SDK's ``AmqpAnnotatedMessage``: a list mixing it with a ``ServiceBusMessage``, a
    batch, a schedule; each received message reads back its sections. A ``ServiceBusMessage``
    changed through its ``raw_amqp_message`` is sent as changed."""
    from datetime import datetime, timedelta, timezone

    from raybus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType

    sections = AmqpAnnotatedMessage(
        data_body=[b"part-1", b"part-2"],
        properties={"message_id": "sections", "subject": "raw"},
        application_properties={"n": 1},
    )
    adopted = ServiceBusMessage(b"adopted", message_id="before")
    own = adopted.raw_amqp_message
    assert own.properties is not None and own.header is not None
    own.properties.message_id, own.properties.subject = "adopted", "via its sections"
    own.header.time_to_live = 60_000
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([sections, ServiceBusMessage(b"plain", message_id="plain"), adopted])
        batch = sender.create_message_batch()
        batch.add_message(
            AmqpAnnotatedMessage(sequence_body=[[1, "a"]], properties={"message_id": "seq"})
        )
        sender.send_messages(batch)
        at = datetime.now(timezone.utc) + timedelta(hours=1)
        (number,) = sender.schedule_messages(AmqpAnnotatedMessage(value_body={"v": 2}), at)
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        got = {}
        while len(got) < 4:
            for m in receiver.receive_messages(4, max_wait_time=5):
                got[m.message_id] = m
                receiver.complete_message(m)
        (scheduled,) = receiver.peek_messages(1, sequence_number=number)
    raw = got["sections"].raw_amqp_message
    assert list(raw.body) == [b"part-1", b"part-2"]
    assert raw.properties is not None and raw.properties.subject == "raw"
    assert raw.application_properties == {"n": 1}
    assert raw.annotations is not None and "x-opt-locked-until" in raw.annotations
    assert bytes(got["sections"].body) == b"part-1part-2"
    assert list(got["plain"].raw_amqp_message.body) == [b"plain"]
    seq = got["seq"].raw_amqp_message
    assert (seq.body_type, list(seq.body)) == (AmqpMessageBodyType.SEQUENCE, [[1, "a"]])
    assert scheduled.scheduled_enqueue_time_utc is not None
    assert scheduled.raw_amqp_message.body == {"v": 2}
    assert (got["adopted"].subject, got["adopted"].body) == ("via its sections", b"adopted")
    assert got["adopted"].time_to_live == timedelta(seconds=60)


def test_received_properties_are_read_by_bytes_names_as_the_sdks_are(namespace: str) -> None:
    """The SDK gives received properties ``bytes`` names and string values, so its users
    write ``props[b"order_id"].decode()``: that reads the same here, through a queue and the
    dead-letter sub-queue, and the ``str`` reading of raybus's own code works alongside."""
    ServiceBusAdministrationClient(namespace).create_queue("props")
    with raybus.ServiceBusClient(namespace) as client:
        with client.get_queue_sender("props") as sender:
            sender.send_messages(
                ServiceBusMessage(
                    "order", application_properties={b"order_id": "o-1", "kind": "new", "n": 3}
                )
            )
        with client.get_queue_receiver("props", max_wait_time=5) as receiver:
            (msg,) = receiver.receive_messages()
            props = msg.application_properties
            assert props is not None
            assert props[b"order_id"].decode() == "o-1" == props["order_id"]
            assert props.get(b"kind") == b"new" and props[b"n"] == 3 and b"n" in props
            assert sorted(props) == ["kind", "n", "order_id"]
            receiver.dead_letter_message(msg, reason="checked")
        with client.get_queue_receiver(
            "props", sub_queue=raybus.ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5
        ) as dead:
            (msg,) = dead.receive_messages()
            assert msg.application_properties[b"order_id"].decode() == "o-1"
            dead.complete_message(msg)
