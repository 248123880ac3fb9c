"""Durable storage for partitions: an append-only log of Arrow record batches with checkpoints.

Works on any ``pyarrow.fs`` filesystem (a local directory, ``file://``, ``s3://``, ``gs://``,
``hdfs://``): on the local disk appends go to segment files (one fdatasync per append), elsewhere
each append is an object of its own, since object stores cannot append. Modules:

* ``framing``: the file format (magic, length, CRC-32, Arrow IPC stream);
* ``segments``: the segment format (records with LSN, length, CRC-32) and its writer;
* ``fs``: ``open_storage`` and durable writes (fsync of file and directory on local disk);
* ``log``: ``DurableLog`` with ``recover``, ``append``, ``checkpoint``;
* ``errors``: ``StorageUnavailableError`` (retryable) and ``StorageCorruptedError``.

Plain Python, no Ray: the partition actor owns one ``DurableLog`` and serialises calls to it.
"""

from __future__ import annotations

from .errors import StorageCorruptedError, StorageUnavailableError
from .framing import Batches
from .fs import open_storage
from .log import DurableLog, RecoveredState

__all__ = [
    "Batches",
    "DurableLog",
    "RecoveredState",
    "StorageCorruptedError",
    "StorageUnavailableError",
    "open_storage",
]
