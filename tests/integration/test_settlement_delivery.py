"""Delivery and time against a real local Ray cluster: receive-and-delete, competing
receivers, prefetch, fast-settlement failure reporting, scheduling, time to live and automatic
lock renewal (sync and asyncio clients).

Time-dependent behaviour uses short real durations (locks of 0.5-1 s, time to live 0.3 s,
schedules 1 s ahead) and generous waits; nothing asserts speed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import settlement_support
from settlement_support import (
    DLQ,
    RAD,
    _areceive_n,
    _asend,
    _lose_lock,
    _name,
    _receive_n,
    _runtime,
    _send,
)

import raybus
from raybus import ServiceBusMessage, aio
from raybus._sync import run
from raybus.exceptions import (
    AutoLockRenewFailed,
    AutoLockRenewTimeout,
    InvalidArgumentError,
    MessageLockLostError,
    MessageNotFoundError,
    SettlementFailedError,
)
from raybus.management import ServiceBusAdministrationClient

namespace = settlement_support.namespace
queue = settlement_support.queue


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


def _completed_after_its_lock_was_lost(
    client: raybus.ServiceBusClient, queue: str
) -> tuple[raybus.ServiceBusReceiver, raybus.ServiceBusReceivedMessage]:
    """A receiver whose fast (not awaited) complete of its one message the broker will refuse:
    the lock was lost meanwhile, which put the message back in the queue. The complete itself
    returns without error."""
    _send(client, queue, "x")
    receiver = client.get_queue_receiver(queue, max_wait_time=5)
    (msg,) = receiver.receive_messages()
    run(_lose_lock(receiver._aio, msg))
    receiver.complete_message(msg)
    return receiver, msg


def test_sync_refused_fast_settlement_is_raised_by_close_and_the_message_stays(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    receiver, msg = _completed_after_its_lock_was_lost(client, queue)
    with pytest.raises(SettlementFailedError) as info:
        receiver.close()
    assert [f[0] for f in info.value.failures] == [msg.sequence_number]
    assert _runtime(admin, queue) == (1, 0, 0)


def test_sync_refused_fast_settlement_is_raised_by_the_next_receive_which_gives_back_its_messages(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    receiver, msg = _completed_after_its_lock_was_lost(client, queue)
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
    """What must hold before a schedule time is checked on a message scheduled an hour ahead
    (on a slow machine a second can pass before the checks do); the messages scheduled a
    second ahead are checked after the fact: received no earlier than their time."""
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    with client.get_queue_sender(queue) as sender:
        cancelled = sender.schedule_messages([ServiceBusMessage("cancelled")], later)
        assert len(cancelled) == 1
        assert _runtime(admin, queue) == (0, 0, 1)
        sender.cancel_scheduled_messages(cancelled[0])
        assert _runtime(admin, queue) == (0, 0, 0)
        with pytest.raises(MessageNotFoundError):  # gone, not merely hidden
            sender.cancel_scheduled_messages(cancelled[0])
        at = datetime.now(timezone.utc) + timedelta(seconds=1)
        (kept,) = sender.schedule_messages(ServiceBusMessage("scheduled"), at)
        sender.send_messages(ServiceBusMessage("by property", scheduled_enqueue_time_utc=at))
        assert isinstance(kept, int)
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
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
        assert _runtime(admin, queue) == (0, 0, 0)


@pytest.mark.parametrize("read", ["peek", "count"])
def test_a_scheduled_message_activated_by_a_read_reaches_a_peek_lock_receive_at_once(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str, read: str
) -> None:
    """A peek or a count applies due activations, as every call does; what it activated is
    flushed too. Before, a peek-lock receive (which flushes only its own changes) did not see
    it until an unrelated write (CI: an AMQP receive after a peek got nothing in 5 s)."""
    at = datetime.now(timezone.utc) + timedelta(seconds=1)
    with client.get_queue_sender(queue) as sender:
        sender.schedule_messages(ServiceBusMessage("due"), at)
    time.sleep(max(0.0, (at - datetime.now(timezone.utc)).total_seconds()) + 0.2)
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        if read == "peek":
            assert [m.body for m in receiver.peek_messages(5)] == ["due"]
        else:
            assert _runtime(admin, queue) == (1, 0, 0)
        got = receiver.receive_messages(5, max_wait_time=5)
        assert [m.body for m in got] == ["due"]
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
    admin.create_queue(name, lock_duration=timedelta(seconds=2))
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
            # 4 s, two locks' worth. The renewer renews with half a lock left: a 1 s lock left
            # it 0.5 s per renewal, which a loaded machine can overrun.
            assert other.receive_messages(max_wait_time=4) == []
        assert registered.auto_renew_error is None
        assert auto_registered.auto_renew_error is None
        manual.complete_message(registered)
        auto.complete_message(auto_registered)
    assert _runtime(admin, name) == (0, 0, 0)


async def test_aio_auto_lock_renewer_keeps_registered_and_auto_registered_messages_locked(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    name = _name()
    await aadmin.create_queue(name, lock_duration=timedelta(seconds=2))
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
            assert await other.receive_messages(max_wait_time=4) == []  # as above
        assert registered.auto_renew_error is None
        assert auto_registered.auto_renew_error is None
        await manual.complete_message(registered)
        await auto.complete_message(auto_registered)
    assert (await aadmin.get_queue_runtime_properties(name)).active_message_count == 0


async def test_aio_auto_lock_renewer_stops_after_max_duration_and_reports_lost_locks(
    aadmin: aio.ServiceBusAdministrationClient,
    aclient: aio.ServiceBusClient,
    aeventually: Callable[..., Awaitable[None]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = _name()
    await aadmin.create_queue(name, lock_duration=timedelta(seconds=0.5))
    await _asend(aclient, name, "timed out", "lost")
    failures: list[tuple[Any, BaseException | None]] = []

    async def on_failure(msg: Any, error: BaseException | None) -> None:
        failures.append((msg, error))

    # ``loop``: the SDK's deprecated argument, accepted and unused.
    loop = asyncio.get_running_loop()
    async with (
        aio.AutoLockRenewer(on_lock_renew_failure=on_failure, loop=loop) as renewer,
        aclient.get_queue_receiver(name, max_wait_time=5) as receiver,
    ):
        timed_out, lost = await _areceive_n(receiver, 2)
        renewer.register(receiver, timed_out, max_lock_renewal_duration=0.8)
        await _lose_lock(receiver, lost)
        renewer.register(receiver, lost)

        async def settled_down() -> None:
            assert isinstance(timed_out.auto_renew_error, AutoLockRenewTimeout)
            assert isinstance(lost.auto_renew_error, AutoLockRenewFailed)

        with caplog.at_level(logging.WARNING, logger="raybus"):
            await aeventually(settled_down)
        # Only the failed renewal is reported through the callback, and logged naming the
        # receiver (its client_identifier, as the SDK's log lines do).
        assert [m for m, _ in failures] == [lost]
        assert isinstance(failures[0][1], AutoLockRenewFailed)
        assert any(
            r.getMessage().startswith(f"{receiver.client_identifier}: lock renewal failed for")
            for r in caplog.records
        )


@pytest.mark.parametrize("pool", ["max_workers", "executor"])
def test_a_renewal_failure_callback_runs_in_the_renewers_executor_and_may_call_the_sync_api(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    eventually: Callable[..., None],
    pool: str,
) -> None:
    """The SDK's ``executor`` / ``max_workers``: the callback runs in a pool thread, where the
    sync API may be called (on raybus's loop thread it may not)."""
    name = _name()
    admin.create_queue(name, lock_duration=timedelta(seconds=2))
    _send(client, name, "lost")
    seen: list[tuple[str, int, BaseException | None]] = []

    def on_failure(msg: Any, error: BaseException | None) -> None:
        count = admin.get_queue_runtime_properties(name).active_message_count  # the sync API
        seen.append((threading.current_thread().name, count, error))

    mine = ThreadPoolExecutor(1, "mine")
    options: dict[str, Any] = {"max_workers": 2} if pool == "max_workers" else {"executor": mine}
    renewer = raybus.AutoLockRenewer(on_lock_renew_failure=on_failure, **options)
    try:
        with renewer, client.get_queue_receiver(name, max_wait_time=5) as receiver:
            (lost,) = receiver.receive_messages()
            run(_lose_lock(receiver._aio, lost))
            renewer.register(receiver, lost)

            def reported() -> None:
                assert len(seen) == 1

            eventually(reported)
    finally:
        mine.shutdown()
    thread, count, error = seen[0]
    assert thread.startswith("raybus-renew-failure" if pool == "max_workers" else "mine")
    assert count == 1 and isinstance(error, AutoLockRenewFailed)


@pytest.mark.parametrize(
    ("option", "value"),
    [("max_workers", 0), ("max_workers", 1.5), ("max_workers", True), ("executor", "pool")],
)
def test_a_bad_renewer_pool_option_is_a_typed_error(option: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        raybus.AutoLockRenewer(**{option: value})
    assert err.value.argument == option


def test_an_aio_renewers_loop_that_is_no_loop_is_a_typed_error() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        aio.AutoLockRenewer(loop="the loop")  # type: ignore[arg-type]
    assert err.value.argument == "loop"
