"""Peek-lock, settlement and lock expiry of one ``Partition`` (spec §1.3, §1.4).

Every test drives the partition with a FakeClock; lock_duration is 30 s unless stated.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from raybus._core.partition import (
    ABANDON,
    COMPLETE,
    DEAD_LETTER,
    DEFER,
    RELEASE,
    SettleOp,
    makes_available,
)
from raybus._core.record import ACTIVE, DEFERRED
from raybus.exceptions import (
    InvalidArgumentError,
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
)

LOCK = 30.0


@pytest.fixture
def queue(make_partition):
    return make_partition(lock_duration=LOCK)


def send(p, msg, n=1):
    return p.send([msg(message_id=f"m{i}") for i in range(n)])


# ---------------------------------------------------------------- receive and lock


def test_receive_locks_message_for_lock_duration(queue, msg, clock):
    [seq] = send(queue, msg)
    [rec] = queue.receive(1)
    assert rec.sequence_number == seq
    assert rec.lock_token
    assert rec.locked_until == clock.now() + LOCK
    assert rec.delivery_count == 0


def test_receive_returns_at_most_max_count_in_sequence_order(queue, msg):
    seqs = send(queue, msg, 5)
    got = queue.receive(3)
    assert [r.sequence_number for r in got] == seqs[:3]


def test_receive_on_empty_queue_returns_empty_list(queue):
    assert queue.receive(10) == []


def test_competing_receives_never_hand_out_a_locked_message(queue, msg):
    seqs = send(queue, msg, 3)
    first = queue.receive(2)
    second = queue.receive(5)
    third = queue.receive(5)
    assert [r.sequence_number for r in first] == seqs[:2]
    assert [r.sequence_number for r in second] == seqs[2:]
    assert third == []
    tokens = {r.lock_token for r in first + second}
    assert len(tokens) == 3


def test_lock_is_still_valid_just_before_expiry(queue, msg, clock, settle):
    send(queue, msg)
    [rec] = queue.receive(1)
    clock.advance(LOCK - 0.1)
    assert queue.receive(1) == []
    assert settle(queue, COMPLETE, rec.lock_token) is None


def test_locked_message_is_counted_as_active(queue, msg):
    send(queue, msg)
    queue.receive(1)
    assert queue.counts().active == 1


# ---------------------------------------------------------------- complete


def test_complete_removes_message(queue, msg, clock, settle):
    send(queue, msg)
    [rec] = queue.receive(1)
    assert settle(queue, COMPLETE, rec.lock_token) is None
    assert queue.counts().active == 0
    assert queue.counts().size_in_bytes == 0
    assert queue.peek(0, 10) == []
    clock.advance(LOCK * 3)
    assert queue.receive(1) == []


def test_complete_after_lock_expiry_raises_message_lock_lost(queue, msg, clock, settle):
    [seq] = send(queue, msg)
    [rec] = queue.receive(1)
    clock.advance(LOCK + 1)
    err = settle(queue, COMPLETE, rec.lock_token)
    assert isinstance(err, MessageLockLostError)
    assert err.lock_token == rec.lock_token
    # The refused complete changed nothing: the message is still there, available again.
    assert queue.counts().active == 1
    [again] = queue.receive(1)
    assert again.sequence_number == seq


@pytest.mark.parametrize("kind", [COMPLETE, ABANDON, DEAD_LETTER, DEFER, RELEASE])
def test_settle_after_lock_expiry_raises_message_lock_lost_and_changes_nothing(
    queue, msg, clock, settle, kind
):
    [seq] = send(queue, msg)
    [rec] = queue.receive(1)
    clock.advance(LOCK + 1)
    before = queue.peek(0, 10)
    err = settle(queue, kind, rec.lock_token)
    assert isinstance(err, MessageLockLostError)
    after = queue.peek(0, 10)
    assert [(r.sequence_number, r.delivery_count, r.state) for r in after] == [
        (r.sequence_number, r.delivery_count, r.state) for r in before
    ]
    assert queue.counts().dead_letter == 0
    assert after[0].state == ACTIVE
    assert [r.sequence_number for r in queue.receive(1)] == [seq]


@pytest.mark.parametrize("kind", [COMPLETE, ABANDON, DEAD_LETTER, DEFER, RELEASE])
def test_settle_with_already_used_token_raises_message_lock_lost(queue, msg, settle, kind):
    send(queue, msg, 2)
    [rec] = queue.receive(1)
    assert settle(queue, COMPLETE, rec.lock_token) is None
    counts = queue.counts()
    err = settle(queue, kind, rec.lock_token)
    assert isinstance(err, MessageLockLostError)
    assert queue.counts() == counts


def test_abandoned_token_cannot_settle_again(queue, msg, settle):
    send(queue, msg)
    [rec] = queue.receive(1)
    assert settle(queue, ABANDON, rec.lock_token) is None
    assert isinstance(settle(queue, COMPLETE, rec.lock_token), MessageLockLostError)
    # The message was not completed by the stale token.
    assert queue.counts().active == 1


def test_stale_token_does_not_affect_the_new_lock_on_the_same_message(queue, msg, clock, settle):
    send(queue, msg)
    [old] = queue.receive(1)
    clock.advance(LOCK + 1)
    [new] = queue.receive(1)
    assert new.sequence_number == old.sequence_number
    assert new.lock_token != old.lock_token
    assert isinstance(settle(queue, COMPLETE, old.lock_token), MessageLockLostError)
    assert queue.receive(1) == []  # still locked by the new token
    assert settle(queue, COMPLETE, new.lock_token) is None
    assert queue.counts().active == 0


def test_unknown_lock_token_raises_message_lock_lost(queue, msg, settle):
    send(queue, msg)
    err = settle(queue, COMPLETE, "not-a-token")
    assert isinstance(err, MessageLockLostError)


def test_refused_settlement_does_not_stop_the_others_in_the_batch(queue, msg):
    send(queue, msg, 2)
    a, b = queue.receive(2)
    results = queue.settle(
        [
            SettleOp(COMPLETE, "bogus"),
            SettleOp(COMPLETE, a.lock_token),
            SettleOp(DEFER, b.lock_token),
        ]
    )
    assert isinstance(results[0], MessageLockLostError)
    assert results[1:] == [None, None]
    [peeked] = queue.peek(0, 10)
    assert peeked.sequence_number == b.sequence_number
    assert peeked.state == DEFERRED


def test_unknown_settle_kind_is_refused(queue, msg, settle):
    send(queue, msg)
    [rec] = queue.receive(1)
    err = settle(queue, "bounce", rec.lock_token)
    assert isinstance(err, InvalidArgumentError)
    assert err.argument == "kind"
    assert settle(queue, COMPLETE, rec.lock_token) is None


# ---------------------------------------------------------------- lock expiry and abandon


def test_lock_expiry_makes_message_available_again_with_delivery_count_incremented(
    queue, msg, clock
):
    [seq] = send(queue, msg)
    [first] = queue.receive(1)
    assert queue.receive(1) == []
    clock.advance(LOCK)
    [second] = queue.receive(1)
    assert second.sequence_number == seq
    assert second.delivery_count == first.delivery_count + 1
    assert second.lock_token != first.lock_token


def test_abandon_increments_delivery_count_and_makes_message_available_at_once(queue, msg, settle):
    send(queue, msg)
    [rec] = queue.receive(1)
    assert settle(queue, ABANDON, rec.lock_token) is None
    [again] = queue.receive(1)
    assert again.sequence_number == rec.sequence_number
    assert again.delivery_count == rec.delivery_count + 1


def test_abandoned_message_is_redelivered_before_later_messages(queue, msg, settle):
    seqs = send(queue, msg, 3)
    [first] = queue.receive(1)
    [second] = queue.receive(1)
    assert settle(queue, ABANDON, second.lock_token) is None
    assert settle(queue, ABANDON, first.lock_token) is None
    # Lowest sequence number first, ahead of the never-delivered third message.
    got = queue.receive(3)
    assert [r.sequence_number for r in got] == seqs
    assert [r.delivery_count for r in got] == [1, 1, 0]


def test_message_moves_to_dead_letter_queue_after_max_delivery_count_deliveries(
    make_partition, msg, settle
):
    p = make_partition(lock_duration=LOCK, max_delivery_count=3)
    [seq] = p.send([msg(message_id="poison")])
    deliveries = 0
    while got := p.receive(1):
        deliveries += 1
        assert deliveries <= 3, "delivered more often than max_delivery_count"
        assert settle(p, ABANDON, got[0].lock_token) is None
    assert deliveries == 3
    counts = p.counts()
    assert (counts.active, counts.dead_letter) == (0, 1)
    [dead] = p.peek(0, 10, dead_letter=True)
    assert dead.sequence_number == seq
    assert dead.message_id == "poison"
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.dead_letter_error_description


def test_lock_expiries_count_toward_max_delivery_count(make_partition, msg, clock):
    p = make_partition(lock_duration=LOCK, max_delivery_count=2)
    p.send([msg()])
    assert len(p.receive(1)) == 1
    clock.advance(LOCK + 1)
    assert len(p.receive(1)) == 1
    clock.advance(LOCK + 1)
    assert p.receive(1) == []
    [dead] = p.peek(0, 10, dead_letter=True)
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"


def test_max_delivery_count_one_dead_letters_on_first_abandon(make_partition, msg, settle):
    p = make_partition(max_delivery_count=1)
    p.send([msg()])
    [rec] = p.receive(1)
    assert settle(p, ABANDON, rec.lock_token) is None
    assert p.receive(1) == []
    assert p.counts().dead_letter == 1


# ---------------------------------------------------------------- renew


def test_renew_locks_extends_lock_without_changing_delivery_count(queue, msg, clock, settle):
    send(queue, msg)
    t0 = clock.now()
    [rec] = queue.receive(1)
    clock.advance(20)
    [until] = queue.renew_locks([rec.lock_token])
    assert until == t0 + 20 + LOCK
    clock.advance(15)  # past the original expiry (t0 + 30), before the renewed one
    assert queue.receive(1) == []
    [peeked] = queue.peek(0, 1)
    assert peeked.delivery_count == 0
    assert settle(queue, COMPLETE, rec.lock_token) is None


def test_renewed_lock_expires_at_the_new_time(queue, msg, clock):
    send(queue, msg)
    [rec] = queue.receive(1)
    clock.advance(20)
    queue.renew_locks([rec.lock_token])
    clock.advance(LOCK)
    [again] = queue.receive(1)
    assert again.sequence_number == rec.sequence_number
    assert again.delivery_count == 1


def test_renew_of_expired_or_unknown_lock_returns_message_lock_lost(queue, msg, clock):
    send(queue, msg, 2)
    a, _ = queue.receive(2)
    clock.advance(LOCK + 1)
    [c] = queue.receive(1)
    results = queue.renew_locks([a.lock_token, "nope", c.lock_token])
    assert isinstance(results[0], MessageLockLostError)
    assert isinstance(results[1], MessageLockLostError)
    assert results[2] == clock.now() + LOCK


# ---------------------------------------------------------------- release


def test_release_puts_message_back_without_incrementing_delivery_count(queue, msg, settle):
    [seq] = send(queue, msg)
    [rec] = queue.receive(1)
    assert settle(queue, RELEASE, rec.lock_token) is None
    [again] = queue.receive(1)
    assert again.sequence_number == seq
    assert again.delivery_count == 0


# ---------------------------------------------------------------- defer


def test_defer_hides_message_from_receive_but_not_from_receive_deferred(queue, msg, settle):
    seqs = send(queue, msg, 2)
    [rec] = queue.receive(1)
    assert settle(queue, DEFER, rec.lock_token) is None
    got = queue.receive(5)
    assert [r.sequence_number for r in got] == seqs[1:]
    assert queue.counts().active == 2  # deferred messages stay in the main queue
    peeked = {r.sequence_number: r.state for r in queue.peek(0, 10)}
    assert peeked[seqs[0]] == DEFERRED == 1
    [deferred] = queue.receive_deferred([seqs[0]])
    assert deferred.sequence_number == seqs[0]
    assert deferred.lock_token
    assert settle(queue, COMPLETE, deferred.lock_token) is None
    assert [r.sequence_number for r in queue.peek(0, 10)] == seqs[1:]


def test_deferred_message_locked_by_receive_deferred_cannot_be_fetched_twice(queue, msg, settle):
    [seq] = send(queue, msg)
    [rec] = queue.receive(1)
    settle(queue, DEFER, rec.lock_token)
    queue.receive_deferred([seq])
    with pytest.raises(MessageNotFoundError):
        queue.receive_deferred([seq])


def test_deferred_message_stays_deferred_after_its_lock_ends(queue, msg, clock, settle):
    [seq] = send(queue, msg)
    [rec] = queue.receive(1)
    settle(queue, DEFER, rec.lock_token)
    [d1] = queue.receive_deferred([seq])
    assert settle(queue, ABANDON, d1.lock_token) is None
    assert queue.receive(1) == []
    [d2] = queue.receive_deferred([seq])
    clock.advance(LOCK + 1)
    assert queue.receive(1) == []
    [peeked] = queue.peek(0, 1)
    assert peeked.state == DEFERRED
    [d3] = queue.receive_deferred([seq])
    assert d3.delivery_count == d2.delivery_count + 1


def test_receive_deferred_with_delete_removes_message(queue, msg, settle):
    [seq] = send(queue, msg)
    [rec] = queue.receive(1)
    settle(queue, DEFER, rec.lock_token)
    [gone] = queue.receive_deferred([seq], delete=True)
    assert gone.sequence_number == seq
    assert queue.counts().active == 0


def test_receive_deferred_of_missing_sequence_number_raises_and_locks_nothing(queue, msg, settle):
    seqs = send(queue, msg, 2)
    [rec] = queue.receive(1)
    settle(queue, DEFER, rec.lock_token)
    missing = seqs[-1] + 1000
    with pytest.raises(MessageNotFoundError) as info:
        queue.receive_deferred([seqs[0], missing])
    assert info.value.sequence_numbers == [missing]
    # The deferred message was not locked by the failed call.
    [deferred] = queue.receive_deferred([seqs[0]])
    assert deferred.sequence_number == seqs[0]


def test_receive_deferred_of_an_active_message_raises_message_not_found(queue, msg):
    [seq] = send(queue, msg)
    with pytest.raises(MessageNotFoundError) as info:
        queue.receive_deferred([seq])
    assert info.value.sequence_numbers == [seq]
    assert [r.sequence_number for r in queue.receive(1)] == [seq]


def _deferred_dead_letter(queue, msg, settle):
    """A queue holding a dead letter deferred in its sub-queue and a deferred main message:
    (the dead letter's number, the main message's)."""
    dead, main = send(queue, msg, 2)
    [rec] = queue.receive(1)
    settle(queue, DEAD_LETTER, rec.lock_token, reason="r", description="d")
    [dl] = queue.receive(1, dead_letter=True)
    assert settle(queue, DEFER, dl.lock_token) is None
    [rec] = queue.receive(1)
    settle(queue, DEFER, rec.lock_token)
    return dead, main


def test_dead_letter_deferred_in_its_sub_queue_is_received_there_by_number(queue, msg, settle):
    dead, main = _deferred_dead_letter(queue, msg, settle)
    assert queue.receive(1, dead_letter=True) == []  # deferred: only by number
    [peeked] = queue.peek(0, 10, dead_letter=True)
    assert (peeked.sequence_number, peeked.state) == (dead, DEFERRED)
    [got] = queue.receive_deferred([dead], dead_letter=True)
    assert (got.sequence_number, got.dead_letter_reason) == (dead, "r")
    assert settle(queue, COMPLETE, got.lock_token) is None
    counts = queue.counts()
    assert (counts.active, counts.dead_letter) == (1, 0)  # the main queue's deferred one
    [kept] = queue.receive_deferred([main])
    assert kept.sequence_number == main


def test_each_sub_queue_finds_only_its_own_deferred_messages(queue, msg, settle):
    dead, main = _deferred_dead_letter(queue, msg, settle)
    for seq, dead_letter in ((main, True), (dead, False)):
        with pytest.raises(MessageNotFoundError) as info:
            queue.receive_deferred([seq], dead_letter=dead_letter, delete=True)
        assert info.value.sequence_numbers == [seq]
    counts = queue.counts()
    assert (counts.active, counts.dead_letter) == (1, 1)  # nothing deleted


def test_deferred_dead_letter_received_and_deleted_leaves_the_main_queue(queue, msg, settle):
    dead, _main = _deferred_dead_letter(queue, msg, settle)
    [gone] = queue.receive_deferred([dead], dead_letter=True, delete=True)
    assert gone.sequence_number == dead
    counts = queue.counts()
    assert (counts.active, counts.dead_letter) == (1, 0)


def test_deferred_dead_letter_never_expires_and_stays_deferred_after_its_lock(
    make_partition, msg, clock, settle
):
    queue = make_partition(lock_duration=LOCK, default_message_time_to_live=timedelta(seconds=60))
    dead, _main = _deferred_dead_letter(queue, msg, settle)
    clock.advance(3600)
    [d1] = queue.receive_deferred([dead], dead_letter=True)
    clock.advance(LOCK + 1)
    assert queue.receive(1, dead_letter=True) == []
    [d2] = queue.receive_deferred([dead], dead_letter=True)
    assert d2.delivery_count == d1.delivery_count + 1


# ---------------------------------------------------------------- dead-letter


def test_dead_letter_moves_message_with_reason_and_description(queue, msg, settle):
    [seq] = send(queue, msg)
    [rec] = queue.receive(1)
    err = settle(queue, DEAD_LETTER, rec.lock_token, reason="bad", description="cannot parse")
    assert err is None
    assert queue.receive(1) == []
    counts = queue.counts()
    assert (counts.active, counts.dead_letter) == (0, 1)
    [dead] = queue.peek(0, 10, dead_letter=True)
    assert dead.sequence_number == seq
    assert dead.dead_letter_reason == "bad"
    assert dead.dead_letter_error_description == "cannot parse"
    [from_dlq] = queue.receive(1, dead_letter=True)
    assert from_dlq.sequence_number == seq
    assert settle(queue, COMPLETE, from_dlq.lock_token) is None
    assert queue.counts().dead_letter == 0


def test_dead_letter_with_non_str_reason_is_refused_and_message_stays_locked(queue, msg, settle):
    send(queue, msg)
    [rec] = queue.receive(1)
    err = settle(queue, DEAD_LETTER, rec.lock_token, reason=42)
    assert isinstance(err, InvalidArgumentError)
    assert queue.counts().dead_letter == 0
    assert settle(queue, COMPLETE, rec.lock_token) is None


def test_dead_letter_of_message_already_in_dead_letter_queue_is_refused(queue, msg, settle):
    send(queue, msg)
    [rec] = queue.receive(1)
    settle(queue, DEAD_LETTER, rec.lock_token, reason="first")
    [dead] = queue.receive(1, dead_letter=True)
    err = settle(queue, DEAD_LETTER, dead.lock_token, reason="second")
    assert isinstance(err, InvalidArgumentError)
    [peeked] = queue.peek(0, 10, dead_letter=True)
    assert peeked.dead_letter_reason == "first"
    # The refusal left the lock in place.
    assert queue.receive(1, dead_letter=True) == []
    assert settle(queue, COMPLETE, dead.lock_token) is None


def test_abandon_in_dead_letter_queue_keeps_message_there(queue, msg, settle):
    send(queue, msg)
    [rec] = queue.receive(1)
    settle(queue, DEAD_LETTER, rec.lock_token)
    [dead] = queue.receive(1, dead_letter=True)
    assert settle(queue, ABANDON, dead.lock_token) is None
    assert queue.counts().dead_letter == 1
    assert len(queue.receive(1, dead_letter=True)) == 1


# ---------------------------------------------------------------- properties to modify


def test_abandon_with_properties_merges_them_into_application_properties(
    make_partition, msg, settle
):
    p = make_partition()
    p.send([msg(application_properties={"keep": 1, "change": "old"})])
    [rec] = p.receive(1)
    err = settle(p, ABANDON, rec.lock_token, properties={"change": "new", "added": True})
    assert err is None
    [again] = p.receive(1)
    assert again.application_properties == {"keep": 1, "change": "new", "added": True}


def test_abandon_with_properties_on_message_without_any(queue, msg, settle):
    send(queue, msg)
    [rec] = queue.receive(1)
    settle(queue, ABANDON, rec.lock_token, properties={"attempt": 1})
    [again] = queue.receive(1)
    assert again.application_properties == {"attempt": 1}


@pytest.mark.parametrize(
    "bad", [{"k": object()}, {"k": [1, 2]}, {"k": {"nested": 1}}, {1: "int key"}]
)
def test_abandon_with_invalid_properties_is_refused_and_message_stays_locked(
    queue, msg, settle, bad
):
    send(queue, msg)
    [rec] = queue.receive(1)
    err = settle(queue, ABANDON, rec.lock_token, properties=bad)
    assert isinstance(err, InvalidArgumentError)
    assert queue.receive(1) == []  # still locked
    [peeked] = queue.peek(0, 1)
    assert peeked.delivery_count == 0
    assert peeked.application_properties is None
    assert settle(queue, COMPLETE, rec.lock_token) is None


def test_defer_and_dead_letter_with_properties_merge_them(queue, msg, settle):
    send(queue, msg, 2)
    a, b = queue.receive(2)
    settle(queue, DEFER, a.lock_token, properties={"why": "later"})
    settle(queue, DEAD_LETTER, b.lock_token, properties={"why": "broken"})
    [deferred] = queue.peek(0, 10)
    assert deferred.application_properties == {"why": "later"}
    [dead] = queue.peek(0, 10, dead_letter=True)
    assert dead.application_properties == {"why": "broken"}


def _held_with_properties(queue, msg, **props):
    [seq] = queue.send([msg(message_id="m", application_properties=props or None)])
    [rec] = queue.receive(1)
    return seq, rec


@pytest.mark.parametrize("kind", [ABANDON, DEFER, DEAD_LETTER])
def test_properties_to_modify_that_would_pass_the_header_limit_are_refused(
    queue, msg, settle, kind
):
    # 64 KB of properties in all, as a send is held to: two of 30 KB sent, a third added.
    _seq, rec = _held_with_properties(queue, msg, a="x" * 30_000, b="y" * 30_000)
    err = settle(queue, kind, rec.lock_token, properties={"c": "z" * 30_000})
    assert isinstance(err, MessageSizeExceededError)
    assert err.max_size == 64 * 1024 and err.size > 90_000 and err.entity == "orders"
    [peeked] = queue.peek(0, 1)  # unchanged, still locked
    assert sorted(peeked.application_properties) == ["a", "b"]
    assert peeked.delivery_count == 0 and queue.receive(1) == []
    # Replacing a property counts its new value only; what fits is applied.
    assert settle(queue, kind, rec.lock_token, properties={"b": "z" * 3_000}) is None


def test_a_dead_letter_reason_or_description_over_32_kib_is_refused(queue, msg, settle):
    _seq, rec = _held_with_properties(queue, msg)
    for fields in ({"reason": "r" * 33_000}, {"description": "d" * 33_000}):
        err = settle(queue, DEAD_LETTER, rec.lock_token, **fields)
        assert isinstance(err, MessageSizeExceededError)
        assert err.max_size == 32 * 1024
        assert ("reason" if "reason" in fields else "error_description") in str(err)
    assert queue.counts().dead_letter == 0 and queue.receive(1) == []
    assert settle(queue, DEAD_LETTER, rec.lock_token, reason="r" * 30_000) is None
    [dead] = queue.peek(0, 1, dead_letter=True)
    assert len(dead.dead_letter_reason) == 30_000


def test_a_dead_letter_reason_counts_against_the_header_with_the_properties(queue, msg, settle):
    _seq, rec = _held_with_properties(queue, msg, a="x" * 30_000, b="y" * 30_000)
    err = settle(queue, DEAD_LETTER, rec.lock_token, reason="r" * 6_000)
    assert isinstance(err, MessageSizeExceededError)
    assert settle(queue, DEAD_LETTER, rec.lock_token, reason="r" * 4_000) is None
    # In the dead-letter sub-queue its reason stays counted: a property that would pass the
    # limit with it is refused.
    [dead] = queue.receive(1, dead_letter=True)
    err = settle(queue, ABANDON, dead.lock_token, properties={"c": "z" * 1_500})
    assert isinstance(err, MessageSizeExceededError)
    assert settle(queue, ABANDON, dead.lock_token, properties={"c": "z" * 10}) is None


# ---------------------------------------------------------------- delete, peek, deadline


def test_receive_and_delete_removes_message(queue, msg, clock):
    [seq] = send(queue, msg)
    [rec] = queue.receive(1, delete=True)
    assert rec.sequence_number == seq
    assert rec.lock_token is None
    counts = queue.counts()
    assert (counts.active, counts.size_in_bytes) == (0, 0)
    clock.advance(LOCK * 3)
    assert queue.receive(1) == []


def test_peek_shows_locked_messages_without_lock_and_takes_no_lock(queue, msg):
    seqs = send(queue, msg, 2)
    queue.receive(1)
    peeked = queue.peek(0, 10)
    assert [r.sequence_number for r in peeked] == seqs
    assert all(r.lock_token is None for r in peeked)
    # Peeking did not lock the second message.
    assert [r.sequence_number for r in queue.receive(5)] == seqs[1:]


def test_peek_from_sequence_number_and_max_count(queue, msg):
    seqs = send(queue, msg, 5)
    assert [r.sequence_number for r in queue.peek(seqs[2], 2)] == seqs[2:4]


def test_next_deadline_reports_earliest_lock_expiry(queue, msg, clock):
    assert queue.next_deadline() is None
    send(queue, msg, 2)
    t0 = clock.now()
    queue.receive(1)
    assert queue.next_deadline() == t0 + LOCK
    clock.advance(10)
    queue.receive(1)
    assert queue.next_deadline() == t0 + LOCK


def test_lock_expiries_tell_each_lock_without_changing_it(queue, msg, clock, settle):
    send(queue, msg, 2)
    a, b = queue.receive(2)
    clock.advance(5)
    assert queue.settle([SettleOp(COMPLETE, b.lock_token)]) == [None]
    held, used, unknown = queue.lock_expiries([a.lock_token, b.lock_token, "nope"])
    assert held == a.locked_until
    assert isinstance(used, MessageLockLostError) and isinstance(unknown, MessageLockLostError)
    clock.advance(LOCK - 5 + 1)  # not extended: past the original expiry it is gone
    [gone] = queue.lock_expiries([a.lock_token])
    assert isinstance(gone, MessageLockLostError)
    [again] = queue.receive(1)
    assert again.sequence_number == a.sequence_number and again.delivery_count == 1


# ---------------------------------------------------------------- who to wake


@pytest.mark.parametrize(
    ("kind", "available"),
    [(COMPLETE, False), (DEFER, False), (ABANDON, True), (RELEASE, True), (DEAD_LETTER, True)],
)
def test_a_settlement_makes_a_message_available_only_when_it_puts_one_back(
    queue, msg, kind, available
):
    """``makes_available`` tells the partition actor whether to wake its waiting receivers:
    and what it says matches what a receive finds (main queue or dead-letter sub-queue)."""
    send(queue, msg)
    [rec] = queue.receive(1)
    ops = [SettleOp(kind, rec.lock_token)]
    results = queue.settle(ops)
    assert results == [None]
    assert makes_available(ops, results) is available
    found = queue.receive(1) + queue.receive(1, dead_letter=True)
    assert bool(found) is available


def test_a_refused_settlement_makes_nothing_available(queue, msg):
    send(queue, msg)
    [rec] = queue.receive(1)
    ops = [SettleOp(ABANDON, "no-such-token"), SettleOp(COMPLETE, rec.lock_token)]
    results = queue.settle(ops)
    assert isinstance(results[0], MessageLockLostError) and results[1] is None
    assert makes_available(ops, results) is False
    assert queue.receive(1) == []
