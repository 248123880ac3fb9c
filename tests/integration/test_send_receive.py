"""Sending and receiving against a real local Ray cluster: what arrives, in which order, what is
refused (and that a refused send stores nothing), waiting receives, duplicate detection, entity
status, deletion and concurrency (sync and asyncio clients)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import raybus
from raybus import (
    EntityStatus,
    ServiceBusMessage,
    ServiceBusMessageBatch,
    ServiceBusMessageState,
    ServiceBusSubQueue,
    _connection,
    _rpc,
    _sync,
    aio,
)
from raybus._connection import ROUTE_TTL_S
from raybus._core.wire import send_args
from raybus.exceptions import (
    InvalidArgumentError,
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusQuotaExceededError,
)
from raybus.management import ServiceBusAdministrationClient


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    # Each test uses its own uniquely named queues; see ``module_namespace`` in conftest.
    return module_namespace


@pytest.fixture
def queue(pooled_queue: str) -> str:
    # A fresh default queue, started ahead of time; see ``QueuePool`` in conftest.
    return pooled_queue


@pytest.fixture(scope="module")
def idle_queue(module_namespace: str) -> str:
    """A queue that only argument-validation tests use: they must leave it empty. (It goes
    with the module's namespace.)"""
    name = f"idle-{uuid.uuid4().hex[:8]}"
    ServiceBusAdministrationClient(module_namespace).create_queue(name)
    return name


def _name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _active(admin: ServiceBusAdministrationClient, queue: str) -> int:
    return admin.get_queue_runtime_properties(queue).active_message_count


TEST_UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")
TEST_TIME = datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=timezone.utc)
ALL_PROPERTY_TYPES = {
    "int": -42,
    "big": 2**63 - 1,
    "float": 2.5,
    "str": "text ü",
    "bytes": b"\x00\xff",
    "bool": True,
    "none": None,
    "uuid": TEST_UUID,
    "datetime": TEST_TIME,
}


# ------------------------------------------------------------------------------ round trips


def test_sent_message_arrives_with_body_and_all_properties_intact(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    sent = ServiceBusMessage(
        "hello",
        application_properties=dict(ALL_PROPERTY_TYPES),
        message_id="id-1",
        correlation_id="corr-1",
        subject="greeting",
        content_type="text/plain",
        reply_to="replies",
        reply_to_session_id="reply-session",
        to="someone",
        partition_key="pk",
    )
    before = datetime.now(timezone.utc)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(sent)
    # Changing the caller's dict after sending must not change the stored message.
    sent.application_properties["int"] = 0  # type: ignore[index]
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        assert msg.body == "hello"
        assert str(msg) == "hello"
        assert msg.application_properties == ALL_PROPERTY_TYPES
        assert msg.message_id == "id-1"
        assert msg.correlation_id == "corr-1"
        assert msg.subject == "greeting"
        assert msg.content_type == "text/plain"
        assert msg.reply_to == "replies"
        assert msg.reply_to_session_id == "reply-session"
        assert msg.to == "someone"
        assert msg.partition_key == "pk"
        # Broker-assigned properties of a first peek-lock delivery.
        assert msg.sequence_number >= 1
        assert msg.enqueued_sequence_number == msg.sequence_number
        assert msg.delivery_count == 0
        assert msg.state is ServiceBusMessageState.ACTIVE
        assert msg.enqueued_time_utc is not None
        assert before - timedelta(seconds=5) <= msg.enqueued_time_utc
        assert msg.enqueued_time_utc <= datetime.now(timezone.utc) + timedelta(seconds=5)
        assert isinstance(msg.lock_token, str) and msg.lock_token
        assert msg.locked_until_utc is not None
        assert msg.locked_until_utc > datetime.now(timezone.utc)
        assert msg.expires_at_utc is None  # no time to live: never expires
        assert msg.time_to_live is None
        assert msg.dead_letter_reason is None
        receiver.complete_message(msg)


async def test_aio_bodies_of_every_amqp_type_arrive_in_send_order(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    bodies = [
        b"raw \x00 bytes",
        "text",
        123,
        4.5,
        None,
        True,
        TEST_UUID,
        TEST_TIME,
        [1, "two", b"3"],
        {"nested": {"list": [1, 2]}, "n": None},
    ]
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(b) for b in bodies])
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as receiver:
        got: list[raybus.ServiceBusReceivedMessage] = []
        while len(got) < len(bodies):
            batch = await receiver.receive_messages(len(bodies))
            assert batch, "messages went missing"
            got.extend(batch)
        assert [m.body for m in got] == bodies
        await receiver.complete_messages(got)


async def test_aio_received_bodies_read_as_sent_and_as_the_sdks_sections(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    """Through the broker: a bytes or str body is the value sent and also reads the way code
    written for the Azure SDK reads a data body; sent on again, it arrives as it was."""
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(b"\x00bin"), ServiceBusMessage("té")])
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as receiver:
        got = await receiver.receive_messages(2, max_wait_time=5)
        while len(got) < 2:
            more = await receiver.receive_messages(2, max_wait_time=5)
            assert more, "messages went missing"
            got.extend(more)
        data, text = (m.body for m in got)
        assert data == b"\x00bin" and isinstance(data, bytes)
        assert b"".join(data) == b"\x00bin" == next(data)
        assert text == "té" and str(got[1]) == "té"
        assert b"".join(text) == "té".encode()
        async with aclient.get_queue_sender(queue) as sender:
            await sender.send_messages(got)  # received messages sent on as they are
        await receiver.complete_messages(got)
        again = await receiver.receive_messages(2, max_wait_time=5)
        while len(again) < 2:
            more = await receiver.receive_messages(2, max_wait_time=5)
            assert more, "messages went missing"
            again.extend(more)
        assert [m.body for m in again] == [b"\x00bin", "té"]
        await receiver.complete_messages(again)


def test_list_is_received_in_order_with_sequence_numbers_increasing_by_one(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
        sender.send_messages(ServiceBusMessage("m5", message_id="same"))
        # Without duplicate detection a repeated message id is just another message.
        sender.send_messages([ServiceBusMessage("m6", message_id="same"), ServiceBusMessage("m7")])
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        first = receiver.receive_messages(max_message_count=3)
        assert 1 <= len(first) <= 3
        one = receiver.receive_messages(max_message_count=None)  # None means one
        assert len(one) == 1
        got = first + one
        while len(got) < 8:
            batch = receiver.receive_messages(max_message_count=8)
            assert batch, "messages went missing"
            got.extend(batch)
        receiver.complete_messages(got)
    assert [m.body for m in got] == [f"m{i}" for i in range(8)]
    seqs = [m.sequence_number for m in got]
    assert seqs == list(range(seqs[0], seqs[0] + 8))


def test_message_time_to_live_is_capped_at_the_queue_default(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, default_message_time_to_live=timedelta(minutes=1))
    with client.get_queue_sender(name) as sender:
        sender.send_messages(
            [
                ServiceBusMessage("long", time_to_live=timedelta(hours=1)),
                ServiceBusMessage("short", time_to_live=timedelta(seconds=30)),
                ServiceBusMessage("default"),
            ]
        )
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        got = []
        while len(got) < 3:
            got.extend(receiver.receive_messages(3))
        ttls = {m.body: m.time_to_live for m in got}
        assert ttls == {
            "long": timedelta(minutes=1),
            "short": timedelta(seconds=30),
            "default": timedelta(minutes=1),
        }
        for m in got:
            assert m.expires_at_utc == m.enqueued_time_utc + m.time_to_live  # type: ignore[operator]
        receiver.complete_messages(got)


# ------------------------------------------------------------------------------ batches


def test_batch_refuses_a_message_that_does_not_fit_and_stays_unchanged(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    with client.get_queue_sender(queue) as sender:
        batch = sender.create_message_batch(max_size_in_bytes=1000)
        assert isinstance(batch, ServiceBusMessageBatch)
        assert batch.max_size_in_bytes == 1000
        added = 0
        while True:
            size, count = batch.size_in_bytes, len(batch)
            msg = ServiceBusMessage(b"x" * 200, message_id=f"m{added}")
            try:
                batch.add_message(msg)
            except MessageSizeExceededError as exc:
                assert exc.max_size == 1000
                assert exc.size > 1000
                break
            added += 1
            assert len(batch) == added
            assert batch.size_in_bytes == size + msg.size_in_bytes
        assert added >= 2
        assert (batch.size_in_bytes, len(batch)) == (size, count)
        assert batch.size_in_bytes <= 1000
        sender.send_messages(batch)
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        got = []
        while len(got) < added:
            got.extend(receiver.receive_messages(added))
        assert [m.message_id for m in got] == [f"m{i}" for i in range(added)]
        receiver.complete_messages(got)


async def test_aio_batch_is_sent_as_a_whole_and_defaults_to_the_queue_message_limit(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    async with aclient.get_queue_sender(queue) as sender:
        batch = await sender.create_message_batch()
        assert batch.max_size_in_bytes == 256 * 1024
        for i in range(10):
            batch.add_message(ServiceBusMessage(f"b{i}"))
        with pytest.raises(MessageSizeExceededError):
            batch.add_message(ServiceBusMessage(b"x" * (256 * 1024)))
        assert len(batch) == 10
        await sender.send_messages(batch)
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as receiver:
        got: list[raybus.ServiceBusReceivedMessage] = []
        while len(got) < 10:
            got.extend(await receiver.receive_messages(10))
        assert [m.body for m in got] == [f"b{i}" for i in range(10)]
        await receiver.complete_messages(got)


@pytest.mark.parametrize("size", [0, -1, 256 * 1024 + 1])
async def test_aio_create_message_batch_outside_the_queue_limit_raises_invalid_argument(
    aclient: aio.ServiceBusClient, idle_queue: str, size: int
) -> None:
    async with aclient.get_queue_sender(idle_queue) as sender:
        with pytest.raises(InvalidArgumentError):
            await sender.create_message_batch(max_size_in_bytes=size)


# ------------------------------------------------------------------------------ size and quota


def test_list_with_one_message_over_the_queue_limit_raises_and_stores_nothing(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, max_message_size_in_kilobytes=1)
    small = ServiceBusMessage("small")
    big = ServiceBusMessage(b"x" * 2000)
    with client.get_queue_sender(name) as sender:
        with pytest.raises(MessageSizeExceededError) as info:
            sender.send_messages([small, big])
        assert info.value.max_size == 1024
        assert info.value.size > 1024
        with pytest.raises(MessageSizeExceededError):
            sender.send_messages(big)
        assert _active(admin, name) == 0
        # A batch from this sender is limited to the queue's size too.
        assert sender.create_message_batch().max_size_in_bytes == 1024
        sender.send_messages(small)
    assert _active(admin, name) == 1


def test_send_over_the_queue_quota_raises_and_stores_nothing_of_that_batch(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, max_size_in_megabytes=1)
    chunk = b"x" * 200_000
    with client.get_queue_sender(name) as sender:
        sender.send_messages([ServiceBusMessage(chunk) for _ in range(4)])  # ~800 kB of 1 MiB
        with pytest.raises(ServiceBusQuotaExceededError) as info:
            sender.send_messages([ServiceBusMessage(chunk) for _ in range(2)])
        assert info.value.max_size == 1024 * 1024
        assert _active(admin, name) == 4
        sender.send_messages(ServiceBusMessage("still fits"))
    assert _active(admin, name) == 5


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "properties",
    [{"list": [1, 2]}, {"dict": {"a": 1}}, {"set": {1}}, {1: "non-str key"}, {"big": 2**64}],
    ids=["list", "dict", "set", "int-key", "too-big-int"],
)
def test_message_with_non_primitive_application_property_raises_invalid_argument(
    properties: dict[object, object],
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ServiceBusMessage("x", application_properties=properties)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


def test_message_id_longer_than_128_characters_raises_invalid_argument() -> None:
    assert ServiceBusMessage("x", message_id="i" * 128).message_id == "i" * 128
    with pytest.raises(InvalidArgumentError) as info:
        ServiceBusMessage("x", message_id="i" * 129)
    assert info.value.argument == "message_id"


def test_message_changed_after_construction_is_validated_again_when_sent(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, idle_queue: str
) -> None:
    msg = ServiceBusMessage("x")
    msg.application_properties = {"list": [1]}
    with client.get_queue_sender(idle_queue) as sender, pytest.raises(InvalidArgumentError):
        sender.send_messages([ServiceBusMessage("fine"), msg])
    assert _active(admin, idle_queue) == 0


@pytest.mark.parametrize(
    "payload",
    ["a str", b"bytes", {"a": 1}, 42, [ServiceBusMessage("ok"), "not a message"]],
    ids=["str", "bytes", "dict", "int", "list-with-str"],
)
def test_send_of_something_other_than_messages_raises_invalid_argument(
    client: raybus.ServiceBusClient, idle_queue: str, payload: object
) -> None:
    with client.get_queue_sender(idle_queue) as sender, pytest.raises(InvalidArgumentError):
        sender.send_messages(payload)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_message_count": 0},
        {"max_message_count": -1},
        {"max_wait_time": 0},
        {"max_wait_time": -1},
    ],
    ids=["count-0", "count-neg", "wait-0", "wait-neg"],
)
def test_receive_with_non_positive_count_or_wait_raises_invalid_argument(
    client: raybus.ServiceBusClient, idle_queue: str, kwargs: dict[str, int]
) -> None:
    with client.get_queue_receiver(idle_queue) as receiver, pytest.raises(InvalidArgumentError):
        receiver.receive_messages(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_message_count": 0},
        {"max_message_count": -1},
        {"max_wait_time": 0},
        {"max_wait_time": -1},
    ],
    ids=["count-0", "count-neg", "wait-0", "wait-neg"],
)
async def test_aio_receive_with_non_positive_count_or_wait_raises_invalid_argument(
    aclient: aio.ServiceBusClient, idle_queue: str, kwargs: dict[str, int]
) -> None:
    async with aclient.get_queue_receiver(idle_queue) as receiver:
        with pytest.raises(InvalidArgumentError):
            await receiver.receive_messages(**kwargs)


def test_peek_of_zero_messages_raises_invalid_argument(
    client: raybus.ServiceBusClient, idle_queue: str
) -> None:
    with client.get_queue_receiver(idle_queue) as receiver:
        with pytest.raises(InvalidArgumentError):
            receiver.peek_messages(0)
        with pytest.raises(InvalidArgumentError):
            receiver.peek_messages(1, sequence_number=-1)


async def test_aio_peek_of_zero_messages_raises_invalid_argument(
    aclient: aio.ServiceBusClient, idle_queue: str
) -> None:
    async with aclient.get_queue_receiver(idle_queue) as receiver:
        with pytest.raises(InvalidArgumentError):
            await receiver.peek_messages(0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prefetch_count": -1},
        {"max_wait_time": 0},
        {"receive_mode": "bogus"},
        {"sub_queue": "bogus"},
    ],
    ids=["prefetch-neg", "wait-0", "mode", "sub-queue"],
)
def test_get_queue_receiver_with_bad_option_raises_invalid_argument(
    client: raybus.ServiceBusClient,
    aclient: aio.ServiceBusClient,
    idle_queue: str,
    kwargs: dict[str, object],
) -> None:
    with pytest.raises(InvalidArgumentError):
        client.get_queue_receiver(idle_queue, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        aclient.get_queue_receiver(idle_queue, **kwargs)


@pytest.mark.parametrize("bad_name", ["-bad", "a//b", "x" * 300])
def test_sender_or_receiver_for_an_invalid_queue_name_raises_invalid_argument(
    client: raybus.ServiceBusClient, bad_name: str
) -> None:
    with pytest.raises(InvalidArgumentError):
        client.get_queue_sender(bad_name)
    with pytest.raises(InvalidArgumentError):
        client.get_queue_receiver(bad_name)


# ------------------------------------------------------------------------------ unknown / deleted


def test_send_or_receive_on_an_unknown_queue_raises_not_found(
    client: raybus.ServiceBusClient,
) -> None:
    name = _name("missing")
    with client.get_queue_sender(name) as sender, pytest.raises(MessagingEntityNotFoundError):
        sender.send_messages(ServiceBusMessage("x"))
    with client.get_queue_receiver(name, max_wait_time=0.5) as receiver:
        with pytest.raises(MessagingEntityNotFoundError):
            receiver.receive_messages()
        with pytest.raises(MessagingEntityNotFoundError):
            receiver.peek_messages()


async def test_aio_send_or_receive_on_an_unknown_queue_raises_not_found(
    aclient: aio.ServiceBusClient,
) -> None:
    name = _name("missing")
    async with aclient.get_queue_sender(name) as sender:
        with pytest.raises(MessagingEntityNotFoundError):
            await sender.send_messages(ServiceBusMessage("x"))
    async with aclient.get_queue_receiver(name, max_wait_time=0.5) as receiver:
        with pytest.raises(MessagingEntityNotFoundError):
            await receiver.receive_messages()


def test_deleting_a_queue_makes_its_sender_and_receiver_raise_not_found(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name)
    with (
        client.get_queue_sender(name) as sender,
        client.get_queue_receiver(name, max_wait_time=0.5) as receiver,
    ):
        sender.send_messages(ServiceBusMessage("before"))
        assert receiver.peek_messages()[0].body == "before"
        admin.delete_queue(name)
        with pytest.raises(MessagingEntityNotFoundError):
            sender.send_messages(ServiceBusMessage("after"))
        with pytest.raises(MessagingEntityNotFoundError):
            receiver.receive_messages()
        # A queue created again under the name is a new, empty queue that the same sender
        # reaches.
        admin.create_queue(name)
        sender.send_messages(ServiceBusMessage("new"))
        (msg,) = receiver.receive_messages(max_wait_time=5)
        assert msg.body == "new"
        receiver.complete_message(msg)


async def test_a_receive_waiting_on_the_wait_an_idle_receiver_left_raises_when_the_queue_goes(
    admin: ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    """After two empty receives a receive waits on the wait they left at the partition, not
    on a long poll of its own (``receive_single``); deleting the queue wakes it to raise, as
    it wakes a long poll, and does not leave it to its 120 s."""
    name = _name()
    admin.create_queue(name)
    async with aclient.get_queue_receiver(name) as receiver:
        for _ in range(2):
            assert await receiver.receive_messages(max_wait_time=0.1) == []
        assert receiver._standing_waits.out_at(0)
        waiting = asyncio.ensure_future(receiver.receive_messages(max_wait_time=120))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await asyncio.to_thread(admin.delete_queue, name)
        with pytest.raises(MessagingEntityNotFoundError):
            await asyncio.wait_for(waiting, 30)


@contextlib.asynccontextmanager
async def _warm_pair(
    aclient: aio.ServiceBusClient, queue: str
) -> AsyncIterator[tuple[aio.ServiceBusSender, aio.ServiceBusReceiver]]:
    """A sender and a receiver of ``queue`` with both routes resolved (one message sent,
    received and completed)."""
    async with (
        aclient.get_queue_sender(queue) as sender,
        aclient.get_queue_receiver(queue) as receiver,
    ):
        await sender.send_messages(ServiceBusMessage("warm-up"))
        (warm,) = await receiver.receive_messages(max_wait_time=5)
        await receiver.complete_message(warm)
        yield sender, receiver


async def test_an_actor_of_a_deleted_queue_refuses_calls_before_it_is_gone(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    # ``ray.kill`` returns before the process is gone: deleting a queue first marks its
    # partitions deleted, so a sender holding the old handle cannot have a message accepted
    # meanwhile, and a receiver waiting there is woken to raise. Marked here without the kill,
    # which is the window a delete leaves.
    async with _warm_pair(aclient, queue) as (_sender, receiver):
        part = (await aclient._conn.registry.route.remote(queue)).partitions[0]
        waiting = asyncio.ensure_future(receiver.receive_messages(max_wait_time=120))
        await asyncio.sleep(0.5)
        await part.mark_deleted.remote()
        with pytest.raises(MessagingEntityNotFoundError):
            await asyncio.wait_for(waiting, 30)  # woken, not left to its 120 s
        # The registry still has the queue here, so the client would take the refusal for a
        # partition removed by a scale-down and try again: ask the actor itself.
        record = ServiceBusMessage("after")._to_record()
        with pytest.raises(MessagingEntityNotFoundError):
            await _rpc.call(queue, part.send_groups, *send_args([[record]]))
        with pytest.raises(MessagingEntityNotFoundError):
            await _rpc.call(queue, part.peek, 0, 10, False)


def test_closed_sender_refuses_to_send(client: raybus.ServiceBusClient, idle_queue: str) -> None:
    sender = client.get_queue_sender(idle_queue)
    sender.close()
    with pytest.raises(InvalidArgumentError):
        sender.send_messages(ServiceBusMessage("x"))


# ------------------------------------------------------------------------------ waiting


async def test_aio_receive_returns_as_soon_as_a_message_is_sent(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    async with _warm_pair(aclient, queue) as (sender, receiver):

        async def send_later() -> None:
            await asyncio.sleep(0.3)
            await sender.send_messages(ServiceBusMessage("wake up"))

        task = asyncio.ensure_future(send_later())
        started = time.monotonic()
        msgs = await receiver.receive_messages(max_wait_time=10)
        elapsed = time.monotonic() - started
        await task
        assert [m.body for m in msgs] == ["wake up"]
        assert elapsed < 5
        await receiver.complete_message(msgs[0])


def test_receive_on_an_empty_queue_returns_nothing_after_max_wait_time(
    client: raybus.ServiceBusClient, idle_queue: str
) -> None:
    with client.get_queue_receiver(idle_queue, max_wait_time=10) as receiver:
        assert receiver.receive_messages(max_wait_time=0.5) == []


async def test_aio_receive_on_an_empty_queue_returns_nothing_after_max_wait_time(
    aclient: aio.ServiceBusClient, idle_queue: str
) -> None:
    async with aclient.get_queue_receiver(idle_queue, max_wait_time=0.5) as receiver:
        assert await receiver.receive_messages() == []


async def test_aio_competing_receivers_waiting_on_a_partition_wake_one_at_a_time(
    aclient: aio.ServiceBusClient, queue: str, aeventually: Callable[..., Awaitable[None]]
) -> None:
    """Eight receivers wait on one partition (no prefetch: each receive waits there). A list
    of five reaches five of them at once, one message each: each woken receive that took all
    it asked for wakes the next in line (``raybus._core.wait_lines``); left to their own
    timeouts the others would wait 30 s. Then messages sent one at a time each reach exactly
    one receiver and wake about three (the one that takes it, the next in line, which finds
    nothing, and one more at the completion's flush), not all eight at each."""
    route = await aclient._conn.registry.route.remote(queue)
    partition = route.partitions[0]
    receivers = [aclient.get_queue_receiver(queue) for _ in range(8)]
    got: list[list[str]] = [[] for _ in receivers]
    wanted = 5 + 20
    done = asyncio.Event()
    listed = asyncio.Event()  # the list's five are in

    async def take(k: int) -> None:
        while not done.is_set():
            taken = await receivers[k].receive_messages(max_wait_time=30)
            got[k].extend(map(str, taken))
            # A receiver that took one of the list waits for the other four to be taken
            # before it settles and receives again. Otherwise a quick one could take two
            # while the wakes pass down the line (a new receive looks before it waits), and
            # its completion's flush would wake the next waiter itself: the wakes passed on
            # would go untested.
            await listed.wait()
            for m in taken:
                await receivers[k].complete_message(m)
            if sum(map(len, got)) == wanted:
                done.set()

    async def all_waiting() -> None:
        assert (await partition.stats.remote())["waiting"] == len(receivers)

    async def received(n: int) -> None:
        assert sum(map(len, got)) == n

    tasks = [asyncio.ensure_future(take(k)) for k in range(len(receivers))]
    try:
        async with aclient.get_queue_sender(queue) as sender:
            await aeventually(all_waiting)
            started = time.monotonic()
            await sender.send_messages([ServiceBusMessage(f"list{i}") for i in range(5)])
            await aeventually(lambda: received(5), timeout=10)
            assert time.monotonic() - started < 10
            assert sum(1 for g in got if g) == 5  # one each: max_message_count is 1
            listed.set()
            before = (await partition.stats.remote())["wakes"]
            for i in range(20):
                await aeventually(all_waiting)
                await sender.send_messages(ServiceBusMessage(f"one{i}"))
                await aeventually(lambda i=i: received(5 + i + 1))
            wakes = (await partition.stats.remote())["wakes"] - before
        await asyncio.wait_for(done.wait(), 10)
    finally:
        for t in tasks:
            t.cancel()  # some may wait for ``listed`` if an assertion failed
        for r in receivers:
            await r.close()
        await asyncio.gather(*tasks, return_exceptions=True)
    bodies = sorted(b for g in got for b in g)
    assert bodies == sorted([f"list{i}" for i in range(5)] + [f"one{i}" for i in range(20)])
    assert 20 <= wakes <= 4 * 20, wakes  # all eight woken at each change: 160 and more


async def test_aio_a_dead_letter_receiver_waiting_wakes_when_another_call_expires_a_message(
    aclient: aio.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    aeventually: Callable[..., Awaitable[None]],
) -> None:
    """A message expires into the dead-letter sub-queue while a dead-letter receive waits
    (nothing times its expiry). The next call that touches the partition (here a peek of
    the main queue) applies the expiry, and its flush wakes the waiting receive: it returns
    the message at once, not at its 30 s wait."""
    name = f"expiring-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, dead_lettering_on_message_expiration=True)
    partition = (await aclient._conn.registry.route.remote(name)).partitions[0]

    async def one_waiting() -> None:
        assert (await partition.stats.remote())["waiting"] == 1

    ttl = 3.0  # long enough for the receive to be waiting before it on a loaded machine
    async with aclient.get_queue_sender(name) as sender:
        sending = time.monotonic()
        await sender.send_messages(ServiceBusMessage("doomed", time_to_live=timedelta(seconds=ttl)))
        sent = time.monotonic()  # it expires between sending + ttl and sent + ttl
    dead = aclient.get_queue_receiver(name, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    waiting = asyncio.ensure_future(dead.receive_messages(max_wait_time=30))
    try:
        await aeventually(one_waiting, timeout=ttl)
        assert time.monotonic() - sending < ttl  # it waits from before the expiry
        await asyncio.sleep(sent + ttl + 0.5 - time.monotonic())  # expired by now
        assert not waiting.done()
        started = time.monotonic()
        async with aclient.get_queue_receiver(name) as main:
            assert await main.peek_messages(10) == []  # applies the expiry
        got = await asyncio.wait_for(waiting, 10)
        assert time.monotonic() - started < 10
        assert [str(m) for m in got] == ["doomed"]
        assert got[0].dead_letter_reason == "TTLExpiredException"
        await dead.complete_message(got[0])
    finally:
        waiting.cancel()
        await dead.close()


# ------------------------------------------------------------------------------ duplicate detection


def test_duplicate_detection_keeps_one_message_per_message_id(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, requires_duplicate_detection=True)
    with client.get_queue_sender(name) as sender:
        sender.send_messages(ServiceBusMessage("first", message_id="same"))
        sender.send_messages(ServiceBusMessage("second", message_id="same"))  # dropped silently
        sender.send_messages(
            [
                ServiceBusMessage("a", message_id="pair"),
                ServiceBusMessage("b", message_id="pair"),  # duplicate within one list
                ServiceBusMessage("no id"),
                ServiceBusMessage("no id"),  # no message id: never a duplicate
            ]
        )
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        got = []
        while len(got) < 4:
            got.extend(receiver.receive_messages(10))
        assert receiver.receive_messages(10, max_wait_time=0.3) == []
        assert [m.body for m in got] == ["first", "a", "no id", "no id"]
        receiver.complete_messages(got)


# ------------------------------------------------------------------------------ entity status


def test_entity_status_controls_sending_and_receiving_and_keeps_messages(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    def set_status(status: EntityStatus) -> None:
        admin.update_queue(admin.get_queue(queue), status=status)

    with (
        client.get_queue_sender(queue) as sender,
        client.get_queue_receiver(queue, max_wait_time=5) as receiver,
    ):
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])

        set_status(EntityStatus.SEND_DISABLED)
        with pytest.raises(MessagingEntityDisabledError) as info:
            sender.send_messages(ServiceBusMessage("refused"))
        assert info.value.status == "SendDisabled"
        assert info.value.retryable
        (m0,) = receiver.receive_messages()  # receiving still works
        assert m0.body == "m0"
        receiver.complete_messages([m0])

        set_status(EntityStatus.DISABLED)
        with pytest.raises(MessagingEntityDisabledError):
            sender.send_messages(ServiceBusMessage("refused"))
        with pytest.raises(MessagingEntityDisabledError):
            receiver.receive_messages()
        assert _active(admin, queue) == 2  # messages are kept

        set_status(EntityStatus.RECEIVE_DISABLED)
        sender.send_messages(ServiceBusMessage("m3"))
        with pytest.raises(MessagingEntityDisabledError):
            receiver.receive_messages()

        set_status(EntityStatus.ACTIVE)
        sender.send_messages(ServiceBusMessage("m4"))
        got = []
        while len(got) < 4:
            got.extend(receiver.receive_messages(10))
        assert [m.body for m in got] == ["m1", "m2", "m3", "m4"]
        receiver.complete_messages(got)


async def test_aio_send_to_a_send_disabled_queue_raises_disabled(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient, queue: str
) -> None:
    await aadmin.update_queue(await aadmin.get_queue(queue), status=EntityStatus.SEND_DISABLED)
    async with aclient.get_queue_sender(queue) as sender:
        with pytest.raises(MessagingEntityDisabledError):
            await sender.send_messages(ServiceBusMessage("refused"))
    await aadmin.update_queue(await aadmin.get_queue(queue), status=EntityStatus.ACTIVE)
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("accepted"))
    assert (await aadmin.get_queue_runtime_properties(queue)).active_message_count == 1


# ------------------------------------------------------------------------------ concurrency


async def test_aio_concurrent_senders_deliver_every_message_exactly_once_in_order(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    senders, per_sender = 32, 20

    async def produce(i: int) -> None:
        async with aclient.get_queue_sender(queue) as sender:
            for j in range(per_sender):
                await sender.send_messages(ServiceBusMessage(f"{i}:{j}", message_id=f"{i}:{j}"))

    await asyncio.gather(*(produce(i) for i in range(senders)))

    got: list[raybus.ServiceBusReceivedMessage] = []
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as receiver:
        while len(got) < senders * per_sender:
            batch = await receiver.receive_messages(200)
            assert batch, f"only {len(got)} messages arrived"
            await receiver.complete_messages(batch)
            got.extend(batch)
        assert await receiver.receive_messages(max_wait_time=0.3) == []
    counts = Counter(m.body for m in got)
    assert set(counts) == {f"{i}:{j}" for i in range(senders) for j in range(per_sender)}
    assert set(counts.values()) == {1}
    # Each sender awaited its sends one by one, so its messages are in its order.
    for i in range(senders):
        mine = [int(m.body.split(":")[1]) for m in got if m.body.startswith(f"{i}:")]
        assert mine == list(range(per_sender))


async def test_aio_sends_started_without_awaiting_are_each_stored_once(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    """One sender's sends started one after another without awaiting each (the latency
    benchmark's open loop) go two calls at a time (``raybus._connection.SENDS_IN_FLIGHT``):
    each is answered with its own number, and each message is stored once. Their order is
    not promised (nor was it with one call at a time: a send waits for its route first)."""
    n = 300
    async with aclient.get_queue_sender(queue) as sender:
        sends = []
        for i in range(n):
            sends.append(asyncio.ensure_future(sender.send_messages(ServiceBusMessage(f"{i}"))))
            if i % 7 == 0:
                await asyncio.sleep(0)  # let calls go out between the sends, as a paced loop
        await asyncio.gather(*sends)
    got: list[raybus.ServiceBusReceivedMessage] = []
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as receiver:
        while len(got) < n:
            batch = await receiver.receive_messages(200)
            assert batch, f"only {len(got)} messages arrived"
            await receiver.complete_messages(batch)
            got.extend(batch)
        assert await receiver.receive_messages(max_wait_time=0.3) == []
    assert sorted(int(str(m)) for m in got) == list(range(n))
    assert len({m.sequence_number for m in got}) == n


# ------------------------------------------------------------------------------ iteration


def test_sync_receiver_iteration_yields_every_message_then_stops(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
    bodies = []
    with client.get_queue_receiver(queue, max_wait_time=1) as receiver:
        for msg in receiver:
            bodies.append(msg.body)
            receiver.complete_message(msg)
    assert bodies == [f"m{i}" for i in range(5)]


async def test_aio_receiver_iteration_yields_every_message_then_stops(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
    bodies = []
    async with aclient.get_queue_receiver(queue, max_wait_time=1, prefetch_count=2) as receiver:
        async for msg in receiver:
            bodies.append(msg.body)
            await receiver.complete_message(msg)
    assert bodies == [f"m{i}" for i in range(5)]


def test_leaving_an_iteration_early_loses_no_prefetched_message(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    """Receive-and-delete with prefetch: the broker has handed over (and deleted) up to
    ``prefetch_count`` messages when the loop takes its first. Those the loop has not reached
    stay in the receiver, for the next loop, ``next()`` or receive, as in the SDK (where the
    receiver is its own iterator)."""
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(6)])
    with client.get_queue_receiver(
        queue, receive_mode="receiveanddelete", prefetch_count=10, max_wait_time=1
    ) as receiver:
        assert iter(receiver) is receiver
        bodies = []
        for msg in receiver:
            bodies.append(msg.body)
            break
        bodies.append(next(receiver).body)
        bodies.append(receiver.next().body)  # the SDK's alias
        bodies += [m.body for m in receiver.receive_messages(1)]
        bodies += [m.body for m in receiver]  # a new loop goes on where the last stopped
        with pytest.raises(StopIteration):  # none within max_wait_time
            next(receiver)
    assert bodies == [f"m{i}" for i in range(6)]


async def test_aio_leaving_an_iteration_early_loses_no_prefetched_message(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(4)])
    bodies = []
    async with aclient.get_queue_receiver(
        queue, receive_mode="receiveanddelete", prefetch_count=10, max_wait_time=1
    ) as receiver:
        async for msg in receiver:
            bodies.append(msg.body)
            break
        bodies += [m.body for m in await receiver.receive_messages(1)]
        async for msg in receiver:
            bodies.append(msg.body)
    assert bodies == [f"m{i}" for i in range(4)]


def test_sync_empty_receive_leaves_no_wait_at_a_route_gone_stale(
    client: raybus.ServiceBusClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync API's receive that found nothing on its own thread leaves its wait on the
    loop (``_leave_wait``) at the partitions of the cached route; a route gone stale by then
    leaves none (the next receive, on the loop, checks the route and leaves one)."""
    receiver = client.get_queue_receiver(queue)
    inner = receiver._aio

    async def leave() -> bool:
        inner._leave_wait()
        return bool(inner._standing_waits.out_at(0))

    assert receiver.receive_messages(5, max_wait_time=0.2) == []  # resolves the route
    assert not inner._standing_waits.out_at(0)  # one empty receive leaves none
    monkeypatch.setattr(_connection, "ROUTE_TTL_S", 0.0)  # every route is stale
    assert _sync.run(leave()) is False
    # Fresh again (not ROUTE_TTL_S, which a pause of 0.8 s since the fetch would pass).
    monkeypatch.setattr(_connection, "ROUTE_TTL_S", 60.0)
    assert _sync.run(leave()) is True
    receiver.close()
    assert not inner._standing_waits.out_at(0)  # close gave it up


@pytest.mark.parametrize("api", ["aio", "sync"])
async def test_idle_receives_without_prefetch_make_no_partition_calls_and_a_send_still_arrives(
    aclient: aio.ServiceBusClient,
    client: raybus.ServiceBusClient,
    queue: str,
    api: str,
    monkeypatch: pytest.MonkeyPatch,
    aeventually: Callable[..., Awaitable[None]],
) -> None:
    """The second receive in a row that found nothing by its deadline leaves a wait at the
    partition (it locks nothing); the next short receives wait on it and make no call,
    across the checks of the route; a message sent then arrives, with one receive call
    (``receive_single``). The sync API's receive, which otherwise calls from its own
    thread, waits on the loop then."""
    calls: Counter[str] = Counter()
    call, call_sync = _rpc.call, _rpc.call_sync

    async def counting(entity: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        calls[str(getattr(method, "_method_name", method))] += 1
        return await call(entity, method, *args, **kwargs)

    def counting_sync(entity: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        calls[str(getattr(method, "_method_name", method))] += 1
        return call_sync(entity, method, *args, **kwargs)

    sync = api == "sync"
    receiver: Any = (client if sync else aclient).get_queue_receiver(queue)

    async def receive(wait: float) -> list[raybus.ServiceBusReceivedMessage]:
        if sync:
            return await asyncio.to_thread(receiver.receive_messages, 5, wait)
        got: list[raybus.ServiceBusReceivedMessage] = await receiver.receive_messages(5, wait)
        return got

    inner = receiver._aio if sync else receiver
    assert await receive(0.2) == []
    assert not inner._standing_waits.out_at(0)  # one empty receive leaves none
    assert await receive(0.2) == []

    async def left() -> None:  # the sync API leaves its wait through the loop
        assert inner._standing_waits.out_at(0)

    await aeventually(left)
    monkeypatch.setattr(_rpc, "call", counting)
    monkeypatch.setattr(_rpc, "call_sync", counting_sync)
    started = time.monotonic()
    while time.monotonic() - started < 2.5 * ROUTE_TTL_S:
        assert await receive(0.1) == []
    assert calls["receive"] == 0, calls
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("wake"))
    got = await receive(5)
    assert [str(m.body) for m in got] == ["wake"]
    assert calls["receive"] == 1, calls
    if sync:
        await asyncio.to_thread(receiver.complete_message, got[0])
        await asyncio.to_thread(receiver.close)
    else:
        await receiver.complete_message(got[0])
        await receiver.close()
