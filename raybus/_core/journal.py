"""The partition journal: the changes a partition makes, as entries a log can store and replay.

A durable partition records every change of its messages as an entry ``(op, store, seq,
payload)`` and its actor writes them to the storage log in group commits. Replaying entries in
order rebuilds the messages, the dead-letter sub-queue, the duplicate-detection ids and the next
sequence number. Every entry is idempotent (replaying it twice gives the same state), so a
checkpoint taken while entries are in flight, followed by those entries, is still exact.

A transaction's sends are journaled once, in its ``TXN_PREPARE`` entry: ``TXN_COMMIT`` names
only which of them were stored under which numbers, and replay rebuilds those messages from the
prepared share with ``raybus._core.record.stamp_accepted``, as the partition did (a committed
share of 1 KiB messages journals about one copy of the bodies, not two). A ``TXN_COMMIT`` whose
transaction is not prepared in the replayed state is a no-op: it can only follow a checkpoint
taken after the commit, which holds the messages (or their later fate) already. Logs written
before ``TXN_COMMIT`` existed have ``PUT`` and ``DEDUP`` entries at commit instead; they replay
as before.

A send is journaled the same way: one ``SENT`` entry carries its accepted messages as they
arrived, with what stamping them needs (the time, the settings), and replay stamps them as the
partition did. Pickling a ``PUT`` (and a ``DEDUP``) per message was the largest share of a
durable partition's CPU after the calls themselves (py-spy, 1 KiB batches): one pickle of a
send's rows costs a fifth of that. Likewise consecutive deletions from one store (a batch's
completions) share one ``DELS`` entry, and a checkpoint's messages are ``PUTS`` entries of
up to ``PUTS_MAX`` each (capturing a checkpoint runs on the partition's event loop). Logs and
checkpoints written before these entries existed replay as before (``PUT``, ``DEDUP``,
``DEL``); older code cannot replay these. One pickle per entry also stores a body object that
several messages of a send share once.

Locks are not journaled: after a restart every message that was locked is available again,
and its delivery count is not charged for the crash.
"""

from __future__ import annotations

import array
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import fields
from typing import Any

import pyarrow as pa

from .record import ACTIVE, MessageRecord, _to_wire, stamp_accepted, to_wire
from .slots import DedupId, dedup_id, dedup_slot
from .wire import PickledPieces, pickle_pieces

__all__ = [
    "ADOPTED",
    "ALIAS",
    "DEDUP",
    "DEL",
    "DELIVERED",
    "DELS",
    "MAIN",
    "MOVE",
    "NEXT",
    "OUTBOX",
    "OUTBOX_DONE",
    "PROPS",
    "PUT",
    "PUTS",
    "SENT",
    "SESSION",
    "SLOTS",
    "SUB_DLQ",
    "TXN_COMMIT",
    "TXN_END",
    "TXN_PREPARE",
    "UPD",
    "Entry",
    "ReplayedState",
    "changes",
    "from_table",
    "put_payload",
    "replay",
    "to_table",
]

Entry = tuple[int, int, int, Any]  # (op, store, sequence number, payload)

# ops
PUT = 1  # payload: the record as a wire tuple, unlocked
DEL = 2  # payload: None
UPD = 3  # payload: (delivery_count, state, application_properties)
MOVE = 4  # main -> dead-letter; payload: (delivery_count, application_properties, reason, desc)
DEDUP = 5  # payload: (message_id, accepted_at)
NEXT = 6  # seq: the next sequence number to assign (in checkpoints)
PROPS = 7  # payload: the entity's QueueProperties (so a restarted actor has the latest)
SESSION = 8  # payload: (session id, state bytes or None, updated at)
SLOTS = 9  # payload: (owned slots as a frozenset or None for all, retiring flag)
ALIAS = 10  # seq: a moved-in message's new number; payload: its number in the old partition
ADOPTED = 11  # payload: the id of a partition move applied here (moves are idempotent)
OUTBOX = 12  # payload: (move id, target partition id, raybus._core.migration.Bundle)
OUTBOX_DONE = 13  # payload: the move id the target has applied
TXN_PREPARE = 14  # payload: (transaction id, its share; see raybus._core.transactions)
TXN_END = 15  # payload: the transaction id (committed or aborted: its effects are logged)
# payload: (transaction id, commit time, first sequence number, messages stored, indices of
# the prepared sends dropped as duplicates, default time to live, session queue flag,
# duplicate detection flag): the share's sends minus the dropped ones got consecutive numbers
# from the first; the settings are those at commit (the entity's may change later).
TXN_COMMIT = 16
DELIVERED = 17  # seq: the number of a topic router's delivery applied; payload: its source key
# seq: the first sequence number; payload: (the messages' rows as they arrived, accepted at,
# default time to live, session queue flag, duplicate detection flag): one send's (or router
# delivery's) accepted messages, numbered consecutively from seq. Replay stamps each row as
# the partition did (``stamp_accepted``) and records its duplicate-detection id when the flag
# is set: one entry and one pickle per send, not a PUT and a DEDUP per message (module
# docstring). A message dead-lettered on arrival has a MOVE entry after it.
SENT = 18
DELS = 19  # payload: the sequence numbers deleted from its store, in order (consecutive DELs)
# payload: (sequence numbers, rows): messages of its store as a checkpoint captures them, the
# rows as ``to_wire`` makes them (a lock they show is dropped at replay); one entry per
# ``PUTS_MAX`` messages or ``PUTS_MAX_BYTES``, not a PUT each.
PUTS = 20
PUTS_MAX = 1000
PUTS_MAX_BYTES = 16 << 20

# stores
MAIN, SUB_DLQ = 0, 1


class Pending(list[Entry]):
    """A partition's entries recorded and not yet taken. ``merged`` counts the deletions
    merged into a ``DELS`` entry already here, so ``size`` grows with every step recorded;
    a fresh ``Pending`` (what taking the entries leaves) counts from zero."""

    merged: int = 0

    def size(self) -> int:
        return len(self) + self.merged


def puts_entries(store: int, messages: Iterable[tuple[int, MessageRecord]]) -> list[Entry]:
    """``messages`` of ``store`` (sequence number, record) as ``PUTS`` entries of up to
    ``PUTS_MAX`` messages or ``PUTS_MAX_BYTES`` of bodies each."""
    return [(PUTS, store, 0, (numbers, to_wire(records))) for numbers, records in _chunks(messages)]


def _chunks(
    messages: Iterable[tuple[int, MessageRecord]],
) -> Iterator[tuple[list[int], list[MessageRecord]]]:
    numbers: list[int] = []
    records: list[MessageRecord] = []
    held = 0
    for seq, rec in messages:
        numbers.append(seq)
        records.append(rec)
        held += rec.size
        if len(numbers) >= PUTS_MAX or held >= PUTS_MAX_BYTES:
            yield numbers, records
            numbers, records, held = [], [], 0
    if numbers:
        yield numbers, records


_BATCHED = frozenset((SENT, PUTS))  # entries whose payload's first item holds many messages

_NAMES = [f.name for f in fields(MessageRecord)]
_BODY = _NAMES.index("body")
_LOCK_TOKEN = _NAMES.index("lock_token")
_LOCKED_UNTIL = _NAMES.index("locked_until")

SCHEMA = pa.schema(
    [
        ("op", pa.int8()),
        ("store", pa.int8()),
        ("seq", pa.int64()),
        ("payload", pa.binary()),
    ]
)


def put_payload(rec: MessageRecord) -> tuple[Any, ...]:
    """The record as stored: a wire tuple without its lock."""
    row = list(_to_wire(rec))
    row[_LOCK_TOKEN] = None
    row[_LOCKED_UNTIL] = 0.0
    return tuple(row)


# A PUT whose body is at least this long is pickled without copying the body.
_LONG_BODY = 16 << 10
_MAX_OFFSET = 2**31 - 1  # a binary column's offsets are 32-bit


def changes(entries: Iterable[Entry]) -> int:
    """How many changes ``entries`` hold: one per entry, one per message of a ``SENT`` or a
    ``PUTS`` and per number of a ``DELS``. What a committer counts toward its next checkpoint
    (a log's replay work grows with changes, and one such entry may hold a whole batch's)."""
    return sum(
        len(e[3][0]) if e[0] in _BATCHED else len(e[3]) if e[0] == DELS else 1 for e in entries
    )


def to_table(entries: Iterable[Entry]) -> pa.Table:
    """Entries as an Arrow table (payloads pickled: they hold any AMQP value).

    Long bodies are copied once, not twice: ``pickle.dumps`` copies a body into a buffer it
    grows as it goes, and Arrow copies the result again, which took 2-6 ms for 100 bodies of
    64 KiB (this machine). A PUT with a long body is pickled in pieces (``pickle_pieces``: the
    body is one of them, uncopied) and the column's data is built by joining all the pieces:
    0.9-1.35 ms against 2.7-3.5 for the whole table, alternating in one process. Short
    payloads keep ``pickle.dumps`` and Arrow's own conversion (faster for them)."""
    ops: list[int] = []
    stores: list[int] = []
    seqs: list[int] = []
    payloads: list[bytes | PickledPieces] = []
    long = False
    for op, store, seq, payload in entries:
        ops.append(op)
        stores.append(store)
        seqs.append(seq)
        if op in _BATCHED or (
            op == PUT and payload[_BODY].__class__ is bytes and len(payload[_BODY]) >= _LONG_BODY
        ):
            payloads.append(pickle_pieces(payload))
            long = True
        else:
            payloads.append(pickle.dumps(payload, protocol=5))
    column: Any = _joined(payloads) if long else pa.array(payloads, _BINARY)
    if isinstance(column, list):  # past 32-bit offsets: Arrow's conversion chunks it
        return pa.table([ops, stores, seqs, column], schema=SCHEMA)
    # Built from buffers: ``pa.table`` converting Python lists took 14.6 us for a one-row
    # flush, this 8 (and a flush of one message of 64 KiB builds two tables).
    n = len(ops)
    return pa.Table.from_arrays(
        [
            pa.Array.from_buffers(_INT8, n, [None, pa.py_buffer(array.array("b", ops))]),
            pa.Array.from_buffers(_INT8, n, [None, pa.py_buffer(array.array("b", stores))]),
            pa.Array.from_buffers(_INT64, n, [None, pa.py_buffer(array.array("q", seqs))]),
            column,
        ],
        schema=SCHEMA,
    )


_INT8, _INT64, _BINARY = pa.int8(), pa.int64(), pa.binary()


def _joined(payloads: list[bytes | PickledPieces]) -> pa.Array | list[bytes]:
    """A binary column of ``payloads`` (each pickled whole, or in pieces) made by one join."""
    offsets = array.array("i", [0])
    parts: list[bytes] = []
    end = 0
    for payload in payloads:
        if isinstance(payload, PickledPieces):
            for piece in payload:
                end += len(piece)
            parts.extend(payload)
        else:
            end += len(payload)
            parts.append(payload)
        offsets.append(end)
    if end > _MAX_OFFSET:  # past a 32-bit offset: Arrow's conversion splits it in chunks
        return [b"".join(p) if isinstance(p, PickledPieces) else p for p in payloads]
    data = b"".join(parts)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(_BINARY, len(payloads), buffers)


def from_table(table: pa.Table) -> list[Entry]:
    cols = table.to_pydict()
    return [
        (op, store, seq, pickle.loads(payload))
        for op, store, seq, payload in zip(
            cols["op"], cols["store"], cols["seq"], cols["payload"], strict=True
        )
    ]


class ReplayedState:
    """What replaying a journal yields: both stores (in sequence order), dedup ids, next seq."""

    def __init__(self) -> None:
        self.main: dict[int, MessageRecord] = {}
        self.dead_letter: dict[int, MessageRecord] = {}
        self.dedup: dict[DedupId, tuple[float, int]] = {}
        self.next_seq = 0
        self.properties: Any = None
        self.sessions: dict[str, tuple[bytes, float]] = {}  # session id -> (state, updated)
        self.slots: tuple[frozenset[int] | None, bool] | None = None  # (owned, retiring)
        self.aliases: dict[int, int] = {}  # old sequence number -> new, for moved messages
        self.adopted: set[str] = set()
        self.dedup_slots: dict[DedupId, int] = {}
        self.outbox: dict[str, tuple[int, Any]] = {}  # move id -> (target, bundle)
        # deferred or scheduled message's number -> the partition a move finished since the
        # checkpoint took it to (``migration.moved``: a lookup racing the move and a restart)
        self.moved_out: dict[int, int] = {}
        self.prepared: dict[str, tuple[Any, ...]] = {}  # transaction id -> logged share
        self.delivered: dict[str, int] = {}  # router source key -> last delivery applied

    def sorted(self) -> ReplayedState:
        self.main = dict(sorted(self.main.items()))
        self.dead_letter = dict(sorted(self.dead_letter.items()))
        self.dedup = dict(sorted(self.dedup.items(), key=lambda kv: kv[1][0]))
        return self


def replay(entries: Iterable[Entry], state: ReplayedState | None = None) -> ReplayedState:
    """Apply entries in order (onto ``state`` if given)."""
    st = state or ReplayedState()
    stores = (st.main, st.dead_letter)
    for op, store, seq, payload in entries:
        if op == PUT:
            stores[store][seq] = MessageRecord(*payload)
            st.next_seq = max(st.next_seq, seq + 1)
        elif op == PUTS:
            target = stores[store]
            numbers, rows = payload
            for number, row in zip(numbers, rows, strict=True):
                message = MessageRecord(*row)
                message.lock_token, message.locked_until = None, 0.0
                target[number] = message
            if numbers:
                st.next_seq = max(st.next_seq, max(numbers) + 1)
        elif op == DELS:
            pop = stores[store].pop
            for number in payload:
                pop(number, None)
        elif op == DEL:
            stores[store].pop(seq, None)
        elif op == UPD:
            rec = stores[store].get(seq)
            if rec is not None:
                rec.delivery_count, rec.state, rec.application_properties = payload
        elif op == MOVE:
            moved = st.main.pop(seq, None) or st.dead_letter.get(seq)
            if moved is not None:
                (
                    moved.delivery_count,
                    moved.application_properties,
                    moved.dead_letter_reason,
                    moved.dead_letter_error_description,
                ) = payload
                moved.state = ACTIVE
                st.dead_letter[seq] = moved
        elif op == DEDUP:
            message_id, accepted_at = payload[:2]
            st.dedup[message_id] = (accepted_at, seq)
            if len(payload) > 2:
                st.dedup_slots[message_id] = payload[2]
        elif op == NEXT:
            st.next_seq = max(st.next_seq, seq)
        elif op == PROPS:
            st.properties = payload
        elif op == SLOTS:
            st.slots = payload
        elif op == ALIAS:
            st.aliases[payload] = seq
        elif op == ADOPTED:
            st.adopted.add(payload)
        elif op == OUTBOX:
            move_id, target, bundle = payload
            st.outbox[move_id] = (target, bundle)
        elif op == OUTBOX_DONE:
            done = st.outbox.pop(payload, None)
            if done is not None:
                to, bundle = done
                st.moved_out.update(dict.fromkeys(bundle.addressed, to))
        elif op == TXN_PREPARE:
            txn_id, share = payload
            st.prepared[txn_id] = share
        elif op == TXN_COMMIT:
            _replay_commit(st, payload)
        elif op == TXN_END:
            st.prepared.pop(payload, None)
        elif op == SENT:
            rows, now, default_ttl, session_queue, dedup = payload
            _store_sent(st, rows, seq, now, default_ttl, session_queue, dedup)
        elif op == DELIVERED:
            st.delivered[payload] = max(seq, st.delivered.get(payload, -1))
        elif op == SESSION:
            session_id, data, updated = payload
            if data is None:
                st.sessions.pop(session_id, None)
            else:
                st.sessions[session_id] = (data, updated)
    return st


def _replay_commit(st: ReplayedState, payload: tuple[Any, ...]) -> None:
    """Store a committed share's sends (see ``TXN_COMMIT``) as ``PUT`` and ``DEDUP`` entries
    would have: the same records, numbers and duplicate-detection ids."""
    txn_id, now, first, count, dropped, default_ttl, session_queue, dedup = payload
    st.next_seq = max(st.next_seq, first + count)
    share = st.prepared.pop(txn_id, None)
    if share is None:
        return  # replayed onto a checkpoint taken after the commit: it holds the messages
    skip = set(dropped)
    rows = [row for i, row in enumerate(share[0]) if i not in skip]
    _store_sent(st, rows, first, now, default_ttl, session_queue, dedup)


def _store_sent(
    st: ReplayedState,
    rows: Iterable[tuple[Any, ...]],
    first: int,
    now: float,
    default_ttl: float,
    session_queue: bool,
    dedup: bool,
) -> None:
    """Store ``rows`` (messages as they arrived) as the partition stored them at ``now``:
    numbered consecutively from ``first``, stamped, with their duplicate-detection ids."""
    seq = first
    main = st.main
    for row in rows:
        rec = MessageRecord(*row)
        stamp_accepted(rec, seq, now, default_ttl, session_queue)
        main[seq] = rec
        if dedup and (ident := dedup_id(rec)) is not None:
            st.dedup[ident] = (now, seq)
            st.dedup_slots[ident] = dedup_slot(rec)
        seq += 1
    st.next_seq = max(st.next_seq, seq)
