"""Peeks of 100 messages of 1 KiB, as one value (through Ray's object store) and in pieces.

A peek of 100 messages of 1 KiB is about 110 KiB of rows: just over what Ray carries inside
a call (100 KiB), so as one value it goes through the object store. Partition ``peek`` returns
them in pieces when the receiver asks (``raybus._core.wire``). This times ``--peeks`` peeks of
the same ``--count`` messages each way, alternating the two ways for ``--rounds`` rounds on
one queue (so both see the same machine load), and prints each round and the medians.

"one value" is the code before pieces with the receiver's row sizing switched off: it asks
for one value and takes the answer as it is, as the client did before (no joining, no size
estimate). "pieces" is the code as it is.

Run: ``python benchmarks/peek_pieces.py [--rounds 5] [--peeks 200] [--count 100] [--sync]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common
import ray

import raybus
from raybus import ServiceBusMessage, aio
from raybus.aio._receiver import ServiceBusReceiver
from raybus.management import ServiceBusAdministrationClient


@contextmanager
def one_value(receiver: ServiceBusReceiver, on: bool) -> Iterator[None]:
    """While ``on``: the receiver asks for its rows in one value and uses them as they come."""
    if on:
        receiver._pieces = lambda count: 1  # type: ignore[method-assign]
        receiver._rows = lambda result, pieces: result  # type: ignore[method-assign]
    try:
        yield
    finally:
        receiver.__dict__.pop("_pieces", None)
        receiver.__dict__.pop("_rows", None)


def body(i: int, size: int) -> bytes:
    return i.to_bytes(8, "big").ljust(size, b"x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--peeks", type=int, default=200)
    p.add_argument("--count", type=int, default=100, help="messages a peek")
    p.add_argument("--size", type=int, default=1024, help="body bytes")
    p.add_argument("--sync", action="store_true", help="the sync client instead of raybus.aio")
    args = p.parse_args(argv)
    _common.start_local_ray(object_store_mb=100)
    namespace = f"peek-{uuid.uuid4().hex[:8]}"
    loop = asyncio.new_event_loop()
    try:
        ServiceBusAdministrationClient(namespace, storage_path="memory://").create_queue("q")
        with raybus.connect(namespace, storage_path="memory://") as client:
            with client.get_queue_sender("q") as sender:
                # Bodies of their own: pickle would write one shared body once.
                sender.send_messages(
                    [ServiceBusMessage(body(i, args.size)) for i in range(args.count)]
                )
            with client.get_queue_receiver("q") as sync_receiver:
                if args.sync:
                    inner = sync_receiver._aio

                    def timed(peeks: int) -> float:
                        start = time.perf_counter()
                        for _ in range(peeks):
                            assert (
                                len(sync_receiver.peek_messages(args.count, sequence_number=1))
                                == args.count
                            )
                        return time.perf_counter() - start

                    times = rounds(args, inner, timed)
                else:
                    aclient = aio.ServiceBusClient(namespace, storage_path="memory://")
                    inner = aclient.get_queue_receiver("q")

                    async def peek_all(peeks: int) -> float:
                        start = time.perf_counter()
                        for _ in range(peeks):
                            got = await inner.peek_messages(args.count, sequence_number=1)
                            assert len(got) == args.count, len(got)
                        return time.perf_counter() - start

                    times = rounds(args, inner, lambda n: loop.run_until_complete(peek_all(n)))
                    loop.run_until_complete(inner.close())
                    loop.run_until_complete(aclient.close())
    finally:
        loop.run_until_complete(cancel(asyncio.all_tasks(loop)))
        loop.close()
        ray.shutdown()
    one, pieces = (statistics.median(times[k]) for k in ("one value", "pieces"))
    per = 1000 / args.peeks
    print(
        f"median of {args.rounds} rounds, {args.peeks} peeks of {args.count} x {args.size} B "
        f"({'sync' if args.sync else 'aio'}): one value {one:.3f} s ({one * per:.3f} ms/peek), "
        f"pieces {pieces:.3f} s ({pieces * per:.3f} ms/peek), ratio {one / pieces:.2f}x"
    )
    return 0


async def cancel(tasks: set[asyncio.Task[object]]) -> None:
    """End the aio client's background tasks (route refreshes) before the loop closes."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def rounds(
    args: argparse.Namespace, receiver: ServiceBusReceiver, timed: Callable[[int], float]
) -> dict[str, list[float]]:
    """``args.rounds`` rounds of both ways, alternating which goes first."""
    times: dict[str, list[float]] = {"one value": [], "pieces": []}
    for r in range(args.rounds):
        for way in ("one value", "pieces") if r % 2 == 0 else ("pieces", "one value"):
            with one_value(receiver, way == "one value"):
                timed(20)  # the first peek learns the row size; warms the path up
                times[way].append(timed(args.peeks))
            asked = 1 if way == "one value" else receiver._pieces(args.count)
            print(f"round {r + 1} {way} ({asked}): {times[way][-1]:.3f} s", flush=True)
    return times


if __name__ == "__main__":
    sys.exit(main())
