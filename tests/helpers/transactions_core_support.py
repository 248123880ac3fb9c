"""Fixtures and helpers of the unit tests of a partition's side of two-phase commit
(``tests/unit/test_transactions_*.py``): partitions on a ``FakeClock`` (``q`` plain, ``dq``
with duplicate detection, ``sq`` with sessions), prepare/receive shorthands, and journal
round trips through the Arrow table format (what the actor replays on recovery).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from raybus._core import journal
from raybus._core import transactions as txn
from raybus._core.partition import Partition, SettleOp
from raybus._core.record import MessageRecord, encoded_size
from raybus._core.slots import SLOTS
from raybus._models import QueueProperties
from raybus.testing import FakeClock

LOCK = 30.0
EVERYTHING = 10_000
ALL = frozenset(range(SLOTS))
MIB = 1024 * 1024


# ---------------------------------------------------------------------------- helpers


def props(**options: Any) -> QueueProperties:
    options.setdefault("lock_duration", LOCK)
    return QueueProperties(name="orders", **options)


def rec(message_id: str | None = None, body: Any = b"payload", **fields: Any) -> MessageRecord:
    """A fresh, validated record ready to send."""
    r = MessageRecord(body=body, message_id=message_id, **fields)
    encoded_size(r)
    return r


@pytest.fixture
def q(clock: FakeClock) -> Partition:
    """A plain (no sessions, no duplicate detection) queue partition."""
    return Partition(props(), clock)


@pytest.fixture
def dq(clock: FakeClock) -> Partition:
    """A queue partition with duplicate detection."""
    return Partition(props(requires_duplicate_detection=True), clock)


@pytest.fixture
def sq(clock: FakeClock) -> Partition:
    """A session-enabled queue partition."""
    return Partition(props(requires_session=True), clock)


def op(kind: str, token: str | None, **fields: Any) -> SettleOp:
    return SettleOp(kind, token, **fields)  # type: ignore[arg-type]


def prepare(
    p: Partition,
    txn_id: str,
    sends: Iterable[MessageRecord] = (),
    settles: Iterable[SettleOp] = (),
    renews: Iterable[str] = (),
) -> None:
    txn.prepare(p, txn_id, list(sends), list(settles), list(renews))


def received(
    p: Partition, *ids: str, log: list[journal.Entry] | None = None
) -> dict[str, MessageRecord]:
    """Send messages ``ids`` and receive (lock) them; the received copies by id. A durable
    partition's sends are flushed to ``log`` first (receivers see only durable messages)."""
    p.send([rec(i) for i in ids])
    if log is not None:
        flush(p, log)
    got = p.receive(len(ids))
    assert [r.message_id for r in got] == list(ids)
    return {r.message_id or "": r for r in got}


def stored(p: Partition, message_id: str) -> MessageRecord:
    """The partition's own record of a message (main queue or dead-letter sub-queue)."""
    found = [
        r for s in (p._main, p._dlq) for r in s.messages.values() if r.message_id == message_id
    ]
    assert len(found) == 1, (message_id, found)
    return found[0]


def in_dlq(p: Partition, message_id: str) -> bool:
    return any(r.message_id == message_id for r in p._dlq.messages.values())


def ids_of(records: Iterable[MessageRecord]) -> list[str | None]:
    return [r.message_id for r in records]


def all_ids(p: Partition) -> list[str | None]:
    """Every stored message's id (main queue, then dead-letter sub-queue)."""
    return [r.message_id for s in (p._main, p._dlq) for r in s.messages.values()]


def counted(p: Partition) -> tuple[int, int, int, int]:
    c = p.counts()
    return c.active, c.dead_letter, c.scheduled, c.size_in_bytes


def stored_size(p: Partition) -> int:
    return sum(r.size for s in (p._main, p._dlq) for r in s.messages.values())


def fingerprint(p: Partition) -> tuple[Any, ...]:
    """Everything a refused prepare must leave unchanged."""
    msgs = tuple(
        (
            s.id,
            seq,
            r.message_id,
            r.state,
            r.lock_token,
            r.locked_until,
            r.delivery_count,
            r.dead_letter_reason,
        )
        for s in (p._main, p._dlq)
        for seq, r in s.messages.items()
    )
    return (
        msgs,
        tuple(p.prepared),
        dict(p.pinned),
        p.reserved,
        p._next_seq,
        p._size,
        dict(p._locks),
        len(p._journal or []),
    )


def through_storage(entries: Iterable[journal.Entry]) -> list[journal.Entry]:
    return journal.from_table(journal.to_table(list(entries)))


def flush(p: Partition, log: list[journal.Entry]) -> None:
    """A successful group commit: the journal goes to ``log``, everything becomes visible."""
    entries, last = p.take_journal()
    log.extend(entries)
    p.visible_seq = max(p.visible_seq or 0, last)


def rebuilt(p: Partition, clock: FakeClock, entries: Iterable[journal.Entry]) -> Partition:
    """A restarted durable partition, loaded from the replay of ``entries``."""
    r = Partition(p.properties, clock, p.partition_id)
    r.load(journal.replay(through_storage(entries)))
    r.enable_journal()
    return r


def durable(p: Partition) -> list[journal.Entry]:
    """Turn the journal on; the log it is written to."""
    p.enable_journal()
    return []
