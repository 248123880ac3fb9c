"""Segment files: many log records appended to one file on the local disk.

Creating a file per append costs a directory fsync on every flush (profiled: 0.70 ms wall and
0.34 ms CPU per flush, against 0.27 ms / 0.065 ms for appending to a file that exists), so on
a local disk ``DurableLog`` appends its records to a *segment* and fsyncs only that file; the
directory is fsynced once, when a segment is created. Object stores cannot append and keep
one object per append (``raybus._storage.log``).

A segment ``<first lsn:020d>.seg`` is a sequence of records with consecutive LSNs starting at
the one in its name, with no file header::

    offset  size  field
    0       8     magic  b"RBSEGR\\x00\\x01"  (the last byte is the format version)
    8       8     LSN, unsigned little-endian
    16      8     payload length in bytes, unsigned little-endian
    24      4     CRC-32 of bytes 0..23 followed by the payload, unsigned little-endian
    28      n     payload: one Arrow IPC stream (as in ``raybus._storage.framing``)

A record may be preceded and followed by zero bytes up to the next multiple of ``BLOCK``
(4,096) bytes: the padding of a long record written with direct I/O (below). A record never
starts with a zero byte, so ``scan`` skips such a run when it ends at a block boundary or at the
end of the file.

A segment may end in zero bytes from a record boundary to the end of the file: space written
ahead of the appends (below). ``scan`` takes such a run as the end of the records, not as damage.

Only the end of a segment is ever written, and a record is acknowledged only after the fsync
that follows it, so a crash leaves at most one incomplete record, at the very end of the newest
segment. ``scan`` therefore tells a torn tail (nothing valid after the damage) from corruption
(a valid record after the damage, or a complete record whose CRC-32 matches but whose Arrow
payload cannot be read or whose LSN is not the next one: a torn write cannot leave either):
the first is dropped, the second refused. A whole record out of sequence is what a second
writer leaves (a partition's old process still appending after its restart) or a file
copied over another; cutting it off as torn would drop an acknowledged append.

Long records (``DIRECT_MIN_BYTES`` or more, header included) are written with ``O_DIRECT``,
where the file system has it: copied once into an aligned buffer of this process and handed to
the disk from there, at the next block boundary, padded with zeros to a whole block. Why: a
buffered write of a long record costs the kernel a page-cache page per 4 KiB, allocated and
copied into, and on the 2-core test machines that was most of a 64 KiB batch's flush (6.4 MB:
2.5-12.9 ms of CPU written buffered, 0.4 ms direct; 5.8 against 6.8-18.2 ms with the
``fdatasync``), on the partition's core. The fsync that acknowledges the record is the same.
Records of at most ``DIRECT_MAX_BYTES`` only: the buffer is kept for the next one. A file
system that refuses direct I/O (tmpfs, some overlays) gets buffered writes, as short records
always do.

Zeros written ahead. An append that makes the file longer makes its ``fdatasync`` write the
file system's metadata too (the new size and blocks: on ext4 a journal commit, a second write
and cache flush), where an append into blocks the file already has writes only the data. So an
append that goes past the zeros already there writes zeros after its record, before its one
``fdatasync``: as many as the segment holds (so an idle partition's segment takes little more
disk than its records), at least 16 KiB and at most ``ZERO_AHEAD_BYTES`` (1 MiB). The appends
that follow, until they reach the end of those zeros, change no metadata. Measured on this
project's 2-core ext4 test machine with ``DurableLog.append`` (``benchmarks/log_flush.py``,
each run the median of five interleaved rounds), against appends that grow the file: with 1 MiB
of zeros each time (three runs), one message of 1 KiB took 0.51-0.67x the time and 0.62-0.69x
the CPU, ten 0.52-0.61x, a hundred (110 KB; one append in nine also wrote the next MiB)
0.88-0.95x; as it is (from 16 KiB up, one run), one message 0.65x the time and 0.68x the CPU, a
hundred 0.87x and 0.81x. Space reserved with ``fallocate`` reads no faster in a bare loop (its
blocks are marked unwritten, and the first write into them changes metadata again), so the
zeros are written. They never go past the size at which the log rolls to a new segment
(``SegmentWriter(..., limit=)``), and a failed append's truncation takes them away with its
remnant (written again by the next append that needs them). Recovery leaves a segment's zeros
as they are: at most 1 MiB of disk per segment (and no more than its records past 16 KiB: a
drained queue's directory stays within the 64 KiB that ``tests/fault/test_storage_drain.py``
allows it), deleted with the segment once a checkpoint covers it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import re
import struct
import threading
from collections.abc import Iterator
from typing import NamedTuple

import pyarrow as pa
from isal.isal_zlib import crc32

from . import fs as _fs
from .framing import FrameError, Piece, UnreadablePayloadError, piece_size, read_stream

__all__ = [
    "BLOCK",
    "DIRECT_MAX_BYTES",
    "DIRECT_MIN_BYTES",
    "RECORD_HEADER_SIZE",
    "RECORD_MAGIC",
    "SEGMENT_NAME",
    "ZERO_AHEAD_BYTES",
    "ZERO_AHEAD_MIN_BYTES",
    "Scan",
    "SegmentWriter",
    "encode_record",
    "scan",
    "segment_name",
    "zeros_ahead",
]

_log = logging.getLogger("raybus.storage")

RECORD_MAGIC = b"RBSEGR\x00\x01"
_PREFIX = struct.Struct("<8sQQ")
_CRC = struct.Struct("<I")
RECORD_HEADER_SIZE = _PREFIX.size + _CRC.size  # 28
SEGMENT_NAME = re.compile(r"(\d{20})\.seg")
# Direct I/O: the alignment of a long record's offset, length and buffer (the largest logical
# block size of the disks it serves), and which records are long (module docstring). Read at
# each append: tests change them.
BLOCK = 4096
DIRECT_MIN_BYTES = 1 << 20
DIRECT_MAX_BYTES = 64 << 20
# Zeros written after a record that goes past the ones already there (module docstring): as
# many as the segment holds already, at least the first and at most the second. Read at each
# append: tests change them (0 turns it off).
ZERO_AHEAD_MIN_BYTES = 16 << 10
ZERO_AHEAD_BYTES = 1 << 20


def segment_name(first_lsn: int) -> str:
    return f"{first_lsn:020d}.seg"


def encode_record(lsn: int, payload: pa.Buffer | list[Piece]) -> bytes:
    """The header of the record holding ``payload`` (one buffer, or the pieces of one in
    order: ``raybus._storage.framing.serialize_pieces``) as log entry ``lsn``."""
    pieces = _pieces_of(payload)
    prefix = _PREFIX.pack(RECORD_MAGIC, lsn, sum(map(piece_size, pieces)))
    crc = crc32(prefix)
    for piece in pieces:
        crc = crc32(piece, crc)
    return prefix + _CRC.pack(crc & 0xFFFFFFFF)


def _pieces_of(payload: pa.Buffer | list[Piece]) -> list[Piece]:
    """A record's payload as its pieces in order (one buffer is one piece)."""
    return payload if isinstance(payload, list) else [payload]


def _record_at(buf: pa.Buffer, offset: int) -> tuple[int, pa.Buffer, int]:
    """``(lsn, payload, end offset)`` of the intact record at ``offset``; ``FrameError`` if the
    bytes there are not one (cut short, bad magic, bad checksum)."""
    left = buf.size - offset
    if left < RECORD_HEADER_SIZE:
        raise FrameError(f"{left} bytes left at offset {offset}, short of a record header")
    head = buf.slice(offset, RECORD_HEADER_SIZE).to_pybytes()
    magic, lsn, length = _PREFIX.unpack_from(head)
    if magic != RECORD_MAGIC:
        raise FrameError(f"bad record magic {magic!r} at offset {offset}")
    if length > left - RECORD_HEADER_SIZE:
        raise FrameError(
            f"record at offset {offset} announces {length} payload bytes, "
            f"{left - RECORD_HEADER_SIZE} left"
        )
    payload = buf.slice(offset + RECORD_HEADER_SIZE, length)
    (crc,) = _CRC.unpack_from(head, _PREFIX.size)
    actual = crc32(payload, crc32(head[: _PREFIX.size])) & 0xFFFFFFFF
    if actual != crc:
        raise FrameError(f"CRC-32 mismatch in record at offset {offset}")
    return lsn, payload, offset + RECORD_HEADER_SIZE + length


class Scan(NamedTuple):
    """What ``scan`` found in one segment."""

    entries: list[tuple[int, pa.Table]]
    """``(lsn, table)`` of the valid records above ``skip_upto``, in order."""
    last_lsn: int
    """LSN of the last valid record (``first_lsn - 1`` if there is none)."""
    valid_end: int
    """Byte offset just after the last valid record (before any padding that follows it)."""
    damage: str | None
    """Why the scan stopped before the end of the file; ``None`` if every byte was valid."""
    valid_after_damage: bool
    """A valid record with a later LSN follows the damage: corruption, not a torn tail."""
    whole: bool
    """The damage is a complete, checksummed record whose payload cannot be read or whose
    LSN is out of sequence: written whole, so corruption, not a torn tail."""


class MisplacedRecordError(FrameError):
    """A complete record whose CRC-32 matches but whose LSN is not the next one."""


def scan(buf: pa.Buffer, first_lsn: int, skip_upto: int) -> Scan:
    """Read the records of a segment whose first LSN is ``first_lsn``.

    Records at or below ``skip_upto`` (covered by a checkpoint) are checked but not decoded.
    Stops at the first bad record (or an LSN out of sequence, or an unreadable Arrow stream)
    and looks for an intact record beyond it.
    """
    entries: list[tuple[int, pa.Table]] = []
    offset, expected = 0, first_lsn
    valid_end = 0  # after the last valid record, not its padding: a torn tail is cut there
    damage: str | None = None
    whole = False
    while offset < buf.size:
        if _zeros_to_end(buf, offset):
            break  # written ahead of the appends (module docstring): the end of the records
        padded = _padding_end(buf, offset)
        if padded is not None:
            offset = padded
            continue
        try:
            lsn, payload, end = _record_at(buf, offset)
            if lsn != expected:
                raise MisplacedRecordError(
                    f"record at offset {offset} has LSN {lsn}, expected {expected}"
                )
            if lsn > skip_upto:
                entries.append((lsn, read_stream(payload)))
        except FrameError as exc:
            damage = exc.reason
            whole = isinstance(exc, (UnreadablePayloadError, MisplacedRecordError))
            break
        offset = valid_end = end
        expected += 1
    after = damage is not None and _valid_record_after(buf, offset + 1, expected)
    return Scan(entries, expected - 1, valid_end, damage, after, whole)


def _zeros_to_end(buf: pa.Buffer, offset: int) -> bool:
    """Whether every byte from ``offset`` to the end of the segment is zero (a record never
    starts with one, so a record's start is told by its first byte)."""
    if buf.slice(offset, 1).to_pybytes() != b"\x00":
        return False
    rest = buf.slice(offset)
    return bool(rest.equals(pa.py_buffer(bytes(rest.size))))


def _padding_end(buf: pa.Buffer, offset: int) -> int | None:
    """Where the zero padding at ``offset`` ends (the next block boundary, or the end of the
    file if that comes first), or None if there is none: no zero byte there, ``offset`` on a
    boundary already (a record starts there), or a byte that is not zero before the end."""
    if offset % BLOCK == 0 or buf.slice(offset, 1).to_pybytes() != b"\x00":
        return None
    end: int = min(buf.size, offset + BLOCK - offset % BLOCK)
    run = buf.slice(offset, end - offset).to_pybytes()
    if run.count(0) != len(run):
        return None
    return end


def _valid_record_after(buf: pa.Buffer, start: int, min_lsn: int) -> bool:
    """Whether an intact record with LSN >= ``min_lsn`` starts anywhere after ``start``.

    A torn append leaves garbage only at the end; an intact record after a bad one means the
    bad one was damaged after it had been acknowledged. (A message body holding a forged
    record could make a torn tail look like corruption: recovery then refuses to start, it
    never returns the forged data.)
    """
    data = buf.to_pybytes()
    hit = data.find(RECORD_MAGIC, start)
    while hit >= 0:
        try:
            lsn, _, _ = _record_at(buf, hit)
        except FrameError:
            pass
        else:
            if lsn >= min_lsn:
                return True
        hit = data.find(RECORD_MAGIC, hit + 1)
    return False


def _sync_data(fd: int) -> None:
    """Make the file's data durable, and its size: ``fdatasync`` where the platform has it
    (Linux), which skips the timestamps ``fsync`` also writes. Appends change only the data
    and the size, so nothing a reader needs is left out; on this project's ext4 test machines
    it took 0.35 ms after a 110 KB append against 0.41-0.48 for ``fsync`` (p50 of 2,000).
    Looked up at each call, so a test that replaces either one reaches this path."""
    sync = getattr(os, "fdatasync", None)
    (os.fsync if sync is None else sync)(fd)


def _pwrite_all(fd: int, data: bytes | pa.Buffer, offset: int) -> None:
    """Write all of ``data`` at ``offset``: an explicit offset, so a retry after a failed
    append overwrites its remnant instead of following it."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        if hasattr(os, "pwrite"):
            done += os.pwrite(fd, view[done:], offset + done)
        else:  # Windows
            os.lseek(fd, offset + done, os.SEEK_SET)
            done += os.write(fd, view[done:])


class _AlignedBuffer:
    """This process's buffer for direct writes (page-aligned: an anonymous map), kept for the
    next long record; one writer at a time (a second gets a map of its own, closed after)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._map: mmap.mmap | None = None

    @contextlib.contextmanager
    def filled(self, length: int, header: bytes, pieces: list[Piece]) -> Iterator[memoryview]:
        """A view of ``length`` aligned bytes holding ``header``, then ``pieces``, then
        zeros, for the ``with`` block."""
        if not self._lock.acquire(blocking=False):
            with mmap.mmap(-1, length) as own, self._fill(own, length, header, pieces) as view:
                yield view
            return
        try:
            if self._map is None or len(self._map) < length:
                if self._map is not None:
                    self._map.close()
                self._map = mmap.mmap(-1, length)
            with self._fill(self._map, length, header, pieces) as view:
                yield view
        finally:
            self._lock.release()

    @staticmethod
    def _fill(buf: mmap.mmap, length: int, header: bytes, pieces: list[Piece]) -> memoryview:
        view = memoryview(buf)[:length]
        at = len(header)
        view[:at] = header
        for piece in pieces:
            data = memoryview(piece).cast("B")
            view[at : at + len(data)] = data
            at += len(data)
        view[at:] = bytes(length - at)
        return view


_aligned = _AlignedBuffer()
_zero_block = b""  # the longest run of zeros written ahead so far, kept for the next ones


def zeros_ahead(offset: int) -> int:
    """How many zeros an append whose record ends at ``offset`` writes after it, when that is
    past the zeros the segment had (at most up to the size it rolls at)."""
    return min(ZERO_AHEAD_BYTES, max(ZERO_AHEAD_MIN_BYTES, offset))


def _zeros(length: int) -> memoryview:
    """``length`` zero bytes (a view of one kept buffer: no allocation per append; two logs'
    threads may ask at once, so each reads the buffer once)."""
    global _zero_block
    block = _zero_block
    if len(block) < length:
        block = _zero_block = bytes(length)
    return memoryview(block)[:length]


class SegmentWriter:
    """The segment being appended to: writes records at its end and fsyncs them.

    Not thread-safe: ``DurableLog`` calls it under its append lock. A failed append truncates
    the segment back to its last acknowledged record; if even that fails the next append
    truncates first, so no unacknowledged bytes ever sit before acknowledged ones.
    """

    def __init__(self, path: str, first_lsn: int, limit: int) -> None:
        """Create (or empty: any file of that name holds only unacknowledged LSNs) segment
        ``path``; its directory entry becomes durable with the first append. ``limit``: the
        size at which the log stops appending to it (no zeros are written past it)."""
        self.path = path
        self.first_lsn = first_lsn
        self.end = 0  # bytes acknowledged
        self.zeroed = 0  # the file's bytes up to here exist: zeros past ``end`` (docstring)
        self._limit = limit
        self.records = 0
        self._dir_synced = False
        self._dirty = False  # bytes beyond ``end`` may exist (a truncation failed)
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            raise _fs.unavailable("creating", path, exc) from exc
        # For long records (module docstring): opened at the first one; -1 once the file
        # system refused direct I/O, or where the platform has none.
        self._direct_fd: int | None = None if hasattr(os, "O_DIRECT") else -1

    @property
    def dirty(self) -> bool:
        """Bytes of a failed append may follow the acknowledged ones (never close it then)."""
        return self._dirty

    def append(self, header: bytes, payload: pa.Buffer | list[Piece]) -> None:
        """Write one record after the last one; return once it (and the segment's name) is
        durable. ``payload`` is one buffer or the pieces of one, in order. Raises
        ``StorageUnavailableError``; then nothing of it is acknowledged."""
        pieces = _pieces_of(payload)
        size = len(header) + sum(map(piece_size, pieces))
        try:
            if self._dirty:
                os.ftruncate(self._fd, self.end)
                self._dirty = False
            offset = None
            if DIRECT_MIN_BYTES <= size <= DIRECT_MAX_BYTES:
                offset = self._write_direct(header, pieces, size)
            if offset is None:
                _pwrite_all(self._fd, header, self.end)
                offset = self.end + len(header)
                for piece in pieces:
                    _pwrite_all(self._fd, piece, offset)
                    offset += piece_size(piece)
            zeroed = self._zero_ahead(offset) if offset > self.zeroed else self.zeroed
            _sync_data(self._fd)
            if not self._dir_synced:
                _fs.fsync_dir(os.path.dirname(self.path))
                self._dir_synced = True
        except OSError as exc:
            error = _fs.unavailable("appending to", self.path, exc)
            self._discard_tail()
            raise error from exc
        self.end = offset
        self.zeroed = zeroed
        self.records += 1

    def _zero_ahead(self, offset: int) -> int:
        """Write zeros from ``offset`` (the end of the record just written, past the zeros the
        file had) for the appends to come (module docstring); return where they end. A write
        the disk refuses leaves the zeros it got (a run of zeros at the end is no record) and
        costs the record nothing: its own ``fdatasync`` decides."""
        ahead = zeros_ahead(offset)
        end = min(offset + ahead, self._limit)
        if end <= offset:
            return offset
        try:
            _pwrite_all(self._fd, _zeros(end - offset), offset)
        except OSError as exc:
            _log.debug("writing zeros ahead in %s failed: %s", self.path, exc)
            return offset
        return end

    def _write_direct(self, header: bytes, pieces: list[Piece], size: int) -> int | None:
        """Write the record with direct I/O at the block boundary at or after ``end``, padded
        with zeros to a whole block; return where the padding ends (not yet fsynced). None if
        the file system refuses direct I/O (nothing written: write it buffered). Raises
        ``OSError`` as a write does."""
        if self._direct_fd is None:
            try:
                self._direct_fd = os.open(self.path, os.O_WRONLY | os.O_DIRECT)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._direct_fd = -1
        if self._direct_fd < 0:
            return None
        start = -(-self.end // BLOCK) * BLOCK
        length = -(-size // BLOCK) * BLOCK
        done = 0
        with _aligned.filled(length, header, pieces) as view:
            try:
                while done < length:
                    done += os.pwrite(self._direct_fd, view[done:], start + done)
            except OSError as exc:
                if exc.errno != errno.EINVAL or done:
                    raise
                os.close(self._direct_fd)  # an alignment this disk does not take: buffered
                self._direct_fd = -1
                return None
        return start + length

    def _discard_tail(self) -> None:
        # The truncation takes the zeros too; if it fails, the next append (or cut_remnant)
        # truncates to ``end`` before anything else: either way none are left past ``end``.
        self.zeroed = self.end
        try:
            os.ftruncate(self._fd, self.end)
        except OSError as exc:
            self._dirty = True
            _log.warning(
                "could not truncate %s to %d bytes after a failed append (%s); the next "
                "append or recovery in this process truncates first",
                self.path,
                self.end,
                exc,
            )
            return
        try:
            os.fsync(self._fd)
        except OSError:
            # Best effort: the next successful append fsyncs the new size anyway. Until then
            # a crash may bring back the failed record: a failed write's outcome is "maybe".
            pass

    def cut_remnant(self) -> None:
        """Cut off what a failed append left after the acknowledged records, if a truncation
        failed before (read back, a complete remnant would pass for an entry). Raises
        ``StorageUnavailableError`` if the truncation fails again."""
        if not self._dirty:
            return
        try:
            os.ftruncate(self._fd, self.end)
        except OSError as exc:
            raise _fs.unavailable("truncating", self.path, exc) from exc
        self._dirty = False

    def close(self) -> None:
        direct = self._direct_fd
        for fd in [self._fd] if direct is None or direct < 0 else [self._fd, direct]:
            try:
                os.close(fd)
            except OSError as exc:  # already durable or truncated: nothing is lost
                _log.warning("closing %s failed: %s", self.path, exc)
