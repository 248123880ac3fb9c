"""Helpers of the unit tests of partition maps and slot moves (``test_partition_*.py``):
partitions on a ``FakeClock`` owning given slots, keys in distinct slots, a move from one
partition to another, and journal round trips through the Arrow table format (what the
Committer replays on recovery).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raybus._core import journal, migration
from raybus._core.partition import ABANDON, DEFER, RELEASE, Partition, SettleOp
from raybus._core.record import MessageRecord, encoded_size
from raybus._core.slots import SLOTS, slot_of
from raybus._models import QueueProperties
from raybus.testing import FakeClock

ALL = frozenset(range(SLOTS))
EVERYTHING = 10_000
NONE: frozenset[int] = frozenset()
LOCK = 30.0

SESSION_QUEUE = {"requires_session": True, "requires_duplicate_detection": True}
KEYED_QUEUE = {"requires_duplicate_detection": True}


# ---------------------------------------------------------------------------- helpers


def rec(body: Any = None, **fields: Any) -> MessageRecord:
    """A fresh, validated record ready to send."""
    r = MessageRecord(body=body if body is not None else f"body {fields}".encode(), **fields)
    encoded_size(r)
    return r


def props(**options: Any) -> QueueProperties:
    return QueueProperties(name="orders", lock_duration=LOCK, **options)


def part(clock: FakeClock, pid: int, owned: frozenset[int] | None, **options: Any) -> Partition:
    """A partition of queue ``orders`` serving ``owned`` (None: every slot)."""
    p = Partition(props(**options), clock, pid)
    p.owned = owned
    return p


def keys_in_distinct_slots(prefix: str, n: int, avoid: Iterable[int] = ()) -> list[str]:
    """``n`` keys ``prefix0``, ``prefix1``, ... whose slots differ from each other and
    from ``avoid``."""
    taken = set(avoid)
    out: list[str] = []
    i = 0
    while len(out) < n:
        key = f"{prefix}{i}"
        i += 1
        if slot_of(key) not in taken:
            taken.add(slot_of(key))
            out.append(key)
    return out


def deliver(
    parts: dict[int, Partition], src: Partition, outbox: dict[str, tuple[int, Any]]
) -> None:
    """What the source actor's outbox flush does: each target adopts, then the source
    forgets the move."""
    for move_id, (target, bundle) in outbox.items():
        assert migration.adopt(parts[target], move_id, bundle) is True
        migration.finish(src, move_id)


def move(
    src: Partition,
    dst: Partition,
    slots: Iterable[int],
    spill: Partition | None = None,
) -> frozenset[int]:
    """Hand ``slots`` from ``src`` over to ``dst`` (and with ``spill`` retire ``src``),
    deliver the bundles, finish; return the pinned slots."""
    parts = {dst.partition_id: dst}
    if spill is not None:
        parts[spill.partition_id] = spill
    out, pinned = migration.hand_over(
        src,
        {dst.partition_id: frozenset(slots)},
        spill.partition_id if spill is not None else None,
    )
    deliver(parts, src, out)
    assert not src.outbox
    return pinned


def accept(p: Partition, session_id: str) -> tuple[str, str]:
    token, _ = p.accept_session(session_id)
    return session_id, token


def settle_one(p: Partition, kind: str, token: str | None, **fields: Any) -> None:
    [result] = p.settle([SettleOp(kind, token, **fields)])  # type: ignore[arg-type]
    assert result is None, result


def all_records(p: Partition) -> list[MessageRecord]:
    """Every message (main, then dead-letter), as peek shows it."""
    return p.peek(0, EVERYTHING) + p.peek(0, EVERYTHING, dead_letter=True)


def ids_of(records: Iterable[MessageRecord]) -> list[str | None]:
    return [r.message_id for r in records]


def without_numbers(r: MessageRecord) -> dict[str, Any]:
    """A record's fields except the sequence numbers (a moved message gets a new one)."""
    d = {name: getattr(r, name) for name in MessageRecord.__dataclass_fields__}
    for name in ("sequence_number", "enqueued_sequence_number", "lock_token", "locked_until"):
        d.pop(name)
    return d


def counted(p: Partition) -> tuple[int, int, int, int]:
    """A partition's counters (without its last access time)."""
    c = p.counts()
    return c.active, c.dead_letter, c.scheduled, c.size_in_bytes


def total_size(*ps: Partition) -> int:
    return sum(p.counts().size_in_bytes for p in ps)


def flush(p: Partition, log: list[journal.Entry]) -> None:
    """A successful group commit: the journal goes to ``log``, everything becomes visible."""
    entries, last = p.take_journal()
    log.extend(entries)
    p.visible_seq = max(p.visible_seq or 0, last)


def recover(
    clock: FakeClock,
    pid: int,
    owned: frozenset[int] | None,
    entries: Iterable[journal.Entry],
    **options: Any,
) -> Partition:
    """A restarted durable partition: created as the actor creates it, then loaded from the
    replay of ``entries`` (after a round trip through the log's table format)."""
    state = journal.replay(journal.from_table(journal.to_table(list(entries))))
    p = part(clock, pid, owned, **options)
    p.load(state)
    p.enable_journal()
    return p


def _session_history(
    clock: FakeClock, a: Partition, log: list[journal.Entry] | None = None
) -> dict[str, int]:
    """Session s1 on ``a`` with messages in every state, plus session state; returns the
    message ids' original sequence numbers. m0 abandoned once (with a property), m1 released,
    m2 deferred, m3 scheduled, m4 active with a time to live, m5 active. A journaled ``a`` is
    flushed to ``log`` as it goes."""
    seqs = a.send(
        [
            rec(message_id="m0", session_id="s1", application_properties={"k": 1}),
            rec(message_id="m1", session_id="s1"),
            rec(message_id="m2", session_id="s1", time_to_live=500.0),
            rec(message_id="m3", session_id="s1", scheduled_enqueue_time=clock.now() + 50),
            rec(message_id="m4", session_id="s1", time_to_live=100.0),
            rec(message_id="m5", session_id="s1", application_properties={"x": "y"}),
        ]
    )
    if log is not None:
        flush(a, log)
    session = accept(a, "s1")
    m0, m1, m2 = a.receive(3, session=session)
    settle_one(a, ABANDON, m0.lock_token, properties={"retry": True})
    settle_one(a, RELEASE, m1.lock_token)
    settle_one(a, DEFER, m2.lock_token)
    a.set_session_state("s1", session[1], b"state of s1")
    assert a.release_session(*session)
    clock.advance(5)
    return dict(zip(["m0", "m1", "m2", "m3", "m4", "m5"], seqs, strict=True))
