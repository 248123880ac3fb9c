#!/usr/bin/env python
"""Cost of one durable flush: ``DurableLog.append`` of a journal-sized table, per layout.

Compares, in one run and interleaved round by round (the machine is shared: compare ratios),
one file per append (``segment_bytes=None``: the layout before segments, still used on object
stores) with appends to a segment file. Reports wall and CPU time (this process, all threads)
per append, median of rounds. No Ray.

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
    root: str, segment_bytes: int | None, table: pa.Table, appends: int
) -> tuple[float, float]:
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
    layouts = {"file per append": None, "segments": 16 * 1024 * 1024}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in layouts}
    for _ in range(args.rounds):
        for name, segment_bytes in layouts.items():
            results[name].append(_round(args.dir, segment_bytes, table, args.appends))
    print(f"{args.appends} appends x {args.rounds} rounds, {args.rows} rows of 1 KiB per append")
    print(f"{'layout':<16} {'wall ms/append':>15} {'CPU ms/append':>14}")
    for name, rows in results.items():
        wall = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        print(f"{name:<16} {wall:>15.3f} {cpu:>14.3f}")


if __name__ == "__main__":
    main()
