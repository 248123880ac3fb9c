"""The small value types of a partition: settlement ops, counters, lock tokens, message stores."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
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
    """Lock tokens in UUID form: a random prefix per partition instance and a counter.

    Unique for the life of the instance; a restarted partition draws a new prefix, so tokens
    issued before the restart can never match. Several times cheaper than ``uuid.uuid4()``.
    """

    __slots__ = ("_count", "_prefix")

    def __init__(self) -> None:
        hexes = uuid.uuid4().hex
        self._prefix = f"{hexes[:8]}-{hexes[8:12]}-4{hexes[13:16]}-{hexes[16:20]}-"
        self._count = int(hexes[20:], 16) >> 8  # random start, far from wrapping 48 bits

    def next(self) -> str:
        self._count += 1
        return f"{self._prefix}{self._count & 0xFFFFFFFFFFFF:012x}"


class Store:
    """The messages of one queue or sub-queue and the heap of those ready for delivery."""

    __slots__ = ("available", "id", "messages", "name")

    def __init__(self, name: str, store_id: int) -> None:
        self.name = name
        self.id = store_id  # journal.MAIN or journal.SUB_DLQ
        self.messages: dict[int, MessageRecord] = {}
        self.available: list[int] = []  # min-heap of sequence numbers; may hold stale entries

    def is_available(self, seq: int) -> bool:
        rec = self.messages.get(seq)
        return rec is not None and rec.lock_token is None and rec.state == ACTIVE
