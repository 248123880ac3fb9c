"""How a committed transaction is journaled (``TXN_COMMIT``): the sends' bodies are written
once (with the prepare), and replay rebuilds exactly the messages the commit stored.

Pure unit tests on a ``FakeClock``, no Ray. The reference for "exactly" is a checkpoint of the
live partition (``snapshot_entries``: one ``PUT`` per message, what commit used to journal),
replayed through the Arrow table format like the log.
"""

from __future__ import annotations

from typing import Any

import pytest
import transactions_core_support
from transactions_core_support import (
    all_ids,
    durable,
    flush,
    op,
    prepare,
    props,
    rebuilt,
    rec,
    received,
    through_storage,
)

from raybus._core import journal, migration
from raybus._core import transactions as txn
from raybus._core.partition import COMPLETE, SESSION_ID_IS_NULL, Partition
from raybus._core.record import ARRIVE_DEAD_LETTERED, MessageRecord
from raybus._core.slots import dedup_id, slot_of
from raybus.testing import FakeClock

counted = transactions_core_support.counted
q = transactions_core_support.q
dq = transactions_core_support.dq
sq = transactions_core_support.sq

KIB = b"x" * 1024


def replayed(entries: list[journal.Entry]) -> tuple[Any, ...]:
    """What a log replays to: both stores (records without locks), dedup ids and their
    slots, the next sequence number, and the transactions still prepared."""
    st = journal.replay(through_storage(entries)).sorted()
    return (
        {seq: journal.put_payload(r) for seq, r in st.main.items()},
        {seq: journal.put_payload(r) for seq, r in st.dead_letter.items()},
        st.dedup,
        st.dedup_slots,
        st.next_seq,
        sorted(st.prepared),
    )


def live(p: Partition) -> tuple[Any, ...]:
    """The same for the partition as it is now (through a checkpoint of it)."""
    return replayed(p.snapshot_entries())


def old_format(p: Partition, first: int, log: list[journal.Entry]) -> list[journal.Entry]:
    """``log`` as commit journaled it before ``TXN_COMMIT``: the messages stored from number
    ``first`` on as ``PUT`` and ``DEDUP`` entries in place of each ``TXN_COMMIT``."""
    puts: list[journal.Entry] = []
    for seq in range(first, p._next_seq):
        rec_ = p._main.messages.get(seq) or p._dlq.messages[seq]
        puts.append((journal.PUT, journal.MAIN, seq, journal.put_payload(rec_)))
        ident = dedup_id(rec_)
        if ident in p._dedup:
            at, _ = p._dedup[ident]
            slot = p._dedup_slots[ident]
            puts.append((journal.DEDUP, journal.MAIN, seq, (ident, at, slot)))
    out: list[journal.Entry] = []
    for entry in log:
        out.extend(puts if entry[0] == journal.TXN_COMMIT else [entry])
    return out


def mixed_sends(clock: FakeClock) -> list[MessageRecord]:
    """One of each way a send is stored: active, with a time to live, scheduled, marked for
    the dead-letter sub-queue by a router, keyed, and two with the same id."""
    return [
        rec("plain", body=KIB),
        rec("ttl", body=KIB, time_to_live=60.0),
        rec("later", body=KIB, scheduled_enqueue_time=clock.now() + 100),
        rec(
            "bad-rule",
            body=KIB,
            state=ARRIVE_DEAD_LETTERED,
            dead_letter_reason="RuleEvaluationFailed",
            dead_letter_error_description="division by zero",
        ),
        rec("keyed", body=KIB, partition_key="k1"),
        rec("twice", body=KIB),
        rec("twice", body=b"second copy"),
        rec(None, body=KIB),
    ]


# ================================================================ replay after commit


@pytest.mark.parametrize("kind", ["q", "dq", "sq"])
def test_commit_then_replay_gives_the_messages_numbers_and_dedup_ids_the_commit_stored(
    kind, request, clock
):
    p: Partition = request.getfixturevalue(kind)
    log = durable(p)
    m = received(p, "settled", log=log)["settled"] if kind != "sq" else None
    p.send([rec("before", body=b"b", session_id="s")])
    sends = mixed_sends(clock)
    if kind == "sq":
        for r in sends[:-1]:
            # The last one has none: a session queue dead-letters it.
            r.session_id = r.partition_key or "s"
    prepare(p, "t", sends, [op(COMPLETE, m.lock_token)] if m else [])
    flush(p, log)
    first = p._next_seq
    clock.advance(5)
    assert txn.commit(p, "t")
    flush(p, log)
    assert journal.TXN_COMMIT in [e[0] for e in log]
    assert journal.PUT not in [e[0] for e in log[[e[0] for e in log].index(journal.TXN_COMMIT) :]]
    expected = live(p)
    assert replayed(log) == expected
    assert replayed(old_format(p, first, log)) == expected  # the pre-TXN_COMMIT format
    _main, dead, dedup, _slots, next_seq, prepared = expected
    assert next_seq == p._next_seq and prepared == []
    if kind == "dq":
        # Keyed on the message id and the key that placed it (session id, partition key).
        ids = ["bad-rule", "later", "plain", "settled", "ttl", "twice"]
        assert sorted(dedup, key=str) == [("before", "s"), ("keyed", "k1"), *ids]
    if kind == "sq":
        assert any(r[0] == KIB and SESSION_ID_IS_NULL in r for r in dead.values())
    assert any("RuleEvaluationFailed" in r for r in dead.values())
    r = rebuilt(p, clock, log)
    assert counted(r) == counted(p)
    assert sorted(map(str, all_ids(r))) == sorted(map(str, all_ids(p)))


def test_a_commit_after_a_restart_replays_from_the_share_logged_before_it(dq, clock):
    log = durable(dq)
    prepare(dq, "t", mixed_sends(clock))
    flush(dq, log)
    r = rebuilt(dq, clock, log)  # the share is held again, from the log
    assert txn.commit(r, "t")
    flush(r, log)
    assert replayed(log) == live(r)
    assert counted(rebuilt(r, clock, log)) == counted(r)


def test_commit_of_settlements_only_journals_no_transaction_commit_entry(q, clock):
    log = durable(q)
    m = received(q, "m", log=log)["m"]
    prepare(q, "t", [], [op(COMPLETE, m.lock_token)])
    assert txn.commit(q, "t")
    flush(q, log)
    assert journal.TXN_COMMIT not in [e[0] for e in log]
    assert replayed(log) == live(q) and all_ids(q) == []


# ================================================================ checkpoints


def test_a_checkpoint_between_prepare_and_commit_then_the_commit_replays_exactly(dq, clock):
    log = durable(dq)
    dq.send([rec("plain-1")])
    prepare(dq, "t", mixed_sends(clock))
    flush(dq, log)
    checkpoint = dq.snapshot_entries()
    clock.advance(1)
    assert txn.commit(dq, "t")
    tail: list[journal.Entry] = []
    flush(dq, tail)
    assert replayed(checkpoint + tail) == live(dq)
    # The entries before the checkpoint replayed again on top of it (in flight when it was
    # taken) change nothing.
    assert replayed(checkpoint + log + tail) == live(dq)


def test_a_checkpoint_after_commit_makes_the_commit_entry_a_no_op_that_loses_nothing(dq, clock):
    log = durable(dq)
    prepare(dq, "t", mixed_sends(clock))
    flush(dq, log)
    assert txn.commit(dq, "t")
    tail: list[journal.Entry] = []
    flush(dq, tail)
    # Settle some of the committed messages, then take the checkpoint: it holds their fate.
    got = dq.receive(2)
    dq.settle([op(COMPLETE, got[0].lock_token)])
    dq.settle([op("abandon", got[1].lock_token)])
    later: list[journal.Entry] = []
    flush(dq, later)
    checkpoint = dq.snapshot_entries()
    assert journal.TXN_PREPARE not in [e[0] for e in checkpoint]
    expected = live(dq)
    # The commit entry in flight, alone: its transaction is not prepared, nothing changes.
    commit_only = [e for e in tail if e[0] == journal.TXN_COMMIT]
    assert commit_only and replayed(checkpoint + commit_only) == expected
    # Prepare, commit and settlements all in flight: the messages are stored again, then
    # settled again, as the checkpoint holds them.
    assert replayed(checkpoint + log + tail + later) == expected
    assert got[0].message_id not in all_ids(rebuilt(dq, clock, checkpoint + commit_only))


# ================================================================ duplicates and abort


def test_a_send_duplicate_detection_drops_at_commit_is_not_replayed(dq, clock):
    log = durable(dq)
    prepare(dq, "t", [rec("a", body=b"in transaction"), rec("b"), rec("a", body=b"again")])
    dq.send([rec("a", body=b"plain")])  # the id arrives outside the transaction first
    flush(dq, log)
    assert txn.commit(dq, "t")
    flush(dq, log)
    [entry] = [e for e in log if e[0] == journal.TXN_COMMIT]
    assert entry[3][3:5] == (1, (0, 2))  # one stored, the two copies of "a" dropped
    main, _dead, dedup, _slots, next_seq, _ = replayed(log)
    assert replayed(log) == live(dq)
    assert [r[0] for r in main.values()] == [b"plain", b"payload"]
    assert dedup["a"][1] < dedup["b"][1] == next_seq - 1


def test_abort_after_prepare_replays_to_nothing_stored_and_nothing_prepared(dq, clock):
    log = durable(dq)
    prepare(dq, "t", [rec("a", body=KIB)])
    flush(dq, log)
    assert txn.abort(dq, "t")
    flush(dq, log)
    ops = [e[0] for e in log]
    assert journal.TXN_COMMIT not in ops and ops.count(journal.TXN_END) == 1
    assert replayed(log)[:4] == live(dq)[:4] == ({}, {}, {}, {})
    assert replayed(log)[5] == live(dq)[5] == []
    assert rebuilt(dq, clock, log).prepared == {}


# ================================================================ bytes journaled


def test_a_committed_share_journals_about_one_copy_of_its_bodies(q, clock):
    log = durable(q)
    sends = [rec(f"m{i}", body=bytes([i]) * 1024) for i in range(50)]
    bodies = sum(len(r.body) for r in sends)
    prepare(q, "t", sends)
    assert txn.commit(q, "t")
    flush(q, log)
    table = journal.to_table(log)
    journaled = sum(len(v) for v in table.column("payload").to_pylist())
    assert bodies <= journaled < 1.3 * bodies, (journaled, bodies)
    assert len(q._main.messages) == 50


# ================================================================ partition moves


def test_committed_messages_handed_over_to_another_partition_replay_on_both_sides(clock):
    options = {"requires_duplicate_detection": True}
    a = Partition(props(**options), clock, 0)
    a.owned = transactions_core_support.ALL
    b = Partition(props(**options), clock, 1)
    b.owned = frozenset()
    log_a, log_b = durable(a), durable(b)
    sends = [rec(f"k{i}", body=KIB, partition_key=f"key{i}") for i in range(8)]
    prepare(a, "t", sends)
    flush(a, log_a)
    assert txn.commit(a, "t")
    moving = frozenset(slot_of(f"key{i}") for i in range(0, 8, 2))
    out, pinned = migration.hand_over(a, {1: moving}, None)
    assert not pinned
    for move_id, (_target, bundle) in out.items():
        assert migration.adopt(b, move_id, bundle)
        migration.finish(a, move_id)
    flush(a, log_a)
    flush(b, log_b)
    assert replayed(log_a) == live(a)
    assert replayed(log_b) == live(b)
    assert sorted(map(str, all_ids(a) + all_ids(b))) == sorted(f"k{i}" for i in range(8))
    assert len(a.receive(transactions_core_support.EVERYTHING)) == 4


def test_rows_logged_before_a_record_gained_copy_of_replay_as_they_were(dq, clock):
    # The log keeps records as tuples of their fields; a row written before the last field
    # (copy_of) was added is one shorter and replays with its default.
    log = durable(dq)
    dq.send([rec("a", body=KIB), rec("b", body=KIB, partition_key="k")])
    flush(dq, log)
    expected = replayed(log)
    shorter = []
    for kind, store, seq, payload in log:
        if kind == journal.SENT:
            rows, *rest = payload
            payload = ([row[:-1] for row in rows], *rest)
        shorter.append((kind, store, seq, payload))
    assert any(kind == journal.SENT for kind, *_ in shorter)
    assert replayed(shorter) == expected
