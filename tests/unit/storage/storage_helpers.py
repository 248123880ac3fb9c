"""Helpers for the storage tests: Arrow data builders, crash simulation, a faulty filesystem.

``FaultyFS`` is a ``pyarrow.fs.PyFileSystem`` over the in-memory mock filesystem whose writes
and deletes can be made to fail; it is not local, so ``DurableLog`` must use plain output
streams on it (and it refuses ``open_append_stream`` to prove nothing appends).
"""

from __future__ import annotations

import errno
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from faulty_fs import FaultyHandler as FaultyHandler
from faulty_fs import faulty_fs as faulty_fs

from raybus._storage import DurableLog, RecoveredState
from raybus._storage.framing import encode


def table(values: list[int]) -> pa.Table:
    return pa.table({"v": pa.array(values, pa.int64())})


def batch(values: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"v": pa.array(values, pa.int64())})


def values_of(data: pa.Table) -> list[int]:
    return list(data.column("v").to_pylist())


def recovered_values(state: RecoveredState) -> list[int]:
    """The checkpoint's values followed by every replayed entry's values."""
    out = [] if state.checkpoint is None else values_of(state.checkpoint)
    for _, entry in state.entries:
        out.extend(values_of(entry))
    return out


def framed(values: list[int]) -> bytes:
    header, payload = encode(table(values))
    return header + payload.to_pybytes()


def put(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``data`` as the whole file ``path`` (no durability: a crash's leftovers)."""
    with fs.open_output_stream(path) as out:
        out.write(data)


def get(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return bytes(f.read())


def tear(fs: pafs.FileSystem, path: str, drop: int) -> None:
    """Cut the last ``drop`` bytes off ``path``, as a crash mid-write would."""
    data = get(fs, path)
    put(fs, path, data[: max(0, len(data) - drop)])


def flip(fs: pafs.FileSystem, path: str, offset: int) -> None:
    """Invert one byte of ``path`` (offset taken modulo its size)."""
    data = bytearray(get(fs, path))
    data[offset % len(data)] ^= 0xFF
    put(fs, path, bytes(data))


def reopen(log: DurableLog) -> tuple[DurableLog, RecoveredState]:
    """Drop ``log`` (a crash loses nothing durable) and recover a fresh one on the same files,
    writing the same layout."""
    fresh = DurableLog(log.filesystem, log.directory, segment_bytes=log.segment_bytes)
    return fresh, fresh.recover()


def short_open(budget: int) -> Any:
    """An ``open`` whose files accept ``budget`` bytes, then fail with ENOSPC."""

    class ShortFile:
        def __init__(self, path: str, mode: str) -> None:
            self._f = open(path, mode)  # noqa: SIM115 - closed by __exit__
            self._budget = budget

        def write(self, data: Any) -> int:
            view = memoryview(data).cast("B")
            if len(view) > self._budget:
                self._f.write(view[: self._budget])
                self._budget = 0
                raise OSError(errno.ENOSPC, "No space left on device")
            self._budget -= len(view)
            return self._f.write(view)

        def __enter__(self) -> ShortFile:
            return self

        def __exit__(self, *exc: object) -> None:
            self._f.close()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._f, name)

    return ShortFile
