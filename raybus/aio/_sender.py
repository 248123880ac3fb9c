"""The asyncio sender: send, schedule and cancel, coalesced per partition."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

from .. import _lane, _rpc, _sync
from .._actors.namespace import Route, TopicRoute
from .._clock import to_timestamp
from .._connection import Connection
from .._core.record import SCHEDULED, MessageRecord, snapshot
from .._core.sendable import check_sendable
from .._core.wire import send_args
from .._handler_from_connection_string import SenderFromConnectionString
from .._retry import send_repeatable
from .._topic_models import is_subscription
from ..exceptions import (
    InvalidArgumentError,
    MessageNotFoundError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    PartitionMovedError,
    ServiceBusError,
)
from ..message import ServiceBusMessage, ServiceBusMessageBatch, outgoing
from ._sequence_reads import check_sequence_numbers

if TYPE_CHECKING:
    from ..amqp._annotated import AmqpAnnotatedMessage
    from ._transaction import ServiceBusTransaction

__all__ = ["ServiceBusSender"]

# How long a send keeps following partition changes before giving up.
REDIRECT_DEADLINE_S = 60.0

# A string: ``raybus.amqp`` (the gateway) imports this module, so AmqpAnnotatedMessage is
# imported for type checking only.
SendInput: TypeAlias = (
    "ServiceBusMessage | AmqpAnnotatedMessage | ServiceBusMessageBatch"
    " | Iterable[ServiceBusMessage | AmqpAnnotatedMessage]"
)


def _records(messages: SendInput) -> list[MessageRecord]:
    if isinstance(messages, ServiceBusMessageBatch):
        return list(messages)
    if isinstance(messages, ServiceBusMessage):
        return [messages._to_record()]
    if isinstance(messages, str | bytes | dict) or not isinstance(messages, Iterable):
        one = outgoing(messages)
        if one is not None:
            return [one._to_record()]
        raise InvalidArgumentError(
            "send ServiceBusMessage or AmqpAnnotatedMessage objects, a list of them, or a "
            f"ServiceBusMessageBatch; not {type(messages).__name__}",
            None,
            "message",
        )
    out = []
    for m in messages:
        # The common case without a call per message; ``outgoing`` takes the rest.
        sendable = m if isinstance(m, ServiceBusMessage) else outgoing(m)
        if sendable is None:
            raise InvalidArgumentError(
                "a list to send must hold ServiceBusMessage or AmqpAnnotatedMessage objects, "
                f"not {type(m).__name__}",
                None,
                "message",
            )
        out.append(sendable._to_record())
    return out


def _check_spanning(route: Route, records: list[MessageRecord]) -> None:
    """A list that spans partitions is refused for bad input before any share is sent, so a
    rejected list stores nothing (the partitions repeat these checks)."""
    check_sendable(route.properties.name, route.properties, records)


def _repeatable(route: Route, records: list[MessageRecord]) -> Callable[[BaseException], bool]:
    """Which errors a send of ``records`` may be repeated after (``raybus._retry``): a broken
    connection only when duplicate detection would drop a message stored twice."""
    return send_repeatable(
        route.properties.requires_duplicate_detection
        and all(rec.message_id is not None for rec in records)
    )


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


class ServiceBusSender(SenderFromConnectionString):
    """Sends messages to one queue or topic. Get one from ``ServiceBusClient.get_queue_sender``
    or ``get_topic_sender``. A send to a topic returns once every subscription's copy is
    stored (all or none; see ``raybus._actors.router``).

    Concurrent ``send_messages`` calls from tasks of one client are coalesced into one actor
    call per partition; each call still returns (or raises) on its own. Not safe to share
    across event loops.
    """

    _SYNC = False  # what _from_connection_string makes it with: the asyncio client

    def __init__(
        self,
        connection: Connection,
        queue_name: str,
        client_identifier: str | None = None,
        *,
        fully_qualified_namespace: str | None = None,
    ) -> None:
        self._conn = connection
        # The SDK's names: the queue or topic as entity_path and entity_name, and the client's
        # namespace (raybus's namespace name, or the host of the connection string given).
        self.entity_path = self.entity_name = queue_name
        self.fully_qualified_namespace = fully_qualified_namespace or connection.namespace
        self.client_identifier = client_identifier or f"SBSender-{uuid.uuid4()}"
        self._closed = False
        self._turn = 0  # rotates the partition that unkeyed messages go to on ties

    async def _route(self, refresh: bool = False) -> Route:
        if self._closed:
            raise InvalidArgumentError("the sender is closed", self.entity_path, "sender")
        return await self._conn.route(self.entity_path, refresh=refresh)

    def _groups(self, route: Route, records: list[MessageRecord]) -> dict[int, list[int]]:
        """Indexes of ``records`` per partition id: keyed messages by the map, the unkeyed
        ones all to the live partition with the fewest sends in flight from this client."""
        if route.single:
            return {0: list(range(len(records)))}
        dedup = route.properties.requires_duplicate_detection
        return route.pmap.place(records, dedup, lambda: self._least_loaded(route))

    def _least_loaded(self, route: Route) -> int:
        live = route.pmap.live
        self._turn += 1
        n = len(live)
        order = [live[(self._turn + i) % n] for i in range(n)]
        name = route.properties.name
        return min(order, key=lambda pid: self._conn.sender(name, route.partitions[pid]).pending)

    async def _send(self, records: list[MessageRecord], timeout: float | None) -> list[int]:
        if not records:
            return []
        try:
            if timeout is None:
                return await self._send_routed(records)
            try:
                return await asyncio.wait_for(self._send_routed(records), timeout)
            except asyncio.TimeoutError:
                raise OperationTimeoutError(
                    f"the send did not finish within {timeout} s; it may or may not have "
                    "been stored",
                    self.entity_path,
                ) from None
        except MessagingEntityNotFoundError:
            self._conn.forget(self.entity_path)
            raise

    async def _send_routed(self, records: list[MessageRecord]) -> list[int]:
        """Send each partition's share; resend a share whose partition moved its keys away
        (after refreshing the map), until ``REDIRECT_DEADLINE_S`` passes."""
        out: list[int] = [0] * len(records)
        todo = list(range(len(records)))
        route = await self._route()
        if is_subscription(route.properties.name):
            raise InvalidArgumentError(
                f"{route.properties.name!r} is a subscription: subscriptions are receive-only; "
                "send to its topic",
                self.entity_path,
                "entity",
            )
        policy = self._conn.retry
        repeatable = _repeatable(route, records)
        if isinstance(route, TopicRoute):
            # A topic's copies get their numbers in each subscription: none to report.
            publisher = self._conn.publisher(route.properties.name, route.router)
            await policy.run(lambda: publisher.submit(records), repeatable, self.entity_path)
            return []
        deadline = time.monotonic() + REDIRECT_DEADLINE_S
        delay = 0.005
        retry = 0  # of the client's retry policy: shares refused for a transient reason
        while True:
            subset = [records[i] for i in todo]
            groups = self._groups(route, subset)
            if len(groups) > 1:
                _check_spanning(route, subset)
            entity = route.properties.name
            futs = [
                self._conn.sender(entity, route.partitions[pid]).submit([subset[j] for j in idxs])
                for pid, idxs in groups.items()
            ]
            results = await asyncio.gather(*futs, return_exceptions=True)
            moved: list[int] = []
            again: list[int] = []  # shares to repeat under the retry policy
            again_after: BaseException | None = None
            first_error: BaseException | None = None
            gone = any(isinstance(r, MessagingEntityNotFoundError) for r in results)
            # A partition removed by a change (not the queue deleted): resend by the new map.
            removed = gone and await self._conn.recheck(self.entity_path)
            for (_pid, idxs), result in zip(groups.items(), results, strict=True):
                if isinstance(result, PartitionMovedError) or (
                    removed and isinstance(result, MessagingEntityNotFoundError)
                ):
                    moved.extend(todo[j] for j in idxs)
                elif isinstance(result, BaseException):
                    if retry < policy.total and repeatable(result):
                        again.extend(todo[j] for j in idxs)
                        again_after = result
                    else:
                        first_error = first_error or result
                else:
                    for j, seq in zip(idxs, result, strict=True):
                        out[todo[j]] = seq
            if first_error is not None:
                raise first_error
            if not moved and not again:
                return out
            if moved and time.monotonic() > deadline:
                raise OperationTimeoutError(
                    "the queue's partitions kept changing; some messages were not sent",
                    entity,
                )
            if again:
                retry += 1
                assert again_after is not None
                wait = policy.wait_before(retry, again_after, f"a send to {entity}")
            else:
                wait = delay
                delay = min(0.1, delay * 2)
            await asyncio.sleep(wait)
            todo = sorted(moved + again)
            if moved:
                route = await self._route(refresh=True)

    async def _check_transactional(self) -> None:
        route = await self._route()
        if is_subscription(route.properties.name):
            raise InvalidArgumentError(
                f"{route.properties.name!r} is a subscription: subscriptions are receive-only",
                self.entity_path,
                "entity",
            )

    def send_blocking(self, records: list[MessageRecord]) -> bool:
        """For the sync API: send from the caller's thread, blocking until accepted.

        Returns False without sending when the route is not cached yet or the queue has
        several partitions (the caller then takes the event-loop path).
        """
        route = self._conn.cached_route(self.entity_path)
        if route is None or self._closed or isinstance(route, TopicRoute) or not route.single:
            return False
        if _lane.open_from(_sync.loop(), route.partitions[0]):
            return False  # a lane from raybus's loop costs less than a Ray call from here
        if not records:
            return True
        entity = route.properties.name
        policy = self._conn.retry
        repeatable = _repeatable(route, records)
        retry = 0
        while True:
            try:
                (result,) = _rpc.call_sync(
                    entity, route.partitions[0].send_groups, *send_args([records])
                )
            except MessagingEntityNotFoundError:
                self._conn.forget(self.entity_path)
                raise
            except ServiceBusError as exc:  # the connection broke: the outcome is unknown
                result = exc
            if isinstance(result, PartitionMovedError):
                return False  # the partition count changed: resend by the new map
            if not isinstance(result, BaseException):
                return True
            if retry >= policy.total or not repeatable(result):
                raise result
            retry += 1
            time.sleep(policy.wait_before(retry, result, f"a send to {entity}"))

    async def send_messages(
        self,
        message: SendInput,
        *,
        timeout: float | None = None,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        """Send one message, a list, or a batch. Returns once the broker accepted all of it.

        A list or batch is all-or-nothing: on any error nothing of it was stored. On a queue of
        several partitions a list whose messages have different partition keys is split by
        partition: bad input still stores nothing (checked before any share is sent), but a
        refusal only one partition can make (its size quota) leaves the other shares stored
        (give the list one partition key to make it all-or-nothing). With duplicate detection
        on, repeated message ids are dropped silently.
        """
        records = _records(message)
        if transaction is not None:
            await self._check_transactional()
            await transaction.add_send(self, records)  # sent at commit
            return
        await self._send(records, _check_timeout(timeout, self.entity_path))

    async def schedule_messages(
        self,
        messages: SendInput,
        schedule_time_utc: datetime,
        *,
        timeout: float | None = None,
        transaction: ServiceBusTransaction | None = None,
    ) -> list[int]:
        """Enqueue messages at ``schedule_time_utc``; returns their sequence numbers (for
        ``cancel_scheduled_messages``). A time in the past enqueues them at once. In a
        ``transaction`` they are numbered at commit, so this returns an empty list.

        On a topic, as in Service Bus, the topic holds them (its router,
        ``raybus._core.topic_schedule``) and numbers them; at their time they go through the
        subscriptions' rules as they stand then, each copy numbered anew in its
        subscription."""
        if not isinstance(schedule_time_utc, datetime):
            raise InvalidArgumentError(
                "schedule_time_utc must be a datetime", self.entity_path, "schedule_time_utc"
            )
        at = to_timestamp(schedule_time_utc)
        records = [snapshot(rec) for rec in _records(messages)]  # not the messages' own
        for rec in records:
            rec.scheduled_enqueue_time = at
        if transaction is not None:
            await self._check_transactional()
            await transaction.add_send(self, records)
            return []
        timeout_s = _check_timeout(timeout, self.entity_path)
        route = await self._route()
        if isinstance(route, TopicRoute) and records:  # the router checks them
            seqs: list[int] = await self._at_router(
                route, route.router.schedule, *send_args([records]), timeout=timeout_s
            )
            return seqs
        return await self._send(records, timeout_s)

    async def cancel_scheduled_messages(
        self, sequence_numbers: int | Iterable[int], *, timeout: float | None = None
    ) -> None:
        """Cancel scheduled messages; all or none (``MessageNotFoundError`` names missing)."""
        seqs = check_sequence_numbers(sequence_numbers, self.entity_path)
        if not seqs:
            return
        route = await self._route()
        timeout_s = _check_timeout(timeout, self.entity_path)
        if isinstance(route, TopicRoute):
            await self._at_router(route, route.router.cancel_scheduled, seqs, timeout=timeout_s)
            return

        await self._cancel_located(seqs, timeout_s)

    async def _cancel_located(self, seqs: list[int], timeout_s: float | None) -> None:
        """Cancel ``seqs`` at the partitions that hold them. A message that activates between
        the check and its cancellation makes its partition's share fail (all or none within a
        partition); the others are cancelled. A share that a partition change moved between
        the two is followed to where it went (``Connection.follow_moves``)."""

        async def located() -> tuple[dict[int, list[int]], list[int]]:
            # The cached route; a fresh one after ``retrying`` found it lacks a partition.
            return await self._conn.locate(await self._route(), seqs, SCHEDULED)

        by_partition, missing = await self._conn.retrying(self.entity_path, located)
        if missing:  # checked in every partition before anything is cancelled
            raise MessageNotFoundError(
                f"no scheduled message has sequence number(s) {missing}", self.entity_path, missing
            )

        async def cancel(pid: int, share: list[int]) -> None:
            route = await self._route()
            handle = route.handle(pid)
            if handle is None:
                raise MessageNotFoundError(
                    f"no scheduled message has sequence number(s) {share}: partition {pid} is gone",
                    self.entity_path,
                    share,
                )
            await _rpc.call(
                route.properties.name, handle.cancel_scheduled, share, timeout=timeout_s
            )

        outcomes = await asyncio.gather(
            *(
                self._conn.follow_moves(self.entity_path, pid, share, cancel)
                for pid, share in by_partition.items()
            )
        )
        errors = [o for each in outcomes for o in each if isinstance(o, Exception)]
        if errors:
            raise errors[0]

    async def _at_router(
        self, route: TopicRoute, method: Any, *args: Any, timeout: float | None
    ) -> Any:
        """A call to the topic's router (schedule, cancel)."""
        try:
            return await _rpc.call(route.properties.name, method, *args, timeout=timeout)
        except MessagingEntityNotFoundError:
            self._conn.forget(self.entity_path)
            raise

    async def create_message_batch(
        self, max_size_in_bytes: int | None = None
    ) -> ServiceBusMessageBatch:
        """An empty batch limited to ``max_size_in_bytes`` (default and maximum: the queue's
        max message size)."""
        route = await self._conn.route(self.entity_path)
        limit = route.properties.max_message_size
        # The batch checks the size is a positive int; the entity's limit is checked here.
        batch = ServiceBusMessageBatch(limit if max_size_in_bytes is None else max_size_in_bytes)
        if batch.max_size_in_bytes > limit:
            raise InvalidArgumentError(
                f"max_size_in_bytes must be from 1 to {limit}, not {max_size_in_bytes!r}",
                self.entity_path,
                "max_size_in_bytes",
            )
        return batch

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> ServiceBusSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
