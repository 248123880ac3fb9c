"""Filesystem access for durable storage: open a ``storage_path``, write files durably, clean up.

Works on any ``pyarrow.fs.FileSystem`` and never appends to a file, because object stores
(S3, GCS) cannot. Durability points:

* **local disk** (``LocalFileSystem``, or a ``SubTreeFileSystem`` over one): the file is written
  with Python's ``open``, then ``flush`` + ``os.fsync`` of the file, then ``os.fsync`` of its
  directory so the new name survives a power cut. pyarrow's own local streams never fsync.
* **anything else**: ``open_output_stream`` written in full and closed without error, which on
  an object store is a completed PUT (or multipart upload): the object is durable and whole.

Every ``OSError`` or pyarrow error becomes ``StorageUnavailableError`` carrying the path and
errno.
"""

from __future__ import annotations

import logging
import os

import pyarrow as pa
import pyarrow.fs as pafs

from ..exceptions import InvalidArgumentError
from .errors import StorageUnavailableError

__all__ = [
    "delete_file",
    "fsync_dir",
    "join",
    "list_files",
    "local_path",
    "make_dir",
    "open_storage",
    "read_file",
    "unavailable",
    "write_durable",
]

_log = logging.getLogger("raybus.storage")

# The errors a filesystem operation may raise because of the storage (pyarrow's ArrowIOError
# is OSError; ArrowException covers the rest, e.g. an object store's cancelled request).
_FS_ERRORS = (OSError, pa.ArrowException)


def open_storage(storage_path: str, *subdirs: str) -> tuple[pafs.FileSystem, str]:
    """Map a ``storage_path`` plus sub-directories to ``(filesystem, directory)``.

    A path without a scheme is a local directory (made absolute); anything with ``://`` goes
    through ``pyarrow.fs.FileSystem.from_uri`` (``file://``, ``s3://``, ``gs://``, ``hdfs://``,
    ...). Nothing is created. Raises ``InvalidArgumentError`` for a malformed path or an
    unsupported scheme, ``StorageUnavailableError`` if the filesystem cannot be reached.
    """
    if not storage_path:
        raise InvalidArgumentError("storage_path must not be empty", None, "storage_path")
    for sub in subdirs:
        parts = sub.split("/")
        if not sub or any(part in ("", ".", "..") for part in parts):
            raise InvalidArgumentError(
                f"storage sub-directory {sub!r} must be non-empty, without '.', '..' or '//'",
                None,
                "subdirs",
            )
    if "://" in storage_path:
        try:
            fs, base = pafs.FileSystem.from_uri(storage_path)
        except (ValueError, NotImplementedError) as exc:
            raise InvalidArgumentError(
                f"cannot open storage_path {storage_path!r}: {exc}", None, "storage_path"
            ) from exc
        except _FS_ERRORS as exc:
            raise unavailable("opening", storage_path, exc) from exc
    else:
        fs, base = pafs.LocalFileSystem(), os.path.abspath(storage_path)
    return fs, join(base, *subdirs)


def join(*parts: str) -> str:
    """Join path parts with ``/`` (pyarrow's separator on every filesystem), skipping empties."""
    out = ""
    for part in parts:
        if not part:
            continue
        out = part if not out else out.rstrip("/") + "/" + part.lstrip("/")
    return out


def local_path(fs: pafs.FileSystem, path: str) -> str | None:
    """The real OS path of ``path`` if ``fs`` is the local disk (possibly under sub-trees)."""
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    if isinstance(fs, pafs.SubTreeFileSystem):
        return local_path(fs.base_fs, join(fs.base_path, path))
    return None


def unavailable(action: str, path: str, exc: BaseException) -> StorageUnavailableError:
    """The ``StorageUnavailableError`` for ``exc``, raised while ``action`` on ``path``."""
    code = exc.errno if isinstance(exc, OSError) else None
    return StorageUnavailableError(f"{action} {path} failed: {exc}", path, code)


def fsync_dir(path: str) -> None:
    """Make the entries of local directory ``path`` (new or renamed files) durable."""
    if os.name == "nt":  # Windows cannot open a directory; NTFS journals metadata itself.
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dir(fs: pafs.FileSystem, path: str) -> None:
    """Create directory ``path`` with its parents; on local disk the new entries are durable."""
    local = local_path(fs, path)
    try:
        if local is None:
            fs.create_dir(path, recursive=True)
            return
        # Remember which directories are new: each new entry lives in its parent, so the
        # deepest existing ancestor and every new directory are fsynced after creation.
        created: list[str] = []
        probe = os.path.abspath(local)
        while not os.path.isdir(probe):
            created.append(probe)
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
        if not created:
            return
        os.makedirs(local, exist_ok=True)
        for directory in [probe, *reversed(created)]:
            fsync_dir(directory)
    except _FS_ERRORS as exc:
        raise unavailable("creating directory", path, exc) from exc


def write_durable(fs: pafs.FileSystem, path: str, chunks: tuple[bytes, pa.Buffer]) -> None:
    """Write ``chunks`` as the whole new content of ``path``; return once it is durable.

    Replaces any existing file of that name. On failure raises ``StorageUnavailableError`` after
    trying to delete what was written; if that also fails the remnant stays (a torn file that
    the framing checksum rejects, or a complete one if only the fsync or an object store's
    answer failed: ``DurableLog.recover`` removes that before reading, if it knows).
    """
    local = local_path(fs, path)
    try:
        if local is not None:
            with open(local, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(os.path.dirname(local))
        else:
            # Closing the stream is the commit point of an object store; an error raised by
            # close() propagates out of the ``with`` block like one raised by write().
            with fs.open_output_stream(path, compression=None) as out:
                for chunk in chunks:
                    out.write(chunk)
    except _FS_ERRORS as exc:
        error = unavailable("writing", path, exc)
        _discard(fs, path, local)
        raise error from exc


def _discard(fs: pafs.FileSystem, path: str, local: str | None) -> None:
    try:
        if local is not None:
            os.remove(local)
        else:
            fs.delete_file(path)
    except FileNotFoundError:
        return
    except _FS_ERRORS as exc:
        _log.warning(
            "could not remove %s after a failed write (%s); until a later write replaces it "
            "a torn remnant is rejected by its checksum, a complete one reads back as written",
            path,
            exc,
        )
        return
    if local is not None:
        try:
            fsync_dir(os.path.dirname(local))
        except OSError:
            # Best effort: the next successful write fsyncs this directory anyway, and a
            # torn remnant resurrected by a crash is rejected by its checksum.
            pass


def delete_file(fs: pafs.FileSystem, path: str) -> bool:
    """Delete ``path`` if it exists; ``False`` (and a warning) if the storage refused.

    Deletions are clean-up of files recovery already ignores, so they are not fsynced: a
    deletion lost in a crash is repeated at the next recovery.
    """
    local = local_path(fs, path)
    try:
        if local is not None:
            os.remove(local)
        else:
            fs.delete_file(path)
    except FileNotFoundError:
        return True
    except _FS_ERRORS as exc:
        _log.warning("could not delete %s (%s); will retry later", path, exc)
        return False
    return True


def list_files(fs: pafs.FileSystem, directory: str) -> dict[str, int]:
    """``{file name: size in bytes}`` of the regular files directly in ``directory``.

    A missing directory lists as empty. Raises ``StorageUnavailableError``.
    """
    try:
        infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    except _FS_ERRORS as exc:
        raise unavailable("listing", directory, exc) from exc
    return {
        info.base_name: int(info.size or 0) for info in infos if info.type == pafs.FileType.File
    }


def read_file(fs: pafs.FileSystem, path: str) -> pa.Buffer:
    """The whole content of ``path``. Raises ``StorageUnavailableError``."""
    try:
        with fs.open_input_stream(path, compression=None) as f:
            return f.read_buffer()
    except _FS_ERRORS as exc:
        raise unavailable("reading", path, exc) from exc
