"""Helpers for the durability tests: a faulty in-memory filesystem, a log whose appends can be
held back, and ways to look at a partition's whole state.

The fault-injecting filesystem is a trimmed copy of ``tests/unit/storage/storage_helpers.py``
(that folder is not a package, so its helpers are only importable while its own tests run),
extended with read faults (``unreachable``) so storage can be made wholly unavailable.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

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


class _FailingWriter:
    """A writable file that passes ``budget`` bytes on, then fails with ``code``."""

    def __init__(self, inner: pa.NativeFile, code: int, budget: int) -> None:
        self._inner = inner
        self._code = code
        self._budget = budget
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if len(view) > self._budget:
            self._inner.write(view[: self._budget])
            self._budget = 0
            raise OSError(self._code, "injected fault")
        self._budget -= len(view)
        self._inner.write(view)
        return len(view)

    def flush(self) -> None:
        self._inner.flush()

    def close(self) -> None:
        self.closed = True
        self._inner.close()


class FaultyHandler(pafs.FileSystemHandler):
    """Delegates to an in-memory ``_MockFileSystem``; faults are switched on by attributes.

    ``write_errno``: every output stream fails with it after ``write_budget`` bytes.
    ``unreachable``: every listing, read and directory creation fails with EIO (the storage
    cannot be reached at all, e.g. a network outage in front of an object store).
    """

    def __init__(self) -> None:
        self.inner = pafs._MockFileSystem()
        self.write_errno: int | None = None
        self.write_budget = 0
        self.unreachable = False
        self.writes = 0  # output streams opened (successful or not)

    def _check_reachable(self, path: str = "") -> None:
        if self.unreachable:
            raise OSError(errno.EIO, "injected fault: storage unreachable", path)

    def get_type_name(self) -> str:
        return "faulty-mock"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: Any) -> bool:
        return self is other

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        self._check_reachable()
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        self._check_reachable(selector.base_dir)
        return self.inner.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self._check_reachable(path)
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.inner.delete_dir_contents("", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self._check_reachable(path)
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.inner.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        self._check_reachable(path)
        return self.inner.open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        self._check_reachable(path)
        return self.inner.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        self.writes += 1
        self._check_reachable(path)
        out = self.inner.open_output_stream(path)
        if self.write_errno is None:
            return out
        return pa.PythonFile(_FailingWriter(out, self.write_errno, self.write_budget), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        raise AssertionError("storage must never append to a file")


def faulty_fs() -> tuple[pafs.FileSystem, FaultyHandler]:
    handler = FaultyHandler()
    return pafs.PyFileSystem(handler), handler


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
