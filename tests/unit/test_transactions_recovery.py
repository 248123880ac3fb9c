"""A partition's side of two-phase commit (``raybus._core.transactions``): idempotency,
duplicate detection and quota, sessions, durability and partition changes.

Pure unit tests: plain ``Partition`` objects on a ``FakeClock``, no Ray. Durability tests
collect a partition's journal into a list (what a group commit writes), pass it through the
Arrow table format and replay it into a fresh partition, as the actor does on recovery (from
the log, or from a checkpoint of ``snapshot_entries``).
"""

from __future__ import annotations

import pytest
import transactions_core_support
from transactions_core_support import (
    ALL,
    EVERYTHING,
    LOCK,
    MIB,
    all_ids,
    counted,
    durable,
    fingerprint,
    flush,
    ids_of,
    in_dlq,
    op,
    prepare,
    props,
    rebuilt,
    rec,
    received,
    stored,
    stored_size,
    through_storage,
)

from raybus._core import journal, migration
from raybus._core import transactions as txn
from raybus._core.partition import ABANDON, COMPLETE, DEAD_LETTER, Partition
from raybus._core.record import MessageRecord
from raybus._core.slots import slot_of
from raybus.exceptions import InvalidArgumentError, ServiceBusQuotaExceededError

q = transactions_core_support.q
dq = transactions_core_support.dq
sq = transactions_core_support.sq


# ================================================================ 5. idempotency


def test_a_repeated_prepare_is_a_no_op(q):
    log = durable(q)
    m = received(q, "m", log=log)["m"]
    prepare(q, "t", [rec("a")], [op(COMPLETE, m.lock_token)])
    before = fingerprint(q)
    prepare(q, "t", [rec("a")], [op(COMPLETE, m.lock_token)])  # the coordinator retried
    prepare(q, "t", [rec("zzz"), rec("yyy")])  # even with a different share
    assert fingerprint(q) == before
    flush(q, log)
    [logged] = [e for e in log if e[0] == journal.TXN_PREPARE]
    assert logged[3][0] == "t"
    assert txn.commit(q, "t")
    assert all_ids(q) == ["a"]


def test_commit_or_abort_of_an_unknown_transaction_returns_false_and_changes_nothing(q):
    log = durable(q)
    m = received(q, "m", log=log)["m"]
    prepare(q, "t", [rec("a")], [op(COMPLETE, m.lock_token)])
    before = fingerprint(q)
    assert txn.commit(q, "nope") is False
    assert txn.abort(q, "nope") is False
    assert fingerprint(q) == before
    flush(q, log)
    assert [e[0] for e in log].count(journal.TXN_END) == 0


def test_commit_and_abort_after_the_end_return_false(q):
    prepare(q, "c", [rec("a")])
    prepare(q, "r", [rec("b")])
    assert txn.commit(q, "c") is True
    assert txn.abort(q, "r") is True
    before = fingerprint(q)
    assert txn.commit(q, "c") is False
    assert txn.abort(q, "c") is False
    assert txn.commit(q, "r") is False
    assert txn.abort(q, "r") is False
    assert fingerprint(q) == before
    assert all_ids(q) == ["a"]


# ================================================================ 6. duplicate detection, quota


def test_a_transactional_send_whose_id_was_sent_meanwhile_is_dropped_at_commit(dq):
    prepare(dq, "t", [rec("m", body=b"from the transaction"), rec("n")])
    [plain] = dq.send([rec("m", body=b"plain")])
    assert txn.commit(dq, "t")
    assert sorted(all_ids(dq)) == ["m", "n"]
    assert stored(dq, "m").body == b"plain"
    assert stored(dq, "m").sequence_number == plain
    assert counted(dq)[3] == stored_size(dq)


def test_duplicates_within_and_across_transactions_are_stored_once(dq):
    prepare(dq, "t1", [rec("m", body=b"1"), rec("m", body=b"2")])
    prepare(dq, "t2", [rec("m", body=b"3"), rec("k")])
    assert txn.commit(dq, "t2") and txn.commit(dq, "t1")
    assert sorted(all_ids(dq)) == ["k", "m"]
    assert stored(dq, "m").body == b"3"
    assert dq.reserved == 0


def test_reserved_bytes_make_a_concurrent_plain_send_exceed_the_quota(clock):
    p = Partition(props(max_size_in_megabytes=1, max_message_size_in_kilobytes=1024), clock)
    big = 600 * 1024
    prepare(p, "t", [rec("held", body=b"x" * big)])
    before = fingerprint(p)
    with pytest.raises(ServiceBusQuotaExceededError):
        p.send([rec("plain", body=b"x" * (MIB - big))])
    assert fingerprint(p) == before
    assert txn.abort(p, "t")
    p.send([rec("plain", body=b"x" * (MIB - big))])
    assert all_ids(p) == ["plain"]


# ================================================================ 7. sessions


def test_settling_a_sessions_messages_in_a_transaction(sq):
    sq.send([rec(f"a{i}", session_id="a") for i in range(3)])
    token, _ = sq.accept_session("a")
    got = sq.receive(EVERYTHING, session=("a", token))
    prepare(
        sq,
        "t",
        [rec("a3", session_id="a")],
        [op(COMPLETE, got[0].lock_token), op(ABANDON, got[1].lock_token)],
    )
    assert sq.receive(EVERYTHING, session=("a", token)) == []
    assert txn.commit(sq, "t")
    again = sq.receive(EVERYTHING, session=("a", token))
    assert ids_of(again) == ["a1", "a3"]  # a2 is still locked by the session
    assert again[0].delivery_count == 1
    assert sorted(all_ids(sq)) == ["a1", "a2", "a3"]


def _prepared_then_session_lock_ends(sq, clock, how: str, n: int) -> list[MessageRecord]:
    """Session "a" holds ``n`` messages; transaction "t" prepares completing the first; then
    the session lock ends (``how``: it expires, or the receiver releases the session)."""
    sq.send([rec(f"a{i}", session_id="a") for i in range(n)])
    token, _ = sq.accept_session("a")
    got = sq.receive(EVERYTHING, session=("a", token))
    prepare(sq, "t", settles=[op(COMPLETE, got[0].lock_token)])
    if how == "lock expires":
        clock.advance(LOCK + 1)
        sq.tick()
    else:
        assert sq.release_session("a", token)
    return got


@pytest.mark.parametrize("how", ["lock expires", "released"])
def test_a_session_lock_ending_while_prepared_leaves_pinned_messages_locked_until_commit(
    sq, clock, how
):
    got = _prepared_then_session_lock_ends(sq, clock, how, 3)
    assert stored(sq, "a0").lock_token == got[0].lock_token  # pinned: still locked
    assert stored(sq, "a1").lock_token is None  # the others are released as usual
    assert stored(sq, "a2").lock_token is None
    counted_delivery = 1 if how == "lock expires" else 0
    assert stored(sq, "a1").delivery_count == counted_delivery
    assert stored(sq, "a0").delivery_count == 0

    token2, _ = sq.accept_session("a")
    assert ids_of(sq.receive(EVERYTHING, session=("a", token2))) == ["a1", "a2"]
    assert sq.pinned == {got[0].lock_token: "t"}
    assert txn.commit(sq, "t")
    assert sorted(all_ids(sq)) == ["a1", "a2"]


@pytest.mark.parametrize("how", ["lock expires", "released"])
def test_a_session_lock_ending_while_prepared_then_abort_lets_the_pinned_message_go(sq, clock, how):
    """After abort the lock runs its normal course: it ended with the session lock, so the
    message must be delivered again (not stay locked for ever)."""
    got = _prepared_then_session_lock_ends(sq, clock, how, 2)
    assert stored(sq, "a0").lock_token == got[0].lock_token
    assert txn.abort(sq, "t")
    clock.advance(LOCK + 1)  # long enough for any lock it could still have
    sq.tick()
    token2, _ = sq.accept_session("a")
    again = sq.receive(EVERYTHING, session=("a", token2))
    assert "a0" in ids_of(again), (
        f"a0 stays locked by {stored(sq, 'a0').lock_token} (until "
        f"{stored(sq, 'a0').locked_until}, now {clock.now()}): it is in no session's lock set "
        "and not in the lock heap"
    )


# ================================================================ 8. durability


def _prepared_history(p: Partition) -> tuple[list[journal.Entry], dict[str, MessageRecord]]:
    """A durable partition with a flushed prepared transaction "t": sends s1, s2; complete
    c; dead-letter d; abandon a; renew r. Returns (log, the received copies)."""
    log = durable(p)
    got = received(p, "c", "d", "a", "r", "free", log=log)
    prepare(
        p,
        "t",
        [rec("s1"), rec("s2")],
        [
            op(COMPLETE, got["c"].lock_token),
            op(DEAD_LETTER, got["d"].lock_token, reason="why", description="because"),
            op(ABANDON, got["a"].lock_token, properties={"k": 1}),
        ],
        [got["r"].lock_token],
    )
    flush(p, log)
    return log, got


@pytest.mark.parametrize("source", ["log", "checkpoint"])
def test_a_prepared_share_is_held_again_after_a_restart(q, clock, source):
    log, got = _prepared_history(q)
    entries = log if source == "log" else q.snapshot_entries()
    r = rebuilt(q, clock, entries)

    assert list(r.prepared) == ["t"]
    assert r.reserved == q.reserved == rec("s1").size + rec("s2").size
    assert counted(r) == counted(q)
    for mid in ("c", "d", "a"):
        locked = stored(r, mid)
        assert locked.lock_token is not None
        assert locked.lock_token != got[mid].lock_token  # new tokens after a restart
        assert r.pinned[locked.lock_token] == "t"
        assert locked.delivery_count == 0  # the restart is not charged
    assert len(r.pinned) == 3
    # The renewed lock and the unrelated one ended with the restart.
    assert sorted(ids_of(r.receive(EVERYTHING))) == ["free", "r"]
    # Pinned: they survive any time, and cannot be settled outside the transaction.
    clock.advance(10 * LOCK)
    r.tick()
    assert all(stored(r, mid).lock_token in r.pinned for mid in ("c", "d", "a"))
    [refused] = r.settle([op(COMPLETE, stored(r, "c").lock_token)])
    assert isinstance(refused, InvalidArgumentError)


@pytest.mark.parametrize("source", ["log", "checkpoint"])
def test_commit_after_a_restart_applies_the_share_exactly_once(q, clock, source):
    log, _ = _prepared_history(q)
    base = log if source == "log" else q.snapshot_entries()
    r = rebuilt(q, clock, base)
    log2 = list(base)
    assert txn.commit(r, "t") is True
    assert txn.commit(r, "t") is False
    flush(r, log2)

    def check(p: Partition) -> None:
        assert p.prepared == {} and p.pinned == {} and p.reserved == 0
        assert sorted(all_ids(p)) == ["a", "d", "free", "r", "s1", "s2"]
        assert in_dlq(p, "d")
        dead = stored(p, "d")
        assert (dead.dead_letter_reason, dead.dead_letter_error_description) == (
            "why",
            "because",
        )
        assert stored(p, "a").delivery_count == 1
        assert stored(p, "a").application_properties == {"k": 1}
        s1, s2 = stored(p, "s1").sequence_number, stored(p, "s2").sequence_number
        assert s2 == s1 + 1
        assert s1 > max(stored(p, m).sequence_number for m in ("a", "free", "r"))
        assert counted(p)[3] == stored_size(p)

    check(r)
    again = rebuilt(r, clock, log2)  # a second restart replays the commit, not the prepare
    check(again)
    assert counted(again) == counted(r)
    third = rebuilt(r, clock, r.snapshot_entries())
    check(third)


@pytest.mark.parametrize("source", ["log", "checkpoint"])
def test_abort_after_a_restart_releases_the_share(q, clock, source):
    log, _ = _prepared_history(q)
    base = log if source == "log" else q.snapshot_entries()
    r = rebuilt(q, clock, base)
    before = counted(r)
    assert txn.abort(r, "t") is True
    assert r.prepared == {} and r.pinned == {} and r.reserved == 0
    assert counted(r) == before
    assert sorted(all_ids(r)) == ["a", "c", "d", "free", "r"]
    assert sorted(ids_of(r.receive(EVERYTHING))) == ["free", "r"]
    # The messages the share would have settled stay locked until their (new) locks end.
    clock.advance(LOCK + 1)
    assert sorted(ids_of(r.receive(EVERYTHING))) == ["a", "c", "d", "free", "r"]
    log2 = list(base)
    flush(r, log2)
    again = rebuilt(r, clock, log2)
    assert again.prepared == {} and again.reserved == 0
    assert sorted(all_ids(again)) == ["a", "c", "d", "free", "r"]


def test_a_journal_with_prepare_and_commit_replays_to_the_effects_once(q, clock):
    log, _ = _prepared_history(q)
    assert txn.commit(q, "t")
    flush(q, log)
    ops = [e[0] for e in log]
    assert ops.count(journal.TXN_PREPARE) == ops.count(journal.TXN_END) == 1
    assert ops.index(journal.TXN_PREPARE) < ops.index(journal.TXN_END)
    state = journal.replay(through_storage(log))
    assert state.prepared == {}
    r = rebuilt(q, clock, log)
    assert r.prepared == {} and r.pinned == {} and r.reserved == 0
    assert sorted(all_ids(r)) == sorted(all_ids(q))
    assert counted(r) == counted(q)
    assert all(stored(r, m).lock_token is None for m in all_ids(r))  # nothing held


def test_a_checkpoint_followed_by_the_commit_entries_replays_to_no_prepared_transaction(q, clock):
    _prepared_history(q)
    checkpoint = q.snapshot_entries()
    assert [e[0] for e in checkpoint].count(journal.TXN_PREPARE) == 1
    assert txn.commit(q, "t")
    tail: list[journal.Entry] = []
    flush(q, tail)
    r = rebuilt(q, clock, checkpoint + tail)
    assert r.prepared == {} and r.reserved == 0
    assert sorted(all_ids(r)) == sorted(all_ids(q))
    assert counted(r) == counted(q)


def test_a_restart_reserves_the_same_bytes_as_the_prepare_did(dq, clock):
    """A send already a duplicate at prepare reserves nothing; after a restart the share must
    reserve the same (not the duplicate's bytes too)."""
    log = durable(dq)
    dq.send([rec("m")])
    prepare(dq, "t", [rec("m"), rec("n")])
    flush(dq, log)
    assert dq.reserved == rec("n").size
    r = rebuilt(dq, clock, log)
    assert r.reserved == dq.reserved


def test_a_prepared_session_settlement_survives_a_restart(sq, clock):
    log = durable(sq)
    sq.send([rec("a0", session_id="a"), rec("a1", session_id="a")])
    flush(sq, log)
    token, _ = sq.accept_session("a")
    got = sq.receive(EVERYTHING, session=("a", token))
    prepare(sq, "t", settles=[op(COMPLETE, got[0].lock_token)])
    flush(sq, log)
    r = rebuilt(sq, clock, log)
    assert stored(r, "a0").lock_token in r.pinned
    token2, _ = r.accept_session("a")
    assert ids_of(r.receive(EVERYTHING, session=("a", token2))) == ["a1"]
    assert txn.commit(r, "t")
    assert all_ids(r) == ["a1"]


# ================================================================ partition changes


def test_handing_over_a_slot_while_a_send_to_it_is_prepared_stores_it_once(clock):
    """A prepared send whose slot moves to another partition before commit must not be
    stored twice (duplicate detection lives with the slot) nor where the slot is not
    served."""
    options = {"requires_duplicate_detection": True}
    a = Partition(props(**options), clock, 0)
    a.owned = ALL
    b = Partition(props(**options), clock, 1)
    b.owned = frozenset()
    prepare(a, "t", [rec("m", body=b"transaction")])
    out, pinned = migration.hand_over(a, {1: frozenset([slot_of("m")])}, None)
    for move_id, (target, bundle) in out.items():
        assert target == 1
        assert migration.adopt(b, move_id, bundle)
        migration.finish(a, move_id)
    if slot_of("m") not in pinned:
        b.send([rec("m", body=b"plain")])  # the slot's new partition takes the id
    assert txn.commit(a, "t")
    holders = [p for p in (a, b) if "m" in all_ids(p)]
    copies = sum(all_ids(p).count("m") for p in (a, b))
    assert copies == 1, f"message id 'm' stored {copies} times (in partitions {holders})"
    [holder] = holders
    assert holder.owned is None or slot_of("m") in holder.owned


def test_a_retiring_partition_with_a_prepared_share_is_not_empty(clock):
    """A partition may stop only when nothing is left in it: a prepared transaction (whose
    commit would store messages here) is something."""
    a = Partition(props(), clock, 0)
    a.owned = ALL
    b = Partition(props(), clock, 1)
    b.owned = frozenset()
    prepare(a, "t", [rec("pending")])
    out, _ = migration.hand_over(a, {1: ALL}, 1)
    for move_id, (_target, bundle) in out.items():
        migration.adopt(b, move_id, bundle)
        migration.finish(a, move_id)
    assert a.prepared
    assert not migration.is_empty(a)
