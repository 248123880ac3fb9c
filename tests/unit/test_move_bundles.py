"""A retiring partition spills its messages in bounded bundles (``migration.MOVE_BUNDLE_*``).

Pure unit tests: plain ``Partition`` objects on a ``FakeClock``, no Ray. A is the retiring
source (id 0), B takes its slots (id 1), C takes its spill (id 2). The bounds are made small
here; the actor side (the namespace goes on at once while a bundle stopped at its bound) is
in ``tests/integration/test_during_scale_down.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from partition_moves_support import (
    ALL,
    EVERYTHING,
    NONE,
    SESSION_QUEUE,
    counted,
    deliver,
    flush,
    ids_of,
    part,
    rec,
    recover,
    settle_one,
    total_size,
)

from raybus._core import journal, migration
from raybus._core.partition import DEAD_LETTER, Partition
from raybus.testing import FakeClock


@pytest.fixture
def bound(monkeypatch: pytest.MonkeyPatch) -> Any:
    def set_bound(messages: int = 1_000_000, size: int = 1 << 40) -> None:
        monkeypatch.setattr(migration, "MOVE_BUNDLE_MESSAGES", messages)
        monkeypatch.setattr(migration, "MOVE_BUNDLE_BYTES", size)

    return set_bound


def _spill(a: Partition, c: Partition) -> migration.Bundle | None:
    """One step of the namespace: hand over the slots A still serves and spill to C,
    deliver; the spill's bundle."""
    out, _ = migration.hand_over(a, {c.partition_id: a.owned} if a.owned else {}, c.partition_id)
    deliver({c.partition_id: c}, a, out)
    spilled = [b for t, b in out.values() if t == c.partition_id]
    return spilled[0] if spilled else None


def test_a_retiring_partition_spills_oldest_first_a_bundle_at_a_time(
    clock: FakeClock, bound: Any
) -> None:
    bound(messages=10)
    a = part(clock, 0, ALL)
    c = part(clock, 2, ALL)
    a.send([rec(message_id=f"m{i}") for i in range(25)])
    dead = a.receive(2)  # m0, m1: dead-lettered, they spill after the main store's
    for r in dead:
        settle_one(a, DEAD_LETTER, r.lock_token, reason="r")
    before = counted(a)

    sizes, bounded = [], []
    while not migration.is_empty(a):
        b = _spill(a, c)
        assert b is not None
        sizes.append(len(b.records))
        bounded.append(b.bounded)
        active, dead_n, _scheduled, size = counted(a)
        c_active, c_dead, _c_scheduled, c_size = counted(c)
        assert (active + c_active, dead_n + c_dead, size + c_size) == (23, 2, before[3])

    assert sizes == [10, 10, 5]
    assert bounded == [True, True, False]
    assert ids_of(c.peek(0, EVERYTHING)) == [f"m{i}" for i in range(2, 25)]  # order kept
    assert ids_of(c.peek(0, EVERYTHING, dead_letter=True)) == ["m0", "m1"]


def test_the_byte_bound_ends_a_bundle_and_a_larger_message_still_moves_alone(
    clock: FakeClock, bound: Any
) -> None:
    a = part(clock, 0, ALL)
    c = part(clock, 2, ALL)
    a.send([rec(b"x" * 1000, message_id=f"s{i}") for i in range(5)])
    a.send([rec(b"x" * 50_000, message_id="big")])
    a.send([rec(b"x" * 1000, message_id="after")])
    one = a.peek(0, 1)[0].size
    bound(size=2 * one)

    carried = []
    while not migration.is_empty(a):
        assert _spill(a, c) is not None
        carried.append(ids_of(c.peek(0, EVERYTHING))[-1])
    assert carried == ["s1", "s3", "s4", "big", "after"]  # 2, 2, 1 (the next is too big), 1, 1
    assert ids_of(c.peek(0, EVERYTHING)) == [f"s{i}" for i in range(5)] + ["big", "after"]


def test_a_moving_slots_messages_go_whole_while_the_spill_stops_at_its_bound(
    clock: FakeClock, bound: Any
) -> None:
    bound(messages=3)
    a = part(clock, 0, ALL)
    b = part(clock, 1, NONE)
    c = part(clock, 2, ALL)
    a.send([rec(message_id=f"k{i}", partition_key="key") for i in range(8)])
    a.send([rec(message_id=f"u{i}") for i in range(7)])

    out, _ = migration.hand_over(a, {1: ALL}, 2)
    deliver({1: b, 2: c}, a, out)

    assert ids_of(b.peek(0, EVERYTHING)) == [f"k{i}" for i in range(8)]  # all 8, past the bound
    assert ids_of(c.peek(0, EVERYTHING)) == ["u0", "u1", "u2"]
    assert [bundle.bounded for t, bundle in sorted(out.values(), key=lambda tb: tb[0])] == [
        False,
        True,
    ]
    sizes = []
    while not migration.is_empty(a):
        bundle = _spill(a, c)
        assert bundle is not None
        sizes.append(len(bundle.records))
    assert sizes == [3, 1]
    assert ids_of(c.peek(0, EVERYTHING)) == [f"u{i}" for i in range(7)]


def test_session_messages_of_a_moving_slot_go_whole(clock: FakeClock, bound: Any) -> None:
    bound(messages=2)
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    a.send([rec(message_id=f"m{i}", session_id="s1") for i in range(6)])
    out, _ = migration.hand_over(a, {1: ALL}, 1)
    deliver({1: b}, a, out)
    assert ids_of(b.peek(0, EVERYTHING)) == [f"m{i}" for i in range(6)]
    assert not any(bundle.bounded for _t, bundle in out.values())
    assert migration.is_empty(a)


class _Counting(dict):  # type: ignore[type-arg]
    reads = 0

    def __getitem__(self, key: Any) -> Any:
        _Counting.reads += 1
        return super().__getitem__(key)


def test_a_spill_alone_looks_at_no_more_than_it_takes(clock: FakeClock, bound: Any) -> None:
    """Later steps of a scale-down spill alone (the slots went at the first): each walks the
    oldest messages up to the bound, not the whole backlog, so a deep backlog costs each
    step a bundle's work."""
    bound(messages=100)
    a = part(clock, 0, ALL)
    c = part(clock, 2, ALL)
    for lo in range(0, 20_000, 1000):
        a.send([rec(b"x", message_id=f"m{lo + i}") for i in range(1000)])
    _spill(a, c)  # the first step moves the slots too: a whole walk
    a._main.messages = _Counting(a._main.messages)
    _Counting.reads = 0
    b = _spill(a, c)
    assert b is not None and len(b.records) == 100 and b.bounded
    assert _Counting.reads <= 101


def test_a_source_restarted_between_bundles_goes_on_from_its_log(
    clock: FakeClock, bound: Any
) -> None:
    bound(messages=4)
    a = part(clock, 0, ALL)
    a.enable_journal()
    log: list[journal.Entry] = []
    a.send([rec(message_id=f"m{i}") for i in range(10)])
    flush(a, log)
    c = part(clock, 2, ALL)
    size = total_size(a)
    migration.hand_over(a, {2: ALL}, 2)
    flush(a, log)  # the first bundle, journaled in the outbox; the source dies before sending

    r = recover(clock, 0, ALL, log)
    assert r.retiring
    [(target, first)] = r.outbox.values()
    assert (target, len(first.records), first.bounded) == (2, 4, True)
    deliver({2: c}, r, dict(r.outbox))
    while not migration.is_empty(r):
        _spill(r, c)
    assert ids_of(c.peek(0, EVERYTHING)) == [f"m{i}" for i in range(10)]
    assert total_size(c) == size
