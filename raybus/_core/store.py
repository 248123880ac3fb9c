"""The small value types of a partition: settlement ops, counters, lock tokens, message stores."""

from __future__ import annotations

import heapq
import uuid
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, count, islice
from typing import Any

from .record import ACTIVE, MessageRecord

__all__ = ["LockTokens", "PartitionCounts", "SettleOp", "Store"]


@dataclass(slots=True)
class SettleOp:
    """One settlement: ``kind`` is complete/abandon/dead_letter/defer/release.

    ``properties`` (abandon, dead-letter, defer) are merged into the message's application
    properties; ``reason``/``description`` are the dead-letter reason and error description.
    """

    kind: str
    lock_token: str
    properties: dict[str, Any] | None = None
    reason: str | None = None
    description: str | None = None

    def to_wire(self) -> tuple[Any, ...]:
        """As a tuple for a remote call (rebuild with ``SettleOp(*t)``)."""
        return (self.kind, self.lock_token, self.properties, self.reason, self.description)


@dataclass(frozen=True, slots=True)
class PartitionCounts:
    """Counters of one partition at one moment."""

    active: int
    dead_letter: int
    scheduled: int
    size_in_bytes: int
    accessed_at: float


class LockTokens:
    """Tokens in UUID form: a random prefix per instance and a counter (lock tokens of a
    partition instance; message ids of a process, ``raybus.message``).

    Unique for the life of the instance; a restarted partition draws a new prefix, so tokens
    issued before the restart can never match (``restart`` draws one in place, as a forked
    child does for its message ids). Several times cheaper than ``uuid.uuid4()``;
    ``next`` of an ``itertools.count`` is atomic, so threads may share an instance.
    """

    __slots__ = ("_counter", "_prefix")

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        hexes = uuid.uuid4().hex
        self._prefix = f"{hexes[:8]}-{hexes[8:12]}-4{hexes[13:16]}-{hexes[16:20]}-"
        # a random start, far from wrapping 48 bits
        self._counter = count(int(hexes[20:], 16) >> 8)

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter) & 0xFFFFFFFFFFFF:012x}"


# How many removed numbers the index of a store may hold beyond twice its live ones.
INDEX_SLACK = 1024


class Store:
    """The messages of one queue or sub-queue and the heap of those ready for delivery.

    Messages are added with ``put``, which also appends the number to an index in ascending
    order, so that ``numbers_from`` (a peek's walk) finds where to start by bisection and
    steps only over the numbers it returns, and those removed since the index was last
    rebuilt. Why: a peek filtered every number the store held, 51 ms for a peek of 10 on a
    partition holding 1,000,000 messages (35 ms from its middle), on the partition's event
    loop, so browsing a backlog page by page took time quadratic in its length. Removals do
    not touch the index (``messages`` is the truth): a number no longer stored is skipped,
    the leading ones for good, and the index is rebuilt once it holds more than twice as
    many numbers as the store plus ``INDEX_SLACK``, so it stays within a small multiple of
    the live messages (8 bytes each) at an amortised constant cost per message. Numbers are
    added in ascending order (a partition takes each new one above the last). One added out
    of order (the dead-letter sub-queue keeps a message's number, in dead-lettering order)
    goes to a second, short list, sorted at the next walk and walked beside the array, and
    merged into the array once it holds more than a quarter as many numbers (a linear merge
    of two sorted runs). Why: the array was rebuilt by sorting every stored number at the
    first walk after each one, so a peek of a dead-letter sub-queue of 1,000,000 messages
    that took one more message meanwhile sorted a million numbers on the partition's loop:
    507 ms a round, where it now takes 0.025 ms (``benchmarks/peek_backlog.py``, "dlq").
    """

    __slots__ = (
        "_head",
        "_last",
        "_late",
        "_late_sorted",
        "_order",
        "available",
        "id",
        "messages",
        "name",
    )

    def __init__(self, name: str, store_id: int) -> None:
        self.name = name
        self.id = store_id  # journal.MAIN or journal.SUB_DLQ
        self.messages: dict[int, MessageRecord] = {}
        self.available: list[int] = []  # min-heap of sequence numbers; may hold stale entries
        self._order = array("q")  # numbers added, ascending; may hold removed ones
        self._head = 0  # the numbers before it in ``_order`` are all removed
        self._last = -1  # the last number in ``_order``
        self._late: list[int] = []  # numbers added below it (or again); may hold removed ones
        self._late_sorted = True

    def put(self, seq: int, rec: MessageRecord) -> None:
        """Store ``rec`` as number ``seq`` and index it (class docstring)."""
        self.messages[seq] = rec
        if seq > self._last:
            order = self._order
            order.append(seq)
            self._last = seq
            if not len(order) & 1023 and self._bloated():  # looked at every 1,024 numbers
                self.reindex()
        else:
            late = self._late
            late.append(seq)
            self._late_sorted = False
            if not len(late) & 1023 and self._bloated():
                self.reindex()

    def _bloated(self) -> bool:
        # The whole array, the skipped head too: a queue drained as fast as it fills, and
        # peeked meanwhile, moves the head on and holds few messages, and the array behind
        # the head would otherwise grow by 8 bytes for every message it ever took.
        return len(self._order) + len(self._late) > 2 * len(self.messages) + INDEX_SLACK

    def reindex(self) -> None:
        """Rebuild the index from ``messages`` (after it was replaced as a whole)."""
        self._order = array("q", sorted(self.messages))
        self._head = 0
        self._last = self._order[-1] if self._order else -1
        self._late = []
        self._late_sorted = True

    def _merge_late(self) -> None:
        """Merge the late numbers into the array: two sorted runs, which ``sorted`` merges in
        linear time; a number in both is kept once."""
        merged = sorted(chain(islice(self._order, self._head, None), self._late))
        self._order = array("q", dict.fromkeys(merged))
        self._head = 0
        self._last = self._order[-1] if self._order else -1
        self._late = []
        self._late_sorted = True

    def numbers_from(self, start: int) -> Iterator[int]:
        """The numbers stored from ``start`` on, ascending, each once. The store must not
        change while this is iterated."""
        if self._bloated():
            self.reindex()
        late = self._late
        if late:
            if not self._late_sorted:
                late.sort()
                self._late_sorted = True
            if len(late) > (len(self._order) - self._head) // 4 + INDEX_SLACK:
                self._merge_late()
                late = self._late
        order, messages = self._order, self.messages
        end = len(order)
        head = self._head
        while head < end and order[head] not in messages:
            head += 1
        self._head = head
        # From the first number at or after ``start`` on, by index: ``islice`` would step over
        # every number before it (one late list can hold a quarter of the array).
        indexed: Iterator[int] = map(order.__getitem__, range(bisect_left(order, start, head), end))
        if late:  # both ascending; a number stored again may be in both
            tail = map(late.__getitem__, range(bisect_left(late, start), len(late)))
            indexed = heapq.merge(indexed, tail)
        last: int | None = None  # any int may be stored, -1 too
        for seq in indexed:
            if seq != last and seq in messages:
                yield seq
            last = seq

    def is_available(self, seq: int) -> bool:
        rec = self.messages.get(seq)
        return rec is not None and rec.lock_token is None and rec.state == ACTIVE
