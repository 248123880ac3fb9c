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
