"""The router's logged deliveries (``raybus._actors.deliverer``) against partitions that lose
answers, stay down, give slots away or are deleted, and a router that restarts from its log:
every copy of a logged publish is stored exactly once.

No Ray: the partitions are pure ``Partition`` cores behind fake handles (a method's
``remote`` returns a coroutine, which ``_rpc.call`` awaits as it would a Ray call), and a
restart is a new ``Deliverer`` on the same storage.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from transactions_core_support import all_ids, props, rec

from raybus._actors import deliverer as deliverer_module
from raybus._actors.deliverer import Deliverer
from raybus._actors.handles import HandleCache
from raybus._core.partition import Partition
from raybus._core.record import from_wire
from raybus._core.slots import slot_of
from raybus._core.wire import unpack_rows
from raybus._storage import StorageUnavailableError
from raybus.exceptions import ServiceBusConnectionError, ServiceBusServerBusyError
from raybus.testing import FakeClock

PATH = "t/Subscriptions/s"


class _Method:
    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> Any:
        return self._fn(*args)


class FakePartition:
    """A partition core behind a handle; ``down`` calls fail before it applies anything,
    ``lose`` answers are lost after it applied the delivery."""

    def __init__(self, clock: FakeClock, **options: Any) -> None:
        self.core = Partition(props(**options), clock)
        self.down = 0
        self.lose = 0
        self.calls = 0
        self.rooms_asked = 0
        self.deliver = _Method(self._deliver)
        self.room = _Method(self._room)

    async def _deliver(self, source: str, number: int, *pieces: bytes) -> int:
        self.calls += 1
        if self.down:
            self.down -= 1
            raise ServiceBusConnectionError("restarting", None)
        self.core.deliver(source, number, from_wire(unpack_rows(pieces)))
        if self.lose:
            self.lose -= 1
            raise ServiceBusConnectionError("the answer was lost", None)
        return self.core.room()

    async def _room(self) -> int:
        self.rooms_asked += 1
        return self.core.room()


@pytest.fixture(autouse=True)
def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deliverer_module, "ATTEMPTS", 3)
    monkeypatch.setattr(deliverer_module, "RETRY_S", 0.0)


def router(storage: Path, parts: dict[str, FakePartition]) -> Deliverer:
    """A router's deliverer (a new one on the same storage is the router restarted)."""
    d = Deliverer("ns", str(storage), "router", "raybus/ns/topic/t/0/router", "t")

    async def look_up(name: str) -> Any:
        if name not in parts:
            raise ValueError(f"no actor named {name}")
        return parts[name]

    d._handles = HandleCache(look_up, 16)
    return d


async def no_replace(path: str, records: list[Any]) -> list[tuple[str, list[Any]]]:
    raise AssertionError("nothing was refused")


def by_key(records: list[Any]) -> list[tuple[str, list[Any]]]:
    """Copies placed on the map after s0 gave k1's slot to s1: k0 on s0, k1 on s1."""
    on = {"k0": "s0", "k1": "s1"}
    out: dict[str, list[Any]] = {}
    for r in records:
        out.setdefault(on[r.partition_key], []).append(r)
    return list(out.items())


def publish(*names: str, ids: tuple[str, ...] = ("a", "b")) -> list[tuple[str, str, list[Any]]]:
    copies = [rec(i) for i in ids]
    return [(name, PATH, copies) for name in names]


def test_a_publish_reaches_every_partition_once_through_lost_answers(
    tmp_path: Path, clock: FakeClock
) -> None:
    parts = {n: FakePartition(clock) for n in ("p1", "p2", "p3")}
    parts["p2"].lose = 1
    parts["p3"].down = 1
    d = router(tmp_path, parts)

    async def run() -> None:
        assert await d.fits(publish("p1", "p2", "p3"))
        await d.deliver(publish("p1", "p2", "p3"), no_replace)
        await d.deliver(publish("p1", "p2", "p3", ids=("c",)), no_replace)

    asyncio.run(run())
    for p in parts.values():
        assert all_ids(p.core) == ["a", "b", "c"]
    assert parts["p2"].calls == 3 and parts["p3"].calls == 3  # one retry each
    assert d.log.pending == {}
    assert d.log.rooms["p1"] == parts["p1"].core.room()


def test_a_restarted_router_finishes_a_publish_a_partition_did_not_take(
    tmp_path: Path, clock: FakeClock
) -> None:
    parts = {n: FakePartition(clock) for n in ("p1", "p2")}
    parts["p2"].down = 100  # down past the publish's attempts

    async def first_life() -> None:
        d = router(tmp_path, parts)
        with pytest.raises(ServiceBusConnectionError, match="delivered when it answers") as got:
            await d.deliver(publish("p1", "p2"), no_replace)
        assert got.value.entity == "t"  # the topic
        assert d._resume is not None
        d._resume.cancel()  # the process dies

    asyncio.run(first_life())
    assert all_ids(parts["p1"].core) == ["a", "b"] and all_ids(parts["p2"].core) == []
    parts["p2"].down = 0

    async def second_life() -> Deliverer:
        d = router(tmp_path, parts)
        assert list(d.log.pending) == [0]
        d.start_resume(no_replace)
        assert d._resume is not None
        await d._resume
        return d

    d = asyncio.run(second_life())
    assert all_ids(parts["p1"].core) == ["a", "b"]  # p1 skipped the redelivery
    assert all_ids(parts["p2"].core) == ["a", "b"]
    assert d.log.pending == {}


def test_numbers_stay_above_those_delivered_across_restarts(
    tmp_path: Path, clock: FakeClock
) -> None:
    parts = {"p1": FakePartition(clock), "p2": FakePartition(clock)}
    for life in range(3):
        d = router(tmp_path, parts)
        asyncio.run(d.deliver(publish("p1", "p2", ids=(f"m{life}",)), no_replace))
    assert all_ids(parts["p1"].core) == ["m0", "m1", "m2"]
    assert list(parts["p1"].core.delivered.values()) == [2]


def test_a_partition_that_gave_its_slot_away_gets_its_copies_placed_again(
    tmp_path: Path, clock: FakeClock
) -> None:
    parts = {n: FakePartition(clock) for n in ("p1", "s0", "s1")}
    parts["s0"].core.owned = frozenset({slot_of("k0")})  # gave k1's slot to s1
    placed: list[list[str | None]] = []

    async def replace(path: str, records: list[Any]) -> list[tuple[str, list[Any]]]:
        assert path == PATH
        placed.append([r.message_id for r in records])
        return by_key(records)

    copies = [rec("x", partition_key="k0"), rec("y", partition_key="k1")]
    d = router(tmp_path, parts)
    asyncio.run(d.deliver([("p1", PATH, copies), ("s0", PATH, copies)], replace))
    assert placed == [["x", "y"]]
    assert all_ids(parts["p1"].core) == ["x", "y"]
    assert all_ids(parts["s0"].core) == ["x"]
    assert all_ids(parts["s1"].core) == ["y"]
    assert d.log.pending == {}


def test_a_deleted_partition_is_owed_nothing(tmp_path: Path, clock: FakeClock) -> None:
    parts = {"p1": FakePartition(clock)}
    d = router(tmp_path, parts)
    asyncio.run(d.deliver(publish("p1", "gone"), no_replace))
    assert all_ids(parts["p1"].core) == ["a", "b"]
    assert d.log.pending == {}


def test_room_is_asked_once_and_a_full_partition_does_not_fit(
    tmp_path: Path, clock: FakeClock
) -> None:
    parts = {"p1": FakePartition(clock), "small": FakePartition(clock, max_size_in_megabytes=1)}
    parts["small"].core.send([rec(f"f{i}", b"x" * 200_000) for i in range(5)])
    d = router(tmp_path, parts)
    big = [rec("big", b"x" * 100_000)]
    assert not asyncio.run(d.fits([("p1", PATH, big), ("small", PATH, big)]))
    assert set(d.log.rooms) == {"p1", "small"}
    assert asyncio.run(d.fits([("p1", PATH, big)]))
    assert [p.rooms_asked for p in parts.values()] == [1, 1]


def test_a_logged_publish_whose_redo_cannot_be_logged_reports_an_unknown_outcome(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The publish is logged, so a later failure (here: logging the copies placed again) must
    not read as a refusal (nothing stored): it raises ``ServiceBusConnectionError``, and the
    refused copies are delivered once the log works again."""
    parts = {n: FakePartition(clock) for n in ("p1", "s0", "s1")}
    parts["s0"].core.owned = frozenset({slot_of("k0")})

    async def replace(path: str, records: list[Any]) -> list[tuple[str, list[Any]]]:
        return by_key(records)

    copies = [rec("x", partition_key="k0"), rec("y", partition_key="k1")]
    d = router(tmp_path, parts)
    assert d._changes is not None
    append = d._changes.append
    failing = {"redo"}

    async def flaky(change: Any) -> None:
        if change[0] in failing:
            raise StorageUnavailableError("the disk is gone", None, "EIO")
        await append(change)

    d._changes.append = flaky  # type: ignore[method-assign]

    async def run() -> None:
        with pytest.raises(ServiceBusConnectionError, match="logged but not delivered"):
            await d.deliver([("p1", PATH, copies), ("s0", PATH, copies)], replace)
        assert list(d.log.pending) == [0] and list(d.log.pending[0]) == ["s0"]
        failing.clear()
        assert d._resume is not None
        await d._resume

    asyncio.run(run())
    assert all_ids(parts["p1"].core) == ["x", "y"]
    assert all_ids(parts["s0"].core) == ["x"] and all_ids(parts["s1"].core) == ["y"]
    assert d.log.pending == {}


def test_a_partition_down_for_good_refuses_later_publishes_at_once_with_nothing_stored(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first publish is logged (it is delivered when the partition answers); later ones
    are refused with ``ServiceBusServerBusyError`` after one try, instead of each waiting out
    the retries, and reach no partition. Once the partition answers, publishes flow again."""
    parts = {n: FakePartition(clock) for n in ("p1", "p2")}
    parts["p2"].down = 1000
    monkeypatch.setattr(deliverer_module, "RESUME_S", 60.0)  # one background try, then a wait

    async def run() -> Deliverer:
        d = router(tmp_path, parts)
        with pytest.raises(ServiceBusConnectionError, match="delivered when it answers"):
            await d.deliver(publish("p1", "p2"), no_replace)
        await asyncio.sleep(0.05)  # the background task's first try (the fakes answer at once)
        assert parts["p2"].calls == deliverer_module.ATTEMPTS + 1
        for i in range(3):
            calls = parts["p2"].calls
            with pytest.raises(ServiceBusServerBusyError, match=f"{PATH!r}.*not stored") as got:
                await d.deliver(publish("p1", "p2", ids=(f"late{i}",)), no_replace)
            assert got.value.entity == "t"
            assert parts["p2"].calls == calls + 1  # one try, not the publish's retries
        assert list(d.log.pending) == [0]
        parts["p2"].down = 0
        assert d._resume is not None
        d._resume.cancel()  # not waiting out its minute
        with contextlib.suppress(asyncio.CancelledError):
            await d._resume
        d.start_resume(no_replace)
        await d._resume
        await d.deliver(publish("p1", "p2", ids=("after",)), no_replace)
        return d

    d = asyncio.run(run())
    for p in parts.values():
        assert all_ids(p.core) == ["a", "b", "after"]
    assert d.log.pending == {}


def test_a_publish_whose_caller_is_cancelled_while_it_is_logged_is_still_delivered(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Cancelled during its log write, the publish must not be forgotten while the write
    lands in the log (it would reach the subscriptions only after a restart)."""
    parts = {n: FakePartition(clock) for n in ("p1", "p2")}
    d = router(tmp_path, parts)
    assert d._changes is not None
    append = d._changes.append

    async def run() -> None:
        release = asyncio.Event()

        async def slow(change: Any) -> None:
            await release.wait()
            await append(change)

        d._changes.append = slow  # type: ignore[method-assign]
        caller = asyncio.ensure_future(d.deliver(publish("p1", "p2"), no_replace))
        await asyncio.sleep(0)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        release.set()
        d._changes.append = append  # type: ignore[method-assign]
        await d.deliver(publish("p1", "p2", ids=("c",)), no_replace)

    asyncio.run(run())
    for p in parts.values():
        assert all_ids(p.core) == ["a", "b", "c"]
    assert d.log.pending == {}
