"""Where a flush is written (``raybus._core.committer``'s docstring): a small one to a local
segment on the event loop's thread, a large one or one to an object store in a worker thread,
and, while the small writes are slow on average, those in the thread too. Whichever
thread wrote it, an acknowledged change is durable and a failed write (or a flush whose entries
cannot be encoded) undoes what it carried.

Runs on a real directory (``tmp_path``, fsync included); the time an inline write took is read
from a fake clock that the log's append moves on.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from durability_helpers import by_id, core_factory, record

from raybus._core import committer as committer_module
from raybus._core.committer import SLOW_INLINE_S, WRITE_TIME_WEIGHT, Committer
from raybus._storage import DurableLog, StorageUnavailableError
from raybus._storage.framing import Batches
from raybus.exceptions import ServiceBusError
from raybus.testing import FakeClock


class WatchedLog(DurableLog):
    """A local ``DurableLog`` that records which thread ran each append, can make the next
    appends take ``slow_s`` seconds of ``clock``, and can fail the next one."""

    def __init__(self, directory: str, clock: FakeClock, **options: Any) -> None:
        super().__init__(pafs.LocalFileSystem(), directory, **options)
        self.clock = clock
        self.threads: list[int] = []
        self.slow_s = 0.0
        self.fail_next = False

    def append(self, data: Batches) -> int:
        self.threads.append(threading.get_ident())
        self.clock.advance(self.slow_s)
        if self.fail_next:
            self.fail_next = False
            raise StorageUnavailableError("injected: the disk refused the write")
        return super().append(data)


def committer(log: WatchedLog, clock: FakeClock, **options: Any) -> Committer:
    return Committer(core_factory(clock), log, monotonic=clock.now, **options)


def on_disk(
    tmp_path: Path, clock: FakeClock, log_options: dict[str, Any] | None = None, **options: Any
) -> tuple[WatchedLog, Committer]:
    """A watched log in ``tmp_path`` and a Committer writing to it."""
    log = WatchedLog(str(tmp_path), clock, **(log_options or {}))
    return log, committer(log, clock, **options)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def send(c: Committer, message_id: str, size: int = 16) -> None:
    """Send one message of ``size`` bytes and wait until it is durable."""
    c.core.send([record(b"x" * size, message_id=message_id)])
    await c.durable()


def stored(tmp_path: Path, clock: FakeClock) -> set[str]:
    """The message ids a restarted Committer recovers from ``tmp_path``."""
    return set(by_id(committer(WatchedLog(str(tmp_path), clock), clock).core))


async def test_a_small_flush_to_a_local_segment_is_written_on_the_loops_thread(
    tmp_path: Path, clock: FakeClock
) -> None:
    log, c = on_disk(tmp_path, clock)
    await send(c, "a")
    await send(c, "b")
    assert log.threads == [threading.get_ident()] * 2
    assert c.inline_flushes == 2
    assert stored(tmp_path, clock) == {"a", "b"}


async def test_a_flush_larger_than_inline_bytes_is_written_in_a_worker_thread(
    tmp_path: Path, clock: FakeClock
) -> None:
    log, c = on_disk(tmp_path, clock, inline_bytes=4096)
    await send(c, "small")
    await send(c, "large", size=8192)
    assert log.threads[0] == threading.get_ident()
    assert log.threads[1] != threading.get_ident()
    assert c.inline_flushes == 1
    assert stored(tmp_path, clock) == {"small", "large"}


async def test_the_default_limit_takes_one_64_kib_message_inline_and_not_a_list_of_1_kib(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The two cases ``INLINE_FLUSH_BYTES`` is set between (its comment, and the module
    docstring's measurements): a per-message send of 64 KiB is quicker inline, a list of 100
    messages of 1 KiB leaves the loop free to serve the receiver while it is written."""
    log, c = on_disk(tmp_path, clock)
    await send(c, "one-of-64-kib", size=64 * 1024)
    # Distinct bodies: equal ones would be pickled once for the whole list.
    c.core.send([record(bytes([i]) * 1024, message_id=f"list-{i}") for i in range(100)])
    await c.durable()
    assert inline_pattern(log) == [True, False]
    assert len(stored(tmp_path, clock)) == 101


async def test_a_log_without_segments_is_written_in_a_worker_thread(
    tmp_path: Path, clock: FakeClock
) -> None:
    """One file per append is the object stores' layout: each write may take a network round
    trip, so none is written on the loop's thread."""
    log, c = on_disk(tmp_path, clock, {"segment_bytes": None})
    await send(c, "a")
    assert log.threads != [threading.get_ident()]
    assert c.inline_flushes == 0
    assert set(by_id(c.core)) == {"a"}


def inline_pattern(log: WatchedLog, since: int = 0) -> list[bool]:
    """For each append since the ``since``-th: whether it ran on this (the loop's) thread."""
    me = threading.get_ident()
    return [t == me for t in log.threads[since:]]


async def test_one_slow_write_among_quick_ones_keeps_the_writes_inline(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A virtual machine's disk has outliers: one write of twice the threshold (the old rule
    sent the next second's writes to the thread for it) is not a slow disk."""
    log, c = on_disk(tmp_path, clock)
    log.slow_s = 0.0003
    await send(c, "quick")
    log.slow_s = SLOW_INLINE_S * 2
    await send(c, "outlier")
    log.slow_s = 0.0003
    for i in range(5):
        await send(c, f"after-{i}")
    assert inline_pattern(log) == [True] * 7
    assert c.inline_flushes == 7


async def test_a_streak_of_slow_writes_sends_the_next_to_the_thread_until_they_are_quick(
    tmp_path: Path, clock: FakeClock
) -> None:
    log, c = on_disk(tmp_path, clock)
    log.slow_s = SLOW_INLINE_S * 2
    for i in range(12):
        await send(c, f"slow-{i}")
    slow = inline_pattern(log)
    # A few slow writes inline, then every one in the thread while the disk stays slow.
    first_threaded = slow.index(False)
    assert 3 <= first_threaded <= 10
    assert slow == [True] * first_threaded + [False] * (12 - first_threaded)
    # The disk is quick again: the thread's writes are timed too, so they come back inline.
    log.slow_s = 0.0003
    for i in range(40):
        await send(c, f"quick-{i}")
    quick = inline_pattern(log, since=12)
    back = quick.index(True)
    assert 1 <= back <= 30
    assert quick == [False] * back + [True] * (40 - back)
    assert stored(tmp_path, clock) == {f"slow-{i}" for i in range(12)} | {
        f"quick-{i}" for i in range(40)
    }


async def test_one_write_stalled_for_ten_times_the_threshold_sends_the_next_to_the_thread(
    tmp_path: Path, clock: FakeClock
) -> None:
    log, c = on_disk(tmp_path, clock)
    log.slow_s = 0.0003
    await send(c, "quick")
    log.slow_s = SLOW_INLINE_S / WRITE_TIME_WEIGHT * 1.1
    await send(c, "stalled")
    log.slow_s = 0.0003
    await send(c, "next")
    assert inline_pattern(log) == [True, True, False]


async def test_a_failed_write_that_stalled_counts_toward_a_slow_disk(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A write that hangs and then fails is timed too: a disk that stalls and errors is as
    slow for the loop as one that stalls and succeeds."""
    log, c = on_disk(tmp_path, clock)
    log.slow_s = SLOW_INLINE_S / WRITE_TIME_WEIGHT * 1.1
    log.fail_next = True
    with pytest.raises(StorageUnavailableError):
        await send(c, "refused")
    log.slow_s = 0.0003
    await send(c, "next")
    assert inline_pattern(log) == [True, False]
    assert stored(tmp_path, clock) == {"next"}


async def test_large_flushes_written_in_the_thread_do_not_count_as_a_slow_disk(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A large flush takes long because it is large: its time is not averaged with the small
    writes', which stay inline."""
    log, c = on_disk(tmp_path, clock, inline_bytes=4096)
    log.slow_s = SLOW_INLINE_S * 20
    for i in range(3):
        await send(c, f"large-{i}", size=8192)
    log.slow_s = 0.0003
    await send(c, "small")
    assert inline_pattern(log) == [False, False, False, True]


@pytest.mark.parametrize("size", [16, 64 * 1024], ids=["small", "64-kib"])
async def test_a_failed_inline_write_undoes_what_it_carried(
    tmp_path: Path, clock: FakeClock, size: int
) -> None:
    """Also for the largest message the default limit writes inline (one of 64 KiB)."""
    log, c = on_disk(tmp_path, clock)
    await send(c, "kept")
    log.fail_next = True
    with pytest.raises(StorageUnavailableError):
        await send(c, "refused", size=size)
    assert log.threads[-1] == threading.get_ident()  # it was an inline write that failed
    assert set(by_id(c.core)) == {"kept"}  # rebuilt from the log: nothing of it stored
    await send(c, "after", size=size)  # the log stays usable
    assert stored(tmp_path, clock) == {"kept", "after"}
    assert log.threads[-1] == threading.get_ident()


async def test_entries_that_cannot_be_encoded_fail_their_waiters_and_are_undone(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a storage error: the table of the flush cannot be built. Its waiters get an error
    (they would otherwise wait for ever) and memory returns to what the log holds."""
    _log, c = on_disk(tmp_path, clock)
    await send(c, "kept")
    to_table = committer_module.journal.to_table

    def broken(entries: Any) -> Any:
        monkeypatch.setattr(committer_module.journal, "to_table", to_table)  # once
        raise TypeError("injected: an entry that does not pickle")

    monkeypatch.setattr(committer_module.journal, "to_table", broken)
    with pytest.raises(ServiceBusError, match="injected: an entry that does not pickle"):
        await asyncio.wait_for(send(c, "refused"), 5)
    assert set(by_id(c.core)) == {"kept"}
    await send(c, "after")
    assert stored(tmp_path, clock) == {"kept", "after"}
