#!/usr/bin/env python
"""Transactional transfers against the same transfers without a transaction, in one run.

A *transfer* moves messages from queue A to queue B: receive K in PEEK_LOCK mode, then
complete them on A and send them to B. Measured side by side on one local Ray cluster, with
``--workers`` concurrent asyncio workers and 1 KiB bodies:

* ``plain``: complete each (``complete_messages``) and send the list to B, no transaction;
* ``txn``: the same operations inside ``client.transaction()`` (two-phase commit through the
  coordinator actor; both partitions prepare durably, the decision is logged).

K = 1 and K = 10 messages per transfer. Reports transfers/s and messages/s, and the ratio
txn ÷ plain for each K (the machine is shared: ratios hold, absolute numbers drift). Every run
checks that every message ends in B exactly once and A is empty.

Run: ``python benchmarks/transactions.py [--quick] [--storage memory://]``.
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
from typing import Any

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common
import ray
from _common import BenchError, Watchdog, machine_facts, make_body, median, report_errors
from _common import write_results as _write

import raybus
from raybus import ServiceBusMessage, aio


async def _fill(client: aio.ServiceBusClient, queue: str, n: int) -> None:
    async with client.get_queue_sender(queue) as sender:
        for i in range(0, n, 100):
            await sender.send_messages(
                [
                    ServiceBusMessage(make_body(j, 1024), application_properties={"i": j})
                    for j in range(i, min(n, i + 100))
                ]
            )


async def _transfer(
    client: aio.ServiceBusClient, src: str, dst: str, n: int, k: int, workers: int, txn: bool
) -> float:
    """Move ``n`` messages from src to dst in transfers of ``k``; returns seconds."""
    done = 0

    async def worker() -> None:
        nonlocal done
        async with (
            client.get_queue_receiver(src, max_wait_time=2) as receiver,
            client.get_queue_sender(dst) as sender,
        ):
            while done < n:
                got = await receiver.receive_messages(k, max_wait_time=1)
                if not got:
                    continue
                out = [
                    ServiceBusMessage(m.body, application_properties=m.application_properties)
                    for m in got
                ]
                if txn:
                    async with client.transaction() as t:
                        for m in got:
                            await receiver.complete_message(m, transaction=t)
                        await sender.send_messages(out, transaction=t)
                else:
                    await receiver.complete_messages(got)
                    await sender.send_messages(out)
                done += len(got)

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(workers))), 300)
    return time.perf_counter() - start


async def _check(client: aio.ServiceBusClient, admin: Any, src: str, dst: str, n: int) -> None:
    a = await admin.get_queue_runtime_properties(src)
    b = await admin.get_queue_runtime_properties(dst)
    if a.active_message_count != 0 or b.active_message_count != n:
        raise BenchError(
            f"after transfer: A holds {a.active_message_count}, B {b.active_message_count}"
        )
    seen: set[int] = set()
    async with client.get_queue_receiver(
        dst, max_wait_time=1, receive_mode="receiveanddelete"
    ) as r:
        while len(seen) < n:
            got = await r.receive_messages(500, max_wait_time=2)
            if not got:
                break
            for m in got:
                i = int(m.application_properties["i"])  # type: ignore[index]
                if i in seen:
                    raise BenchError(f"message {i} arrived twice")
                seen.add(i)
    if len(seen) != n:
        raise BenchError(f"{n - len(seen)} messages lost")


async def _run(args: argparse.Namespace, storage: str) -> dict[str, Any]:
    ns = f"bench-txn-{uuid.uuid4().hex[:6]}"
    client = aio.ServiceBusClient(ns, storage_path=storage)
    admin = aio.ServiceBusAdministrationClient(ns, storage_path=storage)
    rows = []
    for k in (1, 10):
        per: dict[str, list[float]] = {"plain": [], "txn": []}
        for rnd in range(args.rounds):
            for mode in ("plain", "txn"):
                src, dst = f"a-{k}-{rnd}-{mode}", f"b-{k}-{rnd}-{mode}"
                await admin.create_queue(src)
                await admin.create_queue(dst)
                await _fill(client, src, args.messages)
                secs = await _transfer(
                    client, src, dst, args.messages, k, args.workers, mode == "txn"
                )
                await _check(client, admin, src, dst, args.messages)
                per[mode].append(args.messages / secs)
                print(
                    f"  K={k:<2} round {rnd + 1} {mode:<5} {args.messages / secs:>9,.0f} msgs/s",
                    flush=True,
                )
                await admin.delete_queue(src)
                await admin.delete_queue(dst)
        ratios = [t / p for t, p in zip(per["txn"], per["plain"], strict=True)]
        rows.append(
            {
                "k": k,
                "plain_msgs_s": median(per["plain"]),
                "txn_msgs_s": median(per["txn"]),
                "txn_transfers_s": (median(per["txn"]) or 0) / k,
                "plain_transfers_s": (median(per["plain"]) or 0) / k,
                "ratio_txn_over_plain": median(ratios),
            }
        )
    return {"rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--storage", default=None, help="default: a temporary directory (durable)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    args.messages = args.messages or (400 if args.quick else 2000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    started = time.time()
    tmp = None if args.storage else tempfile.mkdtemp(prefix="raybus-bench-txn-")
    storage = args.storage or str(tmp)
    errors: list[str] = []

    def cleanup() -> None:
        if ray.is_initialized():
            ray.shutdown()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    watchdog = Watchdog(cleanup)
    _common.start_local_ray(200)
    try:
        raybus.connect  # noqa: B018 (the aio client joins the Ray started above)
        with watchdog.armed(900, "transactions benchmark"):
            body = asyncio.run(_run(args, storage))
    except BenchError as exc:
        errors.append(str(exc))
        body = {"rows": []}
    finally:
        cleanup()
    print(
        f"\n### Transfers A → B: {args.messages} x 1 KiB, {args.workers} workers, "
        f"storage {'durable' if tmp or '://' not in storage else storage}\n"
    )
    print("| messages per transfer | plain msgs/s | txn msgs/s | txn transfers/s | txn ÷ plain |")
    print("|---:|---:|---:|---:|---:|")
    for r in body["rows"]:
        print(
            f"| {r['k']} | {r['plain_msgs_s']:,.0f} | {r['txn_msgs_s']:,.0f} | "
            f"{r['txn_transfers_s']:,.0f} | {r['ratio_txn_over_plain']:.2f} |"
        )
    path = _write("transactions", started, args, machine_facts(), body)
    print(f"\nJSON: {path}")
    report_errors(errors)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
