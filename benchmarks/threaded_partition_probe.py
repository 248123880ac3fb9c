#!/usr/bin/env python
"""Would a threaded partition actor pay? The same partition logic as two actors, end to end.

raybus's partition is an async Ray actor: every call goes from Ray's task thread (a fiber) to
the actor's event loop and back. A threaded actor runs the call on Ray's thread itself, which
costs less per call (``benchmarks/RESULTS.md``), but group commit and long polls then have to
wait on threading primitives. This probe measures what that would buy before anyone rewrites
``PartitionActor`` and ``Committer``:

* ``AsyncProbe``: raybus's ``Partition`` core and its ``Committer`` (group commit, flushes over
  64 KiB in a worker thread), long polls on an ``asyncio.Event``, as the partition actor does;
* ``ThreadedProbe``: the same core under one lock, a flusher thread doing the group commit
  (every flush in that thread), callers waiting on a ``threading.Condition``.

``--pool`` measures the other side of a threaded actor instead: Ray creates all
``max_concurrency`` threads of a threaded actor when it starts, and a long poll holds one of
them for its whole wait. It reports, for threaded actors of 64, 1,000 and 4,000 threads and
for raybus's async actor setting (10,000), the OS threads, resident memory and seconds to the
first answer, and how long a send to a threaded actor of 64 threads takes while 0, 63 and 64
receivers wait in it (1 s long polls).

Both write to a real durable log (fsync) in a temporary directory below ``--dir``. Neither has
the actor's access checks, metrics or fail points: the probe compares the two ways of running
the same work, not raybus against itself. The driver: one sender (lists of 100 x 1 KiB, one
call in flight) and one receiver (receive up to 100, then complete them), three calls per 100
messages. Reported per round, alternating: messages/s and the actor's CPU per 1,000 messages
(its whole process, ``os.times``).

    python benchmarks/threaded_partition_probe.py [--messages 20000] [--rounds 3] [--pool]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from typing import Any

# Before Ray: sets Ray's environment and puts this checkout on the workers' import paths.
import _common
import ray

BATCH = 100


def _core() -> Any:
    from raybus._clock import SystemClock
    from raybus._core.partition import Partition
    from raybus._models import QueueProperties

    return Partition(QueueProperties(name="probe"), SystemClock(), 0)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


@ray.remote(num_cpus=0, max_concurrency=1000)
class AsyncProbe:
    def __init__(self, path: str) -> None:
        from raybus._core.committer import Committer
        from raybus._storage import DurableLog

        self.commit = Committer(_core, DurableLog.from_storage_path(path, "async"))
        self.changed: asyncio.Event | None = None

    def cpu(self) -> float:
        return _cpu()

    def _notify(self) -> None:
        if self.changed is not None:
            self.changed.set()
        self.changed = asyncio.Event()

    async def send(self, rows: list[Any]) -> int:
        from raybus._core.record import from_wire

        self.commit.core.send(from_wire(rows))
        await self.commit.durable()
        self._notify()
        return len(rows)

    async def receive(self, n: int, wait: float) -> list[Any]:
        from raybus._core.record import to_wire

        if self.changed is None:
            self.changed = asyncio.Event()
        deadline = time.monotonic() + wait
        while True:
            core = self.commit.core
            mark = core.journal_size()
            got = core.receive(n, dead_letter=False, delete=False)
            if got or time.monotonic() >= deadline:
                rows = to_wire(got)
                await self.commit.durable_since(mark)
                return rows
            try:
                await asyncio.wait_for(self.changed.wait(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                pass

    async def complete(self, tokens: list[str]) -> int:
        from raybus._core.partition import COMPLETE, SettleOp

        results = self.commit.core.settle([SettleOp(COMPLETE, t) for t in tokens])
        await self.commit.durable()
        return sum(r is not None for r in results)


@ray.remote(num_cpus=0, max_concurrency=64)
class ThreadedProbe:
    def __init__(self, path: str) -> None:
        from raybus._storage import DurableLog

        self.core = _core()
        self.core.enable_journal()
        self.core.visible_seq = 0
        self.log = DurableLog.from_storage_path(path, "threaded")
        self.log.recover()
        self.lock = threading.Lock()
        self.progress = threading.Condition(self.lock)  # a flush done (and messages visible)
        self.work = threading.Condition(self.lock)  # changes waiting for the flusher
        self.recorded = 0  # callers that recorded changes, in order
        self.flushed = 0  # of those, how many are durable
        threading.Thread(target=self._flusher, daemon=True).start()

    def cpu(self) -> float:
        return _cpu()

    def _flusher(self) -> None:
        from raybus._core import journal

        while True:
            with self.lock:
                while not self.core.has_journal():
                    self.work.wait()
                entries, last = self.core.take_journal()
                upto = self.recorded
            self.log.append(journal.to_table(entries))  # outside the lock: calls go on
            with self.lock:
                self.flushed = upto
                self.core.visible_seq = max(self.core.visible_seq or 0, last)
                self.progress.notify_all()

    def _durable(self) -> None:
        """With the lock held: wait until what this caller recorded is durable."""
        self.recorded += 1
        mine = self.recorded
        self.work.notify()
        while self.flushed < mine:
            self.progress.wait()

    def send(self, rows: list[Any]) -> int:
        from raybus._core.record import from_wire

        records = from_wire(rows)
        with self.lock:
            self.core.send(records)
            self._durable()
        return len(rows)

    def receive(self, n: int, wait: float) -> list[Any]:
        from raybus._core.record import to_wire

        deadline = time.monotonic() + wait
        with self.lock:
            while True:
                got = self.core.receive(n, dead_letter=False, delete=False)
                left = deadline - time.monotonic()
                if got or left <= 0:
                    rows = to_wire(got)
                    if self.core.has_journal():
                        self._durable()
                    return rows
                self.progress.wait(left)

    def complete(self, tokens: list[str]) -> int:
        from raybus._core.partition import COMPLETE, SettleOp

        with self.lock:
            results = self.core.settle([SettleOp(COMPLETE, t) for t in tokens])
            self._durable()
        return sum(r is not None for r in results)


async def drive(actor: Any, n: int) -> None:
    """One sender and one receiver through ``actor`` until ``n`` messages are completed;
    raises ``TimeoutError`` past ``n / 100`` seconds (a stuck probe stops by itself)."""
    from raybus import ServiceBusMessage
    from raybus._core.record import from_wire, to_wire
    from raybus.aio._sender import _records

    lists = [
        to_wire(_records([ServiceBusMessage(bytes([i % 256]) * 1024) for i in range(BATCH)]))
        for _ in range(3)
    ]

    async def sender() -> None:
        for k in range(n // BATCH):
            await actor.send.remote(lists[k % 3])

    async def receiver() -> None:
        got = 0
        while got < n:
            rows = await actor.receive.remote(BATCH, 1.0)
            got += len(rows)
            if rows:
                refused = await actor.complete.remote([r.lock_token for r in from_wire(rows)])
                if refused:
                    raise RuntimeError(f"{refused} completions refused")

    await asyncio.wait_for(asyncio.gather(sender(), receiver()), max(30.0, n / 100))


def _process() -> tuple[int, int]:
    """This process's OS threads and resident memory (KiB)."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


class _PoolProbe:
    """A long poll that holds its thread (threaded) or awaits (async), and a send."""

    def __init__(self) -> None:
        self.changed = threading.Event()

    def process(self) -> tuple[int, int]:
        return _process()

    def send(self) -> float:
        return time.monotonic()


class _ThreadedPool(_PoolProbe):
    def poll(self, wait: float) -> bool:
        return self.changed.wait(wait)


class _AsyncPool(_PoolProbe):
    async def poll(self, wait: float) -> bool:
        await asyncio.sleep(wait)
        return False


async def pool(args: argparse.Namespace) -> None:
    """The ``--pool`` measurements (module docstring)."""
    for kind, cls, threads in (
        ("threaded", _ThreadedPool, 64),
        ("threaded", _ThreadedPool, 1000),
        ("threaded", _ThreadedPool, 4000),
        ("async", _AsyncPool, 10_000),
    ):
        t0 = time.perf_counter()
        actor = ray.remote(cls).options(num_cpus=0, max_concurrency=threads).remote()
        os_threads, rss = await actor.process.remote()
        started = time.perf_counter() - t0
        print(
            f"{kind:8s} max_concurrency {threads:6,d}: {os_threads:5,d} OS threads, "
            f"{rss / 1024:6.1f} MiB resident, first answer after {started:.2f} s",
            flush=True,
        )
        ray.kill(actor)
    actor = ray.remote(_ThreadedPool).options(num_cpus=0, max_concurrency=64).remote()
    await actor.send.remote()
    for waiting in (0, 63, 64):
        polls = [actor.poll.remote(1.0) for _ in range(waiting)]
        await asyncio.sleep(0.3)  # the polls are in the actor's threads now
        t0 = time.monotonic()
        answered = await actor.send.remote()
        print(
            f"threaded, 64 threads, {waiting:2d} receivers waiting: a send answered after "
            f"{1000 * (answered - t0):7.1f} ms (in the actor), "
            f"{1000 * (time.monotonic() - t0):7.1f} ms (at the caller)",
            flush=True,
        )
        await asyncio.gather(*polls)
    ray.kill(actor)


async def run(args: argparse.Namespace) -> None:
    if args.pool:
        await pool(args)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as path:
        probes = {"async": AsyncProbe.remote(path), "threaded": ThreadedProbe.remote(path)}
        for actor in probes.values():
            await drive(actor, 2 * BATCH * 10)  # warm-up
        for rnd in range(args.rounds):
            for name, actor in probes.items():
                c0 = await actor.cpu.remote()
                t0 = time.perf_counter()
                await drive(actor, args.messages)
                elapsed = time.perf_counter() - t0
                cpu = await actor.cpu.remote() - c0
                print(
                    f"round {rnd} {name:9s} {args.messages / elapsed:8,.0f} msg/s, actor CPU "
                    f"{1e6 * cpu / args.messages:6.1f} ms per 1,000 messages",
                    flush=True,
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20000, help="per round and probe")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the temporary logs go")
    ap.add_argument("--pool", action="store_true", help="thread pools and long polls instead")
    args = ap.parse_args()
    _common.start_local_ray(300)
    try:
        asyncio.run(run(args))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
