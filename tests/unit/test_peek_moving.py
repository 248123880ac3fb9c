"""Whether a peek across the partitions is made again (``raybus.aio._fanout.peek_partitioned``):
when a partition's answer says it moves messages out or did a moment ago (a moved bundle is in
neither partition while it travels), and at most ``PEEK_AGAIN`` times. Without Ray: a fake
receiver's partitions answer with scripted flags."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from raybus.aio import _fanout
from raybus.aio._fanout import PEEK_AGAIN, peek_partitioned


class _Receiver:
    """Partition ``pid`` answers its n-th peek with one message (enqueued at ``pid``) and the
    n-th of its scripted flags, the last one repeated."""

    entity_path = "q"

    def __init__(self, *flags: list[bool]) -> None:
        self.flags = flags
        self.asked: list[int] = []
        self._peek_cursors: dict[int, int] = {}
        parts = [(pid, object()) for pid in range(len(flags))]
        route = SimpleNamespace(existing=lambda: parts)

        async def get_route(_entity: str) -> Any:
            return route

        self._conn = SimpleNamespace(route=get_route)

    async def _peek_moving(
        self, start: int, count: int, pid: int, timeout: Any
    ) -> tuple[list[Any], bool]:
        assert start == pid << 48 and count == 5
        n = self.asked.count(pid)
        self.asked.append(pid)
        message = SimpleNamespace(_record=SimpleNamespace(enqueued_time=pid), sequence_number=n)
        script = self.flags[pid]
        return [message], script[min(n, len(script) - 1)]


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fanout, "PEEK_PAUSE_S", 0.0)


@pytest.mark.parametrize(
    ("flags", "peeks"),
    [
        (([False], [False], [False]), 1),
        (([False], [True, False], [False]), 2),  # the second answers say nothing moved
        (([True, True, False], [False]), 3),
        (([True], [False]), PEEK_AGAIN + 1),  # a change that goes on: the last peek stands
    ],
)
def test_the_peek_is_made_again_while_a_partition_says_it_moved_messages(
    flags: tuple[list[bool], ...], peeks: int
) -> None:
    receiver = _Receiver(*flags)
    peeked = asyncio.run(peek_partitioned(receiver, 5, 0, None))  # type: ignore[arg-type]
    assert sorted(receiver.asked) == sorted(list(range(len(flags))) * peeks)
    # the answers of the last round, oldest first
    assert [(m._record.enqueued_time, m.sequence_number) for m in peeked] == [
        (pid, peeks - 1) for pid in range(len(flags))
    ]
