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
    """Drop ``log`` (a crash loses nothing durable) and recover a fresh one on the same files."""
    fresh = DurableLog(log.filesystem, log.directory)
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
        # Like an object store closing a stream after an error: what was written is committed.
        self.closed = True
        self._inner.close()


class FaultyHandler(pafs.FileSystemHandler):
    """Delegates to an in-memory ``_MockFileSystem``; faults are switched on by attributes.

    ``write_errno``: every output stream fails with it after ``write_budget`` bytes.
    ``delete_errno``: ``delete_file`` fails with it.
    """

    def __init__(self) -> None:
        self.inner = pafs._MockFileSystem()
        self.write_errno: int | None = None
        self.write_budget = 0
        self.delete_errno: int | None = None

    def get_type_name(self) -> str:
        return "faulty-mock"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: Any) -> bool:
        return self is other

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.inner.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.inner.delete_dir_contents("", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        if self.delete_errno is not None:
            raise OSError(self.delete_errno, "injected fault", path)
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.inner.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.inner.open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self.inner.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        out = self.inner.open_output_stream(path)
        if self.write_errno is None:
            return out
        return pa.PythonFile(_FailingWriter(out, self.write_errno, self.write_budget), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        raise AssertionError("storage must never append to a file")


def faulty_fs() -> tuple[pafs.FileSystem, FaultyHandler]:
    handler = FaultyHandler()
    return pafs.PyFileSystem(handler), handler
