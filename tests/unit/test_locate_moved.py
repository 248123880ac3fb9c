"""Where a client sends a deferred or scheduled message's number (``Connection.locate``) when
a partition change moved it: to the partition that says it holds it, else to the one its
source names; a partition the client's route does not have yet raises the error that
``Connection.retrying`` answers with a fresh route. Without Ray: each partition's answer
stands in for ``_rpc.call`` of its ``locate``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from raybus import _rpc
from raybus._connection import Connection
from raybus.exceptions import MessagingEntityNotFoundError

P0, P1 = 0, 1 << 48  # the first numbers of partitions 0 and 1


def _route(answers: dict[int, tuple[list[int], dict[int, int]]], known: set[int]) -> Any:
    """A route of the partitions in ``answers`` (each answers its ``locate`` so); the route
    knows the partition ids in ``known``."""
    handles = {pid: SimpleNamespace(locate=answer) for pid, answer in answers.items()}
    return SimpleNamespace(
        properties=SimpleNamespace(name="q"),
        existing=lambda: list(handles.items()),
        handle=lambda pid: object() if pid in known else None,
    )


@pytest.fixture(autouse=True)
def partitions_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    async def call(entity: str, answer: Any, *args: Any, **kwargs: Any) -> Any:
        return answer

    monkeypatch.setattr(_rpc, "call", call)


def _locate(route: Any, seqs: list[int]) -> tuple[dict[int, list[int]], list[int]]:
    return asyncio.run(Connection.locate(None, route, seqs))  # type: ignore[arg-type]


def test_a_moved_number_goes_to_the_partition_its_source_names() -> None:
    route = _route({0: ([], {P0 + 5: 2}), 1: ([P1 + 1], {})}, known={0, 1, 2})
    assert _locate(route, [P0 + 5, P1 + 1]) == ({2: [P0 + 5], 1: [P1 + 1]}, [])


def test_a_partition_holding_the_number_wins_over_a_stale_source() -> None:
    # The source says partition 2 (it moved on from there since); partition 1 holds it.
    route = _route({0: ([], {P0 + 5: 2}), 1: ([P0 + 5], {})}, known={0, 1, 2})
    assert _locate(route, [P0 + 5]) == ({1: [P0 + 5]}, [])


def test_a_number_found_nowhere_goes_to_the_partition_it_names_and_is_reported() -> None:
    route = _route({0: ([], {}), 1: ([], {})}, known={0, 1})
    assert _locate(route, [P1 + 3]) == ({1: [P1 + 3]}, [P1 + 3])


def test_a_target_the_route_does_not_have_yet_asks_for_a_fresh_route() -> None:
    route = _route({0: ([], {P0 + 5: 3}), 1: ([], {})}, known={0, 1})
    with pytest.raises(MessagingEntityNotFoundError, match="partition 3 is not in this"):
        _locate(route, [P0 + 5])
