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


def test_a_subscription_nobody_reads_is_deleted_however_busy_its_topic(
    ray_cluster: str,
) -> None:
    # Service Bus counts a subscription's receives, browses and updates as its use, not the
    # topic's deliveries to it: a subscription left behind by a consumer goes away.
    ns = f"idle-sub-{uuid.uuid4().hex[:6]}"
    client = raybus.connect(ns, storage_path="memory://")
    admin = ServiceBusAdministrationClient(ns, storage_path="memory://")
    idle = timedelta(minutes=5)
    admin.create_topic("events")
    admin.create_subscription("events", "left", auto_delete_on_idle=idle)
    admin.create_subscription("events", "read", auto_delete_on_idle=idle)
    deadline = time.monotonic() + idle.total_seconds() + 120
    with (
        client.get_topic_sender("events") as sender,
        client.get_subscription_receiver("events", "read") as receiver,
    ):
        while time.monotonic() < deadline:
            sender.send_messages(ServiceBusMessage("news"))
            receiver.peek_messages(1)  # browsing counts as use
            names = {s.name for s in admin.list_subscriptions("events")}
            if "left" not in names:
                break
            time.sleep(20)
        sender.send_messages(ServiceBusMessage("after"))  # the router no longer delivers there
    names = {s.name for s in admin.list_subscriptions("events")}
    assert "left" not in names, "the unread subscription outlived its auto_delete_on_idle"
    assert "read" in names
    assert admin.get_subscription_runtime_properties("events", "read").active_message_count > 1


def test_an_idle_topic_is_deleted_and_a_used_one_is_kept(ray_cluster: str) -> None:
    # A topic is used by publishes and by its subscriptions' receivers (Service Bus counts
    # their activity as the topic's): one with neither goes away.
    ns = f"idle-topic-{uuid.uuid4().hex[:6]}"
    client = raybus.connect(ns, storage_path="memory://")
    admin = ServiceBusAdministrationClient(ns, storage_path="memory://")
    idle = timedelta(minutes=5)
    for name in ("gone", "sent", "read"):
        admin.create_topic(name, auto_delete_on_idle=idle)
        admin.create_subscription(name, "s")
    deadline = time.monotonic() + idle.total_seconds() + 120
    with (
        client.get_topic_sender("sent") as sender,
        client.get_subscription_receiver("read", "s") as receiver,
    ):
        while time.monotonic() < deadline:
            sender.send_messages(ServiceBusMessage("news"))
            receiver.peek_messages(1)
            names = {t.name for t in admin.list_topics()}
            if "gone" not in names:
                break
            time.sleep(20)
    names = {t.name for t in admin.list_topics()}
    assert "gone" not in names, "the idle topic outlived its auto_delete_on_idle"
    assert {"sent", "read"} <= names
    assert [s.name for s in admin.list_subscriptions("read")] == ["s"]
