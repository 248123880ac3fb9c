"""Lanes on a real cluster (``raybus._lane``): a client's sends, receives and settlements reach
the partition over its lane once it is open; the actor's refusals arrive typed as over Ray; a
restarted partition gets a new lane and nothing is lost; a deleted queue is reported as
deleted; with lanes off every call goes over Ray."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import ray

import raybus
from raybus import ServiceBusMessage, _lane, aio
from raybus._actors.namespace import namespace_actor_name
from raybus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusConnectionError,
    ServiceBusQuotaExceededError,
)
from raybus.management import ServiceBusAdministrationClient


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    return module_namespace


@pytest.fixture
def lane_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """The names of the methods called over a lane in this process, counted."""
    calls: Counter[str] = Counter()
    call = _lane.Lane.call

    async def counted(self: _lane.Lane, name: str, *args: Any) -> Any:
        calls[name] += 1
        return await call(self, name, *args)

    monkeypatch.setattr(_lane.Lane, "call", counted)
    yield calls


def _queue(admin: ServiceBusAdministrationClient, **props: Any) -> str:
    name = f"lane-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, **props)
    return name


@functools.cache
def _partition(namespace: str, queue: str) -> Any:
    registry = ray.get_actor(namespace_actor_name(namespace), "raybus")
    return ray.get(registry.route.remote(queue)).partitions[0]


def _partition_lane(namespace: str, queue: str) -> Any:
    """What this loop holds for the queue's partition: a lane, or None."""
    entries = _lane._lanes.get(asyncio.get_running_loop(), {})
    return entries.get(_partition(namespace, queue)._actor_id)


async def _lane_open(client: aio.ServiceBusClient, namespace: str, queue: str) -> None:
    """Send until the partition's lane is open (the first calls go over Ray meanwhile); the
    messages sent are received and completed."""
    sent = 0
    async with client.get_queue_sender(queue) as sender:
        deadline = time.monotonic() + 20
        while not isinstance(_partition_lane(namespace, queue), _lane.Lane):
            assert time.monotonic() < deadline, "no lane opened"
            await sender.send_messages(ServiceBusMessage("warm-up"))
            sent += 1
            await asyncio.sleep(0.05)
    async with client.get_queue_receiver(queue) as receiver:
        while sent:
            got = await receiver.receive_messages(sent, max_wait_time=5)
            for m in got:
                await receiver.complete_message(m)
            sent -= len(got)


async def _with_lane(
    namespace: str, admin: ServiceBusAdministrationClient, **props: Any
) -> tuple[str, aio.ServiceBusClient]:
    """A new queue and a client whose lane to its partition is open."""
    queue = _queue(admin, **props)
    client = aio.ServiceBusClient(namespace)
    await _lane_open(client, namespace, queue)
    return queue, client


def _entries() -> list[Any]:
    return list(_lane._lanes.get(asyncio.get_running_loop(), {}).values())


async def test_sends_receives_and_settlements_go_over_the_lane(
    namespace: str, admin: ServiceBusAdministrationClient, lane_calls: Counter[str]
) -> None:
    queue, client = await _with_lane(namespace, admin)
    lane_calls.clear()
    async with client.get_queue_sender(queue) as sender:
        for i in range(20):
            await sender.send_messages(ServiceBusMessage(f"m{i}"))
    async with client.get_queue_receiver(queue) as receiver:
        bodies = []
        while len(bodies) < 20:
            for m in await receiver.receive_messages(20, max_wait_time=5):
                bodies.append(str(m))
                await receiver.complete_message(m)
    assert bodies == [f"m{i}" for i in range(20)]
    await client.close()
    assert lane_calls["send_groups"] == 20
    assert lane_calls["receive"] + lane_calls["settle_receive"] >= 1
    assert lane_calls["settle"] + lane_calls["settle_receive"] >= 1
    assert admin.get_queue_runtime_properties(queue).active_message_count == 0


async def test_a_refused_send_over_the_lane_raises_the_typed_error_and_stores_nothing(
    namespace: str, admin: ServiceBusAdministrationClient, lane_calls: Counter[str]
) -> None:
    queue, client = await _with_lane(namespace, admin, max_size_in_megabytes=1)
    chunk = b"x" * 200_000
    lane_calls.clear()
    async with client.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(chunk) for _ in range(4)])
        with pytest.raises(ServiceBusQuotaExceededError) as info:  # the partition's refusal
            await sender.send_messages([ServiceBusMessage(chunk) for _ in range(2)])
        assert info.value.max_size == 1024 * 1024
    assert lane_calls["send_groups"] == 2
    assert admin.get_queue_runtime_properties(queue).active_message_count == 4
    await client.close()


async def test_a_restarted_partition_gets_a_new_lane_and_loses_nothing(
    namespace: str, admin: ServiceBusAdministrationClient, lane_calls: Counter[str]
) -> None:
    queue, client = await _with_lane(namespace, admin)
    old = _partition_lane(namespace, queue)
    ray.kill(_partition(namespace, queue), no_restart=False)
    sent, uncertain = 0, set()
    async with client.get_queue_sender(queue) as sender:
        deadline = time.monotonic() + 30
        # Sends go on until 10 are acknowledged and a new lane carries them.
        while (
            sent < 10
            or _partition_lane(namespace, queue) is old
            or not isinstance(_partition_lane(namespace, queue), _lane.Lane)
        ):
            assert time.monotonic() < deadline, "sends did not resume over a new lane"
            try:
                await sender.send_messages(ServiceBusMessage(f"after{sent}"))
                sent += 1
            except ServiceBusConnectionError:  # under way when the old process died
                uncertain.add(f"after{sent}")  # stored or not: sent again
                await asyncio.sleep(0.1)
    assert old.broken
    assert isinstance(_partition_lane(namespace, queue), _lane.Lane)
    async with client.get_queue_receiver(queue) as receiver:
        got: list[str] = []
        while batch := await receiver.receive_messages(100, max_wait_time=2):
            got += [str(m) for m in batch]
            await receiver.complete_messages(batch)
    expected = [f"after{i}" for i in range(sent)]
    # Every acknowledged send arrives, in order; a send that raised may have been stored
    # once more (its answer was lost with the process).
    assert [b for i, b in enumerate(got) if b not in got[:i]] == expected
    assert {b for b in got if got.count(b) > 1} <= uncertain
    await client.close()


async def test_a_send_over_the_lane_to_a_deleted_queue_raises_not_found(
    namespace: str, admin: ServiceBusAdministrationClient
) -> None:
    queue, client = await _with_lane(namespace, admin)
    async with client.get_queue_sender(queue) as sender:
        admin.delete_queue(queue)
        with pytest.raises(MessagingEntityNotFoundError):
            await sender.send_messages(ServiceBusMessage("into nothing"))
    await client.close()


async def test_with_lanes_off_every_call_goes_over_ray(
    namespace: str,
    admin: ServiceBusAdministrationClient,
    lane_calls: Counter[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_lane, "ENABLED", False)
    queue = _queue(admin)
    client = aio.ServiceBusClient(namespace)
    async with client.get_queue_sender(queue) as sender:
        for i in range(10):
            await sender.send_messages(ServiceBusMessage(f"m{i}"))
            await asyncio.sleep(0.05)
    async with client.get_queue_receiver(queue) as receiver:
        got = await receiver.receive_messages(10, max_wait_time=5)
        await receiver.complete_messages(got)
    await client.close()
    assert len(got) == 10
    assert sum(lane_calls.values()) == 0
    assert _entries() == []


def test_the_sync_api_takes_the_lane_through_its_loop_once_it_is_open(
    namespace: str, admin: ServiceBusAdministrationClient, lane_calls: Counter[str]
) -> None:
    """Its direct path (a Ray call from the caller's thread) would skip the hop to raybus's
    loop, but a lane from there costs less."""
    queue = _queue(admin)
    with raybus.ServiceBusClient(namespace) as client:
        with client.get_queue_sender(queue) as sender:
            deadline = time.monotonic() + 20
            while not lane_calls["send_groups"]:  # the first sends set the lane up
                assert time.monotonic() < deadline, "the sync sender never took the lane"
                sender.send_messages(ServiceBusMessage("warm-up"))
                time.sleep(0.05)
            lane_calls.clear()
            for i in range(10):
                sender.send_messages(ServiceBusMessage(f"m{i}"))
        assert lane_calls["send_groups"] == 10
        with client.get_queue_receiver(queue) as receiver:
            got: list[str] = []
            while batch := receiver.receive_messages(100, max_wait_time=2):
                got += [str(m) for m in batch]
                receiver.complete_messages(batch)
    assert got[-10:] == [f"m{i}" for i in range(10)]
    assert lane_calls["receive"] >= 1
    assert lane_calls["settle"] + lane_calls["settle_receive"] >= 1
    assert admin.get_queue_runtime_properties(queue).active_message_count == 0
