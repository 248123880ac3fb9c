"""Durable storage for partitions: an append-only log of Arrow record batches with checkpoints.

Works on any ``pyarrow.fs`` filesystem (a local directory, ``file://``, ``s3://``, ``gs://``,
``hdfs://``) without ever appending to a file, so object stores work. Modules:

* ``framing``: the file format (magic, length, CRC-32, Arrow IPC stream);
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
