"""``DurableLog``: an append-only log of Arrow record batches with checkpoints, on any filesystem.

Layout under the log's directory (any ``pyarrow.fs`` filesystem; nothing is ever appended to or
modified in place, so object stores work)::

    log/<lsn:020d>.arrow          one file per append, LSN 1, 2, 3, ... with no gaps
    checkpoint/<lsn:020d>.arrow   the caller's whole state after applying log files <= lsn

Each file is framed by ``raybus._storage.framing`` (length + CRC-32 + Arrow IPC stream) and
written durably by ``raybus._storage.fs`` before the call that wrote it returns.

Guarantees:

* **Durability**: ``append`` and ``checkpoint`` return only once their file is durable (fsync of
  file and directory on local disk; a completed object write elsewhere).
* **Order**: LSNs increase by one per successful ``append``; recovery returns log entries in LSN
  order. A failed append consumes no LSN: the next append reuses it (and replaces any remnant).
* **Recovery** returns the newest valid checkpoint and every log entry after it: exactly the
  acknowledged appends. The one exception: if an append failed *after* its bytes reached the
  storage (e.g. the directory fsync failed) and removing them failed too, and the process then
  crashed before another append, that last unacknowledged entry may come back (a failed write's
  outcome is "maybe", as everywhere).
* **Crash safety of checkpoints**: the files a checkpoint replaces are deleted only after it is
  durable, so a torn checkpoint is skipped in favour of the previous one plus the log.
* **Corruption** is never papered over: only the *last* log file may be torn (a crash mid-append;
  it is deleted with a warning). A damaged or missing file that acknowledged data depends on
  raises ``StorageCorruptedError``.

One writer per directory. ``append`` and ``checkpoint`` may run at the same time in two
threads (one call of each at a time: the partition writes a checkpoint in the background while
it goes on appending); ``recover`` must run alone.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import NamedTuple

import pyarrow as pa
import pyarrow.fs as pafs

from ..exceptions import InvalidArgumentError
from . import fs as _fs
from .errors import StorageCorruptedError, StorageUnavailableError
from .framing import Batches, FrameError, decode, encode

__all__ = ["CHECKPOINT_DIR", "LOG_DIR", "DurableLog", "RecoveredState"]

_log = logging.getLogger("raybus.storage")

LOG_DIR = "log"
CHECKPOINT_DIR = "checkpoint"
_NAME = re.compile(r"(\d{20})\.arrow")


class RecoveredState(NamedTuple):
    """What ``DurableLog.recover`` found: replay ``entries`` on top of ``checkpoint``."""

    checkpoint: pa.Table | None
    """The newest valid checkpoint's table, or ``None`` if there is none."""
    entries: list[tuple[int, pa.Table]]
    """``(lsn, table)`` of every log file after the checkpoint, in LSN order, gap-free."""


def _lsns(names: dict[str, int]) -> list[int]:
    """Sorted LSNs of the well-named files in a listing; other names are ignored."""
    return sorted(int(m.group(1)) for name in names if (m := _NAME.fullmatch(name)))


class DurableLog:
    """A durable, append-only log of Arrow data with checkpoints in ``directory`` on ``fs``.

    Call ``recover()`` once before ``append`` or ``checkpoint``: it reads what is stored and sets
    the next LSN. See the module docstring for the guarantees.
    """

    def __init__(self, fs: pafs.FileSystem, directory: str) -> None:
        self._fs = fs
        self._dir = directory
        self._log_dir = _fs.join(directory, LOG_DIR)
        self._checkpoint_dir = _fs.join(directory, CHECKPOINT_DIR)
        self._next_lsn: int | None = None  # None until recover() ran
        self._checkpoint_lsn: int | None = None
        # LSNs of the files this log knows are stored (including leftovers whose deletion
        # failed), so checkpoint() can delete them without listing the directory.
        self._logs: set[int] = set()
        self._checkpoints: set[int] = set()
        # Guards _logs and _next_lsn between an append and a concurrent checkpoint.
        self._lock = threading.Lock()

    @classmethod
    def from_storage_path(cls, storage_path: str, *subdirs: str) -> DurableLog:
        """A log in ``storage_path/subdirs...`` (local path or URI); see ``open_storage``."""
        return cls(*_fs.open_storage(storage_path, *subdirs))

    @property
    def filesystem(self) -> pafs.FileSystem:
        return self._fs

    @property
    def directory(self) -> str:
        return self._dir

    @property
    def next_lsn(self) -> int:
        """The LSN the next successful ``append`` will get (requires ``recover()``)."""
        return self._require_recovered()

    @property
    def checkpoint_lsn(self) -> int | None:
        """The LSN of the current checkpoint, ``None`` if there is none (or before recovery)."""
        return self._checkpoint_lsn

    def log_path(self, lsn: int) -> str:
        return _fs.join(self._log_dir, f"{lsn:020d}.arrow")

    def checkpoint_path(self, lsn: int) -> str:
        return _fs.join(self._checkpoint_dir, f"{lsn:020d}.arrow")

    # -- recovery ---------------------------------------------------------------------------

    def recover(self) -> RecoveredState:
        """Read the stored state: the newest valid checkpoint and the log entries after it.

        Creates the directory if it does not exist. Deletes (with a warning) a torn last log
        file and torn or superseded checkpoints, and deletes log files a checkpoint covers.
        Raises ``StorageCorruptedError`` (changing nothing) if a log file other than the last
        is damaged, a log file is missing, or a damaged checkpoint cannot be replaced by an
        older one plus the log; ``StorageUnavailableError`` if the storage cannot be read.
        May be called again; it re-reads the storage.
        """
        _fs.make_dir(self._fs, self._log_dir)
        _fs.make_dir(self._fs, self._checkpoint_dir)
        log_lsns = _lsns(_fs.list_files(self._fs, self._log_dir))
        checkpoint_lsns = _lsns(_fs.list_files(self._fs, self._checkpoint_dir))

        # Newest valid checkpoint first; remember the damaged ones newer than it.
        base_lsn: int | None = None
        base_table: pa.Table | None = None
        rejected: list[tuple[int, str]] = []
        for lsn in reversed(checkpoint_lsns):
            try:
                base_table = decode(_fs.read_file(self._fs, self.checkpoint_path(lsn)))
            except FrameError as exc:
                rejected.append((lsn, exc.reason))
                continue
            base_lsn = lsn
            break

        start = 0 if base_lsn is None else base_lsn
        replay = [lsn for lsn in log_lsns if lsn > start]
        entries: list[tuple[int, pa.Table]] = []
        torn: tuple[int, str] | None = None
        for index, lsn in enumerate(replay):
            expected = start + 1 + index
            if lsn != expected:
                raise StorageCorruptedError(
                    self.log_path(expected), f"log file is missing (the next one is LSN {lsn})"
                )
            try:
                entries.append((lsn, decode(_fs.read_file(self._fs, self.log_path(lsn)))))
            except FrameError as exc:
                if index < len(replay) - 1:
                    raise StorageCorruptedError(
                        self.log_path(lsn), f"{exc.reason}; later log files exist"
                    ) from exc
                torn = (lsn, exc.reason)
        last_lsn = entries[-1][0] if entries else start

        for lsn, reason in rejected:
            # A checkpoint is written only after the log files it covers; those are deleted
            # only once it is durable. Missing ones mean it was complete once and has decayed.
            if lsn > last_lsn:
                raise StorageCorruptedError(
                    self.checkpoint_path(lsn),
                    f"{reason}; the log files it replaced are gone (last valid LSN {last_lsn})",
                )

        # Everything checked: only now change the storage.
        if torn is not None:
            _log.warning(
                "discarding torn last log file %s (%s): its append was never acknowledged",
                self.log_path(torn[0]),
                torn[1],
            )
            _fs.delete_file(self._fs, self.log_path(torn[0]))
        for lsn, reason in rejected:
            _log.warning(
                "discarding damaged checkpoint %s (%s); using %s and the log instead",
                self.checkpoint_path(lsn),
                reason,
                "no checkpoint" if base_lsn is None else self.checkpoint_path(base_lsn),
            )
        self._logs = {lsn for lsn, _ in entries}
        self._checkpoints = set() if base_lsn is None else {base_lsn}
        self._delete_logs_upto(start, log_lsns)
        self._delete_checkpoints_except(base_lsn, checkpoint_lsns)
        self._next_lsn = last_lsn + 1
        self._checkpoint_lsn = base_lsn
        return RecoveredState(base_table if base_lsn is not None else None, entries)

    # -- writing ----------------------------------------------------------------------------

    def append(self, data: Batches) -> int:
        """Durably store ``data`` (a batch, a table, or batches of one schema); return its LSN.

        Returns once the file is durable. If it raises ``StorageUnavailableError`` the data is
        not acknowledged, no LSN was consumed, and the log stays usable: a later append (once
        the fault clears) gets the same LSN. ``InvalidArgumentError`` if ``data`` is not
        storable Arrow data (nothing written).
        """
        lsn = self._require_recovered()
        chunks = self._encode(data, "data")
        _fs.write_durable(self._fs, self.log_path(lsn), chunks)
        with self._lock:
            self._logs.add(lsn)
            self._next_lsn = lsn + 1
        return lsn

    def checkpoint(self, table: Batches, upto_lsn: int) -> None:
        """Durably store ``table`` as the whole state after log entries ``<= upto_lsn``.

        Then deletes those log files and every older checkpoint. ``upto_lsn`` must be at least
        0, newer than the current checkpoint and not beyond the last appended LSN. A crash at
        any point leaves a recoverable directory; a deletion the storage refuses is logged and
        retried by the next checkpoint or recovery. If it raises ``StorageUnavailableError``
        nothing was deleted and the previous checkpoint (plus the log) remains the state.
        """
        next_lsn = self._require_recovered()
        floor = -1 if self._checkpoint_lsn is None else self._checkpoint_lsn
        if not floor < upto_lsn < next_lsn:
            raise InvalidArgumentError(
                f"upto_lsn must be above the current checkpoint ({floor}) and below the next "
                f"LSN ({next_lsn}), got {upto_lsn}",
                None,
                "upto_lsn",
            )
        chunks = self._encode(table, "table")
        try:
            _fs.write_durable(self._fs, self.checkpoint_path(upto_lsn), chunks)
        except StorageUnavailableError:
            # A remnant may survive a refused clean-up: remember it so the next successful
            # checkpoint deletes it (recovery would also ignore or replace it).
            self._checkpoints.add(upto_lsn)
            raise
        # The new checkpoint is durable: only now may the files it replaces go.
        self._checkpoints.add(upto_lsn)
        self._checkpoint_lsn = upto_lsn
        with self._lock:
            stale = sorted(lsn for lsn in self._logs if lsn <= upto_lsn)
        self._delete_logs_upto(upto_lsn, stale)
        self._delete_checkpoints_except(upto_lsn, sorted(self._checkpoints))

    # -- inspection -------------------------------------------------------------------------

    def size_bytes(self) -> int:
        """Total size of the stored log and checkpoint files (lists the storage)."""
        return sum(self._stored().values())

    def file_count(self) -> int:
        """Number of stored log and checkpoint files (lists the storage)."""
        return len(self._stored())

    def _stored(self) -> dict[str, int]:
        stored: dict[str, int] = {}
        for directory in (self._log_dir, self._checkpoint_dir):
            for name, size in _fs.list_files(self._fs, directory).items():
                if _NAME.fullmatch(name):
                    stored[_fs.join(directory, name)] = size
        return stored

    # -- helpers ----------------------------------------------------------------------------

    def _require_recovered(self) -> int:
        if self._next_lsn is None:
            raise RuntimeError("DurableLog.recover() must be called before using the log")
        return self._next_lsn

    @staticmethod
    def _encode(data: Batches, argument: str) -> tuple[bytes, pa.Buffer]:
        try:
            return encode(data)
        except (TypeError, ValueError, pa.ArrowException) as exc:
            raise InvalidArgumentError(f"cannot store {argument}: {exc}", None, argument) from exc

    def _delete_logs_upto(self, upto_lsn: int, lsns: list[int]) -> None:
        # Order is irrelevant: a durable checkpoint at or above upto_lsn makes them all stale.
        for lsn in lsns:
            if lsn > upto_lsn:
                break
            deleted = _fs.delete_file(self._fs, self.log_path(lsn))
            with self._lock:
                if deleted:
                    self._logs.discard(lsn)
                else:
                    self._logs.add(lsn)

    def _delete_checkpoints_except(self, keep: int | None, lsns: list[int]) -> None:
        for lsn in lsns:
            if lsn == keep:
                continue
            if _fs.delete_file(self._fs, self.checkpoint_path(lsn)):
                self._checkpoints.discard(lsn)
            else:
                self._checkpoints.add(lsn)
