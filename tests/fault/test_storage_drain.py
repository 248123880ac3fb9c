"""A drained queue gives its disk back: checkpoints compact the log to almost nothing."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

import raybus
from raybus import ServiceBusMessage
from raybus.management import ServiceBusAdministrationClient

pytestmark = [pytest.mark.fault, pytest.mark.timeout(600)]

MESSAGES = 100_000


def _disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_draining_100k_messages_shrinks_storage_back_to_near_zero(
    ray_cluster: str, tmp_path: Path
) -> None:
    ns = f"drain-{uuid.uuid4().hex[:6]}"
    storage = tmp_path / "store"
    client = raybus.connect(ns, storage_path=str(storage))
    admin = ServiceBusAdministrationClient(ns, storage_path=str(storage))
    admin.create_queue("big", max_size_in_megabytes=1024)
    filler = b"x" * 1016
    with client.get_queue_sender("big") as sender:
        for start in range(0, MESSAGES, 1000):
            # A body of its own per message: one body object shared by the messages of a
            # send is pickled once in the send's journal entry, so it takes the disk once.
            bodies = [b"%08d" % i + filler for i in range(start, start + 1000)]
            sender.send_messages([ServiceBusMessage(body) for body in bodies])
    full = _disk(storage)
    assert full > MESSAGES * 1024  # every message is on disk
    with client.get_queue_receiver("big", max_wait_time=5) as receiver:
        drained = 0
        while batch := receiver.receive_messages(1000):
            receiver.complete_messages(batch)
            drained += len(batch)
    assert drained == MESSAGES
    assert admin.get_queue_runtime_properties("big").active_message_count == 0
    # Quiet for a second, the partition checkpoints the empty queue: its log goes.
    deadline = time.monotonic() + 30
    while (left := _disk(storage)) >= 64 * 1024 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left < 64 * 1024, f"{left} bytes left of {full}"
