"""Batch delete in one ``Partition``: messages deleted unreceived, oldest first, before a
cutoff, never a locked one (spec §1.3 "Batch delete / purge")."""

from __future__ import annotations

import dataclasses

import pytest

from raybus._core import journal
from raybus._core.partition import DEAD_LETTER, DEFER, Partition
from raybus.enums import EntityStatus
from raybus.exceptions import (
    InvalidArgumentError,
    MessagingEntityDisabledError,
    SessionLockLostError,
)


def ids(p: Partition, *, dead_letter: bool = False) -> list[str | None]:
    return [r.message_id for r in p.peek(0, 100, dead_letter=dead_letter)]


def test_the_oldest_go_first_up_to_the_count_and_the_counts_follow(make_partition, msg, clock):
    p = make_partition()
    p.send([msg(message_id=f"m{i}") for i in range(5)])
    size = p.counts().size_in_bytes
    one = size // 5
    assert p.delete_messages(3, clock.now() + 1) == 3
    assert ids(p) == ["m3", "m4"]
    counts = p.counts()
    assert (counts.active, counts.size_in_bytes) == (2, size - 3 * one)
    assert p.stats["deleted"] == 3
    assert p.delete_messages(10, clock.now() + 1) == 2
    assert p.delete_messages(10, clock.now() + 1) == 0 and ids(p) == []


def test_only_messages_enqueued_before_the_cutoff_go(make_partition, msg, clock):
    p = make_partition()
    p.send([msg(message_id="old")])
    clock.advance(10)
    cutoff = clock.now()
    p.send([msg(message_id="at-the-cutoff")])
    clock.advance(10)
    p.send([msg(message_id="new")])
    assert p.delete_messages(10, cutoff) == 1
    assert ids(p) == ["at-the-cutoff", "new"]


def test_locked_messages_stay_deferred_ones_go(make_partition, msg, settle, clock):
    p = make_partition()
    p.send([msg(message_id=m) for m in ("locked", "deferred", "active")])
    locked, deferred = p.receive(2)
    assert settle(p, DEFER, deferred.lock_token) is None
    assert p.delete_messages(10, clock.now() + 1) == 2
    assert ids(p) == ["locked"]
    assert settle(p, DEAD_LETTER, locked.lock_token) is None  # its lock still works


def test_a_scheduled_message_goes_only_if_its_time_is_before_the_cutoff(make_partition, msg, clock):
    p = make_partition()
    at = clock.now() + 60
    p.send([msg(message_id="scheduled", scheduled_enqueue_time=at)])
    assert p.delete_messages(10, clock.now() + 1) == 0
    assert p.counts().scheduled == 1
    assert p.delete_messages(10, at + 1) == 1
    assert p.counts().scheduled == 0
    clock.advance(61)
    assert p.receive(10) == []  # its activation finds nothing


def test_the_dead_letter_sub_queue_is_deleted_on_its_own(make_partition, msg, settle, clock):
    p = make_partition()
    p.send([msg(message_id="dead"), msg(message_id="alive")])
    [rec] = p.receive(1)
    assert settle(p, DEAD_LETTER, rec.lock_token) is None
    assert p.delete_messages(10, clock.now() + 1, dead_letter=True) == 1
    assert ids(p, dead_letter=True) == [] and ids(p) == ["alive"]
    assert p.counts().dead_letter == 0


def test_messages_not_yet_durable_stay_and_a_delete_survives_recovery(make_partition, msg, clock):
    p = make_partition()
    p.enable_journal()
    log: list[journal.Entry] = []
    p.send([msg(message_id=f"m{i}") for i in range(3)])
    entries, last = p.take_journal()
    log.extend(entries)
    p.visible_seq = last
    p.send([msg(message_id="unflushed")])
    assert p.delete_messages(10, clock.now() + 1) == 3
    entries, last = p.take_journal()
    log.extend(entries)
    p.visible_seq = last
    assert ids(p) == ["unflushed"]
    recovered = Partition(p.properties, clock)
    recovered.load(journal.replay(journal.from_table(journal.to_table(log))))
    assert ids(recovered) == ["unflushed"]
    assert recovered.counts().size_in_bytes == p.counts().size_in_bytes


def test_a_session_queue_deletes_a_held_sessions_messages_or_every_sessions(
    make_partition, msg, clock
):
    p = make_partition(requires_session=True)
    p.send([msg(message_id=f"a{i}", session_id="a") for i in range(3)])
    p.send([msg(message_id=f"b{i}", session_id="b") for i in range(2)])
    token, _ = p.accept_session("a")
    [first] = p.receive(1, session=("a", token))
    assert p.delete_messages(1, clock.now() + 1, session=("a", token)) == 1
    assert ids(p) == [first.message_id, "a2", "b0", "b1"]
    with pytest.raises(SessionLockLostError):
        p.delete_messages(10, clock.now() + 1, session=("b", "not-its-token"))
    # Without a session: every session's messages, but not the one locked under "a".
    assert p.delete_messages(10, clock.now() + 1) == 3
    assert ids(p) == [first.message_id]


def test_a_session_is_refused_on_a_queue_without_sessions(make_partition, msg, clock):
    p = make_partition()
    p.send([msg(message_id="kept")])
    with pytest.raises(InvalidArgumentError, match="does not require sessions"):
        p.delete_messages(10, clock.now() + 1, session=("s", "token"))
    assert ids(p) == ["kept"]


@pytest.mark.parametrize("status", [EntityStatus.DISABLED, EntityStatus.RECEIVE_DISABLED])
def test_an_entity_that_may_not_receive_refuses_and_keeps_everything(
    make_partition, msg, clock, status
):
    p = make_partition()
    p.send([msg(message_id="kept")])
    p.update_properties(dataclasses.replace(p.properties, status=status))
    with pytest.raises(MessagingEntityDisabledError):
        p.delete_messages(10, clock.now() + 1)
    assert ids(p) == ["kept"]


def test_a_count_of_zero_deletes_nothing(make_partition, msg, clock):
    p = make_partition()
    p.send([msg()])
    assert p.delete_messages(0, clock.now() + 1) == 0 and p.counts().active == 1
