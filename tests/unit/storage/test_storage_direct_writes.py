"""Long log records written with direct I/O (``raybus._storage.segments``): at a block
boundary, padded with zeros to a whole block, read back by recovery as if written buffered;
buffered writes where the file system or the disk refuses direct I/O; a failed direct write
acknowledges nothing; the zero padding is skipped only up to a block boundary.

``DIRECT_MIN_BYTES`` is lowered to 8 KiB here, so records of a few of ``_long`` rows are long.
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
from segment_files import record_starts, records_end, segments
from storage_helpers import batch, recovered_values, reopen

from raybus._storage import DurableLog, StorageUnavailableError
from raybus._storage import segments as seg
from raybus._storage.segments import BLOCK, encode_record, scan

LONG = 8 << 10


def _long(values: list[int]) -> pa.Table:
    """Rows of 3,000 distinct bytes each (three make a long record)."""
    return pa.table(
        {
            "v": pa.array(values, pa.int64()),
            "b": pa.array([bytes([v % 251 + 1]) * 3000 for v in values], pa.binary()),
        }
    )


def _log(root: Path) -> DurableLog:
    log = DurableLog(pafs.LocalFileSystem(), str(root / "store"))
    log.recover()
    return log


def _direct_io_works(directory: Path) -> bool:
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = directory / "direct-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    probe.unlink()
    return True


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records of ``LONG`` bytes or more go direct; the flags of every ``os.open`` that asks
    for direct I/O are recorded."""
    monkeypatch.setattr(seg, "DIRECT_MIN_BYTES", LONG)
    opened: list[int] = []
    real = os.open

    def spy(path: Any, flags: int, *args: Any) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            opened.append(flags)
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", spy)
    return opened


def _refuse_direct_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system without direct I/O (tmpfs): opening with ``O_DIRECT`` is EINVAL."""
    real = os.open

    def refusing(path: Any, flags: int, *args: Any) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)


def _data() -> list[pa.Table | pa.RecordBatch]:
    return [batch([0]), _long([1, 2, 3]), batch([4]), _long([5, 6, 7, 8]), batch([9])]


def _values(data: list[pa.Table | pa.RecordBatch]) -> list[int]:
    return [v for d in data for v in d.column(0).to_pylist()]


def test_long_records_start_on_block_boundaries_padded_with_zeros_and_read_back(
    tmp_path: Path, direct: list[int]
) -> None:
    if not _direct_io_works(tmp_path):
        pytest.skip(f"the file system of {tmp_path} has no direct I/O")
    log = _log(tmp_path)
    for d in _data():
        log.append(d)
    assert direct  # the long records asked for direct I/O
    [path] = segments(tmp_path / "store" / "log")
    content = path.read_bytes()
    extents = _extents(content)
    starts = [start for start, _ in extents]
    assert len(starts) == 5
    assert starts[1] % BLOCK == 0 and starts[3] % BLOCK == 0  # the long ones
    assert starts[2] % BLOCK == 0  # after a long record's padding
    # What lies between a record's end and the next record is zeros, never a full block.
    for i in (0, 1, 2):
        gap = content[extents[i][1] : starts[i + 1]]
        assert gap == bytes(len(gap)) and len(gap) < BLOCK
    fresh, state = reopen(log)
    assert recovered_values(state) == _values(_data())
    assert fresh.append(batch([10])) == 6


def _payload_length(content: bytes, start: int) -> int:
    return int.from_bytes(content[start + 16 : start + 24], "little")


def _extents(content: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` of each record of a segment's content, padding left out."""
    return [
        (s, s + seg.RECORD_HEADER_SIZE + _payload_length(content, s))
        for s in record_starts(content)
    ]


def _back_to_back(path: Path) -> bool:
    """Whether the segment's records follow each other with nothing between them, and only
    the zeros written ahead of the appends after them."""
    content = path.read_bytes()
    extents = _extents(content)
    end = extents[-1][1]
    return (
        [s for s, _ in extents[1:]] == [e for _, e in extents[:-1]]
        and end == records_end(path)
        and content[end:] == bytes(len(content) - end)
    )


def test_records_written_direct_read_back_as_those_written_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: list[int]
) -> None:
    """The same appends through direct I/O and through buffered writes only: the same
    records, byte for byte, once the padding is left out."""
    if not _direct_io_works(tmp_path):
        pytest.skip(f"the file system of {tmp_path} has no direct I/O")
    direct_log = _log(tmp_path / "direct")
    for d in _data():
        direct_log.append(d)
    monkeypatch.setattr(seg, "DIRECT_MIN_BYTES", 1 << 62)
    buffered_log = _log(tmp_path / "buffered")
    for d in _data():
        buffered_log.append(d)

    def records(root: Path) -> list[bytes]:
        [path] = segments(root / "store" / "log")
        content = path.read_bytes()
        return [content[start:end] for start, end in _extents(content)]

    assert records(tmp_path / "direct") == records(tmp_path / "buffered")
    [plain] = segments(tmp_path / "buffered" / "store" / "log")
    assert _back_to_back(plain)  # buffered: no padding


def test_a_file_system_without_direct_io_gets_buffered_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seg, "DIRECT_MIN_BYTES", LONG)
    _refuse_direct_open(monkeypatch)
    log = _log(tmp_path)
    for d in _data():
        log.append(d)
    [path] = segments(tmp_path / "store" / "log")
    assert _back_to_back(path)  # no padding
    assert recovered_values(reopen(log)[1]) == _values(_data())


def test_a_disk_refusing_the_alignment_gets_that_record_and_the_next_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: list[int]
) -> None:
    """EINVAL from the first direct write (a block size above ``BLOCK``): nothing of it
    landed, so the record is written buffered, and so is every later one of the segment."""
    if not _direct_io_works(tmp_path):
        pytest.skip(f"the file system of {tmp_path} has no direct I/O")
    real = os.pwrite
    refused: list[int] = []

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if len(memoryview(data)) % BLOCK == 0 and offset % BLOCK == 0 and len(data) >= LONG:
            refused.append(fd)
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    log = _log(tmp_path)
    for d in _data():
        log.append(d)
    assert len(refused) == 1  # tried once, then never again
    [path] = segments(tmp_path / "store" / "log")
    assert _back_to_back(path)
    assert recovered_values(reopen(log)[1]) == _values(_data())


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
def test_a_failed_direct_write_acknowledges_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: list[int], code: int
) -> None:
    if not _direct_io_works(tmp_path):
        pytest.skip(f"the file system of {tmp_path} has no direct I/O")
    log = _log(tmp_path)
    log.append(batch([0]))
    log.append(_long([1, 2, 3]))
    path = Path(log.appending_to or "")
    acknowledged = records_end(path)  # the long record's padding follows
    content = path.read_bytes()[:acknowledged]
    real = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        view = memoryview(data).cast("B")
        if len(view) >= LONG:  # land a block of it, then fail
            real(fd, view[:BLOCK], offset)
            raise OSError(code, os.strerror(code))
        return real(fd, data, offset)

    with monkeypatch.context() as patch:
        patch.setattr(os, "pwrite", pwrite)
        with pytest.raises(StorageUnavailableError):
            log.append(_long([4, 5, 6]))
    # The remnant was cut off: the records are as they were, followed by no more than the
    # last one's padding.
    assert path.read_bytes()[:acknowledged] == content
    assert acknowledged < path.stat().st_size < acknowledged + BLOCK
    assert records_end(path) == acknowledged
    assert log.next_lsn == 3
    assert log.append(_long([7, 8, 9])) == 3
    _fresh, state = reopen(log)
    assert recovered_values(state) == [0, 1, 2, 3, 7, 8, 9]


def test_a_direct_open_failing_otherwise_than_einval_fails_the_append_and_acknowledges_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only EINVAL means "no direct I/O here"; any other error opening the file for it (EIO,
    EMFILE) is the storage failing: the append raises, and the next one tries again."""
    monkeypatch.setattr(seg, "DIRECT_MIN_BYTES", LONG)
    log = _log(tmp_path)
    log.append(batch([0]))
    path = Path(log.appending_to or "")
    acknowledged = records_end(path)
    real = os.open

    def failing(file: Any, flags: int, *args: Any) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(file, flags, *args)

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", failing)
        with pytest.raises(StorageUnavailableError):
            log.append(_long([1, 2, 3]))
    assert records_end(path) == acknowledged and log.next_lsn == 2
    assert path.read_bytes()[acknowledged:] == bytes(path.stat().st_size - acknowledged)
    assert log.append(_long([4, 5, 6])) == 2
    assert recovered_values(reopen(log)[1]) == [0, 4, 5, 6]


def test_a_writer_finding_the_kept_buffer_taken_writes_from_a_map_of_its_own(
    tmp_path: Path, direct: list[int]
) -> None:
    if not _direct_io_works(tmp_path):
        pytest.skip(f"the file system of {tmp_path} has no direct I/O")
    log = _log(tmp_path)
    with seg._aligned._lock:  # another log of this process is writing
        log.append(_long([1, 2, 3]))
    [path] = segments(tmp_path / "store" / "log")
    assert record_starts(path.read_bytes()) == [0] and path.stat().st_size % BLOCK == 0
    assert log.append(_long([4, 5, 6])) == 2  # the kept buffer, free again
    assert recovered_values(reopen(log)[1]) == [1, 2, 3, 4, 5, 6]


def test_a_direct_record_torn_by_a_crash_is_cut_back_to_the_record_before(
    tmp_path: Path, direct: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """Cut where it was acknowledged: the end of the short record before, not the block
    boundary the torn one started at."""
    if not _direct_io_works(tmp_path):
        pytest.skip(f"the file system of {tmp_path} has no direct I/O")
    log = _log(tmp_path)
    log.append(batch([0]))
    path = Path(log.appending_to or "")
    acknowledged = records_end(path)
    assert acknowledged % BLOCK
    log.append(_long([1, 2, 3]))
    content = path.read_bytes()
    path.write_bytes(content[: record_starts(content)[1] + BLOCK + 100])  # mid-record
    with caplog.at_level(logging.WARNING, logger="raybus.storage"):
        fresh, state = reopen(log)
    assert "torn end of last log segment" in caplog.text
    assert recovered_values(state) == [0]
    assert path.stat().st_size == acknowledged
    assert fresh.append(batch([4])) == 2


def _record(lsn: int, values: list[int]) -> bytes:
    from raybus._storage.framing import serialize

    payload = serialize(batch(values))
    return encode_record(lsn, payload) + payload.to_pybytes()


def _pad_to_block(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def test_scan_skips_zeros_up_to_a_block_boundary_and_at_the_end() -> None:
    first = _record(1, [1])
    data = _pad_to_block(first) + _pad_to_block(_record(2, [2])) + _record(3, [3])
    found = scan(pa.py_buffer(data), 1, 0)
    assert found.damage is None and found.last_lsn == 3
    assert [t.column(0).to_pylist() for _, t in found.entries] == [[1], [2], [3]]
    padded_end = scan(pa.py_buffer(_pad_to_block(first)), 1, 0)
    assert padded_end.damage is None and padded_end.valid_end == len(first)


@pytest.mark.parametrize("zeros", [5, BLOCK, 3 * BLOCK + 17])
def test_scan_takes_zeros_to_the_end_for_the_end_of_the_records(zeros: int) -> None:
    """The zeros a segment writer writes ahead of its appends: whole blocks of them or not,
    from a record's end to the end of the file, they end the records; no damage."""
    data = _record(1, [1]) + _record(2, [2])
    found = scan(pa.py_buffer(data + bytes(zeros)), 1, 0)
    assert found.damage is None and found.last_lsn == 2 and found.valid_end == len(data)
    assert [t.column(0).to_pylist() for _, t in found.entries] == [[1], [2]]


@pytest.mark.parametrize(
    "tail",
    [
        "a zero block, then a byte",  # zeros from a boundary on, not to the end of the file
        "a byte before the boundary",  # not padding: something else was written there
    ],
)
def test_scan_takes_other_zeros_for_damage(tail: str) -> None:
    first = _pad_to_block(_record(1, [1]))
    if tail == "a zero block, then a byte":
        data = first + bytes(BLOCK) + b"\x07"
    else:
        padded = bytearray(first)
        padded[-1] = 7
        data = bytes(padded)
    found = scan(pa.py_buffer(data), 1, 0)
    assert found.damage is not None
    assert found.last_lsn == 1 and found.valid_end == len(_record(1, [1]))


def test_two_logs_writing_long_records_at_once_each_keep_their_own(
    tmp_path: Path, direct: list[int]
) -> None:
    """Two partitions' logs in one process share the kept aligned buffer: a writer that
    finds it taken fills one of its own."""
    if not _direct_io_works(tmp_path):
        pytest.skip(f"the file system of {tmp_path} has no direct I/O")
    logs = [_log(tmp_path / f"log{k}") for k in range(2)]
    errors: list[BaseException] = []

    def write(k: int) -> None:
        try:
            for i in range(20):
                logs[k].append(_long([1000 * k + 3 * i + j for j in range(3)]))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, log in enumerate(logs):
        values = recovered_values(reopen(log)[1])
        assert values == [1000 * k + v for v in range(60)]
