"""A partition whose log writes fail (EIO) in the middle of two combined calls: a completion
that refills the prefetch buffer (``settle_receive``) fails as a whole and leaves every message
where it was, and a topic's logged publish (``deliver``) is retried by the router until the
writes succeed, storing each copy once.

The fault is the fault suite's (``faults._arm_storage_fault``, run inside the partition actor
through ``__ray_call__``): every log write fails until disarmed.
"""

from __future__ import annotations

import errno
import threading
import time
from typing import Any

import faults
import faulty_fs
import pytest
import ray
from topics_support import _bodies, _drain

import raybus
from raybus import ServiceBusMessage, _lane, _rpc
from raybus._storage.errors import StorageUnavailableError
from raybus.exceptions import ServiceBusError
from raybus.management import ServiceBusAdministrationClient


def _writes_fail(handle: Any) -> None:
    for mod in (faulty_fs, faults):
        ray.cloudpickle.register_pickle_by_value(mod)
    ray.get(handle.__ray_call__.remote(faults._arm_storage_fault, errno.EIO, 0))


def _writes_work(handle: Any) -> int:
    return int(ray.get(handle.__ray_call__.remote(faults._disarm_storage_fault)))


_SETTLES_AND_RECEIVES = frozenset({"settle", "settle_receive", "receive"})


def _partition_calls(
    monkeypatch: pytest.MonkeyPatch, names: frozenset[str] = _SETTLES_AND_RECEIVES
) -> list[str]:
    """The names of the calls of ``names`` (settles and receives) made from now on, by
    either path."""
    calls: list[str] = []

    def spied(real: Any) -> Any:
        def spy(entity: Any, method: Any, *args: Any, **kw: Any) -> Any:
            if _rpc._name(method) in names:
                calls.append(_rpc._name(method))
            return real(entity, method, *args, **kw)

        return spy

    monkeypatch.setattr(_rpc, "call", spied(_rpc.call))
    monkeypatch.setattr(_rpc, "call_sync", spied(_rpc.call_sync))
    return calls


def _partition(client: raybus.ServiceBusClient, entity: str) -> Any:
    return ray.get(client._aio._conn.registry.route.remote(entity)).partitions[0]


@pytest.mark.parametrize("lanes", [True, False], ids=["over-its-loop-and-lane", "direct"])
def test_a_refilling_completion_whose_write_fails_completes_nothing(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    queue: str,
    lanes: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sync API's completion goes through its loop once the loop has a lane to the
    partition, and from the caller's thread (the direct path) without one."""
    monkeypatch.setattr(_lane, "ENABLED", lanes)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(30)])
    part = _partition(client, queue)
    with client.get_queue_receiver(queue, prefetch_count=15, max_wait_time=5) as receiver:
        first = receiver.receive_messages(10)
        assert len(first) == 10 and len(receiver._aio._buffer) == 5
        deadline = time.monotonic() + 10
        while lanes and not _lane.open_from(raybus._sync.loop(), part):  # set up meanwhile
            assert time.monotonic() < deadline, "the loop's lane to the partition never opened"
            time.sleep(0.05)
        calls = _partition_calls(monkeypatch)
        _writes_fail(part)
        try:
            try:
                receiver.complete_messages(first)  # refills: one settle_receive call
            except ServiceBusError:
                pass
            else:
                raise AssertionError("the completion's write failed: it must not succeed")
        finally:
            assert _writes_work(part) > 0
        assert calls == ["settle_receive"]
    # Nothing was completed: all 30 are still there (the failed write's locks went with it).
    assert admin.get_queue_runtime_properties(queue).active_message_count == 30
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        got: list[str] = []
        while len(got) < 30:
            batch = receiver.receive_messages(30 - len(got), max_wait_time=10)
            assert batch, f"only {len(got)} of 30 came back"
            receiver.complete_messages(batch)
            got += [str(m) for m in batch]
    assert sorted(got) == sorted(f"m{i}" for i in range(30))


@pytest.mark.fault
def test_a_logged_publish_waits_out_a_subscription_whose_writes_fail(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    t = f"wf-{time.monotonic_ns()}"
    admin.create_topic(t)
    for sub in ("a", "b"):
        admin.create_subscription(t, sub)
    with client.get_topic_sender(t) as sender:
        sender.send_messages(ServiceBusMessage("m0"))
        part = _partition(client, f"{t}/Subscriptions/a")
        _writes_fail(part)
        # The router retries for a few seconds; the writes work again after one.
        threading.Timer(1.0, _writes_work, (part,)).start()
        started = time.monotonic()
        sender.send_messages([ServiceBusMessage("m1"), ServiceBusMessage("m2")])
        assert time.monotonic() - started > 0.9  # it did wait for the writes
    for sub in ("a", "b"):
        assert _bodies(_drain(client, t, sub, 3)) == ["m0", "m1", "m2"], sub
    admin.delete_topic(t)


@pytest.mark.parametrize("lanes", [True, False], ids=["over-its-loop-and-lane", "direct"])
def test_a_send_whose_write_fails_is_repeated_by_the_retry_policy_until_it_is_stored(
    admin: ServiceBusAdministrationClient,
    namespace: str,
    queue: str,
    lanes: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed flush stores nothing (the partition rolls back), so the client's retry policy
    repeats the send, on the sync API's direct path as on its loop, until the writes work:
    the message is there once."""
    monkeypatch.setattr(_lane, "ENABLED", lanes)
    with (
        raybus.ServiceBusClient(namespace, retry_total=8, retry_backoff_factor=0.3) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages(ServiceBusMessage("m0"))
        part = _partition(client, queue)
        deadline = time.monotonic() + 10
        while lanes and not _lane.open_from(raybus._sync.loop(), part):  # set up meanwhile
            assert time.monotonic() < deadline, "the loop's lane to the partition never opened"
            time.sleep(0.05)
        calls = _partition_calls(monkeypatch, frozenset({"send_groups"}))
        _writes_fail(part)
        threading.Timer(1.0, _writes_work, (part,)).start()
        started = time.monotonic()
        sender.send_messages(ServiceBusMessage("m1"))
        assert time.monotonic() - started > 0.9  # it did wait for the writes
        assert len(calls) >= 2, calls  # the first try failed: it was repeated
    assert admin.get_queue_runtime_properties(queue).active_message_count == 2
    with (
        raybus.ServiceBusClient(namespace) as client,
        client.get_queue_receiver(queue, max_wait_time=5) as receiver,
    ):
        got = receiver.receive_messages(2, max_wait_time=5)
        receiver.complete_messages(got)
    assert sorted(str(m) for m in got) == ["m0", "m1"]


def test_with_no_retries_a_send_whose_write_fails_raises_and_stores_nothing(
    admin: ServiceBusAdministrationClient, namespace: str, queue: str
) -> None:
    with (
        raybus.ServiceBusClient(namespace, retry_total=0) as client,
        client.get_queue_sender(queue) as sender,
    ):
        sender.send_messages(ServiceBusMessage("m0"))
        part = _partition(client, queue)
        _writes_fail(part)
        try:
            with pytest.raises(StorageUnavailableError) as err:
                sender.send_messages([ServiceBusMessage("m1"), ServiceBusMessage("m2")])
            assert err.value.retryable
        finally:
            assert _writes_work(part) > 0
    assert admin.get_queue_runtime_properties(queue).active_message_count == 1
