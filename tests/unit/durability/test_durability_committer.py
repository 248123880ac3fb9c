"""Group commit of a partition to its ``DurableLog``: acknowledged means durable, a failed flush
undoes everything it carried, new messages stay invisible until durable, checkpoints bound the
log, and a restarted Committer recovers exactly what was acknowledged.

Runs on a real directory (``tmp_path``, fsync included) and on a fault-injecting in-memory
filesystem. A "restart" is a new Committer on the same storage; the old one is dropped.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from durability_helpers import (
    EVERYTHING,
    FaultyHandler,
    GatedLog,
    by_id,
    committer_on,
    core_factory,
    counts_of,
    faulty_fs,
    record,
    records,
    view,
)
from segment_files import records_end

from raybus._core import transactions
from raybus._core.committer import Committer
from raybus._core.partition import (
    ABANDON,
    COMPLETE,
    DEAD_LETTER,
    DEFER,
    RELEASE,
    SettleOp,
)
from raybus._core.record import ACTIVE, DEFERRED
from raybus._models import QueueProperties
from raybus._storage import DurableLog, StorageUnavailableError
from raybus.exceptions import MessageLockLostError, ServiceBusError
from raybus.testing import FakeClock

DIR = "bucket/ns/orders/0"


def local(tmp_path: Path, clock: FakeClock, checkpoint_min: int = 1000, **options: Any):
    """A Committer over ``tmp_path/p0`` (the real disk); call again to "restart"."""
    return Committer(
        core_factory(clock, **options),
        DurableLog.from_storage_path(str(tmp_path), "p0"),
        checkpoint_min=checkpoint_min,
    )


@pytest.fixture
def faulty() -> tuple[pafs.FileSystem, FaultyHandler]:
    return faulty_fs()


def ids(c: Committer) -> set[str]:
    return set(by_id(c.core))


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until ``check()`` holds: a checkpoint runs in the background after the flush that
    made it due has answered its waiters."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.005)


async def settle_all(c: Committer, ops: list[SettleOp]) -> None:
    assert c.core.settle(ops) == [None] * len(ops)
    await c.durable()


async def holding_a(fs: pafs.FileSystem, clock: FakeClock) -> tuple[Committer, list[BaseException]]:
    """A committer on ``fs`` holding message "a", durably, and the list ``on_fatal`` fills."""
    fatal: list[BaseException] = []
    c = committer_on(fs, DIR, clock)
    c._on_fatal = fatal.append
    c.core.send(records("a"))
    await c.durable()
    return c, fatal


# ---------------------------------------------------------------- round trips


async def test_acknowledged_state_survives_a_restart(tmp_path, clock):
    opts = {"max_delivery_count": 5, "requires_duplicate_detection": True}
    c = local(tmp_path, clock, **opts)
    seqs = c.core.send(records(*"abcdefg", application_properties={"n": 1}))
    await c.durable()
    got = {r.message_id: r for r in c.core.receive(EVERYTHING)}
    await settle_all(
        c,
        [
            SettleOp(COMPLETE, got["a"].lock_token),
            SettleOp(ABANDON, got["b"].lock_token, {"tries": 1}),
            SettleOp(DEAD_LETTER, got["c"].lock_token, {"bad": True}, "Invalid", "no price"),
            SettleOp(DEFER, got["d"].lock_token),
            SettleOp(RELEASE, got["f"].lock_token),
            SettleOp(RELEASE, got["g"].lock_token),
        ],
    )
    # "e" stays locked; the next flush carries a new message and new properties.
    new_props = QueueProperties(name="orders", **opts, user_metadata="v2")
    c.core.update_properties(new_props)
    c.core.send(records("h"))
    await c.durable()
    before, counts = view(c.core), counts_of(c.core)

    again = local(tmp_path, clock, **opts)
    assert view(again.core) == before
    assert counts_of(again.core) == counts
    assert again.core.properties == new_props
    held = by_id(again.core)
    assert "a" not in held
    assert (held["b"].delivery_count, held["b"].application_properties) == (1, {"n": 1, "tries": 1})
    assert held["d"].state == DEFERRED
    [dead] = again.core.peek(0, EVERYTHING, dead_letter=True)
    assert (dead.message_id, dead.sequence_number, dead.dead_letter_reason) == (
        "c",
        seqs[2],
        "Invalid",
    )
    assert dead.dead_letter_error_description == "no price"
    # The message locked at the restart is available again, its delivery count not charged.
    assert {r.message_id: r.delivery_count for r in again.core.receive(EVERYTHING)} == {
        "b": 1,
        "e": 0,
        "f": 0,
        "g": 0,
        "h": 0,
    }
    assert again.core.send(records("i")) == [seqs[-1] + 2]  # "h" took seqs[-1] + 1
    assert again.core.send(records("a")) == [seqs[0]]  # its id is still remembered


async def test_a_restart_recovers_only_what_was_flushed(tmp_path, clock):
    c = local(tmp_path, clock)
    c.core.send(records("kept"))
    await c.durable()
    [rec] = c.core.receive(1)
    c.core.settle([SettleOp(COMPLETE, rec.lock_token)])
    c.core.send(records("never-flushed"))
    # crash: no durable() for these two
    again = local(tmp_path, clock)
    assert ids(again) == {"kept"}
    assert [r.delivery_count for r in again.core.receive(1)] == [0]


async def test_sequence_numbers_continue_after_everything_was_completed(tmp_path, clock):
    c = local(tmp_path, clock)
    seqs = c.core.send(records(*"abc"))
    await c.durable()
    await settle_all(c, [SettleOp(COMPLETE, r.lock_token) for r in c.core.receive(3)])
    assert c.core.message_count() == 0

    again = local(tmp_path, clock)
    assert again.core.send(records("d")) == [seqs[-1] + 1]
    await again.durable()
    await again.checkpoint_now()  # the same through a checkpoint of an empty queue
    await settle_all(again, [SettleOp(COMPLETE, r.lock_token) for r in again.core.receive(1)])
    await again.checkpoint_now()
    assert local(tmp_path, clock).core.send(records("e")) == [seqs[-1] + 2]


async def test_duplicate_detection_ids_survive_a_restart_within_their_window(tmp_path, clock):
    opts = {"requires_duplicate_detection": True, "duplicate_detection_history_time_window": 60}
    c = local(tmp_path, clock, **opts)
    [seq] = c.core.send(records("x"))
    await c.durable()
    await settle_all(c, [SettleOp(COMPLETE, r.lock_token) for r in c.core.receive(1)])

    again = local(tmp_path, clock, **opts)
    assert again.core.send(records("x")) == [seq]  # dropped as a duplicate
    assert again.core.message_count() == 0
    await again.checkpoint_now()

    clock.advance(30)
    third = local(tmp_path, clock, **opts)  # from the checkpoint this time
    assert third.core.send(records("x")) == [seq]
    clock.advance(31)  # the window has passed: accepted again
    assert third.core.send(records("x")) == [seq + 1]


@pytest.mark.parametrize("through_checkpoint", [False, True])
async def test_updated_queue_properties_survive_a_restart(tmp_path, clock, through_checkpoint):
    c = local(tmp_path, clock)
    new = QueueProperties(
        name="orders",
        lock_duration=timedelta(seconds=45),
        max_delivery_count=2,
        user_metadata="v2",
    )
    c.core.update_properties(new)
    await c.durable()
    if through_checkpoint:
        await c.checkpoint_now()
    again = local(tmp_path, clock)  # built with the original properties, as a restarted actor
    assert again.core.properties == new
    again.core.send(records("a"))
    await again.durable()
    [rec] = again.core.receive(1)
    assert rec.locked_until == clock.now() + 45


# ---------------------------------------------------------------- visibility and group commit


async def test_new_messages_are_invisible_until_durable(tmp_path, clock):
    woken: list[int] = []
    c = Committer(
        core_factory(clock),
        DurableLog.from_storage_path(str(tmp_path), "p0"),
        on_visible=lambda: woken.append(c.core.visible_seq or 0),
    )
    [seq] = c.core.send(records("a"))
    assert c.core.receive(1) == []
    assert c.core.peek(0, 10) == []
    assert not c.core.has_available()
    assert woken == []
    await c.durable()
    assert woken == [seq]
    assert c.core.has_available()
    assert [r.message_id for r in c.core.peek(0, 10)] == ["a"]
    assert [r.message_id for r in c.core.receive(1)] == ["a"]


async def test_every_flush_tells_on_visible_even_one_that_logged_no_new_number(tmp_path, clock):
    """A flush of settlements alone numbers no message, but what its calls changed on the way
    (a lock that expired and requeued its message, a message that expired into the
    dead-letter sub-queue) is announced nowhere else: ``on_visible`` is told at every flush."""
    told: list[int] = []
    c = Committer(
        core_factory(clock),
        DurableLog.from_storage_path(str(tmp_path), "p0"),
        on_visible=lambda: told.append(c.flushes),
    )
    c.core.send(records("a", "b"))
    await c.durable()
    assert told == [1]
    locked = c.core.receive(2)
    await settle_all(c, [SettleOp(COMPLETE, locked[0].lock_token)])
    c.core.settle([SettleOp(DEFER, locked[1].lock_token)])
    await c.durable()
    assert c.flushes == 3 and told == [1, 2, 3]


async def flush_held(
    fs: pafs.FileSystem, clock: FakeClock, message_id: str
) -> tuple[Committer, GatedLog, asyncio.Future[None]]:
    """A committer whose flush of a send of ``message_id`` is being written, held there until
    ``log.release()``: the committer, its log, and the send's ``durable()``."""
    c = committer_on(fs, DIR, clock, log_class=GatedLog)
    log = c.durable_log
    assert isinstance(log, GatedLog)
    log.hold()
    c.core.send(records(message_id))
    waiting = asyncio.ensure_future(c.durable())
    await asyncio.to_thread(log.entered.wait, 5)
    return c, log, waiting


async def test_messages_sent_during_a_flush_wait_for_the_next_one(faulty, clock):
    fs, _ = faulty
    c, log, first = await flush_held(fs, clock, "first")
    c.core.send(records("second"))  # recorded while "first" is being written
    second = asyncio.ensure_future(c.durable())
    await asyncio.sleep(0.01)
    assert not second.done()
    log.release()
    log.hold()  # the flush carrying "second" waits until checked
    await asyncio.wait_for(first, 5)
    assert [r.message_id for r in c.core.peek(0, 10)] == ["first"]  # "second" is not durable
    assert not second.done()
    log.release()
    await asyncio.wait_for(second, 5)
    assert [r.message_id for r in c.core.peek(0, 10)] == ["first", "second"]
    assert c.flushes == 2


async def test_a_flush_wakes_its_callers_before_the_receivers_it_makes_messages_visible_to(
    tmp_path, clock
):
    """The sender of a message is answered first; the receivers the flush woke (``on_visible``)
    build their answers after (they had gone first, and the send's answer waited for them)."""
    resumed: list[str] = []
    visible = asyncio.Event()
    c = Committer(
        core_factory(clock),
        DurableLog.from_storage_path(str(tmp_path), "p0"),
        on_visible=visible.set,
    )

    async def receiver() -> None:
        await visible.wait()
        resumed.append("receiver")

    async def sender() -> None:
        c.core.send(records("m"))
        await c.durable()
        resumed.append("sender")

    await asyncio.wait_for(asyncio.gather(receiver(), sender()), 5)
    assert resumed == ["sender", "receiver"]


async def test_a_caller_that_stops_waiting_leaves_the_others_waiting_for_the_flush(faulty, clock):
    """A caller cancelled (its client timed out) cancels nothing of the flush it waited for:
    the others sharing it are answered, and its changes are written all the same."""
    fs, _ = faulty
    c, log, gone = await flush_held(fs, clock, "a")
    c.core.send(records("b"))
    c.core.send(records("c"))
    stays, leaves = asyncio.ensure_future(c.durable()), asyncio.ensure_future(c.durable())
    await asyncio.sleep(0.01)
    gone.cancel()
    leaves.cancel()
    log.release()
    await asyncio.wait_for(stays, 5)
    assert gone.cancelled() and leaves.cancelled()
    assert ids(committer_on(fs, DIR, clock)) == {"a", "b", "c"}


async def test_concurrent_operations_share_flushes(faulty, clock):
    fs, _ = faulty
    c = committer_on(fs, DIR, clock)
    count = 300

    async def send(i: int) -> int:
        [seq] = c.core.send(records(f"m{i}"))
        await c.durable()
        return seq

    seqs = await asyncio.gather(*(send(i) for i in range(count)))
    assert sorted(seqs) == list(range(1, count + 1))
    assert 1 <= c.flushes <= count // 20
    assert c.flushed_entries == count

    async def complete(rec: Any) -> None:
        await asyncio.sleep(0)  # arrive spread over a few loop turns
        assert c.core.settle([SettleOp(COMPLETE, rec.lock_token)]) == [None]
        await c.durable()

    flushes = c.flushes
    await asyncio.gather(*(complete(r) for r in c.core.receive(count)))
    assert c.flushes - flushes <= count // 20
    assert ids(committer_on(fs, DIR, clock)) == set()


async def test_waves_of_operations_during_flushes_share_them(faulty, clock):
    """Operations keep arriving while flushes are under way: each flush carries all of them."""
    fs, _ = faulty
    c = committer_on(fs, DIR, clock)
    acked: list[int] = []

    async def send(i: int) -> None:
        for _ in range(i % 5):
            await asyncio.sleep(0)
        [seq] = c.core.send(records(f"m{i}"))
        await c.durable()
        acked.append(seq)

    await asyncio.gather(*(send(i) for i in range(500)))
    assert len(acked) == 500
    assert c.flushes * 10 <= 500
    assert len(ids(committer_on(fs, DIR, clock))) == 500


async def test_memory_only_committer_pays_nothing(clock):
    c = Committer(core_factory(clock), None)
    assert c.durable_log is None
    c.core.send(records("a"))
    await c.durable()
    assert c.flushes == 0
    assert c.core.visible_seq is None
    assert [r.message_id for r in c.core.receive(1)] == ["a"]
    await c.checkpoint_now()


# ---------------------------------------------------------------- failed flushes


async def test_failed_send_stores_nothing_and_the_queue_goes_on(faulty, clock):
    fs, handler = faulty
    c = committer_on(fs, DIR, clock)
    [a, b] = c.core.send(records("a", "b"))
    await c.durable()
    lsn = c.durable_log.next_lsn
    before = view(c.core)

    handler.write_errno = errno.ENOSPC
    c.core.send(records("c", "d"))
    with pytest.raises(StorageUnavailableError) as info:
        await c.durable()
    assert info.value.errno == errno.ENOSPC
    assert info.value.retryable is True
    assert view(c.core) == before  # memory is back to the durable state
    assert counts_of(c.core)[:3] == (2, 0, 0)
    assert c.durable_log.next_lsn == lsn  # no LSN consumed
    assert ids(committer_on(fs, DIR, clock)) == {"a", "b"}  # nothing half-stored

    handler.write_errno = None  # space again
    [e] = c.core.send(records("e"))
    await c.durable()
    assert e > b
    assert c.durable_log.next_lsn == lsn + 1
    assert [r.message_id for r in c.core.receive(EVERYTHING)] == ["a", "b", "e"]
    assert ids(committer_on(fs, DIR, clock)) == {"a", "b", "e"}
    assert a < b


async def test_failed_settlement_leaves_the_message_where_it_was(faulty, clock):
    fs, handler = faulty
    c = committer_on(fs, DIR, clock, max_delivery_count=2)
    c.core.send(records(*"abcd"))
    await c.durable()
    got = {r.message_id: r for r in c.core.receive(EVERYTHING)}
    await settle_all(c, [SettleOp(ABANDON, got["d"].lock_token)])  # d: delivery count 1
    before = view(c.core)
    got.update({r.message_id: r for r in c.core.receive(EVERYTHING)})

    handler.write_errno = errno.ENOSPC
    results = c.core.settle(
        [
            SettleOp(COMPLETE, got["a"].lock_token),
            SettleOp(DEFER, got["b"].lock_token),
            SettleOp(DEAD_LETTER, got["c"].lock_token, None, "r", "d"),
            SettleOp(ABANDON, got["d"].lock_token),  # would dead-letter it (max 2)
        ]
    )
    assert results == [None] * 4
    with pytest.raises(StorageUnavailableError):
        await c.durable()
    assert view(c.core) == before
    assert all(r.state == ACTIVE for r in c.core.peek(0, EVERYTHING))
    assert c.core.peek(0, EVERYTHING, dead_letter=True) == []
    # The locks were lost with the rebuild: the old tokens no longer settle...
    [lost] = c.core.settle([SettleOp(COMPLETE, got["a"].lock_token)])
    assert isinstance(lost, MessageLockLostError)
    # ...and every message is available again, its delivery count as it was durably.
    handler.write_errno = None
    again = {r.message_id: r.delivery_count for r in c.core.receive(EVERYTHING)}
    assert again == {"a": 0, "b": 0, "c": 0, "d": 1}
    assert view(committer_on(fs, DIR, clock, max_delivery_count=2).core) == before


async def test_every_operation_waiting_on_a_failed_flush_gets_the_error(faulty, clock):
    fs, handler = faulty
    c = committer_on(fs, DIR, clock, log_class=GatedLog)
    c.core.send(records("durable"))
    await c.durable()
    log = c.durable_log
    assert isinstance(log, GatedLog)

    log.hold()
    c.core.send(records("w0"))
    waiters = [asyncio.ensure_future(c.durable())]
    await asyncio.to_thread(log.entered.wait, 5)
    for i in range(1, 5):  # recorded while the doomed flush is under way
        c.core.send(records(f"w{i}"))
        waiters.append(asyncio.ensure_future(c.durable()))
    handler.write_errno = errno.ENOSPC
    log.release()
    results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 5)
    assert all(isinstance(r, StorageUnavailableError) for r in results), results
    assert ids(c) == {"durable"}
    assert c.flushes == 1

    handler.write_errno = None
    c.core.send(records("after"))
    await c.durable()
    assert ids(committer_on(fs, DIR, clock)) == {"durable", "after"}


async def test_failed_fsync_on_local_disk_fails_the_send(tmp_path, clock, monkeypatch):
    c = local(tmp_path, clock)
    c.core.send(records("a"))
    await c.durable()

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    monkeypatch.setattr(os, "fdatasync", no_space, raising=False)  # a segment's sync
    c.core.send(records("b"))
    with pytest.raises(StorageUnavailableError) as info:
        await c.durable()
    assert info.value.errno == errno.ENOSPC
    assert ids(c) == {"a"}
    monkeypatch.undo()

    c.core.send(records("c"))
    await c.durable()
    assert ids(local(tmp_path, clock)) == {"a", "c"}


async def test_failed_checkpoint_loses_nothing(faulty, clock, monkeypatch):
    fs, _ = faulty
    c = committer_on(fs, DIR, clock, checkpoint_min=5)
    log = c.durable_log
    calls: list[int] = []

    def refuse(table: Any, upto_lsn: int) -> None:
        calls.append(upto_lsn)
        raise StorageUnavailableError("injected", "checkpoint", errno.EIO)

    monkeypatch.setattr(log, "checkpoint", refuse)
    c.core.send(records(*(f"m{i}" for i in range(10))))
    await c.durable()
    received = c.core.receive(7)
    for rec in received[:6]:  # each completion adds an entry; a checkpoint becomes due
        await settle_all(c, [SettleOp(COMPLETE, rec.lock_token)])
    # The first try may still be under way in its thread while those flushes ran (a flush
    # starts a checkpoint only when none is being written): once it has failed, one more
    # flush tries again.
    await eventually(lambda: len(calls) >= 1 and c._checkpointing is None)
    completed = 6
    if len(calls) < 2:
        await settle_all(c, [SettleOp(COMPLETE, received[6].lock_token)])
        completed = 7
    await eventually(lambda: len(calls) >= 2 and c._checkpointing is None)
    assert log.checkpoint_lsn is None
    assert ids(committer_on(fs, DIR, clock)) == {f"m{i}" for i in range(completed, 10)}


async def test_a_checkpoint_write_failing_with_a_bug_stops_no_flush(
    tmp_path, clock, monkeypatch, caplog
):
    """Writing the checkpoint raises something that is not a storage error (a bug in the
    writer). It is logged with its traceback, the flushes after it go on being answered, the
    next flush tries the checkpoint again, and once the writer works the checkpoint is taken
    and recovery reads the same state."""
    c = local(tmp_path, clock, checkpoint_min=5)
    log = c.durable_log
    real = log.checkpoint
    calls: list[int] = []

    def buggy(table: Any, upto_lsn: int) -> None:
        calls.append(upto_lsn)
        raise TypeError("injected: a bug in the checkpoint writer")

    monkeypatch.setattr(log, "checkpoint", buggy)
    c.core.send(records(*(f"m{i}" for i in range(10))))
    await c.durable()
    for rec in c.core.receive(6):  # each completion adds an entry; a checkpoint becomes due
        await asyncio.wait_for(settle_all(c, [SettleOp(COMPLETE, rec.lock_token)]), 5)
    # The first try may still be encoding in its thread while those flushes ran (a flush
    # starts a checkpoint only when none is being written): once it has failed, the next
    # flush tries again.
    await eventually(lambda: len(calls) >= 1 and c._checkpointing is None)
    if len(calls) < 2:
        [rec] = c.core.receive(1)
        await asyncio.wait_for(settle_all(c, [SettleOp(COMPLETE, rec.lock_token)]), 5)
    await eventually(lambda: len(calls) >= 2 and c._checkpointing is None)
    assert log.checkpoint_lsn is None
    assert any(  # reported by the committer, not left to the task's garbage collection
        r.name == "raybus.commit"
        and r.getMessage().startswith("checkpoint of")
        and r.exc_info
        and "a bug in the checkpoint writer" in str(r.exc_info[1])
        for r in caplog.records
    )
    monkeypatch.setattr(log, "checkpoint", real)
    for rec in c.core.receive(4):
        await settle_all(c, [SettleOp(COMPLETE, rec.lock_token)])
    await eventually(lambda: log.checkpoint_lsn is not None and c._checkpointing is None)
    assert ids(local(tmp_path, clock)) == set()


async def test_a_checkpoint_that_cannot_be_captured_stops_no_flush(tmp_path, clock, monkeypatch):
    """Capturing the state for a checkpoint fails (a bug: the state does not encode). The
    flush that made it due has answered its waiters, its task ends without an error, later
    flushes go on, and the next capture waits for another threshold of entries instead of
    costing a pass over every message at each flush."""
    c = local(tmp_path, clock, checkpoint_min=5)
    attempts: list[int] = []  # completions settled when a capture was tried
    settled: list[str] = []

    def broken() -> Any:
        attempts.append(len(settled))
        raise TypeError("injected: a state that does not encode")

    monkeypatch.setattr(c.core, "snapshot_entries", broken)
    c.core.send(records(*(f"m{i}" for i in range(10))))
    await c.durable()
    for rec in c.core.receive(10):
        c.core.settle([SettleOp(COMPLETE, rec.lock_token)])
        settled.append(rec.lock_token)
        flush = asyncio.ensure_future(c.durable())
        await asyncio.sleep(0)
        task = c._task  # the flush loop this completion started
        assert task is not None
        await asyncio.wait_for(flush, 5)  # answered, capture failure or not
        await asyncio.wait([task], timeout=5)
        assert task.done() and task.exception() is None
    # Due at the 4th completion (14 entries >= 2 x 6 messages left); after the failure the
    # next capture waits for another 5 entries (the 9th), not for the next flush.
    assert attempts == [4, 9]
    assert c.durable_log.checkpoint_lsn is None
    monkeypatch.undo()
    assert ids(local(tmp_path, clock)) == set()  # every completion was logged


async def test_checkpoint_now_raises_a_capture_failure_and_the_log_stays_whole(
    tmp_path, clock, monkeypatch
):
    c = local(tmp_path, clock)
    c.core.send(records("a", "b"))
    await c.durable()

    def broken() -> Any:
        raise TypeError("injected: a state that does not encode")

    monkeypatch.setattr(c.core, "snapshot_entries", broken)
    with pytest.raises(ServiceBusError, match=r"checkpoint not captured.*does not encode"):
        await c.checkpoint_now()
    assert c.durable_log.checkpoint_lsn is None
    c.core.send(records("c"))  # the committer still takes changes
    await c.durable()
    monkeypatch.undo()
    assert ids(local(tmp_path, clock)) == {"a", "b", "c"}


async def test_storage_unreachable_during_a_failed_flush_never_keeps_the_failed_send(faulty, clock):
    """If the storage cannot even be read back when a flush fails, the failed send must never
    become visible or count as stored. The committer then serves nothing, refuses changes and
    reports itself fatal (the actor exits; Ray restarts it and it recovers from the log)."""
    fs, handler = faulty
    c, fatal = await holding_a(fs, clock)

    handler.unreachable = True
    c.core.send(records("lost"))
    with pytest.raises(StorageUnavailableError):
        await asyncio.wait_for(c.durable(), 5)
    await asyncio.sleep(0.05)  # let the flush task finish whatever it does after failing
    assert fatal and isinstance(fatal[0], StorageUnavailableError)
    assert c.core.receive(EVERYTHING) == [], "a broken committer must show nothing"

    handler.unreachable = False
    c.core.send(records("b"))
    with pytest.raises(StorageUnavailableError):  # still broken until restarted
        await asyncio.wait_for(c.durable(), 5)
    restarted = committer_on(fs, DIR, clock)
    assert ids(restarted) == {"a"}
    restarted.core.send(records("b"))
    await asyncio.wait_for(restarted.durable(), 5)
    assert ids(committer_on(fs, DIR, clock)) == {"a", "b"}


@pytest.mark.parametrize("where", ["replay", "make_core"])
async def test_a_bug_while_rebuilding_after_a_failed_flush_breaks_the_committer(
    faulty, clock, caplog, monkeypatch, where
):
    """Rebuilding the core after a failed flush raises something that is not a storage error
    (a bug in replay, MemoryError). The old core holds the changes the failed flush carried,
    so it must not stay in service: the error is logged with its traceback, the committer
    serves nothing and refuses changes, and it reports itself fatal (the actor restarts).
    With ``make_core`` itself failing not even an empty core can be built: the old one's
    messages are hidden instead."""
    fs, handler = faulty
    c, fatal = await holding_a(fs, clock)

    def buggy(*args: Any) -> Any:
        raise RuntimeError("injected: a bug in replay")

    handler.write_errno = errno.EIO
    c.core.send(records("failed"))
    monkeypatch.setattr(c, "_replay_into" if where == "replay" else "_make_core", buggy)
    with pytest.raises(StorageUnavailableError):
        await asyncio.wait_for(c.durable(), 5)  # the sender is told: not stored
    await asyncio.sleep(0.05)  # let the flush task finish whatever it does after failing
    monkeypatch.undo()
    handler.write_errno = None
    assert isinstance(c.broken, ServiceBusError)
    assert fatal == [c.broken]
    assert any(  # reported by the committer, not left to the task's garbage collection
        r.name == "raybus.commit" and r.exc_info and "a bug in replay" in str(r.exc_info[1])
        for r in caplog.records
    )
    assert c.core.receive(EVERYTHING) == [], "a broken committer must show nothing"
    c.core.send(records("later"))
    with pytest.raises(ServiceBusError):  # still broken until restarted
        await asyncio.wait_for(c.durable(), 5)
    assert ids(committer_on(fs, DIR, clock)) == {"a"}


class _AnswerLost:
    """An object store upload that completes, but whose answer is lost: close() raises."""

    def __init__(self, inner: pa.NativeFile) -> None:
        self._inner = inner
        self.closed = False

    def write(self, data: Any) -> int:
        return self._inner.write(data)

    def flush(self) -> None:
        self._inner.flush()

    def close(self) -> None:
        self.closed = True
        self._inner.close()  # the object is stored...
        raise OSError(errno.ETIMEDOUT, "injected: response lost")  # ...yet we hear an error


class AnswerLostHandler(FaultyHandler):
    """``FaultyHandler`` whose writes complete but report an error while ``answer_lost``, and
    which refuses the next ``refused_deletes`` deletions."""

    answer_lost = False
    refused_deletes = 0

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        out = super().open_output_stream(path, metadata)
        return pa.PythonFile(_AnswerLost(out), mode="w") if self.answer_lost else out

    def delete_file(self, path: str) -> None:
        if self.refused_deletes > 0:
            self.refused_deletes -= 1
            raise OSError(errno.EIO, "injected fault", path)
        super().delete_file(path)


@pytest.mark.parametrize("removable", [True, False], ids=["removed", "stuck"])
async def test_a_failed_send_stored_whole_is_not_read_back_by_the_rebuild(clock, removable):
    """The write of a flush stores the whole object but reports an error, and its clean-up
    delete is refused: the sender is told "not stored", so the rebuild after the failed flush
    must not read the complete object back. It removes it first; if the storage still
    refuses, the committer serves nothing and reports itself fatal (a restart may bring the
    entry back: a failed write's outcome is "maybe", as ``DurableLog`` documents)."""
    handler = AnswerLostHandler()
    fs = pafs.PyFileSystem(handler)
    c, fatal = await holding_a(fs, clock)

    handler.answer_lost = True
    # The write's own clean-up is refused; so is the rebuild's, unless removable.
    handler.refused_deletes = 1 if removable else 10**6
    c.core.send(records("ghost"))
    with pytest.raises(StorageUnavailableError):
        await asyncio.wait_for(c.durable(), 5)
    await asyncio.sleep(0.05)  # let the flush task finish whatever it does after failing
    handler.answer_lost = False
    handler.refused_deletes = 0
    got = [r.message_id for r in c.core.receive(EVERYTHING)]
    assert "ghost" not in got, "a send reported as failed is delivered"
    if removable:
        assert (got, c.broken, fatal) == (["a"], None, [])
        c.core.send(records("b"))
        await asyncio.wait_for(c.durable(), 5)  # the failed send's LSN, written afresh
        assert ids(committer_on(fs, DIR, clock)) == {"a", "b"}
    else:
        assert isinstance(c.broken, StorageUnavailableError) and fatal == [c.broken]
        assert got == []


async def test_duplicate_send_is_not_acknowledged_before_the_original_is_durable(faulty, clock):
    """A duplicate is answered "accepted" with the first copy's sequence number, so it must not
    be answered before that copy is durable: if the copy's flush fails, so must the duplicate."""
    fs, handler = faulty
    opts = {"requires_duplicate_detection": True}
    c = committer_on(fs, DIR, clock, log_class=GatedLog, **opts)
    log = c.durable_log
    assert isinstance(log, GatedLog)

    log.hold()
    [seq] = c.core.send(records("x"))
    original = asyncio.ensure_future(c.durable())
    await asyncio.to_thread(log.entered.wait, 5)
    assert c.core.send(records("x")) == [seq]  # the duplicate, while "x" is being written
    duplicate = asyncio.ensure_future(c.durable())
    await asyncio.sleep(0.01)
    handler.write_errno = errno.EIO
    log.release()
    results = await asyncio.wait_for(asyncio.gather(original, duplicate, return_exceptions=True), 5)
    assert isinstance(results[0], StorageUnavailableError)
    handler.write_errno = None
    stored = ids(committer_on(fs, DIR, clock, **opts))
    duplicate_acknowledged = results[1] is None
    assert not (duplicate_acknowledged and "x" not in stored), (
        "the duplicate send of x was acknowledged, but x was never stored"
    )


# ---------------------------------------------------------------- checkpoints and recovery


async def test_recovery_is_the_latest_checkpoint_plus_the_log_tail(tmp_path, clock):
    c = local(tmp_path, clock)
    c.core.send(records(*"abcd"))
    await c.durable()
    await settle_all(c, [SettleOp(COMPLETE, r.lock_token) for r in c.core.receive(1)])
    await c.checkpoint_now()
    log = c.durable_log
    assert log.checkpoint_lsn == 2
    got = c.core.receive(2)
    await settle_all(c, [SettleOp(DEFER, got[0].lock_token), SettleOp(ABANDON, got[1].lock_token)])
    c.core.send(records("e"))
    await c.durable()
    before = view(c.core)

    stored = {p.relative_to(tmp_path / "p0").as_posix() for p in (tmp_path / "p0").rglob("*.*")}
    # checkpoint 2, and log entries 3 and 4 in the segment begun after the checkpoint closed one
    assert stored == {f"checkpoint/{2:020d}.arrow", f"log/{3:020d}.seg"}
    again = local(tmp_path, clock)
    assert again.durable_log.checkpoint_lsn == 2
    assert view(again.core) == before
    assert again.durable_log.next_lsn == 5


async def test_checkpoints_shrink_a_drained_queue_and_recovery_still_works(tmp_path, clock):
    c = local(tmp_path, clock, checkpoint_min=100)
    total = 3000
    for i in range(0, total, 100):
        c.core.send(records(*(f"m{j}" for j in range(i, i + 100))))
        await c.durable()
    log = c.durable_log
    full = log.size_bytes()
    assert full > 100_000
    while got := c.core.receive(100):
        await settle_all(c, [SettleOp(COMPLETE, r.lock_token) for r in got])
    await eventually(lambda: log.size_bytes() < 20_000)
    await eventually(lambda: log.file_count() <= 2)

    again = local(tmp_path, clock, checkpoint_min=100)
    assert counts_of(again.core) == (0, 0, 0, 0)
    assert again.core.send(records("next")) == [total + 1]
    await again.durable()
    assert [r.message_id for r in again.core.receive(2)] == ["next"]


def quiet_committer(
    tmp_path: Path, clock: FakeClock, queue: dict[str, Any] | None = None, **options: Any
) -> Committer:
    """A Committer whose change threshold is out of reach: only bytes or quiet checkpoint.
    ``queue``: the queue's properties."""
    options.setdefault("checkpoint_min", 10**9)
    return Committer(
        core_factory(clock, **(queue or {})),
        DurableLog.from_storage_path(str(tmp_path), "p0"),
        **options,
    )


async def fill_and_drain(c: Committer, n: int, body: int = 2000, start: int = 0) -> None:
    for i in range(start, start + n, 100):
        c.core.send([record(os.urandom(body), message_id=f"m{j}") for j in range(i, i + 100)])
        await c.durable()
    while got := c.core.receive(100):
        await settle_all(c, [SettleOp(COMPLETE, r.lock_token) for r in got])


async def test_a_drained_queue_gives_its_disk_back_once_quiet(tmp_path, clock):
    c = quiet_committer(tmp_path, clock, quiet_checkpoint=1.0)
    await fill_and_drain(c, 500)
    log = c.durable_log
    full = log.size_bytes()
    assert full > 1_000_000 and log.checkpoint_lsn is None  # no threshold was reached
    await asyncio.sleep(0.2)
    assert log.checkpoint_lsn is None  # not quiet for long enough yet
    await eventually(lambda: log.size_bytes() < 20_000 and c._checkpointing is None)
    again = quiet_committer(tmp_path, clock)
    assert counts_of(again.core) == (0, 0, 0, 0)


async def test_a_quiet_queue_is_not_checkpointed_when_that_would_not_halve_its_storage(
    tmp_path, clock
):
    c = quiet_committer(tmp_path, clock, quiet_checkpoint=0.05)
    c.core.send([record(os.urandom(2000), message_id=f"m{j}") for j in range(300)])
    await c.durable()
    await c.checkpoint_now()
    lsn = c.durable_log.checkpoint_lsn
    assert lsn is not None
    c.core.send(records("one more"))  # a change, but the messages are most of the storage
    await c.durable()
    await asyncio.sleep(0.3)
    assert c.durable_log.checkpoint_lsn == lsn


async def test_the_log_and_checkpoint_bytes_bound_a_queue_of_few_changes(tmp_path, clock):
    c = quiet_committer(tmp_path, clock, checkpoint_min_bytes=400_000, quiet_checkpoint=None)
    log = c.durable_log
    for i in range(20):  # 20 changes of 50 kB each: far below any change threshold
        c.core.send([record(os.urandom(50_000), message_id=f"m{i}")])
        await c.durable()
        got = c.core.receive(1)
        await settle_all(c, [SettleOp(COMPLETE, got[0].lock_token)])
    await eventually(lambda: c._checkpointing is None)
    assert log.checkpoint_lsn is not None
    # What a restart reads back, the checkpoint and the log after it, stays within
    # the checkpoint (one message at most) and 400 kB of log, plus the flush that crossed it.
    found = DurableLog.from_storage_path(str(tmp_path), "p0").recover()
    assert found.checkpoint is not None
    read_back = found.checkpoint.nbytes + sum(t.nbytes for _, t in found.entries)
    assert read_back < 51_000 + 400_000 + 51_000
    again = quiet_committer(tmp_path, clock, checkpoint_min_bytes=400_000)
    assert counts_of(again.core) == (0, 0, 0, 0)
    assert again._stored_bytes() == read_back  # counted back at recovery


DEDUP = {"requires_duplicate_detection": True}


async def test_a_checkpoint_larger_than_the_byte_floor_does_not_trigger_the_next(tmp_path, clock):
    # Duplicate-detection ids stay in every checkpoint after their messages are gone: a
    # rule that counted the checkpoint against its floor would checkpoint after every flush.
    c = quiet_committer(tmp_path, clock, DEDUP, checkpoint_min_bytes=20_000, quiet_checkpoint=None)
    await fill_and_drain(c, 2000, body=10)
    await c.checkpoint_now()
    assert c._checkpoint_bytes > 20_000
    lsn = c.durable_log.checkpoint_lsn
    for i in range(5):
        c.core.send(records(f"x{i}"))
        await c.durable()
    await asyncio.sleep(0.05)
    assert c.durable_log.checkpoint_lsn == lsn


async def test_a_quiet_pause_rewrites_a_checkpoint_of_ids_at_most_once(tmp_path, clock):
    c = quiet_committer(tmp_path, clock, DEDUP, quiet_checkpoint=0.05)
    await fill_and_drain(c, 2000, body=2000)
    log = c.durable_log
    # Quiet: compacted (and the checkpoint's write finished, not just its files deleted).
    await eventually(lambda: log.size_bytes() < 1_000_000 and c._checkpointing is None)
    lsn = log.checkpoint_lsn
    assert lsn is not None and c._checkpoint_bytes > 64 * 1024  # the ids, no message
    for pause in range(3):  # a change, then a quiet pause, each time
        await fill_and_drain(c, 100, body=10, start=10_000 + 100 * pause)
        await asyncio.sleep(0.2)
    assert c.durable_log.checkpoint_lsn == lsn  # the estimate missed the ids: left alone


async def test_checkpoints_bound_the_log_while_messages_are_settled_one_by_one(faulty, clock):
    fs, _ = faulty
    c = committer_on(fs, DIR, clock, checkpoint_min=100)
    log = c.durable_log
    c.core.send(records(*(f"m{j}" for j in range(500))))
    await c.durable()
    while got := c.core.receive(1):
        await settle_all(c, [SettleOp(COMPLETE, got[0].lock_token)])
        # A checkpoint is due once the log holds max(checkpoint_min, 2 * live) entries since
        # the last one (one per file here); while it is written in the background flushes go
        # on up to twice that; allow the checkpoint file and one in progress.
        assert log.file_count() <= 2 * max(100, 2 * c.core.message_count()) + 3
    await eventually(lambda: log.file_count() <= 100 + 1)
    assert counts_of(committer_on(fs, DIR, clock).core) == (0, 0, 0, 0)


async def test_a_torn_last_log_record_loses_only_that_unacknowledged_append(tmp_path, clock):
    c = local(tmp_path, clock)
    seqs, sizes = [], []
    for mid in ("a", "b", "c"):
        seqs += c.core.send(records(mid))
        await c.durable()
        sizes.append(records_end(Path(c.durable_log.appending_to)))
    segment = Path(c.durable_log.appending_to)  # one segment holds all three records
    data = segment.read_bytes()[: sizes[-1]]
    segment.write_bytes(data[: len(data) - 7])  # a crash in the middle of writing "c"

    again = local(tmp_path, clock)
    assert ids(again) == {"a", "b"}
    assert again.durable_log.next_lsn == 3
    assert segment.stat().st_size == sizes[1]  # the torn record was cut off
    assert again.core.send(records("d")) == [seqs[2]]  # "c" was never acknowledged
    await again.durable()
    assert again.durable_log.next_lsn == 4
    assert ids(local(tmp_path, clock)) == {"a", "b", "d"}


# ---------------------------------------------------------------- callers nobody waits on


def lingering(fs: pafs.FileSystem, clock: FakeClock, linger: float, **kw: Any) -> Committer:
    return Committer(
        core_factory(clock), kw.pop("log_class", DurableLog)(fs, DIR), lazy_linger=linger, **kw
    )


async def sent_and_received(c: Committer, *message_ids: str) -> list[Any]:
    c.core.send(records(*message_ids))
    await c.durable()
    return c.core.receive(EVERYTHING)


async def test_a_settlement_nobody_waits_on_shares_the_flush_of_the_next_send(faulty, clock):
    """The ping-pong of one sender and one receiver: the completion the receiver did not wait
    for is written with the next send, in one flush, and the send is not held up by the
    wait (the linger here is a minute: only the send ends it)."""
    fs, _ = faulty
    c = lingering(fs, clock, 60.0)
    (a,) = await sent_and_received(c, "a")
    flushes = c.flushes
    assert c.core.settle([SettleOp(COMPLETE, a.lock_token)]) == [None]
    settled = asyncio.ensure_future(c.durable(lazy=True))
    await asyncio.sleep(0.02)
    assert not settled.done()  # lingering: nobody waiting on it has asked for a flush
    assert c.flushes == flushes
    c.core.send(records("b"))
    await asyncio.wait_for(c.durable(), 5)
    await asyncio.wait_for(settled, 5)
    assert c.flushes == flushes + 1  # both in one flush
    assert ids(committer_on(fs, DIR, clock)) == {"b"}  # a's completion is durable


async def test_a_lone_settlement_nobody_waits_on_is_written_after_the_linger(faulty, clock):
    fs, _ = faulty
    c = lingering(fs, clock, 0.2)
    (a,) = await sent_and_received(c, "a")
    assert c.core.settle([SettleOp(COMPLETE, a.lock_token)]) == [None]
    started = time.monotonic()
    settled = asyncio.ensure_future(c.durable(lazy=True))
    await asyncio.sleep(0.05)
    assert not settled.done()
    assert ids(committer_on(fs, DIR, clock)) == {"a"}  # not written yet
    await asyncio.wait_for(settled, 5)
    assert time.monotonic() - started >= 0.15
    assert ids(committer_on(fs, DIR, clock)) == set()


async def test_settlements_recorded_during_a_flush_linger_for_the_next_send(faulty, clock):
    """A completion that arrives while a send's flush is written does not get a flush of its
    own right after it: it waits for the next send, which the first one's answer lets come."""
    fs, _ = faulty
    c = lingering(fs, clock, 60.0, log_class=GatedLog)
    log = c.durable_log
    assert isinstance(log, GatedLog)
    (a,) = await sent_and_received(c, "a")
    flushes = c.flushes
    log.hold()
    c.core.send(records("b"))
    sent_b = asyncio.ensure_future(c.durable())
    assert await asyncio.to_thread(log.entered.wait, 5)  # b's flush is being written
    assert c.core.settle([SettleOp(COMPLETE, a.lock_token)]) == [None]
    settled = asyncio.ensure_future(c.durable(lazy=True))
    log.release()
    await asyncio.wait_for(sent_b, 5)
    await asyncio.sleep(0.02)
    assert not settled.done() and c.flushes == flushes + 1
    c.core.send(records("c"))
    await asyncio.wait_for(c.durable(), 5)
    await asyncio.wait_for(settled, 5)
    assert c.flushes == flushes + 2
    assert ids(committer_on(fs, DIR, clock)) == {"b", "c"}


async def test_hurry_ends_the_linger_of_settlements_nobody_waits_on(faulty, clock):
    """What a receive that finds messages does: its client waits for the answers of the
    settlements it sent before, so they are written at once, not with the next send."""
    fs, _ = faulty
    c = lingering(fs, clock, 60.0)
    c.hurry()  # nothing pending: nothing to hurry, and the next linger is not cut short
    (a,) = await sent_and_received(c, "a")
    assert c.core.settle([SettleOp(COMPLETE, a.lock_token)]) == [None]
    settled = asyncio.ensure_future(c.durable(lazy=True))
    await asyncio.sleep(0.02)
    assert not settled.done()
    c.hurry()
    await asyncio.wait_for(settled, 5)
    assert ids(committer_on(fs, DIR, clock)) == set()


async def test_hurry_during_a_flush_keeps_the_next_one_from_lingering(faulty, clock):
    fs, _ = faulty
    c = lingering(fs, clock, 60.0, log_class=GatedLog)
    log = c.durable_log
    assert isinstance(log, GatedLog)
    (a,) = await sent_and_received(c, "a")
    log.hold()
    c.core.send(records("b"))
    sent_b = asyncio.ensure_future(c.durable())
    assert await asyncio.to_thread(log.entered.wait, 5)
    assert c.core.settle([SettleOp(COMPLETE, a.lock_token)]) == [None]
    settled = asyncio.ensure_future(c.durable(lazy=True))
    await asyncio.sleep(0)  # it waits now
    c.hurry()  # recorded after the flush under way began: the next flush takes it at once
    log.release()
    await asyncio.wait_for(asyncio.gather(sent_b, settled), 5)
    assert ids(committer_on(fs, DIR, clock)) == {"b"}


@pytest.mark.parametrize("inline_bytes", [64 << 10, 0], ids=["inline", "threaded"])
async def test_settlements_nobody_waits_on_linger_only_after_flushes_written_in_the_thread(
    tmp_path, clock, inline_bytes
):
    """On a local disk a small flush is written on the loop's thread, and quickly: a second
    flush costs less there than the wait for a send to share it, so after one the next
    flush does not linger. After a flush written in the worker thread (a large one, or
    ``inline_bytes=0`` here) it does."""
    c = Committer(
        core_factory(clock),
        DurableLog.from_storage_path(str(tmp_path), "p0"),
        lazy_linger=60.0,
        inline_bytes=inline_bytes,
    )
    (a,) = await sent_and_received(c, "a")
    assert c.inline_flushes == (1 if inline_bytes else 0)
    assert c.core.settle([SettleOp(COMPLETE, a.lock_token)]) == [None]
    settled = asyncio.ensure_future(c.durable(lazy=True))
    await asyncio.sleep(0.05)
    assert settled.done() == bool(inline_bytes)
    c.hurry()
    await asyncio.wait_for(settled, 5)


async def test_without_a_linger_a_settlement_nobody_waits_on_is_written_at_once(faulty, clock):
    fs, _ = faulty
    c = lingering(fs, clock, 0.0)
    (a,) = await sent_and_received(c, "a")
    assert c.core.settle([SettleOp(COMPLETE, a.lock_token)]) == [None]
    await asyncio.wait_for(c.durable(lazy=True), 1)
    assert ids(committer_on(fs, DIR, clock)) == set()


async def test_a_failed_flush_fails_the_settlements_nobody_waited_on_too(faulty, clock):
    """They are undone like any other: the message is where it was, locked no more."""
    fs, handler = faulty
    c = lingering(fs, clock, 60.0)
    (a,) = await sent_and_received(c, "a")
    assert c.core.settle([SettleOp(COMPLETE, a.lock_token)]) == [None]
    settled = asyncio.ensure_future(c.durable(lazy=True))
    await asyncio.sleep(0)
    handler.write_errno = errno.EIO
    c.core.send(records("b"))
    results = await asyncio.wait_for(
        asyncio.gather(c.durable(), settled, return_exceptions=True), 5
    )
    assert all(isinstance(r, StorageUnavailableError) for r in results), results
    handler.write_errno = None
    assert ids(c) == {"a"}


# ---------------------------------------------------------------- express


async def test_express_acknowledges_before_writing_and_writes_within_the_interval(tmp_path, clock):
    c = Committer(
        core_factory(clock),
        DurableLog.from_storage_path(str(tmp_path), "p0"),
        express_interval=0.2,
    )
    c.core.send(records("a", "b"))
    await asyncio.wait_for(c.durable(), 0.05)  # returns at once: not yet written
    assert ids(local(tmp_path, clock)) == set()  # a crash now would lose a and b
    assert {r.message_id for r in c.core.receive(EVERYTHING)} == {"a", "b"}  # yet visible
    await asyncio.sleep(0.5)
    assert ids(local(tmp_path, clock)) == {"a", "b"}  # written within the interval
    assert c.flushes == 1


async def test_a_forced_flush_on_an_express_partition_does_not_wait_for_the_interval(
    tmp_path, clock
):
    """Changes acknowledged at once wait for the express interval; a forced flush (two-phase
    commit's records) ends that wait and writes them all."""
    c = Committer(
        core_factory(clock),
        DurableLog.from_storage_path(str(tmp_path), "p0"),
        express_interval=60.0,
    )
    c.core.send(records("a"))
    await asyncio.wait_for(c.durable(), 0.05)
    transactions.prepare(c.core, "txn-1", records("b"), [], [])
    await asyncio.wait_for(c.durable(force=True), 5)
    assert ids(local(tmp_path, clock)) == {"a"}  # and b, prepared: not a message until commit
    assert "txn-1" in local(tmp_path, clock).core.prepared
    assert c.flushes == 1


@pytest.mark.parametrize("express", [None, 0.05], ids=["standard", "express"])
async def test_a_repeated_prepare_waits_for_the_first_prepare_record(faulty, clock, express):
    """``durable(force=True)`` that recorded nothing (a repeated two-phase-commit prepare)
    still waits for the flush in flight, on an express partition too: it answers with that
    flush's outcome, never "prepared" while the first prepare's record may still be lost."""
    fs, handler = faulty
    c = Committer(core_factory(clock), GatedLog(fs, DIR), express_interval=express)
    log = c.durable_log
    assert isinstance(log, GatedLog)
    log.hold()
    try:
        transactions.prepare(c.core, "txn-1", records("a"), [], [])
        first = asyncio.ensure_future(c.durable(force=True))  # what txn_prepare awaits
        assert await asyncio.to_thread(log.entered.wait, 5)  # its record is being written
        transactions.prepare(c.core, "txn-1", records("a"), [], [])  # the coordinator retries
        assert not c.core.has_journal()  # nothing new recorded
        retry = asyncio.ensure_future(c.durable(force=True))
        await asyncio.sleep(0.05)
        assert not retry.done(), "the repeated prepare answered before the first was durable"
        handler.write_errno = errno.EIO  # the first prepare's write fails: the share is undone
    finally:
        log.release()
    results = await asyncio.wait_for(asyncio.gather(first, retry, return_exceptions=True), 5)
    assert all(isinstance(r, StorageUnavailableError) for r in results), results
    assert "txn-1" not in c.core.prepared  # rebuilt from the log: never prepared


async def churn(c: Committer, n: int) -> None:
    """Send and complete ``n`` messages, one flush each: log entries, nothing left live."""
    for i in range(n):
        c.core.send(records(f"churn{i}"))
        await c.durable()
        (got,) = c.core.receive(1)
        await settle_all(c, [SettleOp(COMPLETE, got.lock_token)])


class SlowCheckpointLog(DurableLog):
    """A ``DurableLog`` whose checkpoints wait for ``go`` (set from the test)."""

    def __init__(self, fs: pafs.FileSystem, directory: str) -> None:
        super().__init__(fs, directory)
        self.go = threading.Event()
        self.writing = threading.Event()
        self.append_failed = threading.Event()

    def append(self, data: Any) -> int:
        try:
            return super().append(data)
        except StorageUnavailableError:
            self.append_failed.set()
            raise

    def checkpoint(self, table: Any, upto_lsn: int) -> None:
        self.writing.set()
        assert self.go.wait(10), "the test never let the checkpoint finish"
        super().checkpoint(table, upto_lsn)


async def test_flushes_go_on_while_a_checkpoint_is_being_written(faulty, clock):
    fs, _ = faulty
    c = committer_on(fs, DIR, clock, checkpoint_min=3, log_class=SlowCheckpointLog)
    log = c.durable_log
    assert isinstance(log, SlowCheckpointLog)
    try:
        await churn(c, 2)  # four entries, nothing live: a checkpoint is due
        assert await asyncio.to_thread(log.writing.wait, 5)
        c.core.send(records("during"))
        await asyncio.wait_for(c.durable(), 5)  # not held up by the checkpoint
        assert log.checkpoint_lsn is None
        log.go.set()
        await eventually(lambda: log.checkpoint_lsn is not None)
        upto = log.checkpoint_lsn
        assert upto is not None and upto < log.next_lsn - 1  # "during" came after it
        c.core.send(records("after"))
        await c.durable()
        assert ids(committer_on(fs, DIR, clock)) == {"during", "after"}
    finally:
        log.go.set()  # never leave the writer thread waiting


async def test_a_flush_failing_while_a_checkpoint_is_written_recovers_after_it(faulty, clock):
    fs, handler = faulty
    c = committer_on(fs, DIR, clock, checkpoint_min=3, log_class=SlowCheckpointLog)
    log = c.durable_log
    assert isinstance(log, SlowCheckpointLog)
    try:
        await churn(c, 2)
        assert await asyncio.to_thread(log.writing.wait, 5)
        c.core.send(records("kept"))
        await asyncio.wait_for(c.durable(), 5)
        handler.write_errno = errno.EIO
        c.core.send(records("lost"))
        failing = asyncio.ensure_future(c.durable())
        assert await asyncio.to_thread(log.append_failed.wait, 5)
        await asyncio.sleep(0.01)
        assert not failing.done()  # its recovery waits for the checkpoint's writer
        handler.write_errno = None
        log.go.set()
        with pytest.raises(StorageUnavailableError):
            await asyncio.wait_for(failing, 5)
        assert ids(c) == {"kept"}
        assert ids(committer_on(fs, DIR, clock)) == {"kept"}
    finally:
        log.go.set()


async def test_durable_since_waits_for_its_own_changes_only(faulty, clock):
    """A read that changed nothing is not held up by other callers' changes waiting for
    their flush; one that changed something waits for it."""
    fs, _ = faulty
    c = committer_on(fs, DIR, clock, log_class=GatedLog)
    c.core.send(records("a", "b"))
    await c.durable()
    log = c.durable_log
    assert isinstance(log, GatedLog)
    log.hold()
    try:
        c.core.send(records("in-flight"))
        writing = asyncio.ensure_future(c.durable())
        assert await asyncio.to_thread(log.entered.wait, 5)
        c.core.send(records("pending"))  # waits for the next flush
        pending = asyncio.ensure_future(c.durable())
        mark = c.core.journal_size()
        got = c.core.receive(1)  # a lock only: nothing to write
        await asyncio.wait_for(c.durable_since(mark), 1)
        assert [r.message_id for r in got] == ["a"]
        mark = c.core.journal_size()
        c.core.settle([SettleOp(COMPLETE, got[0].lock_token)])  # recorded: must wait
        own = asyncio.ensure_future(c.durable_since(mark))
        await asyncio.sleep(0.02)
        assert not own.done() and not pending.done()
    finally:
        log.release()
    await asyncio.wait_for(asyncio.gather(writing, pending, own), 5)
    assert ids(committer_on(fs, DIR, clock)) == {"b", "in-flight", "pending"}


async def test_no_quiet_checkpoint_once_stopped(tmp_path, clock):
    c = quiet_committer(tmp_path, clock, quiet_checkpoint=0.05)
    await fill_and_drain(c, 200)
    c.stop_quiet_checkpoints()  # the entity is being deleted
    await asyncio.sleep(0.3)
    assert c.durable_log.checkpoint_lsn is None


async def test_a_quiet_checkpoint_that_cannot_be_captured_is_tried_once_and_serving_goes_on(
    tmp_path, clock, monkeypatch
):
    c = quiet_committer(tmp_path, clock, quiet_checkpoint=0.05)
    await fill_and_drain(c, 200)
    attempts: list[float] = []

    def broken() -> Any:
        attempts.append(time.monotonic())
        raise TypeError("injected: a state that does not encode")

    monkeypatch.setattr(c.core, "snapshot_entries", broken)
    await eventually(lambda: len(attempts) == 1)
    await asyncio.sleep(0.3)  # several quiet periods: the check waits for a new flush
    assert len(attempts) == 1 and c.durable_log.checkpoint_lsn is None
    c.core.send(records("after"))
    await c.durable()  # the log is still written
    assert [r.message_id for r in c.core.receive(1)] == ["after"]
