"""A topic's scheduled messages (``raybus._core.topic_schedule`` and the router's
``raybus._actors.topic_scheduler``): numbered by the topic, cancelled all or none, published
once due, a refused publish tried again, and all of it kept across a restart by the log.

No Ray: the router's publish is a fake that records or refuses; a restart is a new scheduler on
the same storage; time is a ``FakeClock`` (the timer's own waiting is exercised by the
integration tests).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transactions_core_support import rec

from raybus._actors.topic_scheduler import BATCH, RETRY_S, TopicScheduler
from raybus._core.record import to_wire
from raybus._core.topic_schedule import TopicSchedule
from raybus._storage import StorageUnavailableError
from raybus.exceptions import MessageNotFoundError, ServiceBusQuotaExceededError
from raybus.testing import FakeClock


class Publisher:
    """The router's publish: records what it published; refuses message ids in ``refuse``."""

    def __init__(self) -> None:
        self.published: list[str | None] = []
        self.refuse: set[str] = set()

    async def __call__(self, records: list[Any]) -> None:
        (r,) = records
        if r.message_id in self.refuse:
            raise ServiceBusQuotaExceededError("the subscription is full", "t")
        self.published.append(r.message_id)


def scheduler(storage: Path | None, publish: Publisher, clock: FakeClock) -> TopicScheduler:
    path = None if storage is None else str(storage)
    return TopicScheduler("ns", path, "queues/t/0/scheduled", "t", publish, clock.now)


def at(clock: FakeClock, seconds: float, *ids: str) -> list[Any]:
    return [rec(i, scheduled_enqueue_time=clock.now() + seconds) for i in ids]


def fire_due(s: TopicScheduler, clock: FakeClock) -> None:
    asyncio.run(s._fire(s.state.due(clock.now(), BATCH)))


def test_numbers_are_the_topics_own_and_never_repeat_across_restarts(
    tmp_path: Path, clock: FakeClock
) -> None:
    pub = Publisher()
    first = scheduler(tmp_path, pub, clock)
    assert asyncio.run(first.schedule(at(clock, 60, "a", "b"))) == [1, 2]
    clock.advance(60)
    fire_due(first, clock)
    assert pub.published == ["a", "b"] and first.count == 0
    again = scheduler(tmp_path, pub, clock)  # nothing left scheduled, the counter kept
    assert again.count == 0
    assert asyncio.run(again.schedule(at(clock, 60, "c"))) == [3]


def test_the_size_held_is_the_scheduled_messages_encoded_size(clock: FakeClock) -> None:
    """A topic's size counts its scheduled messages (``TopicRuntimeProperties``)."""
    pub = Publisher()
    s = scheduler(None, pub, clock)
    assert s.size_in_bytes == 0
    records = at(clock, 60, "a", "b") + at(clock, 120, "c")
    seqs = asyncio.run(s.schedule(records))
    assert s.size_in_bytes == sum(r.size for r in records) > 0
    asyncio.run(s.cancel(seqs[:1]))
    clock.advance(60)
    fire_due(s, clock)
    assert s.size_in_bytes == records[2].size


def test_only_due_messages_are_published_earliest_first(clock: FakeClock) -> None:
    pub = Publisher()
    s = scheduler(None, pub, clock)
    asyncio.run(s.schedule(at(clock, 30, "late") + at(clock, 10, "early")))
    clock.advance(5)
    fire_due(s, clock)
    assert pub.published == []
    clock.advance(10)
    fire_due(s, clock)
    assert pub.published == ["early"]
    assert s.state.next_due() == clock.now() + 15
    clock.advance(15)
    fire_due(s, clock)
    assert pub.published == ["early", "late"] and s.count == 0


def test_cancel_is_all_or_none_and_a_cancelled_message_is_never_published(
    tmp_path: Path, clock: FakeClock
) -> None:
    pub = Publisher()
    s = scheduler(tmp_path, pub, clock)
    seqs = asyncio.run(s.schedule(at(clock, 10, "a", "b", "c")))
    with pytest.raises(MessageNotFoundError, match=r"\[99\]") as got:
        asyncio.run(s.cancel([seqs[0], 99]))
    assert got.value.entity == "t"
    assert s.count == 3  # nothing cancelled
    asyncio.run(s.cancel([seqs[0], seqs[2]]))
    with pytest.raises(MessageNotFoundError):
        asyncio.run(s.cancel([seqs[0]]))  # cancelled already
    restarted = scheduler(tmp_path, pub, clock)  # the cancellation is logged
    assert sorted(restarted.state.entries) == [seqs[1]]
    clock.advance(10)
    fire_due(restarted, clock)
    assert pub.published == ["b"]


def test_a_message_being_published_can_no_longer_be_cancelled(clock: FakeClock) -> None:
    s = scheduler(None, Publisher(), clock)
    (seq,) = asyncio.run(s.schedule(at(clock, 1, "a")))
    clock.advance(1)
    assert s.state.due(clock.now(), BATCH) == [seq]  # its publish is under way
    with pytest.raises(MessageNotFoundError):
        asyncio.run(s.cancel([seq]))
    assert s.count == 1


def test_a_refused_publish_stays_scheduled_and_is_tried_again(
    tmp_path: Path, clock: FakeClock
) -> None:
    pub = Publisher()
    pub.refuse = {"full"}
    s = scheduler(tmp_path, pub, clock)
    asyncio.run(s.schedule(at(clock, 1, "ok", "full")))
    clock.advance(1)
    fire_due(s, clock)
    assert pub.published == ["ok"]
    assert s.count == 1
    assert s.state.next_due() == clock.now() + RETRY_S
    fire_due(s, clock)  # not due again yet
    assert pub.published == ["ok"]
    pub.refuse.clear()
    clock.advance(RETRY_S)
    fire_due(s, clock)
    assert pub.published == ["ok", "full"]
    assert scheduler(tmp_path, pub, clock).count == 0  # both logged as published


def test_a_schedule_or_cancel_that_cannot_be_logged_changes_nothing(
    tmp_path: Path, clock: FakeClock
) -> None:
    s = scheduler(tmp_path, Publisher(), clock)
    (kept,) = asyncio.run(s.schedule(at(clock, 10, "kept")))
    assert s._changes is not None
    append = s._changes.append

    async def failing(change: Any) -> None:
        raise StorageUnavailableError("the disk is gone", None, "EIO")

    s._changes.append = failing  # type: ignore[method-assign]
    with pytest.raises(StorageUnavailableError):
        asyncio.run(s.schedule(at(clock, 10, "lost")))
    with pytest.raises(StorageUnavailableError):
        asyncio.run(s.cancel([kept]))
    assert sorted(s.state.entries) == [kept]
    s._changes.append = append  # type: ignore[method-assign]
    assert asyncio.run(s.schedule(at(clock, 10, "next"))) == [kept + 2]  # numbers not reused
    assert sorted(scheduler(tmp_path, Publisher(), clock).state.entries) == [kept, kept + 2]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(1, 3), st.floats(0, 100)),
            st.tuples(st.just("drop"), st.integers(0, 12)),
        ),
        max_size=30,
    )
)
def test_replaying_the_changes_or_the_checkpoint_gives_the_same_schedule(
    ops: list[tuple[Any, ...]],
) -> None:
    live = TopicSchedule()
    changes: list[Any] = []
    for op in ops:
        if op[0] == "add":
            rows = to_wire([rec(f"m{live.next_seq + i}") for i in range(op[1])])
            _seqs, change = live.add(rows, [op[2]] * op[1])
        else:
            _taken, change = live.remove([op[1]])
        changes.append(change)
    for replayed in (TopicSchedule.replayed(changes), TopicSchedule.replayed(live.snapshot())):
        assert replayed.entries == live.entries
        assert replayed.next_seq == live.next_seq


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(1, 3), st.integers(0, 20)),
            st.tuples(st.just("cancel"), st.integers(1, 12)),
            st.tuples(st.just("cancel_unlogged"), st.integers(1, 12)),
            st.tuples(st.just("due"), st.integers(0, 25), st.integers(1, 4)),
            st.tuples(st.just("publish"), st.booleans(), st.integers(0, 25)),
        ),
        max_size=40,
    )
)
def test_due_and_next_due_are_those_of_a_scan_of_every_entry(ops: list[tuple[Any, ...]]) -> None:
    """The heap behind ``due`` and ``next_due`` answers as a scan of every entry would, through
    cancels (logged or undone), refusals moved later and publishes."""
    state = TopicSchedule()

    def scanned(now: float) -> list[int]:
        ready = [(d, s) for s, (d, _r) in state.entries.items() if d <= now]
        return [s for _d, s in sorted(ready) if s not in state.firing]

    def next_scanned() -> float | None:
        waiting = [d for s, (d, _r) in state.entries.items() if s not in state.firing]
        return min(waiting, default=None)

    for op in ops:
        if op[0] == "add":
            rows = to_wire([rec(f"m{state.next_seq + i}") for i in range(op[1])])
            state.add(rows, [float(op[2])] * op[1])
        elif op[0] in ("cancel", "cancel_unlogged"):
            if not state.missing([op[1]]):
                taken, _change = state.remove([op[1]])
                if op[0] == "cancel_unlogged":  # the log write failed: put back
                    state.restore(taken)
        elif op[0] == "due":
            expected = scanned(op[1])[: op[2]]
            assert state.due(op[1], op[2]) == expected
        elif state.firing:  # publish the earliest firing one, or refuse it (tried later)
            seq = min(state.firing)
            if op[1]:
                state.remove([seq])
            else:
                state.retry([seq], float(op[2]))
        assert state.next_due() == next_scanned()
