"""Partition actors count what flows through them (the totals ray.util.metrics exports)."""

from __future__ import annotations

import ray

import raybus
from raybus import ServiceBusMessage
from raybus.management import ServiceBusAdministrationClient


def test_partition_totals_move_when_messages_flow(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    route = ray.get(client._aio._conn.registry.route.remote(queue))
    partition = route.partitions[0]
    before = ray.get(partition.stats.remote())
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(10)])
    with client.get_queue_receiver(queue, max_wait_time=2) as receiver:
        got = receiver.receive_messages(10)
        while len(got) < 10:
            got += receiver.receive_messages(10 - len(got))
        receiver.complete_messages(got[:8])
        receiver.dead_letter_message(got[8], reason="bad")
        receiver.abandon_message(got[9])
    after = ray.get(partition.stats.remote())
    moved = {k: after[k] - before.get(k, 0) for k in after}
    assert moved["sent"] == 10
    assert moved["delivered"] == 10
    assert moved["completed"] == 8
    assert moved["dead_lettered"] == 1
    assert moved["redelivered"] == 1
    assert moved["flushes"] >= 1  # the namespace is durable in tests
    # On the local disk these small flushes are written on the actor's own thread.
    assert 1 <= moved["inline_flushes"] <= moved["flushes"]
