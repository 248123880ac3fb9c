"""A settings change sent to an entity's partitions survives a partition that restarts under
it (``raybus._actors.namespace.tell_each``), without Ray: stand-in calls that raise Ray's actor
errors, pauses shortened."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import ray.exceptions as rex

from raybus._actors.namespace import tell_each


def _restarting() -> Exception:
    # What Ray 2.60 raises for a call in flight to an actor killed and restarting.
    return rex.ActorUnavailableError("The actor was restarted", None)


class Partition:
    """Fails its first ``deaths`` calls with ``error``, then takes the settings."""

    def __init__(self, deaths: int, error: Callable[[], Exception] = _restarting) -> None:
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


def test_a_partition_restarting_under_the_call_is_told_again_once_it_is_back() -> None:
    steady, twice, other = Partition(0), Partition(2), Partition(1, lambda: rex.RayActorError())
    _tell([steady, twice, other])
    assert [p.settings for p in (steady, twice, other)] == ["new"] * 3
    assert (steady.calls, twice.calls, other.calls) == (1, 3, 2)


def test_a_partition_that_keeps_restarting_fails_the_call_after_the_last_try() -> None:
    flapping = Partition(10)
    with pytest.raises(rex.ActorUnavailableError):
        _tell([flapping, Partition(0)], tries=3)
    assert flapping.calls == 3


@pytest.mark.parametrize("error", [rex.ActorDiedError, ValueError])
def test_a_partition_gone_for_good_or_refusing_is_not_asked_again(
    error: Callable[[], Exception],
) -> None:
    partition = Partition(1, error)
    with pytest.raises(error):  # type: ignore[arg-type]
        _tell([partition])
    assert partition.calls == 1
