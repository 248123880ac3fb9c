"""Whether a peek across the partitions is made again (``raybus.aio._fanout._moving``): when a
partition says it moved messages out a moment ago, and when one cannot say (restarting or
removed: the peek made again meets that with the client's retry policy). Without Ray: the
partitions' answers stand in for ``_rpc.call``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from raybus import _rpc
from raybus.aio._fanout import _moving
from raybus.exceptions import ServiceBusConnectionError

ROUTE: Any = SimpleNamespace(properties=SimpleNamespace(name="q"))


@pytest.fixture(autouse=True)
def partitions_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    async def call(entity: str, answer: str, *args: Any, **kwargs: Any) -> bool:
        assert entity == "q" and not args
        if answer == "restarting":
            raise ServiceBusConnectionError("the partition restarted", entity)
        return answer == "moved"

    monkeypatch.setattr(_rpc, "call", call)


def _parts(*answers: str) -> list[tuple[int, Any]]:
    return [(pid, SimpleNamespace(moving=a)) for pid, a in enumerate(answers)]


@pytest.mark.parametrize(
    ("answers", "again"),
    [
        (("still", "still", "still"), False),
        (("still", "moved", "still"), True),
        (("still", "restarting"), True),
    ],
)
def test_the_peek_is_made_again_if_a_partition_moved_or_cannot_say(
    answers: tuple[str, ...], again: bool
) -> None:
    assert asyncio.run(_moving(ROUTE, _parts(*answers))) is again
