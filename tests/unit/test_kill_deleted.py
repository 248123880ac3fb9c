"""Deleting an entity kills its actors, each once it refuses calls, and every one of them even
when some never answer (``NamespaceActor._kill_deleted``), without Ray: the namespace's method
on stand-in actors, with its timeout shortened."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from raybus._actors import namespace as namespace_module
from raybus._actors.namespace import NamespaceActor

TIMEOUT_S = 1.0  # not 0.2: a pause of a loaded machine failed "no waiting when all answer"


class Method:
    def __init__(self, actor: StandIn) -> None:
        self._actor = actor

    def remote(self) -> Any:
        return self._actor.mark()


class StandIn:
    """An actor of the deleted entity: ``mode`` says how its ``mark_deleted`` answers."""

    def __init__(self, name: str, mode: str) -> None:
        self.name, self.mode = name, mode
        self.marked = False
        self.mark_deleted = Method(self)

    async def mark(self) -> None:
        if self.mode == "hang":  # dead or restarting: no answer, ever
            await asyncio.Event().wait()
        if self.mode == "fail":
            raise ConnectionError(f"{self.name} is gone")
        self.marked = True


class Namespace:
    """What ``_kill_deleted`` uses of the namespace actor: ``_in`` (the internal handle)."""

    def _in(self, handle: StandIn) -> StandIn:
        return handle


@pytest.fixture
def killed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    out: list[str] = []
    monkeypatch.setattr(namespace_module, "MARK_DELETED_TIMEOUT_S", TIMEOUT_S)
    monkeypatch.setattr(
        namespace_module.ray, "kill", lambda handle, no_restart: out.append(handle.name)
    )
    return out


def kill_deleted(actors: list[StandIn]) -> float:
    """Run the namespace's ``_kill_deleted`` on ``actors``; the seconds it took (fails, not
    hangs, if it waits past twice the timeout plus a margin)."""

    async def run() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(
            NamespaceActor._kill_deleted(Namespace(), actors),  # type: ignore[arg-type]
            2 * TIMEOUT_S + 2.0,
        )
        return loop.time() - started

    return asyncio.run(run())


def test_every_actor_is_marked_then_killed(killed: list[str]) -> None:
    actors = [StandIn(f"p{i}", "answer") for i in range(3)]
    took = kill_deleted(actors)
    assert all(a.marked for a in actors)
    assert killed == ["p0", "p1", "p2"]
    assert took < TIMEOUT_S  # no waiting when all answer


def test_an_actor_that_never_answers_is_killed_after_the_timeout(
    killed: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    actors = [StandIn("p0", "answer"), StandIn("p1", "hang"), StandIn("p2", "answer")]
    with caplog.at_level(logging.WARNING, logger="raybus.namespace"):
        took = kill_deleted(actors)
    assert killed == ["p0", "p1", "p2"]  # the silent one too, and the others regardless
    assert actors[0].marked and actors[2].marked and not actors[1].marked
    assert TIMEOUT_S <= took < TIMEOUT_S + 1.5
    assert "did not answer in time" in caplog.text


def test_an_actor_whose_mark_fails_is_killed_at_once(
    killed: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    actors = [StandIn("p0", "fail"), StandIn("p1", "answer")]
    with caplog.at_level(logging.INFO, logger="raybus.namespace"):
        took = kill_deleted(actors)
    assert killed == ["p0", "p1"]
    assert took < TIMEOUT_S
    assert "did not mark itself" in caplog.text and "p0 is gone" in caplog.text
