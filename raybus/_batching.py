"""Coalescing: concurrent requests to one actor share one call.

An actor call costs about as much as a call carrying a thousand messages, so raybus keeps at
most one call in flight per (actor, operation) and sends everything submitted meanwhile as the
next call. The first request goes out at once (no added latency when idle); under load the
batches grow by themselves. Each caller still gets its own result or its own error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer", "deliver_apart"]

G = TypeVar("G")  # one caller's request
R = TypeVar("R")  # that caller's result
E = TypeVar("E", bound=BaseException)  # a delivery's error

Dispatch = Callable[[list[G]], Awaitable[Sequence[R | BaseException]]]


class Coalescer(Generic[G, R]):
    """Queue requests; one dispatch in flight at a time carries every queued request.

    ``dispatch`` receives the queued requests in submission order and returns one result per
    request; an exception object in that list is raised to its caller only. If ``dispatch``
    itself raises, every caller of that batch gets the exception.
    """

    def __init__(self, dispatch: Dispatch[G, R], max_batch: int = 4096) -> None:
        self._dispatch = dispatch
        self._max_batch = max_batch
        self._queue: list[tuple[G, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None
        self._inflight = 0

    @property
    def pending(self) -> int:
        """Requests queued or in flight (a measure of this caller's load on the actor)."""
        return len(self._queue) + self._inflight

    def submit(self, request: G) -> asyncio.Future[R]:
        """Queue ``request``; the returned future resolves to its result."""
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((request, fut))
        if self._task is None:
            self._task = asyncio.ensure_future(self._drain())
        return fut

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                self._inflight = len(batch)
                try:
                    results = await self._dispatch([req for req, _ in batch])
                except BaseException as exc:  # every caller of this batch learns of it
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for (_, fut), result in zip(batch, results, strict=True):
                    if fut.done():
                        continue
                    if isinstance(result, BaseException):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
        finally:
            self._task = None
            self._inflight = 0
            if self._queue:  # cancelled with requests left: fail them rather than hang
                pending, self._queue = self._queue, []
                for _, fut in pending:
                    if not fut.done():
                        fut.set_exception(asyncio.CancelledError())


async def deliver_apart(
    calls: Sequence[G],
    deliver: Callable[[Sequence[G]], Awaitable[object]],
    *,
    refused: type[E],
    unknown: tuple[type[E], ...],
    busy: tuple[type[E], ...] = (),
) -> list[E | None]:
    """Deliver ``calls`` together, and after a refusal in halves, recursively: each call's
    outcome (None: delivered) as if it had been delivered on its own.

    Guarantees: a call is reported refused only after a delivery of that call alone was
    refused, so one caller's bad request never fails another's that alone would be accepted
    (even a refusal of the combination only, such as a quota the sum exceeds). An ``unknown``
    error (the delivery may have taken effect) is reported to every call of that delivery and
    never redelivered. A ``busy`` refusal (the broker's state, not a request, refused it:
    nothing was stored) is reported to every call of that delivery too: halves would only be
    refused alike. Anything else that ``deliver`` raises propagates.

    Cost: one delivery when all are accepted; with k refused calls among N, at most about
    2k·log2(N) more (a call per call, as before, cost N + 1 however few were refused). When
    the left half of a refused group is accepted, the right half is split without being
    delivered whole first: the refusal is then its own (or the combination's, which its halves
    settle).
    """
    results: list[E | None] = [None] * len(calls)

    async def attempt(lo: int, hi: int, known_refused: bool) -> bool:
        """Deliver ``calls[lo:hi]`` (split further if refused); True if all were accepted."""
        if not known_refused or hi - lo == 1:
            try:
                await deliver(calls[lo:hi])
                return True
            except (*unknown, *busy) as exc:
                results[lo:hi] = [exc] * (hi - lo)
                return False
            except refused as exc:
                if hi - lo == 1:
                    results[lo] = exc
                    return False
        mid = (lo + hi) // 2
        left = await attempt(lo, mid, False)
        right = await attempt(mid, hi, left)
        return left and right

    if calls:
        await attempt(0, len(calls), False)
    return results
