"""Time in one ``Partition``: message TTL and expiry, scheduled messages, deadlines and idleness
(spec §1.3 Defer, §1.5)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from raybus._core.partition import ABANDON, COMPLETE, DEFER, RELEASE, Partition
from raybus._core.record import ACTIVE, SCHEDULED
from raybus._models import QueueProperties
from raybus.exceptions import MessageLockLostError, MessageNotFoundError

LOCK = 30.0


def dead_letters(p):
    return p.peek(0, 100, dead_letter=True)


# ---------------------------------------------------------------- TTL


def test_message_is_never_delivered_after_its_time_to_live(make_partition, msg, clock):
    p = make_partition()
    p.send([msg(message_id="short", time_to_live=5.0), msg(message_id="long")])
    clock.advance(5.0)
    got = p.receive(10)
    assert [r.message_id for r in got] == ["long"]


def test_message_is_delivered_before_its_time_to_live(make_partition, msg, clock):
    p = make_partition()
    t0 = clock.now()
    p.send([msg(time_to_live=5.0)])
    clock.advance(4.9)
    [rec] = p.receive(1)
    assert rec.expires_at == t0 + 5.0


def test_expired_message_is_dropped_when_dead_lettering_on_expiration_is_off(
    make_partition, msg, clock
):
    p = make_partition()
    p.send([msg(time_to_live=5.0)])
    clock.advance(6)
    counts = p.counts()
    assert (counts.active, counts.dead_letter, counts.size_in_bytes) == (0, 0, 0)


def test_entity_default_ttl_caps_a_longer_message_ttl(make_partition, msg, clock):
    p = make_partition(default_message_time_to_live=timedelta(seconds=10))
    t0 = clock.now()
    p.send([msg(message_id="long", time_to_live=100.0), msg(message_id="short", time_to_live=3)])
    by_id = {r.message_id: r for r in p.peek(0, 10)}
    assert by_id["long"].time_to_live == 10.0
    assert by_id["long"].expires_at == t0 + 10.0
    assert by_id["short"].time_to_live == 3
    clock.advance(10.5)
    assert p.receive(10) == []


def test_entity_default_ttl_applies_to_messages_without_ttl(make_partition, msg, clock):
    p = make_partition(default_message_time_to_live=timedelta(seconds=10))
    p.send([msg()])
    clock.advance(11)
    assert p.receive(1) == []


def test_message_without_ttl_never_expires_by_default(make_partition, msg, clock):
    p = make_partition()
    p.send([msg()])
    [peeked] = p.peek(0, 1)
    assert peeked.expires_at == float("inf")
    clock.advance(10 * 365 * 86400)
    assert len(p.receive(1)) == 1


def test_expired_message_goes_to_dead_letter_queue_when_enabled(make_partition, msg, clock):
    p = make_partition(dead_lettering_on_message_expiration=True)
    [seq] = p.send([msg(message_id="stale", time_to_live=5.0)])
    clock.advance(6)
    assert p.receive(1) == []
    counts = p.counts()
    assert (counts.active, counts.dead_letter) == (0, 1)
    [dead] = dead_letters(p)
    assert dead.sequence_number == seq
    assert dead.dead_letter_reason == "TTLExpiredException"


def test_ttl_is_not_applied_inside_the_dead_letter_queue(make_partition, msg, clock):
    p = make_partition(dead_lettering_on_message_expiration=True)
    p.send([msg(time_to_live=5.0)])
    clock.advance(6)
    clock.advance(3600)
    assert len(p.receive(1, dead_letter=True)) == 1


def test_locked_message_is_not_expired_while_locked(make_partition, msg, clock, settle):
    p = make_partition(lock_duration=LOCK, dead_lettering_on_message_expiration=True)
    p.send([msg(time_to_live=5.0)])
    [rec] = p.receive(1)
    clock.advance(10)  # past TTL, lock still valid
    assert p.counts().dead_letter == 0
    assert p.renew_locks([rec.lock_token])[0] == clock.now() + LOCK
    # A successful complete wins over expiry.
    assert settle(p, COMPLETE, rec.lock_token) is None
    assert p.counts().dead_letter == 0


def test_locked_message_is_expired_when_its_lock_ends_after_ttl(make_partition, msg, clock):
    p = make_partition(lock_duration=LOCK, dead_lettering_on_message_expiration=True)
    p.send([msg(time_to_live=5.0)])
    p.receive(1)
    clock.advance(LOCK + 1)
    assert p.receive(1) == []
    [dead] = dead_letters(p)
    assert dead.dead_letter_reason == "TTLExpiredException"


def test_abandoned_message_past_ttl_is_expired_not_redelivered(make_partition, msg, clock, settle):
    p = make_partition(lock_duration=LOCK)
    p.send([msg(time_to_live=5.0)])
    [rec] = p.receive(1)
    clock.advance(10)
    assert settle(p, ABANDON, rec.lock_token) is None
    assert p.receive(1) == []
    assert p.counts().active == 0


def test_released_message_past_ttl_is_expired_not_redelivered(make_partition, msg, clock, settle):
    # Spec 1.5: expired messages "are never handed to receive"; a locked message is shielded
    # from expiry only until its lock is released.
    p = make_partition(lock_duration=LOCK)
    p.send([msg(time_to_live=5.0)])
    [rec] = p.receive(1)
    clock.advance(10)
    assert settle(p, RELEASE, rec.lock_token) is None
    assert p.receive(1) == []


def test_lock_expiring_before_ttl_leaves_message_receivable_until_ttl(make_partition, msg, clock):
    p = make_partition(lock_duration=5)
    p.send([msg(time_to_live=20.0)])
    p.receive(1)
    clock.advance(6)
    assert len(p.receive(1)) == 1
    clock.advance(6)  # lock ends again at t0+11 < TTL
    assert len(p.receive(1)) == 1
    clock.advance(10)  # now past TTL
    assert p.receive(1) == []


# ---------------------------------------------------------------- deferred messages and TTL


@pytest.fixture
def deferred(make_partition, msg, settle):
    """``deferred(ttl, **queue_options)``: a partition holding one deferred message, and its seq."""

    def make(ttl, **options):
        p = make_partition(**options)
        [seq] = p.send([msg(time_to_live=ttl)])
        [rec] = p.receive(1)
        assert settle(p, DEFER, rec.lock_token) is None
        return p, seq

    return make


def test_deferred_message_does_not_expire_on_its_own(deferred, clock):
    p, seq = deferred(5.0, dead_lettering_on_message_expiration=True)
    clock.advance(60)
    assert p.counts().active == 1
    assert p.counts().dead_letter == 0
    [peeked] = p.peek(0, 10)
    assert peeked.sequence_number == seq


def test_expired_deferred_message_fetched_by_sequence_number_is_reported_not_found(deferred, clock):
    p, seq = deferred(5.0)
    clock.advance(60)
    with pytest.raises(MessageNotFoundError) as info:
        p.receive_deferred([seq])
    assert info.value.sequence_numbers == [seq]
    assert p.counts().active == 0
    assert p.counts().dead_letter == 0


def test_expired_deferred_message_is_dead_lettered_when_fetched_if_enabled(deferred, clock):
    p, seq = deferred(5.0, dead_lettering_on_message_expiration=True)
    clock.advance(60)
    with pytest.raises(MessageNotFoundError):
        p.receive_deferred([seq])
    [dead] = dead_letters(p)
    assert dead.sequence_number == seq
    assert dead.dead_letter_reason == "TTLExpiredException"
    assert p.counts().active == 0


def test_unexpired_deferred_message_is_fetched_normally(deferred, clock):
    p, seq = deferred(100.0)
    clock.advance(60)
    [rec] = p.receive_deferred([seq])
    assert rec.sequence_number == seq


# ---------------------------------------------------------------- scheduling


def test_scheduled_message_is_counted_as_scheduled_and_not_receivable(make_partition, msg, clock):
    p = make_partition()
    at = clock.now() + 60
    [seq] = p.send([msg(message_id="later", scheduled_enqueue_time=at)])
    counts = p.counts()
    assert (counts.active, counts.scheduled) == (0, 1)
    assert p.receive(10) == []
    [peeked] = p.peek(0, 10)
    assert peeked.sequence_number == seq
    assert peeked.state == SCHEDULED == 2
    assert peeked.enqueued_time == at


def test_scheduled_message_becomes_receivable_with_a_new_sequence_number(
    make_partition, msg, clock
):
    p = make_partition()
    at = clock.now() + 60
    [scheduled_seq] = p.send([msg(message_id="later", scheduled_enqueue_time=at)])
    [other] = p.send([msg(message_id="now")])
    clock.advance(59)
    assert [r.message_id for r in p.receive(10)] == ["now"]
    clock.advance(1)
    [rec] = p.receive(10)
    assert rec.message_id == "later"
    assert rec.state == ACTIVE
    assert rec.sequence_number not in (scheduled_seq, other)
    assert rec.sequence_number == other + 1  # the next gap-free number
    assert rec.enqueued_time == at
    counts = p.counts()
    assert (counts.active, counts.scheduled) == (2, 0)


def test_scheduled_enqueue_time_in_the_past_is_sent_at_once(make_partition, msg, clock):
    p = make_partition()
    [seq] = p.send([msg(scheduled_enqueue_time=clock.now() - 10)])
    [rec] = p.receive(1)
    assert rec.sequence_number == seq
    assert p.counts().scheduled == 0


def test_scheduled_message_ttl_starts_at_its_scheduled_time(make_partition, msg, clock):
    p = make_partition()
    t0 = clock.now()
    p.send([msg(time_to_live=10.0, scheduled_enqueue_time=t0 + 60)])
    [peeked] = p.peek(0, 1)
    assert peeked.expires_at == t0 + 70
    clock.advance(60)
    [rec] = p.receive(1)
    assert rec.expires_at == t0 + 70
    clock.advance(LOCK)  # the lock ends after expiry: the message is gone
    assert p.receive(1) == []


def test_scheduled_message_is_not_delivered_after_its_expiry_even_if_activated_late(
    make_partition, msg, clock
):
    # Spec 1.5: "For a scheduled message the clock starts at the scheduled enqueue time" and
    # expired messages are never handed to receive. Nobody touched the partition until after
    # scheduled time + TTL.
    p = make_partition()
    t0 = clock.now()
    p.send([msg(time_to_live=10.0, scheduled_enqueue_time=t0 + 60)])
    clock.advance(100)
    assert p.receive(1) == []


def test_cancel_scheduled_removes_message(make_partition, msg, clock):
    p = make_partition()
    at = clock.now() + 60
    seqs = p.send([msg(scheduled_enqueue_time=at), msg(scheduled_enqueue_time=at)])
    p.cancel_scheduled([seqs[0]])
    counts = p.counts()
    assert (counts.active, counts.scheduled) == (0, 1)
    clock.advance(61)
    assert len(p.receive(10)) == 1
    assert p.counts().scheduled == 0


def test_cancel_scheduled_frees_its_bytes(make_partition, msg, clock):
    p = make_partition()
    [seq] = p.send([msg(scheduled_enqueue_time=clock.now() + 60)])
    p.cancel_scheduled([seq])
    assert p.counts().size_in_bytes == 0


def test_cancel_of_unknown_sequence_number_raises_and_cancels_none_of_the_batch(
    make_partition, msg, clock
):
    p = make_partition()
    [seq] = p.send([msg(scheduled_enqueue_time=clock.now() + 60)])
    with pytest.raises(MessageNotFoundError) as info:
        p.cancel_scheduled([seq, seq + 100])
    assert info.value.sequence_numbers == [seq + 100]
    assert p.counts().scheduled == 1
    [peeked] = p.peek(0, 10)
    assert peeked.state == SCHEDULED


def test_cancel_of_an_active_message_raises_message_not_found(make_partition, msg):
    p = make_partition()
    [seq] = p.send([msg()])
    with pytest.raises(MessageNotFoundError):
        p.cancel_scheduled([seq])
    assert p.counts().active == 1


def test_cancel_after_activation_raises_message_not_found(make_partition, msg, clock):
    p = make_partition()
    [seq] = p.send([msg(scheduled_enqueue_time=clock.now() + 10)])
    clock.advance(11)
    with pytest.raises(MessageNotFoundError):
        p.cancel_scheduled([seq])
    assert p.counts().active == 1


def test_scheduled_message_counts_for_duplicate_detection(make_partition, msg, clock):
    p = make_partition(requires_duplicate_detection=True)
    [seq] = p.send([msg(message_id="x", scheduled_enqueue_time=clock.now() + 60)])
    assert p.send([msg(message_id="x")]) == [seq]
    assert p.counts().active == 0


# ---------------------------------------------------------------- deadlines and idleness


def test_next_deadline_reports_the_schedule_time(make_partition, msg, clock):
    p = make_partition(lock_duration=LOCK)
    t0 = clock.now()
    assert p.next_deadline() is None
    p.send([msg(scheduled_enqueue_time=t0 + 100)])
    assert p.next_deadline() == t0 + 100
    p.send([msg(scheduled_enqueue_time=t0 + 50)])
    assert p.next_deadline() == t0 + 50
    p.send([msg()])
    p.receive(1)  # lock until t0 + 30
    assert p.next_deadline() == t0 + LOCK


def test_tick_reports_when_a_scheduled_message_becomes_available(make_partition, msg, clock):
    p = make_partition()
    p.send([msg(scheduled_enqueue_time=clock.now() + 10)])
    assert p.tick() is False
    assert p.has_available() is False
    clock.advance(10)
    assert p.tick() is True
    assert p.has_available() is True


def test_tick_reports_when_an_expired_lock_makes_a_message_available(make_partition, msg, clock):
    p = make_partition(lock_duration=LOCK)
    p.send([msg()])
    p.receive(1)
    clock.advance(LOCK)
    assert p.tick() is True


def test_idle_deadline_is_last_access_plus_auto_delete_on_idle(make_partition, msg, clock):
    p = make_partition(auto_delete_on_idle=timedelta(minutes=10))
    t0 = clock.now()
    assert p.idle_deadline() == t0 + 600
    clock.advance(100)
    p.send([msg()])
    assert p.idle_deadline() == t0 + 100 + 600
    clock.advance(50)
    p.peek(0, 1)  # browsing counts as activity
    assert p.idle_deadline() == t0 + 150 + 600
    assert p.counts().accessed_at == t0 + 150


def test_an_update_counts_as_use(make_partition, clock):
    p = make_partition(auto_delete_on_idle=timedelta(minutes=10))
    clock.advance(100)
    p.update_properties(p.properties)
    assert p.idle_deadline() == clock.now() + 600


def test_a_subscriptions_store_is_used_by_receives_and_peeks_not_by_its_topics_sends(msg, clock):
    # Service Bus deletes an idle subscription however busy its topic: what its receivers do
    # counts (receive, browse, settle, update), the topic's deliveries do not.
    props = QueueProperties(
        name="orders/Subscriptions/audit", auto_delete_on_idle=timedelta(minutes=10)
    )
    p = Partition(props, clock)
    t0 = clock.now()
    clock.advance(100)
    p.send([msg(), msg()])
    assert p.idle_deadline() == t0 + 600
    clock.advance(50)
    assert len(p.receive(1)) == 1
    assert p.idle_deadline() == t0 + 150 + 600
    clock.advance(50)
    p.peek(0, 1)
    assert p.idle_deadline() == t0 + 200 + 600


def test_idle_deadline_is_infinite_by_default(make_partition):
    p = make_partition()
    assert p.idle_deadline() == float("inf")


def test_expired_lock_token_cannot_renew(make_partition, msg, clock):
    p = make_partition(lock_duration=LOCK)
    p.send([msg()])
    [rec] = p.receive(1)
    clock.advance(LOCK)
    [res] = p.renew_locks([rec.lock_token])
    assert isinstance(res, MessageLockLostError)
