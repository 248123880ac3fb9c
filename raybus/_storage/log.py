"""``DurableLog``: an append-only log of Arrow record batches with checkpoints, on any filesystem.

Layout under the log's directory::

    log/<lsn:020d>.seg            local disk: a segment of appended records, the first has LSN
                                  <lsn>, the rest follow without gaps (``raybus._storage.segments``)
    log/<lsn:020d>.arrow          object stores (and logs written before segments): one file
                                  per append, LSN 1, 2, 3, ... with no gaps
    checkpoint/<lsn:020d>.arrow   the caller's whole state after applying log entries <= lsn

A log is the LSN-ordered sequence of its segments and per-append files; recovery reads both,
so a directory written by an older raybus (files only) recovers and then goes on in segments.
Files are framed by ``raybus._storage.framing`` (length + CRC-32 + Arrow IPC stream), segment
records by ``raybus._storage.segments`` (LSN + length + CRC-32 + Arrow IPC stream).

Guarantees:

* **Durability**: ``append`` and ``checkpoint`` return only once their data is durable. Local
  disk: fdatasync of the segment (fsync where the platform has no fdatasync; and fsync of the
  directory when the append created the segment) or fsync of the file and its directory;
  elsewhere a completed object write.
* **Order**: LSNs increase by one per successful ``append``; recovery returns log entries in LSN
  order. A failed append consumes no LSN: the next append reuses it (and replaces any remnant).
* **Recovery** returns the newest valid checkpoint and every log entry after it: exactly the
  acknowledged appends. The one exception: if an append failed *after* its bytes reached the
  storage (e.g. the fsync failed, or an object store's answer was lost) and removing them
  failed too, and the process then crashed before another append, that last unacknowledged
  entry may come back (a failed write's outcome is "maybe", as everywhere). Without a crash
  it never does: a log recovered again in the same process knows which LSNs it never
  acknowledged and removes what a failed append left of them before reading, or raises
  ``StorageUnavailableError`` if the storage refuses.
* **Crash safety of checkpoints**: the files a checkpoint replaces are deleted only after it is
  durable, so a torn checkpoint is skipped in favour of the previous one plus the log.
* **Corruption** is never papered over: only the *end* of the log may be torn (a crash
  mid-append): a damaged last per-append file is deleted, a damaged end of the last segment
  cut off, with a warning. Damage anywhere else (an earlier file or segment, or a bad record
  followed by an intact one), a missing LSN, or a file or record that is complete and passes
  its CRC-32 but whose Arrow payload cannot be read or (a segment record) whose LSN is out of
  sequence (a torn write cannot leave either: it was written whole, so it may have been
  acknowledged, or a second writer left it) raises ``StorageCorruptedError``.
* **Bounded size**: a segment is closed once it reaches ``segment_bytes`` (its file may be up
  to 1 MiB longer than its records while it is written: zeros written ahead of the appends,
  ``raybus._storage.segments``, which recovery reads as the segment's end); a checkpoint deletes
  every file and segment it covers entirely (closing the segment being written if it covers
  all of it), so a drained log shrinks to its checkpoint.

One writer per directory. ``append`` and ``checkpoint`` may run at the same time in two
threads (one call of each at a time: the partition writes a checkpoint in the background while
it goes on appending); ``recover`` must run alone.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from ..exceptions import InvalidArgumentError
from . import fs as _fs
from .errors import StorageCorruptedError, StorageUnavailableError
from .framing import (
    Batches,
    FrameError,
    Piece,
    UnreadablePayloadError,
    decode,
    frame_header,
    serialize,
    serialize_pieces,
)
from .segments import SEGMENT_NAME, SegmentWriter, encode_record, scan, segment_name

__all__ = ["CHECKPOINT_DIR", "DEFAULT_SEGMENT_BYTES", "LOG_DIR", "DurableLog", "RecoveredState"]

_log = logging.getLogger("raybus.storage")
_T = TypeVar("_T")

LOG_DIR = "log"
CHECKPOINT_DIR = "checkpoint"
DEFAULT_SEGMENT_BYTES = 16 * 1024 * 1024
# Appends of at least this many bytes of Arrow data are written as pieces, not one buffer.
_PIECES_FROM = 1 << 20
_NAME = re.compile(r"(\d{20})\.arrow")
# Why a complete, checksummed entry that cannot be used (its payload unreadable, its LSN out
# of sequence) is damage, not a torn end.
_WHOLE = "it is complete and its checksum matches, so no torn write left it"


class RecoveredState(NamedTuple):
    """What ``DurableLog.recover`` found: replay ``entries`` on top of ``checkpoint``."""

    checkpoint: pa.Table | None
    """The newest valid checkpoint's table, or ``None`` if there is none."""
    entries: list[tuple[int, pa.Table]]
    """``(lsn, table)`` of every log entry after the checkpoint, in LSN order, gap-free."""


class _Source(NamedTuple):
    """One stored piece of the log: a per-append file or a segment, by its first LSN."""

    first: int
    segment: bool


class _Torn(NamedTuple):
    """The damaged end of the log that recovery cuts off: ``keep`` bytes stay (0: delete)."""

    path: str
    keep: int
    reason: str


def _file_name(lsn: int) -> str:
    """The name of a per-append log file or a checkpoint (``_NAME`` reads it back)."""
    return f"{lsn:020d}.arrow"


def _lsns(names: dict[str, int], pattern: re.Pattern[str] = _NAME) -> list[int]:
    """Sorted LSNs of the well-named files in a listing; other names are ignored."""
    return sorted(int(m.group(1)) for name in names if (m := pattern.fullmatch(name)))


class DurableLog:
    """A durable, append-only log of Arrow data with checkpoints in ``directory`` on ``fs``.

    Call ``recover()`` once before ``append`` or ``checkpoint``: it reads what is stored and sets
    the next LSN. See the module docstring for the guarantees. ``segment_bytes`` is the size at
    which a segment is closed and the next append starts a new one; ``None`` writes one file
    per append even on a local disk (the layout object stores always get).
    """

    def __init__(
        self,
        fs: pafs.FileSystem,
        directory: str,
        *,
        segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        if segment_bytes is not None and segment_bytes <= 0:
            raise InvalidArgumentError(
                f"segment_bytes must be positive, got {segment_bytes}", None, "segment_bytes"
            )
        self._fs = fs
        self._dir = directory
        self._log_dir = _fs.join(directory, LOG_DIR)
        self._checkpoint_dir = _fs.join(directory, CHECKPOINT_DIR)
        local = _fs.local_path(fs, self._log_dir)
        # Segments need appends and fsync: the local disk only.
        self._segment_bytes = segment_bytes if local is not None else None
        self._local_log_dir = local
        self._next_lsn: int | None = None  # None until recover() ran
        self._checkpoint_lsn: int | None = None
        # First LSNs of the files and segments this log knows are stored (including
        # leftovers whose deletion failed), so checkpoint() can delete them without listing.
        self._logs: set[int] = set()
        self._segments: set[int] = set()
        self._checkpoints: set[int] = set()
        self._active: SegmentWriter | None = None  # the segment appends go to
        # Guards _logs, _segments and _next_lsn between an append and a concurrent checkpoint.
        self._lock = threading.Lock()
        # Held by an append for its whole write, and by a checkpoint closing the active segment
        # (re-entrant so that ``appending_to`` may be asked while holding it).
        self._append_lock = threading.RLock()

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
    def segment_bytes(self) -> int | None:
        """The size at which segments roll; ``None`` when each append writes its own file."""
        return self._segment_bytes

    @property
    def appending_to(self) -> str | None:
        """The path of the segment the next append writes to; ``None`` if that append will
        create a new one (or writes a file of its own)."""
        with self._append_lock:
            active = self._active
            if active is None or self._segment_bytes is None:
                return None
            if active.end >= self._segment_bytes and not active.dirty:
                return None
            return active.path

    @property
    def next_lsn(self) -> int:
        """The LSN the next successful ``append`` will get (requires ``recover()``)."""
        return self._require_recovered()

    @property
    def checkpoint_lsn(self) -> int | None:
        """The LSN of the current checkpoint, ``None`` if there is none (or before recovery)."""
        return self._checkpoint_lsn

    def log_path(self, lsn: int) -> str:
        """The per-append file of ``lsn`` (object stores, and logs written before segments)."""
        return _fs.join(self._log_dir, _file_name(lsn))

    def segment_path(self, first_lsn: int) -> str:
        return _fs.join(self._log_dir, segment_name(first_lsn))

    def checkpoint_path(self, lsn: int) -> str:
        return _fs.join(self._checkpoint_dir, _file_name(lsn))

    def _source_path(self, source: _Source) -> str:
        return self.segment_path(source.first) if source.segment else self.log_path(source.first)

    # -- recovery ---------------------------------------------------------------------------

    def recover(self) -> RecoveredState:
        """Read the stored state: the newest valid checkpoint and the log entries after it.

        Creates the directory if it does not exist. Cuts off (with a warning) a torn end of
        the log, deletes torn or superseded checkpoints, and deletes the files and segments a
        checkpoint covers. Raises ``StorageCorruptedError`` (changing nothing) if the log is
        damaged anywhere but at its end, its end holds a complete, checksummed entry that
        cannot be used (its payload unreadable, its LSN out of sequence), an LSN is missing,
        or a damaged checkpoint cannot be replaced by an older one plus the log;
        ``StorageUnavailableError`` if the storage cannot be read, or (called again) a remnant
        of a failed append cannot be removed. May be called again; it re-reads the storage,
        and the next append starts a new segment.
        """
        # Called again (after a failed append, say), this log knows that no LSN from
        # ``unacknowledged`` on was acknowledged: whatever a failed append left of one must
        # go before reading, or a complete remnant would read back as an entry.
        unacknowledged = self._next_lsn
        with self._append_lock:
            if self._active is not None:
                self._active.cut_remnant()  # raises: it stays active for the next attempt
                self._active.close()
                self._active = None
        _fs.make_dir(self._fs, self._log_dir)
        _fs.make_dir(self._fs, self._checkpoint_dir)
        names = _fs.list_files(self._fs, self._log_dir)
        if unacknowledged is not None:
            names = self._remove_remnants(names, unacknowledged)
        sources = sorted(
            [_Source(lsn, False) for lsn in _lsns(names)]
            + [_Source(lsn, True) for lsn in _lsns(names, SEGMENT_NAME)]
        )
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
        entries, last_lsn, torn, stale = self._read_log(sources, start)

        for lsn, reason in rejected:
            # A checkpoint is written only after the log entries it covers; those are deleted
            # only once it is durable. Missing ones mean it was complete once and has decayed.
            if lsn > last_lsn:
                raise StorageCorruptedError(
                    self.checkpoint_path(lsn),
                    f"{reason}; the log files it replaced are gone (last valid LSN {last_lsn})",
                )

        # Everything checked: only now change the storage.
        if torn is not None:
            self._cut_torn_end(torn)
        for lsn, reason in rejected:
            _log.warning(
                "discarding damaged checkpoint %s (%s); using %s and the log instead",
                self.checkpoint_path(lsn),
                reason,
                "no checkpoint" if base_lsn is None else self.checkpoint_path(base_lsn),
            )
        kept = [s for s in sources if s not in stale]
        if torn is not None and torn.keep == 0:
            kept.remove(sources[-1])
        self._logs = {s.first for s in kept if not s.segment}
        self._segments = {s.first for s in kept if s.segment}
        self._checkpoints = set() if base_lsn is None else {base_lsn}
        self._next_lsn = last_lsn + 1
        self._checkpoint_lsn = base_lsn
        self._delete_sources(stale)
        self._delete_checkpoints_except(base_lsn, checkpoint_lsns)
        return RecoveredState(base_table if base_lsn is not None else None, entries)

    def _remove_remnants(self, names: dict[str, int], unacknowledged: int) -> dict[str, int]:
        """``names`` without the per-append files from LSN ``unacknowledged`` on, which are
        deleted first (what failed appends left). Segments need nothing: the active one
        was cut back to its acknowledged records, and a later one holds none."""
        kept = dict(names)
        for lsn in _lsns(names):
            if lsn < unacknowledged:
                continue
            path = self.log_path(lsn)
            if not _fs.delete_file(self._fs, path):
                raise StorageUnavailableError(
                    f"cannot remove {path}, left by an append that failed: recovered, it "
                    "would return that unacknowledged entry",
                    path,
                )
            del kept[_file_name(lsn)]
        return kept

    def _read_log(
        self, sources: list[_Source], start: int
    ) -> tuple[list[tuple[int, pa.Table]], int, _Torn | None, list[_Source]]:
        """``(entries after start, last valid LSN, torn end, sources a checkpoint covers)``.

        Raises ``StorageCorruptedError`` for damage before the end or a missing LSN.
        """
        entries: list[tuple[int, pa.Table]] = []
        stale: list[_Source] = []
        torn: _Torn | None = None
        expected: int | None = None  # the LSN the next source must start with
        for index, source in enumerate(sources):
            last = index == len(sources) - 1
            upper = None if last else sources[index + 1].first - 1
            path = self._source_path(source)
            if upper is not None and upper <= start:
                stale.append(source)  # covered by the checkpoint: not even read
                continue
            if expected is None:
                expected = min(source.first, start + 1)
            if source.first != expected:
                raise StorageCorruptedError(
                    self._source_path(_Source(expected, source.segment)),
                    f"log entry {expected} is missing (the next file starts at {source.first})",
                )
            found, keep, expected, damage = self._read_source(source, start, last)
            entries.extend(found)
            if damage is not None:
                torn = _Torn(path, keep, damage)
            if upper is not None and expected - 1 != upper:
                raise StorageCorruptedError(
                    path,
                    f"log entry {expected} is missing: this file ends at LSN {expected - 1}, "
                    f"the next one starts at {upper + 1}",
                )
            if expected - 1 <= start and torn is None:
                stale.append(source)
        return entries, max(start, (expected or 1) - 1), torn, stale

    def _read_source(
        self, source: _Source, start: int, last: bool
    ) -> tuple[list[tuple[int, pa.Table]], int, int, str | None]:
        """``(entries after start, valid bytes, next LSN, damage)`` of one source; damage (a
        torn end) is allowed only in the last one, and only if it can be torn: a complete
        entry whose checksum matches was written whole, whatever its payload holds."""
        path = self._source_path(source)
        data = _fs.read_file(self._fs, path)
        if not source.segment:
            try:
                table = decode(data)
            except FrameError as exc:
                if isinstance(exc, UnreadablePayloadError):
                    raise StorageCorruptedError(path, f"{exc.reason}; {_WHOLE}") from exc
                if not last:
                    raise StorageCorruptedError(
                        path, f"{exc.reason}; later log files exist"
                    ) from exc
                return [], 0, source.first, exc.reason
            found = [(source.first, table)] if source.first > start else []
            return found, data.size, source.first + 1, None
        result = scan(data, source.first, start)
        if result.damage is not None and (not last or result.valid_after_damage or result.whole):
            if result.whole:
                why = _WHOLE
            elif result.valid_after_damage:
                why = "later records exist"
            else:
                why = "later files exist"
            raise StorageCorruptedError(path, f"{result.damage}; {why}")
        if result.damage is None and result.valid_end == 0 and last:
            return [], 0, source.first, "empty segment"  # created, never written
        return result.entries, result.valid_end, result.last_lsn + 1, result.damage

    def _cut_torn_end(self, torn: _Torn) -> None:
        if torn.keep == 0:
            _log.warning(
                "discarding torn last log file %s (%s): its append was never acknowledged",
                torn.path,
                torn.reason,
            )
            _fs.delete_file(self._fs, torn.path)
            return
        _log.warning(
            "discarding torn end of last log segment %s after byte %d (%s): its append was "
            "never acknowledged",
            torn.path,
            torn.keep,
            torn.reason,
        )
        # Later segments follow this one: the cut must be durable before they are written.
        local = _fs.local_path(self._fs, torn.path)
        try:
            if local is None:
                data = _fs.read_file(self._fs, torn.path).slice(0, torn.keep)
                _fs.write_durable(self._fs, torn.path, (b"", data))
                return
            with open(local, "r+b") as f:
                f.truncate(torn.keep)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise _fs.unavailable("truncating", torn.path, exc) from exc

    # -- writing ----------------------------------------------------------------------------

    def append(self, data: Batches) -> int:
        """Durably store ``data`` (a batch, a table, or batches of one schema); return its LSN.

        Returns once the data is durable. If it raises ``StorageUnavailableError`` the data is
        not acknowledged, no LSN was consumed, and the log stays usable: a later append (once
        the fault clears) gets the same LSN. ``InvalidArgumentError`` if ``data`` is not
        storable Arrow data (nothing written).
        """
        lsn = self._require_recovered()
        if self._segment_bytes is None:
            _fs.write_durable(self._fs, self.log_path(lsn), self._encode(data, "data"))
            with self._lock:
                self._logs.add(lsn)
                self._next_lsn = lsn + 1
            return lsn
        payload = self._serialize_record(data)
        header = encode_record(lsn, payload)
        with self._append_lock:
            active = self._active
            if active is not None and active.end >= self._segment_bytes and not active.dirty:
                active.close()  # full: roll over to a new segment
                active = self._active = None
            if active is None:
                assert self._local_log_dir is not None  # segments only on the local disk
                path = _fs.join(self._local_log_dir, segment_name(lsn))
                active = self._active = SegmentWriter(path, lsn, self._segment_bytes)
                with self._lock:
                    self._segments.add(lsn)
            active.append(header, payload)
            with self._lock:
                self._next_lsn = lsn + 1
        return lsn

    def checkpoint(self, table: Batches, upto_lsn: int) -> None:
        """Durably store ``table`` as the whole state after log entries ``<= upto_lsn``.

        Then deletes the log files and segments it covers entirely, and every older
        checkpoint. ``upto_lsn`` must be at least 0, newer than the current checkpoint and not
        beyond the last appended LSN. A crash at any point leaves a recoverable directory; a
        deletion the storage refuses is logged and retried by the next checkpoint or recovery.
        If it raises ``StorageUnavailableError`` nothing was deleted and the previous
        checkpoint (plus the log) remains the state.
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
        self._delete_sources(self._covered(upto_lsn))
        self._delete_checkpoints_except(upto_lsn, sorted(self._checkpoints))

    def _covered(self, upto_lsn: int) -> list[_Source]:
        """The stored files and segments that hold at least one entry and only entries
        ``<= upto_lsn``; closes the active segment if it is one of them (the next append
        starts a new one).

        A source starting above ``upto_lsn`` is never covered, even if it holds nothing yet:
        the segment a failed append created stays active and empty, and the append retried
        once this returns (the lock is released before the deletion) writes that LSN into
        that very file, which a deletion would then take with it."""
        with self._append_lock:
            active = self._active
            # Its records are first_lsn .. next_lsn - 1: all covered, and at least one.
            if (
                active is not None
                and active.records > 0
                and self._require_recovered() - 1 <= upto_lsn
            ):
                active.close()
                active = self._active = None
            active_first = None if active is None else active.first_lsn
            with self._lock:
                sources = sorted(
                    [_Source(lsn, False) for lsn in self._logs]
                    + [_Source(lsn, True) for lsn in self._segments]
                )
                next_lsn = self._require_recovered()
        covered: list[_Source] = []
        for index, source in enumerate(sources):
            upper = sources[index + 1].first - 1 if index + 1 < len(sources) else next_lsn - 1
            if source.segment and source.first == active_first:
                continue  # appends go on into it
            if source.first <= upto_lsn and upper <= upto_lsn:
                covered.append(source)
        return covered

    # -- inspection -------------------------------------------------------------------------

    def size_bytes(self) -> int:
        """Total size of the stored log and checkpoint files (lists the storage)."""
        return sum(self._stored().values())

    def file_count(self) -> int:
        """Number of stored log files, segments and checkpoints (lists the storage)."""
        return len(self._stored())

    def _stored(self) -> dict[str, int]:
        stored: dict[str, int] = {}
        for directory in (self._log_dir, self._checkpoint_dir):
            for name, size in _fs.list_files(self._fs, directory).items():
                if _NAME.fullmatch(name) or (
                    directory == self._log_dir and SEGMENT_NAME.fullmatch(name)
                ):
                    stored[_fs.join(directory, name)] = size
        return stored

    # -- helpers ----------------------------------------------------------------------------

    def _require_recovered(self) -> int:
        if self._next_lsn is None:
            raise RuntimeError("DurableLog.recover() must be called before using the log")
        return self._next_lsn

    @staticmethod
    def _encode(data: Batches, argument: str) -> tuple[bytes, pa.Buffer]:
        payload = DurableLog._serialize(data, argument, serialize)
        return frame_header(payload), payload

    @staticmethod
    def _serialize(data: Batches, argument: str, how: Callable[[Batches], _T]) -> _T:
        """``how(data)``; ``InvalidArgumentError`` naming ``argument`` if it is no Arrow data
        that can be stored."""
        try:
            return how(data)
        except (TypeError, ValueError, pa.ArrowException) as exc:
            raise InvalidArgumentError(f"cannot store {argument}: {exc}", None, argument) from exc

    @staticmethod
    def _serialize_record(data: Batches) -> pa.Buffer | list[Piece]:
        """A segment record's payload: long data as pieces (``serialize_pieces``: the
        columns' buffers are copied only by the write; for 100 bodies of 64 KiB one copy of
        6.5 MB fewer), short data as one buffer (fewer calls)."""
        # The buffers' total, not ``nbytes`` (7 us: it measures slices; an estimate does).
        nbytes = data.get_total_buffer_size() if isinstance(data, (pa.Table, pa.RecordBatch)) else 0
        if nbytes < _PIECES_FROM:
            return DurableLog._serialize(data, "data", serialize)
        return DurableLog._serialize(data, "data", serialize_pieces)

    def _delete_sources(self, sources: list[_Source]) -> None:
        # Order is irrelevant: a durable checkpoint covering them all makes them stale.
        for source in sources:
            deleted = _fs.delete_file(self._fs, self._source_path(source))
            known = self._segments if source.segment else self._logs
            with self._lock:
                if deleted:
                    known.discard(source.first)
                else:
                    known.add(source.first)

    def _delete_checkpoints_except(self, keep: int | None, lsns: list[int]) -> None:
        for lsn in lsns:
            if lsn == keep:
                continue
            if _fs.delete_file(self._fs, self.checkpoint_path(lsn)):
                self._checkpoints.discard(lsn)
            else:
                self._checkpoints.add(lsn)
