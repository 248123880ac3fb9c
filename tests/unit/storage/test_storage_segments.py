"""DurableLog on the local disk: records appended to segment files, rolled at a size limit.

What a crash or a bad disk can do to segments, and what recovery makes of it: a torn end of the
last segment is cut off; damage followed by intact records, or in an earlier segment, and a
missing segment are corruption. Logs written one file per append (before segments) recover and
go on in segments. A failed append (ENOSPC, EIO) leaves nothing that recovery would return.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from segment_files import (
    flip_in_record,
    record_starts,
    records_end,
    segments,
    write_at_records_end,
)
from storage_helpers import batch, recovered_values, reopen, table

from raybus._storage import DurableLog, StorageCorruptedError, StorageUnavailableError
from raybus._storage import fs as storage_fs
from raybus._storage import log as storage_log
from raybus._storage import segments as seg
from raybus._storage.framing import encode
from raybus._storage.segments import RECORD_MAGIC, encode_record
from raybus.exceptions import InvalidArgumentError


def _log(tmp_path: Path, segment_bytes: int | None = 1 << 20) -> DurableLog:
    log = DurableLog(pafs.LocalFileSystem(), str(tmp_path / "store"), segment_bytes=segment_bytes)
    log.recover()
    return log


def _log_dir(tmp_path: Path) -> Path:
    return tmp_path / "store" / "log"


def _fail(code: int) -> Any:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError(code, os.strerror(code))

    return fail


def _short_pwrite(budget: int, code: int) -> Any:
    """``os.pwrite`` that lands at most ``budget`` bytes of the call, then fails."""
    real = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        view = memoryview(data).cast("B")
        real(fd, view[: min(budget, len(view) - 1)], offset)
        raise OSError(code, os.strerror(code))

    return pwrite


def _pwrite_failing_from(call: int, code: int) -> Any:
    """``os.pwrite`` whose ``call``-th call and every later one fail (the earlier ones land)."""
    real = os.pwrite
    calls = [0]

    def pwrite(fd: int, data: Any, offset: int) -> int:
        calls[0] += 1
        if calls[0] >= call:
            raise OSError(code, os.strerror(code))
        return real(fd, data, offset)

    return pwrite


def _long_table(values: list[int]) -> pa.Table:
    """A table past ``_PIECES_FROM`` when patched down: a binary column with distinct bytes."""
    return pa.table(
        {
            "v": pa.array(values, pa.int64()),
            "b": pa.array([bytes([v % 256]) * 5000 for v in values], pa.binary()),
        }
    )


@pytest.fixture
def in_pieces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every append is written as pieces; the sizes of those written so are recorded."""
    monkeypatch.setattr(storage_log, "_PIECES_FROM", 0)
    written: list[int] = []
    real = storage_log.serialize_pieces

    def spy(data: Any) -> Any:
        pieces = real(data)
        written.append(len(pieces))
        return pieces

    monkeypatch.setattr(storage_log, "serialize_pieces", spy)
    return written


def test_a_long_append_written_in_pieces_is_byte_for_byte_the_one_buffer_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_pieces: list[int]
) -> None:
    data = [_long_table([1, 2, 3]), batch([4]), _long_table(list(range(40)))]
    pieced = _log(tmp_path / "pieces")
    for d in data:
        pieced.append(d)
    assert len(in_pieces) == 3 and min(in_pieces) > 3  # each written as several pieces
    monkeypatch.setattr(storage_log, "_PIECES_FROM", 1 << 62)
    whole = _log(tmp_path / "whole")
    for d in data:
        whole.append(d)
    assert len(in_pieces) == 3  # these in one buffer each
    files = [segments(_log_dir(tmp_path / d)) for d in ("pieces", "whole")]
    assert [f.read_bytes() for f in files[0]] == [f.read_bytes() for f in files[1]]
    fresh, state = reopen(pieced)
    assert [t.to_pydict() for _, t in state.entries] == [
        pa.table(d).to_pydict() if isinstance(d, pa.RecordBatch) else d.to_pydict() for d in data
    ]
    assert fresh.append(batch([5])) == 4


@pytest.mark.parametrize("call", [1, 2, 4])  # the header; its first piece; a later piece
def test_an_append_in_pieces_failing_part_way_acknowledges_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_pieces: list[int], call: int
) -> None:
    log = _log(tmp_path)
    log.append(_long_table([1, 2]))
    size = {p: records_end(p) for p in segments(_log_dir(tmp_path))}
    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", _pwrite_failing_from(call, errno.EIO))
        with pytest.raises(StorageUnavailableError):
            log.append(_long_table([3, 4, 5]))
    assert log.next_lsn == 2
    for path, acknowledged in size.items():  # the remnant was cut off (the zeros with it)
        assert path.stat().st_size == acknowledged
    assert log.append(_long_table([6])) == 2
    _fresh, state = reopen(log)
    assert [values for _, t in state.entries for values in t.column("v").to_pylist()] == [1, 2, 6]


def test_appends_share_one_segment_until_it_is_full(tmp_path: Path) -> None:
    log = _log(tmp_path, segment_bytes=700)
    for v in range(6):
        assert log.append(batch([v])) == v + 1
    files = segments(_log_dir(tmp_path))
    assert 2 <= len(files) < 6  # several records a segment, then a new one
    assert files[0].name == f"{1:020d}.seg"
    assert sum(len(record_starts(f.read_bytes())) for f in files) == 6
    fresh, state = reopen(log)
    assert [lsn for lsn, _ in state.entries] == [1, 2, 3, 4, 5, 6]
    assert recovered_values(state) == [0, 1, 2, 3, 4, 5]
    assert fresh.append(batch([6])) == 7


def test_recovery_reads_across_many_segments(tmp_path: Path) -> None:
    log = _log(tmp_path, segment_bytes=1)  # every append rolls
    for v in range(5):
        log.append(batch([v]))
    assert [int(f.stem) for f in segments(_log_dir(tmp_path))] == [1, 2, 3, 4, 5]
    assert recovered_values(reopen(log)[1]) == [0, 1, 2, 3, 4]


def test_segment_bytes_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        DurableLog(pafs.LocalFileSystem(), str(tmp_path), segment_bytes=0)
    assert info.value.argument == "segment_bytes"


def test_object_stores_keep_one_object_per_append() -> None:
    log = DurableLog(pafs._MockFileSystem(), "bucket/q")
    assert log.segment_bytes is None
    log.recover()
    log.append(batch([1]))
    assert log.filesystem.get_file_info(log.log_path(1)).is_file


@pytest.mark.parametrize("damage", ["cut", "flip_payload", "flip_header", "partial_header"])
def test_torn_end_of_the_last_segment_is_cut_off(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    log = _log(tmp_path)
    log.append(batch([0]))
    log.append(batch([1]))
    path = Path(log.appending_to or "")
    acknowledged = records_end(path)
    log.append(batch([2]))
    # The zeros written ahead are cut off first: these are the tears of a file that grew
    # with its appends (a segment written without them, as before raybus wrote them);
    # test_a_record_torn_in_front_of_the_zeros_ahead_is_cut_off tears one in front of them.
    os.truncate(path, records_end(path))
    data = path.read_bytes()
    if damage == "cut":
        path.write_bytes(data[:-3])
    elif damage == "flip_payload":
        flip_in_record(path, 2)
    elif damage == "flip_header":
        path.write_bytes(data[: acknowledged + 10] + b"\xff" + data[acknowledged + 11 :])
    else:  # a crash after 5 bytes of the header of a fourth record
        path.write_bytes(data[:acknowledged])
        acknowledged = len(data[:acknowledged])
        with open(path, "ab") as f:
            f.write(data[acknowledged : acknowledged + 5])

    with caplog.at_level(logging.WARNING, logger="raybus.storage"):
        fresh, state = reopen(log)
    assert "torn end of last log segment" in caplog.text
    assert recovered_values(state) == [0, 1]
    assert fresh.next_lsn == 3
    assert path.stat().st_size == acknowledged  # cut back to the acknowledged records
    assert fresh.append(batch([9])) == 3
    assert recovered_values(reopen(fresh)[1]) == [0, 1, 9]


def test_appends_go_into_zeros_written_ahead_and_leave_the_file_size_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append past the zeros a segment has writes more after its record (before its one
    sync; here ``ZERO_AHEAD_BYTES``, lowered to 2,000); the appends that fit in them change no
    file size, which is what makes their ``fdatasync`` write no metadata
    (``raybus._storage.segments``)."""
    monkeypatch.setattr(seg, "ZERO_AHEAD_BYTES", 2000)
    log = _log(tmp_path)
    syncs: list[int] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        syncs.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    sizes, ends = [], []
    for v in range(12):
        log.append(batch([v]))
        path = Path(log.appending_to or "")
        sizes.append(path.stat().st_size)
        ends.append(records_end(path))
    assert len(syncs) == 12  # still one sync an append
    assert sizes[0] == ends[0] + 2000
    content = path.read_bytes()
    assert content[ends[-1] :] == bytes(sizes[-1] - ends[-1])  # zeros after the records
    grew = [i for i in range(1, 12) if sizes[i] != sizes[i - 1]]
    assert grew and len(grew) < 6  # most appends went into zeros already there
    for i in grew:  # and a file grows only by an append that went past its zeros
        assert ends[i] > sizes[i - 1] and sizes[i] == ends[i] + 2000
    assert recovered_values(reopen(log)[1]) == list(range(12))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_zeros_ahead_the_disk_refuses_cost_the_append_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """The zeros are for later appends: refusing them fails no append (its own sync
    decides), and the next append past the records tries again."""
    log = _log(tmp_path, segment_bytes=4 << 20)
    real = os.pwrite
    refused: list[int] = []

    def pwrite(fd: int, data: Any, offset: int) -> int:
        view = memoryview(data).cast("B")
        if len(view) >= 1000 and not bytes(view).strip(b"\x00"):  # the zeros ahead
            refused.append(len(view))
            raise OSError(code, os.strerror(code))
        return real(fd, data, offset)

    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", pwrite)
        assert log.append(batch([0])) == 1
        assert log.append(batch([1])) == 2
    assert len(refused) == 2  # asked for at each append: none were there
    path = Path(log.appending_to or "")
    assert path.stat().st_size == records_end(path)
    assert log.append(batch([2])) == 3  # and written now
    end = records_end(path)
    assert path.stat().st_size == end + seg.zeros_ahead(end) == end + seg.ZERO_AHEAD_MIN_BYTES
    assert recovered_values(reopen(log)[1]) == [0, 1, 2]


def test_zeros_ahead_grow_with_the_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As many zeros as the segment holds, from ``ZERO_AHEAD_MIN_BYTES`` to
    ``ZERO_AHEAD_BYTES``: a partition that appends little keeps a small file."""
    monkeypatch.setattr(seg, "ZERO_AHEAD_MIN_BYTES", 1000)
    monkeypatch.setattr(seg, "ZERO_AHEAD_BYTES", 5000)
    log = _log(tmp_path)
    path, runs = None, []
    for v in range(60):
        size = path.stat().st_size if path is not None else 0
        log.append(_long_table([v]) if v % 3 == 1 else batch([v]))
        path = Path(log.appending_to or "")
        end = records_end(path)
        if path.stat().st_size != size:
            runs.append((end, path.stat().st_size - end))
    assert runs[0][1] == 1000  # the first record is short of the least
    assert all(ahead == min(5000, max(1000, end)) for end, ahead in runs)
    assert {ahead for _end, ahead in runs} >= {1000, 5000}
    assert recovered_values(reopen(log)[1]) == list(range(60))


def test_zeros_ahead_stop_at_the_size_the_segment_rolls_at(tmp_path: Path) -> None:
    log = _log(tmp_path, segment_bytes=3000)
    log.append(batch([0]))
    [path] = segments(_log_dir(tmp_path))
    assert path.stat().st_size == 3000  # not the full ZERO_AHEAD_BYTES past the record
    while log.appending_to is not None:
        log.append(batch([1]))
    assert records_end(path) >= 3000
    assert path.stat().st_size == records_end(path)  # the last record went past: no zeros


def test_segments_ending_in_zeros_recover_without_a_warning_and_the_log_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A segment's zeros are the end of its records, in the last segment and in earlier
    ones (recovery starts a new segment and leaves the zeros where they are)."""
    log = _log(tmp_path)
    for v in range(3):
        log.append(batch([v]))
    with caplog.at_level(logging.WARNING, logger="raybus.storage"):
        fresh, state = reopen(log)
        assert recovered_values(state) == [0, 1, 2]
        assert fresh.append(batch([3])) == 4
        fresh.append(batch([4]))
        again, state = reopen(fresh)
    assert caplog.text == ""
    assert recovered_values(state) == [0, 1, 2, 3, 4]
    files = segments(_log_dir(tmp_path))
    assert len(files) == 2
    for path in files:
        assert path.stat().st_size > records_end(path)  # zeros after the records
    assert again.append(batch([5])) == 6


@pytest.mark.parametrize("landed", [5, 40, "all but 12"])
def test_a_record_torn_in_front_of_the_zeros_ahead_is_cut_off(
    tmp_path: Path, landed: int | str, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash in the middle of an append into the zeros: its first bytes landed, the zeros
    after them are still there. Recovery cuts the record (and the zeros) off."""
    log = _log(tmp_path)
    log.append(batch([0]))
    log.append(batch([1]))
    path = Path(log.appending_to or "")
    acknowledged = records_end(path)
    _header, payload = encode(batch([2]))
    record = encode_record(3, payload) + payload.to_pybytes()
    count = len(record) - 12 if landed == "all but 12" else int(landed)
    assert record[count:].strip(b"\x00")  # what did not land is not all zeros
    write_at_records_end(path, record[:count])
    assert path.read_bytes()[acknowledged + count :].count(0) > 1000  # zeros follow
    with caplog.at_level(logging.WARNING, logger="raybus.storage"):
        fresh, state = reopen(log)
    assert "torn end of last log segment" in caplog.text
    assert recovered_values(state) == [0, 1]
    assert path.stat().st_size == acknowledged
    assert fresh.append(batch([9])) == 3
    assert recovered_values(reopen(fresh)[1]) == [0, 1, 9]


def test_a_segment_torn_in_its_first_record_is_deleted(tmp_path: Path) -> None:
    log = _log(tmp_path, segment_bytes=1)
    log.append(batch([0]))
    log.append(batch([1]))
    last = segments(_log_dir(tmp_path))[-1]
    last.write_bytes(last.read_bytes()[:20])
    fresh, state = reopen(log)
    assert recovered_values(state) == [0]
    assert not last.exists()
    assert fresh.append(batch([5])) == 2
    assert recovered_values(reopen(fresh)[1]) == [0, 5]


def test_damaged_record_followed_by_intact_ones_is_corruption(tmp_path: Path) -> None:
    log = _log(tmp_path)
    for v in range(3):
        log.append(batch([v]))
    path = Path(log.appending_to or "")
    garbled = flip_in_record(path, 1)
    with pytest.raises(StorageCorruptedError, match="later records exist") as info:
        reopen(log)
    assert info.value.path == str(path)
    assert path.read_bytes() == garbled  # nothing cut: the evidence stays


def test_checksummed_but_unreadable_last_record_is_corruption(tmp_path: Path) -> None:
    """A complete last record whose CRC-32 matches cannot be left by a torn write: an
    unreadable Arrow payload in it is damage to an acknowledged append, so recovery refuses
    rather than cut it off and hand its LSN out again."""
    log = _log(tmp_path)
    log.append(batch([0]))
    path = Path(log.appending_to or "")
    payload = pa.py_buffer(b"\xff" * 64)  # e.g. written by a format this reader cannot read
    write_at_records_end(path, encode_record(2, payload) + payload.to_pybytes())
    data = path.read_bytes()
    with pytest.raises(StorageCorruptedError, match="Arrow") as info:
        reopen(log)
    assert info.value.path == str(path)
    assert path.read_bytes() == data  # nothing cut: the evidence stays


@pytest.mark.parametrize("lsn", [1, 5])
def test_checksummed_last_record_with_an_lsn_out_of_sequence_is_corruption(
    tmp_path: Path, lsn: int
) -> None:
    """A complete, checksummed last record whose LSN is not the next one (a second writer's,
    or a copy of an earlier one) was written whole: no torn write, so recovery refuses it
    rather than cut it off as a torn tail."""
    log = _log(tmp_path)
    log.append(batch([0]))
    path = Path(log.appending_to or "")
    _header, payload = encode(batch([9]))  # a readable Arrow stream
    write_at_records_end(path, encode_record(lsn, payload) + payload.to_pybytes())
    data = path.read_bytes()
    with pytest.raises(StorageCorruptedError, match=f"has LSN {lsn}, expected 2") as info:
        reopen(log)
    assert info.value.path == str(path)
    assert path.read_bytes() == data  # nothing cut: the evidence stays


def test_torn_end_of_an_earlier_segment_is_corruption(tmp_path: Path) -> None:
    log = _log(tmp_path, segment_bytes=1)
    for v in range(3):
        log.append(batch([v]))
    first = segments(_log_dir(tmp_path))[0]
    first.write_bytes(first.read_bytes()[:-4])
    with pytest.raises(StorageCorruptedError, match="later files exist"):
        reopen(log)


def test_missing_segment_is_corruption(tmp_path: Path) -> None:
    log = _log(tmp_path, segment_bytes=1)
    for v in range(3):
        log.append(batch([v]))
    segments(_log_dir(tmp_path))[1].unlink()
    with pytest.raises(StorageCorruptedError, match="missing"):
        reopen(log)


def test_a_log_written_one_file_per_append_recovers_and_goes_on_in_segments(
    tmp_path: Path,
) -> None:
    old = _log(tmp_path, segment_bytes=None)
    old.append(batch([1]))
    old.append(batch([2]))
    old.checkpoint(table([1]), 1)
    old.append(batch([3]))
    names = sorted(p.name for p in _log_dir(tmp_path).iterdir())
    assert names == [f"{lsn:020d}.arrow" for lsn in (2, 3)]

    new = DurableLog(old.filesystem, old.directory)  # the default: segments on local disk
    assert recovered_values(new.recover()) == [1, 2, 3]
    assert new.append(batch([4])) == 4
    assert new.append(batch([5])) == 5
    assert [p.name for p in segments(_log_dir(tmp_path))] == [f"{4:020d}.seg"]
    fresh, state = reopen(new)
    assert [lsn for lsn, _ in state.entries] == [2, 3, 4, 5]
    assert recovered_values(state) == [1, 2, 3, 4, 5]

    fresh.checkpoint(table([1, 2, 3, 4, 5]), 5)  # covers the old files and the segment
    assert list(_log_dir(tmp_path).iterdir()) == []
    assert recovered_values(reopen(fresh)[1]) == [1, 2, 3, 4, 5]


def test_checkpoint_of_everything_closes_and_deletes_the_segment_being_written(
    tmp_path: Path,
) -> None:
    log = _log(tmp_path)
    for v in range(4):
        log.append(table(list(range(v * 100, v * 100 + 100))))
    log.checkpoint(table([]), 4)
    assert log.file_count() == 1  # the checkpoint only
    assert log.appending_to is None
    assert log.append(batch([7])) == 5
    assert [int(p.stem) for p in segments(_log_dir(tmp_path))] == [5]
    _, state = reopen(log)
    assert [lsn for lsn, _ in state.entries] == [5]
    assert recovered_values(state) == [7]


def test_checkpoint_below_the_last_lsn_keeps_the_segment_and_replays_past_it(
    tmp_path: Path,
) -> None:
    log = _log(tmp_path, segment_bytes=700)
    for v in range(6):
        log.append(batch([v]))
    log.checkpoint(table([0, 1, 2, 3]), 4)
    remaining = segments(_log_dir(tmp_path))
    assert remaining and int(remaining[0].stem) <= 5  # the segment holding LSN 5 stays
    fresh, state = reopen(log)
    assert [lsn for lsn, _ in state.entries] == [5, 6]
    assert recovered_values(state) == [0, 1, 2, 3, 4, 5]
    assert fresh.append(batch([6])) == 7


@pytest.mark.skipif(not hasattr(os, "fdatasync"), reason="the platform has no fdatasync")
def test_an_append_syncs_the_segments_data_without_its_timestamps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append to a segment that exists is made durable by one ``fdatasync`` (data and
    size; measured cheaper than ``fsync``, which also writes the timestamps), not ``fsync``."""
    log = _log(tmp_path)
    log.append(batch([1]))  # creates the segment (and syncs its directory)
    calls: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd: int) -> None:
        calls.append("fsync")
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        calls.append("fdatasync")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    log.append(batch([2]))
    assert calls == ["fdatasync"]
    monkeypatch.undo()
    assert recovered_values(reopen(log)[1]) == [1, 2]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
@pytest.mark.parametrize("where", ["pwrite", "fsync", "new_segment_dir_fsync"])
def test_failed_append_acknowledges_nothing_and_the_lsn_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, where: str
) -> None:
    log = _log(tmp_path, segment_bytes=1 if where == "new_segment_dir_fsync" else 1 << 20)
    log.append(batch([1]))
    size = {p: records_end(p) for p in segments(_log_dir(tmp_path))}
    content = {p: p.read_bytes()[: size[p]] for p in size}
    if where == "pwrite":
        monkeypatch.setattr(os, "pwrite", _short_pwrite(9, code))
    elif where == "fsync":  # the segment's data sync: fdatasync on Linux, else fsync
        monkeypatch.setattr(os, "fsync", _fail(code))
        monkeypatch.setattr(os, "fdatasync", _fail(code), raising=False)
    else:
        monkeypatch.setattr(storage_fs, "fsync_dir", _fail(code))
    with pytest.raises(StorageUnavailableError) as info:
        log.append(batch([2]))
    assert info.value.errno == code
    assert info.value.retryable is True
    assert log.next_lsn == 2
    monkeypatch.undo()
    for path, acknowledged in size.items():  # what was acknowledged is untouched
        assert path.read_bytes()[:acknowledged] == content[path]
        assert path.stat().st_size == acknowledged  # the remnant cut off, the zeros with it
    assert log.append(batch([3])) == 2  # the fault has cleared: the same LSN again
    assert recovered_values(reopen(log)[1]) == [1, 3]


@pytest.mark.parametrize("where", ["pwrite", "fsync", "new_segment_dir_fsync"])
def test_crash_after_a_failed_append_recovers_only_acknowledged_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    log = _log(tmp_path, segment_bytes=1 if where == "new_segment_dir_fsync" else 1 << 20)
    log.append(batch([1]))
    with monkeypatch.context() as patch:
        if where == "pwrite":
            patch.setattr(os, "pwrite", _short_pwrite(9, errno.EIO))
        elif where == "fsync":
            patch.setattr(os, "fsync", _fail(errno.EIO))
            patch.setattr(os, "fdatasync", _fail(errno.EIO), raising=False)
        else:
            patch.setattr(storage_fs, "fsync_dir", _fail(errno.EIO))
        with pytest.raises(StorageUnavailableError):
            log.append(batch([2]))
    fresh, state = reopen(log)
    assert recovered_values(state) == [1]
    assert fresh.append(batch([3])) == 2
    assert recovered_values(reopen(fresh)[1]) == [1, 3]


def _fail_with_stuck_remnant(log: DurableLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append that leaves 20 bytes behind and cannot cut them off."""
    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", _short_pwrite(20, errno.ENOSPC))
        patch.setattr(os, "ftruncate", _fail(errno.EIO))
        with pytest.raises(StorageUnavailableError):
            log.append(batch([666]))


def test_remnant_that_cannot_be_cut_is_cut_by_the_next_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = _log(tmp_path, segment_bytes=1)
    log.append(batch([1]))
    assert log.appending_to is None  # full: the next append starts a new segment
    with caplog.at_level(logging.WARNING, logger="raybus.storage"):
        _fail_with_stuck_remnant(log, monkeypatch)
    assert "could not truncate" in caplog.text
    path = Path(log.appending_to or "")  # the new segment, full but not rolled while dirty
    assert path.name == f"{2:020d}.seg"
    assert path.stat().st_size == 20  # the remnant
    assert log.append(batch([3])) == 2  # cuts the remnant, then writes at offset 0
    assert record_starts(path.read_bytes()) == [0]
    assert log.append(batch([4])) == 3  # and now rolls over
    assert recovered_values(reopen(log)[1]) == [1, 3, 4]


def test_remnant_that_cannot_be_cut_is_cut_by_recovery_after_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path)
    log.append(batch([1]))
    path = Path(log.appending_to or "")
    acknowledged = records_end(path)
    _fail_with_stuck_remnant(log, monkeypatch)
    remnant = path.read_bytes()[acknowledged:]
    assert remnant[:8] == RECORD_MAGIC  # 20 bytes of the failed record's header
    assert remnant[20:] == bytes(len(remnant) - 20)  # in front of the zeros written ahead
    fresh, state = reopen(log)  # the crash: the remnant is a torn tail
    assert recovered_values(state) == [1]
    assert path.stat().st_size == acknowledged
    assert fresh.append(batch([2])) == 2
    assert recovered_values(reopen(fresh)[1]) == [1, 2]


def test_complete_remnant_that_cannot_be_cut_is_not_read_back_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append whose record was written whole but whose fsync failed, and which cannot be
    cut off: recovering again in the same process cuts it first (raising while it cannot)
    rather than read it back as an entry."""
    log = _log(tmp_path)
    log.append(batch([1]))
    path = Path(log.appending_to or "")
    acknowledged = records_end(path)
    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", _fail(errno.EIO))
        patch.setattr(os, "fdatasync", _fail(errno.EIO), raising=False)
        patch.setattr(os, "ftruncate", _fail(errno.EIO))
        with pytest.raises(StorageUnavailableError):
            log.append(batch([666]))
        assert len(record_starts(path.read_bytes())) == 2  # the whole record is there
        with pytest.raises(StorageUnavailableError):
            log.recover()  # it cannot be cut yet
    assert recovered_values(log.recover()) == [1]
    assert path.stat().st_size == acknowledged
    assert log.append(batch([2])) == 2
    assert recovered_values(reopen(log)[1]) == [1, 2]


def test_checkpoints_racing_appends_keep_every_acknowledged_entry(tmp_path: Path) -> None:
    """A checkpoint written in one thread while another appends (as the partition does):
    closing and deleting covered segments never loses or reorders an entry."""
    log = _log(tmp_path, segment_bytes=400)
    appends = 200
    done = threading.Event()
    errors: list[BaseException] = []

    def checkpoints() -> None:
        try:
            while not done.is_set():
                upto = log.next_lsn - 1  # entry n holds the value n - 1
                floor = log.checkpoint_lsn or 0
                if upto > floor:
                    log.checkpoint(table(list(range(upto))), upto)
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=checkpoints)
    thread.start()
    try:
        for v in range(appends):
            assert log.append(batch([v])) == v + 1
    finally:
        done.set()
        thread.join()
    assert errors == []
    assert (log.checkpoint_lsn or 0) > 0
    fresh, state = reopen(log)
    assert recovered_values(state) == list(range(appends))
    assert fresh.next_lsn == appends + 1


def test_checkpoint_racing_a_retried_append_keeps_the_segment_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append that opened a new segment failed, leaving that segment empty and active; a
    checkpoint of everything before it runs while the append is retried. The empty segment
    holds no entry the checkpoint covers: it is neither closed nor deleted, so the retried
    append (the same LSN, the same file) stays durable, and so do the appends after it."""
    log = _log(tmp_path, segment_bytes=1)  # every append after the first starts a segment
    assert log.append(batch([1])) == 1
    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", _fail(errno.ENOSPC))
        with pytest.raises(StorageUnavailableError):
            log.append(batch([2]))  # created 2.seg; nothing acknowledged, no LSN consumed
    assert log.next_lsn == 2
    assert log.appending_to == str(_log_dir(tmp_path) / f"{2:020d}.seg")

    listed = threading.Event()
    appended = threading.Event()
    real_delete = log._delete_sources

    def delete_after_the_append(sources: Any) -> None:
        listed.set()  # the checkpoint has chosen what it covers and let appends in again
        assert appended.wait(10)
        real_delete(sources)

    monkeypatch.setattr(log, "_delete_sources", delete_after_the_append)
    errors: list[BaseException] = []

    def checkpoint() -> None:
        try:
            log.checkpoint(table([1]), 1)
        except BaseException as exc:  # reported below
            errors.append(exc)
            listed.set()

    thread = threading.Thread(target=checkpoint)
    thread.start()
    try:
        assert listed.wait(10)
        assert log.append(batch([2])) == 2  # acknowledged while the checkpoint deletes
    finally:
        appended.set()
        thread.join(10)
    assert not thread.is_alive() and errors == []
    assert log.append(batch([3])) == 3
    fresh, state = reopen(log)
    assert fresh.checkpoint_lsn == 1
    assert [lsn for lsn, _ in state.entries] == [2, 3]
    assert recovered_values(state) == [1, 2, 3]
