"""Batch delete: ``delete_messages`` and ``purge_messages``, messages deleted without being
received (Service Bus's batch delete; the receiver methods of the azure-servicebus 7.13.0b1
beta, same names and arguments).

The broker deletes, in sequence order, the messages enqueued before a cutoff (by default the
moment of the call, by this client's clock, as the SDK sets it), of the receiver's queue,
subscription or dead-letter sub-queue: active, deferred and scheduled ones, never a locked one.
On a session receiver only its session's messages go; a receiver without a session on a
session-enabled queue deletes every session's (Service Bus's operation names a session or
none), those locked under a session excepted. Each call deletes at most
``MAX_DELETE_COUNT`` (Service Bus Premium's limit per call; Standard's is 500), and fewer when
fewer are eligible: best effort, as in Service Bus. Where raybus differs: Service Bus refuses
a batch delete on a partitioned entity, raybus asks its partitions in turn, each for what the
count leaves, so the oldest of the whole entity are not necessarily the ones that go; and a
delete is not repeated after an error that leaves its outcome unknown (it may have deleted).

A mixin of ``ServiceBusReceiver``, as ``SequenceReads`` is.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .._clock import to_timestamp
from ..exceptions import InvalidArgumentError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._connection import Connection
    from ._session import ServiceBusSession

__all__ = ["MAX_DELETE_COUNT", "BatchDelete"]

MAX_DELETE_COUNT = 4_000


def _cutoff(before: Any, entity: str) -> float:
    """``before_enqueued_time_utc`` as epoch seconds (naive: UTC); now when None."""
    if before is None:
        return time.time()
    if not isinstance(before, datetime):
        raise InvalidArgumentError(
            f"before_enqueued_time_utc must be a datetime or None, not {type(before).__name__}",
            entity,
            "before_enqueued_time_utc",
        )
    return to_timestamp(before)


class BatchDelete:
    """``delete_messages`` and ``purge_messages`` of ``ServiceBusReceiver`` (module
    docstring)."""

    if TYPE_CHECKING:
        entity_path: str
        session: ServiceBusSession | None
        _conn: Connection
        _dead_letter: bool
        _transfer: bool
        _call: Callable[..., Awaitable[Any]]  # ServiceBusReceiver._call

        async def _settle_pending(self) -> None: ...

        def _check_receivable(self, route: Any) -> None: ...

        def _session_args(self) -> tuple[Any, ...]: ...

    async def delete_messages(
        self,
        max_message_count: int,
        *,
        before_enqueued_time_utc: datetime | None = None,
        timeout: Any = None,
    ) -> int:
        """Delete up to ``max_message_count`` messages (at most ``MAX_DELETE_COUNT`` a call)
        enqueued before ``before_enqueued_time_utc`` (default: now), oldest first, without
        receiving them; locked messages stay. Returns how many were deleted, fewer when
        fewer were eligible."""
        from ._receiver import _check_count  # _receiver imports this module

        await self._settle_pending()
        count = min(
            _check_count(max_message_count, "max_message_count", self.entity_path),
            MAX_DELETE_COUNT,
        )
        return await self._delete_before(
            count, _cutoff(before_enqueued_time_utc, self.entity_path), timeout
        )

    async def purge_messages(
        self, *, before_enqueued_time_utc: datetime | None = None, timeout: Any = None
    ) -> int:
        """Delete every message enqueued before ``before_enqueued_time_utc`` (default: the
        moment of this call, so messages sent meanwhile stay), in calls of
        ``MAX_DELETE_COUNT``; locked messages stay. Returns how many were deleted.
        ``timeout`` bounds each call."""
        await self._settle_pending()
        before = _cutoff(before_enqueued_time_utc, self.entity_path)
        total = 0
        drained: set[int] = set()
        while True:
            deleted = await self._delete_before(MAX_DELETE_COUNT, before, timeout, drained)
            total += deleted
            if deleted < MAX_DELETE_COUNT:
                return total

    async def _delete_before(
        self, count: int, before: float, timeout: Any, drained: set[int] | None = None
    ) -> int:
        """Delete up to ``count`` before ``before``. ``drained`` (a purge's) collects the
        partitions that deleted fewer than asked: the cutoff is fixed, so a later round of
        the same purge skips them."""
        route = await self._conn.route(self.entity_path)
        self._check_receivable(route)
        if self._transfer:  # always empty (raybus.aio._receiver)
            return 0
        if self.session is not None:  # a session's messages do not move while it is held
            _sid, _token, pid = await self.session.ensure()
            args = (count, before, self._dead_letter, *self._session_args())
            deleted: int = await self._call(
                "delete_messages", *args, partition=pid, timeout=timeout
            )
            return deleted
        done: dict[int, int] = {}  # by partition: a fresh route after a change asks the rest

        async def each_partition() -> int:
            current = await self._conn.route(self.entity_path)
            for pid, _handle in current.existing():
                left = count - sum(done.values())
                if left <= 0:
                    break
                if pid in done or (drained is not None and pid in drained):
                    continue
                done[pid] = await self._call(
                    "delete_messages",
                    left,
                    before,
                    self._dead_letter,
                    None,
                    partition=pid,
                    timeout=timeout,
                )
                if drained is not None and done[pid] < left:
                    drained.add(pid)
            return sum(done.values())

        return await self._conn.retrying(self.entity_path, each_partition)
