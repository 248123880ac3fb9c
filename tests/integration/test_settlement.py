"""Settlement, locks and time against a real local Ray cluster: complete, abandon, defer,
dead-letter, peek, lock expiry and renewal, receive modes, competing receivers, prefetch,
fast-settlement failure reporting, scheduling, time to live and automatic lock renewal (sync
and asyncio clients).

Time-dependent behaviour uses short real durations (locks of 0.5-1 s, time to live 0.3 s,
schedules 1 s ahead) and generous waits; nothing asserts speed except that a waiting receive
is woken well before its timeout.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import raybus
from raybus import (
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
    aio,
)
from raybus._core.partition import RELEASE, SettleOp
from raybus._sync import run
from raybus.exceptions import (
    AutoLockRenewFailed,
    AutoLockRenewTimeout,
    InvalidArgumentError,
    MessageAlreadySettled,
    MessageLockLostError,
    MessageNotFoundError,
    SettlementFailedError,
)
from raybus.management import ServiceBusAdministrationClient

DLQ = ServiceBusSubQueue.DEAD_LETTER
RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    # Each test uses its own uniquely named queues; see ``module_namespace`` in conftest.
    return module_namespace


@pytest.fixture
def queue(pooled_queue: str) -> str:
    # A fresh default queue, started ahead of time; see ``QueuePool`` in conftest.
    return pooled_queue


def _name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _runtime(admin: ServiceBusAdministrationClient, queue: str) -> tuple[int, int, int]:
    """(active, dead-letter, scheduled) counts."""
    r = admin.get_queue_runtime_properties(queue)
    return r.active_message_count, r.dead_letter_message_count, r.scheduled_message_count


def _send(client: raybus.ServiceBusClient, queue: str, *bodies: Any, **kwargs: Any) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(b, **kwargs) for b in bodies])


async def _asend(aclient: aio.ServiceBusClient, queue: str, *bodies: Any) -> None:
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(b) for b in bodies])


def _receive_n(
    receiver: raybus.ServiceBusReceiver, n: int, max_wait_time: float = 5
) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    while len(got) < n:
        batch = receiver.receive_messages(n - len(got), max_wait_time=max_wait_time)
        assert batch, f"only {len(got)} of {n} messages arrived"
        got.extend(batch)
    return got


async def _areceive_n(
    receiver: aio.ServiceBusReceiver, n: int, max_wait_time: float = 5
) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    while len(got) < n:
        batch = await receiver.receive_messages(n - len(got), max_wait_time=max_wait_time)
        assert batch, f"only {len(got)} of {n} messages arrived"
        got.extend(batch)
    return got


async def _lose_lock(receiver: aio.ServiceBusReceiver, msg: ServiceBusReceivedMessage) -> None:
    """Make the broker drop ``msg``'s lock behind the receiver's back (as an actor restart
    would): release it through the receiver's internal actor call. The message is available
    again and the receiver still believes its lock is valid."""
    op: Any = SettleOp(RELEASE, msg.lock_token or "")
    if hasattr(op, "to_wire"):  # the wire form, where the actor takes one
        op = op.to_wire()
    (error,) = await receiver._call("settle", [op])
    assert error is None


# ------------------------------------------------------------------------------ complete / abandon


def test_complete_removes_the_message(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, "done")
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        receiver.complete_message(msg)
        assert receiver.receive_messages(max_wait_time=0.5) == []
    assert _runtime(admin, queue) == (0, 0, 0)


def test_abandon_redelivers_the_message_with_delivery_count_incremented(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, "again")
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (first,) = receiver.receive_messages()
        assert first.delivery_count == 0
        receiver.abandon_message(first)
        (second,) = receiver.receive_messages()
        assert second.sequence_number == first.sequence_number
        assert second.delivery_count == 1
        assert second.lock_token != first.lock_token
        receiver.abandon_message(second)
        (third,) = receiver.receive_messages()
        assert third.delivery_count == 2
        receiver.complete_message(third)


async def test_aio_abandon_redelivers_and_complete_removes_the_message_for_good(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient, queue: str
) -> None:
    await _asend(aclient, queue, "again")
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (first,) = await receiver.receive_messages()
        await receiver.abandon_message(first)
        (second,) = await receiver.receive_messages()
        assert (second.sequence_number, second.delivery_count) == (first.sequence_number, 1)
        await receiver.complete_message(second)
        assert await receiver.receive_messages(max_wait_time=0.5) == []
        with pytest.raises(MessageAlreadySettled) as info:
            await receiver.complete_message(second)
        assert isinstance(info.value, ValueError)
        with pytest.raises(MessageAlreadySettled):
            await receiver.abandon_message(second)
    assert (await aadmin.get_queue_runtime_properties(queue)).active_message_count == 0


def test_abandon_and_defer_merge_properties_to_modify_into_application_properties(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, "props", application_properties={"a": 1, "b": 2})
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        with pytest.raises(InvalidArgumentError):  # not an AMQP primitive: nothing settled
            receiver.abandon_message(msg, properties_to_modify={"bad": [1, 2]})
        receiver.abandon_message(msg, properties_to_modify={"b": 3, "c": "new"})
        (again,) = receiver.receive_messages()
        assert again.delivery_count == 1
        assert again.application_properties == {"a": 1, "b": 3, "c": "new"}
        receiver.defer_message(again, properties_to_modify={"deferred": True})
        (deferred,) = receiver.receive_deferred_messages([again.sequence_number])
        assert deferred.application_properties == {"a": 1, "b": 3, "c": "new", "deferred": True}
        receiver.complete_message(deferred)


def test_message_abandoned_max_delivery_count_times_is_dead_lettered(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, max_delivery_count=2)
    _send(client, name, "poison")
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        for expected_count in (0, 1):
            (msg,) = receiver.receive_messages()
            assert msg.delivery_count == expected_count
            receiver.abandon_message(msg)
        assert receiver.receive_messages(max_wait_time=0.5) == []
    assert _runtime(admin, name) == (0, 1, 0)
    with client.get_queue_receiver(name, sub_queue=DLQ, max_wait_time=5) as dlq:
        (dead,) = dlq.receive_messages()
        assert dead.body == "poison"
        assert dead.sequence_number == msg.sequence_number
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert dead.dead_letter_error_description
        dlq.complete_message(dead)
    assert _runtime(admin, name) == (0, 0, 0)


# ------------------------------------------------------------------------------ dead-letter


def test_dead_letter_message_moves_it_to_the_dead_letter_queue_with_reason_and_description(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, "bad", application_properties={"k": 1})
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        receiver.dead_letter_message(
            msg,
            reason="Invalid",
            error_description="field x missing",
            properties_to_modify={"checked": True},
        )
        assert receiver.receive_messages(max_wait_time=0.3) == []
    assert _runtime(admin, queue) == (0, 1, 0)
    # The sub-queue may be named by its string value too.
    with client.get_queue_receiver(queue, sub_queue="deadletter", max_wait_time=5) as dlq:
        (peeked,) = dlq.peek_messages()
        assert peeked.dead_letter_reason == "Invalid"
        (dead,) = dlq.receive_messages()
        assert dead.body == "bad"
        assert dead.dead_letter_reason == "Invalid"
        assert dead.dead_letter_error_description == "field x missing"
        assert dead.application_properties == {"k": 1, "checked": True}
        dlq.complete_message(dead)
    assert _runtime(admin, queue) == (0, 0, 0)


async def test_aio_deferred_message_is_fetched_by_sequence_number_then_dead_lettered(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    await _asend(aclient, queue, "later")
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (msg,) = await receiver.receive_messages()
        await receiver.defer_message(msg)
        assert await receiver.receive_messages(max_wait_time=0.5) == []
        (deferred,) = await receiver.receive_deferred_messages(msg.sequence_number)
        assert deferred.body == "later"
        await receiver.dead_letter_message(deferred, reason="R", error_description="D")
    async with aclient.get_queue_receiver(queue, sub_queue=DLQ, max_wait_time=5) as dlq:
        (dead,) = await dlq.receive_messages()
        assert (dead.body, dead.sequence_number) == ("later", msg.sequence_number)
        assert (dead.dead_letter_reason, dead.dead_letter_error_description) == ("R", "D")
        await dlq.complete_message(dead)
    async with aclient.get_queue_receiver(queue) as receiver:
        with pytest.raises(MessageNotFoundError):
            await receiver.receive_deferred_messages([msg.sequence_number])


def test_dead_lettering_a_message_of_the_dead_letter_queue_is_refused_and_keeps_it(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, "bad")
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        receiver.dead_letter_message(msg, reason="first")
    dlq = client.get_queue_receiver(queue, sub_queue=DLQ, max_wait_time=5)
    (dead,) = dlq.receive_messages()
    # The refusal may come at once or, for a settlement sent without waiting, from close().
    with pytest.raises((InvalidArgumentError, SettlementFailedError)):
        dlq.dead_letter_message(dead, reason="second")
        dlq.close()
    dlq.close()
    assert _runtime(admin, queue)[1] == 1


# ------------------------------------------------------------------------------ defer


def test_deferred_message_is_received_only_by_sequence_number(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, "later", "active")
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        msg, active = _receive_n(receiver, 2)
        seq = msg.sequence_number
        receiver.defer_message(msg)
        receiver.complete_message(active)
        assert receiver.receive_messages(max_wait_time=0.5) == []

        unknown = seq + 1000
        with pytest.raises(MessageNotFoundError) as info:
            receiver.receive_deferred_messages([seq, unknown])
        assert info.value.sequence_numbers == [unknown]
        # A message that is not deferred cannot be fetched by sequence number either.
        with pytest.raises(MessageNotFoundError):
            receiver.receive_deferred_messages([active.sequence_number])

        # All or none: the deferred message was not taken by the refused calls.
        (deferred,) = receiver.receive_deferred_messages([seq])
        assert deferred.body == "later"
        assert deferred.sequence_number == seq
        assert deferred.lock_token
        receiver.complete_message(deferred)
    assert _runtime(admin, queue) == (0, 0, 0)


# ------------------------------------------------------------------------------ peek


def test_peek_shows_locked_deferred_and_scheduled_messages_with_their_state(
    client: raybus.ServiceBusClient, queue: str, eventually: Callable[..., None]
) -> None:
    _send(client, queue, "deferred", "locked", "waiting")
    with client.get_queue_sender(queue) as sender:
        sender.schedule_messages(
            ServiceBusMessage("scheduled"), datetime.now(timezone.utc) + timedelta(hours=1)
        )
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        deferred, locked = _receive_n(receiver, 2)
        receiver.defer_message(deferred)
        start = deferred.sequence_number

        def states() -> None:
            peeked = receiver.peek_messages(10, sequence_number=start)
            assert [(m.body, m.state) for m in peeked] == [
                ("deferred", ServiceBusMessageState.DEFERRED),
                ("locked", ServiceBusMessageState.ACTIVE),
                ("waiting", ServiceBusMessageState.ACTIVE),
                ("scheduled", ServiceBusMessageState.SCHEDULED),
            ]
            assert peeked[3].scheduled_enqueue_time_utc is not None

        eventually(states)
        receiver.complete_message(locked)


def test_peek_continues_after_the_last_peeked_message_or_from_a_given_sequence_number(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, *[f"m{i}" for i in range(5)])
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        first = receiver.peek_messages(2)
        assert [m.body for m in first] == ["m0", "m1"]
        for m in first:
            assert m.lock_token is None
            assert m.locked_until_utc is None
            assert m.state is ServiceBusMessageState.ACTIVE
        assert [m.body for m in receiver.peek_messages(2)] == ["m2", "m3"]
        assert [m.body for m in receiver.peek_messages(2)] == ["m4"]
        assert receiver.peek_messages(2) == []
        from_m1 = receiver.peek_messages(3, sequence_number=first[1].sequence_number)
        assert [m.body for m in from_m1] == ["m1", "m2", "m3"]
        assert [m.body for m in receiver.peek_messages(5)] == ["m4"]  # on from there

        # Peeking locked nothing: every message is received, on its first delivery.
        got = _receive_n(receiver, 5)
        assert [m.body for m in got] == [f"m{i}" for i in range(5)]
        assert [m.delivery_count for m in got] == [0] * 5
        receiver.complete_messages(got)


async def test_aio_peek_does_not_lock_and_continues_where_it_stopped(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    await _asend(aclient, queue, "m0", "m1", "m2")
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as receiver:
        assert [m.body for m in await receiver.peek_messages(2)] == ["m0", "m1"]
        assert [m.body for m in await receiver.peek_messages(2)] == ["m2"]
        got = await _areceive_n(receiver, 3)
        assert [m.body for m in got] == ["m0", "m1", "m2"]
        await receiver.complete_messages(got)


# ------------------------------------------------------------------------------ already settled


def test_settling_a_message_twice_raises_message_already_settled(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    methods = ("complete", "abandon", "defer", "dead_letter")
    _send(client, queue, *methods)
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        got = _receive_n(receiver, len(methods))
        for msg in got:  # each message settled once, its own way
            getattr(receiver, f"{msg.body}_message")(msg)
        for msg in got:
            for second in methods:
                with pytest.raises(MessageAlreadySettled):
                    getattr(receiver, f"{second}_message")(msg)
            with pytest.raises(MessageAlreadySettled):
                receiver.complete_messages([msg])
            with pytest.raises(MessageAlreadySettled):
                receiver.renew_message_lock(msg)


def test_settling_a_peeked_or_receive_and_delete_message_raises_message_already_settled(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, "m0", "m1")
    with client.get_queue_receiver(queue) as peeker:
        (peeked,) = peeker.peek_messages()
        for method in ("complete", "abandon", "defer", "dead_letter"):
            with pytest.raises(MessageAlreadySettled):
                getattr(peeker, f"{method}_message")(peeked)
        with pytest.raises(MessageAlreadySettled):
            peeker.renew_message_lock(peeked)
    with client.get_queue_receiver(queue, receive_mode=RAD, max_wait_time=5) as receiver:
        (deleted,) = receiver.receive_messages()
        assert deleted.lock_token is None
        assert deleted.locked_until_utc is None
        for method in ("complete", "abandon", "defer", "dead_letter"):
            with pytest.raises(MessageAlreadySettled):
                getattr(receiver, f"{method}_message")(deleted)


# ------------------------------------------------------------------------ lock expiry / renewal


def test_expired_lock_redelivers_the_message_and_the_old_lock_cannot_settle(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, lock_duration=timedelta(seconds=0.5))
    _send(client, name, "slow")
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        (old,) = receiver.receive_messages()
        time.sleep(0.8)
        (new,) = receiver.receive_messages()
        assert new.sequence_number == old.sequence_number
        assert new.delivery_count == 1
        with pytest.raises(MessageLockLostError) as info:
            receiver.complete_message(old)
        assert info.value.sequence_number == old.sequence_number
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock(old)
        receiver.complete_message(new)
    assert _runtime(admin, name) == (0, 0, 0)


async def test_aio_waiting_receiver_gets_a_message_whose_lock_expired(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    name = _name()
    await aadmin.create_queue(name, lock_duration=timedelta(seconds=0.5))
    await _asend(aclient, name, "slow")
    async with aclient.get_queue_receiver(name, max_wait_time=5) as receiver:
        (old,) = await receiver.receive_messages()
        # Waits for the lock to run out (no message is available before that).
        (new,) = await receiver.receive_messages(max_wait_time=10)
        assert (new.sequence_number, new.delivery_count) == (old.sequence_number, 1)
        with pytest.raises(MessageLockLostError):
            await receiver.complete_message(old)
        await receiver.complete_message(new)


def test_renew_message_lock_extends_the_lock_past_its_original_expiry(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, lock_duration=timedelta(seconds=1))
    _send(client, name, "long job")
    with (
        client.get_queue_receiver(name, max_wait_time=5) as receiver,
        client.get_queue_receiver(name) as other,
    ):
        (msg,) = receiver.receive_messages()
        original = msg.locked_until_utc
        assert original is not None
        previous = original
        for _ in range(4):  # 1.6 s in all, well past the original 1 s lock
            time.sleep(0.4)
            renewed = receiver.renew_message_lock(msg)
            assert renewed > previous
            assert msg.locked_until_utc == renewed
            previous = renewed
        assert datetime.now(timezone.utc) > original
        assert other.receive_messages(max_wait_time=0.2) == []
        assert msg.delivery_count == 0
        receiver.complete_message(msg)
    assert _runtime(admin, name) == (0, 0, 0)


async def test_aio_renew_message_lock_extends_the_lock_past_its_original_expiry(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    name = _name()
    await aadmin.create_queue(name, lock_duration=timedelta(seconds=1))
    await _asend(aclient, name, "long job")
    async with aclient.get_queue_receiver(name, max_wait_time=5) as receiver:
        (msg,) = await receiver.receive_messages()
        original = msg.locked_until_utc
        assert original is not None
        for _ in range(4):
            await asyncio.sleep(0.4)
            renewed = await receiver.renew_message_lock(msg)
            assert renewed > original
        async with aclient.get_queue_receiver(name) as other:
            assert await other.receive_messages(max_wait_time=0.2) == []
        await receiver.complete_message(msg)


# ------------------------------------------------------------------------------ batch completion


def test_complete_messages_completes_every_message_at_once(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, *range(25))
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        got = _receive_n(receiver, 25)
        receiver.complete_messages(got)
        assert _runtime(admin, queue) == (0, 0, 0)  # complete_messages waits for the broker
        with pytest.raises(MessageAlreadySettled):
            receiver.complete_message(got[0])


async def test_aio_complete_messages_reports_only_the_refused_messages(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient, queue: str
) -> None:
    await _asend(aclient, queue, "a", "b", "c")
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as receiver:
        a, b, c = await _areceive_n(receiver, 3)
        await _lose_lock(receiver, b)
        with pytest.raises(SettlementFailedError) as info:
            await receiver.complete_messages([a, b, c])
        assert [f[0] for f in info.value.failures] == [b.sequence_number]
        # a and c are gone; b is back in the queue.
        assert (await aadmin.get_queue_runtime_properties(queue)).active_message_count == 1
        (again,) = await receiver.receive_messages()
        assert again.sequence_number == b.sequence_number
        await receiver.complete_messages([again])


# ------------------------------------------------------------------------------ receive and delete


def test_receive_and_delete_removes_messages_when_received(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, "m0", "m1", "m2")
    # The mode may be given by its string value too.
    with client.get_queue_receiver(
        queue, receive_mode="receiveanddelete", max_wait_time=5
    ) as receiver:
        got = _receive_n(receiver, 3)
        assert all(m.lock_token is None for m in got)
        assert [m.body for m in got] == ["m0", "m1", "m2"]
        assert _runtime(admin, queue) == (0, 0, 0)
        assert receiver.receive_messages(max_wait_time=0.3) == []


# ------------------------------------------------------------------------------ competing receivers


async def test_aio_competing_receivers_get_each_message_exactly_once(
    namespace: str, aclient: aio.ServiceBusClient, queue: str
) -> None:
    total = 200
    async with aclient.get_queue_sender(queue) as sender:
        for start in range(0, total, 50):
            await sender.send_messages(
                [ServiceBusMessage(i, message_id=str(i)) for i in range(start, start + 50)]
            )

    async def consume(receiver: aio.ServiceBusReceiver) -> list[int]:
        mine: list[int] = []
        async with receiver:
            while True:
                batch = await receiver.receive_messages(10, max_wait_time=1)
                if not batch:
                    return mine
                for msg in batch:
                    assert msg.delivery_count == 0
                await receiver.complete_messages(batch)
                mine.extend(m.body for m in batch)

    # Separate clients, as separate consumer applications would have.
    clients = [aio.ServiceBusClient(namespace) for _ in range(4)]
    results = await asyncio.gather(*(consume(c.get_queue_receiver(queue)) for c in clients))
    for c in clients:
        await c.close()
    everything = [body for mine in results for body in mine]
    assert len(everything) == total
    assert sorted(everything) == list(range(total))


# ------------------------------------------------------------------------------ prefetch


async def test_aio_closing_a_prefetching_receiver_releases_its_prefetched_messages_at_once(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    await _asend(aclient, queue, *[f"m{i}" for i in range(10)])
    prefetcher = aclient.get_queue_receiver(queue, prefetch_count=10, max_wait_time=5)
    (first,) = await prefetcher.receive_messages(1)
    assert first.body == "m0"
    async with aclient.get_queue_receiver(queue) as other:
        # The prefetched messages are locked for the prefetching receiver (a one-minute lock).
        assert await other.receive_messages(10, max_wait_time=0.3) == []
        await prefetcher.close()
        started = time.monotonic()
        got = await _areceive_n(other, 9)
        assert time.monotonic() - started < 5
        assert [m.body for m in got] == [f"m{i}" for i in range(1, 10)]
        assert [m.delivery_count for m in got] == [0] * 9
        await other.complete_messages(got)


def test_prefetched_messages_are_served_from_the_buffer_and_released_on_close(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, *[f"m{i}" for i in range(5)])
    with client.get_queue_receiver(queue, prefetch_count=5, max_wait_time=5) as prefetcher:
        (m0,) = prefetcher.receive_messages(1)
        m1, m2 = prefetcher.receive_messages(2)
        assert [m.body for m in (m0, m1, m2)] == ["m0", "m1", "m2"]
        prefetcher.complete_messages([m0, m1, m2])
    with client.get_queue_receiver(queue, max_wait_time=5) as other:
        got = _receive_n(other, 2)
        assert [(m.body, m.delivery_count) for m in got] == [("m3", 0), ("m4", 0)]
        other.complete_messages(got)


# --------------------------------------------------------------------- fast-settlement failures


async def test_aio_refused_fast_settlement_is_raised_by_the_next_receiver_call(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient, queue: str
) -> None:
    await _asend(aclient, queue, "x")
    receiver = aclient.get_queue_receiver(queue, max_wait_time=5)
    (msg,) = await receiver.receive_messages()
    await _lose_lock(receiver, msg)
    await receiver.complete_message(msg)  # the lock looks valid: sent without waiting
    with pytest.raises(SettlementFailedError) as info:
        await receiver.receive_messages(max_wait_time=1)
    assert [f[0] for f in info.value.failures] == [msg.sequence_number]
    await receiver.close()
    # The message was not completed: it is still in the queue.
    assert (await aadmin.get_queue_runtime_properties(queue)).active_message_count == 1


async def test_aio_refused_fast_settlement_is_raised_by_close(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    await _asend(aclient, queue, "x")
    receiver = aclient.get_queue_receiver(queue, max_wait_time=5)
    (msg,) = await receiver.receive_messages()
    await _lose_lock(receiver, msg)
    await receiver.abandon_message(msg)
    with pytest.raises(SettlementFailedError) as info:
        await receiver.close()
    assert info.value.failures[0][0] == msg.sequence_number
    assert info.value.sequence_number == msg.sequence_number
    async with aclient.get_queue_receiver(queue, receive_mode=RAD, max_wait_time=5) as other:
        (again,) = await other.receive_messages()
        assert again.sequence_number == msg.sequence_number
        assert again.delivery_count == 0  # the refused abandon did not count
        assert again.lock_token is None  # received and deleted


async def test_aio_refused_fast_settlement_is_raised_by_a_later_call_once_refused(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    await _asend(aclient, queue, "x")
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (msg,) = await receiver.receive_messages()
        await _lose_lock(receiver, msg)
        await receiver.defer_message(msg)  # sent without waiting
        await asyncio.sleep(0.5)  # ample time for the broker's refusal to come back
        with pytest.raises(SettlementFailedError) as info:
            await receiver.peek_messages()
        assert [f[0] for f in info.value.failures] == [msg.sequence_number]
        (again,) = await receiver.receive_messages()  # reported once; not deferred
        assert again.sequence_number == msg.sequence_number
        await receiver.complete_message(again)


async def test_aio_settlement_with_little_lock_time_left_waits_and_raises_lock_lost(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    name = _name()
    await aadmin.create_queue(name, lock_duration=timedelta(seconds=1))
    await _asend(aclient, name, "x")
    async with aclient.get_queue_receiver(name, max_wait_time=5) as receiver:
        (msg,) = await receiver.receive_messages()
        await _lose_lock(receiver, msg)
        # Less than half of the 1 s lock is left: the settlement waits for the broker.
        await asyncio.sleep(0.6)
        with pytest.raises(MessageLockLostError):
            await receiver.complete_message(msg)
        (again,) = await receiver.receive_messages()
        assert again.sequence_number == msg.sequence_number
        await receiver.complete_message(again)


def test_sync_refused_fast_settlement_is_raised_by_close_and_the_message_stays(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, "x")
    receiver = client.get_queue_receiver(queue, max_wait_time=5)
    (msg,) = receiver.receive_messages()
    run(_lose_lock(receiver._aio, msg))
    receiver.complete_message(msg)  # returns without error
    with pytest.raises(SettlementFailedError) as info:
        receiver.close()
    assert [f[0] for f in info.value.failures] == [msg.sequence_number]
    assert _runtime(admin, queue) == (1, 0, 0)


def test_sync_refused_fast_settlement_is_raised_by_the_next_receive_which_gives_back_its_messages(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, "x")
    receiver = client.get_queue_receiver(queue, max_wait_time=5)
    (msg,) = receiver.receive_messages()
    run(_lose_lock(receiver._aio, msg))  # the lost lock put msg back in the queue
    receiver.complete_message(msg)  # returns without error
    with pytest.raises(SettlementFailedError) as info:
        receiver.receive_messages(max_wait_time=2)  # this call received msg again ...
    assert [f[0] for f in info.value.failures] == [msg.sequence_number]
    # ... and released it when it raised: another receiver gets it at once, uncharged.
    with client.get_queue_receiver(queue, max_wait_time=5) as other:
        (again,) = other.receive_messages()
        assert again.sequence_number == msg.sequence_number
        assert again.delivery_count == 0
        other.complete_message(again)
    receiver.close()  # already reported: close does not raise it again
    assert _runtime(admin, queue) == (0, 0, 0)


# ------------------------------------------------------------------------------ scheduling


def test_scheduled_messages_arrive_at_their_time_and_cancelled_ones_never(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    at = datetime.now(timezone.utc) + timedelta(seconds=1)
    with client.get_queue_sender(queue) as sender:
        (kept,) = sender.schedule_messages(ServiceBusMessage("scheduled"), at)
        cancelled = sender.schedule_messages([ServiceBusMessage("cancelled")], at)
        sender.send_messages(ServiceBusMessage("by property", scheduled_enqueue_time_utc=at))
        assert isinstance(kept, int)
        assert len(cancelled) == 1
        assert _runtime(admin, queue) == (0, 0, 3)
        sender.cancel_scheduled_messages(cancelled[0])
        assert _runtime(admin, queue) == (0, 0, 2)
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        assert receiver.receive_messages(max_wait_time=0.2) == []
        got = _receive_n(receiver, 2)
        assert datetime.now(timezone.utc) >= at - timedelta(milliseconds=50)
        assert [m.body for m in got] == ["scheduled", "by property"]
        for m in got:
            assert m.enqueued_time_utc >= at - timedelta(milliseconds=50)  # type: ignore[operator]
            assert m.scheduled_enqueue_time_utc is not None
            assert abs((m.scheduled_enqueue_time_utc - at).total_seconds()) < 0.01
        # A scheduled message gets a new sequence number when it turns active.
        assert got[0].sequence_number > kept
        assert receiver.receive_messages(max_wait_time=0.3) == []  # never the cancelled one
        receiver.complete_messages(got)


async def test_aio_schedule_returns_sequence_numbers_that_cancel_accepts(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient, queue: str
) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    async with aclient.get_queue_sender(queue) as sender:
        seqs = await sender.schedule_messages(
            [ServiceBusMessage("a"), ServiceBusMessage("b")], later
        )
        assert len(seqs) == 2
        assert seqs[1] == seqs[0] + 1
        runtime = await aadmin.get_queue_runtime_properties(queue)
        assert runtime.scheduled_message_count == 2
        with pytest.raises(MessageNotFoundError):
            await sender.cancel_scheduled_messages([seqs[0], seqs[1] + 100])
        assert (await aadmin.get_queue_runtime_properties(queue)).scheduled_message_count == 2
        await sender.cancel_scheduled_messages(seqs)
        assert (await aadmin.get_queue_runtime_properties(queue)).scheduled_message_count == 0
        # A time in the past enqueues at once.
        past = datetime.now(timezone.utc) - timedelta(minutes=1)
        await sender.schedule_messages(ServiceBusMessage("now"), past)
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (msg,) = await receiver.receive_messages()
        assert msg.body == "now"
        await receiver.complete_message(msg)
    async with aclient.get_queue_receiver(queue) as peeker:  # the queue is empty now
        assert await peeker.peek_messages(10, sequence_number=1) == []


async def test_aio_schedule_with_a_non_datetime_time_raises_invalid_argument(
    aclient: aio.ServiceBusClient,
) -> None:
    # Arguments are checked before the queue is looked up: none is needed.
    async with aclient.get_queue_sender(_name("never-created")) as sender:
        with pytest.raises(InvalidArgumentError):
            await sender.schedule_messages(ServiceBusMessage("x"), 5)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await sender.cancel_scheduled_messages([-1])


# ------------------------------------------------------------------------------ time to live


def test_message_past_its_time_to_live_is_not_received(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, "short-lived", time_to_live=timedelta(seconds=0.3))
    _send(client, queue, "lasting")
    time.sleep(0.6)
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        assert msg.body == "lasting"
        receiver.complete_message(msg)
        assert receiver.receive_messages(max_wait_time=0.3) == []
    assert _runtime(admin, queue) == (0, 0, 0)  # expired without dead-lettering


def test_expired_messages_are_dead_lettered_when_the_queue_says_so(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(
        name,
        dead_lettering_on_message_expiration=True,
        default_message_time_to_live=timedelta(seconds=0.4),
    )
    _send(client, name, "own ttl", time_to_live=timedelta(seconds=0.3))
    _send(client, name, "queue default ttl")
    time.sleep(0.7)
    with client.get_queue_receiver(name, max_wait_time=0.3) as receiver:
        assert receiver.receive_messages() == []
    assert _runtime(admin, name) == (0, 2, 0)
    with client.get_queue_receiver(name, sub_queue=DLQ, max_wait_time=5) as dlq:
        got = _receive_n(dlq, 2)
        assert [m.body for m in got] == ["own ttl", "queue default ttl"]
        assert {m.dead_letter_reason for m in got} == {"TTLExpiredException"}
        dlq.complete_messages(got)


# ------------------------------------------------------------------------------ auto lock renewal


def test_auto_lock_renewer_keeps_registered_and_auto_registered_messages_locked(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, lock_duration=timedelta(seconds=1))
    _send(client, name, "registered", "auto-registered")
    renewer = raybus.AutoLockRenewer(max_lock_renewal_duration=30)
    with (
        renewer,
        client.get_queue_receiver(name, max_wait_time=5) as manual,
        client.get_queue_receiver(name, max_wait_time=5, auto_lock_renewer=renewer) as auto,
    ):
        (registered,) = manual.receive_messages()
        renewer.register(manual, registered)
        (auto_registered,) = auto.receive_messages()  # registered by the receiver
        with client.get_queue_receiver(name) as other:
            assert other.receive_messages(max_wait_time=3) == []  # 3 s, three locks' worth
        assert registered.auto_renew_error is None
        assert auto_registered.auto_renew_error is None
        manual.complete_message(registered)
        auto.complete_message(auto_registered)
    assert _runtime(admin, name) == (0, 0, 0)


async def test_aio_auto_lock_renewer_keeps_registered_and_auto_registered_messages_locked(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    name = _name()
    await aadmin.create_queue(name, lock_duration=timedelta(seconds=1))
    await _asend(aclient, name, "registered", "auto-registered")
    renewer = aio.AutoLockRenewer(max_lock_renewal_duration=30)
    async with (
        renewer,
        aclient.get_queue_receiver(name, max_wait_time=5) as manual,
        aclient.get_queue_receiver(name, max_wait_time=5, auto_lock_renewer=renewer) as auto,
    ):
        (registered,) = await manual.receive_messages()
        renewer.register(manual, registered)
        (auto_registered,) = await auto.receive_messages()  # registered by the receiver
        async with aclient.get_queue_receiver(name) as other:
            assert await other.receive_messages(max_wait_time=3) == []
        assert registered.auto_renew_error is None
        assert auto_registered.auto_renew_error is None
        await manual.complete_message(registered)
        await auto.complete_message(auto_registered)
    assert (await aadmin.get_queue_runtime_properties(name)).active_message_count == 0


async def test_aio_auto_lock_renewer_stops_after_max_duration_and_reports_lost_locks(
    aadmin: aio.ServiceBusAdministrationClient,
    aclient: aio.ServiceBusClient,
    aeventually: Callable[..., Awaitable[None]],
) -> None:
    name = _name()
    await aadmin.create_queue(name, lock_duration=timedelta(seconds=0.5))
    await _asend(aclient, name, "timed out", "lost")
    failures: list[tuple[Any, BaseException | None]] = []

    async def on_failure(msg: Any, error: BaseException | None) -> None:
        failures.append((msg, error))

    async with (
        aio.AutoLockRenewer(on_lock_renew_failure=on_failure) as renewer,
        aclient.get_queue_receiver(name, max_wait_time=5) as receiver,
    ):
        timed_out, lost = await _areceive_n(receiver, 2)
        renewer.register(receiver, timed_out, max_lock_renewal_duration=0.8)
        await _lose_lock(receiver, lost)
        renewer.register(receiver, lost)

        async def settled_down() -> None:
            assert isinstance(timed_out.auto_renew_error, AutoLockRenewTimeout)
            assert isinstance(lost.auto_renew_error, AutoLockRenewFailed)

        await aeventually(settled_down)
        # Only the failed renewal is reported through the callback.
        assert [m for m, _ in failures] == [lost]
        assert isinstance(failures[0][1], AutoLockRenewFailed)
