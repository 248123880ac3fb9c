"""Partition actors killed while a partition change moves their messages: nothing is lost or
stored twice (moves go through the source's durable outbox and are adopted at most once)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

import pytest
import ray

import raybus
from raybus import ServiceBusMessage
from raybus.exceptions import ServiceBusError
from raybus.management import ServiceBusAdministrationClient

pytestmark = pytest.mark.fault


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_partitions_killed_during_scale_changes_lose_and_duplicate_nothing(
    ray_cluster: str, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    ns = f"kills-{uuid.uuid4().hex[:6]}"
    storage = str(tmp_path / "storage")
    admin = ServiceBusAdministrationClient(ns, storage_path=storage)
    client = raybus.connect(ns, storage_path=storage)
    name = "q"
    admin.create_queue(name, partition_count=4, requires_session=False)
    sent = [f"m{i}" for i in range(2000)]
    with client.get_queue_sender(name) as sender:
        for i in range(0, len(sent), 20):
            for j in range(i, i + 20):  # one by one: spread over the four partitions
                sender.send_messages(ServiceBusMessage(sent[j], message_id=sent[j]))
    registry = client._aio._conn.registry
    kills = 0
    stop = threading.Event()

    def killer() -> None:
        nonlocal kills
        while not stop.is_set():
            route = ray.get(registry.route.remote(name))
            parts = route.existing()
            _pid, victim = rng.choice(parts)
            ray.kill(victim, no_restart=False)
            kills += 1
            time.sleep(rng.uniform(0.05, 0.4))

    for target in (1, 3, 2):
        admin.update_queue(admin.get_queue(name), partition_count=target)
        thread = threading.Thread(target=killer)
        thread.start()
        time.sleep(rng.uniform(0.2, 1.0))
        stop.set()
        thread.join()
        stop.clear()
        deadline = time.monotonic() + 120
        while True:
            try:
                if admin.wait_for_partitions(name, timeout=5) == target:
                    break
            except ServiceBusError:
                pass
            assert time.monotonic() < deadline, f"change to {target} did not finish"

    received: list[str] = []
    with client.get_queue_receiver(name, max_wait_time=3) as receiver:
        while True:
            try:
                got = receiver.receive_messages(200)
            except ServiceBusError:
                continue
            if not got:
                break
            received += [str(m) for m in got]
            receiver.complete_messages(got)
    print(f"seed {seed}: {kills} partition kills, {len(received)} messages received")
    assert kills > 0
    assert sorted(received) == sorted(sent), (
        f"lost {len(set(sent) - set(received))}, duplicated {len(received) - len(set(received))}"
    )
    admin.delete_queue(name)
