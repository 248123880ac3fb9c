"""A receive under way when ``close()`` runs, or whose caller is cancelled: what its broker
answer becomes.

The receive below waits at the broker (a long poll of up to ``max_wait_time``) when the
receiver is closed: close() ends that wait (the partition's ``end_waits``), so a message sent
afterwards stays in the queue. An answer that reached the receiver first is handled so: peek-
lock, the receive gives every message it got back at once and returns ``[]``, so nothing stays
locked to the closed receiver (which could not settle it) until its lock expires;
receive-and-delete, the broker deleted what it handed out, so the receive returns it (nothing
lost). A cancelled receive's wait is ended the same way. The queues' locks last a minute (30 s
for sessions): a second receiver that gets the message within its 5 s wait, with no delivery
counted, got it from the release, not from a lock expiry.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
import settlement_support
from settlement_support import RAD, _areceive_n, _asend, _receive_n, _send, hold_answers

import raybus
from raybus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusReceivedMessage, aio
from raybus._core.partition import COMPLETE, SettleOp
from raybus._core.record import from_wire
from raybus.aio._receiver import lock_token_of
from raybus.exceptions import ServiceBusConnectionError, SettlementFailedError
from raybus.management import ServiceBusAdministrationClient

namespace = settlement_support.namespace
queue = settlement_support.queue

# How long the test lets a receive reach the broker and wait there before closing; the
# outcome checked is the same if it has not got there yet.
_SETTLE_S = 0.5


def _bodies(messages: list[ServiceBusReceivedMessage]) -> list[str]:
    return sorted(str(m.body) for m in messages)


async def _aget_released(aclient: aio.ServiceBusClient, queue: str, bodies: list[str]) -> None:
    """A second receiver gets ``bodies`` well within the lock duration, none counted."""
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as other:
        got = await _areceive_n(other, len(bodies))
        assert _bodies(got) == sorted(bodies)
        assert [m.delivery_count for m in got] == [0] * len(bodies)
        await other.complete_messages(got)
        assert await other.receive_messages(5, max_wait_time=0.2) == []


def _get_released(client: raybus.ServiceBusClient, queue: str, bodies: list[str]) -> None:
    with client.get_queue_receiver(queue, max_wait_time=5) as other:
        got = _receive_n(other, len(bodies))
        assert _bodies(got) == sorted(bodies)
        assert [m.delivery_count for m in got] == [0] * len(bodies)
        other.complete_messages(got)
        assert other.receive_messages(5, max_wait_time=0.2) == []


async def _resolve_route(receiver: aio.ServiceBusReceiver) -> None:
    """Resolve the receiver's route (no hop later) without a receive: one that finds nothing
    leaves a wait at the partition (``aio._fanout.receive_single``), and the next receive
    would wait on that instead of making the partition call these tests are about."""
    await receiver.peek_messages(1)


async def _aclose_during_receive(
    aclient: aio.ServiceBusClient, receiver: aio.ServiceBusReceiver, queue: str, n: int
) -> list[ServiceBusReceivedMessage]:
    """Start ``receive_messages(1)``, close the receiver while it waits at the broker, then
    send ``n`` messages (one call, so that the waiting receive can take them all); returns
    what the receive returned."""
    await _resolve_route(receiver)
    receiving = asyncio.ensure_future(receiver.receive_messages(1))
    await asyncio.sleep(_SETTLE_S)
    assert not receiving.done()
    await receiver.close()
    await _asend(aclient, queue, *[f"m{i}" for i in range(n)])
    return await receiving


@pytest.mark.parametrize(("prefetch", "n"), [(0, 1), (5, 5)], ids=["plain", "prefetch"])
async def test_aio_receive_under_way_at_close_gives_its_messages_back_and_returns_nothing(
    aclient: aio.ServiceBusClient, queue: str, prefetch: int, n: int
) -> None:
    receiver = aclient.get_queue_receiver(queue, max_wait_time=5, prefetch_count=prefetch)
    assert await _aclose_during_receive(aclient, receiver, queue, n) == []
    assert not receiver._buffer
    await _aget_released(aclient, queue, [f"m{i}" for i in range(n)])


@pytest.mark.parametrize(("prefetch", "n"), [(0, 1), (5, 5)], ids=["plain", "prefetch"])
def test_sync_receive_under_way_when_another_thread_closes_gives_its_messages_back(
    client: raybus.ServiceBusClient, queue: str, prefetch: int, n: int
) -> None:
    """The sync receive waits on its caller's thread (its direct path to the partition);
    close() comes from another thread."""
    receiver = client.get_queue_receiver(queue, max_wait_time=5, prefetch_count=prefetch)
    assert receiver.peek_messages(1) == []  # caches the route, leaving no wait out
    assert receiver._aio.direct_ok(receiver._aio._conn.cached_route(queue))
    assert not receiver._aio._standing_waits.out_at(0)
    outcome: list[Any] = []

    def receive() -> None:
        try:
            outcome.append(receiver.receive_messages(1))
        except BaseException as exc:  # reported by the assertion below
            outcome.append(exc)

    receiving = threading.Thread(target=receive)
    receiving.start()
    receiving.join(_SETTLE_S)
    assert receiving.is_alive()
    receiver.close()
    _send(client, queue, *[f"m{i}" for i in range(n)])
    receiving.join(30)
    assert not receiving.is_alive()
    assert outcome == [[]]
    _get_released(client, queue, [f"m{i}" for i in range(n)])


def test_sync_receive_waiting_forever_ends_when_another_thread_closes(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    """The sync receive's direct path, with no ``max_wait_time`` (waits in 30 s slices):
    close() from another thread ends its wait at the partition, so it returns ``[]`` at
    once rather than at the end of the slice, and takes nothing sent afterwards."""
    receiver = client.get_queue_receiver(queue)
    assert receiver.peek_messages(1) == []  # caches the route, leaving no wait out
    assert receiver._aio.direct_ok(receiver._aio._conn.cached_route(queue))
    assert not receiver._aio._standing_waits.out_at(0)
    outcome: list[Any] = []
    receiving = threading.Thread(target=lambda: outcome.append(receiver.receive_messages(1)))
    receiving.start()
    receiving.join(_SETTLE_S)
    assert receiving.is_alive()
    receiver.close()
    receiving.join(10)  # not the 30 s slice
    assert not receiving.is_alive() and outcome == [[]]
    _send(client, queue, "after close")
    _get_released(client, queue, ["after close"])


@pytest.mark.parametrize(("prefetch", "n"), [(0, 1), (3, 3)], ids=["plain", "prefetch"])
async def test_aio_receive_and_delete_under_way_at_close_takes_nothing_sent_after_it(
    aclient: aio.ServiceBusClient, queue: str, prefetch: int, n: int
) -> None:
    """close() ended the receive's wait at the partition: it returns nothing, and what is
    sent afterwards stays in the queue (nothing is deleted for the closed receiver)."""
    receiver = aclient.get_queue_receiver(
        queue, max_wait_time=5, prefetch_count=prefetch, receive_mode=RAD
    )
    assert await _aclose_during_receive(aclient, receiver, queue, n) == []
    async with aclient.get_queue_receiver(queue, receive_mode=RAD) as other:
        got = await _areceive_n(other, n)
        assert _bodies(got) == [f"m{i}" for i in range(n)]


@pytest.mark.parametrize(("prefetch", "n"), [(0, 1), (3, 3)], ids=["plain", "prefetch"])
async def test_aio_receive_and_delete_answered_before_close_ended_it_returns_all_it_took(
    aclient: aio.ServiceBusClient, queue: str, prefetch: int, n: int
) -> None:
    """The broker answered before close()'s end reached it (held here until close() has
    started): it deleted what it handed out, so the receive returns all of it, more than it
    asked for when it prefetched (a closed receiver has no buffer to keep the rest in)."""
    receiver = aclient.get_queue_receiver(
        queue, max_wait_time=5, prefetch_count=prefetch, receive_mode=RAD
    )
    await _resolve_route(receiver)
    answered, proceed = hold_answers(receiver)  # released once close() has started
    receiving = asyncio.ensure_future(receiver.receive_messages(1))
    await asyncio.sleep(_SETTLE_S)
    await _asend(aclient, queue, *[f"m{i}" for i in range(n)])
    await asyncio.wait_for(answered.wait(), 10)
    closing = asyncio.ensure_future(receiver.close())
    await asyncio.sleep(0.2)
    proceed.set()
    got = await asyncio.wait_for(receiving, 10)
    await asyncio.wait_for(closing, 10)
    assert _bodies(got) == [f"m{i}" for i in range(n)]
    async with aclient.get_queue_receiver(queue) as other:
        assert await other.receive_messages(5, max_wait_time=0.3) == []


@pytest.mark.parametrize("mode", ["peek_lock", "receive_and_delete"])
async def test_a_cancelled_receive_leaves_nothing_to_nobody(
    aclient: aio.ServiceBusClient, queue: str, mode: str
) -> None:
    """``asyncio.wait_for`` around a long receive cancels it on this side only: its partition
    call is ended too, so the message sent next goes to the same receiver's next receive at
    once (not locked to nobody until its lock expired, nor, receive-and-delete, deleted)."""
    rad = mode == "receive_and_delete"
    kw: dict[str, Any] = {"receive_mode": RAD} if rad else {}
    async with aclient.get_queue_receiver(queue, **kw) as receiver:
        await _resolve_route(receiver)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(receiver.receive_messages(1, max_wait_time=20), _SETTLE_S)
        await _asend(aclient, queue, "after the cancel")
        got = await receiver.receive_messages(1, max_wait_time=5)
        assert _bodies(got) == ["after the cancel"] and got[0].delivery_count == 0
        if not rad:
            await receiver.complete_message(got[0])
        assert await asyncio.wait_for(_no_waits(receiver), 5)


async def _no_waits(receiver: aio.ServiceBusReceiver) -> bool:
    while receiver._waits:
        await asyncio.sleep(0.05)
    return True


async def _cancel_once_answered(
    aclient: aio.ServiceBusClient, receiver: aio.ServiceBusReceiver, queue: str, body: str
) -> asyncio.Event:
    """Start a long receive, send ``body``, hold the partition's answer on its way back and
    cancel the receive meanwhile; returns the event that lets the answer through."""
    answered, proceed = hold_answers(receiver)
    receiving = asyncio.ensure_future(receiver.receive_messages(1, max_wait_time=20))
    await asyncio.sleep(_SETTLE_S)
    await _asend(aclient, queue, body)
    await asyncio.wait_for(answered.wait(), 10)
    receiving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await receiving
    return proceed


@pytest.mark.parametrize("mode", ["peek_lock", "receive_and_delete"])
async def test_what_a_cancelled_receive_took_before_its_end_is_not_lost(
    aclient: aio.ServiceBusClient, queue: str, mode: str
) -> None:
    """The partition answered before the end reached it (the answer held here until the
    caller was cancelled): peek-lock, the messages are given back at once, none counted;
    receive-and-delete, the broker deleted them, so the next receive returns them."""
    rad = mode == "receive_and_delete"
    kw: dict[str, Any] = {"receive_mode": RAD} if rad else {}
    async with aclient.get_queue_receiver(queue, **kw) as receiver:
        await _resolve_route(receiver)
        call_rows = receiver._call_rows
        proceed = await _cancel_once_answered(aclient, receiver, queue, "taken")
        receiver._call_rows = call_rows  # type: ignore[method-assign]
        proceed.set()
        await asyncio.wait_for(_no_waits(receiver), 5)
        if rad:
            got = await receiver.receive_messages(1, max_wait_time=0.1)
            assert _bodies(got) == ["taken"]
    if not rad:
        await _aget_released(aclient, queue, ["taken"])


async def test_what_a_cancelled_receive_and_delete_took_after_its_receiver_closed_is_logged(
    aclient: aio.ServiceBusClient, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Receive-and-delete, the partition answered a cancelled receive before its end arrived,
    and the receiver closed before the answer came back: the broker deleted the message and
    the closed receiver has no buffer to keep it in, so it is lost to the program; raybus
    says so in a warning naming the entity, not silently."""
    receiver = aclient.get_queue_receiver(queue, receive_mode=RAD)
    await _resolve_route(receiver)
    proceed = await _cancel_once_answered(aclient, receiver, queue, "deleted for nobody")
    await receiver.close()
    with caplog.at_level(logging.WARNING, logger="raybus.receiver"):
        proceed.set()
        await asyncio.wait_for(_no_waits(receiver), 5)
    assert [r.getMessage() for r in caplog.records] == [
        f"{receiver.client_identifier}: 1 message(s) of {queue} received and deleted for a "
        "cancelled receive after its receiver closed"
    ]


async def test_aio_receive_under_way_at_close_on_a_partitioned_queue_gives_back(
    aclient: aio.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    """The receive waits on every partition at once (``wait_available``), then takes the
    messages from the one that has them."""
    q = f"part-{uuid.uuid4().hex[:8]}"
    admin.create_queue(q, partition_count=3)
    receiver = aclient.get_queue_receiver(q, max_wait_time=5, prefetch_count=4)
    assert await _aclose_during_receive(aclient, receiver, q, 4) == []
    await _aget_released(aclient, q, [f"m{i}" for i in range(4)])


async def test_aio_session_receive_under_way_at_close_returns_nothing_and_frees_the_session(
    aclient: aio.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    """close() releases the session (its messages are available again, none counted), so
    the receive it cut short neither raises that the session lock is gone nor hands out a
    message locked by a session that is no longer held."""
    q = f"sess-{uuid.uuid4().hex[:8]}"
    admin.create_queue(q, requires_session=True, lock_duration=timedelta(seconds=30))
    sid = "s1"
    receiver = aclient.get_queue_receiver(q, session_id=sid, max_wait_time=5)
    async with receiver:
        receiving = asyncio.ensure_future(receiver.receive_messages(1))
        await asyncio.sleep(_SETTLE_S)
        assert not receiving.done()
    async with aclient.get_queue_sender(q) as sender:
        await sender.send_messages(ServiceBusMessage("s0", session_id=sid))
    assert await receiving == []
    async with aclient.get_queue_receiver(q, session_id=sid, max_wait_time=5) as other:
        (msg,) = await _areceive_n(other, 1)
        assert (msg.body, msg.delivery_count) == ("s0", 0)
        await other.complete_message(msg)


async def test_aio_next_available_session_accepted_after_close_is_given_up_at_once(
    aclient: aio.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    """The receive of a ``NEXT_AVAILABLE_SESSION`` receiver waits to accept a session; the
    session it accepts once closed (close() found none to release) is released at once, not
    left locked to the closed receiver until the session lock expires."""
    q = f"sess-{uuid.uuid4().hex[:8]}"
    admin.create_queue(q, requires_session=True, lock_duration=timedelta(seconds=30))
    receiver = aclient.get_queue_receiver(q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5)
    receiving = asyncio.ensure_future(receiver.receive_messages(1))
    await asyncio.sleep(_SETTLE_S)
    assert not receiving.done()
    await receiver.close()
    async with aclient.get_queue_sender(q) as sender:
        await sender.send_messages(ServiceBusMessage("s0", session_id="s2"))
    assert await receiving == []
    async with aclient.get_queue_receiver(
        q, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
    ) as other:
        assert other.session is not None and other.session.session_id == "s2"
        (msg,) = await _areceive_n(other, 1)
        assert (msg.body, msg.delivery_count) == ("s0", 0)
        await other.complete_message(msg)


async def test_aio_deferred_receive_answered_after_close_gives_the_messages_back_and_raises(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    """The deferred receive's answer arrives once close() has started (the test closes the
    receiver inside the partition call's await): the messages go back, deferred again and
    not counted, and the call raises instead of handing out locks nobody can settle."""
    await _asend(aclient, queue, "d")
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as first:
        (msg,) = await _areceive_n(first, 1)
        await first.defer_message(msg)
    seq = msg.sequence_number
    receiver = aclient.get_queue_receiver(queue, max_wait_time=5)
    call_rows = receiver._call_rows

    async def closing_meanwhile(*args: Any, **kwargs: Any) -> Any:
        rows = await call_rows(*args, **kwargs)
        await receiver.close()
        return rows

    receiver._call_rows = closing_meanwhile  # type: ignore[method-assign]
    with pytest.raises(raybus.exceptions.InvalidArgumentError, match="closed"):
        await receiver.receive_deferred_messages([seq])
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as other:
        (again,) = await other.receive_deferred_messages([seq])  # not locked: given back
        assert str(again.body) == "d" and again.delivery_count == msg.delivery_count
        await other.complete_message(again)


async def test_put_back_messages_come_first_and_after_close_are_given_back_at_once(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    """``put_back`` (the processor's replicas, stopping): before close() the next receive
    hands them out again, first; once close() took the buffer they are released at once."""
    await _asend(aclient, queue, "a", "b")
    receiver = aclient.get_queue_receiver(queue, max_wait_time=5)
    got = await _areceive_n(receiver, 2)
    await receiver.put_back(got)
    again = await receiver.receive_messages(2, max_wait_time=0.1)
    assert [str(m.body) for m in again] == [str(m.body) for m in got]  # from the buffer
    await receiver.close()
    await receiver.put_back(again)
    await _aget_released(aclient, queue, ["a", "b"])


class _LoopNotYetRun:
    """Stands in for the loop ``settle_from_thread`` hands a settlement to: it keeps the
    callback instead of running it, as a loop busy elsewhere would when close() comes."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> None:
        self.callbacks.append(callback)


async def test_close_sends_and_reports_settlements_handed_over_but_not_yet_sent(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    """The sync API's threads hand settlements to raybus's loop (``settle_from_thread``);
    close() coming before the loop sent them sends them itself, waits for the broker, and
    raises for the one it refused. Before, close() waited only for what had been sent: the
    completion went out after close() returned, and its refusal was never reported."""
    await _asend(aclient, queue, "kept", "lost")
    receiver = aclient.get_queue_receiver(queue, max_wait_time=5)
    got = {str(m.body): m for m in await _areceive_n(receiver, 2)}
    await settlement_support._lose_lock(receiver, got["lost"])  # its completion is refused
    held = _LoopNotYetRun()
    for message in got.values():
        op = SettleOp(COMPLETE, lock_token_of(message))
        assert receiver.settle_from_thread(message, op, held)  # type: ignore[arg-type]
    assert len(held.callbacks) == 1  # one hand-over, not yet run
    with pytest.raises(SettlementFailedError) as refused:
        await receiver.close()
    assert [seq for seq, _, _ in refused.value.failures] == [got["lost"].sequence_number]
    async with aclient.get_queue_receiver(queue) as other:
        assert [str(m.body) for m in await other.peek_messages(5)] == ["lost"]


async def test_a_settlement_handed_over_once_close_has_started_waits_for_its_answer(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    """While close() waits for earlier settlements, a sync thread's settlement is not handed
    over (close() may have looked already): it takes the waiting path, which reports its
    own refusal to its own caller."""
    await _asend(aclient, queue, "late")
    receiver = aclient.get_queue_receiver(queue, max_wait_time=5)
    (message,) = await _areceive_n(receiver, 1)
    earlier: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    receiver._pending.add(earlier)  # an earlier settlement close() must wait for
    closing = asyncio.ensure_future(receiver.close())
    await asyncio.sleep(0.2)
    assert not closing.done()
    held = _LoopNotYetRun()
    op = SettleOp(COMPLETE, lock_token_of(message))
    assert not receiver.settle_from_thread(message, op, held)  # type: ignore[arg-type]
    assert held.callbacks == [] and not message._settled
    await receiver._settle(message, op)  # the waiting path the sync API takes instead
    assert not closing.done()
    earlier.set_result([None])
    receiver._pending.discard(earlier)
    await closing
    async with aclient.get_queue_receiver(queue) as other:
        assert await other.peek_messages(5) == []


async def test_an_end_that_reaches_the_partition_before_its_receive_ends_that_receive_only(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    """close() and a cancel send ``end_waits`` without waiting for the receive to get there
    first: an end that arrives before its receive makes that receive take nothing and
    return at once, a message waiting or not, and is used up by it; the next receive under
    the same name takes the message."""
    await _asend(aclient, queue, "waiting")
    async with aclient.get_queue_receiver(queue) as receiver:
        args = receiver._receive_args(1, None, wait_s=5)
        await receiver._call("end_waits", ["early"])
        started = time.monotonic()
        assert await receiver._call_rows("receive", *args, "early", pieces=args[-1]) == []
        assert time.monotonic() - started < 2.5  # not the 5 s wait
        (row,) = await receiver._call_rows("receive", *args, "early", pieces=args[-1])
        await receiver._release(from_wire([row]))
    await _aget_released(aclient, queue, ["waiting"])


def _refuse_end_waits(receiver: aio.ServiceBusReceiver) -> list[str]:
    """Make the receiver's ``end_waits`` calls fail as they would with the partition down or
    restarting; returns the waiter ids each refused call named."""
    refused: list[str] = []
    call = receiver._call

    async def calling(method_name: str, *args: Any, **kwargs: Any) -> Any:
        if method_name == "end_waits":
            refused.extend(args[0])
            raise ServiceBusConnectionError("partition unreachable (test)", receiver.entity_path)
        return await call(method_name, *args, **kwargs)

    receiver._call = calling  # type: ignore[method-assign]
    return refused


@pytest.mark.parametrize("mode", ["peek_lock", "receive_and_delete"])
async def test_a_cancelled_receive_whose_end_cannot_reach_the_partition_loses_nothing(
    aclient: aio.ServiceBusClient, queue: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``end_waits`` is best effort: when the partition cannot be told (down, restarting),
    the cancelled receive waits on there and takes the next message. What it takes is then
    given back at once, none counted (peek-lock), or kept for the next receive
    (receive-and-delete: the broker deleted it); the failed end is logged at debug level."""
    rad = mode == "receive_and_delete"
    kw: dict[str, Any] = {"receive_mode": RAD} if rad else {}
    async with aclient.get_queue_receiver(queue, **kw) as receiver:
        await _resolve_route(receiver)
        refused = _refuse_end_waits(receiver)
        with caplog.at_level(logging.DEBUG, logger="raybus.receiver"):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(receiver.receive_messages(1, max_wait_time=20), _SETTLE_S)
            await _asend(aclient, queue, "taken by the orphan")
            await asyncio.wait_for(_no_waits(receiver), 10)  # the orphan's call answered
        assert len(refused) == 1
        assert (
            f"{receiver.client_identifier}: waits at partition 0 of {queue} not ended"
            in caplog.text
        )
        if rad:
            got = await receiver.receive_messages(1, max_wait_time=0.1)
            assert _bodies(got) == ["taken by the orphan"]
    if not rad:
        await _aget_released(aclient, queue, ["taken by the orphan"])
