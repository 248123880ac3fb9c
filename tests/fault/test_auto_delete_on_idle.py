"""auto_delete_on_idle for real: Service Bus' minimum is 5 minutes, so this is a soak test."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest

import raybus
from raybus import ServiceBusMessage
from raybus.management import ServiceBusAdministrationClient

pytestmark = [pytest.mark.soak, pytest.mark.timeout(900)]


def test_idle_queue_is_deleted_after_its_idle_time_and_a_used_one_is_kept(
    ray_cluster: str,
) -> None:
    ns = f"idle-{uuid.uuid4().hex[:6]}"
    client = raybus.connect(ns, storage_path="memory://")
    admin = ServiceBusAdministrationClient(ns, storage_path="memory://")
    idle = timedelta(minutes=5)
    admin.create_queue("idle", auto_delete_on_idle=idle)
    admin.create_queue("busy", auto_delete_on_idle=idle)
    deadline = time.monotonic() + idle.total_seconds() + 120
    with client.get_queue_sender("busy") as sender:
        while time.monotonic() < deadline:
            sender.send_messages(ServiceBusMessage("keep me"))  # sending counts as use
            names = {q.name for q in admin.list_queues()}
            if "idle" not in names:
                break
            time.sleep(20)
    names = {q.name for q in admin.list_queues()}
    assert "idle" not in names, "the idle queue outlived its auto_delete_on_idle"
    assert "busy" in names
