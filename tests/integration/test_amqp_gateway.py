"""The official azure-servicebus SDK (7.15, unmodified) against the raybus AMQP gateway: queues,
both receive modes, batches, settlement, deferral, scheduling, dead-lettering, locks, and
messages crossing between the SDK and the native raybus client."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import amqp_gateway_fixtures
import pytest
from amqp_gateway_fixtures import receive_n
from azure.servicebus import (
    AutoLockRenewer,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus import ServiceBusClient as SdkClient
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
)

import raybus
from raybus.amqp import GatewayHandle
from raybus.management import ServiceBusAdministrationClient

# The shared gateway fixtures (module-scoped gateway, SDK client, module namespace).
namespace = amqp_gateway_fixtures.namespace
gateway = amqp_gateway_fixtures.gateway
sdk = amqp_gateway_fixtures.sdk


def _queue(admin: ServiceBusAdministrationClient, **options: object) -> str:
    name = f"amqp-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, **options)
    return name


def _drain_native(
    client: raybus.ServiceBusClient, queue: str
) -> list[raybus.ServiceBusReceivedMessage]:
    with client.get_queue_receiver(queue, max_wait_time=1) as r:
        got = r.receive_messages(max_message_count=50, max_wait_time=1)
        for m in got:
            r.complete_message(m)
        return got


def test_send_and_receive_peek_lock_then_complete_empties_the_queue(
    sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        sender.send_messages(
            ServiceBusMessage(
                "hello",
                application_properties={"kind": "greeting", "n": 7},
                message_id="m-1",
                correlation_id="c-1",
                subject="subj",
                content_type="text/plain",
                reply_to="back",
                time_to_live=timedelta(minutes=5),
            )
        )
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
    with sdk.get_queue_receiver(pooled_queue, max_wait_time=2) as receiver:
        got = receive_n(receiver, 4)
        first = got[0]
        assert str(first) == "hello"
        assert first.message_id == "m-1" and first.correlation_id == "c-1"
        assert first.subject == "subj" and first.content_type == "text/plain"
        assert first.reply_to == "back"
        assert first.application_properties == {b"kind": b"greeting", b"n": 7}
        assert first.time_to_live == timedelta(minutes=5)
        assert first.delivery_count == 0
        assert first.locked_until_utc > datetime.now(timezone.utc)
        assert [m.sequence_number for m in got] == sorted(m.sequence_number for m in got)
        assert [str(m) for m in got[1:]] == ["m0", "m1", "m2"]
        for m in got:
            receiver.complete_message(m)
    assert client.get_queue_receiver(pooled_queue).peek_messages(10) == []


def test_receive_and_delete_removes_on_delivery(
    sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        sender.send_messages([ServiceBusMessage(f"d{i}") for i in range(3)])
    with sdk.get_queue_receiver(
        pooled_queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=2
    ) as receiver:
        got = receive_n(receiver, 3)
    assert sorted(str(m) for m in got) == ["d0", "d1", "d2"]
    assert client.get_queue_receiver(pooled_queue).peek_messages(10) == []


def test_message_batch_is_split_into_its_messages(
    sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        batch = sender.create_message_batch()
        for i in range(100):
            batch.add_message(ServiceBusMessage(b"x" * 1024, application_properties={"i": i}))
        sender.send_messages(batch)
    peeked = client.get_queue_receiver(pooled_queue).peek_messages(200)
    assert len(peeked) == 100
    assert [m.application_properties["i"] for m in peeked] == list(range(100))
    assert all(m.body == b"x" * 1024 for m in peeked)


def test_peek_neither_locks_nor_removes(sdk: SdkClient, pooled_queue: str) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        sender.send_messages([ServiceBusMessage(f"p{i}") for i in range(3)])
    with sdk.get_queue_receiver(pooled_queue, max_wait_time=2) as receiver:
        peeked = receiver.peek_messages(max_message_count=10)
        assert [str(m) for m in peeked] == ["p0", "p1", "p2"]
        from_second = receiver.peek_messages(10, sequence_number=peeked[1].sequence_number)
        assert [str(m) for m in from_second] == ["p1", "p2"]
        got = receiver.receive_messages(max_message_count=3, max_wait_time=3)
        assert got and str(got[0]) == "p0"  # still there, not locked by the peek
        for m in got:
            receiver.complete_message(m)


def test_abandon_delivers_again_with_a_higher_delivery_count(
    sdk: SdkClient, pooled_queue: str
) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        sender.send_messages(ServiceBusMessage("again"))
    with sdk.get_queue_receiver(pooled_queue, max_wait_time=2) as receiver:
        (msg,) = receiver.receive_messages(max_wait_time=3)
        receiver.abandon_message(msg)
        (again,) = receiver.receive_messages(max_wait_time=3)
        assert again.sequence_number == msg.sequence_number
        assert again.delivery_count == 1
        receiver.complete_message(again)


def _is_empty(client: raybus.ServiceBusClient, queue: str) -> None:
    """The gateway echoes a completion as raybus's receiver settles: with lock time to spare,
    before the partition has applied it (``raybus.amqp._links.settle``), so a peek right after
    the SDK's ``complete_message`` may still see the message (seen once in a full run)."""
    assert client.get_queue_receiver(queue).peek_messages(5) == []


def test_defer_then_receive_deferred_by_sequence_number_and_complete(
    sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient, eventually: Any
) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        sender.send_messages(ServiceBusMessage("later"))
    with sdk.get_queue_receiver(pooled_queue, max_wait_time=2) as receiver:
        (msg,) = receiver.receive_messages(max_wait_time=3)
        receiver.defer_message(msg)
        assert receiver.receive_messages(max_wait_time=1) == []
        (deferred,) = receiver.receive_deferred_messages([msg.sequence_number])
        assert str(deferred) == "later" and deferred.lock_token is not None
        receiver.complete_message(deferred)
    eventually(lambda: _is_empty(client, pooled_queue))


def _where(client: raybus.ServiceBusClient, queue: str) -> str:
    """Where the queue's messages are, for a failure's message: counts, a peek, and whether
    a native receive gets one (if it does, the gateway or the SDK held it back)."""
    props = ServiceBusAdministrationClient(client.namespace).get_queue_runtime_properties(queue)
    peeked = client.get_queue_receiver(queue).peek_messages(5)
    with client.get_queue_receiver(queue, max_wait_time=5) as native:
        received = native.receive_messages(5)
    return (
        f"queue: {props.active_message_count} active, {props.scheduled_message_count} "
        f"scheduled; peek: {[(str(m), m.sequence_number, m.state.name) for m in peeked]}; "
        f"a native receive got {[str(m) for m in received]}"
    )


def test_schedule_then_cancel_leaves_nothing_and_a_due_schedule_arrives(
    sdk: SdkClient,
    pooled_queue: str,
    client: raybus.ServiceBusClient,
    caplog: Any,
    eventually: Any,
) -> None:
    caplog.set_level(logging.DEBUG, logger="raybus.amqp")  # a failure shows the frames
    now = datetime.now(timezone.utc)
    with sdk.get_queue_sender(pooled_queue) as sender:
        (far,) = sender.schedule_messages(ServiceBusMessage("far"), now + timedelta(hours=1))
        (soon,) = sender.schedule_messages(ServiceBusMessage("soon"), now + timedelta(seconds=2))
        assert far != soon
        peeked = client.get_queue_receiver(pooled_queue).peek_messages(5)
        # (an activated message gets a new sequence number, so only the far one is compared)
        assert sorted(str(m) for m in peeked) == ["far", "soon"]
        assert far in {m.sequence_number for m in peeked}
        sender.cancel_scheduled_messages(far)
    # Due 2 s after it was scheduled. 5 s was too short for the SDK's link set-up plus the
    # activation with three test processes on two cores. In two full runs out of about six
    # (CI included) nothing came in 30 s; not reproduced in 150 runs of this test or its
    # file under load. A failure says where the message was (``_where``), and pytest shows
    # the gateway's frames (debug log) of the test.
    with sdk.get_queue_receiver(pooled_queue, max_wait_time=30) as receiver:
        try:
            got = receive_n(receiver, 1, timeout=30)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {_where(client, pooled_queue)}") from exc
        assert [str(m) for m in got] == ["soon"]
        assert got[0].scheduled_enqueue_time_utc is not None
        receiver.complete_message(got[0])
    eventually(lambda: _is_empty(client, pooled_queue))


def test_dead_letter_with_reason_then_receive_from_the_dead_letter_queue(
    sdk: SdkClient, pooled_queue: str
) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        sender.send_messages(ServiceBusMessage("poison"))
    with sdk.get_queue_receiver(pooled_queue, max_wait_time=2) as receiver:
        (msg,) = receiver.receive_messages(max_wait_time=3)
        receiver.dead_letter_message(msg, reason="bad", error_description="cannot parse")
    with sdk.get_queue_receiver(
        pooled_queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=3
    ) as dlq:
        (dead,) = dlq.receive_messages(max_wait_time=3)
        assert str(dead) == "poison"
        assert dead.dead_letter_reason == "bad"
        assert dead.dead_letter_error_description == "cannot parse"
        dlq.complete_message(dead)


def test_the_transfer_dead_letter_queue_is_there_and_empty(
    sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        sender.send_messages(ServiceBusMessage("stays"))
    with sdk.get_queue_receiver(
        pooled_queue, sub_queue=ServiceBusSubQueue.TRANSFER_DEAD_LETTER, max_wait_time=1
    ) as tdlq:
        assert tdlq.receive_messages(max_wait_time=1) == []
        assert tdlq.peek_messages(max_message_count=5) == []
    assert [str(m) for m in _drain_native(client, pooled_queue)] == ["stays"]


def test_max_delivery_count_moves_the_message_to_the_dead_letter_queue(
    sdk: SdkClient, admin: ServiceBusAdministrationClient
) -> None:
    queue = _queue(admin, max_delivery_count=2)
    with sdk.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("fails"))
    with sdk.get_queue_receiver(queue, max_wait_time=2) as receiver:
        for _ in range(2):
            (msg,) = receiver.receive_messages(max_wait_time=3)
            receiver.abandon_message(msg)
        assert receiver.receive_messages(max_wait_time=1) == []
    with sdk.get_queue_receiver(
        queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=3
    ) as dlq:
        (dead,) = dlq.receive_messages(max_wait_time=3)
        assert str(dead) == "fails"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        dlq.complete_message(dead)


def test_renew_lock_and_auto_lock_renewer_keep_the_message_locked(
    sdk: SdkClient, admin: ServiceBusAdministrationClient
) -> None:
    queue = _queue(admin, lock_duration=timedelta(seconds=2))
    with sdk.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    renewer = AutoLockRenewer(max_lock_renewal_duration=30)
    try:
        with sdk.get_queue_receiver(queue, max_wait_time=2) as receiver:
            got = receive_n(receiver, 2)
            first, second = got
            before = first.locked_until_utc
            after = receiver.renew_message_lock(first)
            assert after >= before
            original = second.locked_until_utc
            renewer.register(receiver, second)
            time.sleep(3.0)  # past both original locks
            with pytest.raises(MessageLockLostError):
                receiver.complete_message(first)  # renewed once only: its lock ran out
            renewed = second.locked_until_utc
            receiver.complete_message(second)  # kept alive by the renewer
            assert renewed is not None and renewed > original
            # The renewer stops before the receiver closes. The SDK's renewer thread shares
            # the receiver's connection: a renewal still in flight when the receiver closes
            # its session fails there, and the SDK then closes the handler from that thread
            # while this one is closing it too ('NoneType' object has no attribute 'close',
            # seen once in CI). Service Bus itself would see the same race.
            renewer.close()
    finally:
        renewer.close()


def test_complete_after_the_lock_expired_raises_message_lock_lost(
    sdk: SdkClient, admin: ServiceBusAdministrationClient
) -> None:
    queue = _queue(admin, lock_duration=timedelta(seconds=1))
    with sdk.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("slow"))
    with sdk.get_queue_receiver(queue, max_wait_time=2) as receiver:
        (msg,) = receiver.receive_messages(max_wait_time=3)
        time.sleep(1.5)
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(msg)


def test_sdk_messages_read_natively_and_native_messages_read_by_the_sdk(
    sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        sender.send_messages(ServiceBusMessage(b"\x00bytes", session_id=None, subject="s"))
        sender.send_messages(ServiceBusMessage("text"))
        sender.send_messages(
            AmqpAnnotatedMessage(value_body={b"k": [1, 2.5, "v"]}, application_properties={"p": 1})
        )
    got = _drain_native(client, pooled_queue)
    assert [m.body for m in got] == [b"\x00bytes", b"text", {b"k": [1, 2.5, "v"]}]
    assert got[0].subject == "s" and got[2].application_properties == {"p": 1}

    with client.get_queue_sender(pooled_queue) as native:
        native.send_messages(
            [
                raybus.ServiceBusMessage(b"raw", application_properties={"x": "y"}),
                raybus.ServiceBusMessage("str body", message_id="nat-2"),
                raybus.ServiceBusMessage({"a": [1, 2]}),
            ]
        )
    with sdk.get_queue_receiver(pooled_queue, max_wait_time=2) as receiver:
        msgs = receive_n(receiver, 3)
        assert b"".join(msgs[0].body) == b"raw"
        assert msgs[0].application_properties == {b"x": b"y"}
        assert str(msgs[1]) == "str body" and msgs[1].message_id == "nat-2"
        assert msgs[2].body_type == AmqpMessageBodyType.VALUE
        assert msgs[2].body == {b"a": [1, 2]}
        for m in msgs:
            receiver.complete_message(m)


def test_bodies_round_trip_exactly_from_sdk_to_sdk(sdk: SdkClient, pooled_queue: str) -> None:
    """Sequence and multi-section data bodies, which raybus has no native form for, come back
    as the sender wrote them."""
    sent = [
        AmqpAnnotatedMessage(data_body=[b"part1", b"part2"]),
        AmqpAnnotatedMessage(sequence_body=[[1, "two", b"three"]]),
        AmqpAnnotatedMessage(value_body=[b"a", {b"bin-key": 1}, None, True]),
    ]
    with sdk.get_queue_sender(pooled_queue) as sender:
        for m in sent:
            sender.send_messages(m)
    with sdk.get_queue_receiver(pooled_queue, max_wait_time=2) as receiver:
        got = receive_n(receiver, 3)
        assert got[0].body_type == AmqpMessageBodyType.DATA
        assert list(got[0].body) == [b"part1", b"part2"]
        assert got[1].body_type == AmqpMessageBodyType.SEQUENCE
        assert list(got[1].body) == [[1, b"two", b"three"]]
        assert got[2].body_type == AmqpMessageBodyType.VALUE
        assert got[2].body == [b"a", {b"bin-key": 1}, None, True]
        for m in got:
            receiver.complete_message(m)


def test_unknown_entity_raises_messaging_entity_not_found(sdk: SdkClient) -> None:
    with pytest.raises(MessagingEntityNotFoundError), sdk.get_queue_sender("no-such-q") as sender:
        sender.send_messages(ServiceBusMessage("x"))
    with (
        pytest.raises(MessagingEntityNotFoundError),
        sdk.get_queue_receiver("no-such-q", max_wait_time=1) as receiver,
    ):
        receiver.receive_messages(max_wait_time=1)


def test_oversize_message_raises_message_size_exceeded(
    sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        with pytest.raises(MessageSizeExceededError):
            sender.send_messages(ServiceBusMessage(b"x" * (300 * 1024)), timeout=10)
        sender.send_messages(ServiceBusMessage("small"))  # the link still works
    assert [m.body for m in client.get_queue_receiver(pooled_queue).peek_messages(5)] == [b"small"]


async def test_aio_sdk_sends_receives_and_completes(gateway, pooled_queue: str) -> None:
    from azure.servicebus.aio import ServiceBusClient as AioSdkClient

    async with AioSdkClient.from_connection_string(
        gateway.connection_string, retry_total=0
    ) as client:
        async with client.get_queue_sender(pooled_queue) as sender:
            await sender.send_messages([ServiceBusMessage(f"a{i}") for i in range(3)])
        async with client.get_queue_receiver(pooled_queue, max_wait_time=2) as receiver:
            got = []
            while len(got) < 3:
                batch = await receiver.receive_messages(max_message_count=3, max_wait_time=3)
                assert batch
                got += batch
            assert [str(m) for m in got] == ["a0", "a1", "a2"]
            for m in got:
                await receiver.complete_message(m)
            assert await receiver.peek_messages(5) == []


def test_partitioned_queue_peek_iterate_with_prefetch_and_defer(
    sdk: SdkClient, admin: ServiceBusAdministrationClient
) -> None:
    queue = _queue(admin, partition_count=2)
    with sdk.get_queue_sender(queue) as sender:
        sender.send_messages(
            [ServiceBusMessage(f"m{i}", partition_key=f"k{i % 4}") for i in range(8)]
        )
    names = [f"m{i}" for i in range(8)]
    with sdk.get_queue_receiver(queue, max_wait_time=2, prefetch_count=5) as receiver:
        assert sorted(str(m) for m in receiver.peek_messages(20)) == names  # every partition
        got = list(receiver)  # iterates until max_wait_time passes without a message
        assert sorted(str(m) for m in got) == names
        receiver.defer_message(got[0])
        for m in got[1:]:
            receiver.complete_message(m)
        (deferred,) = receiver.receive_deferred_messages([got[0].sequence_number])
        assert str(deferred) == str(got[0])
        receiver.complete_message(deferred)


def test_paging_through_peeks_sees_every_partitions_messages_once(
    sdk: SdkClient, admin: ServiceBusAdministrationClient
) -> None:
    """The SDK pages by numbers: from 1, then one past the last it was shown. A partitioned
    queue's numbers carry their partition, and paging by them had shown one partition's
    messages only (7 of 24 on 4 partitions); the dead-letter sub-queue pages alike. A number
    of the SDK's own choosing still peeks from it."""
    queue = _queue(admin, partition_count=4)
    names = sorted(f"m{i}" for i in range(24))
    with sdk.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", partition_key=f"k{i}") for i in range(24)])
    with sdk.get_queue_receiver(queue, max_wait_time=2) as receiver:
        seen = []
        while page := receiver.peek_messages(5):
            seen += page
        assert sorted(str(m) for m in seen) == names
        assert len({m.sequence_number for m in seen}) == 24
        last = max(seen, key=lambda m: m.sequence_number)
        again = receiver.peek_messages(3, sequence_number=last.sequence_number)
        assert [m.sequence_number for m in again] == [last.sequence_number]
        got: list = []
        while len(got) < 24:
            batch = receiver.receive_messages(24, max_wait_time=5)
            assert batch, f"{len(got)} of 24 received"
            got += batch
        for m in got:
            receiver.dead_letter_message(m, reason="paged")
    with sdk.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        seen = []
        while page := dlq.peek_messages(7):
            seen += page
        assert sorted(str(m) for m in seen) == names


def test_batch_delete_messages_deletes_unreceived_and_answers_the_count(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, pooled_queue: str
) -> None:
    """``batch-delete-messages`` (the .NET SDK's ``DeleteMessagesAsync``; azure-servicebus for
    Python has no such call in its releases): a count and a cutoff, answered with how many
    went; a bad count is an argument error and deletes nothing."""
    from amqp_proton_management import management_call
    from proton import timestamp

    with client.get_queue_sender(pooled_queue) as sender:
        sender.send_messages(
            [raybus.ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(5)]
        )
    cutoff = timestamp(int((time.time() + 60) * 1000))
    answer = management_call(
        gateway.port,
        pooled_queue,
        "batch-delete-messages",
        {"message-count": 3, "enqueued-time-utc": cutoff},
    )
    assert (answer.status, answer.body) == (200, {"message-count": 3})
    bad = management_call(gateway.port, pooled_queue, "batch-delete-messages", {"message-count": 0})
    assert (bad.status, bad.condition) == (400, "com.microsoft:argument-error")
    with client.get_queue_receiver(pooled_queue) as receiver:
        assert [m.message_id for m in receiver.peek_messages(10)] == ["m3", "m4"]
