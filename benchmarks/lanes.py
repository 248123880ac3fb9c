#!/usr/bin/env python
"""Lanes on against lanes off (``raybus._lane``): the same sender and receiver, their calls to
the partition over its Unix-socket lane or over Ray's actor calls, in the same run.

A sender and a receiver run in two worker processes (Ray actors), as in ``suite.py``, against
durable queues in a temporary directory. Each round runs every scenario with lanes on and then
off, or off and then on (alternating: the machine is shared, compare ratios):

- ``single``: 1 KiB messages sent one ``send_messages`` at a time, each awaited; the receiver
  takes what is there (prefetch 20) and completes each message with ``complete_message``;
- ``batch``: lists of 100 x 1 KiB; prefetch 200, ``receive_messages(100)`` and
  ``complete_messages``;
- ``rate``: single sends at a fixed ``--rate`` (default 1,000 msg/s), as the suite's latency
  scenario: p50/p99 of send-to-receive latency (the body carries its tick's time).

Reports messages/s from the first send to the last settlement, latency p50/p99, and lanes on
÷ lanes off (for latency: off ÷ on, above 1 means the lanes are faster).

    python benchmarks/lanes.py [--rounds 3] [--messages 3000] [--rate 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import tempfile
import time
import uuid
from typing import Any

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common
import ray

from raybus.management import ServiceBusAdministrationClient

SCENARIOS = ("single", "batch", "rate")
BATCH = 100
KEYS = ("rate", "p50", "p99")
STAMP = "!d"  # the send time at the start of each body
STAMP_SIZE = struct.calcsize(STAMP)


@ray.remote(num_cpus=0)
class Worker:
    """A sender or a receiver in its own process; ``lanes`` switches this process's lanes."""

    def __init__(self, namespace: str, storage: str) -> None:
        self.namespace, self.storage = namespace, storage

    def _client(self, lanes: bool) -> Any:
        import raybus._lane
        import raybus.aio

        raybus._lane.ENABLED = lanes
        return raybus.aio.ServiceBusClient(self.namespace, storage_path=self.storage)

    async def send(self, queue: str, n: int, scenario: str, rate: float, lanes: bool) -> float:
        from raybus import ServiceBusMessage

        pad = b"x" * (1024 - STAMP_SIZE)
        async with self._client(lanes) as client, client.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage(struct.pack(STAMP, time.time()) + pad))
            await asyncio.sleep(0.5)  # the lane is open
            start = time.time()
            if scenario == "batch":
                for _ in range(n // BATCH):
                    now = struct.pack(STAMP, time.time())
                    await sender.send_messages([ServiceBusMessage(now + pad)] * BATCH)
            else:
                for i in range(n):
                    tick = start + i / rate if scenario == "rate" else time.time()
                    if scenario == "rate" and tick > time.time():
                        await asyncio.sleep(tick - time.time())
                    await sender.send_messages(ServiceBusMessage(struct.pack(STAMP, tick) + pad))
            return start

    async def receive(self, queue: str, n: int, scenario: str, lanes: bool) -> dict[str, Any]:
        prefetch = 200 if scenario == "batch" else 20
        latencies: list[float] = []
        async with (
            self._client(lanes) as client,
            client.get_queue_receiver(queue, prefetch_count=prefetch) as receiver,
        ):
            got = 0
            while got < n + 1:  # and the sender's first message
                msgs = await receiver.receive_messages(BATCH, max_wait_time=10)
                if not msgs:
                    raise RuntimeError(f"{got} of {n + 1} received")
                now = time.time()
                for m in msgs:
                    latencies.append(now - struct.unpack(STAMP, bytes(m.body)[:STAMP_SIZE])[0])
                if scenario == "batch":
                    await receiver.complete_messages(msgs)
                else:
                    for m in msgs:
                        await receiver.complete_message(m)
                got += len(msgs)
        end = time.time()
        latencies = sorted(latencies[1:])
        return {
            "end": end,
            "p50": latencies[len(latencies) // 2] * 1e3,
            "p99": latencies[int(len(latencies) * 0.99)] * 1e3,
        }


def _run(
    admin: ServiceBusAdministrationClient,
    workers: tuple[Any, Any],
    scenario: str,
    lanes: bool,
    args: argparse.Namespace,
) -> dict[str, float]:
    queue = f"{scenario}-{uuid.uuid4().hex[:6]}"
    admin.create_queue(queue)
    sender, receiver = workers
    n = args.messages * (10 if scenario == "batch" else 1)
    got = receiver.receive.remote(queue, n, scenario, lanes)
    start = ray.get(sender.send.remote(queue, n, scenario, args.rate, lanes))
    result = ray.get(got)
    admin.delete_queue(queue)
    return {"rate": n / (result["end"] - start), "p50": result["p50"], "p99": result["p99"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", type=int, default=3000, help="per run (batch: 10x)")
    p.add_argument("--rate", type=float, default=1000.0, help="msg/s of the rate scenario")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = p.parse_args(argv)
    scenarios = args.scenarios.split(",")
    _common.start_local_ray(object_store_mb=200)
    namespace = f"lanes-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="raybus-lanes-") as storage:
        admin = ServiceBusAdministrationClient(namespace, storage_path=storage)
        workers = (Worker.remote(namespace, storage), Worker.remote(namespace, storage))
        results: dict[tuple[str, bool], list[dict[str, float]]] = {}
        for r in range(args.rounds):
            for scenario in scenarios:
                for lanes in (True, False) if r % 2 == 0 else (False, True):
                    one = _run(admin, workers, scenario, lanes, args)
                    results.setdefault((scenario, lanes), []).append(one)
                    _common.progress(
                        f"round {r + 1} {scenario} lanes {'on' if lanes else 'off'}: "
                        f"{one['rate']:,.0f} msg/s, p50 {one['p50']:.2f} ms, "
                        f"p99 {one['p99']:.2f} ms"
                    )
        admin.close()
    print(f"\n### Lanes on ÷ off ({args.rounds} rounds, medians)\n")
    rows = []
    for scenario in scenarios:
        on, off = (
            {k: statistics.median(x[k] for x in results[(scenario, lanes)]) for k in KEYS}
            for lanes in (True, False)
        )
        rows.append(
            (
                scenario,
                f"{on['rate']:,.0f}",
                f"{off['rate']:,.0f}",
                f"{on['rate'] / off['rate']:.2f}x",
                f"{on['p50']:.2f} / {off['p50']:.2f}",
                f"{off['p50'] / on['p50']:.2f}x",
                f"{on['p99']:.2f} / {off['p99']:.2f}",
            )
        )
    for line in _common.md_table(
        "scenario | on msg/s | off msg/s | on ÷ off | p50 ms on / off | off ÷ on | p99 ms on / off",
        "---|---:|---:|---:|---:|---:|---:",
        rows,
    ):
        print(line)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
