"""``ChangeLog``: the namespace's and coordinator's durable log of changes (no Ray).

Concurrent appends share one write (group commit); ``append_soon`` rides the next write without
waiting; a failed write fails exactly the changes it carried and logs nothing of them, not even
through a checkpoint."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from raybus._actors.changelog import ChangeLog
from raybus._storage import DurableLog
from raybus._storage.errors import StorageUnavailableError


def _open(tmp_path: Path, snapshot: Any = list, every: int = 1000) -> ChangeLog:
    return ChangeLog(str(tmp_path), "ns", "changes", snapshot, every=every)


def _records(tmp_path: Path) -> int:
    """Log records (writes) on disk since the last checkpoint."""
    log = DurableLog.from_storage_path(str(tmp_path), "ns", "changes")
    return len(log.recover().entries)


def test_concurrent_appends_share_one_write_and_replay_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        log = _open(tmp_path)
        await log.append(("first", 0))
        await asyncio.gather(*(log.append(("change", i)) for i in range(50)))

    asyncio.run(main())
    # The first append's write; the 50 concurrent ones went out in at most two more.
    assert _records(tmp_path) <= 3
    replayed = list(_open(tmp_path).replay())
    assert replayed == [("first", 0)] + [("change", i) for i in range(50)]


def test_append_soon_is_written_with_the_next_write_without_waiting(tmp_path: Path) -> None:
    async def main() -> None:
        log = _open(tmp_path)
        log.append_soon(("done", "t1"))  # returns at once
        await log.append(("commit", "t2"))  # the same write, or a later one

    asyncio.run(main())
    assert list(_open(tmp_path).replay()) == [("done", "t1"), ("commit", "t2")]


def _failing_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = DurableLog.append

    def append(self: DurableLog, data: Any) -> int:
        calls.append(data.num_rows)
        if len(calls) == 1:
            raise StorageUnavailableError("disk full (injected)", "ns", "disk")
        return real(self, data)

    monkeypatch.setattr(DurableLog, "append", append)
    return calls


def test_a_failed_write_fails_its_changes_only_and_logs_none_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _failing_once(monkeypatch)

    async def main() -> list[Any]:
        log = _open(tmp_path)
        first = await asyncio.gather(
            *(log.append(("lost", i)) for i in range(3)), return_exceptions=True
        )
        await log.append(("kept", 0))  # the storage answers again
        return first

    results = asyncio.run(main())
    assert calls[0] == 3  # the three shared the failed write
    assert all(isinstance(r, StorageUnavailableError) for r in results)
    assert list(_open(tmp_path).replay()) == [("kept", 0)]


def test_a_failed_append_soon_is_logged_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _failing_once(monkeypatch)

    async def main() -> None:
        log = _open(tmp_path)
        log.append_soon(("done", "t1"))
        await asyncio.sleep(0.2)  # its write fails in the background
        await log.append(("commit", "t2"))

    with caplog.at_level(logging.WARNING, logger="raybus.changelog"):
        asyncio.run(main())
    assert "was not logged" in caplog.text and "disk full" in caplog.text
    assert list(_open(tmp_path).replay()) == [("commit", "t2")]


def test_a_checkpoint_replaces_the_records_it_covers(tmp_path: Path) -> None:
    state: list[Any] = []

    async def main() -> None:
        log = _open(tmp_path, snapshot=lambda: list(state), every=5)
        for i in range(7):
            state.append(("change", i))
            await log.append(("change", i))

    asyncio.run(main())
    # The checkpoint after the 5th write holds changes 0-4; records 5 and 6 follow it.
    assert _records(tmp_path) == 2
    assert list(_open(tmp_path, every=5).replay()) == [("change", i) for i in range(7)]


@pytest.mark.parametrize("second_write", ["fails", "succeeds"])
def test_a_checkpoint_never_holds_a_queued_change_whose_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second_write: str
) -> None:
    """A checkpoint falls due after a write while the next change is already applied in the
    caller's state and queued. If that change's write then fails (and the caller undoes it),
    no checkpoint holds it: a restart replays only what was logged. If it succeeds, the
    checkpoint is taken with it, not put off."""
    state: list[Any] = []
    entered = threading.Event()
    gate = threading.Event()
    calls: list[int] = []
    real = DurableLog.append

    def append(self: DurableLog, data: Any) -> int:
        calls.append(data.num_rows)
        if len(calls) == 1:
            entered.set()
            assert gate.wait(5)  # "b" is applied and queued while "a" is written
        elif second_write == "fails":
            raise StorageUnavailableError("disk full (injected)", "ns", "disk")
        return real(self, data)

    monkeypatch.setattr(DurableLog, "append", append)

    async def main() -> None:
        log = _open(tmp_path, snapshot=lambda: list(state), every=1)
        state.append("a")  # as the actors do: apply, then log (the snapshot includes it)
        a = asyncio.ensure_future(log.append("a"))
        assert await asyncio.to_thread(entered.wait, 5)
        state.append("b")
        b = asyncio.ensure_future(log.append("b"))
        await asyncio.sleep(0)  # "b" is queued for the next write
        gate.set()
        await asyncio.wait_for(a, 5)
        try:
            await asyncio.wait_for(b, 5)
        except StorageUnavailableError:
            state.remove("b")  # the caller undoes its failed change
        while log._writer is not None and not log._writer.done():
            await asyncio.wait([log._writer])

    asyncio.run(main())
    monkeypatch.undo()
    assert list(_open(tmp_path).replay()) == state
    assert state == (["a"] if second_write == "fails" else ["a", "b"])
    stored = DurableLog.from_storage_path(str(tmp_path), "ns", "changes")
    found = stored.recover()
    if second_write == "succeeds":
        assert (stored.checkpoint_lsn, found.entries) == (2, [])
