#!/usr/bin/env python
"""A scale-down of a queue holding a backlog: how long the change takes, and how long a send
waits meanwhile.

A durable queue of ``--partitions`` partitions is filled with ``--messages`` unkeyed messages
of ``--size`` bytes (lists of 1,000, spread over the partitions), then changed to one
partition. While the change runs, one sender sends a single message every 50 ms and times
each send, and the runtime properties are read every 50 ms and timed (a count waits for the
change's step in progress). Printed: the fill rate, the time from ``update_queue`` to
``wait_for_partitions`` returning, the sends made meanwhile (the longest, the median), the
counts read meanwhile (the longest), and whether the runtime properties count every message
afterwards. A retiring partition hands its messages over in bundles of at most
4,096 messages or 4 MiB (``raybus._core.migration.MOVE_BUNDLE_*``), so what a send waits for
is about one bundle's storing at the target, three at once here (one per retiring partition),
plus, at the deepest backlogs, the target's checkpoint capture (about 0.3 s at 400,000
messages held). The README ("Changing the partition count") has the numbers. No peer runs
beside it: read it size against size, and against the code before the bound (a worktree of
it, with this script copied in).

Run: ``python benchmarks/move_backlog.py [--messages 100000,400000] [--partitions 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import ray

import raybus
from raybus import ServiceBusMessage
from raybus.aio import ServiceBusAdministrationClient

SEND_EVERY_S = 0.05


async def one_size(storage: str, messages: int, partitions: int, size: int) -> str:
    namespace = f"move-{uuid.uuid4().hex[:6]}"
    admin = ServiceBusAdministrationClient(namespace, storage_path=storage)
    client = raybus.aio.ServiceBusClient(namespace, storage_path=storage)
    await admin.create_queue("q", partition_count=partitions)
    body = b"x" * size
    async with client.get_queue_sender("q") as sender:
        began = time.monotonic()
        for lo in range(0, messages, 1000):
            await sender.send_messages(
                [ServiceBusMessage(body) for _ in range(min(1000, messages - lo))]
            )
        fill = messages / (time.monotonic() - began)
        began = time.monotonic()
        await admin.update_queue(await admin.get_queue("q"), partition_count=1)
        done = asyncio.ensure_future(admin.wait_for_partitions("q"))
        waits: list[float] = []
        reads: list[float] = []

        async def count_meanwhile() -> None:
            while not done.done():
                asked = time.monotonic()
                await admin.get_queue_runtime_properties("q")
                reads.append(time.monotonic() - asked)
                await asyncio.sleep(SEND_EVERY_S)

        counting = asyncio.ensure_future(count_meanwhile())
        while not done.done():
            sent = time.monotonic()
            await sender.send_messages(ServiceBusMessage(b"y"))
            waits.append(time.monotonic() - sent)
            await asyncio.sleep(SEND_EVERY_S)
        took = time.monotonic() - began
        left = await done
        await counting
    counted = (await admin.get_queue_runtime_properties("q")).active_message_count
    await admin.delete_queue("q")
    expected = messages + len(waits)
    check = "counts every message" if counted == expected else f"COUNTS {counted} OF {expected}"
    return (
        f"{messages:>9,} x {size} B: filled at {fill:,.0f} msg/s; {partitions} -> {left} "
        f"partitions in {took:.2f} s; {len(waits)} sends meanwhile, the longest "
        f"{max(waits, default=0) * 1e3:.0f} ms, the median "
        f"{median(waits) * 1e3 if waits else 0:.0f} ms; {len(reads)} counts read, the longest "
        f"{max(reads, default=0) * 1e3:.0f} ms; {check}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", default="100000,400000", help="backlogs, comma-separated")
    p.add_argument("--partitions", type=int, default=4, help="before the change")
    p.add_argument("--size", type=int, default=1024, help="body bytes")
    args = p.parse_args()
    sizes = [int(x) for x in args.messages.split(",")]
    _common.start_local_ray(object_store_mb=max(300, 3 * max(sizes) * args.size >> 20))
    storage = tempfile.mkdtemp(prefix="raybus-move-")
    try:
        for n in sizes:
            print(asyncio.run(one_size(storage, n, args.partitions, args.size)), flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
