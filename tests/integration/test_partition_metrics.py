"""Partition actors count what flows through them (the totals ray.util.metrics exports), and
the broker's actors leave Ray's task events out."""

from __future__ import annotations

import time

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


@ray.remote(num_cpus=0)
class _Control:
    """An actor with Ray's default options: its calls do record task events."""

    def ping(self) -> int:
        return 1


def _task_event_names() -> set[str]:
    """The function names of every task event the GCS holds (actor methods: ``Class.method``)."""
    from ray._private import state

    return {
        e.task_info.func_or_class_name
        for e in state.state._get_all_task_events()
        if e.HasField("task_info")
    }


def test_broker_actors_record_no_ray_task_events(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    """Broker actors are created without task events (``BROKER_ACTOR_OPTIONS``): a call per
    batch would otherwise be reported to the GCS. A default actor's calls are, within Ray's
    report interval (1 s): once the control's show, none of the broker's may."""
    control = _Control.remote()  # type: ignore[attr-defined]
    try:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("m"))
        with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
            receiver.complete_messages(receiver.receive_messages(1))
        assert ray.get(control.ping.remote()) == 1
        deadline = time.monotonic() + 30
        while "_Control.ping" not in (names := _task_event_names()):
            assert time.monotonic() < deadline, "the control's task events never arrived"
            time.sleep(0.2)
        broker = ("NamespaceActor.", "PartitionActor.", "RouterActor.", "CoordinatorActor.")
        assert sorted(n for n in names if n.startswith(broker)) == []
    finally:
        ray.kill(control)
