"""One queue partition's state machine: messages, locks, schedules, TTL, dead-letters, dedup.

``Partition`` is plain Python with an injected clock; ``raybus._actors.partition`` wraps it in
a Ray actor (the only place allowed to mutate it) and adds waiting. Every method is a complete,
synchronous step: it validates everything first and changes nothing when it raises, so a
rejected send stores nothing and a refused settlement leaves the message where it was.

Time is handled lazily: every public method first calls ``tick()``, which activates due
scheduled messages, releases expired locks (delivery count + 1, dead-lettering past the
maximum), expires messages past their time to live and forgets old duplicate-detection ids.
``next_deadline()`` tells the actor when the next of those is due so waiting receivers wake.

Guarantees:

* Sequence numbers increase by one per accepted message (gap-free) within a partition; the
  partition id sits in the top 16 bits. A scheduled message gets a new number when it turns
  active, as in Service Bus.
* At most one valid lock exists per message; a lock token settles at most once.
* A batch is all-or-nothing: size, quota and status are checked for the whole batch before any
  message is stored.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._clock import Clock
from .._models import QueueProperties
from .._topic_models import is_subscription
from ..exceptions import (
    InvalidArgumentError,
    MessageLockLostError,
    MessageNotFoundError,
    MessagingEntityDisabledError,
    PartitionMovedError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
)
from . import journal
from .deliveries import DeliveryOps
from .partition_sessions import SessionOps
from .partition_snapshots import SnapshotOps
from .record import (
    ACTIVE,
    DEFERRED,
    SCHEDULED,
    SESSION_ID_IS_NULL,
    MessageRecord,
    active_expiry,
    check_application_properties,
    check_settled_header,
    snapshot,
    stamp_accepted,
    to_wire,
)
from .sendable import check_sendable
from .sessions import SessionTable
from .slots import DedupId, dedup_id, dedup_slot, partition_key, slot_of
from .store import LockTokens, PartitionCounts, SettleOp, Store

__all__ = [
    "ABANDON",
    "COMPLETE",
    "DEAD_LETTER",
    "DEFER",
    "RELEASE",
    "SESSION_ID_IS_NULL",
    "Partition",
    "PartitionCounts",
    "SettleOp",
    "makes_available",
]

COMPLETE, ABANDON, DEAD_LETTER, DEFER, RELEASE = (
    "complete",
    "abandon",
    "dead_letter",
    "defer",
    "release",
)
_SETTLE_KINDS = frozenset((COMPLETE, ABANDON, DEAD_LETTER, DEFER, RELEASE))
# Settlements after which a waiting receiver may find a message it could not before: the
# message is back in its queue (abandon, release) or new in the dead-letter sub-queue.
_FREEING_KINDS = frozenset((ABANDON, DEAD_LETTER, RELEASE))


def makes_available(ops: Sequence[SettleOp], results: Sequence[ServiceBusError | None]) -> bool:
    """Whether ``Partition.settle(ops)``, answered with ``results``, may have given a waiting
    receiver something to take: an abandon, release or dead-letter that succeeded. A
    completion or deferral only takes a message out of reach, and a refused op changes
    nothing, so a waiting receiver need not wake to find nothing. What else the call changed
    on the way (a lock that expired meanwhile) is not counted here: the partition announces
    it after the call's flush (``raybus._core.committer``, ``on_visible``)."""
    return any(
        result is None and op.kind in _FREEING_KINDS
        for op, result in zip(ops, results, strict=True)
    )


MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"
TTL_EXPIRED = "TTLExpiredException"
SEQUENCE_BITS = 48  # the partition id lives above these
HEAP_SLACK = 1024  # entries a deadline heap may hold beyond twice its last compaction's


def _compacted(heap: list[Any], keep: Callable[[Any], bool]) -> int:
    """Drop the entries of deadline heap ``heap`` that ``keep`` rejects (in place; a heap
    again) and return the length past which it is compacted next.

    Why: ``tick`` skips an entry whose lock ended, whose message is gone or whose session lock
    was released only when its time comes, and until then it stays: a settled lock for its
    lock duration (60 s by default), a completed message's expiry for days, a session lock
    accepted and released for its lock duration. A busy queue (30,000 messages a second) held
    millions of them, and its receives got slower as the heap grew: 100 messages received,
    locked and completed took 2.4-5.0 us a message against 1.2 with the heap compacted
    (``Partition`` alone, 20,000-100,000 stale entries). ``keep`` keeps exactly what ``tick``
    may still act on. A heap is rebuilt once it holds more than twice what its last rebuild
    kept, plus ``HEAP_SLACK``: at most one rebuild per that many entries pushed."""
    live = [e for e in heap if keep(e)]
    heapq.heapify(live)
    heap[:] = live
    return 2 * len(live) + HEAP_SLACK


class Partition(SessionOps, SnapshotOps, DeliveryOps):
    """The state of one partition of a queue (main queue and dead-letter sub-queue)."""

    def __init__(
        self,
        properties: QueueProperties,
        clock: Clock,
        partition_id: int = 0,
        *,
        export: Callable[[MessageRecord], MessageRecord] = snapshot,
    ) -> None:
        """``export`` makes the copy of a locked record that ``receive`` returns; an owner that
        serialises the result at once (the actor) passes the identity to skip the copy."""
        if not 0 <= partition_id < 2**16:
            raise InvalidArgumentError(f"partition id {partition_id} out of range", None, "id")
        self._clock = clock
        self._export = export
        self.partition_id = partition_id
        self._next_seq = (partition_id << SEQUENCE_BITS) + 1
        self._props = properties
        self.entity = properties.name
        self._main = Store(properties.name, journal.MAIN)
        self._dlq = Store(f"{properties.name}/$DeadLetterQueue", journal.SUB_DLQ)
        self._locks: dict[str, tuple[Store, int]] = {}
        self._lock_heap: list[tuple[float, str]] = []
        self._schedule_heap: list[tuple[float, int]] = []
        self._ttl_heap: list[tuple[float, int]] = []
        # Lengths past which the lock, expiry and session-lock heaps are rid of the entries
        # of settled locks, gone messages and released sessions (``_compacted``).
        self._heap_limits = [HEAP_SLACK, HEAP_SLACK, HEAP_SLACK]
        # dedup_id -> (accepted at, seq)
        self._dedup: dict[DedupId, tuple[float, int]] = {}
        self._scheduled_count = 0
        self._size = 0
        self._tokens = LockTokens()
        # Session-enabled queues serve their main store through per-session queues.
        self._sessions = SessionTable() if properties.requires_session else None
        # Partitioned entities (raybus._core.slots): the slots whose keys this partition
        # serves (None: all), and whether it is being removed (it then takes no unkeyed
        # messages). Changed only by raybus._core.migration.
        self.owned: frozenset[int] | None = None
        self.retiring = False
        self._aliases: dict[int, int] = {}  # moved-in messages: old sequence number -> new
        self._adopted: set[str] = set()  # ids of moves applied here
        self._dedup_slots: dict[DedupId, int] = {}  # dedup_id -> slot, on partitioned entities
        self.outbox: dict[str, tuple[int, Any]] = {}  # moves not yet applied by their target
        # Deferred and scheduled messages whose move finished: number here -> (target, when),
        # oldest first, for ``migration.moved`` (in memory only; kept MOVED_OUT_KEEP_S).
        self.moved_out: dict[int, tuple[int, float]] = {}
        self.last_move_end = float("-inf")  # when the last move out of here was confirmed
        # Transactions (raybus._core.transactions): prepared ones by id, the lock tokens they
        # pin (those locks neither expire nor settle outside the transaction), and the bytes
        # their sends reserve against the quota.
        self.prepared: dict[str, Any] = {}
        self.pinned: dict[str, str] = {}  # lock token -> transaction id
        self.reserved = 0
        # Per topic router (its source key), the number of the last delivery applied here
        # (raybus._core.deliveries).
        self.delivered: dict[str, int] = {}
        self.ended_transactions: dict[str, None] = {}  # recent ones (a late prepare is refused)
        # Running totals for metrics (raybus._metrics); plain ints, cheap on hot paths.
        self.stats = dict.fromkeys(
            (
                "sent",
                "delivered",
                "completed",
                "dead_lettered",
                "lock_expired",
                "redelivered",
                "deleted",
            ),
            0,
        )
        # Durable mode (see enable_journal): changes are recorded for the storage log, and
        # receivers see new messages only up to visible_seq, the last one made durable.
        self._journal: journal.Pending | None = None
        self.visible_seq: int | None = None
        # Scheduled messages turned active since the last flush: their new numbers are past
        # visible_seq, yet their content is durable (as scheduled), so peek shows them. A
        # receive waits for the flush (a lock on a number not yet logged would not survive).
        self._activated: set[int] = set()
        self.accessed_at = clock.now()
        # What counts as use for auto_delete_on_idle: for a queue every call, for a
        # subscription every call but the topic's deliveries (Service Bus deletes a
        # subscription nobody receives from or browses, however busy its topic).
        self._sends_are_use = not is_subscription(properties.name)

    # ------------------------------------------------------------------ properties

    @property
    def properties(self) -> QueueProperties:
        return self._props

    def update_properties(self, properties: QueueProperties) -> None:
        """Apply new settings. Existing locks keep their expiry; new ones use the new duration.
        An update counts as use (``auto_delete_on_idle``), as in Service Bus."""
        self._props = properties
        self._record(journal.PROPS, self._main, 0, properties)
        self.accessed_at = self._clock.now()

    # ------------------------------------------------------------------ sending

    def send(self, records: Sequence[MessageRecord], *, forced: bool = False) -> list[int]:
        """Accept a batch atomically; return each message's sequence number.

        A message whose ``message_id`` was accepted within the duplicate-detection window is
        dropped silently and reported with the sequence number of the first copy. Messages with
        a future ``scheduled_enqueue_time`` are stored as scheduled. ``forced``: a topic
        router's logged delivery (``raybus._core.deliveries``), checked against the settings
        and the room before it was logged, so no status, message or quota check refuses it;
        a keyed message of a slot given away still does (``PartitionMovedError``).
        """
        now = self._begin(use=self._sends_are_use)
        fresh, is_fresh = self._validate_send(records, forced)
        self._store_fresh(fresh, now)
        return [
            rec.sequence_number if ok else self._dedup[dedup_id(rec) or ""][1]
            for rec, ok in zip(records, is_fresh, strict=True)
        ]

    def _validate_send(
        self, records: Sequence[MessageRecord], forced: bool = False
    ) -> tuple[list[MessageRecord], list[bool]]:
        """Check a batch (raising, changing nothing); its fresh (non-duplicate) messages and
        a freshness flag per message. Transactions' reserved bytes count toward the quota.
        ``forced``: only the slots are checked (see ``send``)."""
        props = self._props
        if self.owned is not None or self.retiring:
            self._check_owned(records)
        if forced:
            return self._fresh(records)
        check_sendable(self.entity, props, records)
        fresh, is_fresh = self._fresh(records)
        incoming = sum(rec.size for rec in fresh)
        held = self._size + self.reserved
        if held + incoming > props.max_size:
            raise ServiceBusQuotaExceededError(
                f"the queue holds {held} bytes; {incoming} more would exceed its "
                f"max_size_in_megabytes of {props.max_size_in_megabytes}",
                self.entity,
                held + incoming,
                props.max_size,
            )
        return fresh, is_fresh

    def _fresh(self, records: Sequence[MessageRecord]) -> tuple[list[MessageRecord], list[bool]]:
        """A batch's messages that duplicate detection keeps, and a freshness flag each."""
        dedup = self._props.requires_duplicate_detection
        batch_ids: set[DedupId] = set()
        is_fresh: list[bool] = []
        for rec in records:
            mid = dedup_id(rec) if dedup else None
            duplicate = dedup and mid is not None and (mid in self._dedup or mid in batch_ids)
            if dedup and mid is not None:
                batch_ids.add(mid)
            is_fresh.append(not duplicate)
        return [rec for rec, ok in zip(records, is_fresh, strict=True) if ok], is_fresh

    def _store_fresh(
        self, fresh: Sequence[MessageRecord], now: float, *, journaled: bool = True
    ) -> None:
        """Store validated messages (never raises): numbers in order, and one ``SENT``
        journal entry for all of them (``raybus._core.journal``).

        ``journaled=False``: the caller has journaled the messages and their duplicate-
        detection ids in one entry already (a transaction's commit, ``TXN_COMMIT``, which
        replay expands with ``stamp_accepted`` as here); dead-lettering still journals its
        ``MOVE``, after that entry."""
        props = self._props
        dedup = props.requires_duplicate_detection
        default_ttl = props.default_ttl_s
        session_queue = self._sessions is not None
        if journaled and fresh and self._journal is not None:
            # One entry for all of them, as they arrived: replay stamps them as below.
            payload = (to_wire(fresh), now, default_ttl, session_queue, dedup)
            self._journal.append((journal.SENT, journal.MAIN, self._next_seq, payload))
        self.stats["sent"] += len(fresh)
        for rec in fresh:
            seq = self._take_seq()
            dead = stamp_accepted(rec, seq, now, default_ttl, session_queue)
            self._main.put(seq, rec)
            self._size += rec.size
            if dead is not None:
                self._dead_letter(rec, *dead)
            elif rec.state == SCHEDULED:
                self._scheduled_count += 1
                heapq.heappush(self._schedule_heap, (rec.enqueued_time, seq))
            else:
                self._make_active(rec, now)
            if dedup and (ident := dedup_id(rec)) is not None:
                self._dedup[ident] = (now, seq)
                self._dedup_slots[ident] = dedup_slot(rec)

    def _check_owned(self, records: Sequence[MessageRecord]) -> None:
        """Refuse a batch holding a message this partition no longer serves."""
        dedup = self._props.requires_duplicate_detection
        owned = self.owned
        for rec in records:
            key = partition_key(rec, dedup)
            if (key is None and self.retiring) or (
                key is not None and owned is not None and slot_of(key) not in owned
            ):
                raise PartitionMovedError(
                    "this partition no longer serves that partition key: refresh the "
                    "partition map and send again",
                    self.entity,
                )

    def resolve(self, seq: int) -> int:
        """The sequence number a message has here (a moved-in message got a new one)."""
        return self._aliases.get(seq, seq)

    def locate(
        self,
        sequence_numbers: Iterable[int],
        state: int | None = None,
        *,
        dead_letter: bool = False,
    ) -> list[int]:
        """Which of these messages this partition holds (in ``state``, when given), in the
        main store or (``dead_letter``) the dead-letter sub-queue."""
        messages = (self._dlq if dead_letter else self._main).messages
        out = []
        for s in sequence_numbers:
            rec = messages.get(self.resolve(s))
            if rec is not None and (state is None or rec.state == state):
                out.append(s)
        return out

    def cancel_scheduled(self, sequence_numbers: Iterable[int]) -> None:
        """Remove scheduled messages; all or none (``MessageNotFoundError`` names the missing)."""
        self._begin()
        seqs = [self.resolve(s) for s in sequence_numbers]
        missing = [
            s for s in seqs if (rec := self._main.messages.get(s)) is None or rec.state != SCHEDULED
        ]
        if missing:
            raise MessageNotFoundError(
                f"no scheduled message has sequence number(s) {missing}", self.entity, missing
            )
        for seq in dict.fromkeys(seqs):
            rec = self._main.messages.pop(seq)
            self._size -= rec.size
            self._scheduled_count -= 1
            self._record(journal.DEL, self._main, seq)

    # ------------------------------------------------------------------ receiving

    def receive_source(
        self, dead_letter: bool = False, session: tuple[str, str] | None = None
    ) -> tuple[Store, list[int]]:
        """The store and the heap of available numbers a receive with these arguments takes
        from; raises what that receive would raise (receiving disabled, a session missing or
        not held), changing nothing: a call that settles first checks this before it does."""
        self._check_receive()
        store = self._dlq if dead_letter else self._main
        if not dead_letter and (session is not None or self._sessions is not None):
            return store, self._held_session(session).available
        return store, store.available

    def receive(
        self,
        max_count: int,
        *,
        dead_letter: bool = False,
        delete: bool = False,
        session: tuple[str, str] | None = None,
    ) -> list[MessageRecord]:
        """Hand out up to ``max_count`` available messages in sequence order.

        Peek-lock (``delete=False``) locks each for the entity's lock duration; receive-and-
        delete removes them. Returns an empty list when nothing is available. On a
        session-enabled queue the main queue is received through an accepted ``session``
        (its id and lock token): the session's messages, in sequence order, locked until the
        session lock ends.
        """
        now = self._begin()
        store, heap = self.receive_source(dead_letter, session)
        out: list[MessageRecord] = []
        limit = self.visible_seq
        until = now + self._props.lock_duration_s
        while heap and len(out) < max_count:
            seq = heapq.heappop(heap)
            if not store.is_available(seq):
                continue
            if limit is not None and seq > limit:
                heapq.heappush(heap, seq)  # not durable yet; neither is anything after it
                break
            rec = store.messages[seq]
            if delete:
                del store.messages[seq]
                self._size -= rec.size
                self._record(journal.DEL, store, seq)
                out.append(rec)
            else:
                out.append(self._lock(store, rec, until))
        self.stats["delivered"] += len(out)
        return out

    def has_available(self, *, dead_letter: bool = False) -> bool:
        """Whether a receive (or, on a session-enabled queue, ``accept_next_session``) would
        find a message now (ticks first)."""
        self.tick()
        store = self._dlq if dead_letter else self._main
        if self._sessions is not None and not dead_letter:
            return any(self._session_head_visible(sid) for sid in list(self._sessions.ready))
        heap = store.available
        while heap and not store.is_available(heap[0]):
            heapq.heappop(heap)
        return bool(heap) and (self.visible_seq is None or heap[0] <= self.visible_seq)

    def message_count(self) -> int:
        """Messages held (main queue, scheduled and dead-letter), without ticking."""
        return len(self._main.messages) + len(self._dlq.messages)

    def message_bytes(self) -> int:
        """The encoded size of the messages ``message_count`` counts."""
        return self._size

    def receive_deferred(
        self,
        sequence_numbers: Sequence[int],
        *,
        delete: bool = False,
        session: tuple[str, str] | None = None,
        dead_letter: bool = False,
    ) -> list[MessageRecord]:
        """Lock (or remove) deferred messages by sequence number; all or none.

        Deferred messages never expire on their own; one found past its time to live here is
        expired (dead-lettered if the queue says so) and reported as not found. On a
        session-enabled queue only the accepted ``session``'s messages are found. With
        ``dead_letter`` they are the dead-letter sub-queue's deferred messages (a dead letter
        deferred there), which never expire and belong to no session.
        """
        now = self._begin()
        self._check_receive()
        store = self._dlq if dead_letter else self._main
        session_id = None
        if not dead_letter and (session is not None or self._sessions is not None):
            session_id = self._held_session(session).id
        sequence_numbers = [self.resolve(s) for s in sequence_numbers]
        missing: list[int] = []
        expired: list[MessageRecord] = []
        found: list[MessageRecord] = []
        for seq in dict.fromkeys(sequence_numbers):
            rec = store.messages.get(seq)
            if (
                rec is None
                or rec.state != DEFERRED
                or rec.lock_token is not None
                or (session_id is not None and rec.session_id != session_id)
            ):
                missing.append(seq)
            elif rec.expires_at <= now and not dead_letter:
                expired.append(rec)
                missing.append(seq)
            else:
                found.append(rec)
        for rec in expired:
            self._expire(rec)
        if missing:
            raise MessageNotFoundError(
                f"no deferred message is available with sequence number(s) {missing}",
                self.entity,
                missing,
            )
        if delete:
            for rec in found:
                del store.messages[rec.sequence_number]
                self._size -= rec.size
                self._record(journal.DEL, store, rec.sequence_number)
            return found
        until = now + self._props.lock_duration_s
        return [self._lock(store, rec, until) for rec in found]

    def delete_messages(
        self,
        max_count: int,
        before: float,
        *,
        dead_letter: bool = False,
        session: tuple[str, str] | None = None,
    ) -> int:
        """Delete up to ``max_count`` messages enqueued before ``before`` (epoch seconds), in
        sequence order, without handing them out: Service Bus's batch delete. Active,
        deferred and scheduled messages alike (a scheduled one's enqueue time is its
        schedule), never a locked one, nor one not yet durable. On a session-enabled queue,
        with an accepted ``session`` only its messages go, and without one every session's
        (Service Bus's operation names a session or none). Raises what a receive would raise
        for a status that forbids receiving, or a session not held. Returns how many went.
        """
        self._begin()
        self._check_receive()
        store = self._dlq if dead_letter else self._main
        session_id = None
        if store is self._main and session is not None:
            session_id = self._held_session(session).id
        limit = self.visible_seq
        messages = store.messages
        doomed: list[MessageRecord] = []
        if max_count > 0:
            for seq in store.numbers_from(0):  # ascending; the store must not change here
                if limit is not None and seq > limit:
                    break  # not durable yet; neither is anything after it
                rec = messages[seq]
                if rec.lock_token is not None or rec.enqueued_time >= before:
                    continue
                if session_id is not None and rec.session_id != session_id:
                    continue
                doomed.append(rec)
                if len(doomed) == max_count:
                    break
        for rec in doomed:
            seq = rec.sequence_number
            del messages[seq]
            self._size -= rec.size
            if rec.state == SCHEDULED:
                self._scheduled_count -= 1
            self._record(journal.DEL, store, seq)
        self.stats["deleted"] += len(doomed)
        return len(doomed)

    def peek(
        self,
        from_sequence_number: int,
        max_count: int,
        *,
        dead_letter: bool = False,
        session_id: str | None = None,
    ) -> list[MessageRecord]:
        """Up to ``max_count`` messages from ``from_sequence_number`` on, without locking
        (only those of ``session_id`` when given).

        Includes locked, deferred and scheduled messages, and a scheduled message turned active
        whose new number is not yet flushed (so it never drops out of a peek). Allowed on
        disabled queues, so an operator can inspect them.
        """
        self._begin()
        store = self._dlq if dead_letter else self._main
        limit = self.visible_seq if self.visible_seq is not None else float("inf")
        if self._activated:
            self._activated = {s for s in self._activated if s > limit}
        shown: set[int] = set() if dead_letter else self._activated
        msgs = store.messages
        out: list[MessageRecord] = []
        if max_count <= 0:
            return out
        for seq in store.numbers_from(from_sequence_number):  # ascending (``Store``)
            if seq > limit and seq not in shown:
                continue
            rec = msgs[seq]
            if session_id is not None and rec.session_id != session_id:
                continue
            rec = snapshot(rec)
            rec.lock_token, rec.locked_until = None, 0.0
            out.append(rec)
            if len(out) == max_count:
                break
        return out

    # ------------------------------------------------------------------ settling

    def settle(self, ops: Sequence[SettleOp]) -> list[ServiceBusError | None]:
        """Apply settlements in order; one result per op (``None`` = done, else the error).

        A refused op changes nothing; the others still apply.
        """
        self._begin()
        results: list[ServiceBusError | None] = []
        for op in ops:
            try:
                self._settle_one(op)
                results.append(None)
            except ServiceBusError as exc:
                results.append(exc)
        return results

    def lock_expiries(self, lock_tokens: Sequence[str]) -> list[float | ServiceBusError]:
        """Each lock's expiry as it stands, or ``MessageLockLostError`` for one not held.
        Changes no lock; like every call it first applies what time made due (``_begin``:
        expired locks), journaled with the next write. A transaction joining a settlement or
        renewal by lock token asks this first, so a bad token is refused when it joins, not
        later at the commit."""
        self._begin()
        out: list[float | ServiceBusError] = []
        for token in lock_tokens:
            try:
                store, seq = self._locked(token)
                out.append(store.messages[seq].locked_until)
            except ServiceBusError as exc:
                out.append(exc)
        return out

    def renew_locks(self, lock_tokens: Sequence[str]) -> list[float | ServiceBusError]:
        """Extend each lock by the entity's lock duration; new expiry or the error per token.

        Renewal never changes the delivery count.
        """
        now = self._begin()
        self._check_receive()
        out: list[float | ServiceBusError] = []
        until = now + self._props.lock_duration_s
        for token in lock_tokens:
            try:
                store, seq = self._locked(token)
                if token in self.pinned:
                    raise InvalidArgumentError(
                        "the message is part of a transaction being committed",
                        self.entity,
                        "message",
                    )
                if self._in_session(store, store.messages[seq]):
                    raise InvalidArgumentError(
                        "a session's messages are locked by the session lock: renew the "
                        "session's lock instead",
                        self.entity,
                        "message",
                    )
            except ServiceBusError as exc:
                out.append(exc)
                continue
            store.messages[seq].locked_until = until
            heapq.heappush(self._lock_heap, (until, token))
            out.append(until)
        return out

    def _settle_one(self, op: SettleOp, *, in_transaction: str | None = None) -> None:
        if op.kind not in _SETTLE_KINDS:
            raise InvalidArgumentError(f"unknown settlement {op.kind!r}", self.entity, "kind")
        if in_transaction is None:  # a prepared transaction applies whatever the status
            self._check_receive()
        store, seq = self._locked(op.lock_token)
        if self.pinned and self.pinned.get(op.lock_token, in_transaction) != in_transaction:
            raise InvalidArgumentError(
                "the message is part of a transaction being committed; settle it there",
                self.entity,
                "message",
            )
        rec = store.messages[seq]
        self._check_settle_content(op, store, rec)
        # Validated: apply.
        if op.properties:
            rec.application_properties = {**(rec.application_properties or {}), **op.properties}
        del self._locks[op.lock_token]
        rec.lock_token, rec.locked_until = None, 0.0
        if self._sessions is not None and store is self._main and rec.session_id is not None:
            s = self._sessions.by_id.get(rec.session_id)
            if s is not None:
                s.locked.discard(op.lock_token)
        if op.kind == COMPLETE:
            self.stats["completed"] += 1
            del store.messages[seq]
            self._size -= rec.size
            self._record(journal.DEL, store, seq)
        elif op.kind == ABANDON:
            self._redeliver(store, rec, self._clock.now())
        elif op.kind == RELEASE:  # back to the queue without counting a delivery
            self._redeliver(store, rec, self._clock.now(), count=False)
            if op.properties and store.messages.get(seq) is rec:
                self._record_update(store, rec)
        elif op.kind == DEAD_LETTER:
            self._dead_letter(rec, op.reason, op.description)
        else:  # DEFER
            rec.state = DEFERRED
            self._record_update(store, rec)

    def _check_settle_content(self, op: SettleOp, store: Store, rec: MessageRecord) -> None:
        """Refuse a settlement of ``rec`` (in ``store``) that its content rules out: a
        dead-letter of a dead letter, properties or a reason that are not AMQP values, or a
        header that would grow past what a send may carry (``check_settled_header``). Also
        checked when a transaction prepares one, so that its commit cannot fail."""
        if op.properties:
            check_application_properties(op.properties)
        if op.kind == DEAD_LETTER and store is self._dlq:
            raise InvalidArgumentError(
                "the message is already in the dead-letter sub-queue", self.entity, "message"
            )
        if op.reason is not None or op.description is not None:
            for text, what in ((op.reason, "reason"), (op.description, "error_description")):
                if text is not None and not isinstance(text, str):
                    raise InvalidArgumentError(f"{what} must be a str", self.entity, what)
        dead_lettered = op.kind == DEAD_LETTER and (op.reason, op.description) != (None, None)
        if op.properties or dead_lettered:  # what the header grows by stays within its limits
            reasons = (op.reason, op.description) if op.kind == DEAD_LETTER else None
            check_settled_header(rec, op.properties, reasons, self.entity)

    def _locked(self, token: str) -> tuple[Store, int]:
        entry = self._locks.get(token)
        if entry is None:
            raise MessageLockLostError(
                "the lock is not valid: it expired, was already used to settle, or was lost",
                self.entity,
                token,
            )
        return entry

    # ------------------------------------------------------------------ time

    def tick(self) -> bool:
        """Apply every time-driven change due now; return whether a message became available."""
        now = self._clock.now()
        woke = False
        heap = self._schedule_heap
        while heap and heap[0][0] <= now:
            _, seq = heapq.heappop(heap)
            rec = self._main.messages.get(seq)
            if rec is None or rec.state != SCHEDULED:
                continue  # cancelled
            del self._main.messages[seq]
            self._scheduled_count -= 1
            new_seq = self._take_seq()
            rec.sequence_number = rec.enqueued_sequence_number = new_seq
            # enqueued_time stays the scheduled time: the time to live counts from there, even
            # when nothing touched the partition until later (the sweep below expires it then).
            self._main.put(new_seq, rec)
            if self.visible_seq is not None:
                self._activated.add(new_seq)
            self._make_active(rec, now)
            self._record(journal.DEL, self._main, seq)
            self._record(journal.PUT, self._main, new_seq, journal.put_payload(rec))
            mid = dedup_id(rec)
            if mid is not None and self._dedup.get(mid, (0.0, 0))[1] == seq:
                self._dedup[mid] = (self._dedup[mid][0], new_seq)
                self._record(journal.DEDUP, self._main, new_seq, (mid, self._dedup[mid][0]))
            woke = True
        heap2 = self._lock_heap
        while heap2 and heap2[0][0] <= now:
            _, token = heapq.heappop(heap2)
            entry = self._locks.get(token)
            if entry is None:
                continue
            store, seq = entry
            rec = store.messages[seq]
            if rec.locked_until > now:
                continue  # renewed; a later heap entry covers it
            if token in self.pinned:  # a prepared transaction holds it: look again later
                heapq.heappush(heap2, (now + 1.0, token))
                continue
            del self._locks[token]
            rec.lock_token, rec.locked_until = None, 0.0
            self.stats["lock_expired"] += 1
            woke |= self._redeliver(store, rec, now)
        sessions = self._sessions
        if sessions is not None:
            heap4 = sessions.lock_heap
            while heap4 and heap4[0][0] <= now:
                _, session_id, token = heapq.heappop(heap4)
                s = sessions.by_id.get(session_id)
                if s is None or s.holder != token or s.locked_until > now:
                    continue  # released, or renewed (a later entry covers it)
                self._release_session(s, now, count=True)
                woke = True
        heap3 = self._ttl_heap
        while heap3 and heap3[0][0] <= now:
            _, seq = heapq.heappop(heap3)
            rec = self._main.messages.get(seq)
            if rec is not None and rec.state == ACTIVE and rec.lock_token is None:
                self._expire(rec)
        window = self._props.dedup_window_s
        dedup = self._dedup
        while dedup:
            first = next(iter(dedup))
            if dedup[first][0] + window > now:
                break
            del dedup[first]
            self._dedup_slots.pop(first, None)
        # Each heap is compacted on its own: rebuilding all three when one overflowed cost a
        # queue holding 200,000 messages with a time to live 21.8 us a message received and
        # completed against 4.1 (its expiry heap rebuilt at every lock-heap compaction).
        limits = self._heap_limits
        if len(heap2) > limits[0]:
            locks = self._locks
            limits[0] = _compacted(heap2, lambda e: e[1] in locks)
        if len(heap3) > limits[1]:
            messages = self._main.messages
            limits[1] = _compacted(heap3, lambda e: e[1] in messages)
        if sessions is not None and len(sessions.lock_heap) > limits[2]:
            by_id = sessions.by_id
            limits[2] = _compacted(
                sessions.lock_heap,
                lambda e: (s := by_id.get(e[1])) is not None and s.holder == e[2],
            )
        return woke

    def next_deadline(self) -> float | None:
        """When the next scheduled activation or lock expiry is due (epoch seconds)."""
        times = [h[0][0] for h in (self._schedule_heap, self._lock_heap) if h]
        if self._sessions is not None and self._sessions.lock_heap:
            times.append(self._sessions.lock_heap[0][0])
        return min(times) if times else None

    def idle_deadline(self) -> float:
        """When the queue may be deleted for idleness (``inf`` when never)."""
        return self.accessed_at + self._props.auto_delete_on_idle_s

    def counts(self) -> PartitionCounts:
        """What this partition holds, with what its outbox carries to other partitions
        (``raybus._core.migration``): taken out of its stores, those messages are counted here
        until the target confirms, so an entity's counts do not drop while a partition change
        moves them (they read 0 of 200 in one read of 25 during a scale-down from 4 to 1).
        Between the target's ``adopt`` and this partition's ``finish`` they count twice; the
        namespace reads counts only between the steps of a change, which hold both calls,
        so that is seen only for a bundle resent in the background after a failed target."""
        self.tick()
        active = dead = scheduled = size = 0
        for _target, bundle in self.outbox.values():
            a, d, s, b = bundle.tally
            active, dead, scheduled, size = active + a, dead + d, scheduled + s, size + b
        return PartitionCounts(
            active=len(self._main.messages) - self._scheduled_count + active,
            dead_letter=len(self._dlq.messages) + dead,
            scheduled=self._scheduled_count + scheduled,
            size_in_bytes=self._size + size,
            accessed_at=self.accessed_at,
        )

    # ------------------------------------------------------------------ internals

    def _begin(self, *, use: bool = True) -> float:
        """Apply what time made due; the time now, which is when the entity was last used
        (``use``: the call counts as use, ``auto_delete_on_idle``)."""
        self.tick()
        now = self._clock.now()
        if use:
            self.accessed_at = now
        return now

    def _check_receive(self) -> None:
        status = self._props.status
        if not status.can_receive:
            what = (  # a subscription's store is ReceiveDisabled for either of its statuses
                "subscription is disabled"
                if is_subscription(self.entity)
                else f"queue is {status.value}"
            )
            raise MessagingEntityDisabledError(
                f"the {what}; receiving and settling are not allowed",
                self.entity,
                status.value,
            )

    def _take_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def _lock(self, store: Store, rec: MessageRecord, until: float) -> MessageRecord:
        """Lock ``rec`` until ``until`` (now plus the lock duration, computed once per call by
        the caller), or under its session's lock."""
        token = self._tokens.next()
        rec.lock_token = token
        self._locks[token] = (store, rec.sequence_number)
        if self._in_session(store, rec):
            # Under the session's lock: released with it, never on its own.
            assert self._sessions is not None and rec.session_id is not None
            s = self._sessions.by_id[rec.session_id]
            rec.locked_until = s.locked_until
            s.locked.add(token)
        else:
            rec.locked_until = until
            heapq.heappush(self._lock_heap, (until, token))
        return self._export(rec)

    def _in_session(self, store: Store, rec: MessageRecord) -> bool:
        return self._sessions is not None and store is self._main and rec.session_id is not None

    def _push_available(self, store: Store, rec: MessageRecord) -> None:
        if self._in_session(store, rec):
            assert self._sessions is not None and rec.session_id is not None
            self._sessions.push(rec.session_id, rec.sequence_number)
        else:
            heapq.heappush(store.available, rec.sequence_number)

    def _make_active(self, rec: MessageRecord, now: float) -> None:
        rec.state = ACTIVE
        rec.expires_at = active_expiry(rec)
        self._push_available(self._main, rec)
        if rec.expires_at != float("inf"):
            heapq.heappush(self._ttl_heap, (rec.expires_at, rec.sequence_number))

    def _redeliver(
        self, store: Store, rec: MessageRecord, now: float, *, count: bool = True
    ) -> bool:
        """A lock ended without settlement (abandon, expiry, or a release that does not
        ``count``): requeue, dead-letter or expire. Returns whether it is available again."""
        if count:
            rec.delivery_count += 1
            self.stats["redelivered"] += 1
        if store is self._main:
            if count and rec.delivery_count >= self._props.max_delivery_count:
                self._dead_letter(
                    rec,
                    MAX_DELIVERY_COUNT_EXCEEDED,
                    f"Message could not be consumed after {self._props.max_delivery_count} "
                    "delivery attempts.",
                )
                return False
            if rec.expires_at <= now and rec.state == ACTIVE:
                self._expire(rec)
                return False
        if count:
            self._record_update(store, rec)
        if rec.state == ACTIVE:
            self._push_available(store, rec)
            return True
        return False

    def _expire(self, rec: MessageRecord) -> None:
        if self._props.dead_lettering_on_message_expiration:
            self._dead_letter(rec, TTL_EXPIRED, "The message expired and was dead lettered.")
        else:
            del self._main.messages[rec.sequence_number]
            self._size -= rec.size
            self._record(journal.DEL, self._main, rec.sequence_number)

    def _dead_letter(self, rec: MessageRecord, reason: str | None, description: str | None) -> None:
        self.stats["dead_lettered"] += 1
        del self._main.messages[rec.sequence_number]
        rec.state = ACTIVE
        rec.dead_letter_reason = reason
        rec.dead_letter_error_description = description
        self._dlq.put(rec.sequence_number, rec)
        heapq.heappush(self._dlq.available, rec.sequence_number)
        self._record(
            journal.MOVE,
            self._dlq,
            rec.sequence_number,
            (rec.delivery_count, rec.application_properties, reason, description),
        )

    # ------------------------------------------------------------------ durability

    def _record(self, op: int, store: Store, seq: int, payload: Any = None) -> None:
        entries = self._journal
        if entries is None:
            return
        if op == journal.DEL:
            # Consecutive deletions from one store share an entry (a batch's completions).
            if entries and (last := entries[-1])[0] == journal.DELS and last[1] == store.id:
                last[3].append(seq)
                entries.merged += 1
            else:
                entries.append((journal.DELS, store.id, 0, [seq]))
            return
        entries.append((op, store.id, seq, payload))

    def _record_update(self, store: Store, rec: MessageRecord) -> None:
        if self._journal is not None:
            payload = (rec.delivery_count, rec.state, rec.application_properties)
            self._journal.append((journal.UPD, store.id, rec.sequence_number, payload))
