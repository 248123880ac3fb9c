#!/usr/bin/env python
"""Per-message calls on a durable queue, with and without the committer's linger for
settlements nobody waits on: what one sender and one receiver taking turns get.

One asyncio sender sends messages one call at a time (each waits for its fsync); one receiver
(prefetch 200) receives one and completes it with ``complete_message``, which returns before
the broker answers. The partition lets such a settlement's flush wait up to
``raybus._core.committer.LAZY_LINGER_S`` for a call that is waited on (the next send) to
share it. The peer is the same client with that turned off: its settlements are sent as if
waited on (``Connection.settler(..., waited=True)``, what every settlement was before), so
the partition flushes each at once and the next send waits behind that flush.

Both run in the same Ray session on the same queue, alternating, ``--rounds`` times per body
size; reported: medians of messages/s, the sender's per-call latency and the partition's CPU
per message, and the ratio linger ÷ waited. Sender and receiver share this process (the suite
runs them in two; the A/B is what matters here).

    python benchmarks/single_calls.py [--sizes 1024,65536] [--messages 2000] [--rounds 3]
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from typing import Any

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common
import ray
from _common import actor_pids_by_class, int_list, md_table
from _cpu import cpu_seconds

from raybus import ServiceBusMessage
from raybus.aio import ServiceBusClient
from raybus.management import ServiceBusAdministrationClient

MODES = ("linger", "waited")


def client_for(mode: str, namespace: str, storage: str) -> ServiceBusClient:
    """A client; ``waited``: its settlements sent without waiting travel as waited ones."""
    client = ServiceBusClient(namespace, storage_path=storage)
    if mode == "waited":
        conn = client._conn
        settler = conn.settler
        conn.settler = lambda entity, actor, *, waited=True: settler(entity, actor)  # type: ignore[method-assign]
    return client


async def run(client: ServiceBusClient, queue: str, body: bytes, n: int) -> dict[str, Any]:
    latencies: list[float] = []

    async def send() -> None:
        async with client.get_queue_sender(queue) as sender:
            for _ in range(n):
                started = time.perf_counter()
                await sender.send_messages(ServiceBusMessage(body))
                latencies.append(time.perf_counter() - started)

    async def receive() -> None:
        async with client.get_queue_receiver(queue, prefetch_count=200) as receiver:
            got = 0
            while got < n:
                for msg in await receiver.receive_messages(max_message_count=1, max_wait_time=10):
                    await receiver.complete_message(msg)
                    got += 1

    started = time.perf_counter()
    await asyncio.gather(send(), receive())  # close() waited for every completion's answer
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "msgs_per_s": n / elapsed,
        "send_p50_ms": latencies[len(latencies) // 2] * 1e3,
        "send_p90_ms": latencies[int(len(latencies) * 0.9)] * 1e3,
    }


async def measure(args: Any, namespace: str, storage: str) -> list[dict[str, Any]]:
    admin = ServiceBusAdministrationClient(namespace, storage_path=storage)
    rows = []
    for size in args.sizes:
        queue = f"single-{size}"
        before = set(actor_pids_by_class().get("PartitionActor", []))
        admin.create_queue(queue)
        body = b"\xa5" * size
        clients = {mode: client_for(mode, namespace, storage) for mode in MODES}
        for client in clients.values():  # routes, lanes and the partition warm
            await run(client, queue, body, 50)
        (pid,) = set(actor_pids_by_class()["PartitionActor"]) - before  # this queue's
        results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else reversed(MODES):
                cpu = cpu_seconds(pid)
                result = await run(clients[mode], queue, body, args.messages)
                result["partition_cpu_ms_per_msg"] = (cpu_seconds(pid) - cpu) / args.messages * 1e3
                results[mode].append(result)
                _common.progress(f"{size} B {mode} round {r}: {result['msgs_per_s']:,.0f} msg/s")
        for client in clients.values():
            await client.close()
        admin.delete_queue(queue)
        for mode in MODES:
            keys = results[mode][0].keys()
            med = {k: statistics.median(x[k] for x in results[mode]) for k in keys}
            rows.append({"size": size, "mode": mode, **med})
    admin.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    p = _common.arg_parser(__doc__, "500 messages, 1 round per mode")
    p.add_argument("--sizes", type=int_list, default=[1024, 65536])
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.quick:
        args.messages, args.rounds = 500, 1
    _common.start_local_ray(300)
    storage = tempfile.mkdtemp(prefix="raybus-single-")
    try:
        rows = asyncio.run(measure(args, f"single-{uuid.uuid4().hex[:8]}", storage))
    finally:
        ray.shutdown()
    by = {(r["size"], r["mode"]): r for r in rows}
    table = []
    for size in args.sizes:
        linger, waited = by[(size, "linger")], by[(size, "waited")]
        gain = f"{linger['msgs_per_s'] / waited['msgs_per_s']:.2f}x"
        for mode, r in (("linger", linger), ("waited", waited)):
            ratio = gain if mode == "linger" else ""
            table.append(
                [
                    f"{size:,} B",
                    mode,
                    f"{r['msgs_per_s']:,.0f}",
                    ratio,
                    f"{r['send_p50_ms']:.2f} / {r['send_p90_ms']:.2f}",
                    f"{r['partition_cpu_ms_per_msg']:.3f}",
                ]
            )
    print(
        f"durable queue, 1 sender + 1 receiver, per-message calls, {args.messages} messages, "
        f"median of {args.rounds} rounds per mode:"
    )
    print(
        "\n".join(
            md_table(
                "size | settlements sent without waiting | msgs/s | linger ÷ waited"
                " | send p50 / p90 ms | partition CPU ms/msg",
                "---:|---|---:|---:|---:|---:",
                table,
            )
        )
    )


if __name__ == "__main__":
    main()
