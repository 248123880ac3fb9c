#!/usr/bin/env python
"""What an idle receiver costs: a loop of short receives on an empty queue, against the same
loop sleeping instead (the peer: what the machine spends with the actors up and nobody
receiving).

Receivers of idle queues are common (a subscription nobody publishes to for a while, a worker
pool waiting for work), and on Ray every call costs CPU in two processes. Each round starts a
queue of each kind below, then, alternately (the machine is shared: compare ratios), runs the
receive loop and the sleep loop for ``--seconds`` and reads the CPU of every process of this
Ray cluster from ``/proc``:

- ``partitioned``: ``--partitions`` partitions, no prefetch (the waits at the partitions that
  a receive leaves out, ``raybus.aio._fanout``);
- ``prefetch``: one partition, ``prefetch_count`` 20 (the standing request);
- ``plain``: one partition, no prefetch (a long poll per receive).

Reports cores used per kind (median of rounds) and the receive loop ÷ the sleep loop.

    python benchmarks/idle_receivers.py [--rounds 3] [--seconds 10] [--wait 0.2] [--partitions 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common
import _cpu
import ray

from raybus import aio
from raybus.management import ServiceBusAdministrationClient

KINDS = ("partitioned", "prefetch", "plain")


async def _loop(receiver: aio.ServiceBusReceiver | None, seconds: float, wait: float) -> float:
    """Cores used by this cluster's processes while the loop runs (receives, or sleeps when
    ``receiver`` is None)."""
    before, start = _cpu.cpu_snapshot(), time.monotonic()
    while time.monotonic() - start < seconds:
        if receiver is None:
            await asyncio.sleep(wait)
        else:
            assert await receiver.receive_messages(10, max_wait_time=wait) == []
    used = _cpu.cpu_used(before, _cpu.cpu_snapshot(), time.monotonic() - start)
    return sum(v for group, v in used.items() if group != "others")


async def _round(namespace: str, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    async with aio.ServiceBusClient(namespace, storage_path="memory://") as client:
        for kind in KINDS:
            receiver = client.get_queue_receiver(
                kind, prefetch_count=20 if kind == "prefetch" else 0
            )
            async with receiver:
                await receiver.receive_messages(1, max_wait_time=args.wait)  # route, actors
                await asyncio.sleep(1.0)
                receiving = await _loop(receiver, args.seconds, args.wait)
            sleeping = await _loop(None, args.seconds, args.wait)
            out[kind] = (receiving, sleeping)
            _common.progress(f"  {kind}: receiving {receiving:.3f} cores, sleeping {sleeping:.3f}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0, help="per loop")
    p.add_argument("--wait", type=float, default=0.2, help="max_wait_time of each receive")
    p.add_argument("--partitions", type=int, default=4)
    args = p.parse_args(argv)
    _common.start_local_ray(object_store_mb=100)
    namespace = f"idle-{uuid.uuid4().hex[:8]}"
    admin = ServiceBusAdministrationClient(namespace, storage_path="memory://")
    admin.create_queue("partitioned", partition_count=args.partitions)
    admin.create_queue("prefetch")
    admin.create_queue("plain")
    rounds: list[dict[str, tuple[float, float]]] = []
    try:
        for r in range(args.rounds):
            _common.progress(f"round {r + 1} of {args.rounds}")
            rounds.append(asyncio.run(_round(namespace, args)))
    finally:
        ray.shutdown()
    print(
        f"\nIdle receive loops ({args.wait} s receives, {args.seconds} s each, median of "
        f"{args.rounds} rounds; cores used by this Ray cluster's processes)\n"
    )
    rows = []
    for kind in KINDS:
        receiving = statistics.median(r[kind][0] for r in rounds)
        sleeping = statistics.median(r[kind][1] for r in rounds)
        rows.append([kind, f"{receiving:.3f}", f"{sleeping:.3f}", f"{receiving / sleeping:.2f}x"])
    table = _common.md_table(
        "queue | receiving | sleeping | receiving ÷ sleeping", "---|---:|---:|---:", rows
    )
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
