"""Settlement and locks against a real local Ray cluster: complete, abandon, defer,
dead-letter, peek, settling twice, lock expiry and renewal, batch completion (sync and asyncio
clients). Receive modes, competing receivers, prefetch, fast-settlement failures, scheduling,
time to live and automatic lock renewal: ``test_settlement_delivery.py``.

Time-dependent behaviour uses short real durations (locks of 0.5-1 s) and generous waits;
nothing asserts speed except that a waiting receive is woken well before its timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

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
from raybus import ServiceBusMessage, ServiceBusMessageState, aio
from raybus.exceptions import (
    InvalidArgumentError,
    MessageAlreadySettled,
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    SettlementFailedError,
)
from raybus.management import ServiceBusAdministrationClient

namespace = settlement_support.namespace
queue = settlement_support.queue


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


def test_a_message_is_settled_only_through_a_receiver_of_its_own_queue(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    """A receiver of another queue refuses the message before sending anything, and it stays
    locked; a receiver of the same queue named in other letter cases settles it."""
    other = _name()
    admin.create_queue(other)
    try:
        _send(client, queue, "mine")
        with (
            client.get_queue_receiver(queue, max_wait_time=5) as receiver,
            client.get_queue_receiver(other) as stranger,
            client.get_queue_receiver(queue.upper()) as same_queue,
        ):
            (msg,) = receiver.receive_messages()
            for settle in (stranger.complete_message, stranger.abandon_message):
                with pytest.raises(InvalidArgumentError, match="came from") as err:
                    settle(msg)
                assert err.value.argument == "message"
            with pytest.raises(InvalidArgumentError, match="came from"):
                stranger.complete_messages([msg])
            assert receiver.receive_messages(max_wait_time=0.5) == []  # still locked
            same_queue.complete_message(msg)
        assert _runtime(admin, queue) == (0, 0, 0)
    finally:
        admin.delete_queue(other)


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


def test_a_settlement_that_would_pass_the_header_limit_is_refused_and_keeps_the_message(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    # A send holds the properties to 64 KB; a settlement may not grow them past it either.
    _send(client, queue, "props", application_properties={"a": "x" * 30_000, "b": "y" * 30_000})
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        with pytest.raises(MessageSizeExceededError):
            receiver.abandon_message(msg, properties_to_modify={"c": "z" * 30_000})
        with pytest.raises(MessageSizeExceededError):
            receiver.dead_letter_message(msg, reason="r" * 6_000)
        receiver.complete_message(msg)  # still locked by this receiver, unchanged


def test_properties_to_modify_take_bytes_names_as_the_sdk_gives_them(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    # Code written for the SDK reads received names as bytes and may hand them back.
    _send(client, queue, "props", application_properties={"a": 1, "b": 2})
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        with pytest.raises(InvalidArgumentError) as info:  # a name twice: nothing settled
            receiver.abandon_message(msg, properties_to_modify={"b": 3, b"b": 4})
        assert info.value.argument == "properties_to_modify"
        assert "'b'" in str(info.value)
        with pytest.raises(InvalidArgumentError) as info:
            receiver.abandon_message(msg, properties_to_modify={"bad": [1]})
        assert info.value.argument == "properties_to_modify['bad']"
        receiver.abandon_message(
            msg, properties_to_modify={b"b": 3, b"c": msg.application_properties.get(b"a")}
        )
        (again,) = receiver.receive_messages()
        assert again.delivery_count == 1
        assert again.application_properties == {"a": 1, "b": 3, "c": 1}
        assert all(type(name) is str for name in again.application_properties)
        receiver.dead_letter_message(again, reason="r", properties_to_modify={b"dead": b"yes"})
    with client.get_queue_receiver(queue, sub_queue=DLQ, max_wait_time=5) as dlq:
        (dead,) = dlq.receive_messages()
        assert dead.application_properties == {
            "a": 1,
            "b": 3,
            "c": 1,
            "dead": b"yes",
            "DeadLetterReason": "r",
        }
        dlq.complete_message(dead)


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
        # The reason and description are among its properties too, as the SDK reads them.
        assert dead.application_properties == {
            "k": 1,
            "checked": True,
            "DeadLetterReason": "Invalid",
            "DeadLetterErrorDescription": "field x missing",
        }
        assert dead.application_properties[b"DeadLetterReason"] == b"Invalid"
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


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_dead_letter_deferred_in_the_dead_letter_queue_is_received_there_by_number(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, partitions: int
) -> None:
    # Each sub-queue finds only its own deferred messages: a dead-letter receiver never takes
    # (nor, receiving and deleting, deletes) one the main queue deferred, and the reverse.
    queue = _name()
    admin.create_queue(queue, partition_count=partitions)
    _send(client, queue, "dead", "kept")
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        dead, kept = _receive_n(receiver, 2)
        receiver.dead_letter_message(dead, reason="R")
        receiver.defer_message(kept)
    with client.get_queue_receiver(queue, sub_queue=DLQ, max_wait_time=5) as dlq:
        (msg,) = dlq.receive_messages()
        dlq.defer_message(msg)
        assert dlq.receive_messages(max_wait_time=0.5) == []
        with pytest.raises(MessageNotFoundError):
            dlq.receive_deferred_messages([kept.sequence_number])
    with (
        client.get_queue_receiver(queue, sub_queue=DLQ, receive_mode=RAD, max_wait_time=5) as dlq,
        pytest.raises(MessageNotFoundError),
    ):
        dlq.receive_deferred_messages([kept.sequence_number])
    assert _runtime(admin, queue)[:2] == (1, 1)
    with (
        client.get_queue_receiver(queue, max_wait_time=5) as receiver,
        pytest.raises(MessageNotFoundError),
    ):
        receiver.receive_deferred_messages([dead.sequence_number])
    with client.get_queue_receiver(queue, sub_queue=DLQ, max_wait_time=5) as dlq:
        (got,) = dlq.receive_deferred_messages([dead.sequence_number])
        assert (got.body, got.dead_letter_reason) == ("dead", "R")
        assert got.state == ServiceBusMessageState.DEFERRED
        dlq.abandon_message(got)  # stays deferred, in the dead-letter queue
    with client.get_queue_receiver(queue, sub_queue=DLQ, receive_mode=RAD, max_wait_time=5) as dlq:
        (gone,) = dlq.receive_deferred_messages([dead.sequence_number])
        assert gone.body == "dead"
    assert _runtime(admin, queue)[:2] == (1, 0)
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        (again,) = receiver.receive_deferred_messages([kept.sequence_number])
        receiver.complete_message(again)
    assert _runtime(admin, queue) == (0, 0, 0)


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
    admin.create_queue(name, lock_duration=timedelta(seconds=2))
    _send(client, name, "long job")
    with (
        client.get_queue_receiver(name, max_wait_time=5) as receiver,
        client.get_queue_receiver(name) as other,
    ):
        (msg,) = receiver.receive_messages()
        original = msg.locked_until_utc
        assert original is not None
        previous = original
        for _ in range(3):  # 2.4 s in all, past the original 2 s lock; 1.2 s left at each
            time.sleep(0.8)
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
    await aadmin.create_queue(name, lock_duration=timedelta(seconds=2))
    await _asend(aclient, name, "long job")
    async with aclient.get_queue_receiver(name, max_wait_time=5) as receiver:
        (msg,) = await receiver.receive_messages()
        original = msg.locked_until_utc
        assert original is not None
        for _ in range(3):  # as above
            await asyncio.sleep(0.8)
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
