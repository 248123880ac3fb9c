#!/usr/bin/env python
"""Measure and profile raybus's hot paths against the issue 7 targets, with py-spy on every process.

Scenarios (``--scenario``, default all), each against a durable namespace in a temporary
directory; the sender runs in its own process (a Ray actor, so py-spy can attach to it), the
receiver in this process:

* ``e2e``: N x 1 KiB, sender ``send_messages(list of B)`` one call after another; receiver
  with ``prefetch_count`` P, ``receive_messages(B)`` + ``complete_messages``. Also the same
  batches through a bare Ray actor (put / get + ack) for the "share of bare actor calls" ratio.
  ``--send-tasks T`` sends from T asyncio tasks of the one sender at once (the guide's
  "asynchronous operations" per sender): the lists then arrive faster than the receiver takes
  them, and the partition holds a backlog (its collector and checkpoints grow with it).
* ``concurrent``: 100 asyncio senders in one process each sending single messages; a receiver
  doing ``receive_messages(1)`` + ``complete_message`` per message (prefetch P); against
  ``ray.util.queue.Queue`` with 100 concurrent ``put_async`` and one ``get`` per item.
* ``large``: 64 KiB messages in lists of ``--large-batch`` (16; the suite's cells send 100),
  as ``e2e`` (MB/s).
* ``latency``: single messages at a fixed rate (default 1,000 msg/s), send-to-receive latency
  p50/p99 (bodies carry their send time; one machine, one clock).
* ``receive-wait`` (not in ``all``; no Ray): the real ``Partition`` and ``Committer`` on this
  machine's disk, sends of 100 recorded while flushes are under way (as from other callers)
  and a peek-lock receiver with ``complete_message``: how often a receive waits for a flush,
  under the rule before 72e6be8 (any pending change) and the current one (its own changes).

Every scenario reports the CPU time each process spent per 1,000 messages (``/proc``; all
threads, Ray's C++ ones included): on a shared, busy machine rates swing by 2x between runs,
CPU per message much less. ``e2e`` also reports the partition's flush count and the bare
actor's CPU per 1,000 messages. ``--storage-dir /dev/shm`` keeps the durable log off the disk
(whose fsync latency other programs share) for A/B comparisons of raybus's own code;
``--memory`` uses an in-memory namespace.

``--py-spy DIR`` records every process of a scenario (partition actor, sender actor, this
process) with py-spy and prints, per process, the frames with the highest share of samples
(self, and inclusive per raybus function); the raw collapsed stacks stay in DIR. Samples
include threads blocked in system calls (fsync); ``--gil`` samples only the thread holding the
GIL (Python CPU work). Needs ``py-spy`` next to the interpreter (``pip install py-spy``);
without it profiling is skipped with a note.

Run: ``python benchmarks/profile_hot_paths.py [--scenario e2e] [--messages N] [--py-spy DIR]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse
import asyncio
import collections
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import ray

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

from _cpu import cpu_seconds  # noqa: E402

import raybus  # noqa: E402
from raybus import ServiceBusMessage  # noqa: E402
from raybus.management import ServiceBusAdministrationClient  # noqa: E402

SCENARIOS = ("e2e", "concurrent", "large", "latency")
LOCAL = ("receive-wait",)  # no Ray: the partition core and its committer, in this process


def body(i: int, size: int, stamp: bool = False) -> bytes:
    head = i.to_bytes(8, "big")
    if stamp:
        head += int(time.time() * 1e6).to_bytes(8, "big")
    return head + b"\xa5" * (size - len(head))


class Sender:
    """The sender process (a Ray actor): raybus's asyncio client or a bare actor / ray queue."""

    def __init__(self, namespace: str, storage: str) -> None:
        self.namespace, self.storage = namespace, storage
        self.client: Any = None

    def pid(self) -> int:
        return os.getpid()

    async def _sender(self, queue: str) -> Any:
        import raybus.aio

        if self.client is None:
            self.client = raybus.aio.ServiceBusClient(self.namespace, storage_path=self.storage)
        s = self.client.get_queue_sender(queue)
        await s.create_message_batch()  # resolves the route before timing
        return s

    async def lists(
        self, queue: str, n: int, b: int, size: int, tasks: int = 1
    ) -> tuple[float, float]:
        s = await self._sender(queue)
        starts = iter(range(0, n, b))
        t0 = time.time()

        async def worker() -> None:
            for lo in starts:
                hi = min(n, lo + b)
                await s.send_messages(
                    [ServiceBusMessage(body(i, size), message_id=str(i)) for i in range(lo, hi)]
                )

        await asyncio.gather(*(worker() for _ in range(tasks)))
        return t0, time.time()

    async def singles(self, queue: str, n: int, size: int, tasks: int) -> tuple[float, float]:
        s = await self._sender(queue)
        t0 = time.time()

        async def worker(k: int) -> None:
            for i in range(k, n, tasks):
                await s.send_messages(ServiceBusMessage(body(i, size), message_id=str(i)))

        await asyncio.gather(*(worker(k) for k in range(tasks)))
        return t0, time.time()

    async def paced(self, queue: str, n: int, size: int, rate: float) -> tuple[float, float]:
        s = await self._sender(queue)
        t0 = time.time()
        start = time.monotonic()
        pending: set[asyncio.Task[Any]] = set()
        for i in range(n):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            msg = ServiceBusMessage(body(i, size, stamp=True), message_id=str(i))
            task = asyncio.ensure_future(s.send_messages(msg))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
        return t0, time.time()

    async def bare_lists(self, actor: Any, n: int, b: int, size: int) -> tuple[float, float]:
        t0 = time.time()
        for lo in range(0, n, b):
            await actor.put.remote([(i, body(i, size)) for i in range(lo, min(n, lo + b))])
        return t0, time.time()

    async def rayqueue_singles(self, q: Any, n: int, size: int, tasks: int) -> tuple[float, float]:
        t0 = time.time()

        async def worker(k: int) -> None:
            for i in range(k, n, tasks):
                await q.put_async((i, body(i, size)))

        await asyncio.gather(*(worker(k) for k in range(tasks)))
        return t0, time.time()


class BareQueue:
    """The bare-actor baseline: a dict of items plus an in-flight table, acked by id."""

    def __init__(self) -> None:
        self.items: collections.deque[tuple[int, bytes]] = collections.deque()
        self.inflight: dict[int, bytes] = {}
        self.changed = asyncio.Event()

    async def put(self, batch: list[tuple[int, bytes]]) -> int:
        self.items.extend(batch)
        self.changed.set()
        return len(batch)

    async def get(self, n: int, wait_s: float) -> list[tuple[int, bytes]]:
        if not self.items:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), wait_s)
            except asyncio.TimeoutError:
                return []
        out = []
        while self.items and len(out) < n:
            i, b = self.items.popleft()
            self.inflight[i] = b
            out.append((i, b))
        return out

    async def ack(self, ids: list[int]) -> int:
        return sum(self.inflight.pop(i, None) is None for i in ids)


# ---------------------------------------------------------------------------- profiling


class Profiler:
    """py-spy record on a set of PIDs for the duration of a ``with`` block."""

    def __init__(self, out_dir: Path | None, label: str, pids: dict[str, int]) -> None:
        self.spy = Path(sys.executable).with_name("py-spy")
        self.out_dir, self.label, self.pids = out_dir, label, pids
        self.procs: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
        self.extra: list[str] = []  # more py-spy options

    def __enter__(self) -> Profiler:
        self.cpu0 = {role: cpu_seconds(pid) for role, pid in self.pids.items()}
        if self.out_dir is None:
            return self
        if not self.spy.exists():
            print("  (py-spy not installed next to the interpreter: no profile)")
            self.out_dir = None
            return self
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for role, pid in self.pids.items():
            path = self.out_dir / f"{self.label}-{role}.txt"
            cmd = [str(self.spy), "record", "--pid", str(pid), "--format", "raw", "-r", "200"]
            cmd += ["--output", str(path), "--nonblocking", *self.extra]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self.procs.append((role, path, proc))
        time.sleep(1.0)  # py-spy attaches
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu = {role: cpu_seconds(pid) - self.cpu0[role] for role, pid in self.pids.items()}
        for _role, _path, proc in self.procs:
            proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
        for role, path, proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            if path.exists():
                print(summarise_stacks(path, role))

    @property
    def on(self) -> bool:
        return self.out_dir is not None


def summarise_stacks(path: Path, role: str, top: int = 14) -> str:
    """Top frames of a py-spy raw (collapsed) file: self % and inclusive %."""
    selfc: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        selfc[_short(frames[-1])] += n
        for f in {_function(f) for f in frames}:
            incl[f] += n
    if not total:
        return f"  [{role}] no samples"
    out = [f"  [{role}] {total} samples; self %:"]
    out += [f"    {100 * c / total:5.1f}  {f}" for f, c in selfc.most_common(top)]
    out.append(f"  [{role}] inclusive % (raybus functions):")
    keep = [(f, c) for f, c in incl.most_common() if "raybus/" in f]
    out += [f"    {100 * c / total:5.1f}  {f}" for f, c in keep[:top]]
    return "\n".join(out)


def _function(frame: str) -> str:
    """A frame without its line number: inclusive time is per function."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py:123)" keeping the package folder.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    parts = where.split("/")
    return f"{name} ({'/'.join(parts[-2:])})" if where else name


# ---------------------------------------------------------------------------- scenarios


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="raybus-prof-", dir=args.storage_dir)
        self.storage = "memory://" if args.memory else self.tmp
        self.namespace = f"prof-{uuid.uuid4().hex[:8]}"
        self.client = raybus.connect(self.namespace, storage_path=self.storage)
        self.admin = ServiceBusAdministrationClient(self.namespace, storage_path=self.storage)
        cls = ray.remote(Sender).options(num_cpus=0, max_concurrency=1000)
        self.sender = cls.remote(self.namespace, self.storage)
        self.sender_pid = ray.get(self.sender.pid.remote())
        self.counter = 0
        self.results: dict[str, Any] = {}

    def close(self) -> None:
        self.client.close()
        ray.kill(self.sender)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def queue(self) -> str:
        self.counter += 1
        name = f"q{self.counter}"
        self.admin.create_queue(name)
        self.client.get_queue_sender(name).create_message_batch()  # resolve the route
        return name

    def profiler(self, label: str, queue: str) -> Profiler:
        pids = {"receiver": os.getpid(), "sender": self.sender_pid}
        pid = partition_pid(self.client, queue)
        if pid is not None:
            pids["partition"] = pid
        prof = Profiler(self.args.py_spy, label, pids)
        prof.extra = ["--gil"] if self.args.gil else []
        return prof

    def drain(
        self, queue: str, n: int, b: int, prefetch: int, each: bool
    ) -> tuple[float, list[int], list[float]]:
        """Receive n messages; returns (time of the last settlement, ids, latencies)."""
        receiver = self.client.get_queue_receiver(queue, prefetch_count=prefetch)
        ids: list[int] = []
        lat: list[float] = []
        try:
            while len(ids) < n:
                msgs = receiver.receive_messages(max_message_count=b, max_wait_time=5)
                if not msgs:
                    raise RuntimeError(f"{queue}: stalled at {len(ids)} of {n}")
                now = time.time()
                for m in msgs:
                    ids.append(int.from_bytes(m.body[:8], "big"))
                    if self.args.scenario_now == "latency":
                        lat.append(now - int.from_bytes(m.body[8:16], "big") / 1e6)
                if each:
                    for m in msgs:
                        receiver.complete_message(m)
                else:
                    receiver.complete_messages(msgs)
        finally:
            receiver.close()
        return time.time(), ids, lat

    def check(self, what: str, ids: list[int], n: int) -> None:
        if sorted(ids) != list(range(n)):
            raise RuntimeError(f"{what}: {len(ids)} ids, {len(set(ids))} distinct, expected {n}")

    def e2e(self, label: str, n: int, b: int, size: int) -> dict[str, Any]:
        q = self.queue()
        with self.profiler(label, q) as prof:
            ref = self.sender.lists.remote(q, n, b, size, self.args.send_tasks)
            t_end, ids, _ = self.drain(q, n, b, self.args.prefetch, each=False)
            t0, t1 = ray.get(ref)
        self.check(label, ids, n)
        secs = t_end - t0
        out = {"msgs_per_s": n / secs, "mb_per_s": n * size / secs / 1e6, "send_s": t1 - t0}
        out.update(cpu_per_1000(prof.cpu, n))
        out.update(self.partition_stats(q))
        if label == "e2e":
            out["bare_actor_msgs_per_s"] = self.bare(n, b, size)
            out["share_of_bare"] = out["msgs_per_s"] / out["bare_actor_msgs_per_s"]
            out.update(self.bare_cpu)
        return out

    def partition_stats(self, queue: str) -> dict[str, float]:
        route = self.client._aio._conn.cached_route(queue)
        if route is None:
            return {}
        stats = ray.get(route.partitions[0].stats.remote())
        return {key: stats.get(key, 0) for key in ("flushes", "inline_flushes")}

    def bare(self, n: int, b: int, size: int) -> float:
        actor = ray.remote(BareQueue).options(num_cpus=0, max_concurrency=1000).remote()
        try:
            ray.get(actor.ack.remote([]))  # started: its PID is known
            pid = ray._private.state.actors(actor._actor_id.hex()).get("Pid")
            pids = {"receiver": os.getpid(), "sender": self.sender_pid, "actor": int(pid or 0)}
            cpu0 = {role: cpu_seconds(p) for role, p in pids.items()}
            ref = self.sender.bare_lists.remote(actor, n, b, size)
            got = 0
            while got < n:
                items = ray.get(actor.get.remote(b, 5.0))
                if not items:
                    raise RuntimeError("bare actor stalled")
                ray.get(actor.ack.remote([i for i, _ in items]))
                got += len(items)
            t0, _ = ray.get(ref)
            rate = n / (time.time() - t0)
            cpu = {f"bare_{r}": cpu_seconds(p) - cpu0[r] for r, p in pids.items()}
            self.bare_cpu = cpu_per_1000(cpu, n)
            return rate
        finally:
            ray.kill(actor)

    def concurrent(self, n: int, size: int) -> dict[str, Any]:
        q = self.queue()
        with self.profiler("concurrent", q) as prof:
            ref = self.sender.singles.remote(q, n, size, 100)
            t_end, ids, _ = self.drain(q, n, 1, self.args.prefetch, each=True)
            t0, _ = ray.get(ref)
        self.check("concurrent", ids, n)
        rate = n / (t_end - t0)
        rq = self.rayqueue(min(n, 3000), size)
        out = {"msgs_per_s": rate, "rayqueue_msgs_per_s": rq, "over_rayqueue": rate / rq}
        out.update(cpu_per_1000(prof.cpu, n))
        out.update(self.partition_stats(q))
        return out

    def rayqueue(self, n: int, size: int) -> float:
        from ray.util.queue import Queue

        q = Queue(actor_options={"num_cpus": 0})
        try:
            ref = self.sender.rayqueue_singles.remote(q, n, size, 100)
            for _ in range(n):
                q.get(timeout=30)
            t0, _ = ray.get(ref)
            return n / (time.time() - t0)
        finally:
            q.shutdown()

    def latency(self, n: int, size: int) -> dict[str, Any]:
        q = self.queue()
        with self.profiler("latency", q) as prof:
            ref = self.sender.paced.remote(q, n, size, self.args.rate)
            _t_end, ids, lat = self.drain(q, n, 100, 0, each=False)
            ray.get(ref)
        self.check("latency", ids, n)
        lat.sort()
        out = {
            "p50_ms": 1000 * lat[len(lat) // 2],
            "p99_ms": 1000 * lat[int(len(lat) * 0.99)],
            "max_ms": 1000 * lat[-1],
            "mean_ms": 1000 * statistics.mean(lat),
        }
        out.update(cpu_per_1000(prof.cpu, n))
        out.update(self.partition_stats(q))
        return out


def cpu_per_1000(cpu: dict[str, float], n: int) -> dict[str, float]:
    """CPU milliseconds per 1,000 messages, per process: steadier than rates on a busy host."""
    return {f"cpu_ms_per_1000_{role}": 1e6 * secs / n for role, secs in cpu.items()}


async def receive_wait(rule: str, n: int, storage_dir: str | None) -> dict[str, float]:
    """One ``receive-wait`` run (see the module docstring) under ``rule`` ("any" or "own")."""
    from raybus._clock import SystemClock
    from raybus._core.committer import Committer
    from raybus._core.partition import COMPLETE, Partition, SettleOp
    from raybus._core.record import MessageRecord
    from raybus._models import QueueProperties
    from raybus._storage import DurableLog

    tmp = tempfile.mkdtemp(prefix="raybus-prof-", dir=storage_dir)
    c = Committer(
        lambda: Partition(QueueProperties(name="q"), SystemClock(), 0, export=lambda r: r),
        DurableLog.from_storage_path(tmp, "p"),
    )
    waits: list[float] = []
    done = 0
    keep: set[asyncio.Future[None]] = set()

    def flush_later() -> None:  # a caller that waits for its flush elsewhere
        fut = asyncio.ensure_future(c.durable())
        keep.add(fut)
        fut.add_done_callback(keep.discard)

    async def sender() -> None:
        i = 0
        while done < n:
            c.core.send([MessageRecord(body=body(i + j, 1024), size=1100) for j in range(100)])
            i += 100
            flush_later()
            await asyncio.sleep(0.002)

    t0 = time.perf_counter()
    task = asyncio.ensure_future(sender())
    while done < n:
        mark = c.core.journal_size()
        got = c.core.receive(100)
        started = time.perf_counter()
        if rule == "any":
            await c.durable(after_inflight=False)
        else:
            await c.durable_since(mark)
        waits.append(time.perf_counter() - started)
        if got:
            done += len(got)
            c.core.settle([SettleOp(COMPLETE, r.lock_token) for r in got])
            flush_later()
        await asyncio.sleep(0.001)
    secs = time.perf_counter() - t0
    await task
    await asyncio.gather(*keep)
    await c.checkpoint_now()
    shutil.rmtree(tmp, ignore_errors=True)
    return {
        "receives": len(waits),
        "waited_pct": 100 * sum(w > 1e-4 for w in waits) / len(waits),
        "mean_wait_ms": 1000 * statistics.mean(waits),
        "msgs_per_s": n / secs,
        "flushes": c.flushes,
    }


def partition_pid(client: raybus.ServiceBusClient, queue: str) -> int | None:
    """PID of the queue's (first) partition actor, from Ray's actor table (read-only)."""
    route = client._aio._conn.cached_route(queue)
    if route is None:
        return None
    handle = route.partitions[0]
    pid = ray._private.state.actors(handle._actor_id.hex()).get("Pid")
    return int(pid) if pid else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=[*SCENARIOS, *LOCAL, "all"], default="all")
    p.add_argument("--messages", type=int, default=20000, help="per scenario (large: / 16)")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--large-batch", type=int, default=16, help="large scenario's list length")
    p.add_argument("--prefetch", type=int, default=200)
    p.add_argument(
        "--send-tasks", type=int, default=1, help="e2e: sender tasks sending lists at once"
    )
    p.add_argument("--rate", type=float, default=1000.0, help="latency scenario, msgs/s")
    p.add_argument("--py-spy", type=Path, help="record every process with py-spy into DIR")
    p.add_argument("--gil", action="store_true", help="py-spy: only the thread holding the GIL")
    p.add_argument("--memory", action="store_true", help="an in-memory namespace instead")
    p.add_argument(
        "--storage-dir",
        help="where the durable namespace lives (default: the temp dir; /dev/shm takes the "
        "disk's fsync latency, shared with everything else on the machine, out of A/B runs)",
    )
    p.add_argument("--output", type=Path, help="JSON results file")
    args = p.parse_args(argv)
    if args.scenario in LOCAL:
        for rule in ("any", "own", "any", "own"):
            r = asyncio.run(receive_wait(rule, args.messages, args.storage_dir))
            print(f"   {rule}: " + json.dumps({k: round(v, 3) for k, v in r.items()}), flush=True)
        return 0
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=300 * 1024 * 1024,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    run = Run(args)
    results: dict[str, Any] = {"loadavg_start": os.getloadavg()}
    n = args.messages
    try:
        for sc in SCENARIOS if args.scenario == "all" else (args.scenario,):
            args.scenario_now = sc
            print(f"-- {sc}", flush=True)
            if sc == "e2e":
                r = run.e2e("e2e", n, args.batch, 1024)
            elif sc == "large":
                b = args.large_batch
                r = run.e2e("large", max(b, n // 16), b, 64 * 1024)
            elif sc == "concurrent":
                r = run.concurrent(n, 1024)
            else:
                r = run.latency(min(n, int(args.rate * 10)), 1024)
            results[sc] = r
            print("   " + json.dumps({k: round(v, 3) for k, v in r.items()}), flush=True)
    finally:
        run.close()
        ray.shutdown()
    results["loadavg_end"] = os.getloadavg()
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
