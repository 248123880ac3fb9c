"""The partition's deadline heaps stay as long as what is still pending (lock expiries of held
locks, expiries of stored messages, session locks held), and the deadlines they keep still
fall due on time.

A settled lock or a completed message used to leave its heap entry until its time came (60 s
of lock duration, days of time to live): a busy queue held millions of them. Each test runs
many short receive-complete rounds under a small ``HEAP_SLACK`` beside one pending deadline,
then checks the heap's length and that the deadline still falls due exactly when it should.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from raybus._core import partition as partition_module
from raybus._core.partition import COMPLETE, SettleOp
from raybus.exceptions import SessionCannotBeLockedError

LOCK = 30.0
SLACK = 16
ROUNDS = 200
BATCH = 10


@pytest.fixture(autouse=True)
def _small_slack(monkeypatch):
    monkeypatch.setattr(partition_module, "HEAP_SLACK", SLACK)


def churn(p, msg, rounds=ROUNDS, **fields):
    """Send, receive and complete ``BATCH`` messages ``rounds`` times; the longest the lock
    and expiry heaps got, and whether every received message was one just sent."""
    longest = 0
    for r in range(rounds):
        p.send([msg(message_id=f"c{r}-{i}", **fields) for i in range(BATCH)])
        got = p.receive(BATCH)
        assert {m.message_id for m in got} == {f"c{r}-{i}" for i in range(BATCH)}
        assert p.settle([SettleOp(COMPLETE, m.lock_token) for m in got]) == [None] * BATCH
        longest = max(longest, len(p._lock_heap), len(p._ttl_heap))
    return longest


def test_settled_locks_leave_the_lock_heap_and_a_held_lock_still_expires(
    make_partition, msg, clock
):
    p = make_partition(lock_duration=LOCK)
    p.send([msg(message_id="held")])
    [held] = p.receive(1)
    clock.advance(1.0)
    # Rounds a second apart: the held lock stays pending throughout.
    longest = 0
    for _ in range(20):
        longest = max(longest, churn(p, msg, rounds=ROUNDS // 20))
        clock.advance(LOCK / 30)
    assert 10 * longest < ROUNDS * BATCH
    assert longest <= 2 * (1 + SLACK) + BATCH
    assert clock.now() < held.locked_until
    assert p.receive(1) == []  # still locked
    clock.advance(held.locked_until - clock.now())
    [again] = p.receive(1)
    assert (again.message_id, again.delivery_count) == ("held", 1)


def test_a_renewed_lock_keeps_its_latest_expiry_through_compactions(make_partition, msg, clock):
    p = make_partition(lock_duration=LOCK)
    p.send([msg(message_id="held")])
    [held] = p.receive(1)
    for _ in range(5):
        clock.advance(LOCK / 2)
        [until] = p.renew_locks([held.lock_token])
        churn(p, msg, rounds=ROUNDS // 5)
    clock.advance(until - clock.now() - 0.001)
    assert p.receive(1) == []
    clock.advance(0.001)
    [again] = p.receive(1)
    assert (again.message_id, again.delivery_count) == ("held", 1)


def test_completed_messages_leave_the_expiry_heap(make_partition, msg, clock):
    p = make_partition(lock_duration=LOCK, default_message_time_to_live=timedelta(seconds=100))
    longest = churn(p, msg, time_to_live=50.0)
    assert 10 * longest < ROUNDS * BATCH
    assert longest <= 2 * SLACK + BATCH
    p.send([msg(message_id="last", time_to_live=50.0)])
    clock.advance(50.0 - 0.001)
    assert p.counts().active == 1
    clock.advance(0.001)
    assert p.counts().active == 0
    assert p.stats["dead_lettered"] == 0


def test_an_expiry_heap_of_stored_messages_is_kept_whole(make_partition, msg, clock):
    """Compaction drops only what is gone: with every message still stored, each keeps its
    expiry, and they expire in order."""
    p = make_partition(default_message_time_to_live=timedelta(seconds=100))
    for k in range(10 * SLACK):
        p.send([msg(message_id=f"m{k}", time_to_live=float(10 + k))])
        p.tick()
    assert len(p._ttl_heap) == 10 * SLACK
    clock.advance(10 + 5 * SLACK - 0.5)
    assert p.counts().active == 5 * SLACK
    clock.advance(5 * SLACK)
    assert p.counts().active == 0


def test_released_sessions_leave_the_session_lock_heap_and_a_held_one_still_expires(
    make_partition, msg, clock
):
    """A session accepted and released again and again (a short-lived receiver per session)
    pushed a heap entry per accept that stayed for the lock duration. Beside them one session
    stays held, renewed once: its lock still ends exactly at its latest expiry, and its
    message is then available again with a delivery counted."""
    p = make_partition(lock_duration=LOCK, requires_session=True)
    p.send([msg(message_id="held", session_id="keep")])
    keep_token, _ = p.accept_session("keep")
    [held] = p.receive(1, session=("keep", keep_token))
    longest = 0
    rounds = 4 * ROUNDS
    for r in range(rounds):
        token, _ = p.accept_session(f"s{r % 7}")
        assert p.release_session(f"s{r % 7}", token)
        if r == rounds // 2:
            clock.advance(LOCK / 2)
            until = p.renew_session_lock("keep", keep_token)
        p.tick()
        longest = max(longest, len(p._sessions.lock_heap))
    assert 10 * longest < rounds
    # Live at a compaction: the held session's two entries and the one being released.
    assert longest <= 2 * 3 + SLACK
    clock.advance(until - clock.now() - 0.001)
    assert p.accept_next_session() is None  # "keep" is still locked
    clock.advance(0.001)
    session_id, token, _ = p.accept_next_session()
    assert session_id == "keep"
    [again] = p.receive(1, session=("keep", token))
    assert (again.message_id, again.delivery_count) == ("held", held.delivery_count + 1)


def test_a_session_accepted_again_keeps_only_its_new_holders_entries(make_partition, clock):
    """A session released and accepted again by another receiver within one lock duration:
    the first holder's entry goes at the next compaction, and the new holder's lock ends on
    time."""
    p = make_partition(lock_duration=LOCK, requires_session=True)
    first, _ = p.accept_session("a")
    clock.advance(1.0)
    assert p.release_session("a", first)
    token, until = p.accept_session("a")
    for r in range(3 * SLACK):
        t, _ = p.accept_session(f"other{r}")
        p.release_session(f"other{r}", t)
        p.tick()
    assert [e[2] for e in p._sessions.lock_heap if e[1] == "a"] == [token]
    clock.advance(until - clock.now() - 0.001)
    with pytest.raises(SessionCannotBeLockedError):  # still held by the new holder
        p.accept_session("a")
    clock.advance(0.001)
    p.accept_session("a")  # the lock ended on time


def test_a_lock_heap_compaction_leaves_the_expiry_heap_of_a_backlog_alone(
    make_partition, msg, clock, monkeypatch
):
    """Each heap is rebuilt only when it outgrew its own limit: a backlog of messages with a
    time to live is not scanned again whenever the lock heap is compacted (it was, at every
    lock-heap compaction, which made a queue holding 200,000 such messages five times slower
    to receive from)."""
    real = partition_module._compacted
    rebuilt: list[str] = []
    p = make_partition(lock_duration=LOCK, default_message_time_to_live=timedelta(seconds=100))

    def spy(heap, keep):
        rebuilt.append("ttl" if heap is p._ttl_heap else "lock" if heap is p._lock_heap else "?")
        return real(heap, keep)

    monkeypatch.setattr(partition_module, "_compacted", spy)
    backlog = 20 * SLACK
    p.send([msg(message_id=f"b{k}", time_to_live=50.0) for k in range(backlog)])
    p.tick()
    [held] = p.receive(1)
    rebuilt.clear()
    for _ in range(10 * SLACK):  # renewals push lock-heap entries, and nothing else
        p.renew_locks([held.lock_token])
        p.tick()
    assert "lock" in rebuilt and "ttl" not in rebuilt
    assert len(p._ttl_heap) == backlog
    clock.advance(50.0)
    assert p.counts().active == 0  # the backlog still expires on time
