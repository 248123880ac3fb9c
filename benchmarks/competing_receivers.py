#!/usr/bin/env python
"""What competing receivers cost a partition: one sender sending single messages (each send
awaited), and R receivers of the same queue each receiving one message at a time and
completing it, against the same with one receiver (the peer: the same work without the
competition).

Competing consumers are Service Bus's everyday pattern (the Competing Consumers pattern,
``/work/shared/seeds``). Every receiver that finds the queue empty waits at the partition, so
each message sent finds up to R - 1 receives waiting there. Until a partition woke its waiting
receives in turn (``raybus._core.wait_lines``), each message woke all of them, and all but one
looked, found nothing and waited again.

Each round runs every R in ``--receivers`` on a fresh durable queue, sender and receivers as
asyncio tasks of this process, and reads the partition actor's CPU from ``/proc`` and its
``wakes`` (waiting calls woken by a change) from ``stats()``. Reports per R the medians over
rounds: messages/s, the partition's CPU per message, wakes per message, and R's CPU per
message ÷ one receiver's.

    python benchmarks/competing_receivers.py [--rounds 3] [--messages 2000] [--receivers 1,8,32]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common
import _cpu
import ray

from raybus import ServiceBusMessage, aio
from raybus.management import ServiceBusAdministrationClient


async def _run(
    client: aio.ServiceBusClient, queue: str, n: int, receivers: int, prefetch: int
) -> dict[str, float]:
    route = await client._conn.registry.route.remote(queue)
    partition = route.partitions[0]
    pid = ray._private.state.actors(partition._actor_id.hex()).get("Pid")
    got = 0
    done = asyncio.Event()

    async def receive(r: aio.ServiceBusReceiver) -> None:
        nonlocal got
        while not done.is_set():
            for m in await r.receive_messages(max_message_count=1, max_wait_time=5):
                await r.complete_message(m)
                got += 1
                if got == n:
                    done.set()

    rs = [client.get_queue_receiver(queue, prefetch_count=prefetch) for _ in range(receivers)]
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage(b"warm-up"))
        n += 1
        tasks = [asyncio.ensure_future(receive(r)) for r in rs]
        while got < 1:
            await asyncio.sleep(0.01)
        body = b"x" * 1024
        stats0, cpu0, t0 = await partition.stats.remote(), _cpu.cpu_seconds(pid), time.time()
        for _ in range(n - 1):
            await sender.send_messages(ServiceBusMessage(body))
        await asyncio.wait_for(done.wait(), 60)
        secs, cpu = time.time() - t0, _cpu.cpu_seconds(pid) - cpu0
        stats1 = await partition.stats.remote()
    for r in rs:
        await r.close()
    await asyncio.gather(*tasks)
    m = n - 1
    return {
        "msgs_per_s": m / secs,
        "partition_us_per_msg": cpu / m * 1e6,
        "wakes_per_msg": (stats1.get("wakes", 0) - stats0.get("wakes", 0)) / m,
    }


async def _round(namespace: str, storage: str, args: argparse.Namespace) -> dict[int, dict]:
    admin = ServiceBusAdministrationClient(namespace, storage_path=storage)
    out: dict[int, dict] = {}
    try:
        async with aio.ServiceBusClient(namespace, storage_path=storage) as client:
            for r in args.receivers:
                queue = f"q{uuid.uuid4().hex[:8]}"
                admin.create_queue(queue)
                try:
                    out[r] = await _run(client, queue, args.messages, r, args.prefetch)
                finally:
                    admin.delete_queue(queue)
                _common.progress(
                    f"{r} receivers: {out[r]['msgs_per_s']:.0f} msg/s, "
                    f"{out[r]['partition_us_per_msg']:.0f} us/msg in the partition, "
                    f"{out[r]['wakes_per_msg']:.2f} wakes/msg"
                )
    finally:
        admin.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = _common.arg_parser(__doc__, "1 round of 500 messages")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", type=int, default=2000, help="per run")
    p.add_argument("--receivers", type=_common.int_list, default=[1, 8, 32])
    p.add_argument("--prefetch", type=int, default=0, help="each receiver's prefetch_count")
    args = _common.parse_with_output(p, argv)
    if args.quick:
        args.rounds, args.messages = 1, 500
    started, facts = _common.start_run()
    _common.start_local_ray()
    rounds: list[dict[int, dict]] = []
    try:
        with tempfile.TemporaryDirectory() as storage:
            for k in range(args.rounds):
                _common.progress(f"round {k + 1} of {args.rounds}")
                rounds.append(asyncio.run(_round(f"compete{k}", storage, args)))
    finally:
        ray.shutdown()
    summary: dict[int, dict[str, float | None]] = {}
    for r in args.receivers:
        summary[r] = {
            key: _common.median([rd[r][key] for rd in rounds])
            for key in ("msgs_per_s", "partition_us_per_msg", "wakes_per_msg")
        }
    one = summary.get(1, {}).get("partition_us_per_msg")
    rows = []
    for r, s in summary.items():
        cpu = s["partition_us_per_msg"]
        ratio = f"{cpu / one:.2f}x" if one and cpu else "—"
        rows.append(
            (r, f"{s['msgs_per_s']:,.0f}", f"{cpu:,.0f}", f"{s['wakes_per_msg']:.2f}", ratio)
        )
    lines = _common.md_table(
        "receivers | msgs/s | partition CPU us/msg | wakes/msg | CPU ÷ 1 receiver's",
        "---:|---:|---:|---:|---:",
        rows,
    )
    print("\n".join(lines))
    out = _common.write_results(
        "competing_receivers", started, args, facts, {"rounds": rounds, "summary": summary}
    )
    print(f"JSON: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
