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
import gc
import logging
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
    actor_pids,
    machine_facts,
    make_body,
    median,
    py_spy_dump,
    report_errors,
    write_results,
)

import raybus  # noqa: E402
import raybus.aio  # noqa: E402
from raybus import ServiceBusMessage  # noqa: E402
from raybus.exceptions import ServiceBusError  # noqa: E402
from raybus.management import ServiceBusAdministrationClient  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MODES = ("memory", "durable", "express")
PATTERNS = ("single", "batch100", "tasks16", "clients16")
PATTERN_LABELS = {
    "single": "send 1 (sync loop)",
    "batch100": "send list of 100 (sync loop)",
    "tasks16": "send 1 x 16 asyncio tasks, one aio client",
    "clients16": "send 1 x 16 aio clients",
}
MAX_SIZE_MB = 80 * 1024  # the largest raybus allows: 1M x 1 KiB must fit
FILL_BATCH = 1000


# ---------------------------------------------------------------------------- helpers


def body_ok(i: int, body: Any, size: int) -> bool:
    return isinstance(body, bytes) and len(body) == size and int.from_bytes(body[:8], "big") == i


def disk_usage(path: str) -> dict[str, int]:
    """Bytes (file sizes and allocated blocks) and file count below ``path``."""
    apparent = allocated = files = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:  # deleted meanwhile (a checkpoint's clean-up)
                continue
            apparent += st.st_size
            allocated += getattr(st, "st_blocks", 0) * 512
            files += 1
    return {"bytes": apparent, "allocated_bytes": allocated, "files": files}


# ---------------------------------------------------------------------------- the bench


class Bench:
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

    # -- phase 3: recovery and compaction -------------------------------------------------

    def wait_recovered(
        self, ns: str, queue: str, n: int, t_kill: float, timeout: float, spy: bool
    ) -> dict[str, Any]:
        """Until the queue answers ``n`` active messages: a new poll every 0.2 s.

        Polls overlap: while the actor restarts, a call fails only after about 2 s, so waiting
        for each answer before the next poll would measure in 2 s steps.
        """
        return asyncio.run(self._poll(ns, queue, n, t_kill, timeout, spy))

    async def _poll(
        self, ns: str, queue: str, n: int, t_kill: float, timeout: float, spy: bool
    ) -> dict[str, Any]:
        admin = raybus.aio.ServiceBusAdministrationClient(ns, storage_path=self.storage)
        done = asyncio.Event()
        out: dict[str, Any] = {"polls": 0, "poll_errors": 0}
        answers: list[int] = []
        error_samples: list[str] = []
        dumps: list[dict[str, Any]] = []

        async def poll() -> None:
            try:
                props = await admin.get_queue_runtime_properties(queue)
            except ServiceBusError as exc:
                out["poll_errors"] += 1
                if len(error_samples) < 3:  # what a client sees while the actor restarts
                    error_samples.append(
                        f"{time.perf_counter() - t_kill:.2f} s: {type(exc).__name__}"
                        f" (retryable={getattr(exc, 'retryable', None)}): {exc}"
                    )
                return
            at = time.perf_counter() - t_kill
            out.setdefault("first_answer_s", at)
            got = props.active_message_count
            if not answers or answers[-1] != got:
                answers.append(got)
            if got == n and "recovery_s" not in out:
                out["recovery_s"] = at
                done.set()

        async def spy_loop() -> None:
            await asyncio.sleep(2.0)
            while len(dumps) < 6:
                for pid, cmd in actor_pids():
                    if "PartitionActor" in cmd:
                        dump = await asyncio.to_thread(py_spy_dump, pid)
                        dumps.append(
                            {"at_s": time.perf_counter() - t_kill, "pid": pid, "dump": dump}
                        )
                await asyncio.sleep(3.0)

        tasks: set[asyncio.Task[None]] = set()
        spy_task = asyncio.ensure_future(spy_loop()) if spy else None
        deadline = time.monotonic() + timeout
        # raybus logs every failed poll at ERROR; they are counted and sampled instead.
        rpc_log = logging.getLogger("raybus.rpc")
        rpc_level = rpc_log.level
        rpc_log.setLevel(logging.CRITICAL)
        try:
            while not done.is_set():
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"queue {queue} did not answer {n} active messages within {timeout:g} s"
                        f" (answers {answers[-5:]}, errors {error_samples})"
                    )
                if len(tasks) < 50:
                    out["polls"] += 1
                    task = asyncio.ensure_future(poll())
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(done.wait(), 0.2)
        finally:
            for task in [*tasks, *([spy_task] if spy_task else [])]:
                task.cancel()
            await asyncio.gather(*tasks, *([spy_task] if spy_task else []), return_exceptions=True)
            rpc_log.setLevel(rpc_level)
        out.update(counts_seen=answers[-5:], poll_error_samples=error_samples, py_spy=dumps)
        return out

    def kill_and_recover(
        self,
        ns: str,
        client: raybus.ServiceBusClient,
        queue: str,
        n: int,
        spy: bool = False,
    ) -> dict[str, Any]:
        actor = self.partition(client, queue)
        t0 = time.perf_counter()
        ray.kill(actor, no_restart=False)
        out = self.wait_recovered(ns, queue, n, t0, self.args.timeout_recovery, spy)
        # The restarted actor answers again; its counters start from zero.
        flushes, _entries, _ = self.counters(self.partition(client, queue))
        out["flushes_after_restart"] = flushes
        return out

    def replay_breakdown(
        self, ns: str, client: raybus.ServiceBusClient, queue: str, n: int
    ) -> dict[str, Any]:
        """Where recovery's time goes: the partition actor's recovery steps (``Committer``'s
        ``_recover``) timed one by one in this process, on the queue's log, after its actor
        was killed for good (so nothing else uses the directory). Uses raybus internals.

        Timed twice: as the actor runs them, and with Python's cyclic garbage collector
        disabled (it traverses every object allocated so far, again and again, while a
        million records are created)."""
        from raybus._core.registry import partition_storage_dirs

        route = ray.get(client._aio._conn.registry.route.remote(queue), timeout=60)
        ray.kill(route.partitions[0], no_restart=True)
        dirs = partition_storage_dirs(ns, route.properties.name, route.incarnation, 0)
        out = self._timed_recovery(route.properties, dirs, n)
        gc.collect()
        gc.disable()
        try:
            out["gc_disabled"] = self._timed_recovery(route.properties, dirs, n)
        finally:
            gc.enable()
            gc.collect()
        return out

    def _timed_recovery(self, properties: Any, dirs: tuple[str, ...], n: int) -> dict[str, Any]:
        from raybus._clock import SystemClock
        from raybus._core import journal
        from raybus._core.partition import Partition
        from raybus._storage import DurableLog

        t0 = time.perf_counter()
        log = DurableLog.from_storage_path(self.storage, *dirs)
        found = log.recover()
        t1 = time.perf_counter()
        state = journal.ReplayedState()
        convert = replay = 0.0
        tables = ([found.checkpoint] if found.checkpoint is not None else []) + [
            t for _lsn, t in found.entries
        ]
        del found
        for table in tables:
            a = time.perf_counter()
            entries = journal.from_table(table)
            b = time.perf_counter()
            journal.replay(entries, state)
            convert += b - a
            replay += time.perf_counter() - b
        t2 = time.perf_counter()
        core = Partition(properties, SystemClock(), 0)
        core.load(state)
        core.enable_journal()
        t3 = time.perf_counter()
        if core.message_count() != n:
            raise BenchError(f"offline replay found {core.message_count()} messages, not {n}")
        return {
            "files": len(tables),
            "read_decode_s": t1 - t0,
            "from_table_s": convert,
            "replay_s": replay,
            "load_s": t3 - t2,
            "total_s": t3 - t0,
        }

    def check_peek(self, client: raybus.ServiceBusClient, queue: str, n: int) -> None:
        """The first messages come back in order, with their bodies."""
        receiver = client.get_queue_receiver(queue)
        try:
            msgs = receiver.peek_messages(max_message_count=min(n, 10))
        finally:
            receiver.close()
        ids = [int(m.message_id or -1) for m in msgs]
        if ids != list(range(len(ids))) or not ids:
            raise BenchError(f"peek after recovery returned ids {ids}, expected 0..{len(ids) - 1}")
        if not all(body_ok(int(m.message_id or -1), m.body, self.size) for m in msgs):
            raise BenchError("peek after recovery: a body came back damaged")

    def phase_recovery(self) -> dict[str, Any]:
        args = self.args
        n = args.messages
        ns, client, admin = self.namespace("recovery", "durable")
        q = "recovery"
        nsdir = os.path.join(self.storage, ns)
        out: dict[str, Any] = {"messages": n}
        try:
            with self.watchdog.armed(
                args.timeout_fill + args.recoveries * args.timeout_recovery + 300,
                "recovery phase",
            ):
                self.create_queue(admin, q, "durable")
                actor = self.partition(client, q)
                out["fill_s"] = self.fill(client, q, n, "recovery fill")
                out["fill_msgs_per_s"] = n / out["fill_s"]
                if (got := self.active(admin, q)) != n:
                    raise BenchError(f"queue holds {got} after filling {n}")
                flushes, entries, _ = self.counters(actor)
                out["fill_flushed_entries"] = entries
                out["fill_flushes"] = flushes
                out["disk"] = disk_usage(nsdir)
                kills = []
                for k in range(args.recoveries):
                    kills.append(self.kill_and_recover(ns, client, q, n, spy=args.spy))
                    log_run(
                        {"kill": k, **{key: v for key, v in kills[-1].items() if key != "py_spy"}}
                    )
                    self.check_peek(client, q, n)
                out["kills"] = kills
                out["recovery_s"] = median([r["recovery_s"] for r in kills])
                out["recovery_s_all"] = [r["recovery_s"] for r in kills]
                out["first_answer_s"] = median([r["first_answer_s"] for r in kills])
                if args.breakdown:
                    try:
                        out["breakdown"] = self.replay_breakdown(ns, client, q, n)
                        log_run({"breakdown": out["breakdown"]})
                    except Exception as exc:  # internals may change: a diagnostic only
                        out["breakdown_error"] = f"{type(exc).__name__}: {exc}"
                out["ok"] = True
        except (BenchError, ServiceBusError, ray.exceptions.RayError) as exc:
            out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception), self.watchdog.armed(120, "deleting the queue"):
                admin.delete_queue(q)  # frees the actor's memory and the disk
        log_run({"phase": "recovery", **{k: v for k, v in out.items() if k != "kills"}})
        return out

    def phase_compaction(self) -> dict[str, Any]:
        args = self.args
        n = args.drain_messages
        ns, client, admin = self.namespace("compaction", "durable")
        q = "compaction"
        nsdir = os.path.join(self.storage, ns)
        out: dict[str, Any] = {"messages": n}
        peak = {"bytes": 0, "files": 0}

        def sample() -> None:
            d = disk_usage(nsdir)
            peak["bytes"] = max(peak["bytes"], d["bytes"])
            peak["files"] = max(peak["files"], d["files"])

        try:
            with self.watchdog.armed(
                2 * args.timeout_fill + args.timeout_recovery + 300, "compaction"
            ):
                self.create_queue(admin, q, "durable")
                actor = self.partition(client, q)
                out["disk_empty_queue"] = disk_usage(nsdir)
                out["fill_s"] = self.fill(client, q, n, "compaction fill")
                out["disk_full"] = disk_usage(nsdir)
                sample()
                out["drain_s"] = self.drain(client, q, n, "compaction drain", sample)
                out["drain_msgs_per_s"] = n / out["drain_s"]
                # A checkpoint runs after the flush that made it due: let it finish.
                t0 = time.perf_counter()
                self.flushed(actor)
                stable = disk_usage(nsdir)
                while time.perf_counter() - t0 < 5:
                    time.sleep(0.25)
                    now = disk_usage(nsdir)
                    if now == stable:
                        break
                    stable = now
                out["disk_drained"] = stable
                out["disk_peak_during_drain"] = peak
                if (left := self.active(admin, q)) != 0:
                    raise BenchError(f"{left} messages left after draining")
                checkpoint_lsn = ray.get(
                    actor.__ray_call__.remote(lambda self: self._commit.durable_log.checkpoint_lsn),
                    timeout=30,
                )
                out["checkpoint_lsn"] = checkpoint_lsn
                restart = self.kill_and_recover(ns, client, q, 0)
                out["restart_drained_s"] = restart["recovery_s"]
                out["ok"] = True
        except (BenchError, ServiceBusError, ray.exceptions.RayError) as exc:
            out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception), self.watchdog.armed(120, "deleting the queue"):
                admin.delete_queue(q)
        log_run({"phase": "compaction", **out})
        return out

    def close(self) -> None:
        for client, admin in self.clients:
            with contextlib.suppress(Exception):
                client.close()
            with contextlib.suppress(Exception):
                admin.close()


def log_run(rec: dict[str, Any]) -> None:
    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()}
    print(f"  {shown}", file=sys.stderr)


# ---------------------------------------------------------------------------- reporting


def summarise_rates(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (pattern, mode): medians over rounds; ratio = median of per-round ratios."""
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in runs:
        by.setdefault((r["pattern"], r["mode"]), {})[r["round"]] = r
    rows = []
    for pattern in dict.fromkeys(r["pattern"] for r in runs):
        base = by.get((pattern, "memory"), {})
        for mode in MODES:
            cells = by.get((pattern, mode), {})
            ok = [r for r in cells.values() if r.get("ok")]
            ratios = [
                r["msgs_per_s"] / base[k]["msgs_per_s"]
                for k, r in cells.items()
                if r.get("ok") and base.get(k, {}).get("ok")
            ]
            fl = [r for r in ok if r["flushes"]]
            rows.append(
                {
                    "pattern": pattern,
                    "mode": mode,
                    "rounds_ok": len(ok),
                    "rounds": len(cells),
                    "messages": median([r["messages"] for r in ok]),
                    "seconds": median([r["seconds"] for r in ok]),
                    "msgs_per_s": median([r["msgs_per_s"] for r in ok]),
                    "ratio_vs_memory": median(ratios),
                    "flushes_per_s": median([r["flushes"] / r["seconds"] for r in fl])
                    if mode != "memory"
                    else None,
                    "msgs_per_flush": median([r["messages"] / r["flushes"] for r in fl])
                    if mode != "memory"
                    else None,
                    "entries_per_flush": median([r["flushed_entries"] / r["flushes"] for r in fl])
                    if mode != "memory"
                    else None,
                }
            )
    return rows


def fmt(x: float | None, spec: str, missing: str = "-") -> str:
    return missing if x is None else format(x, spec)


def rates_table(rows: list[dict[str, Any]], label: Callable[[str], str]) -> str:
    out = [
        "| scenario | mode | msgs/s | ÷ memory | flushes/s | msgs/flush | rounds ok |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        failed = r["rounds_ok"] < r["rounds"]
        out.append(
            f"| {label(r['pattern'])} | {r['mode']} | {fmt(r['msgs_per_s'], ',.0f', 'FAILED')} | "
            f"{fmt(r['ratio_vs_memory'], '.2f')} | {fmt(r['flushes_per_s'], ',.1f')} | "
            f"{fmt(r['msgs_per_flush'], ',.1f')} | {r['rounds_ok']}/{r['rounds']}"
            f"{' FAILED' if failed else ''} |"
        )
    return "\n".join(out)


def mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:,.1f} MiB"


def recovery_table(rec: dict[str, Any], comp: dict[str, Any]) -> str:
    out = ["| measurement | value |", "|---|---:|"]
    n = rec["messages"]
    if rec.get("fill_s") is not None:
        out.append(
            f"| fill {n:,} durable messages (lists of {FILL_BATCH}) | {rec['fill_s']:.1f} s "
            f"({rec['fill_msgs_per_s']:,.0f} msgs/s) |"
        )
    if rec.get("disk"):
        d = rec["disk"]
        out.append(
            f"| disk before the kill | {mib(d['bytes'])} in {d['files']:,} files "
            f"({d['bytes'] / n:,.0f} B/msg) |"
        )
    if rec.get("ok"):
        every = ", ".join(f"{x:.2f}" for x in rec["recovery_s_all"])
        out.append(
            f"| **recovery of {n:,} messages** (kill → count answers; median of "
            f"{len(rec['recovery_s_all'])}: {every} s) | **{rec['recovery_s']:.2f} s** |"
        )
        if comp.get("ok"):
            replay = rec["recovery_s"] - comp["restart_drained_s"]
            out.append(
                "| recovery minus the restart of a drained queue (≈ reading + replaying the log) "
                f"| {replay:.2f} s ({n / max(replay, 1e-9):,.0f} msgs/s) |"
            )
        if bd := rec.get("breakdown"):
            out.append(
                f"| the same steps timed in this process ({bd['files']:,} files): read + check + "
                f"decode {bd['read_decode_s']:.2f} s, journal.from_table "
                f"{bd['from_table_s']:.2f} s, journal.replay {bd['replay_s']:.2f} s, "
                f"Partition.load {bd['load_s']:.2f} s | {bd['total_s']:.2f} s |"
            )
            if off := bd.get("gc_disabled"):
                out.append(
                    "| the same with Python's garbage collector disabled: read "
                    f"{off['read_decode_s']:.2f} s, from_table {off['from_table_s']:.2f} s, "
                    f"replay {off['replay_s']:.2f} s, load {off['load_s']:.2f} s "
                    f"| {off['total_s']:.2f} s |"
                )
    else:
        out.append(f"| recovery of {n:,} messages | FAILED: {rec.get('error')} |")
    m = comp["messages"]
    for key, what in (
        ("disk_empty_queue", "disk, new empty queue"),
        ("disk_full", f"disk, {m:,} messages queued"),
        ("disk_peak_during_drain", "disk, peak while draining (sampled)"),
        ("disk_drained", "disk, drained (receive 100 + complete_messages)"),
    ):
        if comp.get(key):
            d = comp[key]
            out.append(f"| {what} | {mib(d['bytes'])} in {d['files']:,} files |")
    if comp.get("drain_s") is not None:
        out.append(
            f"| drain {m:,} durable messages | {comp['drain_s']:.1f} s "
            f"({comp['drain_msgs_per_s']:,.0f} msgs/s) |"
        )
    if comp.get("ok"):
        out.append(
            "| restart of the drained queue (kill → count answers) | "
            f"{comp['restart_drained_s']:.2f} s |"
        )
    elif comp.get("error"):
        out.append(f"| compaction | FAILED: {comp['error']} |")
    return "\n".join(out)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small run (< 3 min)")
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
    p.add_argument("--output", type=Path, help="JSON file (default benchmarks/results/...)")
    args = p.parse_args(argv)
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
