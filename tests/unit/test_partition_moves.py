"""Slot moves between partitions (``raybus._core.migration``).

Pure unit tests: plain ``Partition`` objects on a ``FakeClock``, no Ray. A is the source
(partition id 0), B the target (id 1, created serving no slot, as a new partition actor is),
C a spill target (id 2). Slots and maps: ``test_partition_slots.py``; journals and the model:
``test_partition_moves_journal.py``; helpers: ``partition_moves_support``.
"""

from __future__ import annotations

import pickle

import pytest
from partition_moves_support import (
    ALL,
    EVERYTHING,
    KEYED_QUEUE,
    NONE,
    SESSION_QUEUE,
    _session_history,
    accept,
    all_records,
    counted,
    deliver,
    ids_of,
    keys_in_distinct_slots,
    move,
    part,
    rec,
    settle_one,
    total_size,
    without_numbers,
)

from raybus._core import journal, migration
from raybus._core.partition import ABANDON, COMPLETE, DEAD_LETTER, DEFER, RELEASE
from raybus._core.record import ACTIVE, DEFERRED, SCHEDULED, to_wire
from raybus._core.slots import slot_of
from raybus.exceptions import MessageNotFoundError, PartitionMovedError

# ============================================================================ 2. moves


@pytest.mark.parametrize("owned", [None, ALL], ids=["unpartitioned-source", "partitioned-source"])
def test_session_moves_whole_in_order_with_every_field(clock, owned):
    a = part(clock, 0, owned, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    old = _session_history(clock, a)
    before = {r.message_id: r for r in a.peek(0, EVERYTHING, session_id="s1")}
    size_before = total_size(a, b)
    assert [before[m].state for m in old] == [ACTIVE, ACTIVE, DEFERRED, SCHEDULED, ACTIVE, ACTIVE]

    pinned = move(a, b, {slot_of("s1")})

    assert pinned == frozenset()
    assert a.peek(0, EVERYTHING, session_id="s1") == []
    assert "s1" not in a.list_sessions()
    assert a.counts().size_in_bytes == 0
    moved = b.peek(0, EVERYTHING, session_id="s1")
    assert ids_of(moved) == list(old)  # original order
    new = [r.sequence_number for r in moved]
    assert new == sorted(new) and len(set(new)) == len(new)
    assert all(s >> 48 == 1 for s in new)  # numbers of B
    for r in moved:
        assert without_numbers(r) == without_numbers(before[r.message_id])
    assert total_size(a, b) == size_before
    assert b.owned == frozenset({slot_of("s1")})
    assert a.owned == ALL - {slot_of("s1")}

    session = accept(b, "s1")
    assert b.get_session_state(*session) == b"state of s1"
    got = b.receive(EVERYTHING, session=session)
    assert ids_of(got) == ["m0", "m1", "m4", "m5"]
    assert [r.delivery_count for r in got] == [1, 0, 0, 0]
    assert got[0].application_properties == {"k": 1, "retry": True}
    assert got[3].application_properties == {"x": "y"}
    [deferred] = b.receive_deferred([old["m2"]], session=session)
    assert deferred.message_id == "m2" and deferred.state == DEFERRED


def test_moved_messages_keep_their_expiry(clock):
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    a.send([rec(message_id="short", session_id="s1", time_to_live=100.0)])
    a.send([rec(message_id="long", session_id="s1", time_to_live=1000.0)])
    clock.advance(60)
    move(a, b, {slot_of("s1")})
    clock.advance(39)
    assert ids_of(b.peek(0, EVERYTHING)) == ["short", "long"]
    clock.advance(2)  # 101 s after "short" was sent
    assert ids_of(b.peek(0, EVERYTHING)) == ["long"]
    assert b.counts().active == 1


def test_moved_message_expiring_is_dead_lettered_when_the_queue_says_so(clock):
    options = {**KEYED_QUEUE, "dead_lettering_on_message_expiration": True}
    a = part(clock, 0, ALL, **options)
    b = part(clock, 1, NONE, **options)
    a.send([rec(message_id="m", partition_key="k", time_to_live=10.0)])
    move(a, b, {slot_of("k")})
    clock.advance(11)
    [dead] = b.peek(0, EVERYTHING, dead_letter=True)
    assert dead.message_id == "m"
    assert dead.dead_letter_reason == "TTLExpiredException"


def test_source_refuses_moved_keys_and_still_serves_the_kept_ones(clock):
    s1, s2 = keys_in_distinct_slots("s", 2)
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    a.send([rec(message_id="x", session_id=s1), rec(message_id="y", session_id=s2)])
    out, pinned = migration.hand_over(a, {1: frozenset({slot_of(s1)})}, None)
    assert pinned == frozenset()
    counts = counted(a)

    with pytest.raises(PartitionMovedError):
        a.send([rec(message_id="x2", session_id=s1)])
    with pytest.raises(PartitionMovedError):  # a batch is refused whole
        a.send([rec(message_id="y2", session_id=s2), rec(message_id="x3", session_id=s1)])
    with pytest.raises(PartitionMovedError):
        a.accept_session(s1)
    assert counted(a) == counts
    assert ids_of(a.peek(0, EVERYTHING)) == ["y"]

    # Until it has adopted the move the target refuses the key too (the sender retries).
    with pytest.raises(PartitionMovedError):
        b.send([rec(message_id="x2", session_id=s1)])
    with pytest.raises(PartitionMovedError):
        b.accept_session(s1)
    deliver({1: b}, a, out)
    b.send([rec(message_id="x2", session_id=s1)])
    assert ids_of(b.peek(0, EVERYTHING)) == ["x", "x2"]

    a.send([rec(message_id="y2", session_id=s2)])
    session = accept(a, s2)
    assert ids_of(a.receive(EVERYTHING, session=session)) == ["y", "y2"]


def test_keyed_messages_of_a_non_session_queue_move_with_their_slot(clock):
    k1, k2 = keys_in_distinct_slots("key", 2)
    a = part(clock, 0, ALL)
    b = part(clock, 1, NONE)
    a.send([rec(message_id=f"{k}-{i}", partition_key=k) for i in range(3) for k in (k1, k2)])
    a.send([rec(message_id="unkeyed")])
    move(a, b, {slot_of(k1)})
    assert ids_of(b.peek(0, EVERYTHING)) == [f"{k1}-{i}" for i in range(3)]
    assert ids_of(a.peek(0, EVERYTHING)) == [f"{k2}-{i}" for i in range(3)] + ["unkeyed"]
    with pytest.raises(PartitionMovedError):
        a.send([rec(partition_key=k1)])
    a.send([rec(message_id="still unkeyed")])  # a live partition takes unkeyed messages
    assert ids_of(b.receive(EVERYTHING)) == [f"{k1}-{i}" for i in range(3)]


@pytest.mark.parametrize("owned", [None, ALL], ids=["unpartitioned-source", "partitioned-source"])
@pytest.mark.parametrize("kind", ["session", "partition_key"])
def test_duplicate_detection_ids_move_with_their_slot(clock, owned, kind):
    """A message id accepted before the move is a duplicate at the target afterwards.

    The id is placed by the message's key (its session or partition key), which here lies in
    another slot than the message id itself would."""
    options = SESSION_QUEUE if kind == "session" else KEYED_QUEUE
    key, mid = "s1", "m1"
    assert slot_of(key) != slot_of(mid)
    field = {"session_id": key} if kind == "session" else {"partition_key": key}
    a = part(clock, 0, owned, **options)
    b = part(clock, 1, NONE, **options)
    [first] = a.send([rec(message_id=mid, **field)])
    move(a, b, {slot_of(key)})
    assert b.counts().active == 1

    again = b.send([rec(message_id=mid, **field)])

    assert b.counts().active == 1, "the repeated message id was stored again at the target"
    assert again == [first]


def test_duplicate_detection_window_keeps_running_at_the_target(clock):
    a = part(clock, 0, ALL, duplicate_detection_history_time_window=60, **SESSION_QUEUE)
    b = part(clock, 1, NONE, duplicate_detection_history_time_window=60, **SESSION_QUEUE)
    a.send([rec(message_id="m", session_id="s1")])
    clock.advance(40)
    move(a, b, {slot_of("s1")})
    b.send([rec(message_id="m", session_id="s1")])
    assert b.counts().active == 1  # 40 s: still a duplicate
    clock.advance(21)
    b.send([rec(message_id="m", session_id="s1")])
    assert b.counts().active == 2  # 61 s after the first copy: a new message


def test_a_session_held_by_a_receiver_pins_its_slot(clock):
    held, free = keys_in_distinct_slots("s", 2)
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    a.send([rec(message_id=f"{s}-{i}", session_id=s) for i in range(2) for s in (held, free)])
    session = accept(a, held)
    [first] = a.receive(1, session=session)
    a.set_session_state(held, session[1], b"kept")
    slots = {slot_of(held), slot_of(free)}

    pinned = move(a, b, slots)

    assert pinned == frozenset({slot_of(held)})
    assert a.owned == ALL - {slot_of(free)}
    assert b.owned == frozenset({slot_of(free)})
    assert ids_of(b.peek(0, EVERYTHING)) == [f"{free}-0", f"{free}-1"]
    assert ids_of(a.peek(0, EVERYTHING)) == [f"{held}-0", f"{held}-1"]
    # A keeps serving the pinned session: its lock, its messages, its state, new sends.
    a.send([rec(message_id=f"{held}-2", session_id=held)])
    settle_one(a, COMPLETE, first.lock_token)
    assert ids_of(a.receive(EVERYTHING, session=session)) == [f"{held}-1", f"{held}-2"]
    assert a.get_session_state(*session) == b"kept"
    assert a.release_session(*session)

    # Released, it moves on the next try, with everything not yet completed.
    assert move(a, b, {slot_of(held)}) == frozenset()
    assert ids_of(b.peek(0, EVERYTHING, session_id=held)) == [f"{held}-1", f"{held}-2"]
    assert [r.delivery_count for r in b.peek(0, EVERYTHING, session_id=held)] == [0, 0]
    assert b.get_session_state(*accept(b, held)) == b"kept"
    assert b.owned == frozenset(slots)
    assert a.owned == ALL - slots


def test_locked_non_session_messages_are_never_moved(clock):
    a = part(clock, 0, ALL)
    b = part(clock, 1, NONE)
    a.send([rec(message_id=f"k-{i}", partition_key="k") for i in range(3)])
    [locked] = a.receive(1)
    move(a, b, {slot_of("k")})
    assert ids_of(a.peek(0, EVERYTHING)) == ["k-0"]
    assert ids_of(b.peek(0, EVERYTHING)) == ["k-1", "k-2"]
    settle_one(a, COMPLETE, locked.lock_token)  # its receiver settles it where it is
    assert a.counts().active == 0


def test_retiring_source_spills_everything_unlocked_and_empties_after_settlement(clock):
    key = "k"
    a = part(clock, 0, ALL)
    b = part(clock, 1, NONE)
    c = part(clock, 2, NONE)
    parts = {1: b, 2: c}
    a.send([rec(message_id="u0"), rec(message_id="u1")])
    a.send([rec(message_id="dead")])
    a.send([rec(message_id="keyed", partition_key=key)])
    a.send([rec(message_id="later", scheduled_enqueue_time=clock.now() + 100)])
    first, second, dead = a.receive(3)
    assert ids_of([first, second, dead]) == ["u0", "u1", "dead"]
    settle_one(a, RELEASE, second.lock_token)
    settle_one(a, DEAD_LETTER, dead.lock_token, reason="bad", description="very")
    size_before = total_size(a, b, c)

    out, pinned = migration.hand_over(a, {1: ALL}, 2)

    assert pinned == frozenset()
    assert a.retiring and a.owned == frozenset()
    assert sorted(t for t, _ in out.values()) == [1, 2]
    with pytest.raises(PartitionMovedError):  # retiring: no unkeyed message either
        a.send([rec(message_id="new")])
    with pytest.raises(PartitionMovedError):
        a.send([rec(message_id="new", partition_key=key)])
    assert not migration.is_empty(a)  # bundles in transit, u0 locked
    deliver(parts, a, out)
    assert ids_of(a.peek(0, EVERYTHING)) == ["u0"]
    assert a.peek(0, EVERYTHING, dead_letter=True) == []
    assert not migration.is_empty(a)  # u0 is still locked here
    assert ids_of(b.peek(0, EVERYTHING)) == ["keyed"]
    assert ids_of(c.peek(0, EVERYTHING)) == ["u1", "later"]
    assert [r.state for r in c.peek(0, EVERYTHING)] == [ACTIVE, SCHEDULED]
    [spilled_dead] = c.peek(0, EVERYTHING, dead_letter=True)
    assert (spilled_dead.message_id, spilled_dead.dead_letter_reason) == ("dead", "bad")
    assert spilled_dead.dead_letter_error_description == "very"
    assert total_size(a, b, c) == size_before

    settle_one(a, ABANDON, first.lock_token)  # back in the queue, still here
    assert not migration.is_empty(a)
    out, _ = migration.hand_over(a, {}, 2)
    assert not migration.is_empty(a)  # in transit
    deliver(parts, a, out)
    assert migration.is_empty(a)
    u0 = c.peek(0, EVERYTHING)[-1]
    assert (u0.message_id, u0.delivery_count) == ("u0", 1)
    assert total_size(a, b, c) == size_before
    assert ids_of(c.receive(EVERYTHING)) == ["u1", "u0"]
    assert ids_of(c.receive(EVERYTHING, dead_letter=True)) == ["dead"]


def test_retiring_source_with_a_held_session_empties_once_it_is_released(clock):
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    a.send([rec(message_id="m", session_id="s1")])
    session = accept(a, "s1")
    out, pinned = migration.hand_over(a, {1: ALL}, 1)
    deliver({1: b}, a, out)
    assert pinned == frozenset({slot_of("s1")})
    assert a.owned == pinned
    assert not migration.is_empty(a)
    assert ids_of(a.receive(1, session=session)) == ["m"]
    assert a.release_session(*session)
    assert not migration.is_empty(a)
    out, pinned = migration.hand_over(a, {1: frozenset({slot_of("s1")})}, 1)
    assert pinned == frozenset()
    deliver({1: b}, a, out)
    assert migration.is_empty(a)
    assert b.owned == ALL
    assert ids_of(b.receive(1, session=accept(b, "s1"))) == ["m"]


def test_adopt_is_idempotent_per_move_id(clock):
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    _session_history(clock, a)
    out, _ = migration.hand_over(a, {1: frozenset({slot_of("s1")})}, None)
    [(move_id, (target, bundle))] = out.items()
    assert target == 1
    assert migration.adopt(b, move_id, bundle) is True
    view = [to_wire([r])[0] for r in all_records(b)]
    counts = counted(b)
    resent = journal.from_table(journal.to_table([(0, 0, 0, bundle)]))[0][3]  # a fresh copy

    assert migration.adopt(b, move_id, bundle) is False
    assert migration.adopt(b, move_id, resent) is False

    assert [to_wire([r])[0] for r in all_records(b)] == view
    assert counted(b) == counts
    # Another move id is another move (the source never reuses one).
    assert migration.adopt(b, "another", migration.Bundle(frozenset())) is True


def test_finish_drops_the_outbox_entry(clock):
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    c = part(clock, 2, NONE, **SESSION_QUEUE)
    s1, s2 = keys_in_distinct_slots("s", 2)
    a.send([rec(session_id=s1), rec(session_id=s2)])
    out, _ = migration.hand_over(
        a, {1: frozenset({slot_of(s1)}), 2: frozenset({slot_of(s2)})}, None
    )
    assert a.outbox == out and len(out) == 2
    assert {t: bun.slots for t, bun in out.values()} == {
        1: frozenset({slot_of(s1)}),
        2: frozenset({slot_of(s2)}),
    }
    (id1, (_, b1)), (id2, (_, b2)) = sorted(out.items(), key=lambda kv: kv[1][0])
    migration.adopt(b, id1, b1)
    migration.finish(a, id1)
    assert set(a.outbox) == {id2}
    migration.finish(a, id1)  # again: nothing
    migration.finish(a, "unknown")
    assert set(a.outbox) == {id2}
    migration.adopt(c, id2, b2)
    migration.finish(a, id2)
    assert a.outbox == {}


def test_a_move_with_no_message_still_carries_its_slots(clock):
    a = part(clock, 0, ALL)
    b = part(clock, 1, NONE)
    slots = frozenset(range(10, 20))
    out, _ = migration.hand_over(a, {1: slots}, None)
    [(target, bundle)] = out.values()
    assert (target, bundle.slots, bundle.records) == (1, slots, [])
    deliver({1: b}, a, out)
    assert b.owned == slots
    assert a.owned == ALL - slots


@pytest.mark.parametrize("sessions", [False, True], ids=["keyed", "session"])
def test_deferred_and_scheduled_messages_are_found_by_their_old_numbers(clock, sessions):
    options = SESSION_QUEUE if sessions else KEYED_QUEUE
    field = {"session_id": "s1"} if sessions else {"partition_key": "s1"}
    a = part(clock, 0, ALL, **options)
    b = part(clock, 1, NONE, **options)
    d_seq, s_seq, s2_seq = a.send(
        [
            rec(message_id="deferred", **field),
            rec(message_id="scheduled", scheduled_enqueue_time=clock.now() + 60, **field),
            rec(message_id="scheduled2", scheduled_enqueue_time=clock.now() + 60, **field),
        ]
    )
    session = accept(a, "s1") if sessions else None
    [d] = a.receive(1, session=session)
    settle_one(a, DEFER, d.lock_token)
    if session is not None:
        a.release_session(*session)

    move(a, b, {slot_of("s1")})

    assert a.locate([d_seq, s_seq, s2_seq]) == []
    assert b.locate([d_seq, s_seq, s2_seq]) == [d_seq, s_seq, s2_seq]
    assert b.resolve(d_seq) != d_seq and b.resolve(d_seq) >> 48 == 1
    assert b.counts().scheduled == 2
    b.cancel_scheduled([s_seq])
    assert b.counts().scheduled == 1
    assert b.locate([s_seq]) == []
    with pytest.raises(MessageNotFoundError):
        b.cancel_scheduled([s_seq])
    session = accept(b, "s1") if sessions else None
    [got] = b.receive_deferred([d_seq], session=session)
    assert got.message_id == "deferred"
    assert got.sequence_number == b.resolve(d_seq)
    settle_one(b, COMPLETE, got.lock_token)
    if session is not None:
        b.release_session(*session)
    # The other scheduled message turns active at its time, at the target.
    clock.advance(61)
    session = accept(b, "s1") if sessions else None
    assert "scheduled2" in ids_of(b.receive(EVERYTHING, session=session))


def test_a_message_moved_twice_is_still_found_by_its_original_number(clock):
    """A deferred message keeps working under the number its sender was given, however many
    times its slot moves (A -> B -> C here, as two consecutive scale-ups would do)."""
    a = part(clock, 0, ALL, **KEYED_QUEUE)
    b = part(clock, 1, NONE, **KEYED_QUEUE)
    c = part(clock, 2, NONE, **KEYED_QUEUE)
    [seq] = a.send([rec(message_id="d", partition_key="k")])
    [r] = a.receive(1)
    settle_one(a, DEFER, r.lock_token)
    move(a, b, {slot_of("k")})
    assert b.locate([seq]) == [seq]
    move(b, c, {slot_of("k")})
    assert ids_of(c.peek(0, EVERYTHING)) == ["d"]
    # Each source tells where it went (``migration.moved``); b knew it by an alias.
    assert migration.moved(a, [seq]) == {seq: (1, None)}
    assert migration.moved(b, [seq]) == {seq: (2, None)}

    assert c.locate([seq]) == [seq], "the deferred message is lost to its original number"
    [got] = c.receive_deferred([seq])
    assert got.message_id == "d"


def test_a_dead_letter_deferred_in_its_sub_queue_is_found_by_its_number_after_a_spill(clock):
    """A retiring partition spills its dead letters too; one deferred there is asked for by
    number from the dead-letter sub-queue, so the source says where it went and the target
    knows it by that number (in that sub-queue only)."""
    a = part(clock, 0, ALL)
    b = part(clock, 1, NONE)
    c = part(clock, 2, NONE)
    [seq] = a.send([rec(message_id="dead")])
    [r] = a.receive(1)
    settle_one(a, DEAD_LETTER, r.lock_token, reason="bad")
    [dl] = a.receive(1, dead_letter=True)
    settle_one(a, DEFER, dl.lock_token)

    move(a, b, ALL, spill=c)

    assert migration.moved(a, [seq]) == {seq: (2, None)}
    assert c.locate([seq], dead_letter=True) == [seq]
    assert c.locate([seq]) == []
    with pytest.raises(MessageNotFoundError):
        c.receive_deferred([seq])
    [got] = c.receive_deferred([seq], dead_letter=True)
    assert (got.message_id, got.state, got.dead_letter_reason) == ("dead", DEFERRED, "bad")


def test_a_moved_message_keeps_its_first_number_as_its_enqueued_sequence_number(clock):
    """What a receiver's peeks use to leave out a message they were shown before it moved
    (``raybus.aio._sequence_reads.PeekedRanges``): A -> B -> C, and through a restart."""
    a = part(clock, 0, ALL, **KEYED_QUEUE)
    b = part(clock, 1, NONE, **KEYED_QUEUE)
    c = part(clock, 2, NONE, **KEYED_QUEUE)
    [first] = a.send([rec(message_id="m", partition_key="k")])
    move(a, b, {slot_of("k")})
    move(b, c, {slot_of("k")})
    [moved] = c.peek(0, EVERYTHING)
    assert moved.sequence_number >> 48 == 2 and moved.enqueued_sequence_number == first
    restarted = part(clock, 2, NONE, **KEYED_QUEUE)
    restarted.load(journal.replay(c.snapshot_entries()))
    [kept] = restarted.peek(0, EVERYTHING)
    assert (kept.sequence_number, kept.enqueued_sequence_number) == (moved.sequence_number, first)


def test_size_is_conserved_with_session_state_and_dead_letters(clock):
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    _session_history(clock, a)
    a.send([rec(message_id="no session")])  # dead-lettered: Session ID is null
    before = total_size(a, b)
    assert before > 0
    move(a, b, {slot_of("s1")})
    assert total_size(a, b) == before
    assert a.counts().size_in_bytes == sum(r.size for r in all_records(a))
    state = len(b"state of s1")
    assert b.counts().size_in_bytes == sum(r.size for r in all_records(b)) + state


def test_counts_keep_what_is_in_transit_at_the_source_until_it_is_confirmed(clock):
    # A retiring partition with active, scheduled and dead-lettered messages and a session's
    # state: between hand_over and finish the entity's counts must not drop.
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    _session_history(clock, a)
    a.send([rec(message_id="no session")])  # dead-lettered: Session ID is null
    held = counted(a)
    assert held[0] > 0 and held[1] == 1 and held[2] == 1 and held[3] > 0

    out, _ = migration.hand_over(a, {1: frozenset({slot_of("s1")})}, b.partition_id)
    assert all_records(a) == []  # taken out of the stores: in the outbox only
    assert counted(a) == held and counted(b) == (0, 0, 0, 0)

    [(move_id, (_target, bundle))] = out.items()
    migration.adopt(b, move_id, bundle)
    migration.finish(a, move_id)
    assert counted(a) == (0, 0, 0, 0) and counted(b) == held


def test_a_bundles_summaries_are_derived_once_and_never_journaled(clock):
    a = part(clock, 0, ALL, **KEYED_QUEUE)
    [d_seq] = a.send([rec(message_id="d", partition_key="k")])
    [d] = a.receive(1)
    settle_one(a, DEFER, d.lock_token)
    a.send([rec(message_id="active", partition_key="k")])
    out, _ = migration.hand_over(a, {1: frozenset({slot_of("k")})}, None)
    [(_target, bundle)] = out.values()
    # Deferred counts as active, as in the stores; only the deferred one is asked by number.
    assert (bundle.tally[:3], bundle.addressed) == ((2, 0, 0), frozenset({d_seq}))
    assert "tally" in vars(bundle)  # derived once, kept for the next count or lookup
    copy = pickle.loads(pickle.dumps(bundle))  # as the journal and the target get it
    assert not {"tally", "addressed"} & vars(copy).keys()
    assert copy == bundle and copy.tally == bundle.tally


def test_the_source_tells_where_its_deferred_and_scheduled_messages_went(clock):
    # A client looks a number up in every partition at once: while the bundle travels and
    # just after, the source is the one that knows where it is (``migration.moved``).
    a = part(clock, 0, ALL, **KEYED_QUEUE)
    b = part(clock, 1, NONE, **KEYED_QUEUE)
    d_seq, s_seq, active_seq = a.send(
        [
            rec(message_id="deferred", partition_key="k"),
            rec(message_id="scheduled", partition_key="k", scheduled_enqueue_time=clock.now() + 60),
            rec(message_id="active", partition_key="k"),
        ]
    )
    [d] = a.receive(1)
    settle_one(a, DEFER, d.lock_token)
    asked = [d_seq, s_seq, active_seq, 12345]
    assert migration.moved(a, asked) == {}

    out, _ = migration.hand_over(a, {1: frozenset({slot_of("k")})}, None)
    [(move_id, (_target, bundle))] = out.items()
    # On its way: the target and the move, for the numbers asked by (never active ones).
    assert migration.moved(a, asked) == {d_seq: (1, move_id), s_seq: (1, move_id)}
    assert b.locate(asked) == []

    migration.adopt(b, move_id, bundle)
    migration.finish(a, move_id)
    assert migration.moved(a, asked) == {d_seq: (1, None), s_seq: (1, None)}
    assert b.locate(asked) == [d_seq, s_seq]

    # Forgotten a while after the move ended, at the next move's end.
    clock.advance(migration.MOVED_OUT_KEEP_S + 1)
    assert migration.moved(a, asked) == {d_seq: (1, None), s_seq: (1, None)}
    [other] = a.send([rec(message_id="other", partition_key="k2")])
    [o] = a.receive(1)
    settle_one(a, DEFER, o.lock_token)
    out, _ = migration.hand_over(a, {1: frozenset({slot_of("k2")})}, None)
    [(move_id2, (_target, bundle2))] = out.items()
    migration.adopt(b, move_id2, bundle2)
    migration.finish(a, move_id2)
    assert migration.moved(a, [*asked, other]) == {other: (1, None)}


def test_a_source_says_how_long_it_has_been_quiet_and_zero_while_a_move_travels(clock):
    a = part(clock, 0, ALL, **KEYED_QUEUE)
    b = part(clock, 1, NONE, **KEYED_QUEUE)
    a.send([rec(message_id="m", partition_key="k")])
    assert migration.quiet_for(a) == migration.quiet_for(b) == float("inf")  # never moved
    out, _ = migration.hand_over(a, {1: frozenset({slot_of("k")})}, None)
    clock.advance(30.0)  # on its way however long it takes
    assert migration.quiet_for(a) == 0.0
    [(move_id, (_target, bundle))] = out.items()
    migration.adopt(b, move_id, bundle)
    assert migration.quiet_for(a) == 0.0  # the target has it, the source is not told yet
    migration.finish(a, move_id)
    assert migration.quiet_for(a) == 0.0 and migration.quiet_for(b) == float("inf")
    clock.advance(0.25)
    assert migration.quiet_for(a) == pytest.approx(0.25)


def test_a_restarted_partition_says_it_was_quiet_only_since_it_restarted(clock):
    """When a move last ended is not journaled: a partition loaded from its checkpoint
    answers as if one had ended as it started."""
    a = part(clock, 0, ALL, **KEYED_QUEUE)
    a.send([rec(message_id="m", partition_key="k")])
    clock.advance(30.0)
    restarted = type(a)(a.properties, clock, a.partition_id)
    restarted.load(journal.replay(a.snapshot_entries()))
    assert migration.quiet_for(restarted) == 0.0
    clock.advance(0.5)
    assert migration.quiet_for(restarted) == pytest.approx(0.5)
