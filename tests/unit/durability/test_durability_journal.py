"""The partition journal: what each entry does on replay, idempotence, and the Arrow round trip."""

from __future__ import annotations

import dataclasses
import pickle
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pytest
from durability_helpers import record
from hypothesis import given
from hypothesis import strategies as st

from raybus._core import journal
from raybus._core.journal import (
    DEDUP,
    DEL,
    DELS,
    MAIN,
    MOVE,
    NEXT,
    PROPS,
    PUT,
    PUTS,
    SENT,
    SUB_DLQ,
    UPD,
    ReplayedState,
    changes,
    from_table,
    put_payload,
    replay,
    to_table,
)
from raybus._core.partition import (
    COMPLETE,
    DEAD_LETTER,
    DEFER,
    SEQUENCE_BITS,
    Partition,
    SettleOp,
)
from raybus._core.record import ACTIVE, DEFERRED, SCHEDULED, MessageRecord, to_wire
from raybus._models import QueueProperties
from raybus.testing import FakeClock


def stored(seq: int, **fields: Any) -> tuple[Any, ...]:
    """A PUT payload for a record that the broker accepted as ``seq``."""
    rec = record(**fields)
    rec.sequence_number = rec.enqueued_sequence_number = seq
    rec.enqueued_time = 1_800_000_000.0
    return put_payload(rec)


def flat(state: ReplayedState) -> tuple[Any, ...]:
    """A replayed state as plain comparable values."""
    state.sorted()
    return (
        {seq: to_wire([rec])[0] for seq, rec in state.main.items()},
        {seq: to_wire([rec])[0] for seq, rec in state.dead_letter.items()},
        dict(state.dedup),
        state.next_seq,
        state.properties,
    )


# ---------------------------------------------------------------- one entry at a time


def test_put_stores_the_record_in_its_store_and_advances_next_seq() -> None:
    st = replay([(PUT, MAIN, 7, stored(7, message_id="a")), (PUT, SUB_DLQ, 3, stored(3))])
    assert list(st.main) == [7]
    assert list(st.dead_letter) == [3]
    assert isinstance(st.main[7], MessageRecord)
    assert st.main[7].message_id == "a"
    assert st.main[7].sequence_number == 7
    assert st.next_seq == 8  # the highest PUT + 1, whatever the order


def test_put_payload_drops_the_lock() -> None:
    rec = record(message_id="a")
    rec.sequence_number = 1
    rec.lock_token = str(uuid.uuid4())
    rec.locked_until = 1_800_000_030.0
    rec.delivery_count = 2
    st = replay([(PUT, MAIN, 1, put_payload(rec))])
    assert st.main[1].lock_token is None
    assert st.main[1].locked_until == 0.0
    assert st.main[1].delivery_count == 2  # everything else is kept
    assert rec.lock_token is not None  # the live record is untouched


def test_del_removes_from_its_store_only_and_ignores_missing() -> None:
    st = replay(
        [
            (PUT, MAIN, 1, stored(1)),
            (PUT, SUB_DLQ, 2, stored(2)),
            (DEL, SUB_DLQ, 1, None),  # wrong store: nothing happens
            (DEL, MAIN, 2, None),
            (DEL, MAIN, 99, None),  # never stored
        ]
    )
    assert list(st.main) == [1]
    assert list(st.dead_letter) == [2]
    st = replay([(DEL, MAIN, 1, None)], st)
    assert st.main == {}
    assert st.next_seq == 3  # a deletion never lowers the next sequence number


def test_upd_sets_delivery_count_state_and_properties_and_ignores_missing() -> None:
    st = replay(
        [
            (PUT, MAIN, 1, stored(1, application_properties={"a": 1})),
            (UPD, MAIN, 1, (2, DEFERRED, {"a": 1, "b": "x"})),
            (UPD, MAIN, 5, (9, ACTIVE, None)),  # not stored: ignored
            (UPD, SUB_DLQ, 1, (9, ACTIVE, None)),  # not in that store: ignored
        ]
    )
    rec = st.main[1]
    assert (rec.delivery_count, rec.state, rec.application_properties) == (
        2,
        DEFERRED,
        {"a": 1, "b": "x"},
    )
    assert 5 not in st.main and st.dead_letter == {}


def test_move_dead_letters_with_reason_and_makes_the_message_active() -> None:
    st = replay(
        [
            (PUT, MAIN, 4, stored(4, message_id="m")),
            (UPD, MAIN, 4, (1, DEFERRED, None)),
            (MOVE, SUB_DLQ, 4, (3, {"why": "x"}, "Poison", "it kept failing")),
        ]
    )
    assert st.main == {}
    rec = st.dead_letter[4]
    assert rec.message_id == "m"
    assert rec.delivery_count == 3
    assert rec.application_properties == {"why": "x"}
    assert rec.dead_letter_reason == "Poison"
    assert rec.dead_letter_error_description == "it kept failing"
    assert rec.state == ACTIVE  # a deferred message dead-letters as active


def test_move_is_reapplied_to_an_already_moved_message_and_ignores_missing() -> None:
    st = replay(
        [
            (PUT, MAIN, 4, stored(4)),
            (MOVE, SUB_DLQ, 4, (1, None, "r1", None)),
            (MOVE, SUB_DLQ, 4, (2, None, "r2", "d2")),
            (MOVE, SUB_DLQ, 8, (1, None, "r", None)),  # never stored
        ]
    )
    assert list(st.dead_letter) == [4]
    rec = st.dead_letter[4]
    assert (rec.delivery_count, rec.dead_letter_reason, rec.dead_letter_error_description) == (
        2,
        "r2",
        "d2",
    )
    assert 8 not in st.dead_letter


def test_dedup_remembers_the_id_with_its_time_and_sequence_number() -> None:
    st = replay(
        [
            (DEDUP, MAIN, 3, ("id-b", 20.0)),
            (DEDUP, MAIN, 1, ("id-a", 10.0)),
            (DEDUP, MAIN, 5, ("id-b", 30.0)),  # re-accepted after its window: newest wins
        ]
    )
    assert st.dedup == {"id-b": (30.0, 5), "id-a": (10.0, 1)}
    assert list(st.sorted().dedup) == ["id-a", "id-b"]  # oldest first, as tick() expects
    assert st.main == {}  # remembering an id stores no message


def test_next_only_raises_the_next_sequence_number() -> None:
    st = replay([(NEXT, MAIN, 40, None), (PUT, MAIN, 5, stored(5)), (NEXT, MAIN, 12, None)])
    assert st.next_seq == 40
    st = replay([(PUT, MAIN, 60, stored(60))], st)
    assert st.next_seq == 61


def test_props_keeps_the_latest_queue_properties() -> None:
    first = QueueProperties(name="orders")
    second = dataclasses.replace(first, lock_duration=timedelta(seconds=45), user_metadata="v2")
    assert replay([]).properties is None
    st = replay([(PROPS, MAIN, 0, first), (PROPS, MAIN, 0, second)])
    assert st.properties == second


def arrived(**fields: Any) -> tuple[Any, ...]:
    """A row as a sender's call carries it (nothing of the broker's set)."""
    return to_wire([record(**fields)])[0]


def test_sent_stamps_its_rows_from_its_first_number_with_their_ids() -> None:
    rows = [arrived(message_id="a"), arrived(message_id="b", time_to_live=30.0), arrived()]
    st = replay([(SENT, MAIN, 7, (rows, 100.0, 60.0, False, True))])
    assert list(st.main) == [7, 8, 9]
    a, b, c = st.main.values()
    assert (a.message_id, a.sequence_number, a.enqueued_sequence_number) == ("a", 7, 7)
    assert (a.enqueued_time, a.time_to_live, a.expires_at) == (100.0, 60.0, 160.0)
    assert (b.time_to_live, b.expires_at) == (30.0, 130.0)  # the shorter of the two
    assert c.message_id is None and c.sequence_number == 9
    assert st.dedup == {"a": (100.0, 7), "b": (100.0, 8)}
    assert st.next_seq == 10
    # Without the duplicate detection flag no id is remembered.
    assert replay([(SENT, MAIN, 7, (rows, 100.0, 60.0, False, False))]).dedup == {}


def test_sent_dead_letters_nothing_itself_its_move_entries_do() -> None:
    """A session queue's message without a session id is stored, then moved by the MOVE
    the partition journals after the SENT."""
    rows = [arrived(message_id="s", session_id="x"), arrived(message_id="n")]
    reason = (0, None, "Session ID is null", "no session id")
    st = replay([(SENT, MAIN, 1, (rows, 5.0, 60.0, True, False)), (MOVE, SUB_DLQ, 2, reason)])
    assert list(st.main) == [1] and list(st.dead_letter) == [2]
    moved = st.dead_letter[2]
    assert moved.dead_letter_reason == "Session ID is null"
    assert moved.expires_at == float("inf")  # stamped as dead on arrival: it never expires
    assert st.main[1].expires_at == 65.0


def test_a_send_journals_one_sent_entry_that_replays_to_what_the_partition_stored() -> None:
    clock = FakeClock()
    props = QueueProperties(
        name="orders",
        requires_duplicate_detection=True,
        default_message_time_to_live=timedelta(minutes=5),
    )
    p = Partition(props, clock, 0)
    p.enable_journal()
    batch = [
        record(message_id="a"),
        record(message_id="a"),  # a duplicate within the batch: dropped
        record(message_id="later", scheduled_enqueue_time=clock.now() + 60),
        record(message_id="short", time_to_live=10.0, application_properties={"k": 1}),
        record(body=b"no id"),
    ]
    numbers = p.send(batch)
    entries, last = p.take_journal()
    p.visible_seq = last  # durable: peek shows them
    assert [e[0] for e in entries] == [SENT]
    assert changes(entries) == 4
    st = replay(from_table(to_table(entries)))
    stored_now = {r.sequence_number: to_wire([r])[0] for r in p.peek(0, 100)}
    assert {seq: to_wire([r])[0] for seq, r in st.main.items()} == stored_now
    assert st.dedup == dict(p._dedup)
    assert st.next_seq == last + 1
    assert numbers[1] == numbers[0]  # the duplicate reports the original's number


def test_a_body_shared_by_the_messages_of_a_send_is_logged_once() -> None:
    p = Partition(QueueProperties(name="orders"), FakeClock(), 0)
    p.enable_journal()
    body = bytes(range(256)) * 40  # 10 KiB, one object for all of them
    p.send([record(body=body, message_id=str(i)) for i in range(100)])
    entries, _ = p.take_journal()
    table = to_table(entries)
    assert table.nbytes < 2 * len(body) + 100 * 200  # one body, and a small row each
    st = replay(from_table(table))
    assert len(st.main) == 100
    assert all(rec.body == body for rec in st.main.values())


def test_dels_removes_each_number_from_its_store_only() -> None:
    st = replay(
        [
            (PUT, MAIN, 1, stored(1)),
            (PUT, MAIN, 2, stored(2)),
            (PUT, MAIN, 3, stored(3)),
            (PUT, SUB_DLQ, 4, stored(4)),
            (DELS, MAIN, 0, [3, 1, 4, 99]),  # 4 is in the other store, 99 nowhere
        ]
    )
    assert list(st.main) == [2]
    assert list(st.dead_letter) == [4]
    assert st.next_seq == 5


def test_completions_of_a_batch_journal_one_dels_entry_counted_per_message() -> None:
    p = Partition(QueueProperties(name="orders"), FakeClock(), 0)
    p.enable_journal()
    p.send([record(message_id=str(i)) for i in range(4)])
    p.visible_seq = p.take_journal()[1]
    locked = p.receive(4)
    assert p.journal_size() == 0  # locks are not journaled
    p.settle([SettleOp(COMPLETE, r.lock_token) for r in locked[:3]])
    assert p.journal_size() == 3  # three changes, though one entry
    p.settle([SettleOp(DEFER, locked[3].lock_token)])
    entries, _ = p.take_journal()
    assert [(e[0], e[3]) for e in entries] == [
        (DELS, [r.sequence_number for r in locked[:3]]),
        (UPD, (0, DEFERRED, None)),
    ]
    assert p.journal_size() == 0
    assert changes(entries) == 4


def test_deletions_from_the_two_stores_keep_entries_of_their_own() -> None:
    p = Partition(QueueProperties(name="orders"), FakeClock(), 0)
    p.enable_journal()
    p.send([record(message_id="a"), record(message_id="b")])
    p.visible_seq = p.take_journal()[1]
    a, b = p.receive(2)
    p.settle([SettleOp(DEAD_LETTER, b.lock_token)])
    p.take_journal()
    (dead,) = p.receive(1, dead_letter=True)
    p.settle([SettleOp(COMPLETE, a.lock_token), SettleOp(COMPLETE, dead.lock_token)])
    entries, _ = p.take_journal()
    assert [(e[0], e[1], e[3]) for e in entries] == [
        (DELS, MAIN, [a.sequence_number]),
        (DELS, SUB_DLQ, [b.sequence_number]),
    ]


def test_puts_stores_each_row_under_its_number_without_its_lock() -> None:
    locked = record(message_id="a")
    locked.sequence_number = 5
    locked.lock_token, locked.locked_until, locked.delivery_count = "tok", 9.0, 2
    rows = to_wire([locked, record(message_id="b")])
    st = replay([(PUTS, SUB_DLQ, 0, ([5, 3], rows))])
    assert list(st.dead_letter) == [5, 3] and st.main == {}
    a = st.dead_letter[5]
    assert (a.message_id, a.lock_token, a.locked_until, a.delivery_count) == ("a", None, 0.0, 2)
    assert st.dead_letter[3].message_id == "b"
    assert st.next_seq == 6
    assert locked.lock_token == "tok"  # the live record is untouched
    assert replay([(PUTS, MAIN, 0, ([], []))]).next_seq == 0


@pytest.mark.parametrize("limit", ["count", "bytes"])
def test_a_checkpoint_holds_its_messages_in_puts_entries_of_bounded_size(
    limit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if limit == "count":
        monkeypatch.setattr(journal, "PUTS_MAX", 3)
    else:
        monkeypatch.setattr(journal, "PUTS_MAX_BYTES", 3 * record(message_id="0").size)
    p = Partition(QueueProperties(name="orders"), FakeClock(), 0)
    p.enable_journal()
    p.send([record(message_id=str(i)) for i in range(7)])
    p.visible_seq = p.take_journal()[1]
    p.receive(2)  # locked ones are captured without their locks
    puts = [e for e in p.snapshot_entries() if e[0] == PUTS]
    assert [len(e[3][0]) for e in puts] == [3, 3, 1]
    assert changes(puts) == 7
    st = replay(from_table(to_table(p.snapshot_entries())))
    assert [r.message_id for r in st.main.values()] == [str(i) for i in range(7)]
    assert all(r.lock_token is None for r in st.main.values())


def test_changes_count_each_message_of_a_sent_and_each_number_of_a_dels() -> None:
    rows = [arrived(), arrived(), arrived()]
    entries = [(SENT, MAIN, 1, (rows, 1.0, 60.0, False, False)), (DEL, MAIN, 1, None)]
    assert changes(entries) == 4
    assert changes([*entries, (DELS, MAIN, 0, [2, 3])]) == 6
    assert changes([]) == 0


def test_sorted_orders_both_stores_by_sequence_number() -> None:
    st = replay(
        [
            (PUT, MAIN, 9, stored(9)),
            (PUT, MAIN, 2, stored(2)),
            (PUT, SUB_DLQ, 7, stored(7)),
            (PUT, SUB_DLQ, 1, stored(1)),
        ]
    ).sorted()
    assert list(st.main) == [2, 9]
    assert list(st.dead_letter) == [1, 7]


def test_replay_onto_a_state_continues_it() -> None:
    entries = [
        (PUT, MAIN, 1, stored(1)),
        (PUT, MAIN, 2, stored(2)),
        (UPD, MAIN, 2, (1, ACTIVE, None)),
        (MOVE, SUB_DLQ, 1, (0, None, "r", None)),
        (DEL, MAIN, 2, None),
    ]
    for cut in range(len(entries) + 1):
        split = replay(entries[cut:], replay(entries[:cut]))
        assert flat(split) == flat(replay(entries))


# ---------------------------------------------------------------- idempotence


HISTORY: list[journal.Entry] = [
    (PROPS, MAIN, 0, QueueProperties(name="orders")),
    (PUT, MAIN, 1, stored(1, message_id="a")),
    (DEDUP, MAIN, 1, ("a", 1.0)),
    (PUT, MAIN, 2, stored(2, message_id="b")),
    (DEDUP, MAIN, 2, ("b", 1.0)),
    (PUT, MAIN, 3, stored(3, message_id="c", scheduled_enqueue_time=9e9)),
    (UPD, MAIN, 1, (1, ACTIVE, {"try": 1})),
    (UPD, MAIN, 2, (0, DEFERRED, None)),
    (MOVE, SUB_DLQ, 1, (2, {"try": 2}, "MaxDeliveryCountExceeded", "too many")),
    (UPD, SUB_DLQ, 1, (3, ACTIVE, {"try": 2})),
    (DEL, MAIN, 3, None),  # a scheduled message turning active gets a new number
    (PUT, MAIN, 4, stored(4, message_id="c")),
    (DEL, MAIN, 2, None),
    (PUT, MAIN, 5, stored(5, message_id="d")),
    (MOVE, SUB_DLQ, 5, (0, None, "app", "by hand")),
    (DEL, SUB_DLQ, 5, None),
    (PROPS, MAIN, 0, QueueProperties(name="orders", max_delivery_count=4)),
    (SENT, MAIN, 6, ([arrived(message_id="e"), arrived(message_id="f")], 2.0, 60.0, False, True)),
    (UPD, MAIN, 7, (1, ACTIVE, None)),
    (DELS, MAIN, 0, [6, 4]),
]


def test_replaying_a_journal_twice_equals_replaying_it_once() -> None:
    once = flat(replay(HISTORY))
    assert flat(replay(HISTORY + HISTORY)) == once
    assert flat(replay(HISTORY, replay(HISTORY))) == once


@pytest.mark.parametrize("overlap_from", range(len(HISTORY) + 1))
def test_a_checkpoint_followed_by_entries_it_already_holds_is_exact(overlap_from: int) -> None:
    """A checkpoint taken while entries were in flight, then those entries again."""
    whole = flat(replay(HISTORY))
    for taken_at in range(overlap_from, len(HISTORY) + 1):
        checkpoint = replay(HISTORY[:taken_at])
        # As a checkpoint stores it: every message and id, then the next sequence number.
        snapshot = [(PUT, MAIN, s, put_payload(r)) for s, r in checkpoint.main.items()]
        snapshot += [(PUT, SUB_DLQ, s, put_payload(r)) for s, r in checkpoint.dead_letter.items()]
        snapshot += [(DEDUP, MAIN, seq, (mid, at)) for mid, (at, seq) in checkpoint.dedup.items()]
        snapshot += [(NEXT, MAIN, checkpoint.next_seq, None)]
        snapshot += [(PROPS, MAIN, 0, checkpoint.properties)]
        assert flat(replay(HISTORY[overlap_from:], replay(snapshot))) == whole


# ---------------------------------------------------------------- Arrow round trip


AMQP_BODIES = [
    None,
    b"",
    b"\x00\xff" * 1000,
    "text \u00e9\u4e2d",
    0,
    -(2**63),
    2**64 - 1,
    1.5,
    float("inf"),
    True,
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=timezone.utc),
    datetime(2030, 1, 2, 3, 4, 5),
    [1, "two", b"three", [4.0, {"five": None}]],
    {"k": [uuid.UUID(int=7), {"nested": b"bytes"}], "n": {"deep": [[], {}]}},
]


def test_to_table_has_the_storage_schema() -> None:
    t = to_table(HISTORY)
    assert t.schema == journal.SCHEMA
    assert t.num_rows == len(HISTORY)
    assert to_table([]).num_rows == 0
    assert from_table(to_table([])) == []


def test_round_trip_keeps_every_entry_and_every_amqp_value() -> None:
    entries: list[journal.Entry] = []
    for i, body in enumerate(AMQP_BODIES, start=1):
        props = {"s": "v", "i": -1, "u": uuid.UUID(int=i), "b": b"x", "d": datetime(2031, 1, 1)}
        entries.append((PUT, i % 2, i, stored(i, body=body, application_properties=props)))
    entries += [
        (UPD, MAIN, 2, (3, SCHEDULED, {"when": datetime(2032, 5, 5, tzinfo=timezone.utc)})),
        (MOVE, SUB_DLQ, 3, (1, {"u": uuid.UUID(int=3)}, "reason \u2603", None)),
        (DEL, SUB_DLQ, 4, None),
        (DEDUP, MAIN, 5, ("message-id", 1_800_000_000.25)),
        (NEXT, MAIN, 2**58, None),
        (PROPS, MAIN, 0, QueueProperties(name="orders", requires_duplicate_detection=True)),
    ]
    back = from_table(to_table(entries))
    assert back == entries
    for (_, _, _, before), (_, _, _, after) in zip(entries, back, strict=True):
        assert type(after) is type(before)
    bodies = [MessageRecord(*p).body for op, _, _, p in back if op == PUT]
    assert bodies == AMQP_BODIES
    assert [type(b) for b in bodies] == [type(b) for b in AMQP_BODIES]
    aware = bodies[11]
    assert aware.tzinfo is not None and aware.utcoffset() == timedelta(0)


def test_round_trip_then_replay_equals_replay() -> None:
    assert flat(replay(from_table(to_table(HISTORY)))) == flat(replay(HISTORY))


def test_sequence_numbers_of_the_highest_partition_fit_the_log() -> None:
    """The partition id sits above bit 48; the largest partition count is 1024."""
    seq = (1023 << SEQUENCE_BITS) + 123_456_789
    entries = [(PUT, MAIN, seq, stored(seq)), (NEXT, MAIN, seq + 1, None)]
    assert from_table(to_table(entries)) == entries
    assert replay(from_table(to_table(entries))).next_seq == seq + 1


# ---------------------------------------------------------------- long bodies


def _long_mix() -> list[journal.Entry]:
    """PUTs with long bodies (pickled in pieces) among short ones, as one flush holds them."""
    long = journal._LONG_BODY
    return [
        (PUT, MAIN, 1, stored(1, body=bytes(range(256)) * (long // 256 + 1))),
        (DEL, MAIN, 7, None),
        (PUT, MAIN, 2, stored(2, body=b"short", application_properties={"k": 1})),
        (PUT, SUB_DLQ, 3, stored(3, body=b"\x00" * long, message_id="m" * 128)),
        (PUT, MAIN, 4, stored(4, body=bytearray(b"b" * long))),  # not bytes: pickled whole
        (UPD, MAIN, 2, (3, ACTIVE, None)),
        (PUT, MAIN, 5, stored(5, body=b"\xa5" * (4 * long))),
    ]


def plain_table(entries: list[journal.Entry]) -> pa.Table:
    """The journal's table as Arrow's conversion of Python lists makes it, each payload
    pickled whole: what ``to_table`` must equal."""
    return pa.table(
        [
            [e[0] for e in entries],
            [e[1] for e in entries],
            [e[2] for e in entries],
            [pickle.dumps(e[3], protocol=5) for e in entries],
        ],
        schema=journal.SCHEMA,
    )


def test_long_bodies_make_the_same_table_as_pickling_each_payload_whole() -> None:
    entries = _long_mix()
    whole = plain_table(entries)
    table = to_table(entries)
    assert table.equals(whole)
    assert from_table(table) == entries


def test_long_bodies_past_32_bit_offsets_are_left_to_arrow_to_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flush of more than 2 GiB cannot be one binary array: Arrow's own conversion chunks
    it (here the limit is lowered to a few bodies)."""
    monkeypatch.setattr(journal, "_MAX_OFFSET", 2 * journal._LONG_BODY)
    entries = _long_mix()
    long = journal._LONG_BODY
    payloads = [
        journal.pickle_pieces(p)
        if op == PUT and type(p[0]) is bytes and len(p[0]) >= long
        else pickle.dumps(p, protocol=5)
        for op, _, _, p in entries
    ]
    assert journal._joined(payloads) == [pickle.dumps(p, protocol=5) for *_, p in entries]
    table = to_table(entries)
    assert from_table(table) == entries
    assert flat(replay(from_table(table))) == flat(replay(entries))


@given(
    st.lists(
        st.tuples(
            st.sampled_from([DEL, DELS, UPD, NEXT, SENT]),
            st.sampled_from([MAIN, SUB_DLQ]),
            st.integers(min_value=-(2**63), max_value=2**63 - 1),
            st.binary(max_size=40),
        ),
        max_size=30,
    ),
    st.booleans(),
)
def test_to_table_holds_exactly_what_arrow_converting_the_lists_would(
    rows: list[tuple[int, int, int, bytes]], long: bool
) -> None:
    # The table is built from buffers (faster than pa.table on Python lists): the same
    # columns, values and schema, for short payloads and for a long body's pieces alike.
    entries: list[journal.Entry] = [(op, store, seq, payload) for op, store, seq, payload in rows]
    if long:
        body_row = to_wire([record(b"x" * (70 << 10), message_id="long")])
        entries.append((SENT, MAIN, 7, (body_row, 1.0, None, False, False)))
    table = journal.to_table(entries)
    plain = plain_table(entries)
    assert table.schema == plain.schema
    assert table.column("op").to_pylist() == plain.column("op").to_pylist()
    assert table.column("store").to_pylist() == plain.column("store").to_pylist()
    assert table.column("seq").to_pylist() == plain.column("seq").to_pylist()
    assert journal.from_table(table) == journal.from_table(plain)
