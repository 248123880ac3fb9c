#!/usr/bin/env python
"""Sends into a growing backlog: how a durable queue's send rate changes as it fills.

One sender in this process sends ``--messages`` messages of 1 KiB in lists of 100, each list
awaited, to a durable queue (in a temporary directory) with no receiver, for ``--rounds``
rounds: each round adds its messages to the backlog. Prints, per round, messages/s and the
time per list spent building the messages and waiting for the send. The partition's cyclic
garbage collector and its checkpoints grow with what it holds; RESULTS.md ("Since
(2026-12-05, third stop)") has a run and a profile.

    python benchmarks/backlog_sends.py [--messages 50000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
import uuid

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common
import ray

import raybus.aio
from raybus import ServiceBusMessage
from raybus.management import ServiceBusAdministrationClient

BATCH = 100


def body(i: int, size: int = 1024) -> bytes:
    return i.to_bytes(8, "big") + b"x" * (size - 8)


async def one_round(client: raybus.aio.ServiceBusClient, first: int, n: int) -> str:
    sender = client.get_queue_sender("q")
    await sender.create_message_batch()  # resolves the route before timing
    build = send = 0.0
    started = time.perf_counter()
    for lo in range(first, first + n, BATCH):
        a = time.perf_counter()
        msgs = [ServiceBusMessage(body(i), message_id=str(i)) for i in range(lo, lo + BATCH)]
        b = time.perf_counter()
        await sender.send_messages(msgs)
        build += b - a
        send += time.perf_counter() - b
    total = time.perf_counter() - started
    lists = n / BATCH
    return (
        f"{n / total:9,.0f} msg/s   per list: build {build / lists * 1e3:.2f} ms, "
        f"send {send / lists * 1e3:.2f} ms"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=50_000, help="per round (a multiple of 100)")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    _common.start_local_ray()
    storage = tempfile.mkdtemp(prefix="raybus-backlog-")
    namespace = f"backlog-{uuid.uuid4().hex[:6]}"
    try:
        ServiceBusAdministrationClient(namespace, storage_path=storage).create_queue("q")
        client = raybus.aio.ServiceBusClient(namespace, storage_path=storage)
        for r in range(args.rounds):
            line = asyncio.run(one_round(client, r * args.messages, args.messages))
            held = (r + 1) * args.messages
            print(f"round {r + 1} (then {held:,} held): {line}", flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    main()
