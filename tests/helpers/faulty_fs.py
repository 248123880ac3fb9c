"""A fault-injecting filesystem for storage tests (shared by the unit and fault suites).

It behaves as an object store: no append, no fsync; faults are switched on by attributes.
By default it keeps files in memory; the fault suite wraps a partition actor's real local
filesystem with it (``FaultyHandler(inner)``) to make a running broker's writes fail.
"""

from __future__ import annotations

import errno
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = ["FaultyHandler", "faulty_fs"]


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
    ``delete_errno``: ``delete_file`` fails with it.
    ``unreachable``: every listing, read and directory creation fails with EIO (the storage
    cannot be reached at all, e.g. a network outage in front of an object store).
    """

    def __init__(self, inner: pafs.FileSystem | None = None) -> None:
        self.inner = pafs._MockFileSystem() if inner is None else inner
        self.write_errno: int | None = None
        self.write_budget = 0
        self.delete_errno: int | None = None
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
        if self.delete_errno is not None:
            raise OSError(self.delete_errno, "injected fault", path)
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
