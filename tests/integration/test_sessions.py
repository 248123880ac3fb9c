"""Sessions against a real local Ray cluster: per-session FIFO, exclusive session locks,
NEXT_AVAILABLE_SESSION, abandon and session state (sync and asyncio clients). Locks, release,
listing and misuse: ``test_sessions_locks.py``; partitioned queues:
``test_sessions_partitioned.py``; fixtures: ``sessions_support``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

import pytest
import sessions_support
from sessions_support import _areceive_n, _bodies, _msgs, _receive_n, _send, _sid

import raybus
from raybus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusReceivedMessage, aio
from raybus.exceptions import OperationTimeoutError, SessionCannotBeLockedError

namespace = sessions_support.namespace
session_queue = sessions_support.session_queue
short_lock_queue = sessions_support.short_lock_queue
plain_queue = sessions_support.plain_queue
partitioned_session_queue = sessions_support.partitioned_session_queue
lonely_session_queue = sessions_support.lonely_session_queue


# ------------------------------------------------------------------------------ ordering


def test_each_session_receives_its_messages_in_send_order_when_sessions_are_interleaved(
    client: raybus.ServiceBusClient, session_queue: str
) -> None:
    sids = [_sid("fifo") for _ in range(3)]
    expected: dict[str, list[str]] = {sid: [] for sid in sids}
    with client.get_queue_sender(session_queue) as sender:
        for batch in range(3):  # three sends, each interleaving the sessions
            messages = []
            for i in range(4):
                for sid in sids:
                    body = f"{sid}/{batch * 4 + i}"
                    expected[sid].append(body)
                    messages.append(ServiceBusMessage(body, session_id=sid))
            sender.send_messages(messages)
    for sid in reversed(sids):  # receive in a different order than sent
        with client.get_queue_receiver(session_queue, session_id=sid, max_wait_time=5) as rec:
            assert rec.session is not None and rec.session.session_id == sid
            got = _receive_n(rec, 12)
            assert _bodies(got) == expected[sid]
            assert {m.session_id for m in got} == {sid}
            seqs = [m.sequence_number for m in got]
            assert seqs == sorted(seqs)
            for m in got:
                rec.complete_message(m)
            assert rec.receive_messages(max_wait_time=0.3) == []


async def test_aio_session_messages_arrive_in_order_across_several_receive_calls(
    aclient: aio.ServiceBusClient, session_queue: str
) -> None:
    sid, other = _sid("afifo"), _sid("aother")
    async with aclient.get_queue_sender(session_queue) as sender:
        for i in range(10):
            await sender.send_messages(
                [
                    ServiceBusMessage(f"a{i}", session_id=sid),
                    ServiceBusMessage(f"b{i}", session_id=other),
                ]
            )
    for session, prefix in ((sid, "a"), (other, "b")):
        async with aclient.get_queue_receiver(
            session_queue, session_id=session, max_wait_time=5
        ) as receiver:
            got: list[ServiceBusReceivedMessage] = []
            while len(got) < 10:  # small batches: order must hold across calls
                batch = await receiver.receive_messages(3)
                assert batch
                got.extend(batch)
                for m in batch:
                    await receiver.complete_message(m)
            assert _bodies(got) == [f"{prefix}{i}" for i in range(10)]


# ------------------------------------------------------------------------------ exclusive locks


def test_a_session_held_by_one_receiver_cannot_be_accepted_by_another(
    client: raybus.ServiceBusClient, session_queue: str
) -> None:
    sid = _sid("excl")
    _send(client, session_queue, _msgs(sid, "only"))
    with client.get_queue_receiver(session_queue, session_id=sid, max_wait_time=5) as first:
        second = client.get_queue_receiver(session_queue, session_id=sid, max_wait_time=1)
        with pytest.raises(SessionCannotBeLockedError):
            second.__enter__()  # accepting happens on entering
        # Accepting on first use (no ``with``) is refused the same way.
        third = client.get_queue_receiver(session_queue, session_id=sid, max_wait_time=1)
        with pytest.raises(SessionCannotBeLockedError):
            third.receive_messages()
        third.close()
        second.close()
        (msg,) = first.receive_messages()
        assert msg.body == "only"
        first.complete_message(msg)


async def test_aio_a_held_session_cannot_be_accepted_by_a_second_receiver(
    aclient: aio.ServiceBusClient, session_queue: str
) -> None:
    sid = _sid("aexcl")
    async with aclient.get_queue_receiver(session_queue, session_id=sid) as first:
        assert first.session is not None
        assert first.session.session_id == sid
        assert first.session.locked_until_utc is not None
        assert first.session.locked_until_utc > datetime.now(timezone.utc)
        with pytest.raises(SessionCannotBeLockedError) as info:
            async with aclient.get_queue_receiver(session_queue, session_id=sid):
                pass
        assert sid in str(info.value)


# ------------------------------------------------------------------------------ next available


def test_next_available_accepts_a_session_with_messages_and_times_out_when_none_is_free(
    client: raybus.ServiceBusClient, lonely_session_queue: str
) -> None:
    q = lonely_session_queue
    # Nothing at all: the accept waits max_wait_time, then gives up.
    empty = client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1)
    assert empty.session is not None and empty.session.session_id is None
    started = time.monotonic()
    with pytest.raises(OperationTimeoutError):
        empty.__enter__()
    elapsed = time.monotonic() - started
    assert 0.8 <= elapsed < 10
    empty.close()

    _send(client, q, _msgs("busy", "b0", "b1"))
    with client.get_queue_receiver(
        q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
    ) as receiver:
        assert receiver.session is not None
        assert receiver.session.session_id == "busy"
        got = _receive_n(receiver, 2)
        assert _bodies(got) == ["b0", "b1"]
        # The only session is held: another NEXT_AVAILABLE receiver finds none.
        other = client.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1)
        started = time.monotonic()
        with pytest.raises(OperationTimeoutError):
            other.receive_messages()  # accepting on first use
        assert time.monotonic() - started >= 0.8
        other.close()
        for m in got:
            receiver.complete_message(m)


async def test_aio_next_available_waits_for_a_session_that_gets_a_message_meanwhile(
    aclient: aio.ServiceBusClient, lonely_session_queue: str
) -> None:
    q = lonely_session_queue

    async def send_later() -> None:
        await asyncio.sleep(0.5)
        async with aclient.get_queue_sender(q) as sender:
            await sender.send_messages(ServiceBusMessage("late", session_id="late-session"))

    sending = asyncio.create_task(send_later())
    receiver = aclient.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=20)
    started = time.monotonic()
    async with receiver:
        elapsed = time.monotonic() - started
        assert receiver.session is not None
        assert receiver.session.session_id == "late-session"
        (msg,) = await receiver.receive_messages(max_wait_time=5)
        assert msg.body == "late"
        assert msg.session_id == "late-session"
        await receiver.complete_message(msg)
    await sending
    assert elapsed < 10, "the waiting accept was not woken by the new session's message"


def test_next_available_skips_sessions_held_by_others(
    client: raybus.ServiceBusClient, lonely_session_queue: str
) -> None:
    q = lonely_session_queue
    _send(client, q, _msgs("first", "f0") + _msgs("second", "s0"))
    with client.get_queue_receiver(q, session_id="first") as holder:
        with client.get_queue_receiver(
            q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2
        ) as receiver:
            assert receiver.session is not None
            assert receiver.session.session_id == "second"
            (msg,) = receiver.receive_messages(max_wait_time=5)
            assert msg.body == "s0"
            receiver.complete_message(msg)
        (msg,) = holder.receive_messages(max_wait_time=5)
        assert msg.body == "f0"
        holder.complete_message(msg)


# ------------------------------------------------------------------------------ settlement


def test_abandoned_session_message_comes_next_with_delivery_count_one(
    client: raybus.ServiceBusClient, session_queue: str
) -> None:
    sid = _sid("abandon")
    _send(client, session_queue, _msgs(sid, "m0", "m1", "m2"))
    with client.get_queue_receiver(session_queue, session_id=sid, max_wait_time=5) as receiver:
        (first,) = receiver.receive_messages()
        assert (first.body, first.delivery_count) == ("m0", 0)
        receiver.abandon_message(first)
        (again,) = receiver.receive_messages()
        assert again.body == "m0"
        assert again.sequence_number == first.sequence_number
        assert again.delivery_count == 1
        receiver.complete_message(again)
        rest = _receive_n(receiver, 2)
        assert _bodies(rest) == ["m1", "m2"]
        assert [m.delivery_count for m in rest] == [0, 0]
        for m in rest:
            receiver.complete_message(m)


async def test_aio_abandon_in_a_session_redelivers_before_later_messages(
    aclient: aio.ServiceBusClient, session_queue: str
) -> None:
    sid = _sid("aabandon")
    async with aclient.get_queue_sender(session_queue) as sender:
        await sender.send_messages(_msgs(sid, "x0", "x1"))
    async with aclient.get_queue_receiver(
        session_queue, session_id=sid, max_wait_time=5
    ) as receiver:
        both = await _areceive_n(receiver, 2)
        assert _bodies(both) == ["x0", "x1"]
        await receiver.abandon_message(both[0])
        (again,) = await receiver.receive_messages()
        assert (again.body, again.delivery_count) == ("x0", 1)
        await receiver.complete_message(again)
        await receiver.complete_message(both[1])
        assert await receiver.receive_messages(max_wait_time=0.3) == []


# ------------------------------------------------------------------------------ state


def test_session_state_outlives_the_receiver_and_is_seen_by_the_next_acceptor(
    client: raybus.ServiceBusClient, session_queue: str
) -> None:
    sid = _sid("state")
    with client.get_queue_receiver(session_queue, session_id=sid) as receiver:
        assert receiver.session is not None
        assert receiver.session.get_state() is None
        receiver.session.set_state("step-1")
        assert receiver.session.get_state() == b"step-1"
    with client.get_queue_receiver(session_queue, session_id=sid) as receiver:
        assert receiver.session is not None
        assert receiver.session.get_state() == b"step-1"
        receiver.session.set_state(b"\x00step-2")
    with client.get_queue_receiver(session_queue, session_id=sid) as receiver:
        assert receiver.session is not None
        assert receiver.session.get_state() == b"\x00step-2"
        receiver.session.set_state(None)  # clears it
    with client.get_queue_receiver(session_queue, session_id=sid) as receiver:
        assert receiver.session is not None
        assert receiver.session.get_state() is None


async def test_aio_session_state_persists_across_receivers_with_messages_in_between(
    aclient: aio.ServiceBusClient, session_queue: str
) -> None:
    sid = _sid("astate")
    async with aclient.get_queue_sender(session_queue) as sender:
        await sender.send_messages(_msgs(sid, "one", "two"))
    for expected_state, body in ((None, "one"), (b"after-one", "two")):
        async with aclient.get_queue_receiver(
            session_queue, session_id=sid, max_wait_time=5
        ) as receiver:
            assert receiver.session is not None
            assert await receiver.session.get_state() == expected_state
            (msg,) = await receiver.receive_messages()
            assert msg.body == body
            await receiver.complete_message(msg)
            await receiver.session.set_state(f"after-{body}")
    async with aclient.get_queue_receiver(session_queue, session_id=sid) as receiver:
        assert receiver.session is not None
        assert await receiver.session.get_state() == b"after-two"
        await receiver.session.set_state(None)
