#!/usr/bin/env python
"""What durable storage costs raybus, and what it buys: one run on one local Ray cluster.

Three storage modes, each in its own raybus namespace (1 KiB bodies throughout):

* **memory**  ``storage_path="memory://"``: messages in actor memory only (the baseline);
* **durable** ``storage_path=<temporary directory>``: a send or settlement is answered only once
  it is in the partition's log (group commit: one fsynced file per flush);
* **express** the same directory, queues created with ``enable_express=True``: answered at
  once, written within 1 s.

Phases:

1. **Send throughput** per mode and pattern: a plain sync loop of single sends; a sync loop of
   lists of 100; 16 asyncio tasks sending single messages through one ``raybus.aio`` client
   (the client coalesces them); and 16 ``raybus.aio`` clients sending single messages (16
   independent actor calls: only the partition's group commit can merge them). Each cell runs
   for a fixed time; flush counters come from the partition actor (``Committer.flushes`` and
   ``.flushed_entries``).
2. **Receive+complete throughput** of a pre-filled queue: ``receive_messages(100)`` then
   ``complete_messages`` until it is drained.
3. **Recovery**: fill a durable queue with N messages (lists of 1000), kill its partition actor
   (Ray restarts it; it replays its log in ``__init__``) and time until
   ``get_queue_runtime_properties().active_message_count == N`` answers. Then **compaction**:
   the bytes on disk of a queue before and after draining it (checkpoints delete the log files
   they cover), and the restart time of the drained queue.

Every cell checks its counts (the queue holds exactly what was acknowledged; every received
message is distinct; a drained queue is empty). Rates are medians over rounds; ratios are
medians of per-round ratios against the memory mode (the machine is small, shared and noisy).

Run: ``python benchmarks/durability.py [--quick] [--messages N]``.
Writes Markdown tables to stdout and JSON to ``benchmarks/results/durability-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common

ROOT = _common.ROOT

import ray  # noqa: E402
from _common import (  # noqa: E402
    BenchError,
    Deadline,
    Watchdog,
    body_ok,
    machine_facts,
    make_body,
    report_errors,
    write_results,
)
from _durability_recovery import RecoveryPhases  # noqa: E402
from _durability_report import (  # noqa: E402
    FILL_BATCH,
    MODES,
    log_run,
    rates_table,
    recovery_table,
    summarise_rates,
)

import raybus  # noqa: E402
import raybus.aio  # noqa: E402
from raybus import ServiceBusMessage  # noqa: E402
from raybus.exceptions import ServiceBusError  # noqa: E402
from raybus.management import ServiceBusAdministrationClient  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
PATTERNS = ("single", "batch100", "tasks16", "clients16")
PATTERN_LABELS = {
    "single": "send 1 (sync loop)",
    "batch100": "send list of 100 (sync loop)",
    "tasks16": "send 1 x 16 asyncio tasks, one aio client",
    "clients16": "send 1 x 16 aio clients",
}
MAX_SIZE_MB = 80 * 1024  # the largest raybus allows: 1M x 1 KiB must fit


# ---------------------------------------------------------------------------- helpers


# ---------------------------------------------------------------------------- the bench


class Bench(RecoveryPhases):
    def __init__(self, args: argparse.Namespace, storage: str) -> None:
        self.args = args
        self.storage = storage
        self.run_id = uuid.uuid4().hex[:6]
        self.size = args.body_size
        self.clients: list[tuple[raybus.ServiceBusClient, ServiceBusAdministrationClient]] = []
        self.watchdog = Watchdog(lambda: shutil.rmtree(storage, ignore_errors=True))

    # -- namespaces, queues, actors ------------------------------------------------------

    def storage_for(self, mode: str) -> str:
        return "memory://" if mode == "memory" else self.storage

    def namespace(
        self, phase: str, mode: str
    ) -> tuple[str, raybus.ServiceBusClient, ServiceBusAdministrationClient]:
        ns = f"dur-{self.run_id}-{phase}-{mode}"
        sp = self.storage_for(mode)
        pair = (
            raybus.connect(ns, storage_path=sp),
            ServiceBusAdministrationClient(ns, storage_path=sp),
        )
        self.clients.append(pair)
        return ns, pair[0], pair[1]

    def create_queue(self, admin: ServiceBusAdministrationClient, name: str, mode: str) -> None:
        admin.create_queue(
            name,
            enable_express=mode == "express",
            max_size_in_megabytes=MAX_SIZE_MB,
            lock_duration=300,
        )

    @staticmethod
    def partition(client: raybus.ServiceBusClient, queue: str) -> Any:
        route = ray.get(client._aio._conn.registry.route.remote(queue), timeout=60)
        return route.partitions[0]

    @staticmethod
    def counters(actor: Any, timeout: float = 30.0) -> tuple[int, int, bool]:
        """(flushes, flushed_entries, idle): idle = nothing recorded and no flush under way."""
        flushes, entries, idle = ray.get(
            actor.__ray_call__.remote(
                lambda self: (
                    self._commit.flushes,
                    self._commit.flushed_entries,
                    self._commit._task is None and not self._commit.core.has_journal(),
                )
            ),
            timeout=timeout,
        )
        return int(flushes), int(entries), bool(idle)

    def flushed(self, actor: Any, timeout: float = 10.0) -> tuple[int, int]:
        """Counters once everything recorded is written (express writes within 1 s)."""
        deadline = time.monotonic() + timeout
        while True:
            flushes, entries, idle = self.counters(actor)
            if idle:
                return flushes, entries
            if time.monotonic() > deadline:
                raise BenchError(f"the partition still had unwritten changes after {timeout} s")
            time.sleep(0.05)

    @staticmethod
    def active(admin: ServiceBusAdministrationClient, queue: str) -> int:
        return admin.get_queue_runtime_properties(queue).active_message_count

    def fill(self, client: raybus.ServiceBusClient, queue: str, n: int, what: str) -> float:
        """Send messages 0..n-1 (message_id = index) in lists of 1000; returns seconds."""
        deadline = Deadline(self.args.timeout_fill, what)
        sender = client.get_queue_sender(queue)
        t0 = time.perf_counter()
        last_report = t0
        for lo in range(0, n, FILL_BATCH):
            deadline.left()
            hi = min(n, lo + FILL_BATCH)
            sender.send_messages(
                [
                    ServiceBusMessage(make_body(i, self.size), message_id=str(i))
                    for i in range(lo, hi)
                ]
            )
            now = time.perf_counter()
            if now - last_report > 10:
                last_report = now
                print(f"    {what}: {hi:,}/{n:,} in {now - t0:.0f} s", file=sys.stderr)
        sender.close()
        return time.perf_counter() - t0

    # -- phase 1: sends -------------------------------------------------------------------

    def send_cell(
        self,
        client: raybus.ServiceBusClient,
        ns: str,
        mode: str,
        queue: str,
        pattern: str,
    ) -> tuple[int, float]:
        """Send for ``--seconds``; returns (messages acknowledged, seconds)."""
        secs = self.args.seconds
        size = self.size
        if pattern in ("single", "batch100"):
            sender = client.get_queue_sender(queue)
            sender.send_messages(ServiceBusMessage(make_body(0, size)))  # route resolved
            n = 0
            t0 = time.perf_counter()
            end = t0 + secs
            if pattern == "single":
                while time.perf_counter() < end:
                    sender.send_messages(ServiceBusMessage(make_body(n, size)))
                    n += 1
            else:
                while time.perf_counter() < end:
                    sender.send_messages(
                        [ServiceBusMessage(make_body(n + i, size)) for i in range(100)]
                    )
                    n += 100
            t1 = time.perf_counter()
            sender.close()
            return n + 1, t1 - t0  # +1: the warm-up message (not timed)

        sp = self.storage_for(mode)
        conc = self.args.concurrency

        async def run() -> tuple[int, float]:
            if pattern == "tasks16":
                one = raybus.aio.ServiceBusClient(ns, storage_path=sp)
                aio_clients = [one] * conc
            else:
                aio_clients = [
                    raybus.aio.ServiceBusClient(ns, storage_path=sp) for _ in range(conc)
                ]
            senders = [c.get_queue_sender(queue) for c in aio_clients]
            # Warm-up (not timed): every sender resolves the route.
            await asyncio.gather(
                *(s.send_messages(ServiceBusMessage(make_body(0, size))) for s in senders)
            )
            counts = [0] * conc
            t0 = time.perf_counter()
            end = t0 + secs

            async def loop(k: int) -> None:
                s = senders[k]
                while time.perf_counter() < end:
                    await s.send_messages(ServiceBusMessage(make_body(counts[k], size)))
                    counts[k] += 1

            await asyncio.wait_for(asyncio.gather(*(loop(k) for k in range(conc))), secs + 60)
            t1 = time.perf_counter()
            for s in senders:
                await s.close()
            return sum(counts) + conc, t1 - t0

        n, dt = asyncio.run(run())
        return n, dt

    def phase_send(self) -> list[dict[str, Any]]:
        args = self.args
        runs: list[dict[str, Any]] = []
        setups: dict[str, tuple[str, raybus.ServiceBusClient, ServiceBusAdministrationClient]] = {}
        queues: dict[tuple[str, str], tuple[Any, int]] = {}  # -> (actor, messages expected)
        for mode in MODES:
            setups[mode] = self.namespace("send", mode)
            ns, client, admin = setups[mode]
            for pattern in PATTERNS:
                q = f"send-{pattern}"
                self.create_queue(admin, q, mode)
                queues[(mode, pattern)] = (self.partition(client, q), 0)
        for rnd in range(args.rounds):
            for pattern in PATTERNS:
                order = MODES[rnd % 3 :] + MODES[: rnd % 3]  # rotate: drift hits all modes
                for mode in order:
                    ns, client, admin = setups[mode]
                    q = f"send-{pattern}"
                    actor, expected = queues[(mode, pattern)]
                    rec: dict[str, Any] = {"round": rnd, "mode": mode, "pattern": pattern}
                    try:
                        with self.watchdog.armed(args.seconds + 120, f"send {mode} {pattern}"):
                            f0, e0 = self.flushed(actor)
                            n, dt = self.send_cell(client, ns, mode, q, pattern)
                            wall_f = time.perf_counter()
                            f1, e1 = self.flushed(actor)
                            rec["flush_wait_s"] = time.perf_counter() - wall_f
                            expected += n
                            queues[(mode, pattern)] = (actor, expected)
                            got = self.active(admin, q)
                        if got != expected:
                            raise BenchError(f"queue holds {got} messages, {expected} acknowledged")
                        if mode != "memory" and e1 - e0 != n:
                            raise BenchError(f"{e1 - e0} journal entries flushed for {n} sends")
                        rec.update(
                            ok=True,
                            messages=n,
                            seconds=dt,
                            msgs_per_s=n / dt,
                            flushes=f1 - f0,
                            flushed_entries=e1 - e0,
                        )
                    except (BenchError, ServiceBusError, ray.exceptions.RayError) as exc:
                        rec.update(ok=False, error=f"{type(exc).__name__}: {exc}")
                    runs.append(rec)
                    log_run(rec)
        for mode in MODES:
            _, _, admin = setups[mode]
            for pattern in PATTERNS:
                with contextlib.suppress(ServiceBusError):
                    admin.delete_queue(f"send-{pattern}")
        return runs

    # -- phase 2: receive + complete ------------------------------------------------------

    def drain(
        self,
        client: raybus.ServiceBusClient,
        queue: str,
        n: int,
        what: str,
        sample: Callable[[], None] | None = None,
    ) -> float:
        """Receive 100 + complete_messages until n distinct messages; returns seconds."""
        deadline = Deadline(self.args.timeout_fill, what)
        receiver = client.get_queue_receiver(queue, prefetch_count=0)
        seen: set[int] = set()
        bad = dup = 0
        calls = 0
        t0 = time.perf_counter()
        try:
            while len(seen) < n:
                wait = max(0.05, min(2.0, deadline.left()))
                msgs = receiver.receive_messages(max_message_count=100, max_wait_time=wait)
                if not msgs:
                    continue
                for m in msgs:
                    i = int(m.message_id or -1)
                    if i in seen:
                        dup += 1
                    seen.add(i)
                    if not body_ok(i, m.body, self.size):
                        bad += 1
                receiver.complete_messages(msgs)
                calls += 1
                if sample is not None and calls % 20 == 0:
                    sample()
        finally:
            receiver.close()
        dt = time.perf_counter() - t0
        if dup or bad or seen != set(range(n)):
            raise BenchError(
                f"{what}: {dup} duplicates, {bad} bad bodies, {len(seen)} distinct of {n}"
            )
        return dt

    def phase_receive(self) -> list[dict[str, Any]]:
        args = self.args
        n = args.receive_messages
        runs: list[dict[str, Any]] = []
        setups = {mode: self.namespace("recv", mode) for mode in MODES}
        for rnd in range(args.rounds):
            order = MODES[rnd % 3 :] + MODES[: rnd % 3]
            for mode in order:
                _ns, client, admin = setups[mode]
                q = f"recv-{rnd}"
                rec: dict[str, Any] = {"round": rnd, "mode": mode, "pattern": "receive100+complete"}
                try:
                    with self.watchdog.armed(2 * args.timeout_fill + 120, f"receive {mode}"):
                        self.create_queue(admin, q, mode)
                        actor = self.partition(client, q)
                        rec["fill_s"] = self.fill(client, q, n, f"fill {mode} {q}")
                        if (got := self.active(admin, q)) != n:
                            raise BenchError(f"queue holds {got} after filling {n}")
                        f0, e0 = self.flushed(actor)
                        dt = self.drain(client, q, n, f"drain {mode} {q}")
                        f1, e1 = self.flushed(actor)
                        if (left := self.active(admin, q)) != 0:
                            raise BenchError(f"{left} messages left after draining")
                        admin.delete_queue(q)
                    rec.update(
                        ok=True,
                        messages=n,
                        seconds=dt,
                        msgs_per_s=n / dt,
                        flushes=f1 - f0,
                        flushed_entries=e1 - e0,
                    )
                except (BenchError, ServiceBusError, ray.exceptions.RayError) as exc:
                    rec.update(ok=False, error=f"{type(exc).__name__}: {exc}")
                runs.append(rec)
                log_run(rec)
        return runs

    def close(self) -> None:
        for client, admin in self.clients:
            with contextlib.suppress(Exception):
                client.close()
            with contextlib.suppress(Exception):
                admin.close()


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _common.arg_parser(__doc__, "small run (< 3 min)")
    p.add_argument(
        "--messages",
        type=int,
        help="messages in the recovery queue (default 1,000,000; quick 100,000)",
    )
    p.add_argument(
        "--drain-messages",
        type=int,
        help="messages in the compaction queue (default 100,000; quick 20,000)",
    )
    p.add_argument(
        "--receive-messages",
        type=int,
        help="messages per receive+complete cell (default 30,000; quick 10,000)",
    )
    p.add_argument("--seconds", type=float, help="seconds per send cell (default 4; quick 1.5)")
    p.add_argument("--rounds", type=int, help="rounds of phases 1 and 2 (default 3; quick 2)")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent asyncio senders")
    p.add_argument("--body-size", type=int, default=1024, help="body bytes (>= 8)")
    p.add_argument("--timeout-fill", type=float, help="seconds allowed per fill or drain")
    p.add_argument("--timeout-recovery", type=float, help="seconds allowed for a recovery")
    p.add_argument(
        "--recoveries", type=int, default=2, help="kills of the filled queue (median reported)"
    )
    p.add_argument(
        "--no-breakdown",
        dest="breakdown",
        action="store_false",
        help="skip timing the recovery steps in this process (reads raybus internals)",
    )
    p.add_argument(
        "--spy",
        action="store_true",
        help="py-spy dumps of the recovering partition actor every 3 s (diagnostic)",
    )
    p.add_argument(
        "--phases",
        default="send,receive,recovery",
        help="comma-separated subset of send,receive,recovery",
    )
    args = _common.parse_with_output(p, argv)
    q = args.quick
    if args.messages is None:
        args.messages = 100_000 if q else 1_000_000
    if args.drain_messages is None:
        args.drain_messages = 20_000 if q else 100_000
    if args.receive_messages is None:
        args.receive_messages = 10_000 if q else 30_000
    if args.seconds is None:
        args.seconds = 1.5 if q else 4.0
    if args.rounds is None:
        args.rounds = 2 if q else 3
    if args.timeout_fill is None:
        args.timeout_fill = 120.0 if q else 300.0
    if args.timeout_recovery is None:
        args.timeout_recovery = 120.0 if q else 300.0
    args.phases = [s.strip() for s in args.phases.split(",") if s.strip()]
    if any(s not in ("send", "receive", "recovery") for s in args.phases):
        p.error("--phases takes send, receive, recovery")
    if min(args.messages, args.drain_messages, args.receive_messages, args.rounds) < 1 or (
        args.recoveries < 1
    ):
        p.error("message counts and --rounds must be >= 1")
    if args.body_size < 8 or args.seconds <= 0 or args.concurrency < 1:
        p.error("--body-size >= 8, --seconds > 0, --concurrency >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    facts = machine_facts()
    storage = tempfile.mkdtemp(prefix="raybus-durability-")
    facts["storage_dir_fs"] = _fs_type(storage)
    send_runs: list[dict[str, Any]] = []
    recv_runs: list[dict[str, Any]] = []
    recovery: dict[str, Any] = {"messages": args.messages, "skipped": True}
    compaction: dict[str, Any] = {"messages": args.drain_messages, "skipped": True}
    timings: dict[str, float] = {}
    bench: Bench | None = None
    print(
        f"raybus durability: {args.body_size} B bodies, {args.rounds} round(s), "
        f"{args.seconds:g} s per send cell, recovery of {args.messages:,} messages; "
        f"storage {storage}",
        file=sys.stderr,
    )
    try:
        _common.start_local_ray(300)
        bench = Bench(args, storage)
        if "send" in args.phases:
            print("phase 1: send throughput", file=sys.stderr)
            t = time.perf_counter()
            send_runs = bench.phase_send()
            timings["send"] = time.perf_counter() - t
        if "receive" in args.phases:
            print("phase 2: receive + complete throughput", file=sys.stderr)
            t = time.perf_counter()
            recv_runs = bench.phase_receive()
            timings["receive"] = time.perf_counter() - t
        if "recovery" in args.phases:
            print("phase 3: recovery and compaction", file=sys.stderr)
            t = time.perf_counter()
            recovery = bench.phase_recovery()
            timings["recovery"] = time.perf_counter() - t
            t = time.perf_counter()
            compaction = bench.phase_compaction()
            timings["compaction"] = time.perf_counter() - t
    finally:
        if bench is not None:
            bench.close()
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)

    send_rows = summarise_rates(send_runs)
    recv_rows = summarise_rates(recv_runs)
    tables = []
    if send_rows:
        tables.append(
            f"### Send throughput ({args.body_size} B bodies, {args.seconds:g} s per cell, "
            f"median of {args.rounds} rounds)\n\n"
            + rates_table(send_rows, lambda p: PATTERN_LABELS.get(p, p))
        )
    if recv_rows:
        tables.append(
            f"### Receive 100 + complete_messages ({args.receive_messages:,} pre-filled messages, "
            f"median of {args.rounds} rounds)\n\n"
            + rates_table(recv_rows, lambda p: "receive 100 + complete_messages")
        )
    if not recovery.get("skipped"):
        tables.append(
            "### Recovery and compaction (durable)\n\n" + recovery_table(recovery, compaction)
        )
    errors = [
        f"{r.get('pattern')} {r.get('mode')} round {r.get('round')}: {r['error']}"
        for r in send_runs + recv_runs
        if not r.get("ok")
    ]
    for name, part in (("recovery", recovery), ("compaction", compaction)):
        if not part.get("skipped") and not part.get("ok"):
            errors.append(f"{name}: {part.get('error')}")
    table = "\n\n".join(tables)
    out = write_results(
        "durability",
        started,
        args,
        facts,
        {
            "phase_seconds": timings,
            "send_rows": send_rows,
            "receive_rows": recv_rows,
            "recovery": recovery,
            "compaction": compaction,
            "runs": send_runs + recv_runs,
            "errors": errors,
            "table_markdown": table,
        },
    )
    print(table)
    print(
        f"\nphases: {', '.join(f'{k} {v:.0f} s' for k, v in timings.items())}; "
        f"total {time.time() - started:.0f} s; JSON: {out}"
    )
    report_errors(errors)
    return 1 if errors else 0


def _fs_type(path: str) -> str | None:
    """The filesystem type of ``path`` (from /proc/mounts; None where unknown)."""
    best, kind = "", None
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and real.startswith(parts[1]) and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        return None
    return kind


if __name__ == "__main__":
    sys.exit(main())
