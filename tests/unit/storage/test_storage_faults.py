"""Storage faults (ENOSPC, EIO) in append and checkpoint: typed, retryable, nothing half-kept."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from storage_helpers import (
    batch,
    faulty_fs,
    recovered_values,
    reopen,
    short_open,
    table,
    values_of,
)

from raybus._storage import DurableLog, StorageUnavailableError
from raybus._storage import fs as storage_fs
from raybus._storage.framing import decode


def _enospc(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def _local_log(tmp_path: Path) -> DurableLog:
    log = DurableLog(pafs.LocalFileSystem(), str(tmp_path / "store"), segment_bytes=None)
    log.recover()
    return log


def test_fsync_failure_on_local_disk_raises_retryable_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _local_log(tmp_path)
    log.append(batch([1]))
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(StorageUnavailableError) as info:
        log.append(batch([2]))
    assert info.value.errno == errno.ENOSPC
    assert info.value.retryable is True
    assert info.value.path == log.log_path(2)
    assert log.next_lsn == 2
    assert log.file_count() == 1  # the complete but unsynced file was removed
    assert recovered_values(reopen(log)[1]) == [1]

    monkeypatch.undo()  # the disk has room again
    assert log.append(batch([3])) == 2
    assert recovered_values(reopen(log)[1]) == [1, 3]


def test_short_write_whose_remnant_cannot_be_removed_is_discarded_as_torn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = _local_log(tmp_path)
    log.append(batch([1]))
    monkeypatch.setattr(storage_fs, "open", short_open(50), raising=False)
    monkeypatch.setattr(os, "remove", _enospc)  # the clean-up fails too
    with (
        caplog.at_level(logging.WARNING, logger="raybus.storage"),
        pytest.raises(StorageUnavailableError) as info,
    ):
        log.append(batch([2]))
    assert info.value.errno == errno.ENOSPC
    assert "could not remove" in caplog.text
    monkeypatch.undo()
    assert Path(log.log_path(2)).stat().st_size == 50  # the remnant is there...

    fresh, state = reopen(log)  # ...and a crash now loses only the unacknowledged append
    assert recovered_values(state) == [1]
    assert fresh.next_lsn == 2
    assert not Path(log.log_path(2)).exists()


def test_complete_remnant_of_a_failed_append_is_not_read_back_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file of a failed append is complete (only the directory fsync failed) and cannot
    be removed. Recovering again in the same process must not return that unacknowledged
    entry: it removes the file first, and raises while the storage refuses."""
    log = _local_log(tmp_path)
    log.append(batch([1]))
    with monkeypatch.context() as patch:
        patch.setattr(storage_fs, "fsync_dir", _enospc)
        patch.setattr(os, "remove", _enospc)
        with pytest.raises(StorageUnavailableError):
            log.append(batch([2]))
        assert values_of(decode(Path(log.log_path(2)).read_bytes())) == [2]  # complete
        with pytest.raises(StorageUnavailableError, match="append that failed") as info:
            log.recover()  # the remnant cannot go yet
        assert info.value.path == log.log_path(2)
    assert recovered_values(log.recover()) == [1]
    assert not Path(log.log_path(2)).exists()
    assert log.append(batch([3])) == 2
    assert recovered_values(reopen(log)[1]) == [1, 3]


def test_later_append_replaces_a_remnant_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _local_log(tmp_path)
    monkeypatch.setattr(storage_fs, "open", short_open(30), raising=False)
    monkeypatch.setattr(os, "remove", _enospc)
    with pytest.raises(StorageUnavailableError):
        log.append(batch([1]))
    monkeypatch.undo()
    assert log.append(batch([2])) == 1
    assert log.append(batch([3])) == 2
    assert recovered_values(reopen(log)[1]) == [2, 3]


def test_failed_checkpoint_deletes_nothing_and_can_be_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _local_log(tmp_path)
    log.append(batch([1]))
    log.append(batch([2]))
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(StorageUnavailableError) as info:
        log.checkpoint(table([1, 2]), 2)
    assert info.value.path == log.checkpoint_path(2)
    assert log.checkpoint_lsn is None
    monkeypatch.undo()
    assert log.file_count() == 2  # both log files, no checkpoint
    assert recovered_values(reopen(log)[1]) == [1, 2]

    log.checkpoint(table([1, 2]), 2)
    assert log.file_count() == 1
    assert recovered_values(reopen(log)[1]) == [1, 2]


def test_unwritable_directory_is_unavailable_on_recover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "makedirs", _enospc)
    with pytest.raises(StorageUnavailableError) as info:
        DurableLog(pafs.LocalFileSystem(), str(tmp_path / "store")).recover()
    assert info.value.errno == errno.ENOSPC


@pytest.mark.parametrize("budget", [0, 10, 60])
def test_object_store_write_failure_raises_and_later_append_reuses_lsn(budget: int) -> None:
    fs, faults = faulty_fs()
    log = DurableLog(fs, "bucket/q")
    log.recover()
    log.append(batch([1]))
    faults.write_errno, faults.write_budget = errno.ENOSPC, budget
    with pytest.raises(StorageUnavailableError) as info:
        log.append(batch([2]))
    assert info.value.errno == errno.ENOSPC
    assert info.value.retryable is True
    assert log.file_count() == 1  # the partial object committed by close() was deleted
    assert recovered_values(reopen(log)[1]) == [1]

    faults.write_errno = None
    assert log.append(batch([3])) == 2
    assert recovered_values(reopen(log)[1]) == [1, 3]


def test_object_store_partial_object_that_cannot_be_deleted_is_discarded_as_torn() -> None:
    fs, faults = faulty_fs()
    log = DurableLog(fs, "bucket/q")
    log.recover()
    log.append(batch([1]))
    faults.write_errno, faults.write_budget = errno.EIO, 40
    faults.delete_errno = errno.EACCES
    with pytest.raises(StorageUnavailableError) as info:
        log.append(batch([2]))
    assert info.value.errno == errno.EIO
    assert log.file_count() == 2  # the partial object is stuck...
    faults.write_errno = faults.delete_errno = None
    fresh, state = reopen(log)  # ...until recovery rejects it by its checksum
    assert recovered_values(state) == [1]
    assert fresh.file_count() == 1


def test_refused_deletion_after_checkpoint_is_retried_by_the_next_one() -> None:
    fs, faults = faulty_fs()
    log = DurableLog(fs, "bucket/q")
    log.recover()
    log.append(batch([1]))
    faults.delete_errno = errno.EACCES
    log.checkpoint(table([1]), 1)  # durable; the clean-up is refused but the call succeeds
    assert log.file_count() == 2
    assert recovered_values(reopen(log)[1]) == [1]

    faults.delete_errno = None
    log.append(batch([2]))
    log.checkpoint(table([1, 2]), 2)
    assert log.file_count() == 1
    assert recovered_values(reopen(log)[1]) == [1, 2]


@pytest.mark.parametrize("stuck", [False, True], ids=["removed", "remnant-stuck"])
def test_failed_checkpoint_keeps_the_previous_checkpoint(stuck: bool) -> None:
    fs, faults = faulty_fs()
    log = DurableLog(fs, "bucket/q")
    log.recover()
    log.append(batch([1]))
    log.checkpoint(table([1]), 1)
    log.append(batch([2]))
    faults.write_errno, faults.write_budget = errno.ENOSPC, 30
    faults.delete_errno = errno.EIO if stuck else None
    with pytest.raises(StorageUnavailableError):
        log.checkpoint(table([1, 2]), 2)
    faults.write_errno = faults.delete_errno = None
    assert log.checkpoint_lsn == 1
    fresh, state = reopen(log)
    assert fresh.checkpoint_lsn == 1
    assert recovered_values(state) == [1, 2]


def test_next_checkpoint_deletes_the_remnant_of_a_failed_one() -> None:
    fs, faults = faulty_fs()
    log = DurableLog(fs, "bucket/q")
    log.recover()
    log.append(batch([1]))
    log.append(batch([2]))
    faults.write_errno, faults.write_budget = errno.ENOSPC, 30
    faults.delete_errno = errno.EIO
    with pytest.raises(StorageUnavailableError):
        log.checkpoint(table([1]), 1)
    faults.write_errno = faults.delete_errno = None
    assert log.file_count() == 3  # two log files and the stuck partial checkpoint
    log.checkpoint(table([1, 2]), 2)
    assert log.file_count() == 1
    assert recovered_values(reopen(log)[1]) == [1, 2]
