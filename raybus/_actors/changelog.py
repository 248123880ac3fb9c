"""The durable change log of the namespace and coordinator actors: one writer, many callers.

Both actors keep a small state (the registry; the undone commit decisions) as a log of changes
with a checkpoint now and then. ``ChangeLog`` is the one implementation of that pattern:

* ``replay()`` yields every logged change in order (the checkpoint's first);
* ``append(change)`` logs one change durably before returning. Callers run concurrently on the
  actor's event loop but ``DurableLog`` has one writer: one writer task takes every change
  queued meanwhile and writes them as one record with one fsync (group commit, as a
  partition's ``Committer`` does), so N concurrent appends cost one write rather than N in a
  row. The blocking write runs in a thread, so the actor keeps answering;
* ``append_soon(change)`` queues a change for the next write without waiting for it: for
  records whose loss in a crash costs only repeated work after the restart (the coordinator's
  "transaction done" marks: a lost one makes it tell the participants again, which they
  ignore). A failed write of such a change is logged, not raised;
* every ``every`` appends (or ``every_bytes`` written, for logs whose changes carry messages:
  the router's) it writes ``snapshot()`` as a checkpoint, which keeps replay short and deletes
  the log files it covers. A checkpoint holds durable changes only: callers apply a change in
  memory before they queue it, so a snapshot taken while changes are queued holds them too.
  It is then written only after the write carrying exactly those changes succeeded (as of
  that write's LSN), and dropped if that write fails (the callers undo them). Why not wait
  for an empty queue instead: under steady load the queue is never empty after a write, and
  the log would grow without a checkpoint. This relies on callers queuing a change in the
  same synchronous step in which they apply it (``append`` queues at once, before its result
  is awaited, so ``asyncio.gather`` of several appends queues them all in the caller's step).
  A failed checkpoint — whatever it raises: a storage error, a raw ``OSError``, a snapshot that
  cannot be encoded — is only logged and tried again after the next write: the changes are
  already durable, so ``append`` must not report them as failed (the caller would undo in
  memory what a restart replays). The log stays the previous checkpoint plus every entry;
  replay is longer.

Measured (``benchmarks/profile_topics.py``): a topic publish is a two-phase commit whose
decision and "done" mark were two more fsyncs in a row on the publisher's path; concurrent
commits queued behind each other's writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from .._core import journal
from .._storage import DurableLog

__all__ = ["ChangeLog", "LoggedOnce", "message_log"]

_log = logging.getLogger("raybus.changelog")

# A log whose changes carry messages (the router's publish log and its scheduled messages)
# checkpoints after this many bytes too: the checkpoint holds only what is still pending
# (usually little), which keeps the log small on disk and short to replay.
MESSAGE_CHECKPOINT_BYTES = 16 * 1024 * 1024


class ChangeLog:
    """See the module docstring. ``what`` names the log in warnings."""

    def __init__(
        self,
        storage_path: str,
        namespace: str,
        name: str,
        snapshot: Callable[[], list[Any]],
        every: int,
        every_bytes: int | None = None,
    ) -> None:
        self._log = DurableLog.from_storage_path(storage_path, namespace, name)
        self._what = f"{name} of {namespace}"
        self._snapshot = snapshot
        self._every = every
        self._every_bytes = every_bytes
        self._since_checkpoint = 0
        self._bytes_since_checkpoint = 0
        self._pending: list[Any] = []  # changes queued for the next write
        self._written: asyncio.Future[None] | None = None  # resolved by that write
        self._writer: asyncio.Task[None] | None = None
        self._found = self._log.recover()

    def replay(self) -> Iterator[Any]:
        """The logged changes, in order (read once, at start-up)."""
        found = self._found
        tables = [found.checkpoint] if found.checkpoint is not None else []
        tables += [table for _lsn, table in found.entries]
        self._since_checkpoint = len(found.entries)
        for table in tables:
            for entry in journal.from_table(table):
                yield entry[3]

    def append(self, change: Any) -> asyncio.Future[None]:
        """Log ``change``: queued at once, in the caller's synchronous step (not when the
        result is first awaited: a checkpoint captured in between would hold a change not
        queued yet; see the module docstring); the result ends once it is durable (it raises
        the storage error if the write carrying it failed: then it is not logged)."""
        return asyncio.shield(self._queue(change))

    def append_soon(self, change: Any) -> None:
        """Log ``change`` with the next write, without waiting (see the module docstring)."""
        self._queue(change).add_done_callback(self._report)

    def _report(self, written: asyncio.Future[None]) -> None:
        if not written.cancelled() and written.exception() is not None:
            _log.warning("a change of the %s was not logged: %s", self._what, written.exception())

    def _queue(self, change: Any) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        self._pending.append(change)
        if self._written is None:
            self._written = loop.create_future()
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_queued())
        return self._written

    async def _write_queued(self) -> None:
        """The one writer: every change queued while a write is under way goes in the next."""
        log = self._log
        # A state captured with the queued changes applied: checkpointed once the write that
        # takes exactly those changes (the next one: nothing is awaited in between) succeeds.
        ahead: pa.Table | None = None
        while self._pending:
            batch, self._pending = self._pending, []
            written, self._written = self._written, None
            assert written is not None
            table = journal.to_table([(0, 0, 0, c) for c in batch])
            try:
                lsn = await asyncio.to_thread(log.append, table)
            except Exception as exc:  # the storage error, for every change of this write
                written.set_exception(exc)
                ahead = None  # it holds the failed changes, which their callers undo
                continue
            written.set_result(None)
            self._since_checkpoint += len(batch)
            self._bytes_since_checkpoint += table.nbytes
            if ahead is not None:
                snap, ahead = ahead, None
                await self._checkpoint(snap, lsn)
                continue
            big = (
                self._every_bytes is not None and self._bytes_since_checkpoint >= self._every_bytes
            )
            if self._since_checkpoint >= self._every or big:
                snap = self._capture()
                if snap is not None and self._pending:
                    ahead = snap  # holds changes not yet written (module docstring)
                elif snap is not None:
                    await self._checkpoint(snap, lsn)

    def _capture(self) -> pa.Table | None:
        """``snapshot()`` as a table; None (logged) if it cannot be taken."""
        try:
            return journal.to_table([(0, 0, 0, c) for c in self._snapshot()])
        except Exception as exc:  # the changes are durable already: see the module docstring
            _log.warning("checkpoint of the %s failed: %r", self._what, exc)
            return None

    async def _checkpoint(self, snap: pa.Table, upto_lsn: int) -> None:
        try:
            await asyncio.to_thread(self._log.checkpoint, snap, upto_lsn)
            self._since_checkpoint = 0
            self._bytes_since_checkpoint = 0
        except Exception as exc:  # the changes are durable already: see the module docstring
            _log.warning("checkpoint of the %s failed: %r", self._what, exc)


class LoggedOnce:
    """One change that must reach ``log`` once, whichever caller gets there first (the
    namespace's birth: its ``__init__`` has no event loop to write from).

    ``start()`` begins the write unless it is written or under way, and returns it without
    waiting (a failure is logged as a warning); ``written()`` waits for it and raises the
    storage error of a failed write. After a failed write the next ``start`` or ``written``
    begins another. With no ``log`` there is nothing to write.
    """

    def __init__(self, log: ChangeLog | None, change: Any) -> None:
        self._log = log
        self._change = change
        self._write: asyncio.Future[None] | None = None

    def start(self) -> asyncio.Future[None] | None:
        if self._log is None:
            return None
        write = self._write
        if write is not None and write.done() and (write.cancelled() or write.exception()):
            write = None  # it failed: begin again
        if write is None:
            write = self._write = self._log.append(self._change)
            write.add_done_callback(self._report)
        return write

    def _report(self, write: asyncio.Future[None]) -> None:
        if not write.cancelled() and write.exception() is not None:
            _log.warning(
                "%r not logged (tried again at the next call): %s", self._change, write.exception()
            )

    async def written(self) -> None:
        write = self.start()
        if write is not None:
            await asyncio.shield(write)


def message_log(
    storage_path: str | None, namespace: str, name: str, snapshot: Callable[[], list[Any]]
) -> ChangeLog | None:
    """The ``ChangeLog`` of a state whose changes carry messages (checkpointed by bytes as
    well as by count); None without a storage path (the state then lives in memory only)."""
    if storage_path is None:
        return None
    return ChangeLog(
        storage_path, namespace, name, snapshot, every=1000, every_bytes=MESSAGE_CHECKPOINT_BYTES
    )
