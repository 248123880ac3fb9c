"""The ``guarded`` wrapper of actor methods, without Ray: the access check runs first, and the
``_serving`` hook is awaited only while the actor is broken (a plain attribute check otherwise)."""

from __future__ import annotations

import asyncio

import pytest

from raybus._actors.access import Guarded, guarded
from raybus._core.access import ANY, Guard
from raybus.testing import FakeClock


class Broken(Exception):
    pass


class Actor(Guarded):
    def __init__(self) -> None:
        self._namespace = "ns"
        self._guard = Guard(None, FakeClock())  # no rules: open
        self.hooks = 0
        self.ran = 0

    async def _serving(self) -> None:
        self.hooks += 1
        if self._broken is not None:
            raise self._broken

    @guarded(ANY)
    async def work(self, x: int) -> int:
        self.ran += 1
        return x * 2


def test_the_serving_hook_runs_only_while_the_actor_is_broken() -> None:
    actor = Actor()
    assert asyncio.run(actor.work(21)) == 42
    assert (actor.hooks, actor.ran) == (0, 1)  # healthy: the hook is not awaited at all
    actor._broken = Broken("damaged log")
    with pytest.raises(Broken):
        asyncio.run(actor.work(1))
    assert (actor.hooks, actor.ran) == (1, 1)  # broken: the hook refused, the method did not run
    actor._broken = None
    assert asyncio.run(actor.work(2)) == 4
    assert (actor.hooks, actor.ran) == (1, 2)
