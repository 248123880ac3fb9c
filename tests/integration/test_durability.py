"""Durability on a real Ray cluster: acknowledged messages survive actor and cluster restarts.

Each test gives its namespace its own ``storage_path`` (a temporary directory).
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
import ray
from restarts import restart
from segment_files import record_starts, tear_last_record
from settlement_support import _receive_n

import raybus
from raybus import ServiceBusMessage
from raybus._actors.namespace import namespace_actor_name
from raybus.management import ServiceBusAdministrationClient

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def storage(tmp_path: Path) -> str:
    return str(tmp_path / "storage")


@pytest.fixture
def durable(
    namespace: str, storage: str
) -> tuple[raybus.ServiceBusClient, ServiceBusAdministrationClient]:
    return (
        raybus.ServiceBusClient(namespace, storage_path=storage),
        ServiceBusAdministrationClient(namespace, storage_path=storage),
    )


def _partition(client: raybus.ServiceBusClient, queue: str) -> object:
    return ray.get(client._aio._conn.registry.route.remote(queue)).partitions[0]


def _wait_until(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except raybus.exceptions.ServiceBusError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


def _restart(client: raybus.ServiceBusClient, queue: str) -> None:
    """Kill ``queue``'s partition actor and wait until its successor answers (the old actor
    still answers until its process has died: ``restarts``)."""
    restart(_partition(client, queue))


def test_killed_partition_actor_recovers_every_acknowledged_message(
    durable: tuple[raybus.ServiceBusClient, ServiceBusAdministrationClient],
) -> None:
    client, admin = durable
    admin.create_queue("orders", lock_duration=timedelta(seconds=30))
    with client.get_queue_sender("orders") as sender:
        for batch in range(4):
            sender.send_messages(
                [ServiceBusMessage(f"m{batch}-{i}", message_id=f"{batch}-{i}") for i in range(50)]
            )
    with client.get_queue_receiver("orders", max_wait_time=5) as receiver:
        got = receiver.receive_messages(80)
        receiver.complete_messages(got[:50])  # waits for the broker: durable completions
        locked = got[50:]  # still locked when the actor dies
    completed = {m.message_id for m in got[:50]}

    _restart(client, "orders")
    _wait_until(lambda: admin.get_queue_runtime_properties("orders").active_message_count == 150)

    seen: dict[str, int] = {}
    with client.get_queue_receiver("orders", max_wait_time=3) as receiver:
        while batch_ := receiver.receive_messages(100):
            for m in batch_:
                seen[m.message_id or ""] = m.delivery_count
            receiver.complete_messages(batch_)
    assert len(seen) == 150 and not completed & set(seen)
    # Locks are not persisted and the crash is not charged as a delivery.
    assert all(seen[m.message_id or ""] == 0 for m in locked)


def test_completions_sent_without_waiting_are_durable_once_close_returns(
    durable: tuple[raybus.ServiceBusClient, ServiceBusAdministrationClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``complete_message`` returns before the broker answers, and tells the partition so (its
    flush may wait for a send to share it); close() waits for the answers, and from then on
    the completions survive the partition's crash, sends made in between included."""
    client, admin = durable
    admin.create_queue("orders", lock_duration=timedelta(seconds=30))
    conn = client._aio._conn
    asked: list[bool] = []
    settler = conn.settler
    monkeypatch.setattr(
        conn, "settler", lambda *a, waited=True: asked.append(waited) or settler(*a, waited=waited)
    )
    with client.get_queue_sender("orders") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(20)])
        with client.get_queue_receiver("orders", max_wait_time=5) as receiver:
            for i, msg in enumerate(_receive_n(receiver, 20)):
                receiver.complete_message(msg)
                if i % 5 == 0:  # a send shares the flush of the completions before it
                    sender.send_messages(ServiceBusMessage(f"late{i}", message_id=f"late{i}"))
    assert asked and not any(asked)  # every completion went without waiting

    _restart(client, "orders")
    _wait_until(lambda: admin.get_queue_runtime_properties("orders").active_message_count == 4)
    with client.get_queue_receiver("orders", max_wait_time=3) as receiver:
        left = _receive_n(receiver, 4)
        receiver.complete_messages(left)
    assert sorted(m.message_id for m in left) == ["late0", "late10", "late15", "late5"]


@pytest.mark.fault
def test_sequence_numbers_keep_increasing_after_a_restart_of_a_drained_queue(
    durable: tuple[raybus.ServiceBusClient, ServiceBusAdministrationClient],
) -> None:
    client, admin = durable
    admin.create_queue("q")
    with client.get_queue_sender("q") as sender:
        sender.send_messages([ServiceBusMessage(str(i)) for i in range(10)])
    with client.get_queue_receiver("q", max_wait_time=5) as receiver:
        receiver.complete_messages(receiver.receive_messages(10))
    _restart(client, "q")
    with client.get_queue_sender("q") as sender:
        _wait_until(lambda: sender.send_messages(ServiceBusMessage("after")) is None)
    with client.get_queue_receiver("q", max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages(10)
    assert str(msg) == "after" and msg.sequence_number > 10


@pytest.mark.fault
def test_killed_namespace_actor_finds_its_entities_again(
    namespace: str,
    durable: tuple[raybus.ServiceBusClient, ServiceBusAdministrationClient],
) -> None:
    client, admin = durable
    admin.create_queue("keep", max_delivery_count=3)
    admin.create_queue("gone")
    admin.delete_queue("gone")
    ray.kill(ray.get_actor(namespace_actor_name(namespace), "raybus"), no_restart=False)
    _wait_until(lambda: [q.name for q in admin.list_queues()] == ["keep"])
    assert admin.get_queue("keep").max_delivery_count == 3
    with client.get_queue_sender("keep") as sender:
        sender.send_messages(ServiceBusMessage("still works"))
    assert admin.get_queue_runtime_properties("keep").active_message_count == 1


def test_the_namespace_keeps_its_creation_time_on_a_fresh_registry(
    namespace: str,
    storage: str,
    durable: tuple[raybus.ServiceBusClient, ServiceBusAdministrationClient],
) -> None:
    """The registry is stopped for good and a new one started on the same storage (as on a
    fresh cluster): it reads the namespace's creation time back from its log."""
    _, admin = durable
    created = admin.get_namespace_properties()
    assert created.name == namespace and created.namespace_type == "Messaging"
    assert created.created_at_utc is not None
    assert abs(time.time() - created.created_at_utc.timestamp()) < 120
    assert created.modified_at_utc == created.created_at_utc
    ray.kill(ray.get_actor(namespace_actor_name(namespace), "raybus"), no_restart=True)
    _wait_until(lambda: _gone(namespace))
    time.sleep(1.0)  # a second later: a new birth would show
    fresh = ServiceBusAdministrationClient(namespace, storage_path=storage)
    assert fresh.get_namespace_properties() == created


def _gone(namespace: str) -> bool:
    try:
        ray.get_actor(namespace_actor_name(namespace), "raybus")
    except ValueError:
        return True
    return False


def test_deleting_a_durable_queue_deletes_its_storage(
    namespace: str,
    storage: str,
    durable: tuple[raybus.ServiceBusClient, ServiceBusAdministrationClient],
) -> None:
    client, admin = durable
    admin.create_queue("temp")
    with client.get_queue_sender("temp") as sender:
        sender.send_messages([ServiceBusMessage(b"x" * 1000) for _ in range(20)])
    queues = Path(storage) / namespace / "queues"
    assert any(queues.rglob("*.seg"))  # the log's segment
    admin.delete_queue("temp")
    assert not list(queues.rglob("*.seg")) and not list(queues.rglob("*.arrow"))


def test_updated_properties_survive_a_partition_restart(
    durable: tuple[raybus.ServiceBusClient, ServiceBusAdministrationClient],
) -> None:
    client, admin = durable
    admin.create_queue("props")
    props = admin.get_queue("props")
    props.max_delivery_count = 1
    admin.update_queue(props)
    with client.get_queue_sender("props") as sender:
        sender.send_messages(ServiceBusMessage("poison"))
    _restart(client, "props")
    with client.get_queue_receiver("props", max_wait_time=10) as receiver:
        (msg,) = receiver.receive_messages()
        receiver.abandon_message(msg)  # one delivery is the maximum now: dead-lettered
    _wait_until(lambda: admin.get_queue_runtime_properties("props").dead_letter_message_count == 1)


@pytest.mark.fault
def test_a_torn_log_tail_loses_only_the_torn_write(
    namespace: str,
    storage: str,
    durable: tuple[raybus.ServiceBusClient, ServiceBusAdministrationClient],
) -> None:
    """Stop a partition for good, tear its last log record as a crash mid-write would, and let
    the restarted registry bring the partition back: everything before the tear is there."""
    client, admin = durable
    admin.create_queue("torn")
    with client.get_queue_sender("torn") as sender:
        for batch in range(5):  # one log record per acknowledged send
            sender.send_messages([ServiceBusMessage(f"{batch}-{i}") for i in range(10)])
    ray.kill(_partition(client, "torn"), no_restart=True)
    time.sleep(1.0)  # ray.kill returns before the process is gone
    logs = sorted((Path(storage) / namespace).glob("queues/torn-*/*/0/log/*.seg"))
    assert len(logs) == 1 and len(record_starts(logs[0].read_bytes())) >= 5
    tear_last_record(logs[0])  # the last write, torn
    # A restarted registry re-creates the partition, which recovers from the log.
    ray.kill(ray.get_actor(namespace_actor_name(namespace), "raybus"), no_restart=False)
    _wait_until(lambda: admin.get_queue_runtime_properties("torn").active_message_count == 40, 60)
    # A new client: the old one's handle names the partition actor stopped for good above,
    # which raybus reads as a deleted queue (partition actors otherwise restart forever).
    fresh = raybus.ServiceBusClient(namespace, storage_path=storage)
    with fresh.get_queue_receiver("torn", max_wait_time=3) as receiver:
        bodies = []
        while batch_ := receiver.receive_messages(100):
            bodies += [str(m) for m in batch_]
            receiver.complete_messages(batch_)
    assert sorted(bodies) == sorted(f"{b}-{i}" for b in range(4) for i in range(10))


def test_messages_deleted_unreceived_stay_deleted_after_the_partition_restarts(
    durable: tuple[raybus.ServiceBusClient, ServiceBusAdministrationClient],
) -> None:
    client, admin = durable
    admin.create_queue("orders")
    with client.get_queue_sender("orders") as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(5)])
    with client.get_queue_receiver("orders") as receiver:
        assert receiver.delete_messages(3) == 3
    _restart(client, "orders")
    with client.get_queue_receiver("orders") as receiver:
        assert [m.message_id for m in receiver.peek_messages(10)] == ["m3", "m4"]
