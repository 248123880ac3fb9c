"""Property: whatever mix of appends, checkpoints, failed writes and crashes happened, recovery
returns exactly the acknowledged data, in order, with gap-free LSNs.

A crash drops the ``DurableLog`` object (memory is lost, files stay) and may leave what a crash
in the middle of an *unacknowledged* write leaves: a torn or bit-flipped next log file (or
record at the end of the last segment, or new segment), or a torn checkpoint. Failed appends
and checkpoints leave a partial file or record, sometimes one that cannot even be deleted or
cut off. Run on an object store, on the local disk with one file per append, and on the local
disk with segments small enough to roll every few appends.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pyarrow.fs as pafs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import (
    FaultyHandler,
    batch,
    faulty_fs,
    framed,
    put,
    recovered_values,
    reopen,
    short_open,
    table,
)

from raybus._storage import DurableLog, StorageUnavailableError
from raybus._storage import fs as storage_fs
from raybus._storage.framing import serialize
from raybus._storage.segments import encode_record

_append = st.tuples(st.just("append"), st.integers(0, 3))
_checkpoint = st.tuples(st.just("checkpoint"), st.integers(0, 2))
_fail = st.tuples(st.sampled_from(["fail", "fail_checkpoint"]), st.integers(0, 99), st.booleans())
_crash = st.tuples(
    st.just("crash"),
    st.sampled_from(["clean", "torn_log", "flipped_log", "torn_checkpoint"]),
    st.integers(0, 2**16),
)
OPS = st.lists(st.one_of(_append, _append, _checkpoint, _fail, _crash), max_size=20)


class Model:
    """What was acknowledged: the values of every successful append, by LSN."""

    def __init__(self) -> None:
        self.entries: dict[int, list[int]] = {}
        self.next_lsn = 1
        self.counter = 0

    def fresh_values(self, n: int) -> list[int]:
        self.counter += n
        return list(range(self.counter - n, self.counter))

    def state(self, upto: int) -> list[int]:
        return [v for lsn in sorted(self.entries) if lsn <= upto for v in self.entries[lsn]]


def _check(log: DurableLog, model: Model) -> DurableLog:
    fresh, state = reopen(log)
    assert recovered_values(state) == model.state(model.next_lsn - 1)
    lsns = [lsn for lsn, _ in state.entries]
    start = 0 if fresh.checkpoint_lsn is None else fresh.checkpoint_lsn
    assert lsns == list(range(start + 1, model.next_lsn))
    assert fresh.next_lsn == model.next_lsn
    return fresh


def _short_pwrite(budget: int) -> Any:
    """An ``os.pwrite`` that writes at most ``budget`` bytes of a call (never all of it), then
    fails with ENOSPC: a record cut short."""
    real = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        view = memoryview(data).cast("B")
        real(fd, view[: min(budget, max(0, len(view) - 1))], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    return pwrite


@contextmanager
def _fault(handler: FaultyHandler | None, budget: int, stuck: bool) -> Iterator[None]:
    """Writes fail with ENOSPC after ``budget`` bytes; if ``stuck`` deletes (and truncations)
    fail as well."""
    if handler is not None:
        handler.write_errno, handler.write_budget = errno.ENOSPC, budget
        handler.delete_errno = errno.EIO if stuck else None
        try:
            yield
        finally:
            handler.write_errno = handler.delete_errno = None
        return
    with (
        mock.patch.object(storage_fs, "open", short_open(budget), create=True),
        mock.patch.object(os, "pwrite", _short_pwrite(budget)),
    ):
        if stuck:
            stuck_error = OSError(errno.EIO, "stuck")
            with (
                mock.patch.object(os, "remove", side_effect=stuck_error),
                mock.patch.object(os, "ftruncate", side_effect=stuck_error),
            ):
                yield
        else:
            yield


def _tear_log(fs: pafs.FileSystem, log: DurableLog, data: bytes) -> None:
    """Leave ``data``, the damaged next log entry, where a crash mid-append leaves it."""
    if log.segment_bytes is None:
        put(fs, log.log_path(log.next_lsn), data)
        return
    active = log.appending_to
    if active is not None:  # the end of the segment being written (after any remnant)
        with open(active, "ab") as f:
            f.write(data)
    else:  # a new segment, its first record never completed
        put(fs, log.segment_path(log.next_lsn), data)


def _run(
    ops: list[tuple[Any, ...]],
    fs: pafs.FileSystem,
    handler: FaultyHandler | None,
    segment_bytes: int | None = None,
) -> None:
    log = DurableLog(fs, "ns/q/0", segment_bytes=segment_bytes)
    log.recover()
    model = Model()
    for op in ops:
        kind = op[0]
        if kind == "append":
            values = model.fresh_values(op[1])
            assert log.append(table(values)) == model.next_lsn
            model.entries[model.next_lsn] = values
            model.next_lsn += 1
        elif kind == "checkpoint":
            upto = model.next_lsn - 1 - op[1]
            floor = -1 if log.checkpoint_lsn is None else log.checkpoint_lsn
            if floor < upto:
                log.checkpoint(table(model.state(upto)), upto)
        elif kind == "fail":
            with pytest.raises(StorageUnavailableError), _fault(handler, op[1], op[2]):
                log.append(batch(model.fresh_values(2)))
            assert log.next_lsn == model.next_lsn
        elif kind == "fail_checkpoint":
            upto = model.next_lsn - 1
            floor = -1 if log.checkpoint_lsn is None else log.checkpoint_lsn
            if floor < upto:
                with pytest.raises(StorageUnavailableError), _fault(handler, op[1], op[2]):
                    log.checkpoint(table(model.state(upto)), upto)
                assert log.checkpoint_lsn == (None if floor < 0 else floor)
        else:
            how, seed = op[1], op[2]
            if how in ("torn_log", "flipped_log"):
                if log.segment_bytes is None:
                    data = framed(model.fresh_values(1))
                else:
                    payload = serialize(table(model.fresh_values(1)))
                    data = encode_record(log.next_lsn, payload) + payload.to_pybytes()
                if how == "torn_log":
                    data = data[: seed % len(data)]
                else:
                    flipped = bytearray(data)
                    flipped[seed % len(data)] ^= 0xFF
                    data = bytes(flipped)
                _tear_log(fs, log, data)
            elif how == "torn_checkpoint":
                upto = model.next_lsn - 1
                floor = -1 if log.checkpoint_lsn is None else log.checkpoint_lsn
                if floor < upto:
                    data = framed(model.state(upto))
                    put(fs, log.checkpoint_path(upto), data[: seed % len(data)])
            log = _check(log, model)
    _check(log, model)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_recovery_returns_exactly_the_acknowledged_data_on_local_disk(
    ops: list[tuple[Any, ...]],
) -> None:
    with tempfile.TemporaryDirectory() as root:
        _run(ops, pafs.SubTreeFileSystem(root, pafs.LocalFileSystem()), None, None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, segment_bytes=st.sampled_from([1, 700, 1 << 20]))
def test_recovery_returns_exactly_the_acknowledged_data_in_segments(
    ops: list[tuple[Any, ...]], segment_bytes: int
) -> None:
    with tempfile.TemporaryDirectory() as root:
        _run(ops, pafs.SubTreeFileSystem(root, pafs.LocalFileSystem()), None, segment_bytes)


@settings(max_examples=100, deadline=None)
@given(ops=OPS)
def test_recovery_returns_exactly_the_acknowledged_data_on_an_object_store(
    ops: list[tuple[Any, ...]],
) -> None:
    fs, handler = faulty_fs()
    _run(ops, fs, handler)
