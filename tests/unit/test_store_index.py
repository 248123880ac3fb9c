"""A store's index of numbers (``raybus._core.store.Store``): a peek finds where to start by
bisection and steps only over what it returns and what was removed since the last rebuild,
whatever the backlog; the index stays within a small multiple of the live messages; and the
answers are those of a scan of every stored number."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from raybus._core import journal
from raybus._core import store as store_module
from raybus._core.partition import Partition
from raybus._core.record import MessageRecord
from raybus._core.store import INDEX_SLACK, SettleOp, Store
from raybus.testing import FakeClock


class CountingDict(dict[int, MessageRecord]):
    """A store's messages, counting the membership tests a walk makes."""

    looked = 0

    def __contains__(self, key: object) -> bool:
        self.looked += 1
        return super().__contains__(key)


def _scan(store: Store, start: int) -> list[int]:
    return sorted(n for n in store.messages if n >= start)


def _rec() -> MessageRecord:
    return MessageRecord(body=b"x")


# ops: ("put", gap) adds the next number (last + gap), ("stale", k) puts the k-th smallest
# stored number again or one below it (out of order), ("del", k) removes the k-th stored one.
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(1, 3)),
        st.tuples(st.just("stale"), st.integers(0, 50)),
        st.tuples(st.just("del"), st.integers(0, 50)),
    ),
    max_size=300,
)


def _walks_as_a_scan(ops: list[tuple[str, int]], starts: list[int]) -> None:
    store = Store("main", 0)
    last = -1
    for op, k in ops:
        if op == "put":
            last += k
            store.put(last, _rec())
        elif store.messages:
            numbers = sorted(store.messages)
            pick = numbers[k % len(numbers)]
            if op == "del":
                del store.messages[pick]
            else:
                store.put(pick - (k % 2), _rec())  # stored again, or a free number below
        for start in starts:
            assert list(store.numbers_from(start)) == _scan(store, start)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, starts=st.lists(st.integers(-1, 400), min_size=1, max_size=5))
@example(ops=[("put", 1), ("stale", 1)], starts=[-1])  # -1 stored: the walk's old sentinel
def test_the_walk_answers_as_a_scan_of_every_stored_number(
    ops: list[tuple[str, int]], starts: list[int]
) -> None:
    _walks_as_a_scan(ops, starts)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, starts=st.lists(st.integers(-1, 400), min_size=1, max_size=5))
def test_the_walk_answers_as_a_scan_when_late_numbers_are_merged_often(
    ops: list[tuple[str, int]], starts: list[int]
) -> None:
    """As above with no slack: late numbers are merged into the array at most walks, and
    the array is rebuilt whenever it holds more than twice the live numbers."""
    saved = store_module.INDEX_SLACK
    store_module.INDEX_SLACK = 0
    try:
        _walks_as_a_scan(ops, starts)
    finally:
        store_module.INDEX_SLACK = saved


def test_a_dead_letter_walk_after_one_more_is_not_a_rebuild() -> None:
    """A dead-letter sub-queue of 100,000 messages, stored in dead-lettering order, takes one
    more below its last number: the next peek sorts that one, not the 100,000 (it had
    sorted every stored number at the first walk after each late one)."""
    store = Store("dead-letter", 1)
    numbers = list(range(0, 200_000, 2))
    random.Random(7).shuffle(numbers)
    for n in numbers:
        store.put(n, _rec())
    assert list(store.numbers_from(0)) == list(range(0, 200_000, 2))  # merged once
    array_before = store._order
    store.messages = CountingDict(store.messages)
    for n in (1, 99_999, 150_001):
        store.put(n, _rec())
        store.messages.looked = 0
        got = list(islice(store.numbers_from(n - 1), 3))
        assert got == [n - 1, n, n + 1]
        assert store.messages.looked <= 4
        assert store._order is array_before  # walked beside the array, not merged into it
    assert list(islice(store.numbers_from(0), 4)) == [0, 1, 2, 4]


class CountingList(list[int]):
    """A store's late numbers, counting those a walk reads (by index or by iterating)."""

    read = 0

    def __getitem__(self, i: Any) -> Any:
        self.read += 1
        return super().__getitem__(i)

    def __iter__(self) -> Iterator[int]:
        for n in super().__iter__():
            self.read += 1
            yield n


def test_a_walk_from_the_end_of_a_long_late_list_reads_only_its_end() -> None:
    """6,000 late numbers (within a quarter of the array plus the slack, so not merged): a
    peek of 3 from near their end reads those its bisection and merge need, not the 5,500
    before its start (``islice`` stepped over each)."""
    store = Store("dead-letter", 1)
    for n in range(0, 40_000, 2):
        store.put(n, _rec())
    for n in range(1, 12_000, 2):
        store.put(n, _rec())
    assert list(islice(store.numbers_from(0), 3)) == [0, 1, 2]  # sorted, not merged
    assert len(store._late) == 6_000
    store._late = late = CountingList(store._late)
    assert list(islice(store.numbers_from(11_001), 3)) == [11_001, 11_002, 11_003]
    assert late.read <= 20  # the bisection's 13 steps and the numbers merged


def test_late_numbers_are_merged_once_they_are_many() -> None:
    store = Store("dead-letter", 1)
    for n in range(10_000, 20_000):
        store.put(n, _rec())
    for n in range(9_999, 5_999, -1):  # 4,000 late: past a quarter (2,500) plus the slack
        store.put(n, _rec())
    assert list(store.numbers_from(0)) == list(range(6_000, 20_000))
    assert store._late == [] and list(store._order) == list(range(6_000, 20_000))
    store.put(15_000, _rec())  # stored again: walked once
    assert list(store.numbers_from(14_999))[:3] == [14_999, 15_000, 15_001]


def test_a_walk_looks_at_what_it_returns_not_at_the_backlog() -> None:
    store = Store("main", 0)
    store.messages = CountingDict()
    for n in range(100_000):
        store.put(n, _rec())
    for n in range(0, 40_000):  # completed at the head, as a queue's oldest are
        del store.messages[n]
    for n in range(50_001, 60_000, 2):  # and every other one further on
        del store.messages[n]

    def looked_for(start: int, count: int) -> tuple[list[int], int]:
        store.messages.looked = 0
        got = list(islice(store.numbers_from(start), count))
        return got, store.messages.looked

    got, looked = looked_for(0, 10)  # the first walk passes the removed head once
    assert got == list(range(40_000, 40_010))
    assert looked == 40_000 + 1 + 10  # the removed head, its first live number, the 10
    got, looked = looked_for(0, 10)  # and later ones not again
    assert got == list(range(40_000, 40_010)) and looked == 10 + 1
    got, looked = looked_for(50_000, 10)
    assert got == [50_000, *range(50_002, 50_020, 2)] and looked <= 20
    got, looked = looked_for(99_995, 10)
    assert got == list(range(99_995, 100_000)) and looked <= 6


def test_the_index_stays_within_twice_the_live_numbers_plus_its_slack() -> None:
    store = Store("main", 0)
    for n in range(200_000):  # a queue whose messages are completed as they come: no walk
        store.put(n, _rec())
        if n >= 10:
            del store.messages[n - 10]
    assert len(store.messages) == 10
    assert len(store._order) <= 2 * 10 + INDEX_SLACK + 1024  # checked every 1,024 numbers
    assert list(store.numbers_from(0)) == list(range(199_990, 200_000))


def test_the_late_list_stays_bounded_without_walks() -> None:
    """A dead-letter sub-queue taking numbers below its last, each removed soon after, and
    never peeked: the late list is rebuilt away as the array is (checked every 1,024)."""
    store = Store("dead-letter", 1)
    store.put(10**9, _rec())
    for n in range(200_000):
        store.put(n, _rec())
        if n >= 10:
            del store.messages[n - 10]
    assert len(store.messages) == 11
    assert len(store._order) + len(store._late) <= 2 * 11 + INDEX_SLACK + 1024
    assert list(store.numbers_from(0)) == [*range(199_990, 200_000), 10**9]


def test_the_index_stays_bounded_when_walks_move_its_head_on() -> None:
    """A queue drained as fast as it fills, with a peek every 100 messages: each walk moves
    the head past the removed numbers, and the array behind it must not keep them all."""
    store = Store("main", 0)
    for n in range(200_000):
        store.put(n, _rec())
        if n >= 10:
            del store.messages[n - 10]
        if n % 100 == 0:
            assert next(store.numbers_from(0)) == max(0, n - 9)
    assert len(store._order) <= 2 * 10 + INDEX_SLACK + 1024


def test_the_dead_letter_order_is_walked_in_number_order() -> None:
    store = Store("dead-letter", 1)
    for n in (7, 3, 9, 1, 8):  # dead-lettering order
        store.put(n, _rec())
    assert list(store.numbers_from(0)) == [1, 3, 7, 8, 9]
    assert list(store.numbers_from(4)) == [7, 8, 9]
    store.put(5, _rec())
    del store.messages[8]
    assert list(store.numbers_from(2)) == [3, 5, 7, 9]


def test_a_partition_peeks_a_deep_backlog_page_by_page_as_a_scan_would(
    make_partition: Callable[..., Partition], clock: FakeClock
) -> None:
    """Sends, completions, abandons, dead-lettering, scheduled messages turning active (new
    numbers) and a restart from the journal: paging through with peeks of 7 shows every
    message once, in number order, as a scan of the stores does."""
    rnd = random.Random(7)
    p = make_partition(max_delivery_count=2)
    for _ in range(30):
        p.send([MessageRecord(body=b"x") for _ in range(100)])
        locked = p.receive(60)
        ops = [
            SettleOp(
                rnd.choice(["complete", "abandon", "abandon", "dead_letter"]), str(r.lock_token)
            )
            for r in locked
        ]
        p.settle(ops)
    when = clock.now() + 5
    p.send([MessageRecord(body=b"later", scheduled_enqueue_time=when) for _ in range(20)])
    p.send([MessageRecord(body=b"x") for _ in range(10)])
    clock.advance(6)
    p.peek(0, 1)  # the schedule's sweep: the 20 take new numbers after the 10

    def paged(q: Partition, dead_letter: bool) -> list[int]:
        seen: list[int] = []
        cursor = 0
        while got := q.peek(cursor, 7, dead_letter=dead_letter):
            seen += [r.sequence_number for r in got]
            cursor = got[-1].sequence_number + 1
        return seen

    main, dlq = paged(p, False), paged(p, True)
    assert main == sorted(p._main.messages) and len(main) > 1000
    assert dlq == sorted(p._dlq.messages) and dlq
    later = [n for n in main if p._main.messages[n].body == b"later"]
    assert len(later) == 20 and min(later) > max(n for n in main if n not in later)
    restarted = make_partition(max_delivery_count=2)
    restarted.load(journal.replay(p.snapshot_entries()))
    assert paged(restarted, False) == main and paged(restarted, True) == dlq


def test_a_partition_peek_stops_at_its_count(make_partition: Callable[..., Partition]) -> None:
    p = make_partition()
    for _ in range(50):
        p.send([MessageRecord(body=b"x") for _ in range(1000)])
    p.peek(0, 1)  # the first walk of a fresh index
    p._main.messages = CountingDict(p._main.messages)
    got = p.peek(25_000, 10)
    assert [r.sequence_number for r in got] == list(range(25_000, 25_010))
    assert p._main.messages.looked <= 10 + 1  # its first live number, then the 10
