"""Coalescing: concurrent requests to one actor share one call.

An actor call costs about as much as a call carrying a thousand messages, so raybus keeps at
most one call in flight per (actor, operation) and sends everything submitted meanwhile as the
next call. The first request goes out at once (no added latency when idle); under load the
batches grow by themselves. Each caller still gets its own result or its own error.

Sends keep two calls in flight (``raybus._connection.SENDS_IN_FLIGHT``). Why: a durable send's
call lasts its round trip plus the partition's flush (about 1 ms here), so one sender sending
open loop at 1,000 msg/s had a call in flight nearly all the time, and each message waited
for the previous one's answer before its own call could start. A second call in flight
carries it at once, over the same lane as the first (``raybus._lane``), so the partition takes
the calls in the order they were sent; while no lane is open, calls go one at a time. Measured
(``benchmarks/profile_hot_paths.py --scenario latency``, 8,000 x 1 KiB at 1,000 msg/s, six
alternating pairs in two runs): p50 send-to-receive 1.78-2.25 ms against 2.13-2.60, lower in
each pair. Sends awaited one by one are unchanged (one call in flight either way). Messages
sent without awaiting each other have no order promised between them (as with Service Bus),
with one call in flight or two: a send waits for its route before it queues its call, and a
call that is retried may store its messages after those of the next.
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
    """Queue requests; up to ``max_inflight`` dispatches at a time, each carrying every request
    queued when it starts (at most ``max_batch``).

    ``dispatch`` receives the queued requests in submission order and returns one result per
    request; an exception object in that list is raised to its caller only. If ``dispatch``
    itself raises, every caller of that batch gets the exception. Dispatches start in
    submission order; with more than one in flight their answers may come in any order.
    ``ordered`` says whether a dispatch started now would reach the actor after those under
    way (over the same ordered connection); a dispatch starts while others are under way only
    if it says so now and said so for each of them.
    """

    def __init__(
        self,
        dispatch: Dispatch[G, R],
        max_batch: int = 4096,
        max_inflight: int = 1,
        ordered: Callable[[], bool] | None = None,
    ) -> None:
        self._dispatch = dispatch
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        # Whether a dispatch started now reaches the actor behind those under way (they share
        # one ordered connection): only then may it start before they have answered.
        self._ordered = ordered
        self._unordered = 0  # dispatches under way that were started when it said no
        self._queue: list[tuple[G, asyncio.Future[R]]] = []
        # Tasks taking batches off the queue, one dispatch at a time each. Each removes itself
        # as it ends (a done callback would come a step later, when a request submitted in
        # between would find no room for a drain and none left to take it). Held here also
        # because the event loop keeps only a weak reference to a task.
        self._drains: set[asyncio.Future[None]] = set()
        self._inflight = 0  # requests in the dispatches under way

    @property
    def pending(self) -> int:
        """Requests queued or in flight (a measure of this caller's load on the actor)."""
        return len(self._queue) + self._inflight

    def submit(self, request: G) -> asyncio.Future[R]:
        """Queue ``request``; the returned future resolves to its result."""
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((request, fut))
        if len(self._drains) < self._max_inflight:
            self._drains.add(asyncio.ensure_future(self._drain()))
        return fut

    async def _drain(self) -> None:
        try:
            while self._queue:
                ordered = self._ordered is None or self._ordered()
                if self._inflight and (self._unordered or not ordered):
                    return  # the dispatch under way takes the queue once it has answered
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                self._inflight += len(batch)
                self._unordered += not ordered
                try:
                    results = await self._dispatch([req for req, _ in batch])
                except BaseException as exc:  # every caller of this batch learns of it
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                finally:
                    self._inflight -= len(batch)
                    self._unordered -= not ordered
                for (_, fut), result in zip(batch, results, strict=True):
                    if fut.done():
                        continue
                    if isinstance(result, BaseException):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
        finally:
            self._drains.discard(asyncio.current_task())
            # Cancelled (the loop is closing) with requests left and no other drain to take
            # them: fail them rather than leave their callers hanging.
            if self._queue and not self._drains:
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
