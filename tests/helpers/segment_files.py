"""Reading and damaging a durable log's segment files in tests, as a crash or a bad disk would.

Record boundaries are found by the record magic: fine for test data, whose message bodies never
contain it (``raybus._storage.segments`` itself walks records by their lengths).

A segment's records may be followed by the zeros its writer wrote ahead of its appends (up to
``ZERO_AHEAD_BYTES``): damage meant for the records is done to them (``records_end``), not to
those zeros.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from raybus._storage.segments import RECORD_MAGIC, scan


def segments(log_dir: Path) -> list[Path]:
    """The segment files of a log directory, oldest first."""
    return sorted(log_dir.glob("*.seg"))


def records_end(path: Path) -> int:
    """Where the intact records of segment ``path`` end: before the zeros written ahead of
    them, or before the first damage."""
    return scan(pa.py_buffer(path.read_bytes()), int(path.stem), 1 << 62).valid_end


def write_at_records_end(path: Path, data: bytes) -> None:
    """Write ``data`` where segment ``path``'s next record would go, over the zeros written
    ahead (as the writer does; appending after them would leave a gap no writer leaves)."""
    at = records_end(path)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def record_starts(data: bytes) -> list[int]:
    """Byte offsets of the records in a segment's content."""
    starts, hit = [], data.find(RECORD_MAGIC)
    while hit >= 0:
        starts.append(hit)
        hit = data.find(RECORD_MAGIC, hit + 1)
    return starts


def tear_last_record(path: Path) -> int:
    """Cut the last record of segment ``path`` in half (a crash mid-append); returns how many
    bytes the segment keeps."""
    data = path.read_bytes()[: records_end(path)]
    last = record_starts(data)[-1]
    keep = last + (len(data) - last) // 2
    path.write_bytes(data[:keep])
    return last


def flip_in_record(path: Path, index: int) -> bytes:
    """Invert one payload byte of record ``index`` of segment ``path``; returns the new content."""
    data = bytearray(path.read_bytes())
    end = records_end(path)
    starts = [*record_starts(bytes(data[:end])), end]
    data[(starts[index] + starts[index + 1]) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return bytes(data)
