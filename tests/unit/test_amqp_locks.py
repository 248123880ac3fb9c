"""The AMQP gateway's lock-token index and its ask-every-partition fallback (no Ray)."""

from __future__ import annotations

import asyncio

import pytest

from raybus.amqp._locks import LockIndex, by_token
from raybus.exceptions import MessageLockLostError, SessionLockLostError


def test_lock_index_remembers_forgets_and_drops_the_oldest_past_capacity() -> None:
    index = LockIndex(capacity=2)
    index.remember("a", 1)
    index.remember("b", 2)
    index.remember("a", 3)  # refreshed: now the newest
    index.remember("c", 4)
    assert (index.sequence_number("a"), index.sequence_number("b")) == (3, None)
    index.forget("c")
    index.forget("never")
    assert index.sequence_number("c") is None and len(index) == 1
    with pytest.raises(ValueError, match="capacity"):
        LockIndex(capacity=0)


class _Partitions:
    """Partitions by id; ``holder`` holds the lock, the rest refuse as raybus does."""

    def __init__(self, holder: int | None, other_error: BaseException | None = None) -> None:
        self.holder, self.other_error, self.asked = holder, other_error, []

    async def __call__(self, seq: int | None) -> str:
        pid = None if seq is None else seq >> 48
        self.asked.append(seq)
        if pid == self.holder:
            return f"settled in {pid}"
        if self.other_error is not None and pid == 0:
            raise self.other_error
        raise MessageLockLostError("no such lock", "q", "t")


def test_by_token_with_a_sequence_number_asks_its_partition_only() -> None:
    calls = _Partitions(holder=3)
    assert asyncio.run(by_token(calls, (3 << 48) + 17, (0, 1, 2, 3))) == "settled in 3"
    assert calls.asked == [(3 << 48) + 17]


def test_by_token_without_one_asks_every_partition_and_takes_the_holder() -> None:
    calls = _Partitions(holder=2)
    assert asyncio.run(by_token(calls, None, (0, 2, 5))) == "settled in 2"
    assert sorted(calls.asked) == [0, 2 << 48, 5 << 48]


def test_by_token_held_nowhere_is_lock_lost() -> None:
    with pytest.raises(MessageLockLostError):
        asyncio.run(by_token(_Partitions(holder=None), None, (0, 1)))
    with pytest.raises(MessageLockLostError):
        asyncio.run(by_token(_Partitions(holder=None), None, ()))


def test_by_token_reports_an_error_other_than_lock_lost() -> None:
    calls = _Partitions(holder=None, other_error=SessionLockLostError("gone", "q"))
    with pytest.raises(SessionLockLostError):
        asyncio.run(by_token(calls, None, (0, 1)))
