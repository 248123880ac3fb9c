"""A settings change sent to an entity's partitions survives a partition that dies under it
(``raybus._actors.namespace.tell_each``), without Ray: stand-in calls that raise Ray's actor
errors, pauses shortened."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import ray.exceptions as rex

from raybus._actors.namespace import tell_each


class Partition:
    """Fails its first ``deaths`` calls with ``error`` (a kill under the call), then takes
    the settings."""

    def __init__(self, deaths: int, error: Callable[[], Exception] = rex.ActorDiedError) -> None:
        self.deaths, self.error = deaths, error
        self.calls = 0
        self.settings: str | None = None

    async def update(self, settings: str) -> None:
        self.calls += 1
        if self.calls <= self.deaths:
            raise self.error()
        self.settings = settings


def _tell(partitions: list[Partition], tries: int = 5) -> None:
    asyncio.run(tell_each(partitions, lambda p: p.update("new"), tries=tries, pause_s=0.001))


def test_a_partition_killed_under_the_call_is_told_again_once_it_is_back() -> None:
    steady, killed, unavailable = (
        Partition(0),
        Partition(2),
        Partition(1, lambda: rex.ActorUnavailableError("restarting", None)),
    )
    _tell([steady, killed, unavailable])
    assert [p.settings for p in (steady, killed, unavailable)] == ["new"] * 3
    assert (steady.calls, killed.calls, unavailable.calls) == (1, 3, 2)


def test_a_partition_that_keeps_dying_fails_the_call_after_the_last_try() -> None:
    gone = Partition(10)
    with pytest.raises(rex.ActorDiedError):
        _tell([gone, Partition(0)], tries=3)
    assert gone.calls == 3


def test_what_a_partition_raises_itself_is_not_repeated() -> None:
    refusing = Partition(1, ValueError)
    with pytest.raises(ValueError):
        _tell([refusing])
    assert refusing.calls == 1
