"""The durable change log of the namespace and coordinator actors: one writer, many callers.

Both actors keep a small state (the registry; the undone commit decisions) as a log of changes
with a checkpoint now and then. ``ChangeLog`` is the one implementation of that pattern:

* ``replay()`` yields every logged change in order (the checkpoint's first);
* ``append(change)`` logs one change durably before returning. Callers run concurrently on the
  actor's event loop but ``DurableLog`` has one writer, so appends (and checkpoints) are
  serialised by a lock; the blocking write runs in a thread, so the actor keeps answering;
* every ``every`` appends it writes ``snapshot()`` as a checkpoint, which keeps replay short.
  A failed checkpoint — whatever it raises: a storage error, a raw ``OSError``, a snapshot that
  cannot be encoded — is only logged and tried again at the next append: the change is already
  durable, so ``append`` must not report it as failed (the caller would undo in memory what a
  restart replays). The log stays the previous checkpoint plus every entry; replay is longer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

from .._core import journal
from .._storage import DurableLog

__all__ = ["ChangeLog"]

_log = logging.getLogger("raybus.changelog")


class ChangeLog:
    """See the module docstring. ``what`` names the log in warnings."""

    def __init__(
        self,
        storage_path: str,
        namespace: str,
        name: str,
        snapshot: Callable[[], list[Any]],
        every: int,
    ) -> None:
        self._log = DurableLog.from_storage_path(storage_path, namespace, name)
        self._what = f"{name} of {namespace}"
        self._snapshot = snapshot
        self._every = every
        self._since_checkpoint = 0
        self._lock = asyncio.Lock()
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

    async def append(self, change: Any) -> None:
        table = journal.to_table([(0, 0, 0, change)])
        log = self._log
        async with self._lock:
            await asyncio.to_thread(log.append, table)
            self._since_checkpoint += 1
            if self._since_checkpoint < self._every:
                return
            try:
                snap = journal.to_table([(0, 0, 0, c) for c in self._snapshot()])
                await asyncio.to_thread(log.checkpoint, snap, log.next_lsn - 1)
                self._since_checkpoint = 0
            except Exception as exc:  # the append above is durable: see the module docstring
                _log.warning("checkpoint of the %s failed: %r", self._what, exc)
