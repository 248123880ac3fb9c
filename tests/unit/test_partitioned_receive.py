"""Receiving from a queue of several partitions (``raybus.aio._fanout``), without Ray: fake
partition actors whose ``wait_available`` answers, or fails as Ray's errors do when a partition
is gone (its queue deleted) or restarting.

The wait on every partition at once must neither swallow a deleted queue nor spin: when every
partition's wait fails at once, the receive raises ``MessagingEntityNotFoundError`` (as a
queue of one partition does) or, all restarting, pauses before waiting again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import ray.exceptions as rex

from raybus.aio import _fanout
from raybus.exceptions import MessagingEntityNotFoundError


def gone() -> bool:
    raise rex.ActorDiedError()  # the queue was deleted: its actors were killed for good


def restarting() -> bool:
    raise rex.ActorUnavailableError("restarting", None)


def deleted() -> bool:
    # What a partition marked deleted answers (its waiting calls are woken to raise it).
    raise MessagingEntityNotFoundError("'q' was deleted", "q")


class FakeRef:
    def __init__(self, answer: Callable[[], bool]) -> None:
        self._answer = answer

    def future(self) -> concurrent.futures.Future[bool]:
        fut: concurrent.futures.Future[bool] = concurrent.futures.Future()
        try:
            fut.set_result(self._answer())
        except Exception as exc:
            fut.set_exception(exc)
        return fut


class FakePartition:
    """A partition actor: ``wait_available`` answers with ``answer()`` at once (a wait
    that would last is not needed here: the receives end at the first answer)."""

    def __init__(self, answer: Callable[[], bool], rows: list[Any] | None = None) -> None:
        self.answer = answer
        self.rows = rows or []
        self.waits = 0
        self.wait_available = SimpleNamespace(remote=self._wait_available)
        self._actor_id = object()

    def _wait_available(self, wait_s: float, dead_letter: bool) -> FakeRef:
        self.waits += 1
        return FakeRef(self.answer)


class FakeReceiver:
    """What ``receive_partitioned`` uses of a ``ServiceBusReceiver``. A partition's receive
    returns its rows once its ``wait_available`` said there are some (the receives made
    before the wait find nothing)."""

    entity_path = "q"
    _dead_letter = False
    _closing = False

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.turn = 0
        self._standing_waits = _fanout.StandingWaits()
        self.asked: list[int] = []  # the partitions each receive call went to

    def _next_turn(self) -> int:
        self.turn += 1
        return self.turn

    def _receive_args(self, fetch: int, deadline: float | None) -> tuple[Any, ...]:
        return (fetch, deadline)

    async def _receive_call(self, args: tuple[Any, ...], pid: int) -> list[Any]:
        """A long poll: the rows there, else none at the deadline."""
        fetch, deadline = args
        self.asked.append(pid)
        part = self.parts[pid]
        if part.rows:
            return part.rows[:fetch]
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        return []

    async def _receive_from(self, pid: int, count: int, wait_s: float) -> list[Any]:
        self.asked.append(pid)
        part = self.parts[pid]
        return part.rows[:count] if part.waits else []


def route_of(parts: list[Any]) -> Any:
    return SimpleNamespace(existing=lambda: list(enumerate(parts)))


@pytest.fixture(autouse=True)
def cancelled(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The refs ``ray.cancel`` was called with (waits given up: fake refs, nothing to do)."""
    refs: list[Any] = []

    def cancel(ref: Any) -> None:
        refs.append(ref)
        if isinstance(ref, PendingRef):  # as Ray answers a cancelled task
            ref.fut.set_exception(rex.TaskCancelledError())

    monkeypatch.setattr("ray.cancel", cancel)
    return refs


@pytest.mark.parametrize(
    "answers",
    [(gone, gone), (deleted, deleted), (gone, restarting)],
    ids=["actors-dead", "marked-deleted", "one-dead-one-restarting"],
)
async def test_a_partitioned_receive_raises_not_found_when_every_wait_fails_and_one_is_gone(
    answers: tuple[Callable[[], bool], ...],
) -> None:
    """The caller (``Connection.retrying``) then rechecks the route: it raises if the queue
    is gone, or receives again with the fresh route if a partition change removed that
    partition. Before the fix the receive waited again at once until its deadline (thousands
    of calls a second) and then returned []."""
    parts = [FakePartition(a) for a in answers]
    receiver: Any = FakeReceiver(parts)  # stands in for a ServiceBusReceiver
    start = time.monotonic()
    with pytest.raises(MessagingEntityNotFoundError):
        await _fanout.receive_partitioned(receiver, route_of(parts), 1, start + 5.0)
    assert time.monotonic() - start < 1.0
    assert [p.waits for p in parts] == [1, 1]


async def test_a_partitioned_receive_pauses_between_waits_while_every_partition_restarts() -> None:
    parts = [FakePartition(restarting), FakePartition(restarting)]
    receiver: Any = FakeReceiver(parts)  # stands in for a ServiceBusReceiver
    start = time.monotonic()
    got = await _fanout.receive_partitioned(receiver, route_of(parts), 1, start + 0.6)
    took = time.monotonic() - start
    assert got == []
    assert 0.5 <= took < 1.5
    # A pause of _RESTART_BACKOFF_S (0.25 s) between tries: three or four in 0.6 s.
    assert sum(p.waits for p in parts) <= 2 * 4, [p.waits for p in parts]


async def test_a_partitioned_receive_without_deadline_waits_out_a_restart_without_spinning() -> (
    None
):
    """``max_wait_time=None``: no deadline bounds the loop, so a spin would last for ever
    while the partitions restart, and burn a core meanwhile."""
    back_at = time.monotonic() + 0.6

    def restarts_then_has_one() -> bool:
        return True if time.monotonic() >= back_at else restarting()

    parts = [FakePartition(restarting), FakePartition(restarts_then_has_one, rows=[("m",)])]
    receiver: Any = FakeReceiver(parts)  # stands in for a ServiceBusReceiver
    got = await _fanout.receive_partitioned(receiver, route_of(parts), 1, None)
    assert got == [("m",)]
    assert parts[1].waits <= 5, parts[1].waits


async def test_a_partition_that_fails_is_passed_over_while_another_answers() -> None:
    parts = [FakePartition(gone), FakePartition(lambda: True, rows=[("m",)])]
    receiver: Any = FakeReceiver(parts)  # stands in for a ServiceBusReceiver
    got = await _fanout.receive_partitioned(receiver, route_of(parts), 1, time.monotonic() + 5)
    assert got == [("m",)]
    assert [p.waits for p in parts] == [1, 1]


class PendingRef:
    def __init__(self) -> None:
        self.fut: concurrent.futures.Future[bool] = concurrent.futures.Future()

    def future(self) -> concurrent.futures.Future[bool]:
        return self.fut


class WaitingPartition:
    """A partition actor whose waits stay out until the test answers them (``answer``);
    its receives find ``rows`` once ``has`` is set."""

    def __init__(self) -> None:
        self.refs: list[PendingRef] = []
        self.rows: list[Any] = []
        self.wait_available = SimpleNamespace(remote=self._wait_available)
        self._actor_id = object()

    @property
    def waits(self) -> int:  # FakeReceiver: its receives find rows only after a wait
        return len(self.refs) if self.rows else 0

    def _wait_available(self, wait_s: float, dead_letter: bool) -> PendingRef:
        assert wait_s == _fanout._WAIT_SLICE_S  # held a whole slice, whatever the receive's
        self.refs.append(PendingRef())
        return self.refs[-1]

    def answer(self, available: bool) -> None:
        self.refs[-1].fut.set_result(available)


async def _idle_receive(receiver: Any, parts: list[Any]) -> list[Any]:
    # Long enough for the first receive to ask every partition and leave its waits before
    # the deadline on a loaded machine (CI: 0.1 s was not, once).
    return await _fanout.receive_partitioned(receiver, route_of(parts), 10, time.monotonic() + 0.3)


async def test_an_idle_receivers_next_receive_asks_no_partition_while_its_waits_are_out(
    cancelled: list[Any],
) -> None:
    """A loop of short receives on an idle partitioned queue: the first asks every partition
    and leaves a wait at each; the next ones make no call at all (before, each made a
    receive call, a wait and a cancel per partition)."""
    parts = [WaitingPartition() for _ in range(3)]
    receiver: Any = FakeReceiver(parts)
    assert await _idle_receive(receiver, parts) == []
    assert sorted(receiver.asked) == [0, 1, 2]
    for _ in range(3):
        assert await _idle_receive(receiver, parts) == []
    assert sorted(receiver.asked) == [0, 1, 2]
    assert [len(p.refs) for p in parts] == [1, 1, 1]
    assert cancelled == []  # left out, not given up


async def test_a_wait_answered_between_receives_sends_the_next_receive_to_that_partition() -> None:
    parts = [WaitingPartition() for _ in range(3)]
    receiver: Any = FakeReceiver(parts)
    assert await _idle_receive(receiver, parts) == []
    receiver.asked.clear()
    parts[1].rows = [("m",)]
    parts[1].answer(True)
    await asyncio.sleep(0)  # the answer reaches the loop while no receive waits
    assert await _idle_receive(receiver, parts) == [("m",)]
    assert receiver.asked == [1]  # the others' waits are out and unanswered: not asked
    assert [len(p.refs) for p in parts] == [1, 1, 1]


async def test_a_wait_answered_during_a_receive_is_received_from_and_the_others_stay_out(
    cancelled: list[Any],
) -> None:
    parts = [WaitingPartition() for _ in range(3)]
    receiver: Any = FakeReceiver(parts)
    deadline = time.monotonic() + 5
    receiving = asyncio.ensure_future(
        _fanout.receive_partitioned(receiver, route_of(parts), 10, deadline)
    )
    await asyncio.sleep(0.05)
    assert not receiving.done()
    parts[2].rows = [("m",)]
    parts[2].answer(True)
    assert await asyncio.wait_for(receiving, 1) == [("m",)]
    assert cancelled == []
    assert receiver._standing_waits.quiet(route_of(parts).existing()) == {0, 1}


async def test_a_wait_that_ended_without_news_is_made_again() -> None:
    """The partition holds a wait one slice (30 s): answered "nothing", the partition is
    asked once more (something may have come since) and gets a new wait."""
    parts = [WaitingPartition() for _ in range(2)]
    receiver: Any = FakeReceiver(parts)
    assert await _idle_receive(receiver, parts) == []
    receiver.asked.clear()
    parts[0].answer(False)
    await asyncio.sleep(0)
    assert await _idle_receive(receiver, parts) == []
    assert receiver.asked == [0]
    assert [len(p.refs) for p in parts] == [2, 1]


async def test_waits_at_partitions_the_route_no_longer_lists_are_cancelled(
    cancelled: list[Any],
) -> None:
    """A partition change: the waits at partitions gone from the route, or served by another
    actor, are cancelled; the new partition's is made."""
    parts = [WaitingPartition() for _ in range(3)]
    receiver: Any = FakeReceiver(parts)
    assert await _idle_receive(receiver, parts) == []
    moved = WaitingPartition()
    route = SimpleNamespace(existing=lambda: [(0, parts[0]), (1, moved)])
    assert await _fanout.receive_partitioned(receiver, route, 10, time.monotonic() + 0.3) == []
    assert cancelled == [parts[1].refs[0], parts[2].refs[0]]
    assert len(moved.refs) == 1 and len(parts[0].refs) == 1


async def test_cancel_gives_up_the_waits_still_out_only(cancelled: list[Any]) -> None:
    """What close() does: the answered waits need no cancel."""
    parts = [WaitingPartition() for _ in range(2)]
    receiver: Any = FakeReceiver(parts)
    assert await _idle_receive(receiver, parts) == []
    parts[0].answer(False)
    await asyncio.sleep(0)
    receiver._standing_waits.cancel()
    assert cancelled == [parts[1].refs[0]]
    assert receiver._standing_waits.quiet(route_of(parts).existing()) == set()


async def test_a_refreshed_route_of_the_same_actors_keeps_the_waits(cancelled: list[Any]) -> None:
    """A new route of the same actors (the entity's settings changed; a client with a
    credential fetches its routes every ROUTE_TTL_S) has new handle objects: the waits out at
    them stay (they were all given up once a second)."""
    parts = [WaitingPartition() for _ in range(2)]
    receiver: Any = FakeReceiver(parts)
    assert await _idle_receive(receiver, parts) == []
    same = [SimpleNamespace(wait_available=p.wait_available, _actor_id=p._actor_id) for p in parts]
    receiver.asked.clear()
    assert await _idle_receive(receiver, same) == []
    assert cancelled == [] and receiver.asked == []
    assert [len(p.refs) for p in parts] == [1, 1]


async def test_a_receive_waiting_when_close_gives_up_the_waits_returns_nothing() -> None:
    """close() cancels the waits a receive may be waiting on: that is no error, and the
    closing receiver's receive returns none."""
    parts = [WaitingPartition() for _ in range(2)]
    receiver: Any = FakeReceiver(parts)
    receiving = asyncio.ensure_future(
        _fanout.receive_partitioned(receiver, route_of(parts), 10, time.monotonic() + 5)
    )
    await asyncio.sleep(0.05)
    receiver._closing = True
    receiver._standing_waits.cancel()
    assert await asyncio.wait_for(receiving, 1) == []


async def _single(receiver: Any, parts: list[Any], wait: float = 0.1) -> list[Any]:
    return await _fanout.receive_single(receiver, route_of(parts), 10, time.monotonic() + wait)


async def _idle_twice(receiver: Any, parts: list[Any]) -> None:
    """Two receives that find nothing: the second leaves a wait."""
    for _ in range(2):
        assert await _single(receiver, parts) == []
    assert receiver._standing_waits.out_at(0)


async def test_a_second_single_partition_receive_that_found_nothing_leaves_a_wait() -> None:
    """A queue of one partition, no standing request: the second long poll in a row that
    found nothing by its deadline leaves a wait (it locks nothing); the next receives wait
    on it and call nothing (before, each made its own long poll). The first leaves none:
    a receiver that receives once and closes would pay a wait and a cancel more."""
    parts = [WaitingPartition()]
    receiver: Any = FakeReceiver(parts)
    assert await _single(receiver, parts) == []
    assert receiver.asked == [0] and parts[0].refs == []
    assert await _single(receiver, parts) == []
    assert receiver.asked == [0, 0] and len(parts[0].refs) == 1
    for _ in range(3):
        assert await _single(receiver, parts) == []
    assert receiver.asked == [0, 0] and len(parts[0].refs) == 1


async def test_a_receive_that_got_messages_starts_the_count_of_empty_ones_again() -> None:
    parts = [WaitingPartition()]
    receiver: Any = FakeReceiver(parts)
    assert await _single(receiver, parts) == []
    parts[0].rows = [("m",)]
    assert await _single(receiver, parts) == [("m",)]
    parts[0].rows = []
    assert await _single(receiver, parts) == []
    assert parts[0].refs == []


async def _waiting_on_the_left_wait(receiver: Any, parts: list[Any]) -> asyncio.Future[Any]:
    """After two empty receives, a third (5 s) that waits on the wait the second left."""
    await _idle_twice(receiver, parts)
    receiving = asyncio.ensure_future(_single(receiver, parts, wait=5))
    await asyncio.sleep(0.05)
    assert not receiving.done() and receiver.asked == [0, 0]  # waiting, not calling
    return receiving


async def test_once_the_left_wait_answers_the_next_receive_makes_its_long_poll() -> None:
    parts = [WaitingPartition()]
    receiver: Any = FakeReceiver(parts)
    receiving = await _waiting_on_the_left_wait(receiver, parts)
    parts[0].rows = [("m",)]
    parts[0].answer(True)
    assert await asyncio.wait_for(receiving, 1) == [("m",)]
    assert receiver.asked == [0, 0, 0]
    assert not receiver._standing_waits.out_at(0)


async def test_a_single_partition_receive_that_got_messages_leaves_no_wait() -> None:
    parts = [WaitingPartition()]
    parts[0].rows = [("m",)]
    receiver: Any = FakeReceiver(parts)
    assert await _single(receiver, parts) == [("m",)]
    assert parts[0].refs == []


async def test_a_single_partition_receive_waiting_on_the_left_wait_ends_at_close() -> None:
    parts = [WaitingPartition()]
    receiver: Any = FakeReceiver(parts)
    receiving = await _waiting_on_the_left_wait(receiver, parts)
    receiver._closing = True
    receiver._standing_waits.cancel()
    assert await asyncio.wait_for(receiving, 1) == []
    assert receiver.asked == [0, 0]
