"""``complete_messages`` on a prefetching receiver refills the prefetch buffer with the same
broker call (``settle_receive``) once the buffer holds less than the last receive asked for:
the next receive is then served without a call of its own. Every message still arrives once,
in order, locked to this receiver; refusals, ``close`` and the dead-letter sub-queue behave
as without the refill. And the standing request of a prefetching asyncio receiver: a receive
that found nothing leaves its partition call out, and what it brings goes to the buffer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import settlement_support
from settlement_support import _lose_lock, hold_answers

import raybus
from raybus import ServiceBusMessage, ServiceBusReceivedMessage, _lane, _rpc, aio
from raybus._core.partition import COMPLETE, SettleOp
from raybus._sync import run
from raybus.aio import _prefetch
from raybus.exceptions import (
    InvalidArgumentError,
    MessagingEntityNotFoundError,
    ServiceBusConnectionError,
    ServiceBusError,
    SettlementFailedError,
)
from raybus.management import ServiceBusAdministrationClient

# One namespace for the module, a fresh queue per test from the pool (see conftest).
namespace = settlement_support.namespace
queue = settlement_support.queue


def _send(client: raybus.ServiceBusClient, queue: str, n: int) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(n)])


def _calls(receiver: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the partition methods ``receiver`` calls from now on (both paths)."""
    names: list[str] = []
    inner = receiver._aio if hasattr(receiver, "_aio") else receiver
    blocking, call = inner.call_blocking, inner._call

    def call_blocking(name: str, *args: Any, **kw: Any) -> Any:
        names.append(name)
        return blocking(name, *args, **kw)

    async def _call(name: str, *args: Any, **kw: Any) -> Any:
        names.append(name)
        return await call(name, *args, **kw)

    monkeypatch.setattr(inner, "call_blocking", call_blocking)
    monkeypatch.setattr(inner, "_call", _call)
    return names


def test_complete_messages_refills_the_buffer_and_the_next_receive_needs_no_call(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _send(client, queue, 300)
    seen: list[int] = []
    with client.get_queue_receiver(queue, prefetch_count=150, max_wait_time=5) as receiver:
        first = receiver.receive_messages(100)
        assert len(first) == 100 and len(receiver._aio._buffer) == 50
        receiver.complete_messages(first)  # 50 left < 100 asked: refill to 150
        assert len(receiver._aio._buffer) == 150
        seen += [m.sequence_number for m in first]
        calls = _calls(receiver, monkeypatch)
        second = receiver.receive_messages(100)
        assert len(second) == 100 and calls == []  # served from the buffer
        receiver.complete_messages(second)  # 50 left: refill with the last 100
        third = receiver.receive_messages(100)
        receiver.complete_messages(third)
        assert calls.count("receive") == 0
        seen += [m.sequence_number for m in second + third]
        assert receiver.receive_messages(10, max_wait_time=0.3) == []
    assert seen == sorted(seen) and len(set(seen)) == 300
    assert admin.get_queue_runtime_properties(queue).active_message_count == 0


async def test_aio_complete_messages_refills_the_buffer(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient, queue: str
) -> None:
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(60)])
    seen: list[int] = []
    async with aclient.get_queue_receiver(queue, prefetch_count=30, max_wait_time=5) as receiver:
        got = await receiver.receive_messages(20)
        assert len(receiver._buffer) == 10
        await receiver.complete_messages(got)
        assert len(receiver._buffer) == 30
        seen += [m.sequence_number for m in got]
        while len(seen) < 60:
            got = await receiver.receive_messages(20)
            assert got, f"stalled at {len(seen)}"
            assert all(m.lock_token for m in got)
            await receiver.complete_messages(got)
            seen += [m.sequence_number for m in got]
    assert seen == sorted(seen) and len(set(seen)) == 60
    props = await aadmin.get_queue_runtime_properties(queue)
    assert props.active_message_count == 0


def test_no_refill_without_prefetch_or_while_the_buffer_suffices(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, 30)
    with client.get_queue_receiver(queue, max_wait_time=5) as plain:
        got = plain.receive_messages(5)
        plain.complete_messages(got)
        assert len(plain._aio._buffer) == 0  # prefetch_count 0: nothing taken ahead
    with client.get_queue_receiver(queue, prefetch_count=20, max_wait_time=5) as receiver:
        got = receiver.receive_messages(5)  # fetches 20, hands out 5
        assert len(receiver._aio._buffer) == 15
        receiver.complete_messages(got)  # 15 >= 5: the next receive needs no call
        assert len(receiver._aio._buffer) == 15
        # The other 5 are still available to a competing receiver.
        with client.get_queue_receiver(queue, max_wait_time=5) as other:
            rest = other.receive_messages(10)
            assert len(rest) == 5
            other.complete_messages(rest)


def test_no_refill_when_prefetch_is_smaller_than_the_receives(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    """A buffer smaller than the receives would make the next one return fewer messages than
    a call of its own fetches: such a receiver completes without refilling."""
    _send(client, queue, 40)
    with client.get_queue_receiver(queue, prefetch_count=5, max_wait_time=5) as receiver:
        got = receiver.receive_messages(20)
        assert len(got) == 20
        receiver.complete_messages(got)
        assert len(receiver._aio._buffer) == 0
        rest = receiver.receive_messages(20)
        assert len(rest) == 20  # one call, all it asked for
        receiver.complete_messages(rest)


def test_refused_completion_still_refills_and_the_rest_complete(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, 6)
    with client.get_queue_receiver(queue, prefetch_count=3, max_wait_time=5) as receiver:
        got = receiver.receive_messages(3)
        assert len(got) == 3 and len(receiver._aio._buffer) == 0
        lost = got[1]
        run(_lose_lock(receiver._aio, lost))
        with pytest.raises(SettlementFailedError) as info:
            receiver.complete_messages(got)
        assert [f[0] for f in info.value.failures] == [lost.sequence_number]
        # The refill happened all the same: the released one and two more.
        buffered = [m.sequence_number for m in receiver._aio._buffer]
        assert buffered == [
            lost.sequence_number,
            got[2].sequence_number + 1,
            got[2].sequence_number + 2,
        ]
        rest = receiver.receive_messages(3)
        receiver.complete_messages(rest)
        last = receiver.receive_messages(3)
        receiver.complete_messages(last)
        assert len(rest) + len(last) == 4
    assert admin.get_queue_runtime_properties(queue).active_message_count == 0


def test_close_releases_refilled_messages_at_once(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, 8)
    receiver = client.get_queue_receiver(queue, prefetch_count=4, max_wait_time=5)
    got = receiver.receive_messages(4)
    receiver.complete_messages(got)
    assert len(receiver._aio._buffer) == 4
    receiver.close()
    with client.get_queue_receiver(queue, max_wait_time=5) as other:
        again: list[ServiceBusReceivedMessage] = []
        while len(again) < 4:
            batch = other.receive_messages(4)
            assert batch, "the refilled messages were not released"
            again += batch
        assert all(m.delivery_count == 0 for m in again)  # a release counts no delivery
        other.complete_messages(again)


def test_dead_letter_receiver_refills_from_the_dead_letter_queue(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, 6)
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        got: list[ServiceBusReceivedMessage] = []
        while len(got) < 6:
            got += receiver.receive_messages(6)
        for m in got:
            receiver.dead_letter_message(m, reason="test")
    with client.get_queue_receiver(
        queue, sub_queue="deadletter", prefetch_count=4, max_wait_time=5
    ) as dlq:
        first = dlq.receive_messages(4)
        assert len(first) == 4
        dlq.complete_messages(first)
        assert len(dlq._aio._buffer) == 2  # the other two, taken with the completion
        rest = dlq.receive_messages(4)
        assert [m.dead_letter_reason for m in rest] == ["test", "test"]
        dlq.complete_messages(rest)
    props = admin.get_queue_runtime_properties(queue)
    assert props.dead_letter_message_count == 0 and props.active_message_count == 0


def test_settle_receive_on_a_session_queue_is_refused_and_settles_nothing(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    admin.create_queue("sq", requires_session=True)
    with client.get_queue_sender("sq") as sender:
        sender.send_messages(
            [ServiceBusMessage("a", session_id="s"), ServiceBusMessage("b", session_id="s")]
        )
    with client.get_queue_receiver("sq", session_id="s", max_wait_time=5) as receiver:
        (first,) = receiver.receive_messages(1)
        op: Any = SettleOp(COMPLETE, first.lock_token or "").to_wire()
        with pytest.raises(InvalidArgumentError, match="requires sessions"):
            run(receiver._aio._call("settle_receive", [op], 10, False, 1, returns=2))
        receiver.complete_message(first)  # still locked to us: the refused call changed nothing
        (second,) = receiver.receive_messages(1)
        assert str(second) == "b"
        receiver.complete_message(second)
    assert admin.get_queue_runtime_properties("sq").active_message_count == 0


async def test_a_refill_landing_after_close_started_is_given_back_at_once(
    aclient: aio.ServiceBusClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(8)])
    receiver = aclient.get_queue_receiver(queue, prefetch_count=4, max_wait_time=5)
    got = await receiver.receive_messages(4)
    assert len(got) == 4 and not receiver._buffer
    # close() runs while the completion's settle_receive call is under way.
    in_flight = asyncio.Event()
    real = _rpc.call

    async def spy(*args: Any, **kwargs: Any) -> Any:
        call = asyncio.ensure_future(real(*args, **kwargs))
        if getattr(args[1], "_method_name", "") == "settle_receive":
            in_flight.set()
        return await call

    monkeypatch.setattr(_rpc, "call", spy)
    completing = asyncio.ensure_future(receiver.complete_messages(got))
    await in_flight.wait()
    await receiver.close()
    await completing  # the completions themselves succeeded
    assert not receiver._buffer
    async with aclient.get_queue_receiver(queue, max_wait_time=5) as other:
        again: list[ServiceBusReceivedMessage] = []
        while len(again) < 4:
            batch = await other.receive_messages(4, max_wait_time=2)
            assert batch, "the messages refilled during close() stayed locked"
            again += batch
        assert all(m.delivery_count == 0 for m in again)
        await other.complete_messages(again)


class _Held:
    """Holds the sync ``settle_receive`` call of ``receiver`` (its prefetch refill) on the
    calling thread, ``before`` the broker gets it or after it answered, until ``go_on``."""

    def __init__(self, receiver: Any, monkeypatch: pytest.MonkeyPatch, before: bool) -> None:
        self.holding, self.go_on = threading.Event(), threading.Event()
        real = receiver._aio.call_blocking

        def held(name: str, *args: Any, **kwargs: Any) -> Any:
            if name != "settle_receive":
                return real(name, *args, **kwargs)
            if before:
                self._hold()
            answer = real(name, *args, **kwargs)
            if not before:
                self._hold()
            return answer

        monkeypatch.setattr(receiver._aio, "call_blocking", held)

    def _hold(self) -> None:
        self.holding.set()
        assert self.go_on.wait(60)


def _in_thread(target: Any, *args: Any) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``target(*args)`` in a thread of its own; the list gets what it raised."""
    errors: list[BaseException] = []

    def run_it() -> None:
        try:
            target(*args)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_it, daemon=True)
    thread.start()
    return thread, errors


def _all_at_once(client: raybus.ServiceBusClient, queue: str, n: int) -> None:
    """A second receiver gets ``n`` messages without waiting for a lock to expire (the
    queue's lock lasts a minute), none with a delivery counted; it completes them."""
    with client.get_queue_receiver(queue, max_wait_time=5) as other:
        again: list[ServiceBusReceivedMessage] = []
        while len(again) < n:
            batch = other.receive_messages(n, max_wait_time=2)
            assert batch, f"{n - len(again)} refilled messages stayed locked"
            again += batch
        assert all(m.delivery_count == 0 for m in again)  # a release counts no delivery
        other.complete_messages(again)


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync API's direct path (a partition call from the caller's thread), which it takes
    while its loop has no lane to the partition (``raybus._lane``): lanes off."""
    monkeypatch.setattr(_lane, "ENABLED", False)


@pytest.mark.usefixtures("direct")
@pytest.mark.parametrize("before", [True, False], ids=["before-the-call", "after-the-answer"])
def test_close_from_another_thread_waits_for_a_sync_refill_under_way(
    client: raybus.ServiceBusClient,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
    eventually: Callable[..., None],
    before: bool,
) -> None:
    """The sync ``complete_messages`` refills from its caller's thread; ``close()`` from
    another thread meanwhile waits until the refilled messages are in the buffer, then
    releases them with it: none stays locked to the closed receiver."""
    _send(client, queue, 8)
    receiver = client.get_queue_receiver(queue, prefetch_count=4, max_wait_time=5)
    got = receiver.receive_messages(4)
    assert len(got) == 4 and not receiver._aio._buffer
    held = _Held(receiver, monkeypatch, before)
    completing, completion_errors = _in_thread(receiver.complete_messages, got)
    assert held.holding.wait(60)
    closing, close_errors = _in_thread(receiver.close)

    def close_started() -> None:
        assert receiver._aio._closing

    eventually(close_started)
    closing.join(0.2)
    assert closing.is_alive(), "close() did not wait for the refill under way"
    held.go_on.set()
    completing.join(60)
    closing.join(60)
    assert not completing.is_alive() and not closing.is_alive()
    assert completion_errors == [] and close_errors == []  # the completions succeeded
    assert not receiver._aio._buffer
    _all_at_once(client, queue, 4)
    with client.get_queue_receiver(queue, max_wait_time=5) as last:
        assert last.receive_messages(8, max_wait_time=0.3) == []  # the first 4: completed


@pytest.mark.usefixtures("direct")
def test_close_waits_for_a_refill_no_longer_than_its_bound(
    client: raybus.ServiceBusClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refill that does not answer within ``REFILL_WAIT_S`` is left behind: close()
    returns, and the messages it brings are not buffered by the closed receiver but given
    back at once when it answers (none stays locked to the closed receiver)."""
    monkeypatch.setattr(_prefetch, "REFILL_WAIT_S", 0.3)
    _send(client, queue, 8)
    receiver = client.get_queue_receiver(queue, prefetch_count=4, max_wait_time=5)
    got = receiver.receive_messages(4)
    held = _Held(receiver, monkeypatch, before=False)
    completing, completion_errors = _in_thread(receiver.complete_messages, got)
    assert held.holding.wait(60)
    receiver.close()  # returns although the refill is still held
    held.go_on.set()
    completing.join(60)
    assert not completing.is_alive() and completion_errors == []
    assert not receiver._aio._buffer
    with pytest.raises(InvalidArgumentError, match="closed"):
        receiver.receive_messages(4)
    # Brought by the refill that landed after close() gave up on it, and released by it.
    _all_at_once(client, queue, 4)


@pytest.mark.usefixtures("direct")
def test_sync_completion_whose_route_goes_stale_settles_through_the_loop(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The route is forgotten (by another thread) between the plan and the refill: the direct
    call is not made, and the completions go as a plain settle through the event loop."""
    _send(client, queue, 30)
    with client.get_queue_receiver(queue, prefetch_count=15, max_wait_time=5) as receiver:
        inner = receiver._aio
        first = receiver.receive_messages(10)
        blocking = inner.call_blocking
        names: list[str] = []

        def stale(name: str, *args: Any, **kw: Any) -> Any:
            names.append(name)
            inner._conn.forget(inner.entity_path)
            return blocking(name, *args, **kw)

        monkeypatch.setattr(inner, "call_blocking", stale)
        looped = _calls_on_loop(inner, monkeypatch)
        receiver.complete_messages(first)
        assert names == ["settle_receive"] and looped == ["settle"]
        assert len(inner._buffer) == 5  # no refill: the plain settle does not receive
    assert admin.get_queue_runtime_properties(queue).active_message_count == 20


def _calls_on_loop(inner: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []
    call = inner._call

    async def _call(name: str, *args: Any, **kw: Any) -> Any:
        names.append(name)
        return await call(name, *args, **kw)

    monkeypatch.setattr(inner, "_call", _call)
    return names


# ---------------------------------------------------------------------------------------------
# The standing request of a prefetching asyncio receiver (``ServiceBusReceiver._standing_
# receive``): a receive that found nothing in its max_wait_time leaves its partition call out,
# and what that call brings goes to the prefetch buffer.


async def test_idle_short_receives_share_one_standing_request(
    aclient: aio.ServiceBusClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with aclient.get_queue_receiver(queue, prefetch_count=10) as receiver:
        assert await receiver.receive_messages(5, max_wait_time=0.05) == []
        calls = _calls(receiver, monkeypatch)
        for _ in range(10):
            assert await receiver.receive_messages(5, max_wait_time=0.05) == []
        assert calls == []  # the first receive's call is still out, for all of them
        async with aclient.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage("late"))
        got = await receiver.receive_messages(5, max_wait_time=5)
        assert [str(m) for m in got] == ["late"] and calls == []
        await receiver.complete_messages(got)


async def test_a_message_sent_after_a_receive_gave_up_is_prefetched_and_locked(
    aclient: aio.ServiceBusClient, queue: str, aeventually: Callable[..., Awaitable[None]]
) -> None:
    async with aclient.get_queue_receiver(queue, prefetch_count=10) as receiver:
        assert await receiver.receive_messages(1, max_wait_time=0.05) == []
        async with aclient.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage("m"))

        async def brought() -> None:
            assert len(receiver._buffer) == 1, "the standing request brought nothing"

        await aeventually(brought)
        # Locked to this receiver (as Service Bus's prefetch locks what it fetches): a
        # competing receiver does not get it; this one's next receive does, at once.
        async with aclient.get_queue_receiver(queue) as other:
            assert await other.receive_messages(1, max_wait_time=0.3) == []
        got = await receiver.receive_messages(1, max_wait_time=0.01)
        assert [str(m) for m in got] == ["m"] and got[0].lock_token
        await receiver.complete_message(got[0])


async def test_close_ends_the_standing_request(aclient: aio.ServiceBusClient, queue: str) -> None:
    """close() ends the standing request at the partition and waits for its answer: it does
    not stay out (30 s) to take what is sent next for the closed receiver."""
    receiver = aclient.get_queue_receiver(queue, prefetch_count=10)
    assert await receiver.receive_messages(1, max_wait_time=0.05) == []
    standing = receiver._standing
    assert standing is not None and not standing.done()
    await receiver.close()
    assert standing.done() and standing.result() is None
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("after close"))
    async with aclient.get_queue_receiver(queue) as other:
        got = await other.receive_messages(1, max_wait_time=5)  # not after a 60 s lock
        assert [str(m) for m in got] == ["after close"]
        assert got[0].delivery_count == 0  # a release counts no delivery
        await other.complete_message(got[0])


async def test_a_standing_request_gives_back_what_it_took_before_close_ended_it(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    """The partition answered before close()'s end reached it (the answer held here until
    close() has started): what it brought is given back at once, none counted."""
    receiver = aclient.get_queue_receiver(queue, prefetch_count=10)
    assert await receiver.receive_messages(1, max_wait_time=0.05) == []
    standing = receiver._standing
    assert standing is not None
    answered, proceed = hold_answers(receiver)
    # The standing request out now was made before the hold: end it, let the next one be held.
    await receiver._end_waits()
    await asyncio.wait_for(asyncio.shield(standing), 10)
    assert await receiver.receive_messages(1, max_wait_time=0.05) == []
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("before the end"))
    await asyncio.wait_for(answered.wait(), 10)
    closing = asyncio.ensure_future(receiver.close())
    await asyncio.sleep(0.2)
    proceed.set()
    await asyncio.wait_for(closing, 10)
    async with aclient.get_queue_receiver(queue) as other:
        got = await other.receive_messages(1, max_wait_time=5)  # not after a 60 s lock
        assert [str(m) for m in got] == ["before the end"]
        assert got[0].delivery_count == 0
        await other.complete_message(got[0])


def test_a_closed_receivers_standing_request_takes_nothing_after_its_event_loop_ended(
    client: raybus.ServiceBusClient, queue: str, namespace: str
) -> None:
    """The usual shape of an asyncio program: ``asyncio.run(main())``, main receiving with a
    prefetching receiver in ``async with``. Once main returned the loop is gone, and with it
    anything that could give back what a standing request still out brings: close() must have
    ended it (a message sent next would otherwise be locked to nobody until its lock
    expired, and counted as a delivery)."""

    async def main() -> None:
        aclient = aio.ServiceBusClient(namespace)
        async with aclient.get_queue_receiver(queue, prefetch_count=5, max_wait_time=0.3) as r:
            assert await r.receive_messages(5) == []
            assert r._standing is not None and not r._standing.done()

    thread = threading.Thread(target=asyncio.run, args=(main(),))
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    _send(client, queue, 1)
    with client.get_queue_receiver(queue, max_wait_time=5) as other:
        got = other.receive_messages(1)  # at once, not after the 60 s lock
        assert [str(m) for m in got] == ["m0"] and got[0].delivery_count == 0
        other.complete_messages(got)


async def test_a_receive_racing_close_takes_nothing_from_the_buffer(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    """close() has started (here held in its wait for a refill under way): a receive that got
    past the closed check before (the sync API's, on another thread) takes nothing from the
    buffer close() is about to give back, as the closed receiver could not settle it."""
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(5)])
    receiver = aclient.get_queue_receiver(queue, prefetch_count=5)
    got = await receiver.receive_messages(1, max_wait_time=5)
    assert [str(m) for m in got] == ["m0"] and len(receiver._buffer) == 4
    await receiver.complete_message(got[0])
    with receiver._refilling:
        receiver._refills += 1  # a refill under way: close() waits for it
    closing = asyncio.ensure_future(receiver.close())
    await asyncio.sleep(0.2)
    assert not closing.done()
    assert receiver._from_buffer(4) == []
    with receiver._refilling:
        receiver._refills -= 1
        receiver._refilling.notify_all()
    await asyncio.wait_for(closing, 10)
    async with aclient.get_queue_receiver(queue) as other:
        rest = await other.receive_messages(4, max_wait_time=5)
        while len(rest) < 4:
            more = await other.receive_messages(4 - len(rest), max_wait_time=5)
            assert more
            rest += more
        assert [str(m) for m in rest] == ["m1", "m2", "m3", "m4"]
        assert [m.delivery_count for m in rest] == [0] * 4  # given back, not expired
        await other.complete_messages(rest)


async def test_a_refusal_of_a_standing_request_is_raised_by_the_next_receive(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient, queue: str
) -> None:
    receiver = aclient.get_queue_receiver(queue, prefetch_count=10)
    assert await receiver.receive_messages(1, max_wait_time=0.05) == []
    standing = receiver._standing
    assert standing is not None
    await aadmin.delete_queue(queue)
    refused = await asyncio.wait_for(asyncio.shield(standing), 15)
    assert isinstance(refused, MessagingEntityNotFoundError)
    with pytest.raises(MessagingEntityNotFoundError):
        await receiver.receive_messages(1, max_wait_time=0.05)
    await receiver.close()


async def test_a_refusal_of_the_standing_request_a_receive_waits_on_is_raised_by_it(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient, queue: str
) -> None:
    receiver = aclient.get_queue_receiver(queue, prefetch_count=10)
    waiting = asyncio.ensure_future(receiver.receive_messages(1, max_wait_time=20))
    while receiver._standing is None:
        await asyncio.sleep(0.01)
    await aadmin.delete_queue(queue)
    with pytest.raises(MessagingEntityNotFoundError):
        await asyncio.wait_for(waiting, 15)
    await receiver.close()


async def test_a_dead_letter_receiver_keeps_a_standing_request_too(
    aclient: aio.ServiceBusClient,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
    aeventually: Callable[..., Awaitable[None]],
) -> None:
    """Idle short receives of the dead-letter sub-queue make no call; a message dead-lettered
    after one gave up is brought by the standing request, locked to this receiver."""
    dlq = aclient.get_queue_receiver(queue, sub_queue="deadletter", prefetch_count=10)
    async with dlq:
        assert await dlq.receive_messages(5, max_wait_time=0.05) == []
        calls = _calls(dlq, monkeypatch)
        for _ in range(5):
            assert await dlq.receive_messages(5, max_wait_time=0.05) == []
        assert calls == []
        async with aclient.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage("poison"))
        async with aclient.get_queue_receiver(queue) as main:
            (msg,) = await main.receive_messages(1, max_wait_time=5)
            await main.dead_letter_message(msg, reason="bad")

        async def brought() -> None:
            assert len(dlq._buffer) == 1, "the standing request brought nothing"

        await aeventually(brought)
        async with aclient.get_queue_receiver(queue, sub_queue="deadletter") as other:
            assert await other.receive_messages(1, max_wait_time=0.3) == []  # locked
        got = await dlq.receive_messages(5, max_wait_time=0.01)
        assert [(str(m), m.dead_letter_reason) for m in got] == [("poison", "bad")]
        assert calls == []
        await dlq.complete_messages(got)


async def test_no_standing_request_without_prefetch_or_in_receive_and_delete(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    plain = aclient.get_queue_receiver(queue)
    deleting = aclient.get_queue_receiver(
        queue, prefetch_count=10, receive_mode=raybus.ServiceBusReceiveMode.RECEIVE_AND_DELETE
    )
    for r in (plain, deleting):
        assert await r.receive_messages(1, max_wait_time=0.05) == []
        assert r._standing is None
        await r.close()


def test_sync_idle_short_receives_share_one_standing_request(
    client: raybus.ServiceBusClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client.get_queue_receiver(queue, prefetch_count=10) as receiver:
        assert receiver.receive_messages(5, max_wait_time=0.05) == []
        calls = _calls(receiver, monkeypatch)
        for _ in range(10):
            assert receiver.receive_messages(5, max_wait_time=0.05) == []
        assert calls == []
        _send(client, queue, 1)
        got = receiver.receive_messages(5, max_wait_time=5)
        assert [str(m) for m in got] == ["m0"] and calls == []
        receiver.complete_messages(got)


def test_sync_close_ends_the_standing_request(client: raybus.ServiceBusClient, queue: str) -> None:
    receiver = client.get_queue_receiver(queue, prefetch_count=10)
    assert receiver.receive_messages(1, max_wait_time=0.05) == []
    standing = receiver._aio._standing
    assert standing is not None and not standing.done()
    receiver.close()
    assert standing.done()
    _send(client, queue, 1)
    with client.get_queue_receiver(queue, max_wait_time=5) as other:
        got = other.receive_messages(1)
        assert [str(m) for m in got] == ["m0"] and got[0].delivery_count == 0
        other.complete_messages(got)


async def test_a_transient_refusal_nobody_waited_for_is_dropped_for_a_new_request(
    aclient: aio.ServiceBusClient, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standing request that failed with a retryable error while no receive waited on it
    (a partition restarting, say) is stale by the next receive: that one asks again."""
    async with aclient.get_queue_receiver(queue, prefetch_count=10) as receiver:

        async def failed() -> ServiceBusError | None:
            return ServiceBusConnectionError("the partition restarted", queue)

        receiver._standing = asyncio.ensure_future(failed())
        await receiver._standing
        calls = _calls(receiver, monkeypatch)
        async with aclient.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage("after"))
        got = await receiver.receive_messages(1, max_wait_time=5)
        assert [str(m) for m in got] == ["after"] and calls == ["receive"]
        await receiver.complete_messages(got)


async def test_no_refill_while_the_standing_request_is_out(
    aclient: aio.ServiceBusClient, queue: str
) -> None:
    """The standing request and a refill both fill the buffer: with both out, the receiver
    held up to twice ``prefetch_count`` messages locked. complete_messages does not refill
    while the standing request is out; what it did not take stays for other receivers."""
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("first"))
    receiver = aclient.get_queue_receiver(queue, prefetch_count=5)
    (first,) = await receiver.receive_messages(1, max_wait_time=5)
    answered, proceed = hold_answers(receiver)  # the standing request's answer is held
    assert await receiver.receive_messages(1, max_wait_time=0.05) == []
    standing = receiver._standing
    assert standing is not None
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(10)])
    await asyncio.wait_for(answered.wait(), 10)  # it took five at the partition
    await receiver.complete_messages([first])
    proceed.set()
    await asyncio.wait_for(asyncio.shield(standing), 10)
    assert len(receiver._buffer) == 5
    async with aclient.get_queue_receiver(queue) as other:
        rest = await settlement_support._areceive_n(other, 5)
        await other.complete_messages(rest)
    await receiver.close()
