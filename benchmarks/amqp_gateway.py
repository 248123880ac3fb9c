#!/usr/bin/env python
"""Messages per second through the AMQP gateway with the official azure-servicebus SDK, beside
the native raybus client on the same kind of queue, in one run on one local Ray cluster.

Both move N messages with 1 KiB bodies, in batches of B (default 100):

* native: ``raybus.ServiceBusClient`` (sync): ``send_messages(list of B)``; then
  ``receive_messages(max_message_count=B)`` and ``complete_message`` one by one.
* SDK: ``azure.servicebus.ServiceBusClient`` (sync, 7.15) against ``raybus.amqp`` running in
  this process: ``send_messages(ServiceBusMessageBatch of B)``; then
  ``receive_messages(max_message_count=B)`` and ``complete_message`` one by one (each waits
  for the gateway's settled disposition, as 7.15 does in PEEK_LOCK).

The SDK runs in a separate process (this script with ``--role sdk``) so that it does not share
a GIL with the gateway, as in a real deployment. Every run checks that each message arrived
exactly once with its body and that the queue is empty afterwards. Numbers are medians over
rounds; the machine may be shared and noisy.

Run: ``python benchmarks/amqp_gateway.py [--quick] [--messages N] [--batch B] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common

BODY = 1024


def _body(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"\xa5" * (BODY - 8)


def _check(indices: list[int], n: int, who: str) -> None:
    if sorted(indices) != list(range(n)):
        raise RuntimeError(f"{who}: received {len(indices)} messages, not each of {n} once")


def _drain(receiver: Any, n: int, batch: int, who: str, body: Callable[[Any], bytes]) -> float:
    """Receive and complete ``n`` messages one by one (either client: same method names);
    checks each arrived once; returns the seconds it took."""
    got: list[int] = []
    start = time.perf_counter()
    while len(got) < n:
        msgs = receiver.receive_messages(max_message_count=batch, max_wait_time=10)
        if not msgs:
            raise RuntimeError(f"{who}: the queue ran dry early")
        for m in msgs:
            got.append(int.from_bytes(body(m)[:8], "big"))
            receiver.complete_message(m)
    seconds = time.perf_counter() - start
    _check(got, n, who)
    return seconds


def native_run(namespace: str, queue: str, n: int, batch: int) -> tuple[float, float]:
    import raybus

    with raybus.ServiceBusClient(namespace) as client:
        with client.get_queue_sender(queue) as sender:
            start = time.perf_counter()
            for first in range(0, n, batch):
                sender.send_messages(
                    [
                        raybus.ServiceBusMessage(_body(i))
                        for i in range(first, min(n, first + batch))
                    ]
                )
            send_s = time.perf_counter() - start
        with client.get_queue_receiver(queue, max_wait_time=10) as receiver:
            recv_s = _drain(receiver, n, batch, "native", lambda m: m.body)
    return n / send_s, n / recv_s


def sdk_role(conn_str: str, queue: str, n: int, batch: int) -> None:
    """In the child process: the SDK's send and receive; prints one JSON line."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    with ServiceBusClient.from_connection_string(conn_str, retry_total=0) as client:
        with client.get_queue_sender(queue) as sender:
            start = time.perf_counter()
            for first in range(0, n, batch):
                b = sender.create_message_batch()
                for i in range(first, min(n, first + batch)):
                    b.add_message(ServiceBusMessage(_body(i)))
                sender.send_messages(b)
            send_s = time.perf_counter() - start
        with client.get_queue_receiver(queue, max_wait_time=10, prefetch_count=batch) as receiver:
            recv_s = _drain(receiver, n, batch, "sdk", lambda m: b"".join(m.body))
    print(json.dumps({"send": n / send_s, "receive": n / recv_s}))


def sdk_run(conn_str: str, queue: str, n: int, batch: int) -> tuple[float, float]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--role",
            "sdk",
            "--conn",
            conn_str,
            "--queue",
            queue,
            "--messages",
            str(n),
            "--batch",
            str(batch),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"sdk process failed:\n{out.stderr[-3000:]}")
    line = json.loads(out.stdout.strip().splitlines()[-1])
    return line["send"], line["receive"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1000 messages, 1 round")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--confirm", action="store_true", help="gateway with confirm_settlements=True"
    )
    parser.add_argument("--role", default="main", help=argparse.SUPPRESS)
    parser.add_argument("--conn", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "sdk":
        sdk_role(args.conn, args.queue, args.messages, args.batch)
        return
    n, rounds = (1000, 1) if args.quick else (args.messages, args.rounds)

    import ray

    from raybus.amqp import start_gateway
    from raybus.management import ServiceBusAdministrationClient

    _common.start_local_ray(200)
    namespace = f"bench-amqp-{uuid.uuid4().hex[:6]}"
    admin = ServiceBusAdministrationClient(namespace, storage_path="memory://")
    gateway = start_gateway(
        namespace, port=0, storage_path="memory://", confirm_settlements=args.confirm
    )
    results: dict[str, list[float]] = {k: [] for k in ("ns", "nr", "ss", "sr")}
    try:
        for r in range(rounds):
            for kind in ("native", "sdk"):
                queue = f"{kind}-{r}"
                admin.create_queue(queue)
                if kind == "native":
                    send, recv = native_run(namespace, queue, n, args.batch)
                    results["ns"].append(send)
                    results["nr"].append(recv)
                else:
                    send, recv = sdk_run(gateway.connection_string, queue, n, args.batch)
                    results["ss"].append(send)
                    results["sr"].append(recv)
                if admin.get_queue_runtime_properties(queue).active_message_count != 0:
                    raise RuntimeError(f"{queue} is not empty after the run")
                admin.delete_queue(queue)
                print(
                    f"round {r + 1} {kind}: send {send:,.0f}/s, receive+complete {recv:,.0f}/s",
                    file=sys.stderr,
                )
    finally:
        gateway.stop()
        ray.shutdown()
    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"\nAMQP gateway vs native raybus: {n} messages of {BODY} B in batches of "
        f"{args.batch}, median of {rounds} round(s), confirm_settlements={args.confirm}\n"
    )
    print("| path | native raybus msg/s | azure-servicebus SDK via gateway msg/s | SDK / native |")
    print("|---|---:|---:|---:|")
    for label, a, b in (("send (batches)", "ns", "ss"), ("receive + complete", "nr", "sr")):
        print(f"| {label} | {med[a]:,.0f} | {med[b]:,.0f} | {med[b] / med[a]:.2f} |")


if __name__ == "__main__":
    main()
