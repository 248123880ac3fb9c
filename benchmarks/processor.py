#!/usr/bin/env python
"""The processor (competing consumers in a pool of Ray actors): messages handled per second at
1, 2 and 4 replicas for an I/O-bound handler that sleeps 10 ms, and how long the pool takes to
reach its new size after a burst. One run on one local Ray cluster.

1. **Throughput.** For each replica count R (and each ``--concurrency`` C, ``--prefetch`` P,
   handler kind) a fresh queue gets a processor with ``min_replicas = max_replicas = R``,
   ``max_concurrent_calls = C`` and ``prefetch_count = P``; once its replicas are ready,
   N = ``--messages-per-slot`` x R x C
   messages are sent in lists of 100 and the script polls ``processor.statistics`` every 10 ms
   until all are handled. Reported: the end-to-end rate (N / time from the first send to the
   last handled), the steady rate (80 % of N / time from 10 % to 90 % handled), the ideal
   R x C / 10 ms, and steady / ideal. The handler is ``await asyncio.sleep(0.01)`` (``async``)
   or ``time.sleep(0.01)`` in the replica's thread pool (``sync``).
2. **Scale-up time.** A processor with ``min_replicas=1, max_replicas=4``,
   ``target_backlog_per_replica`` = ``--scale-target`` and C = 1 waits with one replica; then
   a burst of ``--scale-burst`` messages is sent. Reported: burst -> the controller wanting 4
   replicas (``desired_replicas``), burst -> 4 replicas ready (the time to the new size),
   burst -> queue drained, and drained -> back to 1 replica (includes ``scale_down_delay``).

Every cell checks that each message was handled once and the queue is empty afterwards
(``handled == N``, ``failed == 0``, no active or dead-lettered messages) and fails loudly
otherwise. The storage is ``memory://``: the broker's durability is measured elsewhere.

Run: ``python benchmarks/processor.py [--quick]``. Writes Markdown tables to stdout and JSON to
``benchmarks/results/processor-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import traceback
import uuid
from typing import Any

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common

ROOT = _common.ROOT

from _common import BenchError, Deadline, progress  # noqa: E402

from raybus import ServiceBusMessage, aio  # noqa: E402

HANDLER_SLEEP_S = 0.010


async def sleep_async(message: Any) -> None:
    """The I/O-bound handler: 10 ms of waiting on the replica's event loop."""
    await asyncio.sleep(HANDLER_SLEEP_S)


def sleep_sync(message: Any) -> None:
    """The same in a plain function (the replica's thread pool)."""
    time.sleep(HANDLER_SLEEP_S)


HANDLERS = {"async": sleep_async, "sync": sleep_sync}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.namespace = f"bench-proc-{uuid.uuid4().hex[:8]}"
        self.client = aio.ServiceBusClient(self.namespace, storage_path=_common.MEMORY)
        self.admin = aio.ServiceBusAdministrationClient(self.namespace, storage_path=_common.MEMORY)
        self.errors: list[str] = []
        self.cells: list[dict[str, Any]] = []
        self.scales: list[dict[str, Any]] = []
        self.watchdog = _common.Watchdog()

    async def _queue(self) -> str:
        name = f"q-{uuid.uuid4().hex[:8]}"
        await self.admin.create_queue(name)
        return name

    async def _send(self, queue: str, count: int) -> None:
        async with self.client.get_queue_sender(queue) as sender:
            for start in range(0, count, 100):
                n = min(100, count - start)
                await sender.send_messages([ServiceBusMessage(b"x" * 64) for _ in range(n)])

    async def _check_empty(self, queue: str, processor: Any, count: int, what: str) -> None:
        stats = processor.statistics
        props = await self.admin.get_queue_runtime_properties(queue)
        if stats.handled != count or stats.failed or props.active_message_count:
            raise BenchError(
                f"{what}: handled {stats.handled}/{count}, failed {stats.failed}, "
                f"{props.active_message_count} left in the queue"
            )
        if props.dead_letter_message_count:
            raise BenchError(f"{what}: {props.dead_letter_message_count} dead-lettered")
        await self.admin.delete_queue(queue)

    # ------------------------------------------------------------------ throughput

    async def throughput(
        self, replicas: int, concurrency: int, prefetch: int, kind: str
    ) -> dict[str, Any]:
        args = self.args
        what = f"R={replicas} C={concurrency} P={prefetch} {kind}"
        queue = await self._queue()
        count = args.messages_per_slot * replicas * concurrency
        processor = self.client.get_processor(
            queue,
            HANDLERS[kind],
            max_concurrent_calls=concurrency,
            prefetch_count=prefetch,
            min_replicas=replicas,
        )
        deadline = Deadline(args.timeout, what)
        with self.watchdog.armed(args.timeout + 60, what):
            await processor.start()
            try:
                t0 = time.monotonic()
                sender = asyncio.create_task(self._send(queue, count))
                marks: dict[float, float] = {}
                while True:
                    handled = processor.statistics.handled
                    now = time.monotonic()
                    for frac in (0.1, 0.9):
                        if frac not in marks and handled >= frac * count:
                            marks[frac] = now
                    if handled >= count:
                        break
                    deadline.left()
                    await asyncio.sleep(0.01)
                t_end = time.monotonic()
                await sender
            finally:
                await processor.stop()
        await self._check_empty(queue, processor, count, what)
        steady = 0.8 * count / max(1e-9, marks[0.9] - marks[0.1])
        ideal = replicas * concurrency / HANDLER_SLEEP_S
        return {
            "replicas": replicas,
            "concurrency": concurrency,
            "prefetch": prefetch,
            "handler": kind,
            "messages": count,
            "seconds": t_end - t0,
            "end_to_end_per_s": count / (t_end - t0),
            "steady_per_s": steady,
            "ideal_per_s": ideal,
            "efficiency": steady / ideal,
        }

    # ------------------------------------------------------------------ scale-up time

    async def scale(self) -> dict[str, Any]:
        args = self.args
        queue = await self._queue()
        processor = self.client.get_processor(
            queue,
            sleep_async,
            min_replicas=1,
            max_replicas=4,
            target_backlog_per_replica=args.scale_target,
            scale_down_delay=args.scale_down_delay,
        )
        what = "scale-up"
        deadline = Deadline(args.timeout, what)
        count = args.scale_burst
        with self.watchdog.armed(args.timeout + 60, what):
            await processor.start()
            try:
                t0 = time.monotonic()
                await self._send(queue, count)
                t_sent = time.monotonic()
                times: dict[str, float] = {}
                while "down" not in times:
                    s = processor.statistics
                    now = time.monotonic() - t0
                    if "desired" not in times and s.desired_replicas == 4:
                        times["desired"] = now
                    if "ready" not in times and s.replicas == 4:
                        times["ready"] = now
                    if "drained" not in times and s.handled >= count:
                        times["drained"] = now
                    if "drained" in times and s.replicas == 1 and not s.replicas_starting:
                        times["down"] = now
                    deadline.left()
                    await asyncio.sleep(0.01)
            finally:
                await processor.stop()
        await self._check_empty(queue, processor, count, what)
        if "ready" not in times:
            raise BenchError(f"{what}: the pool never reached 4 replicas")
        return {
            "burst": count,
            "send_s": t_sent - t0,
            "to_desired_s": times["desired"],
            "to_4_ready_s": times["ready"],
            "to_drained_s": times["drained"],
            "drained_to_1_s": times["down"] - times["drained"],
            "scale_down_delay_s": args.scale_down_delay,
        }

    async def run(self) -> None:
        args = self.args
        for repeat in range(args.repeats):
            cells = [
                (kind, conc, pre, reps)
                for kind in args.handlers
                for conc in args.concurrency
                for pre in args.prefetch
                for reps in args.replicas
            ]
            for kind, conc, pre, reps in cells:
                label = f"R={reps} C={conc} P={pre} {kind} (repeat {repeat + 1})"
                try:
                    cell = await self.throughput(reps, conc, pre, kind)
                except Exception as exc:
                    self.errors.append(f"{label}: {type(exc).__name__}: {exc}")
                    progress(traceback.format_exc())
                    continue
                cell["repeat"] = repeat
                self.cells.append(cell)
                progress(
                    f"{label}: {cell['steady_per_s']:.0f} msgs/s steady "
                    f"({cell['efficiency']:.0%} of ideal), "
                    f"{cell['end_to_end_per_s']:.0f} end to end"
                )
        for repeat in range(args.scale_repeats):
            try:
                result = await self.scale()
            except Exception as exc:
                self.errors.append(f"scale-up (repeat {repeat + 1}): {type(exc).__name__}: {exc}")
                progress(traceback.format_exc())
                continue
            self.scales.append(result)
            progress(
                f"scale-up {repeat + 1}: 4 replicas ready {result['to_4_ready_s']:.2f} s after "
                f"the burst (wanted after {result['to_desired_s']:.2f} s); back to 1 "
                f"{result['drained_to_1_s']:.2f} s after draining"
            )


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarise(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []

    def cell_key(c: dict[str, Any]) -> tuple[str, int, int, int]:
        return (c["handler"], c["concurrency"], c["prefetch"], c["replicas"])

    for kind, conc, pre, reps in sorted({cell_key(c) for c in cells}):
        mine = [c for c in cells if cell_key(c) == (kind, conc, pre, reps)]
        base = [c["steady_per_s"] for c in cells if cell_key(c) == (kind, conc, pre, 1)]
        steady = median([c["steady_per_s"] for c in mine])
        rows.append(
            {
                "handler": kind,
                "concurrency": conc,
                "prefetch": pre,
                "replicas": reps,
                "steady_per_s": steady,
                "end_to_end_per_s": median([c["end_to_end_per_s"] for c in mine]),
                "ideal_per_s": mine[0]["ideal_per_s"],
                "efficiency": steady / mine[0]["ideal_per_s"],
                "vs_1_replica": steady / median(base) if base else None,
                "runs": len(mine),
            }
        )
    return rows


def scale_table(scales: list[dict[str, Any]]) -> list[str]:
    """The scale-up runs, one row each."""
    return _common.md_table(
        "burst | wants 4 after | 4 ready after | drained after | back to 1 after draining",
        "---|---|---|---|---",
        [
            (
                s["burst"],
                f"{s['to_desired_s']:.2f} s",
                f"{s['to_4_ready_s']:.2f} s",
                f"{s['to_drained_s']:.2f} s",
                f"{s['drained_to_1_s']:.2f} s (delay {s['scale_down_delay_s']:g} s)",
            )
            for s in scales
        ],
    )


def markdown(rows: list[dict[str, Any]], scales: list[dict[str, Any]]) -> str:
    lines = _common.md_table(
        "handler | C | prefetch | replicas | msgs/s steady | msgs/s end to end | ideal "
        "| of ideal | ÷ 1 replica",
        "---|---|---|---|---|---|---|---|---",
        [
            (
                r["handler"],
                r["concurrency"],
                r["prefetch"],
                r["replicas"],
                f"{r['steady_per_s']:.0f}",
                f"{r['end_to_end_per_s']:.0f}",
                f"{r['ideal_per_s']:.0f}",
                f"{r['efficiency']:.0%}",
                "" if r["vs_1_replica"] is None else f"{r['vs_1_replica']:.2f}x",
            )
            for r in rows
        ],
    )
    if scales:
        lines += ["", *scale_table(scales)]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _common.arg_parser(__doc__, "small run (< 2 min)")
    p.add_argument(
        "--replicas", type=_common.int_list, default=[1, 2, 4], help="replica counts (1,2,4)"
    )
    p.add_argument(
        "--concurrency",
        type=_common.int_list,
        help="max_concurrent_calls values (default 1,8; quick 1)",
    )
    p.add_argument(
        "--handlers", type=lambda s: s.split(","), help="async,sync (default both; quick async)"
    )
    p.add_argument(
        "--messages-per-slot",
        type=int,
        help="messages per replica per concurrent call (default 300; quick 150)",
    )
    p.add_argument(
        "--prefetch",
        type=_common.int_list,
        default=[0, 10],
        help="prefetch_count values (default 0,10)",
    )
    p.add_argument("--repeats", type=int, help="throughput repeats (default 2; quick 1)")
    p.add_argument("--scale-repeats", type=int, help="scale-up runs (default 3; quick 1)")
    p.add_argument("--scale-burst", type=int, default=1000, help="burst size (default 1000)")
    p.add_argument(
        "--scale-target", type=int, default=50, help="target_backlog_per_replica (default 50)"
    )
    p.add_argument(
        "--scale-down-delay", type=float, default=2.0, help="scale_down_delay (default 2 s)"
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per cell (120)")
    args = _common.parse_with_output(p, argv)
    quick = args.quick
    args.concurrency = args.concurrency or ([1] if quick else [1, 8])
    args.handlers = args.handlers or (["async"] if quick else ["async", "sync"])
    bad = set(args.handlers) - set(HANDLERS)
    if bad:
        p.error(f"unknown handler kind(s): {', '.join(sorted(bad))}")
    args.messages_per_slot = args.messages_per_slot or (150 if quick else 300)
    args.repeats = args.repeats or (1 if quick else 2)
    args.scale_repeats = (
        args.scale_repeats if args.scale_repeats is not None else (1 if quick else 3)
    )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, facts = _common.start_run()
    _common.start_local_ray(300)
    progress(
        f"raybus processor: replicas {args.replicas}, concurrency {args.concurrency}, "
        f"prefetch {args.prefetch}, "
        f"handlers {args.handlers}, {args.messages_per_slot} messages per slot, "
        f"{args.repeats} repeat(s); scale-up x{args.scale_repeats}; {os.cpu_count()} CPUs"
    )
    bench = Bench(args)
    with _common.ray_run(bench.errors):
        asyncio.run(bench.run())
    rows = summarise(bench.cells)
    text = (
        f"### Processor throughput (handler sleeps {HANDLER_SLEEP_S * 1000:g} ms; "
        f"medians of {args.repeats}; {os.cpu_count()} CPUs)\n\n" + markdown(rows, bench.scales)
    )
    body = {"rows": rows, "cells": bench.cells, "scale_up": bench.scales, "errors": bench.errors}
    return _common.finish("processor", started, args, facts, text, body)


if __name__ == "__main__":
    sys.exit(main())
