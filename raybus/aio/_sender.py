"""The asyncio sender: send, schedule and cancel, coalesced per partition."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from .. import _rpc
from .._clock import to_timestamp
from .._connection import Connection
from .._core.record import MessageRecord, snapshot, to_wire
from ..exceptions import (
    InvalidArgumentError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
)
from ..message import ServiceBusMessage, ServiceBusMessageBatch

__all__ = ["ServiceBusSender"]

SendInput = ServiceBusMessage | ServiceBusMessageBatch | Iterable[ServiceBusMessage]


def _records(messages: SendInput) -> list[MessageRecord]:
    if isinstance(messages, ServiceBusMessageBatch):
        return list(messages)
    if isinstance(messages, ServiceBusMessage):
        return [messages._to_record()]
    if isinstance(messages, str | bytes | dict) or not isinstance(messages, Iterable):
        raise InvalidArgumentError(
            "send ServiceBusMessage objects, a list of them, or a ServiceBusMessageBatch; "
            f"not {type(messages).__name__}",
            None,
            "message",
        )
    out = []
    for m in messages:
        if not isinstance(m, ServiceBusMessage):
            raise InvalidArgumentError(
                f"a list to send must hold ServiceBusMessage objects, not {type(m).__name__}",
                None,
                "message",
            )
        out.append(m._to_record())
    return out


def _check_timeout(timeout: Any, entity: str) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise InvalidArgumentError(
            f"timeout must be a positive number of seconds or None, not {timeout!r}",
            entity,
            "timeout",
        )
    return float(timeout)


class ServiceBusSender:
    """Sends messages to one queue. Get one from ``ServiceBusClient.get_queue_sender``.

    Concurrent ``send_messages`` calls from tasks of one client are coalesced into one actor
    call per partition; each call still returns (or raises) on its own. Not safe to share
    across event loops.
    """

    def __init__(self, connection: Connection, queue_name: str) -> None:
        self._conn = connection
        self.entity_path = queue_name
        self._closed = False

    async def _partition(self, records: Sequence[MessageRecord]) -> tuple[str, Any]:
        if self._closed:
            raise InvalidArgumentError("the sender is closed", self.entity_path, "sender")
        route = await self._conn.route(self.entity_path)
        # One partition per queue for now; the partition id stays in the route so that
        # partition selection by key can follow.
        return route.properties.name, route.partitions[0]

    async def _send(self, records: list[MessageRecord], timeout: float | None) -> list[int]:
        if not records:
            return []
        entity, actor = await self._partition(records)
        try:
            fut = self._conn.sender(entity, actor).submit(records)
            if timeout is None:
                return await fut
            try:
                return await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                raise OperationTimeoutError(
                    f"the send did not finish within {timeout} s; it may or may not have "
                    "been stored",
                    entity,
                ) from None
        except MessagingEntityNotFoundError:
            self._conn.forget(self.entity_path)
            raise

    def send_blocking(self, records: list[MessageRecord]) -> bool:
        """For the sync API: send from the caller's thread, blocking until accepted.

        Returns False without sending when the route is not cached yet (the caller then takes
        the event-loop path, which resolves it).
        """
        route = self._conn.cached_route(self.entity_path)
        if route is None or self._closed:
            return False
        if records:
            entity = route.properties.name
            try:
                (result,) = _rpc.call_sync(
                    entity, route.partitions[0].send_groups, [to_wire(records)]
                )
            except MessagingEntityNotFoundError:
                self._conn.forget(self.entity_path)
                raise
            if isinstance(result, BaseException):
                raise result
        return True

    async def send_messages(self, message: SendInput, *, timeout: float | None = None) -> None:
        """Send one message, a list, or a batch. Returns once the broker accepted all of it.

        A list or batch is all-or-nothing: on any error nothing of it was stored. With
        duplicate detection on, repeated message ids are dropped silently.
        """
        records = _records(message)
        await self._send(records, _check_timeout(timeout, self.entity_path))

    async def schedule_messages(
        self,
        messages: ServiceBusMessage | Iterable[ServiceBusMessage],
        schedule_time_utc: datetime,
        *,
        timeout: float | None = None,
    ) -> list[int]:
        """Enqueue messages at ``schedule_time_utc``; returns their sequence numbers (for
        ``cancel_scheduled_messages``). A time in the past enqueues them at once."""
        if not isinstance(schedule_time_utc, datetime):
            raise InvalidArgumentError(
                "schedule_time_utc must be a datetime", self.entity_path, "schedule_time_utc"
            )
        at = to_timestamp(schedule_time_utc)
        records = [snapshot(rec) for rec in _records(messages)]  # not the messages' own
        for rec in records:
            rec.scheduled_enqueue_time = at
        return await self._send(records, _check_timeout(timeout, self.entity_path))

    async def cancel_scheduled_messages(
        self, sequence_numbers: int | Iterable[int], *, timeout: float | None = None
    ) -> None:
        """Cancel scheduled messages; all or none (``MessageNotFoundError`` names missing)."""
        seqs = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seqs):
            raise InvalidArgumentError(
                f"sequence numbers must be non-negative ints: {seqs!r}",
                self.entity_path,
                "sequence_numbers",
            )
        if not seqs:
            return
        entity, actor = await self._partition([])
        await _rpc.call(
            entity, actor.cancel_scheduled, seqs, timeout=_check_timeout(timeout, self.entity_path)
        )

    async def create_message_batch(
        self, max_size_in_bytes: int | None = None
    ) -> ServiceBusMessageBatch:
        """An empty batch limited to ``max_size_in_bytes`` (default and maximum: the queue's
        max message size)."""
        route = await self._conn.route(self.entity_path)
        limit = route.properties.max_message_size
        if max_size_in_bytes is None:
            max_size_in_bytes = limit
        if (
            isinstance(max_size_in_bytes, bool)
            or not isinstance(max_size_in_bytes, int)
            or not 0 < max_size_in_bytes <= limit
        ):
            raise InvalidArgumentError(
                f"max_size_in_bytes must be from 1 to {limit}, not {max_size_in_bytes!r}",
                self.entity_path,
                "max_size_in_bytes",
            )
        return ServiceBusMessageBatch(max_size_in_bytes)

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> ServiceBusSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
