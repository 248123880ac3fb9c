"""What a peek costs a partition as its backlog grows: raybus's indexed walk against a scan.

A peek runs on the partition's event loop: while it runs, the partition answers nothing
else. Until `Store.numbers_from` (``raybus/_core/store.py``) a peek filtered every number the
partition held to find the ones from its start on, so its cost grew with the backlog and
browsing a backlog page by page took time quadratic in its length. This times, on one
partition core holding ``--sizes`` messages (no Ray: the cost in question is the partition's
own), peeks of ``--count`` messages three ways, each with raybus's ``Partition.peek`` and with
the scan it replaced, run side by side on the same partition:

- ``start``: from the first number (a new receiver's first peek);
- ``middle``: from the number halfway through (``peek_messages(sequence_number=...)``);
- ``pages``: a receiver paging through the first ``--pages`` pages, each peek from after
  the last one (the time per peek);
- ``dlq``: a dead-letter sub-queue of as many messages, dead-lettered in a random order,
  takes one more (numbered below its last) and is peeked from its start, per round. The
  column "scan" is here the way before the late list: every stored number sorted again at
  the first walk after such a message (``Store.reindex`` before the peek).

A third of the messages (every third number) is completed first, so the walk steps over
removed numbers as a working queue's does. Printed: microseconds per peek each way, and
scan ÷ raybus (above 1: raybus is faster). Both ways return the same messages (checked).

Run: ``python benchmarks/peek_backlog.py [--sizes 10000,100000,1000000] [--count 10]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raybus._core.partition import Partition
from raybus._core.record import MessageRecord, encoded_size
from raybus._core.store import SettleOp
from raybus.management import QueueProperties
from raybus.testing import FakeClock


def scan_peek(p: Partition, start: int, count: int) -> list[int]:
    """The peek before the index, as it chose its numbers: every stored number filtered."""
    msgs = p._main.messages
    limit = p.visible_seq if p.visible_seq is not None else float("inf")
    return [s for s in msgs if start <= s and s <= limit][:count]


def raybus_peek(p: Partition, start: int, count: int) -> list[int]:
    return [rec.sequence_number for rec in p.peek(start, count)]


def filled(n: int) -> Partition:
    """A partition holding ``n`` messages of 100 bytes, with every third one completed."""
    p = Partition(QueueProperties(name="backlog"), FakeClock(), 0)
    total = n + n // 2
    for lo in range(0, total, 1000):
        p.send([_record() for _ in range(min(1000, total - lo))])
    for _ in range(0, total, 3000):
        locked = p.receive(3000)
        p.settle(
            [
                SettleOp("complete" if i % 3 == 0 else "abandon", str(rec.lock_token))
                for i, rec in enumerate(locked)
            ]
        )
    return p


def _record() -> MessageRecord:
    rec = MessageRecord(body=b"x" * 100)
    encoded_size(rec)
    return rec


def per_peek_us(peek: Callable[[Partition, int, int], list[int]], runs: int, *args: int) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        peek(*args)  # type: ignore[arg-type]
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def paging_us(
    p: Partition, peek: Callable[[Partition, int, int], list[int]], pages: int, count: int
) -> float:
    t = time.perf_counter()
    cursor = 0
    for _ in range(pages):
        got = peek(p, cursor, count)
        if not got:
            break
        cursor = got[-1] + 1
    return (time.perf_counter() - t) / pages * 1e6


def dead_lettered(n: int, rounds: int) -> tuple[Partition, list[str]]:
    """A partition whose dead-letter sub-queue holds ``n`` messages of 100 bytes, dead-lettered
    in a random order, and the lock tokens of ``rounds`` more, numbered among them, to
    dead-letter one at a time."""
    p = Partition(QueueProperties(name="backlog"), FakeClock(), 0)
    total = n + rounds
    for lo in range(0, total, 1000):
        p.send([_record() for _ in range(min(1000, total - lo))])
    locked = [str(rec.lock_token) for rec in p.receive(total)]
    random.Random(7).shuffle(locked)
    for lo in range(0, n, 1000):
        p.settle([SettleOp("dead_letter", token) for token in locked[lo : lo + 1000]])
    return p, locked[n:]


def dead_letter_then_peek_us(p: Partition, tokens: list[str], count: int, rebuild: bool) -> float:
    """Per round: dead-letter one more message (numbered below the sub-queue's last, as
    most are), then peek ``count`` of the sub-queue from its start. ``rebuild``: the way
    before, which sorted every stored number at the first walk after such a one."""
    samples = []
    for token in tokens:
        t = time.perf_counter()
        p.settle([SettleOp("dead_letter", token)])
        if rebuild:
            p._dlq.reindex()
        p.peek(0, count, dead_letter=True)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--sizes", default="10000,100000,1000000", help="messages held, comma-separated"
    )
    ap.add_argument("--count", type=int, default=10, help="messages a peek")
    ap.add_argument("--pages", type=int, default=100, help="pages in the paging walk")
    ap.add_argument("--runs", type=int, default=15, help="peeks timed per way (median)")
    args = ap.parse_args(argv)
    print(f"{'held':>9} {'peek':>7} {'raybus us':>10} {'scan us':>10} {'scan / raybus':>14}")
    for n in (int(x) for x in args.sizes.split(",")):
        p = filled(n)
        held = len(p._main.messages)
        middle = sorted(p._main.messages)[held // 2]
        for start in (0, middle):
            if raybus_peek(p, start, args.count) != scan_peek(p, start, args.count):
                raise SystemExit(f"the two ways disagree at {start}")
        rows = [
            (
                "start",
                *(per_peek_us(f, args.runs, p, 0, args.count) for f in (raybus_peek, scan_peek)),
            ),
            (
                "middle",
                *(
                    per_peek_us(f, args.runs, p, middle, args.count)
                    for f in (raybus_peek, scan_peek)
                ),
            ),
            ("pages", *(paging_us(p, f, args.pages, args.count) for f in (raybus_peek, scan_peek))),
        ]
        for name, ours, scan in rows:
            print(f"{held:>9,} {name:>7} {ours:>10.1f} {scan:>10.1f} {scan / ours:>13.1f}x")
        del p
        p, tokens = dead_lettered(n, 2 * args.runs)
        half = len(tokens) // 2
        ours = dead_letter_then_peek_us(p, tokens[:half], args.count, rebuild=False)
        before = dead_letter_then_peek_us(p, tokens[half:], args.count, rebuild=True)
        print(f"{n:>9,} {'dlq':>7} {ours:>10.1f} {before:>10.1f} {before / ours:>13.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
