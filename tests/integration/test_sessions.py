"""Sessions against a real local Ray cluster: per-session FIFO, exclusive session locks,
NEXT_AVAILABLE_SESSION, abandon, session state, session lock renewal and expiry, release on
close, dead-lettering of session-less messages, listing sessions, automatic renewal of session
locks, and sessions spread over the partitions of a partitioned queue (sync and asyncio
clients).

Queues are few and shared by the module: most tests use their own uniquely named sessions on
``session_queue`` (lock 30 s) or ``short_lock_queue`` (lock 2 s, for expiry and renewal with
real durations). Tests that need a queue without any other session take a fresh one.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import raybus
from raybus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusSubQueue,
    aio,
)
from raybus._core.slots import PartitionMap
from raybus.exceptions import (
    InvalidArgumentError,
    OperationTimeoutError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from raybus.management import ServiceBusAdministrationClient

LONG_LOCK_S = 30.0
SHORT_LOCK_S = 2.0
PARTITIONS = 3


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    # Tests use their own uniquely named sessions (or queues); see ``module_namespace``.
    return module_namespace


def _name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _sid(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def session_queue(module_namespace: str) -> str:
    """A session-enabled queue with a comfortable lock, shared by the module."""
    name = _name("sq")
    ServiceBusAdministrationClient(module_namespace).create_queue(
        name, requires_session=True, lock_duration=timedelta(seconds=LONG_LOCK_S)
    )
    return name


@pytest.fixture(scope="module")
def short_lock_queue(module_namespace: str) -> str:
    """A session-enabled queue whose session locks run out after ``SHORT_LOCK_S``."""
    name = _name("short")
    ServiceBusAdministrationClient(module_namespace).create_queue(
        name, requires_session=True, lock_duration=timedelta(seconds=SHORT_LOCK_S)
    )
    return name


@pytest.fixture(scope="module")
def plain_queue(module_namespace: str) -> str:
    """A queue without sessions (left empty)."""
    name = _name("plain")
    ServiceBusAdministrationClient(module_namespace).create_queue(name)
    return name


@pytest.fixture(scope="module")
def partitioned_session_queue(module_namespace: str) -> str:
    name = _name("psq")
    ServiceBusAdministrationClient(module_namespace).create_queue(
        name,
        requires_session=True,
        partition_count=PARTITIONS,
        lock_duration=timedelta(seconds=LONG_LOCK_S),
    )
    return name


@pytest.fixture
def lonely_session_queue(admin: ServiceBusAdministrationClient) -> Iterator[str]:
    """A fresh session-enabled queue no other test touches (deleted after the test)."""
    name = _name("lonely")
    admin.create_queue(name, requires_session=True, lock_duration=timedelta(seconds=LONG_LOCK_S))
    yield name


def _send(client: raybus.ServiceBusClient, queue: str, messages: list[ServiceBusMessage]) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(messages)


def _msgs(session_id: str | None, *bodies: str, **kwargs: Any) -> list[ServiceBusMessage]:
    return [ServiceBusMessage(b, session_id=session_id, **kwargs) for b in bodies]


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


def _bodies(messages: list[ServiceBusReceivedMessage]) -> list[Any]:
    return [m.body for m in messages]


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


# ------------------------------------------------------------------------------ partitioned


def _session_workload(prefix: str, sessions: int, per_session: int) -> dict[str, list[str]]:
    return {
        f"{prefix}-{k:02d}-{uuid.uuid4().hex[:4]}": [f"{k}:{i}" for i in range(per_session)]
        for k in range(sessions)
    }


def _interleaved(workload: dict[str, list[str]]) -> list[list[ServiceBusMessage]]:
    """Sends of a few messages each, rotating over the sessions."""
    per_session = len(next(iter(workload.values())))
    sends: list[list[ServiceBusMessage]] = []
    for i in range(0, per_session, 2):
        sends.append(
            [
                ServiceBusMessage(body, session_id=sid)
                for sid, bodies in workload.items()
                for body in bodies[i : i + 2]
            ]
        )
    return sends


def _check_partitioned_sessions(
    workload: dict[str, list[str]],
    received: list[tuple[str, ServiceBusReceivedMessage]],
) -> None:
    pmap = PartitionMap.initial(PARTITIONS)
    total = sum(len(b) for b in workload.values())
    counts = Counter((m.session_id, m.body) for _sid_, m in received)
    assert len(received) == total
    assert all(n == 1 for n in counts.values()), "a message was received twice"
    per_session: dict[str, list[ServiceBusReceivedMessage]] = {}
    for accepted, m in received:
        assert m.session_id == accepted  # a receiver only gets its own session's messages
        per_session.setdefault(accepted, []).append(m)
    assert set(per_session) == set(workload)
    for sid, msgs in per_session.items():
        assert _bodies(msgs) == workload[sid], f"session {sid} out of order"
        assert {m.partition_id for m in msgs} == {pmap.owner(sid)}
    used = {m.partition_id for _s, m in received}
    assert used == {pmap.owner(sid) for sid in workload}
    assert len(used) > 1


def test_sessions_of_a_partitioned_queue_are_served_in_order_exactly_once_by_competing_threads(
    client: raybus.ServiceBusClient, partitioned_session_queue: str
) -> None:
    q = partitioned_session_queue
    workload = _session_workload("thr", sessions=12, per_session=8)
    with client.get_queue_sender(q) as sender:
        for messages in _interleaved(workload):
            sender.send_messages(messages)
    assert set(workload) <= set(client.list_queue_sessions(q))

    received: list[tuple[str, ServiceBusReceivedMessage]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while True:
                receiver = client.get_queue_receiver(
                    q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
                )
                try:
                    receiver.__enter__()
                except OperationTimeoutError:
                    receiver.close()
                    return
                try:
                    assert receiver.session is not None
                    sid = receiver.session.session_id
                    assert sid is not None
                    total = len(workload[sid])
                    got: list[ServiceBusReceivedMessage] = []
                    while len(got) < total:
                        batch = receiver.receive_messages(3, max_wait_time=5)
                        assert batch, f"session {sid} stalled after {len(got)} messages"
                        for m in batch:
                            receiver.complete_message(m)
                        got.extend(batch)
                    with lock:
                        received.extend((sid, m) for m in got)
                finally:
                    receiver.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    _check_partitioned_sessions(workload, received)


async def test_aio_sessions_of_a_partitioned_queue_are_served_exactly_once_by_competing_tasks(
    aclient: aio.ServiceBusClient, partitioned_session_queue: str
) -> None:
    q = partitioned_session_queue
    workload = _session_workload("task", sessions=9, per_session=6)
    async with aclient.get_queue_sender(q) as sender:
        for messages in _interleaved(workload):
            await sender.send_messages(messages)
    listed = set(await aclient.list_queue_sessions(q))
    assert set(workload) <= listed
    received: list[tuple[str, ServiceBusReceivedMessage]] = []

    async def worker() -> None:
        while True:
            receiver = aclient.get_queue_receiver(
                q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
            )
            try:
                await receiver.__aenter__()
            except OperationTimeoutError:
                await receiver.close()
                return
            try:
                assert receiver.session is not None
                sid = receiver.session.session_id
                assert sid is not None
                got = await _areceive_n(receiver, len(workload[sid]))
                for m in got:
                    await receiver.complete_message(m)
                received.extend((sid, m) for m in got)
            finally:
                await receiver.close()

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(3))), 60)
    _check_partitioned_sessions(workload, received)


def test_a_session_of_a_partitioned_queue_keeps_state_deferral_and_peek_in_its_partition(
    client: raybus.ServiceBusClient, partitioned_session_queue: str
) -> None:
    q = partitioned_session_queue
    pmap = PartitionMap.initial(PARTITIONS)
    sid = next(s for s in (f"part-{i}" for i in range(1000)) if pmap.owner(s) == PARTITIONS - 1)
    _send(client, q, _msgs(sid, "d0", "d1", "d2"))
    with client.get_queue_receiver(q, session_id=sid, max_wait_time=5) as receiver:
        assert receiver.session is not None
        peeked = receiver.peek_messages(10)
        assert _bodies(peeked) == ["d0", "d1", "d2"]
        got = _receive_n(receiver, 3)
        assert {m.partition_id for m in got} == {PARTITIONS - 1}
        receiver.defer_message(got[0])
        receiver.session.set_state("deferred d0")
        receiver.complete_message(got[1])
        receiver.complete_message(got[2])
        (back,) = receiver.receive_deferred_messages([got[0].sequence_number])
        assert back.body == "d0"
        receiver.complete_message(back)
        assert receiver.session.get_state() == b"deferred d0"
        receiver.session.set_state(None)
    # Receiving without a session is refused by the partitioned session queue too.
    with (
        client.get_queue_receiver(q, max_wait_time=1) as plain,
        pytest.raises(InvalidArgumentError),
    ):
        plain.receive_messages()
    assert sid not in client.list_queue_sessions(q)


async def test_aio_next_available_on_a_partitioned_queue_wakes_for_a_session_in_any_partition(
    aclient: aio.ServiceBusClient, partitioned_session_queue: str
) -> None:
    q = partitioned_session_queue
    pmap = PartitionMap.initial(PARTITIONS)
    sid = next(s for s in (f"wake-{i}" for i in range(1000)) if pmap.owner(s) == PARTITIONS - 1)

    async def send_later() -> None:
        await asyncio.sleep(0.5)
        async with aclient.get_queue_sender(q) as sender:
            await sender.send_messages(_msgs(sid, "w0", "w1"))

    sending = asyncio.create_task(send_later())
    started = time.monotonic()
    async with aclient.get_queue_receiver(
        q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=20
    ) as receiver:
        assert time.monotonic() - started < 10, "the waiting accept was not woken"
        assert receiver.session is not None and receiver.session.session_id == sid
        got = await _areceive_n(receiver, 2)
        assert _bodies(got) == ["w0", "w1"]
        assert {m.partition_id for m in got} == {PARTITIONS - 1}
        for m in got:
            await receiver.complete_message(m)
    await sending
