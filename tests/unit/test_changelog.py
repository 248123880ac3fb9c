"""``ChangeLog`` (the namespace's and coordinator's durable log) when its checkpoint fails.

An append is durable before the checkpoint is tried, so a failed checkpoint must neither make
``append`` raise (the caller would undo in memory a change that a restart replays) nor lose or
reorder an entry: after a restart the log replays exactly the changes that were appended.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from raybus._actors.changelog import ChangeLog, LoggedOnce
from raybus._storage import StorageUnavailableError
from raybus._storage import fs as storage_fs


def open_log(path: Path, state: list[Any]) -> ChangeLog:
    """A ChangeLog checkpointing every 3 appends; its snapshot is ``state`` (the changes)."""
    return ChangeLog(str(path), "ns", "registry", lambda: list(state), every=3)


async def drain(log: ChangeLog) -> None:
    """Wait until the writer is idle: every queued change written and the checkpoint it made
    due done (the writer takes a checkpoint after answering the appends that made it due, and
    ``asyncio.run`` would cancel it on return). The actors never need this: they run until
    killed, with no graceful shutdown to drain before, and a checkpoint cut short only makes
    replay longer."""
    while log._writer is not None and not log._writer.done():
        await asyncio.wait([log._writer])


def append_all(log: ChangeLog, state: list[Any], changes: list[Any]) -> None:
    async def run() -> None:
        for change in changes:
            state.append(change)  # as the actors do: apply, then log (the snapshot includes it)
            await log.append(change)  # raises if the append is reported failed
        await drain(log)

    asyncio.run(run())


def checkpoints(path: Path) -> list[str]:
    return sorted(p.name for p in path.rglob("checkpoint/*.arrow"))


@pytest.mark.parametrize("failure", ["write", "snapshot"])
def test_a_failed_checkpoint_keeps_every_append_durable_and_replayable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    state: list[Any] = []
    log = open_log(tmp_path, state)
    assert list(log.replay()) == []
    append_all(log, state, [("put", "a", 1), ("put", "b", 2)])
    assert checkpoints(tmp_path) == []

    calls: list[str] = []

    def failing_write(*args: Any, **kwargs: Any) -> None:
        calls.append("write")
        raise OSError(28, "No space left on device")

    if failure == "write":  # the checkpoint's file write raises a raw OSError
        monkeypatch.setattr(storage_fs, "write_durable", failing_write)
    else:  # the state to checkpoint cannot be taken at all

        def broken_snapshot() -> list[Any]:
            calls.append("snapshot")
            raise RuntimeError("cannot take the state")

        log._snapshot = broken_snapshot
    changes = [("put", "c", 3), ("del", "a", None), ("put", "d", 4), ("put", "e", 5)]
    append_all(log, state, changes)  # every 3rd append tries a checkpoint, which fails
    assert calls  # the failure was really hit (and did not fail the append)
    assert checkpoints(tmp_path) == []

    # A restart replays every entry, in order, from the log alone.
    assert list(open_log(tmp_path, []).replay()) == state

    # Once the fault clears, the next append checkpoints and the log still replays the same.
    monkeypatch.undo()
    log._snapshot = lambda: list(state)
    append_all(log, state, [("put", "f", 6)])
    assert len(checkpoints(tmp_path)) == 1
    restarted_state: list[Any] = []
    restarted = open_log(tmp_path, restarted_state)
    assert list(restarted.replay()) == state
    restarted_state.extend(state)
    append_all(restarted, restarted_state, [("put", "g", 7)])
    assert list(open_log(tmp_path, []).replay()) == [*state, ("put", "g", 7)]


def test_a_log_of_big_changes_checkpoints_by_bytes_and_drops_what_the_checkpoint_covers(
    tmp_path: Path,
) -> None:
    """The router's log carries messages: it checkpoints after ``every_bytes`` written, long
    before ``every`` appends, and the files the checkpoint covers go."""
    state: list[Any] = []
    log = ChangeLog(
        str(tmp_path), "ns", "router", lambda: state[-1:], every=1000, every_bytes=50_000
    )
    big = [("pub", i, b"x" * 20_000) for i in range(5)]
    append_all(log, state, big)
    assert len(checkpoints(tmp_path)) == 1  # after the third append (60 KB)
    logged = [p for p in tmp_path.rglob("*.arrow") if "checkpoint" not in p.parts]
    assert sum(p.stat().st_size for p in logged) < 50_000  # the first three appends are gone
    again = ChangeLog(str(tmp_path), "ns", "router", lambda: [], every=1000)
    assert list(again.replay()) == [big[2], big[3], big[4]]


def test_append_queues_its_change_in_the_callers_step(tmp_path: Path) -> None:
    """``append`` queues the change when called, not when its result is first awaited: a
    caller that applies a change and then awaits ``gather`` of appends (the router's log
    does) must not leave a moment in which a checkpoint captures the applied change while it
    is not yet queued for the write the checkpoint waits for."""
    state: list[Any] = []
    log = open_log(tmp_path, state)
    assert list(log.replay()) == []

    async def run() -> None:
        state.append("a")
        written = asyncio.gather(log.append("a"), log.append("b"))
        assert log._pending == ["a", "b"]  # both queued before anything is awaited
        state.append("b")
        await written
        await drain(log)

    asyncio.run(run())
    assert list(open_log(tmp_path, []).replay()) == ["a", "b"]


def test_a_change_logged_once_is_written_once_and_begun_again_after_a_failed_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The namespace's birth: the first call not waiting for it (a ping) begins the write; a
    failed one is begun again by the next call; callers waiting meanwhile share one write."""
    writes: list[str] = []

    async def run() -> None:
        log = open_log(tmp_path, [])
        assert list(log.replay()) == []
        durable_append = log._log.append
        failures = [2]

        def flaky(data: Any) -> int:
            if failures[0]:
                failures[0] -= 1
                writes.append("failed")
                raise StorageUnavailableError("the disk is away")
            writes.append("written")
            return durable_append(data)

        log._log.append = flaky  # type: ignore[method-assign]
        birth = LoggedOnce(log, ("born", 1.5))
        first = birth.start()
        assert first is not None and birth.start() is first  # under way: not begun twice
        await asyncio.wait([first])
        assert writes == ["failed"] and "not logged" in caplog.text
        with pytest.raises(StorageUnavailableError):
            await birth.written()  # begun again, and failed again
        await asyncio.gather(birth.written(), birth.written())
        await birth.written()
        birth.start()
        await drain(log)
        assert writes == ["failed", "failed", "written"]

        assert LoggedOnce(None, ("born", 2.0)).start() is None
        await LoggedOnce(None, ("born", 2.0)).written()

    asyncio.run(run())
    assert list(open_log(tmp_path, []).replay()) == [("born", 1.5)]
