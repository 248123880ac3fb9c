"""A journaled ``Partition`` rebuilt from its journal (or from a checkpoint of it) after a crash.

Each test drives a partition with ``enable_journal()`` on the FakeClock; ``flush`` plays the
group commit (journal to the "log", ``visible_seq`` advanced) and ``recovered`` builds a fresh
partition from the flushed entries as the Committer does, so everything not flushed is lost as
in a crash. Spec §1.2 (sequence numbers), §1.3 (locks, delivery count, defer), §1.4, §1.5, §1.6.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from durability_helpers import (
    EVERYTHING,
    by_id,
    counts_of,
    flush,
    record,
    records,
    recovered,
    through_storage,
    view,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raybus._core import journal
from raybus._core.partition import (
    ABANDON,
    COMPLETE,
    DEAD_LETTER,
    DEFER,
    MAX_DELIVERY_COUNT_EXCEEDED,
    RELEASE,
    TTL_EXPIRED,
    Partition,
    SettleOp,
)
from raybus._core.record import ACTIVE, DEFERRED, SCHEDULED
from raybus._models import QueueProperties
from raybus.exceptions import MessageLockLostError, ServiceBusError
from raybus.testing import FakeClock

OPTS: dict[str, Any] = {
    "lock_duration": 30,
    "max_delivery_count": 3,
    "dead_lettering_on_message_expiration": True,
    "requires_duplicate_detection": True,
}


@dataclasses.dataclass
class History:
    """A partition after a scripted history, and what a crash at its end leaves."""

    partition: Partition
    flushed: list[journal.Entry]  # everything a successful flush carried, in order
    checkpoints: list[tuple[int, list[journal.Entry]]]  # (log length, snapshot) at each flush
    seqs: dict[str, int]  # the sequence number each message id was accepted with
    at_crash: tuple[Any, ...]  # view() at the last flush
    counts_at_crash: tuple[int, int, int, int]
    delivery_counts: dict[str, int]  # by message id, at the last flush
    next_seq: int  # the next sequence number after the last flushed one
    properties: QueueProperties
    lock_tokens: list[str]  # of the messages locked at the crash


def run_history(make_partition: Callable[..., Partition], settle: Any, clock: FakeClock) -> History:
    p = make_partition(**OPTS)
    p.enable_journal()
    log: list[journal.Entry] = []
    checkpoints: list[tuple[int, list[journal.Entry]]] = []

    def commit() -> None:
        flush(p, log)
        checkpoints.append((len(log), p.snapshot_entries()))

    t0 = clock.now()
    plain = ["done", "abandoned", "dlq-app", "deferred", "poison", "held", "plain", "rad"]
    batch = records(*plain, application_properties={"origin": "test"})
    batch += [
        record(b"short-lived", message_id="expiring", time_to_live=60.0),
        record({"nested": [1, b"2"]}, message_id="scheduled-soon", scheduled_enqueue_time=t0 + 30),
        record(b"later", message_id="scheduled-later", scheduled_enqueue_time=t0 + 3600),
        record(b"cancelled", message_id="cancelled", scheduled_enqueue_time=t0 + 3600),
    ]
    ids = [r.message_id or "" for r in batch]
    seqs = dict(zip(ids, p.send(batch), strict=True))
    commit()
    p.cancel_scheduled([seqs["cancelled"]])
    commit()

    clock.advance(61)
    p.counts()  # tick: "expiring" is dead-lettered, "scheduled-soon" turns active
    commit()

    got = {r.message_id: r for r in p.receive(EVERYTHING)}
    assert set(got) == {*plain, "scheduled-soon"}
    seqs["scheduled-soon (active)"] = got["scheduled-soon"].sequence_number

    def do(mid: str, kind: str, **fields: Any) -> None:
        assert settle(p, kind, got[mid].lock_token, **fields) is None

    do("done", COMPLETE)
    do("abandoned", ABANDON, properties={"attempt": 1})
    do("dlq-app", DEAD_LETTER, reason="BadOrder", description="no such item", properties={"x": 1})
    do("deferred", DEFER, properties={"later": "yes"})
    do("rad", DEFER)
    do("poison", ABANDON)
    do("plain", RELEASE)
    do("scheduled-soon", RELEASE)
    held_token = got["held"].lock_token or ""  # "held" stays locked until the crash
    commit()

    for _ in range(2):  # "poison" is delivered twice more and dead-letters on its third abandon
        got = {r.message_id: r for r in p.receive(EVERYTHING)}
        assert "poison" in got and "held" not in got
        for mid in got:
            do(mid, ABANDON if mid == "poison" else RELEASE)
        commit()

    assert [r.message_id for r in p.receive_deferred([seqs["rad"]], delete=True)] == ["rad"]
    commit()
    assert p.send(records("done")) == [seqs["done"]]  # a duplicate: dropped, nothing recorded
    assert not p.has_journal()

    new_props = dataclasses.replace(
        p.properties, lock_duration=timedelta(seconds=45), user_metadata="v2"
    )
    p.update_properties(new_props)
    commit()

    history = History(
        partition=p,
        flushed=log,
        checkpoints=checkpoints,
        seqs=seqs,
        at_crash=view(p),
        counts_at_crash=counts_of(p),
        delivery_counts={mid: r.delivery_count for mid, r in by_id(p).items()},
        next_seq=seqs["scheduled-soon (active)"] + 1,
        properties=new_props,
        lock_tokens=[held_token],
    )

    # Not flushed, so lost in the crash: a completion, a send, and three new locks.
    got = {r.message_id: r for r in p.receive(EVERYTHING)}
    assert set(got) == {"abandoned", "plain", "scheduled-soon"}
    do("plain", COMPLETE)
    p.send(records("unflushed"))
    history.lock_tokens += [got[mid].lock_token or "" for mid in ("abandoned", "scheduled-soon")]
    return history


@pytest.fixture
def history(make_partition, settle, clock) -> History:
    return run_history(make_partition, settle, clock)


@pytest.fixture
def fresh(make_partition) -> Callable[[], Partition]:
    """A new, empty partition with the queue's original options (as a restarted actor)."""
    return lambda: make_partition(**OPTS)


@pytest.fixture(params=["log", "checkpoint", "checkpoint+tail"])
def restarted(request, history: History, fresh) -> Partition:
    """The partition recovered from the whole log, from a checkpoint at the last flush, or from
    an early checkpoint plus the log after it."""
    if request.param == "log":
        return recovered(fresh, history.flushed)
    if request.param == "checkpoint":
        return recovered(fresh, history.checkpoints[-1][1])
    upto, snapshot = history.checkpoints[2]
    return recovered(fresh, snapshot, history.flushed[upto:])


# ---------------------------------------------------------------- what comes back


def test_recovery_restores_every_message_with_all_its_fields(history: History, restarted):
    assert view(restarted) == history.at_crash
    assert counts_of(restarted) == history.counts_at_crash


def test_recovery_from_any_checkpoint_plus_its_log_tail_is_exact(history: History, fresh):
    for upto, snapshot in history.checkpoints:
        assert view(recovered(fresh, snapshot, history.flushed[upto:])) == history.at_crash
        # A checkpoint taken while earlier entries were still in flight, then those entries.
        for earlier in (0, upto // 2):
            again = recovered(fresh, snapshot, history.flushed[earlier:])
            assert view(again) == history.at_crash


def test_completed_cancelled_and_deleted_messages_stay_gone(history: History, restarted):
    held = by_id(restarted)
    assert {"done", "rad", "cancelled"}.isdisjoint(held)
    assert "plain" in held  # its completion was never flushed
    assert "unflushed" not in held  # nor was this send
    assert set(held) == {
        "abandoned",
        "dlq-app",
        "deferred",
        "poison",
        "held",
        "plain",
        "expiring",
        "scheduled-soon",
        "scheduled-later",
    }


def test_deferred_scheduled_and_dead_lettered_messages_keep_their_state(
    history: History, restarted
):
    held = by_id(restarted)
    seqs = history.seqs

    deferred = held["deferred"]
    assert (deferred.sequence_number, deferred.state) == (seqs["deferred"], DEFERRED)
    assert deferred.application_properties == {"origin": "test", "later": "yes"}
    assert deferred.delivery_count == 0

    later = held["scheduled-later"]
    assert (later.sequence_number, later.state) == (seqs["scheduled-later"], SCHEDULED)
    assert later.enqueued_time == later.scheduled_enqueue_time

    soon = held["scheduled-soon"]
    assert soon.state == ACTIVE
    assert soon.sequence_number == seqs["scheduled-soon (active)"] != seqs["scheduled-soon"]
    assert soon.body == {"nested": [1, b"2"]}

    dead = restarted.peek(0, EVERYTHING, dead_letter=True)
    assert [r.message_id for r in dead] == ["dlq-app", "poison", "expiring"]  # sequence order
    app, poison, expiring = dead
    assert app.sequence_number == seqs["dlq-app"]
    assert (app.dead_letter_reason, app.dead_letter_error_description) == (
        "BadOrder",
        "no such item",
    )
    assert app.application_properties == {"origin": "test", "x": 1}
    assert (poison.dead_letter_reason, poison.delivery_count) == (MAX_DELIVERY_COUNT_EXCEEDED, 3)
    assert expiring.dead_letter_reason == TTL_EXPIRED
    assert all(r.state == ACTIVE for r in dead)

    abandoned = held["abandoned"]
    assert abandoned.delivery_count == 1
    assert abandoned.application_properties == {"origin": "test", "attempt": 1}


def test_messages_locked_at_the_crash_are_available_again_without_a_delivery_charged(
    history: History, restarted
):
    before = history.delivery_counts
    got = restarted.receive(EVERYTHING)
    # "held" was locked at the last flush; "abandoned" and "scheduled-soon" after it.
    assert [r.message_id for r in got] == ["abandoned", "held", "plain", "scheduled-soon"]
    for rec in got:
        assert rec.delivery_count == before[rec.message_id]
        assert rec.lock_token is not None
    assert [r.delivery_count for r in got] == [1, 0, 0, 0]


def test_lock_tokens_from_before_the_crash_are_lost(history: History, restarted, settle):
    for token in history.lock_tokens:
        assert isinstance(settle(restarted, COMPLETE, token), MessageLockLostError)
    assert "held" in by_id(restarted)


def test_sequence_numbers_continue_after_recovery(history: History, restarted, clock):
    [seq] = restarted.send(records("after-restart"))
    assert seq == history.next_seq  # gap-free, above every acknowledged number
    assert seq > max(history.seqs.values())
    clock.advance(3600)
    restarted.counts()  # "scheduled-later" turns active with yet another new number
    flush(restarted, [])
    later = by_id(restarted)["scheduled-later"]
    assert later.state == ACTIVE
    assert later.sequence_number == seq + 1


def test_duplicate_detection_ids_survive_within_their_window(history: History, restarted, clock):
    seqs = history.seqs
    for mid in ("done", "rad", "dlq-app", "expiring", "held"):
        assert restarted.send(records(mid)) == [seqs[mid]]
    assert counts_of(restarted) == history.counts_at_crash
    clock.advance(600)  # the default 10 minute window has passed for all of them
    [again] = restarted.send(records("done"))
    assert again == history.next_seq


def test_updated_queue_properties_survive(history: History, restarted):
    assert restarted.properties == history.properties
    assert restarted.properties.user_metadata == "v2"
    [rec] = restarted.receive(1)
    assert rec.locked_until - restarted.accessed_at == 45.0


# ---------------------------------------------------------------- focused cases


@pytest.mark.parametrize("source", ["log", "checkpoint"])
def test_sequence_numbers_are_never_reused_after_every_message_completed(
    make_partition, settle, source
):
    p = make_partition()
    p.enable_journal()
    log: list[journal.Entry] = []
    seqs = p.send(records(*"abcde"))
    flush(p, log)
    for rec in p.receive(EVERYTHING):
        assert settle(p, COMPLETE, rec.lock_token) is None
    flush(p, log)
    assert p.message_count() == 0

    entries = log if source == "log" else p.snapshot_entries()
    restarted = recovered(make_partition, entries)
    assert counts_of(restarted) == (0, 0, 0, 0)
    assert restarted.send(records("f")) == [seqs[-1] + 1]


def test_sequence_numbers_of_an_empty_journal_start_at_one(make_partition):
    restarted = recovered(make_partition, [])
    assert restarted.send(records("first")) == [1]


def test_partition_id_stays_in_the_top_bits_after_recovery(make_partition):
    p = make_partition(partition_id=3)
    p.enable_journal()
    log: list[journal.Entry] = []
    [seq] = p.send(records("a"))
    flush(p, log)
    restarted = recovered(lambda: make_partition(partition_id=3), log)
    assert restarted.send(records("b")) == [seq + 1]
    assert (seq + 1) >> 48 == 3


def test_expired_lock_is_charged_before_a_crash_but_a_held_lock_is_not(
    make_partition, settle, clock
):
    p = make_partition(lock_duration=30)
    p.enable_journal()
    log: list[journal.Entry] = []
    p.send(records("expired-once", "held"))
    flush(p, log)
    [first, second] = p.receive(2)
    settle(p, RELEASE, second.lock_token)  # "held" goes back without a charge
    clock.advance(31)  # the lock on "expired-once" expires: a delivery is counted
    got = {r.message_id: r for r in p.receive(2)}
    assert got["expired-once"].delivery_count == 1
    assert got["held"].delivery_count == 0
    flush(p, log)

    restarted = recovered(lambda: make_partition(lock_duration=30), log)
    again = {r.message_id: r.delivery_count for r in restarted.receive(2)}
    assert again == {"expired-once": 1, "held": 0}
    assert first.message_id == "expired-once"


def test_receive_and_delete_is_recorded(make_partition):
    p = make_partition()
    p.enable_journal()
    log: list[journal.Entry] = []
    p.send(records("a", "b"))
    flush(p, log)
    assert [r.message_id for r in p.receive(1, delete=True)] == ["a"]
    flush(p, log)
    assert list(by_id(recovered(make_partition, log))) == ["b"]


def test_new_messages_are_neither_receivable_nor_peekable_until_flushed(make_partition):
    p = make_partition()
    p.enable_journal()
    log: list[journal.Entry] = []
    p.send(records("a"))
    assert p.receive(1) == []
    assert p.peek(0, 10) == []
    assert not p.has_available()
    assert p.counts().active == 1  # counted, just not handed out
    flush(p, log)
    p.send(records("b"))
    assert [r.message_id for r in p.peek(0, 10)] == ["a"]
    assert [r.message_id for r in p.receive(10)] == ["a"]
    flush(p, log)
    assert [r.message_id for r in p.receive(10)] == ["b"]


def test_scheduled_message_turning_active_is_not_receivable_until_flushed(make_partition, clock):
    p = make_partition()
    p.enable_journal()
    log: list[journal.Entry] = []
    p.send([record(message_id="s", scheduled_enqueue_time=clock.now() + 10)])
    flush(p, log)
    clock.advance(10)
    assert p.receive(1) == []  # active now, with a new number that is not durable yet
    flush(p, log)
    assert [r.message_id for r in p.receive(1)] == ["s"]


def test_memory_only_partition_records_nothing_and_hides_nothing(make_partition):
    p = make_partition()
    p.send(records("a"))
    assert not p.has_journal()
    assert p.take_journal() == ([], 1)
    assert p.visible_seq is None
    assert [r.message_id for r in p.receive(1)] == ["a"]


def test_load_needs_an_empty_partition(make_partition):
    p = make_partition()
    p.send(records("a"))
    with pytest.raises(RuntimeError):
        p.load(journal.ReplayedState())


def test_duplicate_of_a_scheduled_message_that_turned_active_reports_the_same_number_after_recovery(
    make_partition, clock
):
    """A duplicate send answers with the sequence number of the first copy; once a scheduled
    message turned active that is its new number, before and after a restart alike."""
    opts = {"requires_duplicate_detection": True}
    p = make_partition(**opts)
    p.enable_journal()
    log: list[journal.Entry] = []
    [old] = p.send([record(message_id="s", scheduled_enqueue_time=clock.now() + 10)])
    flush(p, log)
    clock.advance(10)
    p.counts()  # turns active with a new sequence number
    flush(p, log)
    [active] = p.peek(0, 10)
    assert active.sequence_number != old
    assert p.send([record(message_id="s")]) == [active.sequence_number]

    restarted = recovered(lambda: make_partition(**opts), log)
    assert restarted.send([record(message_id="s")]) == [active.sequence_number]


def test_release_with_properties_survives_recovery(make_partition, settle):
    """Every change of a message is journaled: properties merged by a release included."""
    p = make_partition()
    p.enable_journal()
    log: list[journal.Entry] = []
    p.send(records("a"))
    flush(p, log)
    [rec] = p.receive(1)
    assert settle(p, RELEASE, rec.lock_token, properties={"seen": True}) is None
    flush(p, log)
    assert p.peek(0, 1)[0].application_properties == {"seen": True}
    assert recovered(make_partition, log).peek(0, 1)[0].application_properties == {"seen": True}


# ---------------------------------------------------------------- every change is journaled


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 5), st.sampled_from(["now", "later", "ttl"])),
        st.tuples(st.just("receive"), st.integers(1, 4), st.booleans()),
        st.tuples(
            st.just("settle"),
            st.integers(0, 9),
            st.sampled_from([COMPLETE, ABANDON, DEAD_LETTER, DEFER, RELEASE]),
        ),
        st.tuples(st.just("deferred"), st.integers(0, 9), st.booleans()),
        st.tuples(st.just("cancel"), st.integers(0, 9), st.just(None)),
        st.tuples(st.just("dlq"), st.integers(1, 3), st.booleans()),
        st.tuples(st.just("advance"), st.sampled_from([1, 11, 31, 61, 700]), st.just(None)),
        st.tuples(st.just("props"), st.integers(2, 5), st.just(None)),
        st.tuples(st.just("flush"), st.just(0), st.just(None)),
    ),
    max_size=40,
)


def comparable(state: journal.ReplayedState, now: float, window: float) -> tuple[Any, ...]:
    """A replayed state as values; duplicate-detection ids past their window (which the log
    still holds until the next checkpoint, and a restarted partition forgets at once) and the
    numbers they point at are left out."""
    state.sorted()
    return (
        {s: journal.put_payload(r) for s, r in state.main.items()},
        {s: journal.put_payload(r) for s, r in state.dead_letter.items()},
        {mid: at for mid, (at, _) in state.dedup.items() if at + window > now},
        max(state.next_seq, 1),  # a partition starts at 1 whatever an empty journal says
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_replaying_the_journal_always_equals_the_partition_state(ops) -> None:
    """After any sequence of operations the flushed journal replays to exactly the partition's
    own durable state (its checkpoint), and a partition loaded from it shows the same messages."""
    clock = FakeClock()
    initial = QueueProperties(name="orders", **OPTS)
    p = Partition(initial, clock)
    p.enable_journal()
    log: list[journal.Entry] = []
    tokens: list[str] = []
    sent: list[int] = []
    n = 0
    for kind, arg, extra in ops:
        try:
            if kind == "send":
                batch = []
                for _ in range(arg):
                    n += 1
                    fields: dict[str, Any] = {"message_id": f"m{n % 7}"}  # some duplicates
                    if extra == "later":
                        fields["scheduled_enqueue_time"] = clock.now() + 20
                    elif extra == "ttl":
                        fields["time_to_live"] = 45.0
                    batch.append(record(str(n).encode(), **fields))
                sent += p.send(batch)
            elif kind == "receive":
                tokens += [r.lock_token or "" for r in p.receive(arg, delete=extra)]
            elif kind == "settle" and tokens:
                token = tokens.pop(arg % len(tokens))
                fields = {"properties": {"k": arg}} if extra != RELEASE else {}
                if extra == DEAD_LETTER:
                    fields.update(reason="r", description="d")
                p.settle([SettleOp(extra, token, **fields)])
            elif kind == "deferred" and sent:
                got = p.receive_deferred([sent[arg % len(sent)]], delete=extra)
                tokens += [r.lock_token or "" for r in got]
            elif kind == "cancel" and sent:
                p.cancel_scheduled([sent[arg % len(sent)]])
            elif kind == "dlq":
                tokens += [r.lock_token or "" for r in p.receive(arg, dead_letter=True)]
            elif kind == "advance":
                clock.advance(arg)
            elif kind == "props":
                p.update_properties(dataclasses.replace(p.properties, max_delivery_count=arg))
            elif kind == "flush":
                flush(p, log)
        except ServiceBusError:
            pass  # refused operations change nothing (checked by the comparison below)
        if not p.has_journal():  # everything recorded so far is in the log
            now, window = clock.now(), p.properties.dedup_window_s
            from_log = journal.replay(through_storage(log))
            from_checkpoint = journal.replay(p.snapshot_entries())
            assert comparable(from_log, now, window) == comparable(from_checkpoint, now, window)
            assert (from_log.properties or initial) == from_checkpoint.properties == p.properties
    p.counts()  # due lock expiries are charged now, before the "crash"
    flush(p, log)
    restarted = recovered(lambda: Partition(initial, clock), log)
    assert view(restarted)[1] == view(p)[1]  # dead letters: locks and TTL play no part there
    assert restarted.message_count() == p.message_count()


def test_a_scheduled_message_turned_active_stays_in_peek_before_its_flush(make_partition, clock):
    """Its new number is past ``visible_seq`` until the next flush: a receive waits for that
    (its lock must survive a crash), but peek, which showed it scheduled, still shows it."""
    p = make_partition()
    p.enable_journal()
    log: list[journal.Entry] = []
    t0 = clock.now()
    (seq,) = p.send([record(b"soon", message_id="soon", scheduled_enqueue_time=t0 + 2)])
    p.send(records("sent-after"))
    flush(p, log)
    assert [r.sequence_number for r in p.peek(0, 10)] == [seq, seq + 1]
    (unflushed,) = p.send(records("unflushed"))  # a send not yet durable: no peek shows it

    clock.advance(3)
    peeked = p.peek(0, 10)
    assert [r.message_id for r in peeked] == ["sent-after", "soon"]
    assert peeked[1].sequence_number > unflushed and peeked[1].state == ACTIVE
    assert p.peek(peeked[1].sequence_number, 10) == [peeked[1]]
    assert p.peek(0, 10, dead_letter=True) == []
    assert [r.message_id for r in p.receive(EVERYTHING)] == ["sent-after"]

    flush(p, log)
    assert [r.message_id for r in p.receive(EVERYTHING)] == ["unflushed", "soon"]
    assert [r.message_id for r in p.peek(0, 10)] == ["sent-after", "unflushed", "soon"]
