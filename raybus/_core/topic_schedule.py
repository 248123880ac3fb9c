"""A topic's scheduled messages, held by its router until their time (pure, logged).

Service Bus keeps a message scheduled on a topic in the topic: ``schedule_messages`` answers a
sequence number of the topic's, ``cancel_scheduled_messages`` on the topic sender takes it, and
the subscriptions see the message (each copy with a new sequence number of its own) only
when it is enqueued at its time, through their rules as they stand then. raybus does the same
with the topic's router (``raybus._actors.topic_scheduler``): this class is its state, and
every change it returns is logged by the router before the caller is answered.

* ``add`` numbers the messages from the topic's own counter (numbers never repeat, across
  restarts too: the counter is in the log and in every checkpoint);
* ``missing`` names those a cancel cannot take, and ``remove`` takes them out (a cancel, all or
  none, checks ``missing`` first); a message whose time has come and whose publish is under way
  (``firing``) can no longer be cancelled, as a Service Bus message already enqueued;
* ``due`` names the messages whose time has come, earliest first, and ``remove`` takes them out
  once published. A publish that was refused (a full subscription, a disabled topic) is tried
  again later (``retry``); the message stays scheduled and counted meanwhile.

``due`` and ``next_due`` read a heap of (due time, number), not every entry: the timer asks
them each time it wakes, which every ``schedule_messages`` call does. Entries removed or
moved (``retry``) leave their old heap items behind, skipped when they come up.

Outside a transaction both ways to schedule come here: ``schedule_messages``, and
``send_messages`` of messages whose ``scheduled_enqueue_time_utc`` is to come (the router's
``_publish_holding``; their numbers are not answered). Deviations (README, Differences):
schedules inside a transaction still fan out at once and wait in each subscription (their
copies show in a subscription's peek and scheduled count). Duplicate detection (done by the
subscriptions' stores) applies when a message is published, not when it is scheduled.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .record import encoded_sizes

__all__ = ["TopicSchedule"]


@dataclass
class TopicSchedule:
    """Scheduled messages by sequence number: (due time, the message as a wire row)."""

    next_seq: int = 1
    entries: dict[int, tuple[float, Any]] = field(default_factory=dict)
    firing: set[int] = field(default_factory=set)
    # (due, seq) of the entries, with stale items (see the module docstring).
    _queue: list[tuple[float, int]] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def replayed(cls, changes: Iterable[tuple[Any, ...]]) -> TopicSchedule:
        """The state a logged history (or a checkpoint, then the changes after it) leaves."""
        state = cls()
        for change in changes:
            kind = change[0]
            if kind == "next":
                state.next_seq = max(state.next_seq, change[1])
            elif kind == "sched":
                for seq, due, row in change[1]:
                    state.entries[seq] = (due, row)
                    state.next_seq = max(state.next_seq, seq + 1)
            elif kind == "drop":
                for seq in change[1]:
                    state.entries.pop(seq, None)
        state._queue = [(due, seq) for seq, (due, _row) in state.entries.items()]
        heapq.heapify(state._queue)
        return state

    def size_in_bytes(self) -> int:
        """The encoded size of the messages scheduled (a topic's size counts them, as Service
        Bus counts a topic's scheduled messages)."""
        return encoded_sizes(row for _due, row in self.entries.values())

    def snapshot(self) -> list[Any]:
        """A checkpoint: the counter and every message still scheduled."""
        rows = [(seq, due, row) for seq, (due, row) in self.entries.items()]
        return [("next", self.next_seq), ("sched", rows)]

    def add(self, rows: Sequence[Any], dues: Sequence[float]) -> tuple[list[int], Any]:
        """Schedule ``rows`` at ``dues``; their sequence numbers and the change to log (if it
        cannot be logged, ``remove`` them again: they were never scheduled)."""
        seqs = list(range(self.next_seq, self.next_seq + len(rows)))
        self.next_seq += len(rows)
        added = list(zip(seqs, dues, rows, strict=True))
        for seq, due, row in added:
            self.entries[seq] = (due, row)
            heapq.heappush(self._queue, (due, seq))
        return seqs, ("sched", added)

    def missing(self, seqs: Iterable[int]) -> list[int]:
        """Those of ``seqs`` that cannot be cancelled: never scheduled here, cancelled or
        enqueued already, or being enqueued now."""
        return [s for s in seqs if s not in self.entries or s in self.firing]

    def remove(self, seqs: Iterable[int]) -> tuple[dict[int, tuple[float, Any]], Any]:
        """Take ``seqs`` out (cancelled, or published); what was taken (to ``restore`` if the
        change cannot be logged) and the change to log."""
        taken = {s: self.entries.pop(s) for s in seqs if s in self.entries}
        self.firing.difference_update(taken)
        return taken, ("drop", sorted(taken))

    def restore(self, taken: dict[int, tuple[float, Any]]) -> None:
        self.entries.update(taken)
        # Their heap items may have been dropped as stale meanwhile (the timer ran while the
        # change was being logged): push them again; a duplicate is skipped when it comes up.
        for seq, (due, _row) in taken.items():
            heapq.heappush(self._queue, (due, seq))

    def due(self, now: float, limit: int) -> list[int]:
        """Up to ``limit`` messages whose time has come and that are not being published,
        earliest first; they are marked ``firing`` until ``remove`` or ``retry``."""
        seqs: list[int] = []
        while len(seqs) < limit and self._next() is not None and self._queue[0][0] <= now:
            _due, seq = heapq.heappop(self._queue)
            seqs.append(seq)
            self.firing.add(seq)
        return seqs

    def retry(self, seqs: Iterable[int], at: float) -> None:
        """The publish of ``seqs`` was refused: try again at ``at`` (not logged: after a
        restart they are due at once, which is only earlier)."""
        for seq in seqs:
            if seq in self.entries:
                self.entries[seq] = (at, self.entries[seq][1])
                heapq.heappush(self._queue, (at, seq))
            self.firing.discard(seq)

    def next_due(self) -> float | None:
        """When the next message not being published is due (None: nothing scheduled)."""
        return self._next()

    def _next(self) -> float | None:
        """The due time at the top of the heap once stale items are dropped from it: those
        of entries removed, moved by ``retry`` or being published."""
        queue = self._queue
        while queue:
            due, seq = queue[0]
            entry = self.entries.get(seq)
            if entry is not None and entry[0] == due and seq not in self.firing:
                return due
            heapq.heappop(queue)
        return None

    def rows(self, seqs: Iterable[int]) -> list[Any]:
        return [self.entries[s][1] for s in seqs]
