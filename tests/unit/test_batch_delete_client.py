"""``BatchDelete`` (the receiver's ``delete_messages`` / ``purge_messages``) without Ray: a fake
connection whose partitions delete from counters, to drive the paths the integration tests do
not reach on demand (a partition change under a delete, a purge of several rounds)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raybus import _connection
from raybus.aio import _batch_delete
from raybus.aio._batch_delete import BatchDelete
from raybus.exceptions import MessagingEntityNotFoundError


class _Route:
    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def existing(self) -> list[tuple[int, Any]]:
        return [(pid, None) for pid in self.pids]


class _Conn:
    """Routes handed out in turn (the last one stays); ``retrying`` is the real one."""

    retrying = _connection.Connection.retrying

    def __init__(self, *routes: list[int]) -> None:
        self.routes = [_Route(r) for r in routes]

    async def route(self, name: str) -> _Route:
        return self.routes[0]

    async def recheck(self, name: str) -> bool:
        if len(self.routes) > 1:
            self.routes.pop(0)
        return True


class _Receiver(BatchDelete):
    """Partitions holding ``held[pid]`` messages; a partition in ``gone`` was removed."""

    entity_path = "q"
    session = None
    _dead_letter = _transfer = False

    def __init__(self, conn: _Conn, held: dict[int, int], gone: set[int] = frozenset()) -> None:
        self._conn = conn  # type: ignore[assignment]
        self.held, self.gone = held, set(gone)
        self.calls: list[tuple[int, int]] = []  # (partition, count asked)
        self.timeouts: list[Any] = []  # each call's timeout

    async def _settle_pending(self) -> None:
        pass

    def _check_receivable(self, route: Any) -> None:
        pass

    def _session_args(self) -> tuple[Any, ...]:
        return ()

    async def _call(self, method: str, count: int, *args: Any, partition: int, **kw: Any) -> int:
        assert method == "delete_messages"
        self.calls.append((partition, count))
        self.timeouts.append(kw.get("timeout"))
        if partition in self.gone:
            raise MessagingEntityNotFoundError("partition removed", "q")
        deleted = min(count, self.held[partition])
        self.held[partition] -= deleted
        return deleted


def test_a_partition_removed_under_a_delete_sends_the_rest_to_the_fresh_routes_partitions() -> None:
    # Partition 1 went away in a scale change: its messages are in partition 2 now.
    r = _Receiver(_Conn([0, 1], [0, 2]), {0: 4, 2: 20}, gone={1})
    assert asyncio.run(r.delete_messages(10)) == 10
    # 0 is asked once (not again after the fresh route), 1 fails, 2 gets what is left.
    assert r.calls == [(0, 10), (1, 6), (2, 6)]
    assert r.held == {0: 0, 2: 14}


def test_a_purge_calls_until_a_call_deletes_fewer_than_its_limit_skipping_drained_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_batch_delete, "MAX_DELETE_COUNT", 3)
    r = _Receiver(_Conn([0, 1]), {0: 5, 1: 3})
    assert asyncio.run(r.purge_messages()) == 8
    # Round 2 found partition 0 short (2 of 3): round 3 does not ask it again.
    assert r.calls == [(0, 3), (0, 3), (1, 1), (1, 3)]
    assert r.held == {0: 0, 1: 0}


def test_a_delete_asks_no_more_partitions_once_its_count_is_reached() -> None:
    r = _Receiver(_Conn([0, 1, 2]), {0: 10, 1: 10, 2: 10})
    assert asyncio.run(r.delete_messages(4)) == 4
    assert r.calls == [(0, 4)]


def test_the_timeout_bounds_each_partition_call_of_a_delete_and_a_purge() -> None:
    r = _Receiver(_Conn([0, 1]), {0: 3, 1: 5})
    assert asyncio.run(r.delete_messages(4, timeout=2.5)) == 4
    assert asyncio.run(r.purge_messages(timeout=1.5)) == 4
    assert r.timeouts == [2.5, 2.5, 1.5, 1.5]
