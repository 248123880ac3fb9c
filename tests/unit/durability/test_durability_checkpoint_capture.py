"""A checkpoint is captured on the event loop and encoded in a worker thread, with the cyclic
garbage collector paused in between (``Committer._start_checkpoint``).

Real directory (``tmp_path``), real threads: the encoding is held back with an event while
the test changes the partition on the loop, so what it writes is known to be what was
captured, not what the partition holds by the time the thread gets to it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from durability_helpers import EVERYTHING, by_id, core_factory, records

from raybus._core import committer as committer_module
from raybus._core import journal
from raybus._core.committer import Committer
from raybus._core.partition import ABANDON, COMPLETE, SettleOp
from raybus._storage import DurableLog
from raybus.exceptions import ServiceBusError
from raybus.testing import FakeClock


def local(tmp_path: Path, clock: FakeClock, checkpoint_min: int = 1000) -> Committer:
    """A Committer over ``tmp_path/p0``; call again to "restart"."""
    return Committer(
        core_factory(clock),
        DurableLog.from_storage_path(str(tmp_path), "p0"),
        checkpoint_min=checkpoint_min,
    )


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    """Whatever a test leaves, the collector runs again after it."""
    yield
    gc.enable()


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.005)


class HeldEncoding:
    """``_encode`` that waits for ``release`` in its thread, and records whether the garbage
    collector ran meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started = threading.Event()
        self.released = threading.Event()
        self.collecting_while_held: list[bool] = []
        real = committer_module._encode

        def held(entries: Any) -> Any:
            self.started.set()
            self.collecting_while_held.append(gc.isenabled())
            assert self.released.wait(5)
            return real(entries)

        monkeypatch.setattr(committer_module, "_encode", held)

    def release(self) -> None:
        self.released.set()


async def test_the_checkpoint_holds_the_state_as_captured_while_the_partition_changes(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the capture and the encoding the partition delivers, abandons with new
    properties and completes: the checkpoint written has every message as it was at the
    capture (no delivery, the first properties), and a restart from it and the log after it
    has the state as it is now."""
    c = local(tmp_path, clock)
    c.core.send(records(*(f"m{i}" for i in range(20)), application_properties={"v": 1}))
    await c.durable()
    held = HeldEncoding(monkeypatch)
    written: list[Any] = []
    log = c.durable_log
    assert log is not None
    real_checkpoint = log.checkpoint

    def keep(table: Any, upto: int) -> None:
        written.append(table)
        real_checkpoint(table, upto)

    monkeypatch.setattr(log, "checkpoint", keep)

    c._start_checkpoint()
    assert not gc.isenabled()  # paused from the capture on
    await asyncio.to_thread(held.started.wait, 5)
    got = c.core.receive(10)
    c.core.settle([SettleOp(ABANDON, r.lock_token, properties={"v": 2}) for r in got[:5]])
    c.core.settle([SettleOp(COMPLETE, r.lock_token) for r in got[5:]])
    await c.durable()  # flushes go on while the checkpoint is encoded
    held.release()
    await eventually(lambda: c._checkpointing is None)

    assert gc.isenabled()  # running again once the encoding let the capture go
    assert held.collecting_while_held == [False]
    [table] = written
    state = journal.replay(journal.from_table(table))
    restored = core_factory(clock)()
    restored.load(state)
    captured = {r.message_id: r for r in restored.peek(0, EVERYTHING)}
    assert sorted(captured) == sorted(f"m{i}" for i in range(20))
    assert {(r.delivery_count, r.application_properties["v"]) for r in captured.values()} == {
        (0, 1)
    }

    now = by_id(local(tmp_path, clock).core)
    assert sorted(now) == sorted(f"m{i}" for i in (*range(5), *range(10, 20)))
    assert [now[f"m{i}"].application_properties["v"] for i in range(5)] == [2] * 5
    assert [now[f"m{i}"].delivery_count for i in range(5)] == [1] * 5


async def test_an_encoding_that_fails_is_logged_and_waits_for_another_threshold(
    tmp_path: Path,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Encoding the captured state raises (a bug) in the thread: it is logged with its
    traceback, the collector runs again, flushes go on, the next checkpoint waits for
    another threshold of entries, and the log stays complete."""
    c = local(tmp_path, clock, checkpoint_min=5)
    attempts: list[int] = []
    settled: list[str] = []

    def broken(entries: Any) -> Any:
        attempts.append(len(settled))
        raise TypeError("injected: a state that does not encode")

    monkeypatch.setattr(committer_module, "_encode", broken)
    c.core.send(records(*(f"m{i}" for i in range(10))))
    await c.durable()
    with caplog.at_level(logging.ERROR, logger="raybus.commit"):
        for rec in c.core.receive(10):
            c.core.settle([SettleOp(COMPLETE, rec.lock_token)])
            settled.append(rec.lock_token)
            await asyncio.wait_for(c.durable(), 5)
            await eventually(lambda: c._checkpointing is None)
            assert gc.isenabled()
    # Due at the 4th completion (14 entries >= 2 x 6 messages left); after the failure the
    # next one waits for another 5 entries (the 9th), not for the next flush.
    assert attempts == [4, 9]
    assert any(
        r.getMessage().startswith("checkpoint of orders not encoded")
        and r.exc_info
        and "does not encode" in str(r.exc_info[1])
        for r in caplog.records
    )
    assert c.durable_log is not None and c.durable_log.checkpoint_lsn is None
    monkeypatch.undo()
    assert by_id(local(tmp_path, clock).core) == {}  # every completion was logged


async def test_the_collector_stays_off_if_it_was_off(tmp_path: Path, clock: FakeClock) -> None:
    c = local(tmp_path, clock)
    c.core.send(records("a", "b"))
    gc.disable()
    await c.checkpoint_now()
    assert not gc.isenabled()
    gc.enable()
    assert c.durable_log is not None and c.durable_log.checkpoint_lsn is not None
    assert sorted(by_id(local(tmp_path, clock).core)) == ["a", "b"]


async def test_a_failure_before_the_encoding_starts_turns_the_collector_on_again(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture succeeds and what follows it fails (here the size estimate): the
    checkpoint is not captured, and the collector runs again."""
    c = local(tmp_path, clock)
    c.core.send(records("a"))
    await c.durable()

    def broken() -> int:
        raise TypeError("injected: after the capture")

    monkeypatch.setattr(c, "_live_bytes", broken)
    with pytest.raises(ServiceBusError, match=r"checkpoint not captured.*after the capture"):
        c._start_checkpoint()
    assert gc.isenabled()
    assert c._checkpointing is None
