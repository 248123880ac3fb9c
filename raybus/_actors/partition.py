"""The Ray actor that owns one queue partition: a thin asyncio shell around ``Partition``.

The actor is the only thing that mutates its partition. It adds what the pure core cannot do:
receivers that wait without polling (an ``asyncio.Event`` is swapped whenever messages may have
become available, and waiters also wake at the core's next deadline), batched entry points that
apply many callers' requests in one call, and the idle timer for ``auto_delete_on_idle``.

Every method runs to completion without awaiting between reading and changing the core, so the
asyncio concurrency of the actor never interleaves two operations on the same state.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import ray

from .. import _failpoints
from .._clock import SystemClock
from .._core import migration, transactions
from .._core.access import ANY, INTERNAL
from .._core.committer import Committer
from .._core.ended_waits import EndedWaits
from .._core.partition import Partition, PartitionCounts, SettleOp, makes_available
from .._core.record import SCHEDULED, MessageRecord, WireRecord, from_wire, to_wire
from .._core.registry import partition_storage_dirs
from .._core.wait_lines import WaitLines
from .._core.wire import join_groups, split_rows, unpack_rows
from .._metrics import EXPORT_INTERVAL_S, PartitionMetrics
from .._models import EXPRESS_FLUSH_INTERVAL, QueueProperties
from .._storage import DurableLog, StorageCorruptedError, StorageUnavailableError
from ..auth import AccessRights
from ..exceptions import MessageNotFoundError, MessagesMovedError, ServiceBusError
from .access import BROKER_ACTOR_OPTIONS, Guarded, guarded, internal, named_actor
from .self_call import call_self_until_answered

__all__ = ["PartitionActor"]

_T = TypeVar("_T")

# A partition whose log is damaged reads it again when called this long after the last try.
BROKEN_RETRY_S = 5.0
SEND, LISTEN, MANAGE = AccessRights.SEND, AccessRights.LISTEN, AccessRights.MANAGE
_log = logging.getLogger("raybus.partition")

# A transaction prepared here this long without a decision is asked about.
TXN_INQUIRY_S = 2.0

# ``locate`` waits this long at most for a move carrying a message asked for (the move's
# ``adopt`` takes milliseconds; a target restarting, about a second), polling this often.
MOVE_WAIT_S = 5.0
MOVE_POLL_S = 0.01


def _in_pieces(
    rows: list[WireRecord], pieces: int
) -> list[WireRecord] | tuple[list[WireRecord], ...]:
    """A call's rows as it answers them: one list, or ``pieces`` values (``num_returns``)."""
    return tuple(split_rows(rows, pieces)) if pieces > 1 else rows


def _exit_for_restart(exc: BaseException) -> None:
    """The log can be neither written nor read: let Ray restart this actor, whose __init__
    recovers from the log once the storage answers again."""
    _log.critical("partition storage unusable (%s); exiting so Ray restarts the actor", exc)
    asyncio.get_running_loop().call_later(0.5, os._exit, 1)


def _same(record: MessageRecord) -> MessageRecord:
    return record


class PartitionActor(Guarded):
    """One partition of one queue (created by the namespace actor; see ``partition_actor``).

    With a ``storage_path`` the partition is durable: it recovers its messages from its log when
    Ray (re)starts it, and answers a changing call only once the change is in the log (group
    commit, ``raybus._core.committer``). Without one it lives in memory only.
    """

    def __init__(
        self,
        namespace: str,
        properties: QueueProperties,
        partition_id: int,
        incarnation: int,
        storage_path: str | None = None,
        owned: frozenset[int] | None = None,
    ) -> None:
        self._namespace = namespace
        self._incarnation = incarnation
        self._storage_path = storage_path
        self._forwarding: asyncio.Task[None] | None = None
        self._partition_id = partition_id
        self._flushing: asyncio.Task[None] | None = None
        self._txn_watch: asyncio.Task[None] | None = None
        self._kicked = False
        self._send_times: list[float] = []  # metric samples, drained every export
        self._wait_times: list[float] = []
        self._prepared_at: dict[str, float] = {}
        # A memory-only partition that Ray restarted has lost which slots it serves (a
        # durable one reads them from its log): it asks the namespace before serving keys.
        self._ask_slots = (
            storage_path is None and ray.get_runtime_context().was_current_actor_reconstructed
        )
        # Receives (and other calls) waiting for a message, in lines by what they wait for,
        # each change waking one per line (``raybus._core.wait_lines``).
        self._waits = WaitLines()
        # The waits ended by ``end_waits``: dropped by their receive when it returns, or
        # after END_KEEP_S if none came for them (``raybus._core.ended_waits``).
        self._ended = EndedWaits()
        self._idle_task: asyncio.Task[None] | None = None
        log = None
        if storage_path is not None:
            log = DurableLog.from_storage_path(
                storage_path,
                *partition_storage_dirs(namespace, properties.name, incarnation, partition_id),
            )

        def make_core() -> Partition:
            # Results are turned into tuples before the next await: no defensive copies.
            core = Partition(properties, SystemClock(), partition_id, export=_same)
            core.owned = owned  # the log's record of it, if any, replaces this
            return core

        def make_commit() -> Committer:
            return Committer(
                make_core,
                log,
                on_visible=self._notify,
                express_interval=EXPRESS_FLUSH_INTERVAL if properties.enable_express else None,
                on_fatal=_exit_for_restart,
            )

        self._make_commit = make_commit
        self._broken: BaseException | None = None
        self._entity = properties.name
        self._broken_checked = 0.0
        # Recovery (blocking) happens here, so a restarted actor answers with its data back.
        try:
            self._commit = make_commit()
        except StorageUnavailableError as exc:
            if not ray.get_runtime_context().was_current_actor_reconstructed:
                raise  # a new entity: its creation fails and is reported
            # A restart. Ray never restarts an actor whose __init__ raised: it would stay dead,
            # and its queue look deleted, after the storage came back. Exiting the process
            # instead makes Ray restart it (max_restarts=-1) until the storage answers.
            _log.critical(
                "cannot read the log of %s/%s (%s); exiting for a restart",
                properties.name,
                partition_id,
                exc,
            )
            os._exit(1)
        except StorageCorruptedError as exc:
            if not ray.get_runtime_context().was_current_actor_reconstructed:
                raise
            # Damage does not heal by restarting: the actor stays up and answers every call
            # with the documented error (not "entity deleted"), and reads the log again when
            # called after BROKEN_RETRY_S, so a restored file is picked up without a restart.
            _log.critical("the log of %s/%s is damaged: %s", properties.name, partition_id, exc)
            self._broken, self._broken_checked = exc, time.monotonic()
            return
        self._recovered()

    def _recovered(self) -> None:
        core = self._commit.core
        if (
            core.prepared
            or core.outbox
            or core.properties.forward_to
            or (core.properties.forward_dead_lettered_messages_to)
        ):
            # Unfinished transactions and moves, and forwarding, resume without waiting for
            # a client's call: the actor calls itself once it is constructed.
            actor = internal(ray.get_runtime_context().current_actor, self._namespace)
            call_self_until_answered(actor.ready.remote, "partition-resume")

    async def _serving(self) -> None:
        """Raise the damage while the log stays damaged (see ``__init__``); recover once it
        reads again."""
        self._raise_if_deleted()
        broken = self._broken
        if broken is None:
            return
        if time.monotonic() - self._broken_checked >= BROKEN_RETRY_S:
            self._broken_checked = time.monotonic()
            try:
                self._commit = await asyncio.to_thread(self._make_commit)
            except (StorageCorruptedError, StorageUnavailableError) as exc:
                _log.warning("the log of %s is still unreadable: %s", self._entity, exc)
                raise exc from None
            self._broken = None
            _log.warning("the log of %s reads again: serving", self._entity)
            self._recovered()
            return
        raise broken

    def _access_path(self) -> str:
        return self._entity if self._broken is not None else self._core.entity

    def _on_deleted(self) -> None:
        self._waits.notify_all()  # waiting receivers wake in ``_wait_change`` and raise
        commit: Committer | None = getattr(self, "_commit", None)  # unset: log unreadable
        if commit is not None:
            commit.stop_quiet_checkpoints()  # nothing written after the storage is deleted

    @property
    def _core(self) -> Partition:
        return self._commit.core

    def _notify(self) -> None:
        """Messages may have become available: wake the first waiter of every line (a woken
        receive that took all it asked for wakes the next, ``raybus._core.wait_lines``)."""
        self._waits.notify()

    def _settled(self, settles: Sequence[SettleOp], results: Sequence[Any]) -> None:
        """After a settlement is durable: wake the waiters if it put a message back
        (abandoned, released or dead-lettered), unless the flush that made it durable woke
        them already (a durable partition that is not express: every flush does, as for sends
        and deliveries). In memory (no flush) also for what else it changed on the way (a
        lock that expired meanwhile)."""
        if self._commit.shows_when_durable:
            return
        if makes_available(settles, results) or self._commit.durable_log is None:
            self._notify()

    @guarded(ANY)
    async def ready(self) -> int:
        """Answer once constructed; start the idle timer. Returns the partition id."""
        self._kick()
        if self._idle_task is None:
            self._idle_task = asyncio.get_running_loop().create_task(self._idle_loop())
        if self._core.outbox:  # moves this partition started before a restart
            self._flush_soon()
        if self._core.prepared:  # transactions prepared before a restart
            self._watch_transactions()
        return self._core.partition_id

    # -------------------------------------------------------------- sending

    @guarded(SEND, lane=True)
    async def send_groups(
        self, layout: list[int], *pieces: list[WireRecord]
    ) -> list[list[int] | ServiceBusError]:
        """Accept each group atomically (one caller's batch each); a result or error per group.

        Records travel as tuples (``raybus._core.record.to_wire``), as in every method here;
        the groups arrive as their lengths and their rows in pieces (``raybus._core.wire``).
        """
        groups = join_groups(layout, pieces)
        self._kick()
        started = time.perf_counter()
        if self._ask_slots:
            await self._learn_slots()
        results: list[list[int] | ServiceBusError] = []
        for group in groups:
            try:
                results.append(self._core.send(from_wire(group)))
            except ServiceBusError as exc:
                results.append(exc)
        try:
            await self._commit.durable()
        except ServiceBusError as exc:  # nothing of these groups was stored
            return [exc for _ in results]
        if not self._commit.shows_when_durable:  # else the flush woke the receivers
            self._notify()
        if len(self._send_times) < 1000:
            self._send_times.append(time.perf_counter() - started)
        return results

    @guarded(INTERNAL, lane=True)
    async def deliver(self, source: str, number: int, *pieces: bytes) -> int:
        """Store a topic router's delivery ``number`` unless applied already (at most once per
        ``source``: ``raybus._core.deliveries``); answer the room left, once durable. Raises
        ``PartitionMovedError`` (nothing stored) for a keyed copy of a slot given away."""
        _failpoints.hit("participant.before_deliver")
        self._kick()
        if self._ask_slots:
            await self._learn_slots()
        rows = unpack_rows(pieces)  # pickled once by the router for every subscription
        applied = self._core.deliver(source, number, from_wire(rows))
        # Applied before, it may still be in a flush under way: answer once that is durable.
        await self._commit.durable()
        if applied and not self._commit.shows_when_durable:  # else the flush woke them
            self._notify()
        _failpoints.hit("participant.after_deliver")
        return self._core.room()

    @guarded(INTERNAL, lane=True)
    async def room(self) -> int:
        """The bytes this partition can still take (``raybus._core.deliveries``)."""
        return self._core.room()

    @guarded(SEND, lane=True)
    async def cancel_scheduled(self, sequence_numbers: list[int]) -> None:
        """Cancel scheduled messages, all or none; ``MessagesMovedError`` if those not here
        were moved away by a partition change (see ``_or_moved``)."""
        core = self._core
        try:
            core.cancel_scheduled(sequence_numbers)
        except MessageNotFoundError as missing:
            raise await self._or_moved(core, sequence_numbers, missing, "scheduled") from None
        await self._commit.durable()

    # -------------------------------------------------------------- receiving

    def _kick(self) -> None:
        """After a restart nobody calls ``ready``: the first call resumes unfinished moves and
        transactions, and starts the metrics export."""
        if self._kicked:
            return
        self._kicked = True
        asyncio.get_running_loop().create_task(self._export_metrics())
        if self._core.outbox:
            self._flush_soon()
        if self._core.prepared:
            self._watch_transactions()
        self._forward()

    async def _settled_core(self, *, pending: bool = True) -> Partition:
        """The core after applying due time-driven changes, durably (activated messages
        become visible once durable, and the waiting receivers are woken then).
        ``pending=False`` waits for this tick's changes only (``Committer.durable_since``),
        not for other callers' changes still pending."""
        self._kick()
        core = self._core  # a failed flush may have rebuilt it
        mark = core.journal_size()
        woke = core.tick()
        try:
            if pending:
                if core.has_journal():
                    await self._commit.durable()
            else:
                await self._commit.durable_since(mark)
        finally:
            if woke:
                self._notify()
        return self._core

    async def _read_core(self) -> Partition:
        """``_settled_core`` for a read that changes nothing itself (peek, counts, session
        reads): a peek-lock receive flushes only its own tick's changes, so a scheduled
        message activated by a peek or a count stayed invisible to receivers until an
        unrelated write. A flush that fails does not fail the read (the write path reports
        the storage error)."""
        try:
            return await self._settled_core(pending=False)
        except Exception as exc:
            _log.debug("time-driven changes of a read not flushed: %r", exc)
            return self._core

    async def _wait_change(self, deadline: float, line: Hashable) -> bool | None:
        """Wait in ``line`` for a change or the core's next deadline: whether a change woke
        this call (it then owes the line a ``pass_on`` unless it finds the line's messages
        exhausted), or None once ``deadline`` has passed (no wait)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        due = self._core.next_deadline()
        if due is not None:
            remaining = min(remaining, max(0.0, due - time.time()) + 0.001)
        woken = await self._waits.wait(line, remaining)
        self._raise_if_deleted()  # deleting wakes every waiter: none owes a wake then
        return woken

    async def _look_or_wait(
        self, wait_s: float, line: Hashable, look: Callable[[Partition], _T | None]
    ) -> _T | None:
        """``look`` at the settled core until it finds something (returned) or ``wait_s``
        has passed (None), waiting in ``line`` between looks. A call a change woke that
        finds something wakes the next in line (there may be more, or, for a look that
        takes nothing, the same for them); one that finds nothing does not."""
        deadline = time.monotonic() + wait_s
        woken: bool | None = False
        try:
            while True:
                found = look(await self._settled_core())
                if found is not None:
                    return found
                woken = False  # nothing: the next in line would find nothing either
                woken = await self._wait_change(deadline, line)
                if woken is None:
                    return None
        finally:
            if woken:
                self._waits.pass_on(line)

    def _sample_wait(self, got: Sequence[MessageRecord]) -> None:
        """One metric sample per receiving call: how long its first message waited."""
        if got and len(self._wait_times) < 1000:
            self._wait_times.append(max(0.0, time.time() - got[0].enqueued_time))

    @guarded(LISTEN, lane=True)
    async def receive(
        self,
        max_count: int,
        wait_s: float,
        dead_letter: bool,
        delete: bool,
        session: tuple[str, str] | None = None,
        pieces: int = 1,
        waiter: str | None = None,
    ) -> list[WireRecord] | tuple[list[WireRecord], ...]:
        """Up to ``max_count`` messages (of the accepted ``session``, on a session-enabled
        queue); waits up to ``wait_s`` for the first one. With ``pieces`` > 1 the caller
        asked for that many return values (``num_returns``): the rows in pieces
        (``raybus._core.wire``).

        Returns as soon as any message is available (never polls): senders, settlements and
        the core's deadlines (scheduled activations, lock expiries) wake the waiters.
        ``waiter`` names this receive for ``end_waits``, which makes it return no messages
        at once if it has taken none yet.
        """
        deadline = time.monotonic() + wait_s
        # Peek-lock receives of the main queue wait for their own changes only; the
        # dead-letter sub-queue shows messages moved there whose move may not be durable yet.
        own = not (delete or dead_letter)
        line = (dead_letter, session[0] if session is not None else None)
        owes = False  # woken by a change and not seen the line's messages exhausted
        try:
            while True:
                core = await self._settled_core(pending=not own)
                if waiter is not None and waiter in self._ended:
                    return _in_pieces([], pieces)  # its receiver stopped waiting: take nothing
                mark = core.journal_size()
                got = core.receive(
                    max_count, dead_letter=dead_letter, delete=delete, session=session
                )
                if len(got) < max_count:
                    owes = False  # took all there was: nothing left for the next in line
                if got or deadline <= time.monotonic():
                    if got:  # its receiver waits for its settlements' answers next
                        self._commit.hurry()
                    self._sample_wait(got)
                    rows = to_wire(got)
                    # Deletions, expiries, activations; locks alone need no write.
                    if own:
                        await self._commit.durable_since(mark)
                    else:
                        await self._commit.durable(after_inflight=delete)
                    return _in_pieces(rows, pieces)
                owes = bool(await self._wait_change(deadline, line))
        finally:
            if owes:
                self._waits.pass_on(line)
            if waiter is not None:
                self._ended.drop(waiter)

    @guarded(LISTEN, lane=True)
    async def end_waits(self, waiters: list[str]) -> None:
        """End the waits of the receives named ``waiters`` (``receive``'s ``waiter``): each
        returns no messages at once, unless it took some already (it returns those).

        For a receiver that stops waiting while its receive is still out here: ``close()``
        and a receive its caller cancelled. Left out, the receive would take the next
        message for nobody: locked until its lock expired (a delivery counted), or, in
        receive-and-delete mode, deleted. An end that arrives before its receive (or after
        it) is kept ``END_KEEP_S`` and then forgotten (``raybus._core.ended_waits``)."""
        self._ended.end(waiters)
        self._waits.notify_all()  # the waiters look again, the ended ones return

    @guarded(LISTEN, lane=True)
    async def wait_available(self, wait_s: float, dead_letter: bool) -> bool:
        """Whether a message (or, on a session-enabled queue, a session to accept) became
        available within ``wait_s``. Locks nothing: a receiver of a partitioned queue waits
        on every partition at once and then receives from the first that answers."""
        found = await self._look_or_wait(
            wait_s,
            ("available", dead_letter),
            lambda core: True if core.has_available(dead_letter=dead_letter) else None,
        )
        return found is not None

    @guarded(LISTEN, lane=True)
    async def receive_deferred(
        self,
        sequence_numbers: list[int],
        delete: bool,
        session: tuple[str, str] | None = None,
        pieces: int = 1,
        dead_letter: bool = False,
    ) -> list[WireRecord] | tuple[list[WireRecord], ...]:
        """The deferred messages ``sequence_numbers`` (all or none) of the main store or
        (``dead_letter``) the dead-letter sub-queue, in ``pieces`` values as ``receive``
        returns them; ``MessagesMovedError`` if those not here were moved away by a partition
        change (see ``_or_moved``)."""
        core = self._core
        try:
            rows = to_wire(
                core.receive_deferred(
                    sequence_numbers, delete=delete, session=session, dead_letter=dead_letter
                )
            )
        except MessageNotFoundError as missing:
            raise await self._or_moved(core, sequence_numbers, missing, "deferred") from None
        finally:  # expired deferred messages were removed even when this raises
            await self._commit.durable()
        return _in_pieces(rows, pieces)

    @guarded(LISTEN, lane=True)
    async def delete_messages(
        self,
        max_count: int,
        before: float,
        dead_letter: bool,
        session: tuple[str, str] | None = None,
    ) -> int:
        """Delete up to ``max_count`` messages enqueued before ``before`` (epoch seconds)
        without receiving them (``Partition.delete_messages``); answers how many, once
        durable."""
        self._kick()
        deleted = self._core.delete_messages(
            max_count, before, dead_letter=dead_letter, session=session
        )
        await self._commit.durable()
        return deleted

    @guarded(LISTEN, lane=True)
    async def peek(
        self,
        from_sequence_number: int,
        max_count: int,
        dead_letter: bool,
        session_id: str | None = None,
        pieces: int = 1,
        quiet: bool = False,
    ) -> list[WireRecord] | tuple[Any, ...]:
        """Up to ``max_count`` messages from ``from_sequence_number`` on, locking nothing, in
        ``pieces`` values as ``receive`` returns them (a peek of 100 messages of 1 KiB is
        over what Ray carries inside the call).

        With ``quiet``, one value more, last: the seconds since a partition change last moved
        messages out of here, 0 while some travel (``migration.quiet_for``), read with the
        peek in one step of the loop. Messages on their way out are in no partition's peek,
        so the source's word is what tells ``peek_partitioned`` to peek again."""
        core = await self._read_core()
        peeked = core.peek(
            from_sequence_number, max_count, dead_letter=dead_letter, session_id=session_id
        )
        rows = to_wire(peeked)
        if not quiet:
            return _in_pieces(rows, pieces)
        return (*split_rows(rows, pieces), migration.quiet_for(core))

    # -------------------------------------------------------------- sessions

    @guarded(LISTEN, lane=True)
    async def accept_session(self, session_id: str) -> tuple[str, float]:
        if self._ask_slots:
            await self._learn_slots()
        core = await self._settled_core()
        return core.accept_session(session_id)

    @guarded(LISTEN, lane=True)
    async def accept_next_session(self, wait_s: float) -> tuple[str, str, float] | None:
        """Lock the next available session, waiting up to ``wait_s`` for one."""
        return await self._look_or_wait(wait_s, ("accept",), Partition.accept_next_session)

    @guarded(LISTEN, lane=True)
    async def renew_session_lock(self, session_id: str, token: str) -> float:
        return self._core.renew_session_lock(session_id, token)

    @guarded(LISTEN, lane=True)
    async def release_session(self, session_id: str, token: str) -> bool:
        released = self._core.release_session(session_id, token)
        await self._commit.durable()  # messages may have been dead-lettered or expired
        self._notify()
        return released

    @guarded(LISTEN, lane=True)
    async def get_session_state(self, session_id: str, token: str) -> bytes | None:
        return (await self._read_core()).get_session_state(session_id, token)

    @guarded(LISTEN, lane=True)
    async def set_session_state(self, session_id: str, token: str, state: bytes | None) -> None:
        self._core.set_session_state(session_id, token, state)
        await self._commit.durable()

    @guarded(LISTEN)
    async def list_sessions(self, updated_after: float | None) -> list[str]:
        return (await self._read_core()).list_sessions(updated_after)

    # -------------------------------------------------------------- settling

    @guarded(LISTEN, lane=True)
    async def settle(
        self, ops: Sequence[tuple[Any, ...]], waited: bool = True
    ) -> list[ServiceBusError | None]:
        """Settle ``ops``; answer once durable. ``waited=False``: the client does not wait for
        this answer, so its flush may wait a moment for a call that is waited on to share it
        (``raybus._core.committer``, "Callers nobody waits on linger")."""
        self._kick()
        settles = [SettleOp(*op) for op in ops]
        results = self._core.settle(settles)
        # raises the storage error for the whole call
        await self._commit.durable(lazy=not waited)
        self._settled(settles, results)
        return results

    @guarded(LISTEN, lane=True)
    async def settle_receive(
        self, ops: Sequence[tuple[Any, ...]], max_count: int, dead_letter: bool, pieces: int = 1
    ) -> tuple[Any, ...]:
        """``settle(ops)``, then a peek-lock receive of up to ``max_count`` messages available
        now (no waiting), in one call: a prefetching receiver refills its buffer with the call
        that completes what it processed, instead of a receive call of its own. Each half
        behaves as its own call would; the answer waits until both are durable. Returns the
        settle results, then the rows in ``pieces`` values (``num_returns`` is pieces + 1).
        """
        self._kick()
        self._core.receive_source(dead_letter)  # refused before settling: it changes nothing
        settles = [SettleOp(*op) for op in ops]
        results = self._core.settle(settles)
        core = await self._settled_core(pending=dead_letter)
        got = core.receive(max_count, dead_letter=dead_letter, delete=False)
        self._sample_wait(got)
        rows = to_wire(got)
        await self._commit.durable()  # raises the storage error for the whole call
        self._settled(settles, results)
        return (results, *split_rows(rows, pieces))

    @guarded(LISTEN, lane=True)
    async def lock_expiries(self, lock_tokens: Sequence[str]) -> list[float | ServiceBusError]:
        return self._core.lock_expiries(lock_tokens)

    @guarded(LISTEN, lane=True)
    async def renew_locks(self, lock_tokens: Sequence[str]) -> list[float | ServiceBusError]:
        return self._core.renew_locks(lock_tokens)

    # -------------------------------------------------------------- management

    @guarded(INTERNAL)
    async def update_properties(self, properties: QueueProperties) -> None:
        self._core.update_properties(properties)
        await self._commit.durable()
        self._waits.notify_all()  # a status change may allow receiving again
        self._forward()

    def _forward(self) -> None:
        """Run the forwarding loop while the entity forwards (``raybus._actors.forwarder``)."""
        props = self._core.properties
        if not props.forward_to and not props.forward_dead_lettered_messages_to:
            return
        if self._forwarding is None or self._forwarding.done():
            from .forwarder import Forwarder

            loop = asyncio.get_running_loop()
            self._forwarding = loop.create_task(Forwarder(self).run())

    @guarded(ANY)
    async def counts(self) -> PartitionCounts:
        return (await self._read_core()).counts()

    def _totals(self) -> dict[str, float]:
        totals: dict[str, float] = dict(self._core.stats)
        totals["flushes"] = self._commit.flushes
        totals["inline_flushes"] = self._commit.inline_flushes
        totals["wakes"] = self._waits.wakes
        totals["waiting"] = self._waits.waiting()
        return totals

    @guarded(MANAGE)
    async def stats(self) -> dict[str, float]:
        """Running totals of this partition (what the metrics export): messages sent,
        delivered, completed, dead-lettered, deleted unreceived (batch delete), lock expiries,
        redeliveries, flushes (and of
        those, the ones written on the event loop's thread: ``raybus._core.committer``), and
        ``wakes``: waiting calls woken by a change (``raybus._core.wait_lines``); and, not a
        total, ``waiting``: how many calls wait now."""
        return self._totals()

    async def _export_metrics(self) -> None:
        metrics = PartitionMetrics(self._namespace, self._core.entity, self._partition_id)
        while True:
            await asyncio.sleep(EXPORT_INTERVAL_S)
            core = self._core
            c = core.counts()
            flush_times, self._commit.flush_times = self._commit.flush_times, []
            samples = {
                "flush_seconds": flush_times,
                "send_seconds": self._send_times,
                "receive_wait_seconds": self._wait_times,
            }
            self._send_times, self._wait_times = [], []
            gauges = {
                "active": c.active,
                "dead_letter": c.dead_letter,
                "scheduled": c.scheduled,
                "size_bytes": c.size_in_bytes,
            }
            metrics.export(self._totals(), gauges, samples)

    # -------------------------------------------------------------- transactions

    @guarded(INTERNAL)
    async def txn_prepare(
        self,
        txn_id: str,
        sends: list[WireRecord],
        ops: list[tuple[Any, ...]],
        renews: list[str],
    ) -> None:
        """Hold this partition's share of a transaction, durably (raises if it cannot)."""
        _failpoints.hit("participant.before_prepare")
        if self._ask_slots and sends:
            await self._learn_slots()
        transactions.prepare(
            self._core, txn_id, from_wire(sends), [SettleOp(*op) for op in ops], renews
        )
        await self._commit.durable(force=True)  # even on an express partition
        self._prepared_at[txn_id] = time.monotonic()
        self._watch_transactions()
        _failpoints.hit("participant.after_prepare")

    @guarded(INTERNAL)
    async def txn_commit(self, txn_id: str) -> bool:
        _failpoints.hit("participant.before_commit")
        applied = transactions.commit(self._core, txn_id)
        await self._commit.durable(force=True)
        self._prepared_at.pop(txn_id, None)
        self._notify()
        _failpoints.hit("participant.after_commit")
        return applied

    @guarded(INTERNAL)
    async def txn_abort(self, txn_id: str) -> bool:
        aborted = transactions.abort(self._core, txn_id)
        await self._commit.durable(force=True)
        self._prepared_at.pop(txn_id, None)
        return aborted

    def _watch_transactions(self) -> None:
        if self._txn_watch is None or self._txn_watch.done():
            self._txn_watch = asyncio.get_running_loop().create_task(self._resolve_prepared())

    async def _resolve_prepared(self) -> None:
        """Ask the coordinator about transactions prepared here long ago (the coordinator or
        this actor restarted in between): commit or abort them as it says."""
        from .coordinator import coordinator_actor_name

        while self._core.prepared:
            await asyncio.sleep(TXN_INQUIRY_S)
            now = time.monotonic()
            for txn_id in list(self._core.prepared):
                if now - self._prepared_at.setdefault(txn_id, now) < TXN_INQUIRY_S:
                    continue
                try:
                    coordinator = await named_actor(coordinator_actor_name(self._namespace))
                    outcome = await internal(coordinator, self._namespace).outcome.remote(txn_id)
                except Exception as exc:  # restarting: ask again later
                    _log.info("outcome of transaction %s unknown yet: %s", txn_id, exc)
                    continue
                if outcome == "commit":
                    await self.txn_commit(txn_id)
                elif outcome == "abort":
                    await self.txn_abort(txn_id)

    @guarded(LISTEN)
    async def locate(
        self, sequence_numbers: list[int], state: int | None = None, dead_letter: bool = False
    ) -> tuple[list[int], dict[int, int]]:
        """Which of these messages this partition holds (in ``state``, when given; in the
        dead-letter sub-queue with ``dead_letter``), and the
        partition each deferred or scheduled one of the others went to, if a partition change
        moved it from here (``migration.moved``).

        A move still on its way is waited for (up to ``MOVE_WAIT_S``), so that its target
        holds the message when this answers. A client asks every partition at once: before
        this, a message between source and target was found nowhere, and
        ``receive_deferred_messages`` raised ``MessageNotFoundError`` for 1 or 2 of 200
        deferred messages in every scale-down from 4 partitions to 1. A move that does not
        arrive in time leaves its messages out (not found, as before)."""
        return await self._locate(sequence_numbers, state, dead_letter)

    @guarded(SEND)
    async def locate_scheduled(
        self, sequence_numbers: list[int]
    ) -> tuple[list[int], dict[int, int]]:
        """``locate`` of scheduled messages, for a sender's ``cancel_scheduled_messages``:
        under the Send right, as cancelling is (a Send-only token, which Service Bus lets
        cancel, was refused by ``locate``'s Listen)."""
        return await self._locate(sequence_numbers, SCHEDULED, False)

    async def _locate(
        self, sequence_numbers: list[int], state: int | None, dead_letter: bool
    ) -> tuple[list[int], dict[int, int]]:
        core = self._core
        core.tick()
        held = core.locate(sequence_numbers, state, dead_letter=dead_letter)
        if len(held) == len(sequence_numbers):
            return held, {}
        kept = set(held)
        return held, await self._moved_to(core, [s for s in sequence_numbers if s not in kept])

    async def _moved_to(self, core: Partition, sequence_numbers: list[int]) -> dict[int, int]:
        """The partition each of these deferred or scheduled messages went to, for those a
        partition change moved from here (``migration.moved``). A move still on its way is
        waited for (up to ``MOVE_WAIT_S``) so that its target holds the message when this
        answers; one that does not arrive in time leaves its messages out."""
        if not (core.outbox or core.moved_out):
            return {}
        where = migration.moved(core, sequence_numbers)
        travelling = {move_id for _target, move_id in where.values() if move_id is not None}
        if travelling:  # wait for those moves to leave the outbox, then ask once more
            deadline = time.monotonic() + MOVE_WAIT_S
            while travelling & core.outbox.keys() and time.monotonic() < deadline:
                await asyncio.sleep(MOVE_POLL_S)
            where = migration.moved(core, sequence_numbers)
        return {s: t for s, (t, move_id) in where.items() if move_id is None}

    async def _or_moved(
        self, core: Partition, asked: list[int], missing: MessageNotFoundError, what: str
    ) -> MessageNotFoundError:
        """What a receive or cancel by number raises when some of ``asked`` are not here:
        ``MessagesMovedError`` naming where each went, when a partition change moved every
        one of them away (the client calls those partitions on: ``Connection.follow_moves``);
        when it moved only some, a ``MessageNotFoundError`` naming the ``what`` (deferred,
        scheduled) messages that are nowhere; else ``missing`` itself. A client locates the
        numbers first (``locate``), but a move may take a message between that answer and
        this call."""
        gone = set(missing.sequence_numbers)
        lost = [s for s in dict.fromkeys(asked) if core.resolve(s) in gone]
        moved = await self._moved_to(core, lost)
        if not moved:
            return missing
        if len(moved) == len(lost):
            return MessagesMovedError(
                f"sequence number(s) {lost} moved to other partitions by a partition change",
                missing.entity,
                lost,
                moved,
            )
        # Some moved, some not anywhere: the call fails (all or none), naming those alone.
        absent = [s for s in lost if s not in moved]
        return MessageNotFoundError(
            f"no {what} message is available with sequence number(s) {absent}",
            missing.entity,
            absent,
        )

    # -------------------------------------------------------------- partition changes

    @guarded(INTERNAL)
    async def hand_over(
        self, moves: dict[int, frozenset[int]], spill: int | None
    ) -> tuple[dict[int, frozenset[int]], frozenset[int], bool, bool]:
        """Move slots to other partitions (see ``raybus._core.migration``).

        Returns (slots each target now serves, pinned slots kept here, whether this retiring
        partition is now empty and may stop, whether it stopped spilling at a bundle's bound
        and has more to spill at once). A target that fails keeps its bundle in this
        partition's outbox; ``flush_outbox`` (or the next call) sends it again.
        """
        out, _pinned = migration.hand_over(self._core, moves, spill)
        more = any(bundle.bounded for _target, bundle in out.values())
        await self._commit.durable()  # removed here and kept in the outbox, durably
        adopted = await self._flush_outbox()
        done: dict[int, frozenset[int]] = {}
        for target, slots in adopted:
            done[target] = done.get(target, frozenset()) | slots
        pinned = frozenset(s for slots in moves.values() for s in slots) - frozenset(
            s for slots in done.values() for s in slots
        )
        empty = migration.is_empty(self._core) and spill is not None
        # Not at once while a bundle waits for its target: the retry of the outbox comes first.
        return done, pinned, empty, more and not self._core.outbox

    @guarded(INTERNAL)
    async def flush_outbox(self) -> list[tuple[int, frozenset[int]]]:
        return await self._flush_outbox()

    async def _flush_outbox(self) -> list[tuple[int, frozenset[int]]]:
        """Send every pending move to its target; (target, slots) of those applied."""
        from .._core.registry import partition_actor_name

        applied: list[tuple[int, frozenset[int]]] = []
        for move_id, (target, bundle) in list(self._core.outbox.items()):
            name = partition_actor_name(
                self._namespace, self._core.entity, self._incarnation, target
            )
            try:
                handle = await named_actor(name)
                await internal(handle, self._namespace).adopt.remote(move_id, bundle)
            except Exception as exc:  # the target is restarting: try again later
                _log.warning("move %s to partition %s failed: %s", move_id, target, exc)
                self._flush_soon(2.0)
                continue
            migration.finish(self._core, move_id)
            applied.append((target, bundle.slots))
        await self._commit.durable()
        return applied

    def _flush_soon(self, delay: float = 0.0) -> None:
        if self._flushing is not None and not self._flushing.done():
            return

        async def later() -> None:
            await asyncio.sleep(delay)
            await self._flush_outbox()

        self._flushing = asyncio.get_running_loop().create_task(later())

    @guarded(INTERNAL)
    async def adopt(self, move_id: str, bundle: migration.Bundle) -> bool:
        """Take over a moved-in bundle, durably and at most once."""
        applied = migration.adopt(self._core, move_id, bundle)
        await self._commit.durable()
        self._notify()
        return applied

    @guarded(INTERNAL)
    async def slots(self) -> tuple[frozenset[int] | None, bool]:
        return self._core.owned, self._core.retiring

    async def _learn_slots(self) -> None:
        from .namespace import namespace_actor_name

        registry = await named_actor(namespace_actor_name(self._namespace))
        pmap = await internal(registry, self._namespace).partition_map.remote(
            self._core.entity, self._incarnation
        )
        if pmap is not None:
            self._core.owned = pmap.owned_by(self._partition_id)
            self._core.retiring = self._partition_id in pmap.retiring
        self._ask_slots = False

    async def _idle_loop(self) -> None:
        """Ask the namespace to delete the queue once it has been idle long enough."""
        while True:
            due = self._core.idle_deadline()
            if due == float("inf"):
                await asyncio.sleep(60)
                continue
            wait = due - time.time()
            if wait > 0:
                await asyncio.sleep(min(wait, 60))
                continue
            try:
                from .namespace import namespace_actor_name

                registry = await named_actor(namespace_actor_name(self._namespace))
                await internal(registry, self._namespace).delete_idle_queue.remote(
                    self._core.entity, self._incarnation, self._core.accessed_at
                )
            except Exception:  # the registry may be restarting; try again later
                _log.warning("auto-delete of idle queue %s failed", self._core.entity)
            await asyncio.sleep(5)


def partition_actor(
    name: str,
    namespace: str,
    properties: QueueProperties,
    partition_id: int,
    incarnation: int,
    storage_path: str | None,
    owned: frozenset[int] | None = None,
) -> Any:
    """Create (or find) a named, detached partition actor serving ``owned`` slots (None:
    all of them)."""
    cls = ray.remote(PartitionActor)
    return cls.options(
        name=name,
        max_concurrency=10_000,
        # Partitions of one entity go to different nodes where there are several.
        scheduling_strategy="SPREAD",
        **BROKER_ACTOR_OPTIONS,
    ).remote(namespace, properties, partition_id, incarnation, storage_path, owned)
