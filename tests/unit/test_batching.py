"""The coalescer: one dispatch in flight, everything submitted meanwhile shares the next one."""

from __future__ import annotations

import asyncio

import pytest

from raybus._batching import Coalescer


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()

    async def dispatch(self, items: list[int]) -> list[int | BaseException]:
        self.batches.append(list(items))
        await self.gate.wait()
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


async def test_requests_submitted_during_a_dispatch_share_the_next_call() -> None:
    rec = Recorder()
    co: Coalescer[int, int] = Coalescer(rec.dispatch)
    first = co.submit(0)
    await asyncio.sleep(0)  # the first dispatch starts with one request
    later = [co.submit(i) for i in (2, 4, 6)]
    rec.gate.set()
    assert await first == 0
    assert await asyncio.gather(*later) == [20, 40, 60]
    assert rec.batches == [[0], [2, 4, 6]]


async def test_each_caller_gets_its_own_error() -> None:
    rec = Recorder()
    rec.gate.set()
    co: Coalescer[int, int] = Coalescer(rec.dispatch)
    futs = [co.submit(i) for i in range(4)]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert results[0] == 0 and results[2] == 20
    assert isinstance(results[1], ValueError) and str(results[1]) == "odd 1"
    assert isinstance(results[3], ValueError)


async def test_a_failed_dispatch_fails_every_caller_of_that_batch_only() -> None:
    calls = 0

    async def dispatch(items: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("actor unreachable")
        return items

    co: Coalescer[int, int] = Coalescer(dispatch)
    a, b = co.submit(1), co.submit(2)
    with pytest.raises(ConnectionError):
        await a
    with pytest.raises(ConnectionError):
        await b
    assert await co.submit(3) == 3  # the coalescer recovers for later requests


async def test_batches_are_capped_at_max_batch() -> None:
    seen: list[int] = []

    async def dispatch(items: list[int]) -> list[int]:
        seen.append(len(items))
        return items

    co: Coalescer[int, int] = Coalescer(dispatch, max_batch=3)
    assert await asyncio.gather(*(co.submit(i) for i in range(7))) == list(range(7))
    assert seen == [3, 3, 1]


class Gated:
    """A dispatch whose calls each wait for their own gate, in the order they started."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gates: list[asyncio.Event] = []

    async def dispatch(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return [i * 10 for i in items]


async def test_a_second_dispatch_starts_while_the_first_is_under_way() -> None:
    rec = Gated()
    co: Coalescer[int, int] = Coalescer(rec.dispatch, max_inflight=2)
    first = co.submit(1)
    await asyncio.sleep(0)
    second = co.submit(2)  # pipelined, not queued behind the first's answer
    await asyncio.sleep(0)
    assert rec.batches == [[1], [2]]
    later = [co.submit(i) for i in (3, 4, 5)]  # both under way: these share the next one
    await asyncio.sleep(0)
    assert rec.batches == [[1], [2]] and co.pending == 5
    rec.gates[1].set()  # the second answers first: its caller need not wait for the first
    assert await second == 20
    assert not first.done()
    await asyncio.sleep(0)
    assert rec.batches == [[1], [2], [3, 4, 5]]
    rec.gates[0].set()
    rec.gates[2].set()
    assert await first == 10
    assert await asyncio.gather(*later) == [30, 40, 50]
    assert co.pending == 0


async def test_one_in_flight_by_default() -> None:
    rec = Gated()
    co: Coalescer[int, int] = Coalescer(rec.dispatch)
    first = co.submit(1)
    await asyncio.sleep(0)
    second = co.submit(2)
    await asyncio.sleep(0)
    assert rec.batches == [[1]]
    rec.gates[0].set()
    assert await first == 10
    await asyncio.sleep(0)
    rec.gates[1].set()
    assert await second == 20
    assert rec.batches == [[1], [2]]


async def test_a_request_submitted_as_the_last_drain_ends_is_dispatched() -> None:
    """The caller woken by the last answer submits again before the ended drain's task has
    run its done callbacks: a drain that left the coalescer only then would still count as
    under way, and the new request would wait for nobody. (One drain: with room for another,
    the request would start one and the case could not fail.)"""

    async def dispatch(items: list[int]) -> list[int]:
        return items

    co: Coalescer[int, int] = Coalescer(dispatch)
    for i in range(0, 6, 2):
        first = co.submit(i)
        assert await first == i  # woken straight from the answer, as the drain ends
        again = co.submit(i + 1)  # before that drain's task has run its done callbacks
        assert await asyncio.wait_for(again, 2) == i + 1


async def test_requests_left_by_a_cancelled_drain_go_with_the_other_one() -> None:
    """A drain cancelled in its dispatch (its loop closing) fails that batch's callers; the
    requests queued meanwhile go with a drain still running, or fail once none is left."""
    rec = Gated()
    co: Coalescer[int, int] = Coalescer(rec.dispatch, max_inflight=2)
    first = co.submit(1)
    await asyncio.sleep(0)
    (cancelled,) = co._drains
    second = co.submit(2)
    await asyncio.sleep(0)
    queued = co.submit(3)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    rec.gates[1].set()
    assert await second == 20
    await asyncio.sleep(0)
    assert rec.batches[-1] == [3]
    later = co.submit(4)  # room for a second drain again: under way at once
    await asyncio.sleep(0)
    assert rec.batches[-1] == [4]
    queued_too = co.submit(5)  # both under way: queued, then no drain is left to take it
    for drain in list(co._drains):
        drain.cancel()
    for fut in (queued, later, queued_too):
        with pytest.raises(asyncio.CancelledError):
            await fut
    assert co.pending == 0 and not co._drains


async def test_a_second_dispatch_waits_unless_it_and_those_under_way_are_ordered() -> None:
    """Two calls may be under way at once only over one ordered connection: a dispatch
    started while it was not open, or one that would not use it, goes alone."""
    rec = Gated()
    lane_open = False
    co: Coalescer[int, int] = Coalescer(rec.dispatch, max_inflight=2, ordered=lambda: lane_open)
    first = co.submit(1)  # no lane yet: goes alone
    await asyncio.sleep(0)
    lane_open = True
    second = co.submit(2)  # the first may still overtake it: waits
    await asyncio.sleep(0)
    assert rec.batches == [[1]]
    rec.gates[0].set()
    assert await first == 10
    await asyncio.sleep(0)
    assert rec.batches == [[1], [2]]  # taken by the first one's drain once it answered
    third = co.submit(3)  # the lane is open and the one under way used it: both under way
    await asyncio.sleep(0)
    assert rec.batches == [[1], [2], [3]]
    lane_open = False
    fourth = co.submit(4)  # the lane broke: waits for both
    await asyncio.sleep(0)
    assert rec.batches == [[1], [2], [3]]
    rec.gates[2].set()
    assert await third == 30
    await asyncio.sleep(0)
    assert rec.batches == [[1], [2], [3]]  # the second is still under way
    rec.gates[1].set()
    assert await second == 20
    await asyncio.sleep(0)
    assert rec.batches == [[1], [2], [3], [4]]
    rec.gates[3].set()
    assert await fourth == 40
    assert co.pending == 0
