"""Reading and damaging a durable log's segment files in tests, as a crash or a bad disk would.

Record boundaries are found by the record magic: fine for test data, whose message bodies never
contain it (``raybus._storage.segments`` itself walks records by their lengths).
"""

from __future__ import annotations

from pathlib import Path

from raybus._storage.segments import RECORD_MAGIC


def segments(log_dir: Path) -> list[Path]:
    """The segment files of a log directory, oldest first."""
    return sorted(log_dir.glob("*.seg"))


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
    data = path.read_bytes()
    last = record_starts(data)[-1]
    keep = last + (len(data) - last) // 2
    path.write_bytes(data[:keep])
    return last


def flip_in_record(path: Path, index: int) -> bytes:
    """Invert one payload byte of record ``index`` of segment ``path``; returns the new content."""
    data = bytearray(path.read_bytes())
    starts = [*record_starts(bytes(data)), len(data)]
    data[(starts[index] + starts[index + 1]) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return bytes(data)
