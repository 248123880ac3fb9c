"""Sessions of one ``Partition``: session locks, per-session FIFO, session state, durability.

Every test drives a session-enabled partition (``requires_session=True``) with the FakeClock;
lock_duration is 30 s unless stated. No Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from raybus._core import journal
from raybus._core.partition import (
    ABANDON,
    COMPLETE,
    DEAD_LETTER,
    DEFER,
    MAX_DELIVERY_COUNT_EXCEEDED,
    SESSION_ID_IS_NULL,
    Partition,
    SettleOp,
)
from raybus._core.record import MessageRecord
from raybus._models import QueueProperties
from raybus.exceptions import (
    InvalidArgumentError,
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    ServiceBusQuotaExceededError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from raybus.testing import FakeClock

LOCK = 30.0
EVERYTHING = 1_000


@pytest.fixture
def sq(make_partition) -> Partition:
    """A session-enabled queue partition."""
    return make_partition(lock_duration=LOCK, requires_session=True)


def send_to(p: Partition, msg: Callable[..., MessageRecord], session_id: str | None, n: int = 1):
    return p.send([msg(session_id=session_id) for _ in range(n)])


def seqs_of(records: Iterable[MessageRecord]) -> list[int]:
    return [r.sequence_number for r in records]


def accept(p: Partition, session_id: str) -> tuple[str, str]:
    """Accept ``session_id``; return the ``session=`` argument for receive."""
    token, _ = p.accept_session(session_id)
    return session_id, token


# ---------------------------------------------------------------- sending to a session queue


def test_message_without_session_id_is_dead_lettered_as_session_id_is_null(sq, msg):
    [seq] = sq.send([msg(message_id="no-session")])
    counts = sq.counts()
    assert (counts.active, counts.dead_letter) == (0, 1)
    assert sq.accept_next_session() is None
    assert sq.list_sessions() == []

    [rec] = sq.receive(1, dead_letter=True)  # the dead-letter sub-queue needs no session
    assert rec.sequence_number == seq
    assert rec.message_id == "no-session"
    assert rec.dead_letter_reason == SESSION_ID_IS_NULL == "Session ID is null"
    assert rec.lock_token


def test_only_the_messages_without_session_id_of_a_batch_are_dead_lettered(sq, msg):
    seqs = sq.send([msg(session_id="a"), msg(), msg(session_id="a")])
    assert seqs_of(sq.peek(0, EVERYTHING)) == [seqs[0], seqs[2]]
    assert seqs_of(sq.peek(0, EVERYTHING, dead_letter=True)) == [seqs[1]]
    got = sq.receive(EVERYTHING, session=accept(sq, "a"))
    assert seqs_of(got) == [seqs[0], seqs[2]]


def test_partition_key_differing_from_session_id_is_rejected_and_nothing_is_stored(sq, msg):
    before = sq.counts()
    with pytest.raises(InvalidArgumentError) as err:
        sq.send([msg(session_id="a"), msg(session_id="a", partition_key="b")])
    assert err.value.argument == "partition_key"
    after = sq.counts()
    assert (after.active, after.dead_letter, after.scheduled, after.size_in_bytes) == (
        before.active,
        before.dead_letter,
        before.scheduled,
        before.size_in_bytes,
    )
    assert sq.peek(0, EVERYTHING) == []
    assert sq.list_sessions() == []
    assert sq.send([msg(session_id="a")]) == [1]  # no sequence number was used up


def test_partition_key_equal_to_session_id_is_accepted(sq, msg):
    [seq] = sq.send([msg(session_id="a", partition_key="a")])
    [rec] = sq.receive(1, session=accept(sq, "a"))
    assert rec.sequence_number == seq
    assert rec.partition_key == rec.session_id == "a"


# ---------------------------------------------------------------- receiving needs a session


def test_receive_without_session_on_a_session_queue_is_rejected(sq, msg):
    send_to(sq, msg, "a")
    with pytest.raises(InvalidArgumentError):
        sq.receive(1)
    with pytest.raises(InvalidArgumentError):
        sq.receive(1, delete=True)
    assert sq.counts().active == 1


def test_receive_deferred_without_session_on_a_session_queue_is_rejected(sq, msg):
    [seq] = send_to(sq, msg, "a")
    with pytest.raises(InvalidArgumentError):
        sq.receive_deferred([seq])


def test_receive_with_session_on_a_non_session_queue_is_rejected(make_partition, msg):
    p = make_partition(lock_duration=LOCK)
    p.send([msg(session_id="a")])
    with pytest.raises(InvalidArgumentError):
        p.receive(1, session=("a", "some-token"))
    assert len(p.receive(1)) == 1  # the message is untouched


def test_session_operations_on_a_non_session_queue_are_rejected(make_partition):
    p = make_partition(lock_duration=LOCK)
    with pytest.raises(InvalidArgumentError):
        p.accept_session("a")
    with pytest.raises(InvalidArgumentError):
        p.accept_next_session()
    with pytest.raises(InvalidArgumentError):
        p.list_sessions()


@pytest.mark.parametrize("bad", ["", None, 7])
def test_accept_session_needs_a_non_empty_str_id(sq, bad):
    with pytest.raises(InvalidArgumentError):
        sq.accept_session(bad)


def test_receive_with_a_token_that_does_not_hold_the_session_raises_session_lock_lost(sq, msg):
    send_to(sq, msg, "a")
    with pytest.raises(SessionLockLostError):
        sq.receive(1, session=("a", "not-the-token"))
    accept(sq, "a")
    with pytest.raises(SessionLockLostError):
        sq.receive(1, session=("a", "not-the-token"))


# ---------------------------------------------------------------- session locks


def test_accept_session_locks_it_for_the_lock_duration(sq, clock):
    token, until = sq.accept_session("a")
    assert token
    assert until == clock.now() + LOCK
    assert sq.next_deadline() == until


def test_second_accept_of_a_locked_session_raises_session_cannot_be_locked(sq, msg, clock):
    send_to(sq, msg, "a")
    sq.accept_session("a")
    with pytest.raises(SessionCannotBeLockedError):
        sq.accept_session("a")
    clock.advance(LOCK - 0.1)
    with pytest.raises(SessionCannotBeLockedError):
        sq.accept_session("a")


def test_session_can_be_accepted_again_after_its_lock_expired(sq, msg, clock):
    send_to(sq, msg, "a")
    old = accept(sq, "a")
    clock.advance(LOCK)
    assert sq.tick() is True
    new = accept(sq, "a")
    assert new[1] != old[1]
    with pytest.raises(SessionLockLostError):
        sq.receive(1, session=old)
    assert len(sq.receive(1, session=new)) == 1


def test_empty_session_lock_expires_too(sq, clock):
    sq.accept_session("a")
    clock.advance(LOCK)
    sq.tick()
    sq.accept_session("a")


def test_messages_of_an_expired_session_lock_come_back_counted_in_sequence_order(
    sq, msg, clock, settle
):
    seqs = send_to(sq, msg, "a", 3)
    session = accept(sq, "a")
    got = sq.receive(EVERYTHING, session=session)
    assert [r.delivery_count for r in got] == [0, 0, 0]
    clock.advance(LOCK)
    sq.tick()

    assert isinstance(settle(sq, COMPLETE, got[0].lock_token), MessageLockLostError)
    again = sq.receive(EVERYTHING, session=accept(sq, "a"))
    assert seqs_of(again) == seqs
    assert [r.delivery_count for r in again] == [1, 1, 1]


def test_expired_session_lock_dead_letters_messages_past_max_delivery_count(
    make_partition, msg, clock
):
    p = make_partition(lock_duration=LOCK, requires_session=True, max_delivery_count=2)
    [seq] = send_to(p, msg, "a")
    for _ in range(2):
        assert seqs_of(p.receive(1, session=accept(p, "a"))) == [seq]
        clock.advance(LOCK)
    [dead] = p.receive(1, dead_letter=True)
    assert dead.sequence_number == seq
    assert dead.dead_letter_reason == MAX_DELIVERY_COUNT_EXCEEDED
    assert p.receive(1, session=accept(p, "a")) == []


# ---------------------------------------------------------------- per-session FIFO


def test_session_receiver_gets_only_its_sessions_messages_in_sequence_order(sq, msg):
    seqs = sq.send([msg(session_id=sid) for sid in "ababbaa"])
    a_seqs = [s for s, sid in zip(seqs, "ababbaa", strict=True) if sid == "a"]
    b_seqs = [s for s, sid in zip(seqs, "ababbaa", strict=True) if sid == "b"]

    a = accept(sq, "a")
    first = sq.receive(2, session=a)
    rest = sq.receive(EVERYTHING, session=a)
    assert seqs_of(first + rest) == a_seqs
    assert {r.session_id for r in first + rest} == {"a"}
    assert sq.receive(EVERYTHING, session=a) == []

    got_b = sq.receive(EVERYTHING, session=accept(sq, "b"))
    assert seqs_of(got_b) == b_seqs


def test_session_messages_are_locked_until_the_session_lock_ends(sq, msg, clock):
    send_to(sq, msg, "a", 2)
    token, until = sq.accept_session("a")
    clock.advance(5)
    got = sq.receive(EVERYTHING, session=("a", token))
    assert [r.locked_until for r in got] == [until, until]
    assert all(r.lock_token for r in got)


def test_abandoned_session_message_is_the_next_one_delivered(sq, msg, settle):
    seqs = send_to(sq, msg, "a", 4)
    a = accept(sq, "a")
    got = sq.receive(3, session=a)
    assert seqs_of(got) == seqs[:3]

    assert sq.settle([SettleOp(ABANDON, got[1].lock_token)]) == [None]
    [again] = sq.receive(1, session=a)
    assert again.sequence_number == seqs[1]
    assert again.delivery_count == 1

    assert settle(sq, ABANDON, got[0].lock_token) is None
    assert seqs_of(sq.receive(1, session=a)) == [seqs[0]]
    assert seqs_of(sq.receive(EVERYTHING, session=a)) == [seqs[3]]


def test_completed_and_dead_lettered_session_messages_leave_the_session(sq, msg, settle):
    seqs = send_to(sq, msg, "a", 3)
    a = accept(sq, "a")
    got = sq.receive(2, session=a)
    assert settle(sq, COMPLETE, got[0].lock_token) is None
    assert settle(sq, DEAD_LETTER, got[1].lock_token, reason="bad") is None
    assert seqs_of(sq.receive(EVERYTHING, session=a)) == [seqs[2]]
    [dead] = sq.receive(1, dead_letter=True)
    assert (dead.sequence_number, dead.dead_letter_reason) == (seqs[1], "bad")


def test_receive_and_delete_within_a_session_removes_its_messages_in_order(sq, msg):
    seqs = sq.send([msg(session_id=sid) for sid in "abaa"])
    a = accept(sq, "a")
    first = sq.receive(2, session=a, delete=True)
    assert seqs_of(first) == [seqs[0], seqs[2]]
    assert all(r.lock_token is None for r in first)
    assert sq.counts().active == 2
    assert seqs_of(sq.receive(EVERYTHING, session=a, delete=True)) == [seqs[3]]
    assert sq.receive(EVERYTHING, session=a, delete=True) == []
    assert seqs_of(sq.peek(0, EVERYTHING)) == [seqs[1]]
    assert sq.release_session(*a)
    assert sq.list_sessions() == ["b"]


# ---------------------------------------------------------------- accept_next_session


def test_accept_next_session_returns_none_when_no_session_has_a_message(sq):
    assert sq.accept_next_session() is None


def test_accept_next_session_serves_the_longest_waiting_session_first(sq, msg, clock):
    sq.send([msg(session_id="b")])
    sq.send([msg(session_id="a"), msg(session_id="b")])
    sq.send([msg(session_id="c")])

    offered = []
    while (got := sq.accept_next_session()) is not None:
        session_id, token, until = got
        assert until == clock.now() + LOCK
        offered.append(session_id)
        assert sq.receive(EVERYTHING, session=(session_id, token))  # the token holds it
    assert offered == ["b", "a", "c"]


def test_accept_next_session_skips_sessions_locked_by_another_receiver(sq, msg):
    send_to(sq, msg, "a")
    send_to(sq, msg, "b")
    sq.accept_session("a")
    got = sq.accept_next_session()
    assert got is not None and got[0] == "b"
    assert sq.accept_next_session() is None


def test_accept_next_session_does_not_offer_a_session_whose_messages_are_all_deferred(
    sq, msg, settle
):
    send_to(sq, msg, "a")
    a = accept(sq, "a")
    [rec] = sq.receive(1, session=a)
    assert settle(sq, DEFER, rec.lock_token) is None
    assert sq.release_session(*a)
    assert sq.accept_next_session() is None
    assert not sq.has_available()
    send_to(sq, msg, "b")
    got = sq.accept_next_session()
    assert got is not None and got[0] == "b"
    assert sq.accept_next_session() is None


def test_accept_next_session_does_not_offer_a_session_whose_messages_are_all_handed_out(sq, msg):
    send_to(sq, msg, "a", 2)
    got = sq.accept_next_session()
    assert got is not None
    assert len(sq.receive(EVERYTHING, session=(got[0], got[1]))) == 2
    assert sq.accept_next_session() is None


def test_accept_next_session_does_not_offer_a_session_that_only_holds_state(sq):
    a = accept(sq, "a")
    sq.set_session_state(*a, b"state")
    assert sq.release_session(*a)
    assert sq.accept_next_session() is None
    assert sq.list_sessions() == ["a"]


def test_accept_next_session_offers_a_released_session_with_messages_again(sq, msg):
    send_to(sq, msg, "a")
    a = accept(sq, "a")
    sq.receive(1, session=a)
    assert sq.release_session(*a)
    got = sq.accept_next_session()
    assert got is not None and got[0] == "a"


def test_scheduled_session_message_makes_its_session_available_when_due(sq, msg, clock):
    [seq] = sq.send([msg(session_id="a", scheduled_enqueue_time=clock.now() + 10)])
    assert sq.accept_next_session() is None
    clock.advance(10)
    got = sq.accept_next_session()
    assert got is not None and got[0] == "a"
    [rec] = sq.receive(1, session=(got[0], got[1]))
    assert rec.sequence_number > seq  # a scheduled message gets a new number when active


def test_messages_sent_to_a_locked_session_go_to_its_holder(sq, msg):
    token, until = sq.accept_session("a")  # no messages yet
    seqs = send_to(sq, msg, "a", 2)
    assert sq.accept_next_session() is None
    assert not sq.has_available()
    with pytest.raises(SessionCannotBeLockedError):
        sq.accept_session("a")
    got = sq.receive(EVERYTHING, session=("a", token))
    assert seqs_of(got) == seqs
    assert [r.locked_until for r in got] == [until, until]


# ---------------------------------------------------------------- renewing and releasing


def test_renew_session_lock_extends_the_session_and_its_messages(sq, msg, clock, settle):
    send_to(sq, msg, "a", 2)
    token, old_until = sq.accept_session("a")
    [first] = sq.receive(1, session=("a", token))
    clock.advance(20)
    new_until = sq.renew_session_lock("a", token)
    assert new_until == clock.now() + LOCK
    assert new_until > old_until

    clock.advance(old_until - clock.now() + 5)  # past the old expiry, before the new one
    sq.tick()
    with pytest.raises(SessionCannotBeLockedError):
        sq.accept_session("a")
    assert settle(sq, COMPLETE, first.lock_token) is None  # the message lock was extended too
    [second] = sq.receive(EVERYTHING, session=("a", token))
    assert second.locked_until == new_until
    assert second.delivery_count == 0


def test_renew_and_settle_after_the_session_lock_expired_fail(sq, msg, clock, settle):
    send_to(sq, msg, "a")
    token, _ = sq.accept_session("a")
    [rec] = sq.receive(1, session=("a", token))
    clock.advance(LOCK)
    with pytest.raises(SessionLockLostError):
        sq.renew_session_lock("a", token)
    assert isinstance(settle(sq, COMPLETE, rec.lock_token), MessageLockLostError)
    assert sq.counts().active == 1


def test_renew_session_lock_with_a_wrong_token_raises_session_lock_lost(sq):
    sq.accept_session("a")
    with pytest.raises(SessionLockLostError):
        sq.renew_session_lock("a", "not-the-token")
    with pytest.raises(SessionLockLostError):
        sq.renew_session_lock("unknown", "not-the-token")


def test_renew_locks_refuses_a_session_message_token(sq, msg, settle):
    send_to(sq, msg, "a")
    [rec] = sq.receive(1, session=accept(sq, "a"))
    [refused, unknown] = sq.renew_locks([rec.lock_token, "no-such-token"])
    assert isinstance(refused, InvalidArgumentError)
    assert isinstance(unknown, MessageLockLostError)
    assert settle(sq, COMPLETE, rec.lock_token) is None  # still locked


def test_release_session_returns_its_messages_without_counting_a_delivery(sq, msg, settle):
    seqs = send_to(sq, msg, "a", 3)
    a = accept(sq, "a")
    got = sq.receive(EVERYTHING, session=a)
    assert sq.release_session(*a) is True

    assert isinstance(settle(sq, COMPLETE, got[0].lock_token), MessageLockLostError)
    with pytest.raises(SessionLockLostError):
        sq.receive(1, session=a)
    again = sq.receive(EVERYTHING, session=accept(sq, "a"))  # acceptable at once
    assert seqs_of(again) == seqs
    assert [r.delivery_count for r in again] == [0, 0, 0]


def test_release_session_with_a_wrong_token_returns_false_and_keeps_the_lock(sq, msg):
    send_to(sq, msg, "a")
    a = accept(sq, "a")
    assert sq.release_session("a", "not-the-token") is False
    assert sq.release_session("unknown", "not-the-token") is False
    with pytest.raises(SessionCannotBeLockedError):
        sq.accept_session("a")
    assert len(sq.receive(1, session=a)) == 1
    assert sq.release_session(*a) is True
    assert sq.release_session(*a) is False  # already released


# ---------------------------------------------------------------- session state


def test_session_state_requires_the_session_lock(sq, msg):
    send_to(sq, msg, "a")
    with pytest.raises(SessionLockLostError):
        sq.get_session_state("a", "not-the-token")
    with pytest.raises(SessionLockLostError):
        sq.set_session_state("a", "not-the-token", b"x")
    a = accept(sq, "a")
    sq.set_session_state(*a, b"x")
    assert sq.release_session(*a)
    with pytest.raises(SessionLockLostError):
        sq.get_session_state(*a)
    with pytest.raises(SessionLockLostError):
        sq.set_session_state(*a, b"y")
    assert sq.get_session_state(*accept(sq, "a")) == b"x"


def test_session_state_is_set_read_and_cleared(sq):
    a = accept(sq, "a")
    assert sq.get_session_state(*a) is None
    sq.set_session_state(*a, b"step-1")
    assert sq.get_session_state(*a) == b"step-1"
    sq.set_session_state(*a, b"step-2")
    assert sq.get_session_state(*a) == b"step-2"
    sq.set_session_state(*a, None)
    assert sq.get_session_state(*a) is None


def test_session_state_must_be_bytes_or_none(sq):
    a = accept(sq, "a")
    sq.set_session_state(*a, b"kept")
    with pytest.raises(InvalidArgumentError):
        sq.set_session_state(*a, "text")
    assert sq.get_session_state(*a) == b"kept"


def test_session_state_over_max_message_size_is_rejected_and_unchanged(make_partition):
    p = make_partition(lock_duration=LOCK, requires_session=True, max_message_size_in_kilobytes=1)
    a = accept(p, "a")
    p.set_session_state(*a, b"x" * 1024)  # exactly the limit is fine
    size = p.counts().size_in_bytes
    with pytest.raises(MessageSizeExceededError):
        p.set_session_state(*a, b"y" * 1025)
    assert p.get_session_state(*a) == b"x" * 1024
    assert p.counts().size_in_bytes == size


def test_session_state_counts_toward_size_in_bytes(sq, msg):
    send_to(sq, msg, "a")
    base = sq.counts().size_in_bytes
    a = accept(sq, "a")
    sq.set_session_state(*a, b"s" * 100)
    assert sq.counts().size_in_bytes == base + 100
    sq.set_session_state(*a, b"s" * 40)
    assert sq.counts().size_in_bytes == base + 40
    sq.set_session_state(*a, None)
    assert sq.counts().size_in_bytes == base


def test_session_state_counts_toward_the_queue_quota(make_partition, msg):
    p = make_partition(
        lock_duration=LOCK,
        requires_session=True,
        max_size_in_megabytes=1,
        max_message_size_in_kilobytes=1024,
    )
    a = accept(p, "a")
    p.set_session_state(*a, b"s" * (1024 * 1024))  # the whole quota
    with pytest.raises(ServiceBusQuotaExceededError):
        p.send([msg(session_id="a")])
    assert p.counts().active == 0
    p.set_session_state(*a, None)
    p.send([msg(session_id="a")])


def test_session_state_outlives_the_lock_and_its_messages(sq, msg, settle, clock):
    send_to(sq, msg, "a")
    a = accept(sq, "a")
    [rec] = sq.receive(1, session=a)
    sq.set_session_state(*a, b"kept")
    assert settle(sq, COMPLETE, rec.lock_token) is None
    clock.advance(LOCK)  # the lock expires
    assert sq.get_session_state(*accept(sq, "a")) == b"kept"
    assert sq.counts().size_in_bytes == len(b"kept")


def test_list_sessions_lists_sessions_with_messages_or_state(sq, msg):
    send_to(sq, msg, "with-message")
    s = accept(sq, "with-state")
    sq.set_session_state(*s, b"x")
    assert sq.release_session(*s)
    accept(sq, "locked-but-empty")
    assert sq.list_sessions() == ["with-message", "with-state"]


def test_list_sessions_updated_after_filters_by_state_update_time(sq, msg, clock):
    t0 = clock.now()
    send_to(sq, msg, "message-only")
    a = accept(sq, "a")
    sq.set_session_state(*a, b"1")
    clock.advance(10)
    b = accept(sq, "b")
    sq.set_session_state(*b, b"2")
    assert sq.list_sessions(updated_after=t0 + 5) == ["b"]
    assert sq.list_sessions(updated_after=t0 - 1) == ["a", "b"]
    assert sq.list_sessions(updated_after=clock.now()) == []
    clock.advance(10)
    sq.set_session_state(*a, b"3")
    assert sq.list_sessions(updated_after=t0 + 15) == ["a"]


def test_peek_with_session_id_shows_only_that_sessions_messages_unlocked(sq, msg):
    seqs = sq.send([msg(session_id=sid) for sid in "abab"])
    sq.receive(1, session=accept(sq, "a"))  # peek shows locked messages too, without the lock
    peeked = sq.peek(0, EVERYTHING, session_id="a")
    assert seqs_of(peeked) == [seqs[0], seqs[2]]
    assert all(r.lock_token is None for r in peeked)
    assert seqs_of(sq.peek(seqs[1] + 1, EVERYTHING, session_id="b")) == [seqs[3]]
    assert seqs_of(sq.peek(0, EVERYTHING)) == seqs


def test_empty_session_id_is_refused_at_send_and_nothing_is_stored(sq, msg):
    """An empty session id could be neither listed nor accepted by id: it is refused."""
    with pytest.raises(InvalidArgumentError) as err:
        sq.send([msg(session_id="a"), msg(session_id="")])
    assert err.value.argument == "session_id"
    assert sq.counts().active == 0 and sq.counts().dead_letter == 0
    assert sq.accept_next_session() is None


# ---------------------------------------------------------------- deferred messages


def test_receive_deferred_within_a_session_finds_only_that_sessions_messages(sq, msg, settle):
    [a_seq, b_seq] = sq.send([msg(session_id="a"), msg(session_id="b")])
    for sid in ("a", "b"):
        session = accept(sq, sid)
        [rec] = sq.receive(1, session=session)
        assert settle(sq, DEFER, rec.lock_token) is None
        assert sq.release_session(*session)

    a_token, a_until = sq.accept_session("a")
    with pytest.raises(MessageNotFoundError) as err:
        sq.receive_deferred([b_seq], session=("a", a_token))
    assert err.value.sequence_numbers == [b_seq]
    with pytest.raises(MessageNotFoundError):
        sq.receive_deferred([a_seq, b_seq], session=("a", a_token))  # all or none

    [got] = sq.receive_deferred([a_seq], session=("a", a_token))
    assert got.sequence_number == a_seq
    assert got.locked_until == a_until  # locked under the session lock
    assert settle(sq, COMPLETE, got.lock_token) is None

    [other] = sq.receive_deferred([b_seq], session=accept(sq, "b"))
    assert other.sequence_number == b_seq


def test_receive_deferred_with_a_lost_session_lock_raises_session_lock_lost(sq, msg, settle):
    [seq] = send_to(sq, msg, "a")
    a = accept(sq, "a")
    [rec] = sq.receive(1, session=a)
    assert settle(sq, DEFER, rec.lock_token) is None
    assert sq.release_session(*a)
    with pytest.raises(SessionLockLostError):
        sq.receive_deferred([seq], session=a)


# ---------------------------------------------------------------- forgetting sessions


def known_sessions(p: Partition) -> set[str]:
    assert p._sessions is not None
    return set(p._sessions.by_id)


@pytest.mark.parametrize("end", ["release", "expiry"])
def test_session_with_no_messages_state_or_lock_is_forgotten(sq, msg, settle, clock, end):
    send_to(sq, msg, "a")
    a = accept(sq, "a")
    [rec] = sq.receive(1, session=a)
    sq.set_session_state(*a, b"x")
    sq.set_session_state(*a, None)
    assert settle(sq, COMPLETE, rec.lock_token) is None
    assert "a" in known_sessions(sq)  # still locked
    if end == "release":
        assert sq.release_session(*a)
    else:
        clock.advance(LOCK)
        sq.tick()
    assert "a" not in known_sessions(sq)
    assert sq.list_sessions() == []
    assert sq.counts().size_in_bytes == 0


# ---------------------------------------------------------------- durability


def through_storage(entries: Iterable[journal.Entry]) -> list[journal.Entry]:
    return journal.from_table(journal.to_table(list(entries)))


def flush(p: Partition, log: list[journal.Entry]) -> None:
    """A successful group commit: the journal goes to ``log``, everything becomes visible."""
    entries, last = p.take_journal()
    log.extend(entries)
    p.visible_seq = max(p.visible_seq or 0, last)


def recovered(properties: QueueProperties, clock: FakeClock, entries: Iterable[journal.Entry]):
    p = Partition(properties, clock)
    p.load(journal.replay(through_storage(entries)))
    p.enable_journal()
    return p


def crash_history(sq: Partition, msg: Any, clock: FakeClock, settle: Any):
    """A journaled session queue with state, locked, abandoned, completed and dead-lettered
    session messages; returns (log, seqs by session, size, counts at the last flush)."""
    sq.enable_journal()
    log: list[journal.Entry] = []
    a_seqs = send_to(sq, msg, "a", 4)
    b_seqs = send_to(sq, msg, "b", 2)
    [null_seq] = sq.send([msg()])
    flush(sq, log)

    a = accept(sq, "a")
    sq.set_session_state(*a, b"a-state")
    got = sq.receive(3, session=a)
    assert settle(sq, COMPLETE, got[0].lock_token) is None
    assert settle(sq, ABANDON, got[1].lock_token) is None  # delivery count 1, journaled
    [again] = sq.receive(1, session=a)
    assert again.sequence_number == a_seqs[1]
    # got[2] and a_seqs[1] stay locked at the crash; a_seqs[3] was never received
    b = accept(sq, "b")
    sq.set_session_state(*b, b"b-state")
    sq.set_session_state(*b, None)
    assert sq.release_session(*b)
    flush(sq, log)
    counts = sq.counts()
    return log, a_seqs, b_seqs, null_seq, counts


@pytest.mark.parametrize("source", ["log", "checkpoint"])
def test_session_state_and_messages_survive_recovery(sq, msg, clock, settle, source):
    log, a_seqs, b_seqs, null_seq, counts = crash_history(sq, msg, clock, settle)
    entries = log if source == "log" else sq.snapshot_entries()
    restarted = recovered(sq.properties, clock, entries)

    after = restarted.counts()
    assert (after.active, after.dead_letter, after.scheduled, after.size_in_bytes) == (
        counts.active,
        counts.dead_letter,
        counts.scheduled,
        counts.size_in_bytes,
    )
    assert restarted.list_sessions() == ["a", "b"]
    assert restarted.list_sessions(updated_after=0) == ["a"]

    a = accept(restarted, "a")  # the lock from before the crash is gone
    assert restarted.get_session_state(*a) == b"a-state"
    got = restarted.receive(EVERYTHING, session=a)
    assert seqs_of(got) == a_seqs[1:]
    # abandoned once (counted); locked at the crash (not counted); never received
    assert [r.delivery_count for r in got] == [1, 0, 0]

    b = accept(restarted, "b")
    assert restarted.get_session_state(*b) is None
    assert seqs_of(restarted.receive(EVERYTHING, session=b)) == b_seqs

    [dead] = restarted.receive(1, dead_letter=True)
    assert (dead.sequence_number, dead.dead_letter_reason) == (null_seq, SESSION_ID_IS_NULL)


def test_checkpoint_plus_later_log_entries_replays_session_state_changes(sq, clock):
    sq.enable_journal()
    log: list[journal.Entry] = []
    a = accept(sq, "a")
    sq.set_session_state(*a, b"first")
    flush(sq, log)
    checkpoint = sq.snapshot_entries()
    tail_start = len(log)
    sq.set_session_state(*a, None)
    b = accept(sq, "b")
    sq.set_session_state(*b, b"second")
    flush(sq, log)

    restarted = recovered(sq.properties, clock, checkpoint + log[tail_start:])
    assert restarted.list_sessions() == ["b"]
    assert restarted.get_session_state(*accept(restarted, "b")) == b"second"
    assert restarted.get_session_state(*accept(restarted, "a")) is None
    assert restarted.counts().size_in_bytes == len(b"second")


def test_session_messages_are_not_offered_until_flushed(sq, msg):
    sq.enable_journal()
    log: list[journal.Entry] = []
    send_to(sq, msg, "a")
    assert sq.accept_next_session() is None
    a = accept(sq, "a")
    assert sq.receive(EVERYTHING, session=a) == []
    flush(sq, log)
    assert len(sq.receive(EVERYTHING, session=a)) == 1
