"""Session locks against a real local Ray cluster: renewal and expiry, release on close,
dead-lettering of session-less messages, listing sessions, automatic renewal of session locks,
messages sent while a session is held, and misuse (sync and asyncio clients).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import sessions_support
from sessions_support import SHORT_LOCK_S, _areceive_n, _bodies, _msgs, _receive_n, _send, _sid

import raybus
from raybus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusSubQueue, aio
from raybus.exceptions import InvalidArgumentError, SessionCannotBeLockedError, SessionLockLostError

namespace = sessions_support.namespace
session_queue = sessions_support.session_queue
short_lock_queue = sessions_support.short_lock_queue
plain_queue = sessions_support.plain_queue
partitioned_session_queue = sessions_support.partitioned_session_queue
lonely_session_queue = sessions_support.lonely_session_queue


# ------------------------------------------------------------------------ lock renewal / expiry


def test_renewing_the_session_lock_extends_locked_until_and_keeps_settlement_valid(
    client: raybus.ServiceBusClient, short_lock_queue: str
) -> None:
    sid = _sid("renew")
    _send(client, short_lock_queue, _msgs(sid, "keep"))
    with client.get_queue_receiver(short_lock_queue, session_id=sid, max_wait_time=5) as receiver:
        session = receiver.session
        assert session is not None
        (msg,) = receiver.receive_messages()
        first_expiry = session.locked_until_utc
        assert first_expiry is not None
        expiry = first_expiry
        for _ in range(3):  # 3 x 0.9 s: well past the first 2 s lock
            time.sleep(0.9)
            renewed = session.renew_lock()
            assert renewed > expiry
            assert session.locked_until_utc == renewed
            assert renewed > datetime.now(timezone.utc)
            expiry = renewed
        assert datetime.now(timezone.utc) > first_expiry
        receiver.complete_message(msg)  # still valid thanks to the renewals
    with client.get_queue_receiver(short_lock_queue, session_id=sid, max_wait_time=5) as receiver:
        assert receiver.receive_messages(max_wait_time=0.3) == []


def test_settling_after_the_session_lock_expired_raises_and_messages_return_counted(
    client: raybus.ServiceBusClient, short_lock_queue: str
) -> None:
    sid = _sid("expire")
    _send(client, short_lock_queue, _msgs(sid, "e0", "e1"))
    old = client.get_queue_receiver(short_lock_queue, session_id=sid, max_wait_time=5)
    with old:
        got = _receive_n(old, 2)
        assert [m.delivery_count for m in got] == [0, 0]
        time.sleep(SHORT_LOCK_S + 0.5)
        with pytest.raises(SessionLockLostError):
            old.complete_message(got[0])
        with pytest.raises(SessionLockLostError):
            old.abandon_message(got[1])
        assert old.session is not None
        with pytest.raises(SessionLockLostError):
            old.session.renew_lock()
        # A new receiver takes the session over while the old one is still open.
        with client.get_queue_receiver(short_lock_queue, session_id=sid, max_wait_time=5) as new:
            again = _receive_n(new, 2)
            assert _bodies(again) == ["e0", "e1"]
            assert [m.sequence_number for m in again] == [m.sequence_number for m in got]
            assert [m.delivery_count for m in again] == [1, 1]
            old.close()  # the old receiver's late release must not free the new holder's lock
            with pytest.raises(SessionCannotBeLockedError):
                client.get_queue_receiver(short_lock_queue, session_id=sid).__enter__()
            for m in again:
                new.complete_message(m)


# ------------------------------------------------------------------------------ release on close


def test_closing_a_session_receiver_releases_the_session_at_once_without_counting(
    client: raybus.ServiceBusClient, session_queue: str
) -> None:
    sid = _sid("release")
    _send(client, session_queue, _msgs(sid, "r0", "r1"))
    with client.get_queue_receiver(session_queue, session_id=sid, max_wait_time=5) as first:
        got = _receive_n(first, 2)  # locked, never settled
        assert [m.delivery_count for m in got] == [0, 0]
    # The lock lasts 30 s, so only the release on close lets this accept succeed now.
    started = time.monotonic()
    with client.get_queue_receiver(session_queue, session_id=sid, max_wait_time=5) as second:
        again = _receive_n(second, 2)
        assert time.monotonic() - started < 5
        assert _bodies(again) == ["r0", "r1"]
        assert [m.delivery_count for m in again] == [0, 0]
        for m in again:
            second.complete_message(m)


async def test_aio_closing_releases_the_session_for_next_available(
    aclient: aio.ServiceBusClient, lonely_session_queue: str
) -> None:
    q = lonely_session_queue
    async with aclient.get_queue_sender(q) as sender:
        await sender.send_messages(_msgs("solo", "s0"))
    receiver = aclient.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2)
    async with receiver:
        (msg,) = await receiver.receive_messages(max_wait_time=5)
        assert msg.delivery_count == 0
    async with aclient.get_queue_receiver(
        q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2
    ) as receiver:
        assert receiver.session is not None and receiver.session.session_id == "solo"
        (msg,) = await receiver.receive_messages(max_wait_time=5)
        assert (msg.body, msg.delivery_count) == ("s0", 0)
        await receiver.complete_message(msg)


# ------------------------------------------------------------------------------ session-less


def test_messages_without_session_id_are_dead_lettered_as_session_id_is_null(
    client: raybus.ServiceBusClient, session_queue: str
) -> None:
    sid, orphan_id = _sid("mixed"), f"orphan-{uuid.uuid4().hex[:8]}"
    _send(
        client,
        session_queue,
        [
            ServiceBusMessage("with", session_id=sid),
            ServiceBusMessage("without", message_id=orphan_id),
        ],
    )
    with client.get_queue_receiver(session_queue, session_id=sid, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        assert msg.body == "with"
        receiver.complete_message(msg)
        assert receiver.receive_messages(max_wait_time=0.3) == []
    with client.get_queue_receiver(
        session_queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5
    ) as dlq:
        found = None
        for _ in range(20):
            batch = dlq.receive_messages(10, max_wait_time=2)
            assert batch, "the session-less message was not dead-lettered"
            for m in batch:
                if m.message_id == orphan_id:
                    found = m
                    dlq.complete_message(m)
                else:
                    dlq.abandon_message(m)
            if found is not None:
                break
        assert found is not None
        assert found.body == "without"
        assert found.session_id is None
        assert found.dead_letter_reason == "Session ID is null"


# ------------------------------------------------------------------------------ listing


def test_list_queue_sessions_names_sessions_with_messages_or_state(
    client: raybus.ServiceBusClient, session_queue: str
) -> None:
    with_messages = [_sid("list"), _sid("list")]
    with_state = _sid("liststate")
    _send(client, session_queue, _msgs(with_messages[0], "a") + _msgs(with_messages[1], "b"))
    before_state = datetime.now(timezone.utc) - timedelta(seconds=1)
    with client.get_queue_receiver(session_queue, session_id=with_state) as receiver:
        assert receiver.session is not None
        receiver.session.set_state("s")
    listed = set(client.list_queue_sessions(session_queue))
    assert {*with_messages, with_state} <= listed

    updated = set(client.list_queue_sessions(session_queue, state_updated_after=before_state))
    assert with_state in updated
    assert not set(with_messages) & updated  # no state: not "updated"
    later = datetime.now(timezone.utc) + timedelta(seconds=5)
    assert with_state not in client.list_queue_sessions(session_queue, state_updated_after=later)

    # Drained and stateless sessions are no longer listed.
    for sid in with_messages:
        with client.get_queue_receiver(session_queue, session_id=sid, max_wait_time=5) as r:
            (m,) = r.receive_messages()
            r.complete_message(m)
    with client.get_queue_receiver(session_queue, session_id=with_state) as receiver:
        assert receiver.session is not None
        receiver.session.set_state(None)
    listed = set(client.list_queue_sessions(session_queue))
    assert not {*with_messages, with_state} & listed


# ------------------------------------------------------------------------------ auto lock renewal


def test_auto_lock_renewer_keeps_a_session_alive_past_its_lock_duration(
    client: raybus.ServiceBusClient, short_lock_queue: str
) -> None:
    sid = _sid("auto")
    _send(client, short_lock_queue, _msgs(sid, "slow"))
    with (
        raybus.AutoLockRenewer(max_lock_renewal_duration=60) as renewer,
        client.get_queue_receiver(
            short_lock_queue, session_id=sid, max_wait_time=5, auto_lock_renewer=renewer
        ) as receiver,
    ):
        session = receiver.session
        assert session is not None
        (msg,) = receiver.receive_messages()
        first_expiry = session.locked_until_utc
        assert first_expiry is not None
        # A session's messages are covered by the session lock: they are not renewable.
        with pytest.raises(InvalidArgumentError):
            renewer.register(receiver, msg)
        time.sleep(SHORT_LOCK_S * 1.75)  # processing outlasts the lock
        assert session.auto_renew_error is None
        assert session.locked_until_utc is not None
        assert session.locked_until_utc > first_expiry
        assert session.locked_until_utc > datetime.now(timezone.utc)
        receiver.complete_message(msg)
        # Nobody else could take the session meanwhile.
        with pytest.raises(SessionCannotBeLockedError):
            client.get_queue_receiver(short_lock_queue, session_id=sid).__enter__()
    with client.get_queue_receiver(short_lock_queue, session_id=sid, max_wait_time=5) as receiver:
        assert receiver.receive_messages(max_wait_time=0.3) == []


async def test_aio_auto_lock_renewer_renews_a_registered_session(
    aclient: aio.ServiceBusClient, short_lock_queue: str
) -> None:
    sid = _sid("aauto")
    async with aclient.get_queue_sender(short_lock_queue) as sender:
        await sender.send_messages(_msgs(sid, "slow"))
    async with (
        aio.AutoLockRenewer(max_lock_renewal_duration=60) as renewer,
        aclient.get_queue_receiver(short_lock_queue, session_id=sid, max_wait_time=5) as receiver,
    ):
        assert receiver.session is not None
        renewer.register(receiver, receiver.session)
        (msg,) = await receiver.receive_messages()
        with pytest.raises(InvalidArgumentError):
            renewer.register(receiver, msg)
        await asyncio.sleep(SHORT_LOCK_S * 1.75)
        assert receiver.session.auto_renew_error is None
        until = receiver.session.locked_until_utc
        assert until is not None and until > datetime.now(timezone.utc)
        await receiver.complete_message(msg)
        assert await receiver.receive_messages(max_wait_time=0.3) == []


# ------------------------------------------------------------------------------ held sessions


async def test_aio_messages_sent_while_a_session_is_held_go_to_its_holder(
    aclient: aio.ServiceBusClient, session_queue: str
) -> None:
    sid = _sid("held")
    async with aclient.get_queue_receiver(
        session_queue, session_id=sid, max_wait_time=10
    ) as receiver:
        # Accepted before the session has any message; a waiting receive gets the new one.
        waiting = asyncio.create_task(receiver.receive_messages(5))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        async with aclient.get_queue_sender(session_queue) as sender:
            await sender.send_messages(_msgs(sid, "h0"))
        got = await waiting
        assert time.monotonic() - started < 5
        assert _bodies(got) == ["h0"]
        async with aclient.get_queue_sender(session_queue) as sender:
            await sender.send_messages(_msgs(sid, "h1", "h2"))
        got += await _areceive_n(receiver, 2)
        assert _bodies(got) == ["h0", "h1", "h2"]
        for m in got:
            await receiver.complete_message(m)


# ------------------------------------------------------------------------------ misuse


def test_receiving_without_a_session_from_a_session_queue_is_invalid(
    client: raybus.ServiceBusClient, session_queue: str
) -> None:
    with (
        client.get_queue_receiver(session_queue, max_wait_time=1) as receiver,
        pytest.raises(InvalidArgumentError),
    ):
        receiver.receive_messages()


async def test_aio_receiving_without_a_session_from_a_session_queue_is_invalid(
    aclient: aio.ServiceBusClient, session_queue: str
) -> None:
    async with aclient.get_queue_receiver(session_queue, max_wait_time=1) as receiver:
        with pytest.raises(InvalidArgumentError):
            await receiver.receive_messages()


def test_a_session_receiver_on_a_queue_without_sessions_is_invalid(
    client: raybus.ServiceBusClient, plain_queue: str
) -> None:
    for session_id in ("s1", NEXT_AVAILABLE_SESSION):
        receiver = client.get_queue_receiver(plain_queue, session_id=session_id, max_wait_time=1)
        with pytest.raises(InvalidArgumentError):
            receiver.__enter__()
        receiver.close()
