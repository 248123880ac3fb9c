"""Checkpoints, recovery and the journal of ``Partition``: its state as journal entries, and back.

Kept in their own module for size; they are methods of ``Partition`` (a mixin) and share its
state. The journal format is ``raybus._core.journal``.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, cast

from .._models import QueueProperties
from . import journal
from .record import ACTIVE, SCHEDULED, MessageRecord
from .sessions import SessionTable
from .slots import DedupId
from .store import Store

if TYPE_CHECKING:
    from .._clock import Clock
    from .partition import Partition

__all__ = ["SnapshotOps"]

_TXN_OPS = frozenset((journal.TXN_PREPARE, journal.TXN_COMMIT, journal.TXN_END))


class SnapshotOps:
    """Journal, checkpoint and load methods of ``Partition``."""

    if TYPE_CHECKING:
        _main: Store
        _dlq: Store
        _props: QueueProperties
        _sessions: SessionTable | None
        _dedup: dict[DedupId, tuple[float, int]]
        _dedup_slots: dict[DedupId, int]
        _aliases: dict[int, int]
        _adopted: set[str]
        _next_seq: int
        _size: int
        _scheduled_count: int
        _schedule_heap: list[tuple[float, int]]
        _ttl_heap: list[tuple[float, int]]
        owned: frozenset[int] | None
        retiring: bool
        outbox: dict[str, tuple[int, Any]]
        last_move_end: float
        moved_out: dict[int, tuple[int, float]]
        _clock: Clock
        prepared: dict[str, Any]
        delivered: dict[str, int]
        visible_seq: int | None
        _journal: journal.Pending | None

        def _in_session(self, store: Store, rec: MessageRecord) -> bool: ...
        def _push_available(self, store: Store, rec: MessageRecord) -> None: ...

    def snapshot_entries(self) -> list[journal.Entry]:
        """The whole durable state as entries (a checkpoint): messages in ``PUTS`` entries
        (their locks are dropped at replay), duplicate-detection ids, and the next sequence
        number."""
        out: list[journal.Entry] = []
        for store in (self._main, self._dlq):
            out += journal.puts_entries(store.id, store.messages.items())
        for message_id, (accepted_at, seq) in self._dedup.items():
            slot = self._dedup_slots.get(message_id)
            payload: tuple[Any, ...] = (message_id, accepted_at)
            if slot is not None:
                payload += (slot,)
            out.append((journal.DEDUP, journal.MAIN, seq, payload))
        if self.owned is not None or self.retiring:
            out.append((journal.SLOTS, journal.MAIN, 0, (self.owned, self.retiring)))
        for old, new in self._aliases.items():
            out.append((journal.ALIAS, journal.MAIN, new, old))
        for move_id in self._adopted:
            out.append((journal.ADOPTED, journal.MAIN, 0, move_id))
        for source, number in self.delivered.items():
            out.append((journal.DELIVERED, journal.MAIN, number, source))
        for move_id, (target, bundle) in self.outbox.items():
            out.append((journal.OUTBOX, journal.MAIN, 0, (move_id, target, bundle)))
        if self.prepared:
            from .transactions import _to_payload

            for txn_id, share in self.prepared.items():
                payload = (txn_id, _to_payload(cast("Partition", self), share))
                out.append((journal.TXN_PREPARE, journal.MAIN, 0, payload))
        if self._sessions is not None:
            for s in self._sessions.by_id.values():
                if s.state is not None:
                    payload = (s.id, s.state, s.state_updated)
                    out.append((journal.SESSION, journal.MAIN, 0, payload))
        out.append((journal.NEXT, journal.MAIN, self._next_seq, None))
        out.append((journal.PROPS, journal.MAIN, 0, self._props))
        return out

    def load(self, state: journal.ReplayedState) -> None:
        """Replace this (new, empty) partition's state with a replayed one. Messages that were
        locked are available again, without a delivery counted for the restart."""
        if self._main.messages or self._dlq.messages:
            raise RuntimeError("load() needs an empty partition")
        state.sorted()
        if state.properties is not None:
            self._props = state.properties
        self._main.messages, self._dlq.messages = state.main, state.dead_letter
        self._main.reindex()
        self._dlq.reindex()
        self._dedup = state.dedup
        self._dedup_slots = state.dedup_slots
        if state.slots is not None:
            self.owned, self.retiring = state.slots
        self._aliases = state.aliases
        self._adopted = state.adopted
        self.delivered = state.delivered
        self.outbox = state.outbox
        # When a move out last ended is not journaled: say "just now", so a peek that a move
        # and this restart both overlapped is made again (``migration.quiet_for``). Where the
        # moves finished since the checkpoint took numbers is remembered as of now too.
        self.last_move_end = now = self._clock.now()
        self.moved_out = {seq: (target, now) for seq, target in state.moved_out.items()}
        self._next_seq = max(self._next_seq, state.next_seq)
        for store in (self._main, self._dlq):
            for seq, rec in store.messages.items():
                rec.lock_token, rec.locked_until = None, 0.0
                self._size += rec.size
                if rec.state == SCHEDULED:
                    self._scheduled_count += 1
                    heapq.heappush(self._schedule_heap, (rec.enqueued_time, seq))
                elif rec.state == ACTIVE:
                    if self._in_session(store, rec):
                        self._push_available(store, rec)
                    else:
                        store.available.append(seq)
                    if store is self._main and rec.expires_at != float("inf"):
                        self._ttl_heap.append((rec.expires_at, seq))
            heapq.heapify(store.available)
        heapq.heapify(self._ttl_heap)
        if self._sessions is not None:
            for session_id, (data, updated) in state.sessions.items():
                s = self._sessions.get(session_id)
                s.state, s.state_updated = data, updated
                self._size += len(data)
        if state.prepared:
            from .transactions import recover

            recover(cast("Partition", self), state.prepared)
        if self.visible_seq is not None:
            self.visible_seq = self._next_seq - 1

    @property
    def next_sequence_number(self) -> int:
        """The sequence number the next message stored here gets (a transaction's commit
        journals where its sends start, so that replay numbers them the same)."""
        return self._next_seq

    def record_transaction(self, op: int, payload: Any) -> None:
        """Journal one step of a transaction (``raybus._core.transactions``): ``op`` is
        ``TXN_PREPARE``, ``TXN_COMMIT`` or ``TXN_END``, ``payload`` as ``raybus._core.journal``
        describes it. Nothing is recorded when the partition is not durable. Raises
        ``ValueError`` for another ``op`` (the other entries belong to the partition's own
        changes)."""
        if op not in _TXN_OPS:
            raise ValueError(f"journal op {op} is not a transaction's")
        if self._journal is not None:
            self._journal.append((op, journal.MAIN, 0, payload))

    def enable_journal(self) -> None:
        """Record every change for the storage log, and show receivers only messages up to
        ``visible_seq`` (set it after each durable flush). Memory-only partitions skip this."""
        if self._journal is None:
            self._journal = journal.Pending()
            self.visible_seq = self._next_seq - 1

    def take_journal(self) -> tuple[list[journal.Entry], int]:
        """The entries recorded since the last call, and the last sequence number assigned;
        once they are durable, set ``visible_seq`` to that number."""
        entries: list[journal.Entry] = self._journal or []
        if self._journal is not None:
            self._journal = journal.Pending()
        return entries, self._next_seq - 1

    def has_journal(self) -> bool:
        return bool(self._journal)

    def journal_size(self) -> int:
        """Changes recorded and not yet taken (entries, and deletions merged into one):
        compared before and after a step, whether that step changed durable state."""
        return 0 if self._journal is None else self._journal.size()
