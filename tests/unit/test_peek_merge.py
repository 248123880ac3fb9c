"""Which messages a peek across the partitions returns (``raybus.aio._fanout``): up to its
count, oldest first, each partition's in the order of its numbers, so that the receiver's
cursors (after the last number each partition showed) pass only messages it was shown. A
partition change moves messages under new, higher numbers with their old enqueued times, and
a scheduled message's enqueued time is its schedule's; sorted by time alone and cut at the
count, a peek could return messages numbered after such a one and leave it out, and the next
peeks then skipped it.
Without Ray: a fake receiver, the real ``peek_messages``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raybus.aio import _sequence_reads
from raybus.aio._sequence_reads import PEEK_PAGES, PeekedRanges, SequenceReads


def _message(pid: int, number: int, enqueued: float, first: int | None = None) -> Any:
    """Message ``number`` of partition ``pid``; ``first``: the number it had before a move."""
    seq = (pid << 48) + number
    return SimpleNamespace(
        sequence_number=seq,
        enqueued_sequence_number=seq if first is None else first,
        partition_id=pid,
        _record=SimpleNamespace(enqueued_time=enqueued),
    )


class _Receiver(SequenceReads):
    """Partitions holding fixed messages (``held[pid]``, in number order); a peek answers
    from its start, as a partition does. A test moves messages by replacing ``held``."""

    entity_path = "q"
    session = None
    _transfer = False

    def __init__(self, held: dict[int, list[Any]]) -> None:
        self._init_reads()
        self.held = held
        self.single = False  # set: the route has one partition (a scale-down ended)
        self.calls = 0  # partition peeks

        async def get_route(_name: str, *, refresh: bool = False) -> Any:
            return SimpleNamespace(
                single=self.single, existing=lambda: [(p, None) for p in self.held]
            )

        async def retrying(_name: str, call: Any) -> Any:
            return await call()

        self._conn = SimpleNamespace(
            route=get_route, retrying=retrying, known_current=lambda _name: float("-inf")
        )

    async def _settle_pending(self) -> None:
        pass

    def _check_receivable(self, route: Any) -> None:
        pass

    async def _peek_quiet(
        self, start: int, count: int, pid: int, timeout: Any
    ) -> tuple[list[Any], float]:
        return await self._peek_call(start, count, pid, timeout), float("inf")

    async def _peek_call(
        self, start: int, count: int, pid: int, timeout: Any, session_id: str | None = None
    ) -> list[Any]:
        self.calls += 1
        return [m for m in self.held[pid] if m.sequence_number >= start][:count]


def _page_through(held: dict[int, list[Any]], count: int) -> list[list[Any]]:
    receiver = _Receiver(held)

    async def pages() -> list[list[Any]]:
        out = []
        while page := await receiver.peek_messages(count):
            out.append(page)
        return out

    return asyncio.run(pages())


def test_paging_shows_every_message_once_when_moved_ones_are_numbered_after_newer_ones() -> None:
    # Partition 1 holds two messages of its own (enqueued at 100 and 101), then six moved in
    # from a retired partition (enqueued long before, at 1-6, numbered after them).
    held = {
        0: [_message(0, n, 50 + n) for n in range(20)],
        1: [_message(1, 0, 100), _message(1, 1, 101)]
        + [_message(1, 2 + n, 1 + n) for n in range(6)],
    }
    pages = _page_through(held, 5)
    shown = [m.sequence_number for page in pages for m in page]
    every = [m.sequence_number for answer in held.values() for m in answer]
    assert sorted(shown) == sorted(every)  # each once: none skipped, none twice
    assert all(len(page) == 5 for page in pages[:-1])


def test_each_partition_gives_a_prefix_of_its_answer_oldest_first_across_them() -> None:
    held = {
        0: [_message(0, n, 10 * n) for n in range(4)],  # 0, 10, 20, 30
        1: [_message(1, 0, 5), _message(1, 1, 40), _message(1, 2, 1)],  # moved-in last
    }
    (first, *_rest) = _page_through(held, 4)
    assert [(m.partition_id, m._record.enqueued_time) for m in first] == [
        (0, 0),
        (1, 5),
        (0, 10),
        (0, 20),
    ]


def test_without_moves_a_peek_is_the_oldest_of_all_as_before() -> None:
    held = {pid: [_message(pid, n, 3 * n + pid) for n in range(10)] for pid in range(3)}
    pages = _page_through(held, 7)
    shown = [m for page in pages for m in page]
    assert [m._record.enqueued_time for m in shown] == list(range(30))


def test_a_scheduled_message_numbered_before_sent_ones_is_not_skipped() -> None:
    # Partition 0: a message scheduled for time 1,000 (number 0), then three sent at 10-12.
    held = {
        0: [_message(0, 0, 1000)] + [_message(0, 1 + n, 10 + n) for n in range(3)],
        1: [_message(1, n, 20 + n) for n in range(4)],
    }
    pages = _page_through(held, 3)
    shown = [m.sequence_number for page in pages for m in page]
    assert sorted(shown) == sorted(m.sequence_number for a in held.values() for m in a)


def test_messages_peeked_before_a_move_are_not_shown_again_under_their_new_numbers() -> None:
    # Partitions 0 and 1 hold 6 messages each; a receiver peeks 8 (oldest first: 0-3 of
    # each). Then partition 1 retires: its 6 move to partition 0 as numbers 6-11, keeping
    # their first numbers; the next peeks show the 2 it had not peeked, and 0's last 2.
    held = {
        0: [_message(0, n, 2 * n) for n in range(6)],
        1: [_message(1, n, 2 * n + 1) for n in range(6)],
    }
    receiver = _Receiver(held)

    async def peeks() -> list[list[Any]]:
        pages = [await receiver.peek_messages(8)]
        moved = [_message(0, 6 + n, 2 * n + 1, first=(1 << 48) + n) for n in range(6)]
        receiver.held = {0: held[0] + moved}
        receiver.single = True
        while page := await receiver.peek_messages(3):
            pages.append(page)
        return pages

    first, *later = asyncio.run(peeks())
    assert sorted(m._record.enqueued_time for m in first) == list(range(8))
    after = [m.sequence_number for page in later for m in page]
    assert after == [4, 5, 10, 11]  # 0's own 4 and 5, then 1's 4 and 5 under 10 and 11
    assert [len(page) for page in later] == [3, 1]  # the first page made up for 4 left out
    # The first (two partitions); three for the page of 3 (6 left out, then 7-9, then 10
    # taken); one for 11; one that found nothing.
    assert receiver.calls == 2 + 3 + 1 + 1


def test_a_receiver_goes_on_peeking_after_a_scale_down_to_one_partition() -> None:
    """Its cursor was after a number of partition 3; the single partition's peek starts from
    partition 0's own cursor, not from there (where it found nothing)."""
    held = {pid: [_message(pid, n, 4 * n + pid) for n in range(3)] for pid in range(4)}
    receiver = _Receiver(held)

    async def peeks() -> list[Any]:
        first = await receiver.peek_messages(4)  # one of each partition, 3's last
        assert first[-1].partition_id == 3
        moved = [
            _message(0, 3 + k, m._record.enqueued_time, first=m.sequence_number)
            for k, m in enumerate(m for pid in (1, 2, 3) for m in held[pid])
        ]
        receiver.held = {0: held[0] + moved}
        receiver.single = True
        return await receiver.peek_messages(20)

    rest = asyncio.run(peeks())
    assert sorted(m._record.enqueued_time for m in rest) == list(range(4, 12))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12)), max_size=25))
def test_peeked_ranges_hold_what_was_added_and_nothing_else(added: list[tuple[int, int]]) -> None:
    ranges, model = PeekedRanges(), set()
    for lo, length in added:
        ranges.add(lo, lo + length)
        model.update(range(lo, lo + length))
    assert [n for n in range(-1, 80) if n in ranges] == sorted(model)
    assert all(lo < hi for lo, hi in zip(ranges._los, ranges._his, strict=True))
    assert all(hi < lo for hi, lo in zip(ranges._his, ranges._los[1:], strict=False))  # merged


def test_a_message_moved_out_before_the_peek_reached_it_is_shown_at_its_new_partition() -> None:
    """A scale-up moves some of a partition's messages and keeps the rest: a page of the
    source after the move passes the moved one's number without showing it, so only the
    numbers shown count, not the span the page passed."""
    mine = [_message(1, 2, 2), _message(1, 5, 5)]  # number 3 left in a move, still travelling
    receiver = _Receiver({1: mine})

    async def peeks() -> list[Any]:
        first = await receiver.peek_messages(5)
        assert [m.sequence_number & 0xFF for m in first] == [2, 5]
        receiver.held = {1: mine, 2: [_message(2, 0, 3, first=(1 << 48) + 3)]}  # arrived
        return await receiver.peek_messages(5)

    [arrived] = asyncio.run(peeks())
    assert arrived.sequence_number == 2 << 48


def test_peeked_ranges_start_afresh_past_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sequence_reads, "PEEKED_RUNS_MAX", 3)
    ranges = PeekedRanges()
    for n in (0, 2, 4):  # three runs
        ranges.add(n, n + 1)
    ranges.add(5, 6)  # joins the third: still three
    assert [n for n in range(8) if n in ranges] == [0, 2, 4, 5]
    ranges.add(7, 8)  # a fourth: forgets the rest first
    assert [n for n in range(8) if n in ranges] == [7]


def test_a_peek_that_leaves_out_page_after_page_stops_after_its_budget() -> None:
    """Every message of the only partition was peeked before it moved: each call passes a
    count of them, and after ``PEEK_PAGES`` calls the peek returns what it has (nothing),
    its cursor after all it passed, so the next peek goes on from there."""
    count = 2
    first = [_message(1, n, n) for n in range(count * (PEEK_PAGES + 1))]
    receiver = _Receiver({1: first})

    async def peeks() -> tuple[list[Any], list[Any]]:
        seen = []
        while len(seen) < len(first):
            seen += await receiver.peek_messages(len(first) - len(seen))
        moved = [_message(0, n, n, first=m.sequence_number) for n, m in enumerate(first)]
        receiver.held = {0: [*moved, _message(0, len(first), 99)]}
        receiver.single = True
        receiver.calls = 0
        short = await receiver.peek_messages(count)
        assert short == [] and receiver.calls == PEEK_PAGES  # passed 8 x 2 of the 18
        return short, await receiver.peek_messages(count)

    _short, rest = asyncio.run(peeks())
    assert [m._record.enqueued_time for m in rest] == [99]  # the last 2 passed, then the new
    assert receiver.calls == PEEK_PAGES + 2
