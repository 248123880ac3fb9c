"""Receiving from a queue of several partitions (``raybus.aio._fanout``), without Ray: fake
partition actors whose ``wait_available`` answers, or fails as Ray's errors do when a partition
is gone (its queue deleted) or restarting.

The wait on every partition at once must neither swallow a deleted queue nor spin: when every
partition's wait fails at once, the receive raises ``MessagingEntityNotFoundError`` (as a
queue of one partition does) or, all restarting, pauses before waiting again.
"""

from __future__ import annotations

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

    def __init__(self, parts: list[FakePartition]) -> None:
        self.parts = parts
        self.turn = 0

    def _next_turn(self) -> int:
        self.turn += 1
        return self.turn

    async def _receive_from(self, pid: int, count: int, wait_s: float) -> list[Any]:
        part = self.parts[pid]
        return part.rows[:count] if part.waits else []


def route_of(parts: list[FakePartition]) -> Any:
    return SimpleNamespace(existing=lambda: list(enumerate(parts)))


@pytest.fixture(autouse=True)
def _no_ray_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    """``wait_any`` cancels the waits still out when it returns: fake refs, nothing to do."""
    monkeypatch.setattr("ray.cancel", lambda ref: None)


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
