"""DurableLog behaviour on every kind of filesystem: round trips, checkpoints, crash recovery."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pyarrow as pa
import pytest
from storage_helpers import (
    batch,
    flip,
    framed,
    put,
    recovered_values,
    reopen,
    table,
    tear,
    values_of,
)

from raybus._storage import DurableLog, StorageCorruptedError
from raybus._storage.framing import HEADER_SIZE, frame_header
from raybus.exceptions import InvalidArgumentError

MakeLog = Callable[[], DurableLog]


def test_empty_directory_recovers_to_nothing_and_starts_at_lsn_1(make_log: MakeLog) -> None:
    log = make_log()
    _, state = reopen(log)
    assert state.checkpoint is None
    assert state.entries == []
    assert log.next_lsn == 1
    assert log.checkpoint_lsn is None
    assert log.file_count() == 0
    assert log.size_bytes() == 0


def test_appends_recover_in_lsn_order_and_next_lsn_continues(make_log: MakeLog) -> None:
    log = make_log()
    assert log.append(batch([1, 2])) == 1
    assert log.append(table([3])) == 2
    assert log.append([batch([4]), batch([5, 6])]) == 3

    fresh, state = reopen(log)
    assert state.checkpoint is None
    assert [lsn for lsn, _ in state.entries] == [1, 2, 3]
    assert [values_of(t) for _, t in state.entries] == [[1, 2], [3], [4, 5, 6]]
    assert fresh.next_lsn == 4
    assert fresh.append(batch([7])) == 4
    assert fresh.file_count() == 4


def test_checkpoint_replaces_covered_log_files_and_shrinks_storage(make_log: MakeLog) -> None:
    log = make_log()
    for i in range(5):
        log.append(table(list(range(i * 100, i * 100 + 100))))
    before = log.size_bytes()
    log.checkpoint(table([]), 5)  # a drained queue: nothing left
    assert log.checkpoint_lsn == 5
    assert log.file_count() == 1
    assert log.size_bytes() < before

    log.append(batch([7]))
    log.append(batch([8]))
    fresh, state = reopen(log)
    assert state.checkpoint is not None and values_of(state.checkpoint) == []
    assert [lsn for lsn, _ in state.entries] == [6, 7]
    assert recovered_values(state) == [7, 8]
    assert fresh.next_lsn == 8
    assert fresh.checkpoint_lsn == 5


def test_checkpoint_below_the_last_lsn_keeps_later_log_files(make_log: MakeLog) -> None:
    log = make_log()
    for v in range(4):
        log.append(batch([v]))
    log.checkpoint(table([0, 1]), 2)
    log.checkpoint(table([0, 1, 2]), 3)
    _, state = reopen(log)
    assert [lsn for lsn, _ in state.entries] == [4]
    assert recovered_values(state) == [0, 1, 2, 3]
    assert log.file_count() == 2  # checkpoint 3 and log 4


def test_checkpoint_of_initial_state_at_lsn_0(make_log: MakeLog) -> None:
    log = make_log()
    log.checkpoint(table([42]), 0)
    log.append(batch([43]))
    _, state = reopen(log)
    assert recovered_values(state) == [42, 43]


@pytest.mark.parametrize("upto", [-1, 3, 1])
def test_checkpoint_refuses_lsns_outside_the_log(make_log: MakeLog, upto: int) -> None:
    log = make_log()
    log.append(batch([1]))
    log.append(batch([2]))
    log.checkpoint(table([1]), 1)
    files = log.file_count()
    with pytest.raises(InvalidArgumentError) as info:
        log.checkpoint(table([1]), upto)  # below 0, beyond the last LSN, or not newer
    assert info.value.argument == "upto_lsn"
    assert log.file_count() == files


def test_unstorable_data_is_refused_before_writing(make_log: MakeLog) -> None:
    log = make_log()
    with pytest.raises(InvalidArgumentError):
        log.append([])
    with pytest.raises(InvalidArgumentError):
        log.append([batch([1]), pa.record_batch({"other": ["x"]})])
    assert log.next_lsn == 1
    assert log.file_count() == 0


def test_using_the_log_before_recover_raises() -> None:
    log = DurableLog.from_storage_path("/nonexistent/never/created")
    with pytest.raises(RuntimeError):
        log.append(batch([1]))


@pytest.mark.parametrize("damage", ["truncate", "flip_payload", "flip_header", "empty"])
def test_torn_last_log_file_is_discarded_and_earlier_ones_kept(
    make_log: MakeLog, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    log = make_log()
    for v in range(3):
        log.append(batch([v]))
    fs, last = log.filesystem, log.log_path(3)
    if damage == "truncate":
        tear(fs, last, 3)
    elif damage == "flip_payload":
        flip(fs, last, HEADER_SIZE + 40)
    elif damage == "flip_header":
        flip(fs, last, 10)  # inside the length field
    else:
        put(fs, last, b"")

    with caplog.at_level(logging.WARNING, logger="raybus.storage"):
        fresh, state = reopen(log)
    assert [lsn for lsn, _ in state.entries] == [1, 2]
    assert recovered_values(state) == [0, 1]
    assert "torn last log file" in caplog.text
    assert fresh.next_lsn == 3  # the torn LSN is reused
    assert fresh.file_count() == 2
    assert fresh.append(batch([9])) == 3
    assert recovered_values(reopen(fresh)[1]) == [0, 1, 9]


def test_damaged_log_file_before_valid_ones_is_corruption(make_log: MakeLog) -> None:
    log = make_log()
    for v in range(3):
        log.append(batch([v]))
    flip(log.filesystem, log.log_path(2), HEADER_SIZE + 40)
    with pytest.raises(StorageCorruptedError) as info:
        reopen(log)
    assert info.value.path == log.log_path(2)
    assert info.value.retryable is False
    assert log.file_count() == 3  # nothing deleted: the evidence stays


def test_checksummed_but_unreadable_last_log_file_is_corruption(make_log: MakeLog) -> None:
    """A last file of the announced length whose checksum matches was written whole, so it
    is no torn write: an unreadable Arrow payload in it is damage to an acknowledged append,
    and recovery refuses rather than delete it and hand its LSN out again."""
    log = make_log()
    for v in range(2):
        log.append(batch([v]))
    payload = pa.py_buffer(b"\xff" * 64)  # e.g. written by a format this reader cannot read
    put(log.filesystem, log.log_path(3), frame_header(payload) + payload.to_pybytes())
    with pytest.raises(StorageCorruptedError, match="Arrow") as info:
        reopen(log)
    assert info.value.path == log.log_path(3)
    assert log.file_count() == 3  # nothing deleted: the evidence stays


def test_missing_log_file_is_corruption(make_log: MakeLog) -> None:
    log = make_log()
    for v in range(3):
        log.append(batch([v]))
    log.filesystem.delete_file(log.log_path(2))
    with pytest.raises(StorageCorruptedError, match="missing"):
        reopen(log)


def test_torn_newest_checkpoint_falls_back_to_previous_checkpoint_and_log(
    make_log: MakeLog,
) -> None:
    log = make_log()
    log.append(batch([1]))
    log.checkpoint(table([1]), 1)
    log.append(batch([2]))
    log.append(batch([3]))
    # A crash while checkpoint 3 was being written: it is torn, log files 2 and 3 still exist.
    put(log.filesystem, log.checkpoint_path(3), framed([1, 2, 3])[:-5])

    fresh, state = reopen(log)
    assert fresh.checkpoint_lsn == 1
    assert [lsn for lsn, _ in state.entries] == [2, 3]
    assert recovered_values(state) == [1, 2, 3]
    assert fresh.file_count() == 3  # the torn checkpoint was deleted
    fresh.checkpoint(table([1, 2, 3]), 3)  # and the same checkpoint can be retried
    assert recovered_values(reopen(fresh)[1]) == [1, 2, 3]


def test_torn_first_checkpoint_falls_back_to_the_whole_log(make_log: MakeLog) -> None:
    log = make_log()
    log.append(batch([1]))
    log.append(batch([2]))
    put(log.filesystem, log.checkpoint_path(2), framed([1, 2])[:30])
    fresh, state = reopen(log)
    assert state.checkpoint is None
    assert fresh.checkpoint_lsn is None
    assert recovered_values(state) == [1, 2]


def test_decayed_checkpoint_whose_log_files_are_gone_is_corruption(make_log: MakeLog) -> None:
    log = make_log()
    log.append(batch([1]))
    log.append(batch([2]))
    log.checkpoint(table([1, 2]), 2)
    flip(log.filesystem, log.checkpoint_path(2), HEADER_SIZE + 40)
    with pytest.raises(StorageCorruptedError) as info:
        reopen(log)
    assert info.value.path == log.checkpoint_path(2)


def test_leftovers_of_an_interrupted_checkpoint_clean_up_are_ignored(make_log: MakeLog) -> None:
    log = make_log()
    for v in range(3):
        log.append(batch([v]))
    log.checkpoint(table([0]), 1)
    # As if the process died after writing checkpoint 3 but before deleting what it replaces.
    put(log.filesystem, log.checkpoint_path(3), framed([0, 1, 2]))
    fresh, state = reopen(log)
    assert fresh.checkpoint_lsn == 3
    assert state.entries == []
    assert recovered_values(state) == [0, 1, 2]
    assert fresh.file_count() == 1


def test_files_with_unexpected_names_are_ignored(make_log: MakeLog) -> None:
    log = make_log()
    log.append(batch([1]))
    fs = log.filesystem
    put(fs, log.log_path(2) + ".tmp", b"junk")
    put(fs, log.log_path(1).rsplit("/", 1)[0] + "/README", b"junk")
    put(fs, log.checkpoint_path(7).replace("00000000000000000007", "7"), b"junk")
    fresh, state = reopen(log)
    assert recovered_values(state) == [1]
    assert fresh.next_lsn == 2
    assert fresh.file_count() == 1
