"""The asyncio receiver: batched receive, prefetch, peek, and fast settlement.

Settlement guarantee (the same as Azure's own Python SDK, which does not wait for the
broker's disposition acknowledgement either): when a message's lock is comfortably valid
(more than ``min(5 s, lock_duration / 2)`` left by this process's clock) ``complete_message``,
``abandon_message``, ``defer_message`` and ``dead_letter_message`` hand the settlement to a
per-partition batcher and return without waiting for the broker. If the broker refuses it (the
lock was lost, e.g. to an actor restart) the next call on this receiver that reaches the broker
(``receive_messages``, ``peek_messages``, ``receive_deferred_messages``, ``renew_message_lock``,
``complete_messages``) or ``close()`` raises ``SettlementFailedError``
listing the refused messages; they were not settled and will be delivered again. Such a call
waits for the settlements sent before it (a receive runs alongside them, so this costs no extra
round trip) and, when it raises, gives back any messages it had received; ``complete_messages``
sends its own completions all the same and lists its own refusals with the earlier ones. A
single settlement (``complete_message`` and the others) never raises an earlier refusal as its
own: the error would name another message, and its own would go unsent. A receive served
entirely from the prefetch buffer does not reach the broker and reports nothing. A settlement
with little lock time left, an abandon in a session (so that the abandoned message is the
next one received), and ``complete_messages`` wait for the broker's answer. Processing
must therefore be idempotent (it must be anyway under at-least-once delivery). close() sends
what the sync API's threads handed over and waits for every settlement sent without waiting;
a settlement made on another thread once close() has started waits for its own answer (or
raises ``InvalidArgumentError`` once the receiver is closed), so no refusal goes unreported.

Closing during a receive: a ``receive_messages`` waiting at the broker when ``close()`` runs
must not hand out messages locked to a closed receiver, which could not settle them, nor leave
its partition call waiting (a long poll may last ``max_wait_time``, and the standing request
30 s): that call would take what arrives next for nobody, locked until its lock expired, or
deleted in receive-and-delete mode, once the program's event loop had ended. So close() ends
the wait of every receive this receiver has out at a partition (the partition's
``end_waits``: each returns no messages at once) and waits, up to 5 s, for the standing
request to answer. A receive whose broker answer arrives once close() has started (it took
messages before the end reached the partition) gives every message of it back at once
(RELEASE: available to other receivers at once, no delivery counted; prefetched extras too)
and returns ``[]``; an error that the close causes in it (the closed receiver, the released
session) also ends it with ``[]``. In receive-and-delete mode the broker has deleted what it
handed out: the receive returns all of it (more than ``max_message_count`` if it prefetched,
as the closed receiver has no buffer to keep the rest in); those messages are the caller's.
The sync API's receive that waits on its caller's own thread (its direct path) registers its
call too, so a close() from another thread ends it the same way.

A receive whose caller is cancelled (``asyncio.wait_for``, a timeout, a cancelled task) ends
the same way: its partition call is told to end its wait, and what it took before the end
arrived is given back (peek-lock) or kept in the buffer for the next receive
(receive-and-delete: the broker deleted it), not left to nobody. A session receiver's messages
are locked by the session, which close() releases (they come again, none counted): its receive
cut short returns ``[]`` too, and gives back what it got should its answer beat the release. A
receive that starts after close() has started raises ``InvalidArgumentError``; so does a
``receive_deferred_messages`` answered once close() has started, after giving its messages
back (deferred again): it asked for those messages, and ``[]`` would read as "none there".
The close is seen through the prefetch buffer's state (``raybus.aio._prefetch``), and every
message this receiver will not hand out goes back through one path (``_release``). A
prefetching peek-lock receiver's standing request (``_standing_receive``), which outlives the
receive that made it, follows the same rule: close() ends it, and what it brings once close()
took the buffer is given back at once.

The transfer dead-letter sub-queue (``ServiceBusSubQueue.TRANSFER_DEAD_LETTER``) is always
empty in raybus, so a receiver of it asks no partition anything: in Service Bus it holds the
messages a transfer could not deliver (send-via, forwarding), and raybus has no such transfer
to fail. Its send-via is one transaction, which a refusing destination refuses whole, and a
forward that cannot be delivered dead-letters at the source, as auto-forwarding does. Its
receive waits as on an empty queue (``max_wait_time``, forever when None, until ``close()``),
peek returns ``[]``, and deferred receives, settlements and renewals find nothing.

The receiver is put together from mixins, each a part with a rule of its own: ``Settlement``
(settling message objects), ``LockTokenSettlement`` (by lock token), ``Prefetch`` (the buffer,
its refill by ``complete_messages``, and how ``close()`` waits for a refill under way, which
the sync API runs on its callers' threads) and ``SequenceReads`` (peek, deferred receive).
This module keeps receiving, the plumbing the parts share, and closing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from itertools import chain
from typing import Any

from .. import _lane, _rpc, _sync
from .._actors.namespace import Route, TopicRoute
from .._clock import from_timestamp
from .._connection import Connection, SettleResults
from .._core.partition import ABANDON, COMPLETE, DEAD_LETTER, DEFER, RELEASE, SettleOp
from .._core.record import MessageRecord, WireRecord, from_wire, wire_sizes
from .._core.wire import pieces_for
from .._handler_from_connection_string import ReceiverFromConnectionString
from .._retry import RetryPolicy
from ..enums import ServiceBusReceiveMode, ServiceBusSubQueue
from ..exceptions import (
    InvalidArgumentError,
    MessageLockLostError,
    MessagingEntityNotFoundError,
    ServiceBusError,
)
from ..message import ServiceBusReceivedMessage
from . import _complete
from ._batch_delete import BatchDelete
from ._fanout import StandingWaits, _past, receive_partitioned, receive_single
from ._lock_token import LockTokenSettlement
from ._prefetch import Prefetch
from ._refusal import Failure
from ._sequence_reads import SequenceReads
from ._session import ServiceBusSession, check_session_id
from ._settlement import Settlement
from ._transaction import ServiceBusTransaction

__all__ = ["ServiceBusReceiver"]

_log = logging.getLogger("raybus.receiver")

# A receive with no max_wait_time waits in slices of this length, so a deleted queue or a
# closed receiver is noticed.
_WAIT_SLICE_S = 30.0
# How long close() waits for the standing request it ended to answer.
_END_WAIT_S = 5.0


def _retries(method_name: str, policy: RetryPolicy) -> int:
    """Receives and peeks ride out a partition restart, as often as the client's retry policy
    says; settlements are not repeated (a repeated one would fail on the new lock table
    anyway)."""
    return policy.total if method_name in ("receive", "peek") else 0


def lock_token_of(message: Any) -> str:
    """The lock token of a message to settle; a typed error for anything that is not a
    received message (checked before the settlement is even built)."""
    if not isinstance(message, ServiceBusReceivedMessage):
        raise InvalidArgumentError(
            f"settle a ServiceBusReceivedMessage, not {type(message).__name__}", None, "message"
        )
    return message._record.lock_token or ""


def _release_ops(records: Iterable[MessageRecord]) -> dict[int, list[tuple[Any, ...]]]:
    """The settle ops that give back the locks of ``records``, by partition (the top 16 bits
    of a sequence number): for close() and for a receive that must raise instead."""
    by_partition: dict[int, list[tuple[Any, ...]]] = {}
    for rec in records:
        op = SettleOp(RELEASE, rec.lock_token or "").to_wire()
        by_partition.setdefault(rec.sequence_number >> 48, []).append(op)
    return by_partition


def _check_count(value: Any, name: str, entity: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive int, not {value!r}", entity, name)
    return value


def _check_non_negative(value: Any, name: str, entity: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be an int >= 0, not {value!r}", entity, name)
    return value


def _check_wait(value: Any, name: str, entity: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidArgumentError(
            f"{name} must be a positive number of seconds or None, not {value!r}", entity, name
        )
    return float(value)


class ServiceBusReceiver(
    Settlement,
    LockTokenSettlement,
    Prefetch,
    SequenceReads,
    BatchDelete,
    ReceiverFromConnectionString,
):
    """Receives from one queue (or its dead-letter sub-queue).

    Get one from ``ServiceBusClient.get_queue_receiver``. Not safe to share across event loops;
    concurrent tasks of one loop may use it (their settlements share actor calls).
    """

    _SYNC = False  # what _from_connection_string makes it with: the asyncio client

    def __init__(
        self,
        connection: Connection,
        queue_name: str,
        *,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        sub_queue: ServiceBusSubQueue | str | None = None,
        max_wait_time: float | None = None,
        prefetch_count: int = 0,
        session_id: Any = None,
        auto_lock_renewer: Any = None,
        client_identifier: str | None = None,
        fully_qualified_namespace: str | None = None,
    ) -> None:
        self._conn = connection
        self.entity_path = queue_name
        # As the sender's: the client's namespace (or the host of its connection string).
        self.fully_qualified_namespace = fully_qualified_namespace or connection.namespace
        # The SDK's identifier of a handler (it names it in its errors): for the caller's logs.
        self.client_identifier = client_identifier or f"SBReceiver-{uuid.uuid4()}"
        try:
            self.receive_mode = ServiceBusReceiveMode(receive_mode)
        except ValueError:
            raise InvalidArgumentError(
                f"receive_mode {receive_mode!r} is not PEEK_LOCK or RECEIVE_AND_DELETE",
                queue_name,
                "receive_mode",
            ) from None
        try:
            self.sub_queue = None if sub_queue is None else ServiceBusSubQueue(sub_queue)
        except ValueError:
            raise InvalidArgumentError(
                f"sub_queue {sub_queue!r} is not DEAD_LETTER or TRANSFER_DEAD_LETTER",
                queue_name,
                "sub_queue",
            ) from None
        self.session: ServiceBusSession | None = None
        if session_id is not None:
            if self.sub_queue is not None:
                raise InvalidArgumentError(
                    "the dead-letter sub-queue has no sessions: receive from it without session_id",
                    queue_name,
                    "session_id",
                )
            self.session = ServiceBusSession(self, check_session_id(session_id, queue_name))
        self.max_wait_time = _check_wait(max_wait_time, "max_wait_time", queue_name)
        self.prefetch_count = _check_non_negative(prefetch_count, "prefetch_count", queue_name)
        self._dead_letter = self.sub_queue is ServiceBusSubQueue.DEAD_LETTER
        # Always empty (see the module docstring): no partition is asked.
        self._transfer = self.sub_queue is ServiceBusSubQueue.TRANSFER_DEAD_LETTER
        self._delete = self.receive_mode is ServiceBusReceiveMode.RECEIVE_AND_DELETE
        self._init_prefetch()
        self._init_reads()
        self._row_bytes = 0.0  # the wire size of a row the last call returned, on average
        # This receiver's receives out at partitions: waiter id -> partition (``_receive_call``).
        self._waiter_prefix = uuid.uuid4().hex[:16]
        self._waiter_ids = itertools.count()
        self._waits: dict[str, int] = {}
        self._orphans: set[asyncio.Task[None]] = set()
        self._turn = 0
        self._pending: set[asyncio.Future[SettleResults]] = set()
        # Settlements sent without waiting (from any thread) and how many the broker has
        # answered (loop thread), so a sync call can wait for those sent before it.
        self._answers = threading.Condition()
        self._handed = 0
        self._answered = 0
        self._failures: list[Failure] = []
        self._closed = False
        self._renewer = auto_lock_renewer
        # Settlements handed over by the sync API's threads (see settle_from_thread).
        self._handoff: list[tuple[ServiceBusReceivedMessage, SettleOp, str, Any]] = []
        self._handoff_lock = threading.Lock()
        self._handoff_scheduled = False
        # The standing request of a prefetching receiver (``_stands``), if one is out: it
        # puts what it gets in the buffer, and answers a broker refusal (None otherwise).
        self._standing: asyncio.Task[ServiceBusError | None] | None = None
        # The waits a receive that found nothing left out at the partitions (``_fanout``).
        self._standing_waits = StandingWaits()

    # ------------------------------------------------------------------ plumbing

    async def _actor(self, partition: int = 0) -> tuple[str, Any, float]:
        """(entity name, partition actor, lock duration in seconds)."""
        if self._closed:
            raise InvalidArgumentError("the receiver is closed", self.entity_path, "receiver")
        route = await self._conn.route(self.entity_path)
        handle = route.handle(partition)
        if handle is None:  # removed by a scale-down, which waits for every lock to end
            raise MessageLockLostError(
                f"partition {partition} of the queue no longer exists; its locks ended",
                self.entity_path,
            )
        return route.properties.name, handle, route.properties.lock_duration_s

    def _next_turn(self) -> int:
        """Rotates the partition that a partitioned receive asks first (fairness)."""
        self._turn += 1
        return self._turn

    def _session_args(self) -> tuple[Any, ...]:
        """The (session id, token) argument of calls made within the accepted session."""
        if self.session is None:
            return ()
        assert self.session.session_id is not None
        return ((self.session.session_id, self.session._token),)

    async def _call(
        self,
        method_name: str,
        *args: Any,
        partition: int = 0,
        timeout: Any = None,
        returns: int = 1,
    ) -> Any:
        entity, actor, _ = await self._actor(partition)
        timeout = _check_wait(timeout, "timeout", self.entity_path)
        try:
            return await _rpc.call(
                entity,
                getattr(actor, method_name),
                *args,
                timeout=timeout,
                retries=_retries(method_name, self._conn.retry),
                backoff=self._conn.retry.delay,
                returns=returns,
            )
        except MessagingEntityNotFoundError:
            if partition == 0:
                self._conn.forget(self.entity_path)
            raise

    def _wrap(self, rows: Iterable[WireRecord], kind: str) -> list[ServiceBusReceivedMessage]:
        entity = self.entity_path
        return [ServiceBusReceivedMessage(r, entity=entity, kind=kind) for r in from_wire(rows)]

    # ------------------------------------------------------------------ receiving

    async def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[ServiceBusReceivedMessage]:
        """Up to ``max_message_count`` messages, waiting up to ``max_wait_time`` seconds (the
        receiver's default when None; forever when both are None) for the first one.

        Returns as soon as at least one message is there; may return fewer than asked.
        """
        ready, count, fetch, deadline = self._receive_start(max_message_count, max_wait_time)
        if ready:
            return ready
        return await self._receive_rest(count, fetch, deadline)

    async def _receive_rest(
        self, count: int, fetch: int, deadline: float | None
    ) -> list[ServiceBusReceivedMessage]:
        """``receive_messages`` after ``_receive_start`` found the buffer empty: from the
        broker. The sync API comes here too, through the loop, for a standing request."""
        sent_before = list(self._pending)
        try:
            rows = await self._conn.retrying(self.entity_path, lambda: self._fetch(fetch, deadline))
        except ServiceBusError:
            if not self._closing:
                raise
            rows = []  # cut short by close() (see the module docstring)
        # The settlements sent before this call ran alongside it; report a refusal now.
        if sent_before:
            await asyncio.gather(*sent_before, return_exceptions=True)
        out = self._receive_done(rows, count)
        if out is None:
            await self._release_rows(rows)
            self._raise_failures()
            return []
        # A standing request (``_standing_receive``) answers into the buffer.
        return out or self._from_buffer(count)

    def _check_receivable(self, route: Any) -> None:
        if isinstance(route, TopicRoute):
            raise InvalidArgumentError(
                f"{self.entity_path!r} is a topic: receive from one of its subscriptions "
                "(get_subscription_receiver)",
                self.entity_path,
                "entity",
            )

    async def _fetch(self, fetch: int, deadline: float | None) -> list[WireRecord]:
        """Receive up to ``fetch`` messages from the broker (waiting until ``deadline``)."""
        route = await self._conn.route(self.entity_path)
        self._check_receivable(route)
        if self._transfer:
            await self._wait_for_close(deadline)
            return []
        forwards = (
            route.properties.forward_dead_lettered_messages_to
            if self._dead_letter
            else route.properties.forward_to
        )
        if forwards:
            raise InvalidArgumentError(
                f"{self.entity_path!r} forwards its messages to {forwards!r}: receive from there",
                self.entity_path,
                "forward_to",
            )
        if self.session is not None:
            _sid, _token, pid = await self.session.ensure()
            if self._closing:  # accepted after close() released the session: give it up
                await self.session.release()
                return []
            while True:
                args = self._receive_args(fetch, deadline, *self._session_args())
                rows = await self._receive_call(args, pid)
                if rows or _past(deadline) or self._closing:
                    break
        elif route.single and self._stands():
            await self._standing_receive(fetch, deadline)
            return []  # what it got is in the buffer
        elif route.single:
            rows = await receive_single(self, route, fetch, deadline)
        else:
            rows = await receive_partitioned(self, route, fetch, deadline)
        result: list[WireRecord] = rows
        return result

    def _stands(self) -> bool:
        """Whether this receiver keeps a standing request at the broker when its route is of
        one partition (the callers check that): a peek-lock receiver of a queue or
        subscription or of its dead-letter sub-queue, with a prefetch buffer, no session.
        See ``_standing_receive``."""
        return (
            self.prefetch_count > 0
            and not self._delete
            and not self._transfer  # always empty: no partition is asked
            and self.session is None
        )

    async def _standing_receive(self, fetch: int, deadline: float | None) -> None:
        """Wait until ``deadline`` (forever when None) for the standing request to put
        messages in the buffer, making one if none is out.

        A prefetching receiver's request to its partition does not end with the receive that
        made it: the partition holds it up to ``_WAIT_SLICE_S`` whatever the caller's
        ``max_wait_time``, and when the caller stops waiting it stays out and puts what it
        gets in the prefetch buffer, for the next receive. This is what an AMQP receiver's
        link credit does in Service Bus (its prefetched messages are locked from the moment
        they are fetched). Why: each receive that found nothing in ``max_wait_time`` cost a
        call, and a loop of short waits on an idle subscription made one every few hundred
        ms (measured: 30 idle subscriptions with receivers waiting 0.2 s at a time, 144 calls
        a second costing 1.9 ms of the client's CPU and 2.2 ms of the partition's each, 0.6
        of a core on the 2-core test machine). Once close() has taken the buffer, what a
        standing request brings is given back at once (``_buffer_more``)."""
        while True:
            standing = self._standing
            stale = standing is not None and standing.done()  # answered while nobody waited
            if standing is None:
                if self._closing:  # a closed receiver's request would lock for nobody
                    return
                args = self._receive_args(fetch, None)  # the partition holds it one slice
                standing = self._standing = asyncio.ensure_future(self._stand(args))
            if not stale:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    await asyncio.wait_for(asyncio.shield(standing), timeout)
                except asyncio.TimeoutError:
                    return  # it stays out
            if self._standing is standing:
                self._standing = None
            refused = standing.result()
            # A stale refusal that a new call may not meet again (``retryable``) is dropped.
            if refused is not None and not (stale and refused.retryable):
                raise refused
            if self._buffer or self._closing or (not stale and _past(deadline)):
                return

    async def _stand(self, args: tuple[Any, ...]) -> ServiceBusError | None:
        """The standing request: a partition's receive whose messages go to the buffer
        (given back if close() took it). A refusal is answered, not raised, for the receive
        that waits on it or, if none does and it is not ``retryable``, the next one
        (``_standing_receive``)."""
        try:
            rows = await self._conn.retrying(self.entity_path, lambda: self._receive_call(args, 0))
        except ServiceBusError as exc:
            return exc
        back = self._buffer_more(self._wrap(rows, "locked"))
        if back:
            await self._release(m._record for m in back)
        return None

    def _leave_wait(self) -> None:
        """For the sync API's receive that found nothing on the caller's thread: leave the
        wait at the partition that ``receive_single`` leaves (on the loop, where the waits
        live; a route gone stale meanwhile leaves none)."""
        route = self._conn.cached_route(self.entity_path)
        if route is not None and not self._closing:
            self._standing_waits.ensure(route.existing(), self._dead_letter)

    async def _wait_for_close(self, deadline: float | None) -> None:
        """Wait until ``deadline`` (forever when None) or until close() starts."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            await asyncio.wait_for(self._close_started.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def _receive_from(self, pid: int, count: int, wait_s: float) -> list[WireRecord]:
        return await self._receive_call(self._receive_args(count, None, None, wait_s=wait_s), pid)

    async def _receive_call(self, args: tuple[Any, ...], pid: int) -> list[WireRecord]:
        """A partition's ``receive`` with ``args`` (``_receive_args``): its rows.

        The call runs on, shielded, when its caller is cancelled (``asyncio.wait_for`` or a
        timeout around ``receive_messages``, a cancelled task): a partition call cannot be
        taken back, and what it takes must not go to nobody. The partition is told to end
        its wait (``end_waits``) and what it took meanwhile is given back (peek-lock) or kept
        for the next receive (receive-and-delete: the broker deleted it). ``close()`` ends
        the waits of every receive still out the same way (``_end_waits``)."""
        waiter = self._new_waiter(pid)
        call = asyncio.ensure_future(
            self._call_rows("receive", *args, waiter, partition=pid, pieces=args[-1])
        )
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            if not call.done():
                task = asyncio.ensure_future(self._orphaned(call, waiter, pid))
                self._orphans.add(task)
                task.add_done_callback(self._orphans.discard)
            raise
        finally:
            if call.done():
                self._waits.pop(waiter, None)

    def _new_waiter(self, pid: int) -> str:
        """A waiter id for a receive at partition ``pid``, registered for ``_end_waits``
        until the caller drops it from ``_waits`` (any thread: the sync API's direct path)."""
        waiter = f"{self._waiter_prefix}:{next(self._waiter_ids)}"
        self._waits[waiter] = pid
        return waiter

    async def _orphaned(
        self, call: asyncio.Future[list[WireRecord]], waiter: str, pid: int
    ) -> None:
        """A receive whose caller was cancelled (``_receive_call``): end its wait, then give
        back or keep what it took."""
        try:
            await self._end_waits({pid: [waiter]})
            try:
                rows = await call
            except Exception:  # an error: it took nothing
                return
            if not rows:
                return
            if not self._delete:
                await self._release_rows(rows)
                return
            lost = self._buffer_more(self._wrap(rows, "deleted"))
            if lost:  # deleted by the broker, and this receiver closed meanwhile
                _log.warning(
                    "%s: %d message(s) of %s received and deleted for a cancelled receive "
                    "after its receiver closed",
                    self.client_identifier,
                    len(lost),
                    self.entity_path,
                )
        finally:
            self._waits.pop(waiter, None)

    async def _end_waits(self, by_partition: dict[int, list[str]] | None = None) -> None:
        """Tell the partitions to end these receives' waits (all of this receiver's receives
        out, when None). Best effort: a partition that does not answer ends them when their
        wait does."""
        if by_partition is None:
            by_partition = {}
            for waiter, pid in list(self._waits.items()):  # a copy: threads add to it
                by_partition.setdefault(pid, []).append(waiter)
        for pid, waiters in by_partition.items():
            try:
                await self._call("end_waits", waiters, partition=pid)
            except Exception as exc:  # restarting or removed: its waits ended with it
                _log.debug(
                    "%s: waits at partition %d of %s not ended: %r",
                    self.client_identifier,
                    pid,
                    self.entity_path,
                    exc,
                )

    async def _call_rows(
        self,
        method_name: str,
        *args: Any,
        partition: int = 0,
        timeout: Any = None,
        pieces: int | None = None,
    ) -> list[WireRecord]:
        """A partition call that returns rows in ``pieces`` (``receive``, ``peek``,
        ``receive_deferred``; by default its last argument is that number): the rows, joined."""
        if pieces is None:
            pieces = args[-1]
        result = await self._call(
            method_name, *args, partition=partition, timeout=timeout, returns=pieces
        )
        return self._rows(result, pieces)

    async def _release_rows(self, rows: list[WireRecord]) -> None:
        """Give back messages received by a call that must raise or return none instead."""
        await self._release(from_wire(rows))

    async def _release(self, records: Iterable[MessageRecord]) -> None:
        """Give back the locks of ``records`` at once (RELEASE: available to other receivers,
        no delivery counted): the one path for messages this receiver will not hand out (its
        buffer on close, a receive's messages when it must raise or return none). Works
        during and after close(). A release the broker refuses or does not get is let go:
        those locks end when they expire, as a vanished receiver's do."""
        by_partition = _release_ops(records)
        if not by_partition:
            return
        try:
            route = await self._conn.route(self.entity_path)
            for pid, ops in by_partition.items():
                handle = route.handle(pid)
                if handle is not None:  # else removed by a scale-down: its locks ended
                    await _rpc.call(route.properties.name, handle.settle, ops)
        except ServiceBusError:
            pass

    # receive_messages in three steps, so the sync API can run the same steps with a blocking
    # call in between (it differs only in how it waits).

    def _receive_start(
        self, max_message_count: int | None, max_wait_time: float | None
    ) -> tuple[list[ServiceBusReceivedMessage], int, int, float | None]:
        """Validate; serve from the prefetch buffer. Returns (ready, count, fetch, deadline)."""
        if self._closing:
            raise InvalidArgumentError("the receiver is closed", self.entity_path, "receiver")
        self._raise_failures()
        count = _check_count(
            1 if max_message_count is None else max_message_count,
            "max_message_count",
            self.entity_path,
        )
        wait = _check_wait(max_wait_time, "max_wait_time", self.entity_path)
        if wait is None:
            wait = self.max_wait_time
        deadline = None if wait is None else time.monotonic() + wait
        self._want = count
        return self._from_buffer(count), count, max(count, self.prefetch_count), deadline

    def _receive_args(
        self,
        fetch: int,
        deadline: float | None,
        session: tuple[str, str] | None = None,
        *,
        wait_s: float | None = None,
    ) -> tuple[Any, ...]:
        """The arguments of a partition's ``receive``. The last one is the number of pieces
        the messages come back in (``raybus._core.wire``), from the size of the rows the last
        receive returned: a result Ray can carry inside the call is much cheaper."""
        if wait_s is None:
            slice_s = _WAIT_SLICE_S if deadline is None else max(0.0, deadline - time.monotonic())
            wait_s = min(slice_s, _WAIT_SLICE_S)
        return (fetch, wait_s, self._dead_letter, self._delete, session, self._pieces(fetch))

    def _pieces(self, count: int) -> int:
        """How many pieces a call returning up to ``count`` rows asks for them in, from the
        size of the rows this receiver last saw (received, peeked or deferred): a result Ray
        can carry inside the call is much cheaper (``raybus._core.wire``)."""
        return pieces_for(int(count * self._row_bytes))

    def _rows(self, result: Any, pieces: int) -> list[WireRecord]:
        """The rows of a call that asked for them in ``pieces`` (joined if more than one);
        learns their size for the next call's ``_pieces``."""
        rows: list[WireRecord] = list(chain.from_iterable(result)) if pieces > 1 else result
        if rows:
            self._row_bytes = sum(wire_sizes(rows)) / len(rows)
        return rows

    def _receive_done(
        self, rows: list[WireRecord], count: int
    ) -> list[ServiceBusReceivedMessage] | None:
        """The messages the receive returns (the rest of ``rows`` buffered). None when it
        must give all of ``rows`` back (``_release_rows``) and then raise the refused
        settlements sent before it (``_raise_failures``) or, once close() has started, return
        none (``Prefetch._keep_received``)."""
        if self._failures and not self._delete:
            return None
        kept = self._keep_received(self._wrap(rows, "deleted" if self._delete else "locked"), count)
        return None if kept is None else self._handed_out(kept)

    def wait_answers_blocking(self, handed_before: int) -> None:
        """For the sync API: block until the broker answered the first ``handed_before``
        settlements sent without waiting (they run alongside the caller's own call)."""
        with self._answers:
            self._answers.wait_for(lambda: self._answered >= handed_before, timeout=120)

    def call_blocking(self, method_name: str, *args: Any, returns: int = 1) -> Any | None:
        """For the sync API: call the partition actor from the caller's thread, blocking.

        Returns None without calling when the route is not cached yet (the caller then takes
        the event-loop path, which resolves it).
        """
        route = self._conn.cached_route(self.entity_path)
        if route is None or self._closed or not self.direct_pays(route):
            return None
        entity = route.properties.name
        try:
            return _rpc.call_sync(
                entity,
                getattr(route.partitions[0], method_name),
                *args,
                retries=_retries(method_name, self._conn.retry),
                backoff=self._conn.retry.delay,
                returns=returns,
            )
        except MessagingEntityNotFoundError:
            self._conn.forget(self.entity_path)
            raise

    def direct_ok(self, route: Route | None) -> bool:
        """Whether the sync API may call the (single) partition from its own thread."""
        return route is not None and route.single and self.session is None and not self._transfer

    def direct_pays(self, route: Route | None) -> bool:
        """Whether the sync API should call the partition from its own thread (``direct_ok``):
        not when raybus's loop has a lane to it (``raybus._lane``), which costs less than a
        Ray call even with the hop to the loop."""
        if route is None or not self.direct_ok(route):
            return False
        return not _lane.open_from(_sync.loop(), route.partitions[0])

    def __aiter__(self) -> ServiceBusReceiver:
        """The receiver is its own iterator, as the SDK's is: ``async for`` yields messages
        until none arrives within ``max_wait_time`` (forever when None), and a later loop
        goes on where an earlier one stopped."""
        return self

    async def __anext__(self) -> ServiceBusReceivedMessage:
        # One message per step: a fetch still brings up to ``prefetch_count``, and those not
        # handed out yet wait in the prefetch buffer (released at close), not in a generator,
        # so a loop left early loses none of them in RECEIVE_AND_DELETE mode.
        batch = await self.receive_messages(1)
        if not batch:
            raise StopAsyncIteration
        return batch[0]

    async def complete_message(
        self,
        message: ServiceBusReceivedMessage,
        *,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        """Remove the message from the queue (see the module's settlement guarantee). With
        ``transaction``, at its commit."""
        await self._settle_or_join(message, SettleOp(COMPLETE, lock_token_of(message)), transaction)

    async def abandon_message(
        self,
        message: ServiceBusReceivedMessage,
        properties_to_modify: dict[str, Any] | None = None,
        *,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        """Release the lock now; the message comes again with ``delivery_count + 1``.

        ``properties_to_modify`` (a raybus and .NET/Java extension) is merged into the
        message's application properties.
        """
        await self._settle_or_join(
            message, SettleOp(ABANDON, lock_token_of(message), properties_to_modify), transaction
        )

    async def defer_message(
        self,
        message: ServiceBusReceivedMessage,
        properties_to_modify: dict[str, Any] | None = None,
        *,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        """Set the message aside; fetch it later with ``receive_deferred_messages``."""
        await self._settle_or_join(
            message, SettleOp(DEFER, lock_token_of(message), properties_to_modify), transaction
        )

    async def dead_letter_message(
        self,
        message: ServiceBusReceivedMessage,
        reason: str | None = None,
        error_description: str | None = None,
        properties_to_modify: dict[str, Any] | None = None,
        *,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        """Move the message to the dead-letter sub-queue with ``reason``/``error_description``."""
        await self._settle_or_join(
            message,
            SettleOp(
                DEAD_LETTER,
                lock_token_of(message),
                properties_to_modify,
                reason,
                error_description,
            ),
            transaction,
        )

    async def complete_messages(self, messages: Sequence[ServiceBusReceivedMessage]) -> None:
        """Complete many messages in one broker call per partition, waiting for the answer.

        Raises ``SettlementFailedError`` listing the messages the broker refused; the others
        are completed. The list also names the messages of earlier settlements sent without
        waiting that the broker refused (they were not settled and will come again); this
        call's own are sent all the same. A raybus extension.
        """
        await self._answered_pending()
        by_partition = _complete.plan(self, messages)  # raises before anything is sent
        earlier = self._take_failures()
        failures: _complete.Failures = []

        async def settle(pid: int, items: _complete.Items) -> None:
            ops = _complete.wire(items)
            try:
                entity, actor, _ = await self._actor(pid)
                if pid == 0:  # it may refill the prefetch buffer (``raybus.aio._prefetch``)
                    results = await self._settle_refilling(entity, actor, ops)
                else:
                    results = await _rpc.call(entity, actor.settle, ops)
            except BaseException as exc:
                results = exc
            _complete.apply_results(items, results, failures)

        # One call per partition, all at once.
        await asyncio.gather(*(settle(pid, items) for pid, items in by_partition.items()))
        _complete.raise_failures(self.entity_path, failures, len(messages), earlier)

    async def renew_message_lock(
        self,
        message: ServiceBusReceivedMessage,
        *,
        timeout: Any = None,
        transaction: ServiceBusTransaction | None = None,
    ) -> datetime | None:
        """Extend the message's lock by the queue's lock duration; returns the new expiry.
        With ``transaction`` the renewal happens at its commit (and returns None now)."""
        await self._settle_pending()
        if transaction is not None:
            self._settle_op(message, SettleOp(COMPLETE, lock_token_of(message)))
            if self.session is not None:
                raise InvalidArgumentError(
                    "a session's messages are locked by the session: renew the session lock",
                    self.entity_path,
                    "message",
                )
            route = await self._conn.route(self.entity_path)
            await transaction.add_renew(route, message)
            return None
        return await self._renew(message, timeout)

    async def _renew(self, message: ServiceBusReceivedMessage, timeout: Any = None) -> datetime:
        """Renew without reporting other messages' refused settlements (for the renewer)."""
        if self.session is not None:
            raise InvalidArgumentError(
                "a session's messages are locked by the session: renew the session lock "
                "(receiver.session.renew_lock()) instead",
                self.entity_path,
                "message",
            )
        self._settle_op(message, SettleOp(COMPLETE, lock_token_of(message)))
        (result,) = await self._call(
            "renew_locks", [message.lock_token], partition=message.partition_id, timeout=timeout
        )
        if isinstance(result, ServiceBusError):
            raise result
        message._record.locked_until = result
        expiry = from_timestamp(result)
        assert expiry is not None
        return expiry

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Release prefetched messages at once, wait for pending settlements, and raise
        ``SettlementFailedError`` if the broker refused any of them.

        A prefetch refill under way (``complete_messages`` on another task or thread) is
        waited for first, up to 30 s, so that its messages are released with the rest
        (``raybus.aio._prefetch``). A ``receive_messages`` waiting at the broker is not
        waited for: peek-lock, it gives back what its answer brings and returns ``[]``;
        receive-and-delete, it returns what the broker deleted for it (see the module
        docstring). A session receiver releases its session: its unsettled messages come
        again at once, none counted. Receiving after close() raises ``InvalidArgumentError``.
        """
        if self._closed:
            return
        buffered = await self._close_buffer()
        await self._release(m._record for m in buffered)
        # Receives still out at partitions (the standing request, another task's receive)
        # would take what arrives for this closed receiver: end them, and wait (briefly) for
        # the standing request, which gives back what it brings.
        if self._waits:
            await self._end_waits()
        self._standing_waits.cancel()  # they lock nothing; cancelled so as not to linger
        standing = self._standing
        if standing is not None and not standing.done():
            await asyncio.wait([standing], timeout=_END_WAIT_S)
        await self._send_handed()
        if self.session is not None:
            await self.session.release()
        self._closed = True
        self._raise_failures()

    async def __aenter__(self) -> ServiceBusReceiver:
        if self.session is not None:  # accept now, so receiver.session.session_id is known
            await self.session.ensure()
            if self._renewer is not None:
                self._renewer.register(self, self.session)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
