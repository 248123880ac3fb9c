#!/usr/bin/env python
"""Where a topic publish spends its time: CPU per process kind and publish latency, with py-spy.

A durable namespace in a temporary directory, one topic with ``--subscriptions`` subscriptions
(one partition each, every message selected), and ``--senders`` clients in this process, each
sending lists of ``--batch`` 1 KiB messages one after another (``--lists`` lists in all per
repeat). Reported per repeat: messages/s in, copies/s stored, publish latency p50/p90, and the
CPU seconds each kind of process (partition, coordinator, router, namespace actors, this
driver) spent per 1,000 published messages (``/proc``, all threads): on a shared machine
rates swing by 2x between runs, CPU per message much less, so compare those.

``--py-spy DIR`` records the router, the coordinator and two partition actors for the first
repeat (with ``--cycle``: two subscription partitions) and prints their hottest frames
(``--gil``: only samples holding the GIL, i.e. Python CPU work). Needs ``py-spy`` next to the
interpreter.

``--cycle`` measures the whole cycle of the suite's topic cells instead: one sender
publishing lists of ``--batch``, and a receiver per subscription (prefetch twice the batch)
that receives up to ``--batch`` and completes them with ``complete_messages``; reported are
copies/s, the CPU per copy of each kind of process, and each subscription partition's flushes
per delivery. ``--core`` measures the same steps on a pure ``Partition`` without Ray (unpack a
delivery, store it, receive it, complete it, build and serialize both journal tables): what
the broker's own logic costs per copy, against which the cycle's CPU per copy reads as Ray's
per-call cost.

Run: ``python benchmarks/profile_topics.py [--senders 4] [--py-spy DIR]``,
``python benchmarks/profile_topics.py --cycle [--batch 500]``,
``python benchmarks/profile_topics.py --core``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

# Before Ray: sets Ray's environment and puts this checkout on the workers' import paths.
import _common
import ray
from _common import actor_pids_by_class
from _cpu import cpu_seconds
from profile_hot_paths import Profiler

from raybus import ServiceBusMessage, aio
from raybus.management import ServiceBusAdministrationClient

BODY = b"x" * 1024


def cpu_by_kind(roles: list[tuple[str, int]], cpu0: list[float]) -> dict[str, float]:
    """CPU seconds each kind of process spent since ``cpu0`` (taken for ``roles``)."""
    by_kind: dict[str, float] = {}
    for (kind, pid), c0 in zip(roles, cpu0, strict=True):
        by_kind[kind] = by_kind.get(kind, 0.0) + cpu_seconds(pid) - c0
    return by_kind


def profiler(args: argparse.Namespace, label: str, spied: dict[str, int]) -> Profiler:
    """py-spy on the ``spied`` processes (none: only their CPU), as ``--py-spy``/``--gil``
    ask."""
    prof = Profiler(Path(args.py_spy) if spied else None, label, spied)
    if args.gil:
        prof.extra.append("--gil")
    return prof


async def publish(namespace: str, storage: str, args: argparse.Namespace) -> None:
    clients = [aio.ServiceBusClient(namespace, storage_path=storage) for _ in range(args.senders)]
    senders = [c.get_topic_sender("t") for c in clients]
    try:
        for s in senders:  # routes fetched, coordinator created
            await s.send_messages(ServiceBusMessage(BODY))
        pids = actor_pids_by_class()
        roles = [(kind, pid) for kind, ps in pids.items() for pid in ps]
        per = args.lists // args.senders
        for rep in range(args.repeats):
            spied: dict[str, int] = {}
            if rep == 0 and args.py_spy:
                # No coordinator when every publish goes through the router's publish log.
                spied = {"router": pids["RouterActor"][0]}
                if pids.get("CoordinatorActor"):
                    spied["coordinator"] = pids["CoordinatorActor"][0]
                spied.update({f"partition{i}": p for i, p in enumerate(pids["PartitionActor"][:2])})
            prof = profiler(args, f"topic{rep}", spied)
            latencies: list[float] = []

            async def one(sender: aio.ServiceBusSender, latencies: list[float]) -> None:
                for _ in range(per):
                    t0 = time.perf_counter()
                    await sender.send_messages([ServiceBusMessage(BODY) for _ in range(args.batch)])
                    latencies.append(time.perf_counter() - t0)

            cpu0 = [cpu_seconds(pid) for _kind, pid in roles]
            with prof:
                t0 = time.perf_counter()
                await asyncio.gather(*(one(s, latencies) for s in senders))
                elapsed = time.perf_counter() - t0
            n = per * args.senders * args.batch
            by_kind = cpu_by_kind(roles, cpu0)
            latencies.sort()
            p50, p90 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.9)]
            cpu = ", ".join(f"{k} {1e6 * v / n:,.0f}" for k, v in sorted(by_kind.items()))
            print(
                f"repeat {rep}: {n / elapsed:,.0f} msgs/s in, "
                f"{n * args.subscriptions / elapsed:,.0f} copies/s; publish p50 "
                f"{1000 * p50:.1f} ms, p90 {1000 * p90:.1f} ms; CPU ms per 1,000 msgs: {cpu}",
                flush=True,
            )
    finally:
        for c in clients:
            await c.close()


async def cycle(namespace: str, storage: str, args: argparse.Namespace) -> None:
    """Publish and receive + complete every copy, as the suite's topic cells do."""
    client = aio.ServiceBusClient(namespace, storage_path=storage)
    sender = client.get_topic_sender("t")
    receivers = [
        client.get_subscription_receiver("t", f"s{i}", prefetch_count=2 * args.batch)
        for i in range(args.subscriptions)
    ]

    async def drain(receiver: aio.ServiceBusReceiver, n: int) -> None:
        got = 0
        while got < n:
            msgs = await receiver.receive_messages(args.batch, max_wait_time=0.2)
            got += len(msgs)
            if msgs:
                await receiver.complete_messages(msgs)

    try:
        await sender.send_messages([ServiceBusMessage(BODY) for _ in range(10)])  # warm-up
        await asyncio.gather(*(drain(r, 10) for r in receivers))
        pids = actor_pids_by_class()
        roles = [(kind, pid) for kind, ps in pids.items() for pid in ps]
        roles.append(("client", os.getpid()))
        for rep in range(args.repeats):
            flushes0 = await partition_flushes(namespace)
            cpu0 = [cpu_seconds(pid) for _kind, pid in roles]
            n = args.lists * args.batch

            async def publish_all() -> None:
                for _ in range(args.lists):
                    await sender.send_messages([ServiceBusMessage(BODY) for _ in range(args.batch)])

            spied: dict[str, int] = {}
            if rep == 0 and args.py_spy:
                spied = {f"partition{i}": p for i, p in enumerate(pids["PartitionActor"][:2])}
            prof = profiler(args, f"cycle{rep}", spied)
            with prof:
                t0 = time.perf_counter()
                await asyncio.gather(publish_all(), *(drain(r, n) for r in receivers))
                elapsed = time.perf_counter() - t0
            copies = n * args.subscriptions
            by_kind = cpu_by_kind(roles, cpu0)
            flushes = sum(await partition_flushes(namespace)) - sum(flushes0)
            cpu = ", ".join(f"{k} {1e6 * v / copies:.1f}" for k, v in sorted(by_kind.items()))
            print(
                f"repeat {rep}: {copies / elapsed:,.0f} copies/s; CPU us per copy: {cpu}; "
                f"flushes per subscription partition per delivery: "
                f"{flushes / args.subscriptions / args.lists:.1f}",
                flush=True,
            )
    finally:
        for r in receivers:
            await r.close()
        await sender.close()
        await client.close()


async def partition_flushes(namespace: str) -> list[int]:
    """Flushes so far of every subscription partition of topic ``t`` (their stats; the
    namespace is open, so no token is needed)."""
    prefix = f"raybus/{namespace}/queue/t/subscriptions/"
    names = [
        info["Name"]
        for info in ray._private.state.actors().values()
        if info.get("State") == "ALIVE" and str(info.get("Name", "")).startswith(prefix)
    ]
    handles = [ray.get_actor(name, namespace="raybus") for name in names]
    stats = await asyncio.gather(*(h.stats.remote() for h in handles))
    return [int(st["flushes"]) for st in stats]


def core_cost(batch: int, rounds: int = 200) -> None:
    """CPU per copy of the broker's own steps on a pure Partition (no Ray, no disk)."""
    from raybus._clock import SystemClock
    from raybus._core.journal import to_table
    from raybus._core.partition import COMPLETE, Partition, SettleOp
    from raybus._core.record import from_wire, to_wire
    from raybus._core.wire import pack_rows, unpack_rows
    from raybus._models import QueueProperties
    from raybus._storage.framing import serialize
    from raybus.aio._sender import _records

    core = Partition(QueueProperties(name="s"), SystemClock(), 0, export=lambda r: r)
    core.enable_journal()
    pieces = pack_rows(to_wire(_records([ServiceBusMessage(BODY) for _ in range(batch)])))
    t0 = time.process_time()
    for number in range(rounds):
        core.deliver("router", number, from_wire(unpack_rows(pieces)))
        entries, _last = core.take_journal()
        serialize(to_table(entries))
        core.visible_seq = None  # as if flushed: every message may be received
        got = core.receive(batch, dead_letter=False, delete=False)
        to_wire(got)
        results = core.settle([SettleOp(COMPLETE, rec.lock_token or "") for rec in got])
        if any(r is not None for r in results) or len(got) != batch:
            raise RuntimeError(f"the core refused a step: {results[:3]}")
        entries, _last = core.take_journal()
        serialize(to_table(entries))
    per_copy = (time.process_time() - t0) / (rounds * batch)
    print(f"broker logic without Ray: {1e6 * per_copy:.1f} us of CPU per copy", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subscriptions", type=int, default=10)
    ap.add_argument("--senders", type=int, default=1, help="clients publishing concurrently")
    ap.add_argument("--batch", type=int, default=100, help="messages per list")
    ap.add_argument("--lists", type=int, default=40, help="lists per repeat, all senders")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--py-spy", default="", help="directory for py-spy's raw stacks")
    ap.add_argument("--gil", action="store_true", help="py-spy: GIL-holding samples only")
    ap.add_argument("--cycle", action="store_true", help="publish, receive and complete")
    ap.add_argument("--core", action="store_true", help="the broker's logic alone, no Ray")
    args = ap.parse_args()
    if args.core:
        core_cost(args.batch)
        return
    _common.start_local_ray(200)
    tmp = tempfile.mkdtemp(prefix="raybus-topics-")
    namespace = f"prof-{uuid.uuid4().hex[:8]}"
    admin = ServiceBusAdministrationClient(namespace, storage_path=tmp)
    try:
        admin.create_topic("t")
        for i in range(args.subscriptions):
            admin.create_subscription("t", f"s{i}")
        asyncio.run((cycle if args.cycle else publish)(namespace, tmp, args))
    finally:
        try:
            admin.delete_topic("t")
        finally:
            admin.close()
            ray.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
