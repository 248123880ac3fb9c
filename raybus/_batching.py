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

__all__ = ["Coalescer"]

G = TypeVar("G")  # one caller's request
R = TypeVar("R")  # that caller's result

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
