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
repeat and prints their hottest frames (``--gil``: only samples holding the GIL, i.e. Python
CPU work). Needs ``py-spy`` next to the interpreter.

Run: ``python benchmarks/profile_topics.py [--senders 4] [--py-spy DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path

# Before Ray: sets Ray's environment and puts this checkout on the workers' import paths.
import _common
import ray
from profile_hot_paths import Profiler, cpu_seconds

from raybus import ServiceBusMessage, aio
from raybus.management import ServiceBusAdministrationClient

BODY = b"x" * 1024


def actor_pids() -> dict[str, list[int]]:
    """Live actors' PIDs by class name (raybus's and any other on this local cluster)."""
    out: dict[str, list[int]] = {}
    for info in ray._private.state.actors().values():
        if info.get("State") == "ALIVE" and info.get("Pid"):
            out.setdefault(info.get("ActorClassName", "?"), []).append(int(info["Pid"]))
    return out


async def publish(namespace: str, storage: str, args: argparse.Namespace) -> None:
    clients = [aio.ServiceBusClient(namespace, storage_path=storage) for _ in range(args.senders)]
    senders = [c.get_topic_sender("t") for c in clients]
    try:
        for s in senders:  # routes fetched, coordinator created
            await s.send_messages(ServiceBusMessage(BODY))
        pids = actor_pids()
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
            prof = Profiler(Path(args.py_spy) if spied else None, f"topic{rep}", spied)
            if args.gil:
                prof.extra.append("--gil")
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
            by_kind: dict[str, float] = {}
            for (kind, pid), c0 in zip(roles, cpu0, strict=True):
                by_kind[kind] = by_kind.get(kind, 0.0) + cpu_seconds(pid) - c0
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subscriptions", type=int, default=10)
    ap.add_argument("--senders", type=int, default=1, help="clients publishing concurrently")
    ap.add_argument("--batch", type=int, default=100, help="messages per list")
    ap.add_argument("--lists", type=int, default=40, help="lists per repeat, all senders")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--py-spy", default="", help="directory for py-spy's raw stacks")
    ap.add_argument("--gil", action="store_true", help="py-spy: GIL-holding samples only")
    args = ap.parse_args()
    _common.start_local_ray(200)
    tmp = tempfile.mkdtemp(prefix="raybus-topics-")
    namespace = f"prof-{uuid.uuid4().hex[:8]}"
    admin = ServiceBusAdministrationClient(namespace, storage_path=tmp)
    try:
        admin.create_topic("t")
        for i in range(args.subscriptions):
            admin.create_subscription("t", f"s{i}")
        asyncio.run(publish(namespace, tmp, args))
    finally:
        try:
            admin.delete_topic("t")
        finally:
            admin.close()
            ray.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
