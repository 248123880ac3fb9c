"""Competing consumers on Ray: a processor whose pool of actors follows the backlog.

Run: ``python examples/competing_consumers.py`` (starts an embedded local Ray if none runs).
A producer bursts 400 orders into a queue. The processor starts with one replica (a Ray actor
running up to 4 handlers at a time); as the backlog grows it adds replicas up to 4, drains the
queue, and once the backlog has stayed low for 2 s it drains and stops the extra replicas. The
script prints the timeline as it happens.
"""

from __future__ import annotations

import os
import time
import uuid

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import raybus
from raybus import ServiceBusMessage
from raybus.management import ServiceBusAdministrationClient

ORDERS = 400


def handle_order(message: raybus.ServiceBusReceivedMessage) -> None:
    """The work, run inside a replica actor: 50 ms of I/O (say, a call to a payment service).
    Returning completes the message; raising would abandon it."""
    time.sleep(0.05)


def main() -> None:
    namespace = f"example-{uuid.uuid4().hex[:6]}"
    admin = ServiceBusAdministrationClient(namespace, storage_path="memory://")
    admin.create_queue("orders")
    client = raybus.connect(namespace)

    processor = client.get_processor(
        "orders",
        handle_order,
        max_concurrent_calls=4,  # handlers per replica
        min_replicas=1,
        max_replicas=4,
        target_backlog_per_replica=50,  # one replica per 50 waiting orders
        scale_down_delay=2.0,  # shrink only after the backlog stayed low this long
    )
    start = time.monotonic()

    def say(text: str) -> None:
        print(f"{time.monotonic() - start:5.1f} s  {text}", flush=True)

    with processor:
        stats = processor.statistics
        say(f"processor started: {stats.replicas} replica, queue empty")
        with client.get_queue_sender("orders") as sender:
            sender.send_messages([ServiceBusMessage(f"order {i}") for i in range(ORDERS)])
        say(f"producer burst: {ORDERS} orders sent")

        shown = None
        last_line = 0.0
        peak = 1
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            stats = processor.statistics
            peak = max(peak, stats.replicas)
            pool = (stats.replicas, stats.replicas_starting, stats.desired_replicas)
            if pool != shown or time.monotonic() - last_line >= 1.0:
                say(
                    f"backlog {stats.backlog:3d}  handled {stats.handled:3d}  "
                    f"in flight {stats.in_flight:2d}  replicas {stats.replicas} "
                    f"(+{stats.replicas_starting} starting, desired {stats.desired_replicas})"
                )
                shown, last_line = pool, time.monotonic()
            if stats.handled == ORDERS and stats.replicas == 1 and stats.replicas_starting == 0:
                break
            time.sleep(0.1)
    stats = processor.statistics
    say(
        f"stopped: handled {stats.handled}, failed {stats.failed}, peak replicas {peak}, "
        f"replicas started {stats.replicas_started}"
    )
    assert stats.handled == ORDERS, stats
    admin.delete_queue("orders")


if __name__ == "__main__":
    main()
