"""Batch delete on a real Ray cluster: ``delete_messages`` and ``purge_messages`` delete
messages without receiving them, across partitions, in dead-letter sub-queues and sessions
(that a delete stays done after a restart: ``test_durability.py``). One namespace for the
module; each test has its own queues."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

import raybus
from raybus import ServiceBusMessage, ServiceBusSubQueue, aio
from raybus.aio._batch_delete import MAX_DELETE_COUNT
from raybus.exceptions import InvalidArgumentError
from raybus.management import ServiceBusAdministrationClient


@pytest.fixture
def namespace(module_namespace: str) -> str:
    return module_namespace


@pytest.fixture
def queue(pooled_queue: str) -> str:
    return pooled_queue


def _active(admin: ServiceBusAdministrationClient, queue: str) -> int:
    return admin.get_queue_runtime_properties(queue).active_message_count


def test_a_partitioned_queue_loses_the_count_asked_then_all_but_the_locked_ones(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    name = f"q-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, partition_count=2, lock_duration=timedelta(seconds=30))
    with client.get_queue_sender(name) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", partition_key=f"k{i}") for i in range(40)])
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        locked = receiver.receive_messages(3, max_wait_time=5)
        assert locked
        assert receiver.delete_messages(10) == 10
        assert _active(admin, name) == 30
        assert receiver.purge_messages() == 30 - len(locked)
        assert _active(admin, name) == len(locked)  # locked: still there, still settleable
        for m in locked:
            receiver.complete_message(m)
        assert receiver.purge_messages() == 0
    assert _active(admin, name) == 0


def test_a_cutoff_keeps_what_was_enqueued_after_it(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, queue: str
) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(
            [ServiceBusMessage(f"old-{i}", message_id=f"old-{i}") for i in range(3)]
        )
        time.sleep(0.05)
        cutoff = datetime.now(timezone.utc)
        time.sleep(0.05)
        sender.send_messages([ServiceBusMessage("new", message_id="new")])
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        assert receiver.purge_messages(before_enqueued_time_utc=cutoff) == 3
        assert [m.message_id for m in receiver.peek_messages(10)] == ["new"]


async def test_a_subscriptions_dead_letter_sub_queue_is_purged_and_its_main_queue_kept(
    aclient: aio.ServiceBusClient, aadmin: aio.ServiceBusAdministrationClient
) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    await aadmin.create_topic(topic)
    await aadmin.create_subscription(topic, "s")
    async with aclient.get_topic_sender(topic) as sender:
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(6)])
    async with aclient.get_subscription_receiver(topic, "s", max_wait_time=5) as receiver:
        got = []
        while len(got) < 4:
            got += await receiver.receive_messages(4 - len(got), max_wait_time=5)
        for m in got:
            await receiver.dead_letter_message(m, reason="bad")
    async with aclient.get_subscription_receiver(
        topic, "s", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5
    ) as dlq:
        assert await dlq.purge_messages() == 4
        assert await dlq.peek_messages(10) == []
    props = await aadmin.get_subscription_runtime_properties(topic, "s")
    assert (props.active_message_count, props.dead_letter_message_count) == (2, 0)


def test_a_session_receiver_deletes_its_sessions_messages_and_a_plain_one_every_sessions(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    name = f"q-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, requires_session=True)
    with client.get_queue_sender(name) as sender:
        sender.send_messages([ServiceBusMessage(f"a{i}", session_id="a") for i in range(3)])
        sender.send_messages([ServiceBusMessage("b0", session_id="b")])
        sender.send_messages([ServiceBusMessage("c0", session_id="c")])
    with client.get_queue_receiver(name, session_id="a", max_wait_time=5) as receiver:
        assert receiver.purge_messages() == 3
    with client.get_queue_receiver(name, session_id="b", max_wait_time=5) as held:
        assert [str(m) for m in held.receive_messages(5, max_wait_time=2)] == ["b0"]
        with client.get_queue_receiver(name) as plain:  # every session's, not the locked b0
            assert plain.purge_messages() == 1
        assert [str(m) for m in held.peek_messages(5)] == ["b0"]


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda r: r.delete_messages(0), "max_message_count"),
        (lambda r: r.delete_messages("5"), "max_message_count"),
        (lambda r: r.purge_messages(before_enqueued_time_utc="yesterday"), "before_enqueued"),
        (lambda r: r.delete_messages(5, timeout=-1), "timeout"),
        (lambda r: r.purge_messages(timeout="soon"), "timeout"),
    ],
    ids=["zero", "str-count", "str-cutoff", "negative-timeout", "str-timeout"],
)
def test_bad_input_is_refused_by_name_and_deletes_nothing(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    queue: str,
    call: object,
    argument: str,
) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("kept"))
    with client.get_queue_receiver(queue) as receiver, pytest.raises(InvalidArgumentError) as err:
        call(receiver)  # type: ignore[operator]
    assert err.value.argument.startswith(argument)
    assert _active(admin, queue) == 1


def test_one_call_deletes_at_most_its_limit(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, queue: str
) -> None:
    with client.get_queue_sender(queue) as sender:
        for _ in range(5):
            sender.send_messages([ServiceBusMessage(b"x") for _ in range(1_000)])
    with client.get_queue_receiver(queue) as receiver:
        assert receiver.delete_messages(MAX_DELETE_COUNT + 500) == MAX_DELETE_COUNT
        assert receiver.purge_messages() == 5_000 - MAX_DELETE_COUNT
