"""Helpers for the durability tests: a faulty in-memory filesystem, a log whose appends can be
held back, and ways to look at a partition's whole state.

The fault-injecting filesystem is a trimmed copy of ``tests/unit/storage/storage_helpers.py``
(that folder is not a package, so its helpers are only importable while its own tests run),
extended with read faults (``unreachable``) so storage can be made wholly unavailable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow.fs as pafs
from faulty_fs import FaultyHandler as FaultyHandler
from faulty_fs import faulty_fs as faulty_fs

from raybus._core import journal
from raybus._core.committer import Committer
from raybus._core.partition import Partition
from raybus._core.record import MessageRecord, encoded_size, to_wire
from raybus._models import QueueProperties
from raybus._storage import DurableLog
from raybus._storage.framing import Batches
from raybus.testing import FakeClock

EVERYTHING = 10**9  # a peek/receive count larger than any test's queue


def record(body: Any = b"payload", **fields: Any) -> MessageRecord:
    """A fresh, validated record ready to send (as ``tests/unit/conftest.make_record``)."""
    rec = MessageRecord(body=body, **fields)
    encoded_size(rec)
    return rec


def records(*message_ids: str, **fields: Any) -> list[MessageRecord]:
    return [record(f"body of {mid}".encode(), message_id=mid, **fields) for mid in message_ids]


# ---------------------------------------------------------------------------- faulty storage


class GatedLog(DurableLog):
    """A ``DurableLog`` whose appends can be held back: while ``hold()`` is in force every
    ``append`` sets ``entered`` and waits for ``release()`` (it runs in a worker thread)."""

    def __init__(self, fs: pafs.FileSystem, directory: str) -> None:
        super().__init__(fs, directory)
        self._gate: threading.Event | None = None
        self.entered = threading.Event()

    def hold(self) -> None:
        self._gate = threading.Event()
        self.entered.clear()

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.set()

    def append(self, data: Batches) -> int:
        gate = self._gate
        if gate is not None:
            self.entered.set()
            if not gate.wait(10):
                raise RuntimeError("GatedLog: release() was never called")
        return super().append(data)


# ---------------------------------------------------------------------------- partitions


def core_factory(clock: FakeClock, **options: Any) -> Callable[[], Partition]:
    """``make_core`` for a ``Committer``: partition 0 of queue ``orders`` on ``clock``."""

    def make() -> Partition:
        return Partition(QueueProperties(name="orders", **options), clock, 0)

    return make


def committer_on(
    fs: pafs.FileSystem,
    directory: str,
    clock: FakeClock,
    *,
    checkpoint_min: int = 1000,
    log_class: type[DurableLog] = DurableLog,
    **options: Any,
) -> Committer:
    """A Committer recovering from (and writing to) ``directory`` on ``fs``."""
    return Committer(
        core_factory(clock, **options),
        log_class(fs, directory),
        checkpoint_min=checkpoint_min,
    )


def flush(p: Partition, sink: list[journal.Entry]) -> None:
    """What a successful group commit does to a bare partition: the journal goes to ``sink``
    and everything assigned so far becomes visible."""
    entries, last = p.take_journal()
    sink.extend(entries)
    p.visible_seq = max(p.visible_seq or 0, last)


def through_storage(entries: Iterable[journal.Entry]) -> list[journal.Entry]:
    """The entries as they come back from the log (pickled into an Arrow table and back)."""
    return journal.from_table(journal.to_table(list(entries)))


def recovered(make: Callable[[], Partition], *entry_lists: Iterable[journal.Entry]) -> Partition:
    """A fresh partition loaded from the replay of ``entry_lists`` (as the Committer does)."""
    state = journal.ReplayedState()
    for entries in entry_lists:
        journal.replay(through_storage(entries), state)
    p = make()
    p.load(state)
    p.enable_journal()
    return p


def view(p: Partition) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every message of the main queue (active, deferred, scheduled) and of the dead-letter
    sub-queue, all fields, locks cleared (as peek shows them), in sequence order."""
    main = [to_wire([r])[0] for r in p.peek(0, EVERYTHING)]
    dlq = [to_wire([r])[0] for r in p.peek(0, EVERYTHING, dead_letter=True)]
    return main, dlq


def by_id(p: Partition) -> dict[str, MessageRecord]:
    """Every message (main and dead-letter) by message id; dead-lettered ones are marked by
    their ``dead_letter_reason`` (set for every dead-lettered message in these tests)."""
    out: dict[str, MessageRecord] = {}
    for dead in (False, True):
        for rec in p.peek(0, EVERYTHING, dead_letter=dead):
            assert rec.message_id is not None
            assert rec.message_id not in out, f"{rec.message_id} held twice"
            out[rec.message_id] = rec
    return out


def counts_of(p: Partition) -> tuple[int, int, int, int]:
    c = p.counts()
    return c.active, c.dead_letter, c.scheduled, c.size_in_bytes
