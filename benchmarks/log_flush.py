#!/usr/bin/env python
"""Cost of one durable flush: ``DurableLog.append`` of a journal-sized table, per layout.

Compares, in one run and interleaved round by round (the machine is shared: compare ratios),
one file per append (``segment_bytes=None``: the layout before segments, still used on object
stores) with appends to a segment file, both growing the file with each append (as before
zeros were written ahead: ``ZERO_AHEAD_BYTES = 0``) and into the zeros the segment writer
writes ahead of its appends (``raybus._storage.segments``). Reports wall and CPU time (this
process, all threads) per append, median of rounds, and the ratio of the segments with zeros
ahead to those without. No Ray.

    python benchmarks/log_flush.py [--appends 300] [--rounds 5] [--rows 10] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import pyarrow as pa
import pyarrow.fs as pafs

from raybus._storage import DurableLog
from raybus._storage import segments as _segments


def _table(rows: int) -> pa.Table:
    """``rows`` journal-like rows with a 1 KiB body each (a group commit of ``rows`` sends)."""
    return pa.table(
        {
            "kind": pa.array([1] * rows, pa.int8()),
            "seq": pa.array(range(rows), pa.int64()),
            "body": pa.array([b"x" * 1024] * rows, pa.binary()),
        }
    )


def _round(
    root: str, layout: tuple[int | None, int], table: pa.Table, appends: int
) -> tuple[float, float]:
    segment_bytes, _segments.ZERO_AHEAD_BYTES = layout
    with tempfile.TemporaryDirectory(dir=root) as directory:
        log = DurableLog(pafs.LocalFileSystem(), directory, segment_bytes=segment_bytes)
        log.recover()
        log.append(table)  # the first append creates the segment: steady state only
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(appends):
            log.append(table)
        return (
            (time.perf_counter() - wall) / appends * 1e3,
            (time.process_time() - cpu) / appends * 1e3,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--dir", default=None, help="parent directory (default: the temp dir)")
    args = parser.parse_args()
    table = _table(args.rows)
    ahead = _segments.ZERO_AHEAD_BYTES
    layouts: dict[str, tuple[int | None, int]] = {
        "file per append": (None, 0),
        "segments, growing": (16 * 1024 * 1024, 0),
        "segments, zeros ahead": (16 * 1024 * 1024, ahead),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in layouts}
    for _ in range(args.rounds):
        for name, layout in layouts.items():
            results[name].append(_round(args.dir, layout, table, args.appends))
    _segments.ZERO_AHEAD_BYTES = ahead
    print(f"{args.appends} appends x {args.rounds} rounds, {args.rows} rows of 1 KiB per append")
    print(f"{'layout':<22} {'wall ms/append':>15} {'CPU ms/append':>14}")
    medians = {}
    for name, rows in results.items():
        wall = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        medians[name] = (wall, cpu)
        print(f"{name:<22} {wall:>15.3f} {cpu:>14.3f}")
    (w0, c0), (w1, c1) = medians["segments, growing"], medians["segments, zeros ahead"]
    print(f"zeros ahead / growing: wall {w1 / w0:.2f}x, CPU {c1 / c0:.2f}x")


if __name__ == "__main__":
    main()
