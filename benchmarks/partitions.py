#!/usr/bin/env python
"""Partitioned queues: throughput at 1, 2, 4 and 8 partitions, and the pause that receivers see
while the partition count changes. One run on one local Ray cluster.

1. **Throughput.** For each partition count P a queue is created with ``partition_count=P``
   and, in the same run, P bare Ray actors (a deque each: the engine's ceiling). Each repeat:

   * **send**: ``--senders`` asyncio tasks (one ``raybus.aio`` client each) send N messages of
     ``--body-size`` bytes in lists of ``--batch`` (the bare peer: ``put(batch)`` calls that
     go round robin over the P actors);
   * **receive+complete**: ``--receivers`` asyncio tasks (one client each) drain the queue that
     the send filled: ``receive_messages(batch)`` then ``complete_messages`` (the bare peer:
     ``get(batch)`` from one actor after another, then ``ack(ids)``).

   Rates are medians over repeats; ``÷ P=1`` and ``raybus ÷ bare`` are medians of per-repeat
   ratios. The CPU each group of processes used (driver, partition actors, bare actors, Ray's
   own) is read from ``/proc`` around every phase: on a small machine it says what limits.
2. **Pause.** A queue of 2 partitions gets a steady open-loop load (``--pause-rate`` msgs/s in
   lists of ``--pause-batch``, each message stamped with ``time.time()`` in its application
   properties) and one receiver (receive 100 + ``complete_messages``) for ``--pause-seconds``.
   At 30 % of the run ``update_queue(partition_count=4)``, at 60 % back to 2, each followed by
   ``wait_for_partitions``. Reported: the send-to-receive latency (p50, p99, max) of messages
   sent around each change against steady state, the longest gap between two receives, how
   long ``update_queue`` and ``wait_for_partitions`` took, and a check that every acknowledged
   message arrived exactly once (by message id).

Every phase checks its counts (each message id exactly once, bodies intact, queue empty
afterwards) and fails loudly. The default storage is ``memory://``; without ``--quick`` the same
measurements run again on a durable namespace in a temporary directory.

Run: ``python benchmarks/partitions.py [--quick]``. Writes Markdown tables to stdout and JSON to
``benchmarks/results/partitions-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common

ROOT = _common.ROOT

import ray  # noqa: E402
from _common import BenchError, Deadline, body_ok, make_body, progress  # noqa: E402
from _cpu import CpuSampler, cpu_snapshot, cpu_used  # noqa: E402
from _partitions_report import PARTITION_COUNTS, analyse_pause, log_cell, report_text, summarise  # noqa: E402

import raybus  # noqa: E402
import raybus.aio  # noqa: E402
from raybus import ServiceBusMessage  # noqa: E402
from raybus.exceptions import ServiceBusError  # noqa: E402

LOCK_S = 300  # no lock may expire during a run (a redelivery would look like a duplicate)
MAX_SIZE_MB = 80 * 1024


# ---------------------------------------------------------------------------- helpers


def verify(ids: list[int], n: int, bad_bodies: int, what: str) -> None:
    """Every id in range(n) exactly once, bodies intact."""
    counts = Counter(ids)
    dup = sum(c - 1 for c in counts.values() if c > 1)
    missing = n - len(counts.keys() & set(range(n)))
    extra = len(counts.keys() - set(range(n)))
    if dup or missing or extra or bad_bodies:
        raise BenchError(
            f"{what}: {dup} duplicates, {missing} missing, {extra} unexpected of {n}, "
            f"{bad_bodies} bad bodies"
        )


async def bounded(aw: Awaitable[Any], deadline: Deadline) -> Any:
    try:
        return await asyncio.wait_for(aw, deadline.left())
    except asyncio.TimeoutError:
        raise BenchError(f"{deadline.what}: not done within {deadline.seconds:g} s") from None


@dataclass
class Drain:
    """Shared state of the receivers of one drain."""

    n: int
    count: int = 0
    t_end: float = 0.0
    ids: list[int] = field(default_factory=list)
    bad: int = 0
    calls: dict[str, int] = field(default_factory=dict)

    def add_call(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1


# ---------------------------------------------------------------------------- the bench


class Bench:
    def __init__(self, args: argparse.Namespace, tmpdir: str | None) -> None:
        self.args = args
        self.tmpdir = tmpdir
        self.run_id = uuid.uuid4().hex[:6]
        self.watchdog = _common.Watchdog(
            (lambda: shutil.rmtree(tmpdir, ignore_errors=True)) if tmpdir else (lambda: None)
        )
        self.bare: dict[int, list[Any]] = {}
        self.rpc = _common.RpcCounter(sync=False, ignore=frozenset({"route"}))
        self.modes_left = 0
        self.started = time.time()
        self.errors: list[str] = []
        self.skipped: list[str] = []
        self.runs_done: list[dict[str, Any]] = []
        self.pauses: list[dict[str, Any]] = []

    # -- throughput ---------------------------------------------------------------------

    def bare_actors(self, p: int) -> list[Any]:
        if p not in self.bare:
            cls: Any = ray.remote(_common.BareQueue)
            actors = [cls.options(num_cpus=0, max_concurrency=1000).remote() for _ in range(p)]
            ray.get([a.ping.remote() for a in actors], timeout=self.args.timeout)
            self.bare[p] = actors
        return self.bare[p]

    def close_bare(self) -> None:
        for actors in self.bare.values():
            for a in actors:
                with contextlib.suppress(Exception):
                    ray.kill(a, no_restart=True)
        self.bare.clear()

    async def raybus_cell(
        self,
        senders: list[Any],
        receivers: list[Any],
        admin: Any,
        queue: str,
        n: int,
        what: str,
    ) -> dict[str, Any]:
        """Send n messages (ids 0..n-1) with the senders, then drain them with the receivers."""
        args = self.args
        size, b = args.body_size, args.batch
        out: dict[str, Any] = {}
        k = len(senders)
        bounds = [(j * n // k, (j + 1) * n // k) for j in range(k)]

        async def send(sender: Any, lo: int, hi: int) -> None:
            for a in range(lo, hi, b):
                await sender.send_messages(
                    [
                        ServiceBusMessage(make_body(i, size), message_id=str(i))
                        for i in range(a, min(hi, a + b))
                    ]
                )

        gc.collect()
        c0, r0 = cpu_snapshot(), self.rpc.snapshot()
        t0 = time.perf_counter()
        await bounded(
            asyncio.gather(*(send(s, lo, hi) for s, (lo, hi) in zip(senders, bounds, strict=True))),
            Deadline(args.timeout, f"{what} send"),
        )
        t1 = time.perf_counter()
        out["send_s"] = t1 - t0
        out["send_cpu"] = cpu_used(c0, cpu_snapshot(), t1 - t0)
        out["send_actor_calls"] = self.rpc.since(r0)
        try:  # per partition: raybus internals, only for the record
            _route, counts = await admin._conn.registry.counts.remote(queue)
            out["per_partition"] = [c.active for c in counts]
        except Exception:
            out["per_partition"] = None
        held = (await admin.get_queue_runtime_properties(queue)).active_message_count
        if held != n:
            raise BenchError(f"{what}: queue holds {held} after sending {n}")

        state = Drain(n)

        async def drain(receiver: Any) -> None:
            while state.count < n:
                msgs = await receiver.receive_messages(max_message_count=b, max_wait_time=0.2)
                state.add_call("receive_messages")
                if not msgs:
                    continue
                for m in msgs:
                    i = int(m.message_id)
                    state.ids.append(i)
                    if not body_ok(i, m.body, size):
                        state.bad += 1
                await receiver.complete_messages(msgs)
                state.add_call("complete_messages")
                state.count += len(msgs)
                if state.count >= n and not state.t_end:
                    state.t_end = time.perf_counter()

        gc.collect()
        c0, r0 = cpu_snapshot(), self.rpc.snapshot()
        t0 = time.perf_counter()
        await bounded(
            asyncio.gather(*(drain(r) for r in receivers)), Deadline(args.timeout, f"{what} drain")
        )
        t1 = state.t_end or time.perf_counter()
        out["recv_s"] = t1 - t0
        out["recv_cpu"] = cpu_used(c0, cpu_snapshot(), t1 - t0)
        out["recv_calls"] = state.calls
        out["recv_actor_calls"] = self.rpc.since(r0)
        verify(state.ids, n, state.bad, what)
        rt = await admin.get_queue_runtime_properties(queue)
        if rt.active_message_count or rt.dead_letter_message_count:
            raise BenchError(
                f"{what}: {rt.active_message_count} active, {rt.dead_letter_message_count} "
                "dead-lettered after draining"
            )
        out["partition_count"] = rt.partition_count
        return out

    async def bare_cell(self, actors: list[Any], n: int, what: str) -> dict[str, Any]:
        """The same batches through P bare actors: put round robin, get + ack one by one."""
        args = self.args
        size, b, p = args.body_size, args.batch, len(actors)
        out: dict[str, Any] = {}
        k = args.senders
        bounds = [(j * n // k, (j + 1) * n // k) for j in range(k)]

        async def put(j: int, lo: int, hi: int) -> None:
            turn = j
            for a in range(lo, hi, b):
                actor = actors[turn % p]
                turn += 1
                await actor.put.remote([(i, make_body(i, size)) for i in range(a, min(hi, a + b))])

        gc.collect()
        c0 = cpu_snapshot()
        t0 = time.perf_counter()
        await bounded(
            asyncio.gather(*(put(j, lo, hi) for j, (lo, hi) in enumerate(bounds))),
            Deadline(args.timeout, f"{what} put"),
        )
        t1 = time.perf_counter()
        out["send_s"] = t1 - t0
        out["send_cpu"] = cpu_used(c0, cpu_snapshot(), t1 - t0)
        out["send_actor_calls"] = {"put": sum(-(-(hi - lo) // b) for lo, hi in bounds)}
        per = [q for q, _ in await asyncio.gather(*(a.counts.remote() for a in actors))]
        out["per_partition"] = per
        if sum(per) != n:
            raise BenchError(f"{what}: actors hold {sum(per)} after putting {n}")

        state = Drain(n)

        async def drain(j: int) -> None:
            turn, misses = j, 0
            while state.count < n:
                actor = actors[turn % p]
                turn += 1
                # Empty actors in a row: wait a little on the next (no busy loop at the end).
                items = await actor.get.remote(b, 0.05 if misses >= p else 0.0)
                state.add_call("get")
                if not items:
                    misses += 1
                    continue
                misses = 0
                for i, body in items:
                    state.ids.append(i)
                    if not body_ok(i, body, size):
                        state.bad += 1
                unknown = await actor.ack.remote([i for i, _ in items])
                state.add_call("ack")
                if unknown:
                    raise BenchError(f"{what}: {unknown} acks of unknown ids")
                state.count += len(items)
                if state.count >= n and not state.t_end:
                    state.t_end = time.perf_counter()

        gc.collect()
        c0 = cpu_snapshot()
        t0 = time.perf_counter()
        await bounded(
            asyncio.gather(*(drain(j) for j in range(args.receivers))),
            Deadline(args.timeout, f"{what} drain"),
        )
        t1 = state.t_end or time.perf_counter()
        out["recv_s"] = t1 - t0
        out["recv_cpu"] = cpu_used(c0, cpu_snapshot(), t1 - t0)
        out["recv_calls"] = state.calls
        out["recv_actor_calls"] = dict(state.calls)
        verify(state.ids, n, state.bad, what)
        left = await asyncio.gather(*(a.counts.remote() for a in actors))
        if any(q or f for q, f in left):
            raise BenchError(f"{what}: bare actors not empty after draining: {left}")
        return out

    async def throughput(self, mode: str, storage: str, runs: list[dict[str, Any]]) -> None:
        """Every partition count in turn: create its queue and its P bare actors, warm up, run
        ``--repeats`` rounds (raybus and bare alternating), delete both. Only the processes of
        the partition count under test exist meanwhile (an idle actor process costs about 1 %
        of a core, which matters on 2 cores)."""
        args = self.args
        ns = f"part-{self.run_id}-{mode}"
        admin = raybus.aio.ServiceBusAdministrationClient(ns, storage_path=storage)
        n_clients = max(args.senders, args.receivers)
        clients = [raybus.aio.ServiceBusClient(ns, storage_path=storage) for _ in range(n_clients)]
        t_mode = time.time()
        for gi, p in enumerate(PARTITION_COUNTS):
            q = f"tp-p{p}"
            receivers: list[Any] = []
            try:
                with self.watchdog.armed(args.timeout + 120, f"{mode}: create queue of {p}"):
                    t = time.perf_counter()
                    await admin.create_queue(
                        q,
                        partition_count=p,
                        lock_duration=LOCK_S,
                        max_size_in_megabytes=MAX_SIZE_MB,
                    )
                    created = time.perf_counter() - t
                    t = time.perf_counter()
                    actors = self.bare_actors(p)
                    bare_created = time.perf_counter() - t
                senders = [c.get_queue_sender(q) for c in clients[: args.senders]]
                receivers = [
                    c.get_queue_receiver(q, prefetch_count=0) for c in clients[: args.receivers]
                ]
                runs.append(
                    {
                        "kind": "setup",
                        "mode": mode,
                        "partitions": p,
                        "create_queue_s": created,
                        "create_bare_s": bare_created,
                    }
                )
                # Warm-up (not recorded): first calls of every client, partition and actor.
                warm = args.batch * n_clients * 2
                with self.watchdog.armed(3 * args.timeout + 60, f"{mode}: warm-up P={p}"):
                    await self.raybus_cell(senders, receivers, admin, q, warm, f"warm-up {p}")
                    await self.bare_cell(actors, warm, f"warm-up bare {p}")
                progress(
                    f"[{mode}] P={p}: queue created in {created:.1f} s, {p} bare actor(s) in "
                    f"{bare_created:.1f} s, warmed up"
                )
                t_group = time.time()
                rep_s = 0.0
                for rep in range(args.repeats):
                    # The time left is shared by the partition counts (and modes) still to go.
                    groups_left = (
                        len(PARTITION_COUNTS) - gi + self.modes_left * len(PARTITION_COUNTS)
                    )
                    share = (args.budget - (time.time() - self.started)) / groups_left
                    if rep and time.time() - t_group + rep_s > share:
                        progress(f"  time budget: skipping repeats {rep}+ of {mode} P={p}")
                        self.skipped.append(f"{mode} P={p}: repeats {rep}..{args.repeats - 1}")
                        break
                    t_rep = time.time()
                    systems = ("raybus", "bare") if rep % 2 == 0 else ("bare", "raybus")
                    for system in systems:
                        await self.one_cell(
                            mode, system, p, rep, senders, receivers, admin, q, actors, clients
                        )
                    rep_s = time.time() - t_rep
            finally:
                for r in receivers:
                    with contextlib.suppress(Exception):
                        await r.close()
                with (
                    contextlib.suppress(Exception),
                    self.watchdog.armed(120, f"{mode}: delete {q}"),
                ):
                    await admin.delete_queue(q)
                self.close_bare()
        progress(f"[{mode}] throughput done in {time.time() - t_mode:.0f} s")

    async def one_cell(
        self,
        mode: str,
        system: str,
        p: int,
        rep: int,
        senders: list[Any],
        receivers: list[Any],
        admin: Any,
        q: str,
        actors: list[Any],
        clients: list[Any],
    ) -> None:
        args = self.args
        what = f"{mode} {system} P={p} repeat {rep}"
        rec: dict[str, Any] = {
            "kind": "throughput",
            "mode": mode,
            "system": system,
            "partitions": p,
            "repeat": rep,
            "messages": args.messages,
        }
        try:
            with self.watchdog.armed(3 * args.timeout + 60, what):
                if system == "raybus":
                    res = await self.raybus_cell(senders, receivers, admin, q, args.messages, what)
                else:
                    res = await self.bare_cell(actors, args.messages, what)
            rec.update(res, ok=True)
        except (BenchError, ServiceBusError, ray.exceptions.RayError) as exc:
            rec.update(ok=False, error=f"{type(exc).__name__}: {exc}")
            self.errors.append(f"{what}: {rec['error']}")
            progress(f"FAILED {what}: {rec['error']}")
            # A failed drain may leave messages: start the next one empty.
            if system == "raybus":
                await self.purge(clients[0], q)
            else:
                for a in actors:
                    with contextlib.suppress(Exception):
                        ray.kill(a, no_restart=True)
                self.bare.pop(p, None)
                actors[:] = self.bare_actors(p)
        self.runs_done.append(rec)
        log_cell(rec)

    async def purge(self, client: Any, queue: str) -> None:
        from raybus import ServiceBusReceiveMode

        with contextlib.suppress(Exception), self.watchdog.armed(120, f"purge {queue}"):
            r = client.get_queue_receiver(
                queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
            )
            while await r.receive_messages(1000, max_wait_time=0.5):
                pass
            await r.close()

    # -- pause ----------------------------------------------------------------------------

    async def pause(self, mode: str, storage: str) -> dict[str, Any]:
        """Steady load on a queue of 2 partitions while it grows to 4 and shrinks back."""
        ns = f"part-{self.run_id}-{mode}"
        admin = raybus.aio.ServiceBusAdministrationClient(ns, storage_path=storage)
        q = "pause"
        await admin.create_queue(
            q, partition_count=2, lock_duration=LOCK_S, max_size_in_megabytes=MAX_SIZE_MB
        )
        send_client = raybus.aio.ServiceBusClient(ns, storage_path=storage)
        recv_client = raybus.aio.ServiceBusClient(ns, storage_path=storage)
        sender = send_client.get_queue_sender(q)
        receiver = recv_client.get_queue_receiver(q, prefetch_count=0)
        try:
            # Warm-up: routes resolved, both partitions called once.
            await sender.send_messages([ServiceBusMessage(b"w") for _ in range(10)])
            got = 0
            while got < 10:
                msgs = await receiver.receive_messages(100, max_wait_time=5)
                if not msgs:
                    raise BenchError(f"{mode} pause: warm-up messages did not arrive")
                await receiver.complete_messages(msgs)
                got += len(msgs)
            return await self._pause_run(admin, sender, receiver, q, mode)
        finally:
            with contextlib.suppress(Exception):
                await receiver.close()
            with contextlib.suppress(Exception), self.watchdog.armed(120, f"delete {q}"):
                await admin.delete_queue(q)

    async def _pause_run(
        self, admin: Any, sender: Any, receiver: Any, q: str, mode: str
    ) -> dict[str, Any]:
        args = self.args
        duration, rate, b = args.pause_seconds, args.pause_rate, args.pause_batch
        body = b"p" * args.pause_body_size
        interval = b / rate
        sends = int(duration * rate) // b
        received: list[tuple[int, float, float]] = []  # (id, stamped at, received at)
        seen: set[int] = set()
        acked: set[int] = set()
        ack_lat: list[tuple[float, float]] = []  # (stamped at, ack latency)
        send_errors: list[str] = []
        changes: list[dict[str, Any]] = []
        lateness = 0.0
        sending_done = asyncio.Event()
        outstanding: set[asyncio.Task[None]] = set()
        cap = asyncio.Semaphore(max(100, 10 * int(rate / b)))  # ~10 s of sends in flight at most

        t0_wall = time.time()
        t0 = time.monotonic()

        async def send_one(ids: range, msgs: list[ServiceBusMessage], stamp: float) -> None:
            try:
                await sender.send_messages(msgs)
                ack_lat.append((stamp, time.time() - stamp))
                acked.update(ids)
            except Exception as exc:  # recorded; the check counts these as not sent
                send_errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                cap.release()

        async def send_loop() -> None:
            nonlocal lateness
            for k in range(sends):
                due = t0 + k * interval
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await cap.acquire()
                lateness = max(lateness, time.monotonic() - due)
                stamp = time.time()
                ids = range(k * b, (k + 1) * b)
                msgs = [
                    ServiceBusMessage(body, message_id=str(i), application_properties={"t": stamp})
                    for i in ids
                ]
                task = asyncio.ensure_future(send_one(ids, msgs, stamp))
                outstanding.add(task)
                task.add_done_callback(outstanding.discard)
            if outstanding:
                await asyncio.gather(*list(outstanding))
            sending_done.set()

        async def receive_loop() -> None:
            drain_deadline: float | None = None
            while True:
                if sending_done.is_set():
                    if acked <= seen:
                        return
                    if drain_deadline is None:
                        drain_deadline = time.monotonic() + args.timeout
                    elif time.monotonic() > drain_deadline:
                        return  # the check reports what is missing
                msgs = await receiver.receive_messages(100, max_wait_time=0.2)
                now = time.time()
                if not msgs:
                    continue
                for m in msgs:
                    props = m.application_properties or {}
                    i = int(m.message_id)
                    received.append((i, float(props["t"]), now))
                    seen.add(i)
                await receiver.complete_messages(msgs)

        async def change_loop() -> None:
            for at, to in ((0.3, 4), (0.6, 2)):
                delay = t0 + at * duration - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                before = await admin.get_queue_runtime_properties(q)
                t_call = time.time()
                await admin.update_queue(await admin.get_queue(q), partition_count=to)
                t_updated = time.time()
                live = await admin.wait_for_partitions(q, timeout=args.timeout)
                t_waited = time.time()
                after = await admin.get_queue_runtime_properties(q)
                changes.append(
                    {
                        "from": before.partition_count,
                        "to": to,
                        "at_s": t_call - t0_wall,
                        "update_queue_s": t_updated - t_call,
                        "wait_for_partitions_s": t_waited - t_call,
                        "live_after_wait": live,
                        "partition_count_after": after.partition_count,
                        "map_version_before": before.partition_map_version,
                        "map_version_after": after.partition_map_version,
                        "t_call": t_call,
                        "t_waited": t_waited,
                    }
                )
                progress(
                    f"  [{mode}] {before.partition_count} -> {to} partitions at "
                    f"{t_call - t0_wall:.1f} s: update_queue {t_updated - t_call:.2f} s, "
                    f"wait_for_partitions {t_waited - t_call:.2f} s, map v"
                    f"{before.partition_map_version} -> v{after.partition_map_version}"
                )

        c0 = cpu_snapshot()
        deadline = Deadline(duration + 3 * args.timeout, f"{mode} pause")
        with CpuSampler() as sampler:
            await bounded(asyncio.gather(send_loop(), receive_loop(), change_loop()), deadline)
        wall = time.time() - t0_wall
        cpu = cpu_used(c0, cpu_snapshot(), wall)
        # Anything left over (it would be a duplicate or an unexpected message)?
        leftover = 0
        while True:
            msgs = await receiver.receive_messages(100, max_wait_time=0.5)
            if not msgs:
                break
            for m in msgs:
                props = m.application_properties or {}
                received.append((int(m.message_id), float(props.get("t", 0.0)), time.time()))
            leftover += len(msgs)
            await receiver.complete_messages(msgs)
        rt = await admin.get_queue_runtime_properties(q)
        t_send_end = t0_wall + sends * interval
        return analyse_pause(
            mode=mode,
            received=received,
            acked=acked,
            attempted=sends * b,
            ack_lat=ack_lat,
            send_errors=send_errors,
            changes=changes,
            t0=t0_wall,
            t_send_end=t_send_end,
            lateness=lateness,
            leftover=leftover,
            active_after=rt.active_message_count,
            cpu=cpu,
            cpu_samples=sampler.samples,
            wall=wall,
            settings={"seconds": duration, "rate": rate, "batch": b, "body": len(body)},
        )

    # -- the whole run --------------------------------------------------------------------

    async def run(self, modes: list[tuple[str, str]]) -> tuple[list[dict[str, Any]], list[Any]]:
        self.started = time.time()
        runs: list[dict[str, Any]] = []
        self.runs_done = runs
        pauses = self.pauses
        for k, (mode, storage) in enumerate(modes):
            self.modes_left = len(modes) - k - 1
            await self.throughput(mode, storage, runs)
        for mode, storage in modes:
            if self.args.no_pause:
                break
            a = self.args
            progress(
                f"[{mode}] pause: {a.pause_rate:g} msgs/s for {a.pause_seconds:g} s, "
                "2 -> 4 -> 2 partitions"
            )
            try:
                with self.watchdog.armed(
                    self.args.pause_seconds + 4 * self.args.timeout + 120, f"{mode} pause"
                ):
                    res = await self.pause(mode, storage)
                pauses.append(res)
                if not res["check"]["ok"]:
                    self.errors.append(f"{mode} pause: {res['check']['summary']}")
                progress(f"  [{mode}] pause check: {res['check']['summary']}")
            except (BenchError, ServiceBusError, ray.exceptions.RayError) as exc:
                self.errors.append(f"{mode} pause: {type(exc).__name__}: {exc}")
                progress(f"FAILED {mode} pause: {exc}\n{traceback.format_exc(limit=-4)}")
                pauses.append({"mode": mode, "ok": False, "error": str(exc)})
        return runs, pauses


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _common.arg_parser(__doc__, "small run (< 2 min; no durable run)")
    p.add_argument("--messages", type=int, help="messages per cell (default 20000; quick 5000)")
    p.add_argument("--batch", type=int, default=100, help="messages per send/receive list")
    p.add_argument("--senders", type=int, default=4, help="concurrent asyncio senders")
    p.add_argument("--receivers", type=int, default=4, help="concurrent asyncio receivers")
    p.add_argument("--repeats", type=int, help="repeats of every cell (default 3)")
    p.add_argument("--body-size", type=int, default=1024, help="body bytes (>= 8)")
    p.add_argument(
        "--storage",
        default=_common.MEMORY,
        help="raybus storage_path of the first run (default memory://)",
    )
    p.add_argument("--no-durable", action="store_true", help="skip the durable run")
    p.add_argument("--no-pause", action="store_true", help="skip the pause scenario")
    p.add_argument("--pause-seconds", type=float, default=10.0, help="pause run length")
    p.add_argument("--pause-rate", type=float, default=2000.0, help="msgs/s of the steady load")
    p.add_argument("--pause-batch", type=int, default=20, help="messages per send (pause)")
    p.add_argument("--pause-body-size", type=int, default=128, help="body bytes (pause)")
    _common.add_time_limits(
        p,
        timeout_help="seconds per phase (default 120; quick 60)",
        budget_help="seconds for the throughput part; a partition count's later repeats are "
        "skipped once one more would exceed its share (default 360; quick 70)",
    )
    args = _common.parse_with_output(p, argv)
    if args.messages is None:
        args.messages = 5000 if args.quick else 20000
    if args.repeats is None:
        args.repeats = 3
    if args.timeout is None:
        args.timeout = 60.0 if args.quick else 120.0
    if args.budget is None:
        args.budget = 70.0 if args.quick else 360.0
    if (
        min(args.messages, args.batch, args.senders, args.receivers, args.repeats) < 1
        or args.body_size < 8
        or args.pause_batch < 1
        or args.pause_rate <= 0
        or args.pause_seconds < 3
    ):
        p.error("counts must be >= 1, --body-size >= 8, --pause-seconds >= 3")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, facts = _common.start_run()
    durable = not args.quick and not args.no_durable and args.storage == _common.MEMORY
    tmpdir = tempfile.mkdtemp(prefix="raybus-partitions-") if durable else None
    first = "memory" if args.storage == _common.MEMORY else "storage"
    modes = [(first, args.storage)] + ([("durable", tmpdir)] if tmpdir else [])
    if tmpdir:
        facts["durable_dir"] = tmpdir
    _common.start_local_ray(300)
    bench = Bench(args, tmpdir)
    progress(
        f"raybus partitions: P in {PARTITION_COUNTS}, {args.messages} messages x "
        f"{args.body_size} B per cell in lists of {args.batch}, {args.senders} senders, "
        f"{args.receivers} receivers, {args.repeats} repeat(s), storage: "
        + ", ".join(m for m, _ in modes)
        + f"; {os.cpu_count()} CPUs"
    )
    with _common.ray_run(bench.errors, before_shutdown=bench.close_bare, scratch_dir=tmpdir):
        asyncio.run(bench.run(modes))
    # What was measured, also when the run was cut short (``run`` fills these as it goes).
    runs, pauses = bench.runs_done, bench.pauses

    rows = summarise(runs)
    text = report_text(args, facts, rows, pauses)
    body = {
        "rows": rows,
        "runs": runs,
        "pauses": pauses,
        "errors": bench.errors,
        "skipped": bench.skipped,
    }
    return _common.finish("partitions", started, args, facts, text, body)


if __name__ == "__main__":
    sys.exit(main())
