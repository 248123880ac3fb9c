"""Cached actor handles, without Ray. The forwarder's namespace actor: looked up once, not once
per batch; kept through restarts; dropped and looked up again once it is gone for good (a
namespace deleted and created again). The coordinator, as routers and forwarders find it: once,
off the event loop. The coordinator's partitions: a bounded, least-recently-used cache."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import ray.exceptions as rex

from raybus._actors import forwarder
from raybus._actors.handles import HandleCache
from raybus.exceptions import MessagingEntityNotFoundError, ServiceBusConnectionError


class FakeMethod:
    def __init__(self, actor: FakeActor, name: str) -> None:
        self._actor, self._name = actor, name

    def remote(self, *args: Any) -> Any:
        return self._actor.answer(self._name, args)


class FakeActor:
    """A namespace actor: answers ``route`` with its own name, or fails as told."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.fail: BaseException | None = None
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, method: str) -> FakeMethod:
        return FakeMethod(self, method)

    async def answer(self, method: str, args: tuple[Any, ...]) -> Any:
        self.calls.append((method, args))
        if self.fail is not None:
            raise self.fail
        if args == ("missing",):
            raise MessagingEntityNotFoundError("no such entity", "missing")
        return (self.name, method, args)


class Cluster:
    """The GCS's named actors: counts lookups; ``current`` is what a lookup finds now."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.current = FakeActor("first")
        self.lookups = 0
        monkeypatch.setattr(forwarder, "named_actor", self.named_actor)
        monkeypatch.setattr(forwarder, "internal", lambda handle, _ns: handle)

    async def named_actor(self, name: str) -> FakeActor:
        self.lookups += 1
        return self.current


def started(monkeypatch: pytest.MonkeyPatch) -> tuple[Cluster, forwarder._Registry]:
    """A cluster whose namespace actor ("first") a first forwarded batch has looked up."""
    cluster = Cluster(monkeypatch)
    registry = forwarder._Registry("ns")
    assert asyncio.run(registry.call("dest", "route", "dest"))[0] == "first"
    return cluster, registry


def test_the_namespace_actor_is_looked_up_once_for_many_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(monkeypatch)
    registry = forwarder._Registry("ns")

    async def batches() -> list[Any]:
        return [await registry.call("dest", "route", "dest") for _ in range(5)]

    assert asyncio.run(batches()) == [("first", "route", ("dest",))] * 5
    assert cluster.lookups == 1


def test_a_restarting_namespace_actor_keeps_its_handle(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, registry = started(monkeypatch)
    first = cluster.current
    first.fail = rex.ActorUnavailableError("restarting", None)
    cluster.current = FakeActor("other")  # would be found by a lookup: must not be
    with pytest.raises(ServiceBusConnectionError):
        asyncio.run(registry.call("dest", "route", "dest"))
    first.fail = None
    assert asyncio.run(registry.call("dest", "route", "dest"))[0] == "first"
    assert cluster.lookups == 1


def test_a_namespace_actor_gone_for_good_is_looked_up_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster, registry = started(monkeypatch)
    cluster.current.fail = rex.ActorDiedError()
    cluster.current = FakeActor("recreated")
    # The same call answers, from the namespace created again.
    assert asyncio.run(registry.call("dest", "router_config", "dest")) == (
        "recreated",
        "router_config",
        ("dest",),
    )
    assert cluster.lookups == 2
    assert asyncio.run(registry.call("dest", "route", "dest"))[0] == "recreated"
    assert cluster.lookups == 2


def test_a_fresh_handle_that_is_gone_is_not_looked_up_in_a_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(monkeypatch)
    cluster.current.fail = rex.ActorDiedError()
    registry = forwarder._Registry("ns")
    with pytest.raises(MessagingEntityNotFoundError):
        asyncio.run(registry.call("dest", "route", "dest"))
    assert cluster.lookups == 1


def test_a_missing_destination_is_the_namespaces_answer_not_a_dead_handle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(monkeypatch)
    registry = forwarder._Registry("ns")
    for _ in range(2):
        with pytest.raises(MessagingEntityNotFoundError, match="no such entity"):
            asyncio.run(registry.call("missing", "route", "missing"))
    assert cluster.lookups == 1
    assert len(cluster.current.calls) == 2  # asked once each time: not retried


def test_the_coordinator_is_found_once_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Routers and forwarders start transactions through ``CoordinatorCommit``: the blocking
    find-or-create runs once, in a thread (never on the actor's event loop)."""
    import threading

    from raybus._actors import coordinator

    made: list[tuple[str, str | None, bool]] = []

    def fake_coordinator_actor(namespace: str, storage_path: str | None = None) -> Any:
        made.append((namespace, storage_path, threading.current_thread() is main))
        return FakeActor("coordinator")

    main = threading.main_thread()
    monkeypatch.setattr(coordinator, "coordinator_actor", fake_coordinator_actor)
    monkeypatch.setattr(coordinator, "internal", lambda handle, namespace: handle)
    finder = coordinator.CoordinatorCommit("ns", "/data")

    async def twice() -> tuple[Any, Any]:
        return await finder.method(), await finder.method()

    first, second = asyncio.run(twice())
    assert made == [("ns", "/data", False)]  # once, and not on the loop's thread
    assert first is second


def test_the_coordinator_keeps_the_most_recently_used_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The coordinator's partition handles are an LRU cache: a name used again stays, the
    least recently used goes past the bound (a deleted entity's names do not stay forever),
    and a name dropped is simply looked up again."""
    from raybus._actors import coordinator

    looked_up: list[str] = []

    async def fake_named_actor(name: str) -> Any:
        looked_up.append(name)
        actor = FakeActor(name)
        actor._actor_id = name  # type: ignore[attr-defined]
        return actor

    monkeypatch.setattr(coordinator, "named_actor", fake_named_actor)
    monkeypatch.setattr(coordinator, "internal", lambda handle, namespace: handle)
    actor = coordinator.CoordinatorActor.__new__(coordinator.CoordinatorActor)
    actor._namespace = "ns"
    actor._partitions = coordinator.HandleCache(actor._look_up, 2)  # PARTITION_CACHE, smaller

    async def use(*names: str) -> None:
        for name in names:
            found = await actor._partition(name)
            assert found is not None and found.commit._actor.name == name

    asyncio.run(use("a", "b", "a", "c"))  # "b" is the least recently used when "c" comes
    assert [n in actor._partitions for n in "abc"] == [True, False, True]
    asyncio.run(use("b"))
    assert looked_up == ["a", "b", "c", "b"]


def test_the_coordinator_drops_a_partition_that_died_for_good_and_keeps_a_restarting_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit that finds a participant's actor dead for good (its entity deleted; the name
    may get a new actor) drops it from the cache, so the next use looks it up again; one that
    is only unreachable (restarting under the same handle) stays cached. Neither is confirmed,
    so the decision stays to be re-sent."""
    from raybus._actors import coordinator

    actors: dict[str, FakeActor] = {}
    looked_up: list[str] = []

    async def fake_named_actor(name: str) -> Any:
        looked_up.append(name)
        return actors.setdefault(name, FakeActor(name))

    monkeypatch.setattr(coordinator, "named_actor", fake_named_actor)
    monkeypatch.setattr(coordinator, "internal", lambda handle, namespace: handle)
    actor = coordinator.CoordinatorActor.__new__(coordinator.CoordinatorActor)
    actor._namespace = "ns"
    actor._partitions = coordinator.HandleCache(actor._look_up, coordinator.PARTITION_CACHE)
    actor._decided = {"txn": ["dead", "restarting", "fine"]}
    actor._log = None
    actor._resume = None

    async def commit_once() -> None:
        handles = [await actor._partition(n) for n in actor._decided["txn"]]
        actors["dead"].fail = rex.ActorDiedError()
        actors["restarting"].fail = rex.RayActorError()
        await actor._tell_commit("txn", actor._decided["txn"], handles)  # type: ignore[arg-type]
        if actor._resume is not None:
            actor._resume.cancel()

    asyncio.run(commit_once())
    kept = [n in actor._partitions for n in ("dead", "restarting", "fine")]
    assert kept == [False, True, True]
    assert "txn" in actor._decided  # not confirmed by all: re-sent later
    assert [m for m, _ in actors["fine"].calls] == ["txn_commit"]
    asyncio.run(actor._partition("dead"))
    assert looked_up == ["dead", "restarting", "fine", "dead"]


# ------------------------------------------------------------ the helper all three use


class Lookups:
    """A GCS of named actors for ``HandleCache``: counts lookups per name; names in
    ``missing`` have no actor (``ValueError``, as ``named_actor`` raises)."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.missing: set[str] = set()

    async def __call__(self, name: str) -> tuple[str, int]:
        if name in self.missing:
            raise ValueError(f"no actor named {name!r}")
        self.made.append(name)
        return (name, len(self.made))  # a new value per lookup: a repeated one shows


def test_handle_cache_looks_a_name_up_once_and_drops_the_least_recently_used() -> None:
    lookups = Lookups()
    cache: HandleCache[tuple[str, int]] = HandleCache(lookups, size=2)

    async def use(*names: str) -> list[tuple[str, int]]:
        return [await cache.get(n) for n in names]

    assert asyncio.run(use("a", "b", "a")) == [("a", 1), ("b", 2), ("a", 1)]
    asyncio.run(use("c"))  # "b" is the least recently used
    assert [n in cache for n in "abc"] == [True, False, True]
    assert asyncio.run(use("b")) == [("b", 4)]  # looked up again
    assert lookups.made == ["a", "b", "c", "b"]
    assert [n in cache for n in "abc"] == [False, True, True]


def test_handle_cache_keeps_nothing_when_a_lookup_fails() -> None:
    lookups = Lookups()
    lookups.missing.add("gone")
    cache: HandleCache[tuple[str, int]] = HandleCache(lookups, size=2)
    asyncio.run(cache.get("a"))
    with pytest.raises(ValueError, match="no actor named 'gone'"):
        asyncio.run(cache.get("gone"))
    assert "a" in cache and "gone" not in cache
    lookups.missing.clear()  # the actor exists now: the next get finds it
    assert asyncio.run(cache.get("gone")) == ("gone", 2)


def test_handle_cache_looks_a_forgotten_dead_handle_up_again() -> None:
    lookups = Lookups()
    cache: HandleCache[tuple[str, int]] = HandleCache(lookups)
    assert asyncio.run(cache.get("ns")) == ("ns", 1)
    cache.forget("ns")  # its actor died for good
    cache.forget("never-kept")  # harmless
    assert "ns" not in cache
    assert asyncio.run(cache.get("ns")) == ("ns", 2)
    assert asyncio.run(cache.get("ns")) == ("ns", 2)
    assert lookups.made == ["ns", "ns"]


def test_handle_cache_refuses_a_size_below_one() -> None:
    with pytest.raises(ValueError, match="at least one name"):
        HandleCache(Lookups(), size=0)
