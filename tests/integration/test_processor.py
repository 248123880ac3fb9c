"""The processor (competing consumers in a pool of Ray actors) against a local Ray cluster:
exactly-once handling when nothing fails, poison messages, a killed replica, autoscaling,
sessions, a topic's subscription, and what ``stop()`` does with work in flight (sync and
asyncio clients).

Every replica is a Ray actor (a process, ~0.8 s to start), so the tests use one or two replicas
with small message counts, except the scaling test (up to three). Handlers record what they did
in one shared ``Collector`` actor, keyed per test.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import ray
from ray import cloudpickle

import raybus
from raybus import ServiceBusMessage, ServiceBusSubQueue, aio
from raybus.exceptions import InvalidArgumentError, MessagingEntityNotFoundError
from raybus.management import ServiceBusAdministrationClient

# Handlers and the collector are defined here; replicas cannot import this test module, so
# Ray's cloudpickle ships them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

DLQ = ServiceBusSubQueue.DEAD_LETTER


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    # Each test uses its own uniquely named queues; see ``module_namespace`` in conftest.
    return module_namespace


class Collector:
    """Records what handlers did, per test key (a Ray actor shared by the module's tests)."""

    def __init__(self) -> None:
        self._items: dict[str, list[Any]] = {}

    def add(self, key: str, item: Any) -> None:
        self._items.setdefault(key, []).append(item)

    def items(self, key: str) -> list[Any]:
        return list(self._items.get(key, []))


@pytest.fixture(scope="module")
def collector(ray_cluster: str) -> Iterator[Any]:
    actor = ray.remote(Collector).options(num_cpus=0).remote()
    try:
        yield actor
    finally:
        ray.kill(actor, no_restart=True)


@pytest.fixture
def key() -> str:
    return uuid.uuid4().hex[:8]


def _queue(admin: ServiceBusAdministrationClient, **options: Any) -> str:
    name = f"p-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, **options)
    return name


def _messages(count: int, prefix: str = "m", **fields: Any) -> list[ServiceBusMessage]:
    return [
        ServiceBusMessage(f"{prefix}{i}", message_id=f"{prefix}{i}", **fields) for i in range(count)
    ]


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


async def _await(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------- exactly once


def test_every_message_handled_exactly_once_sync(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    collector: Any,
    key: str,
) -> None:
    queue = _queue(admin)

    def handler(message: Any, context: raybus.ProcessorContext) -> None:
        time.sleep(0.01)  # a plain function: runs in the replica's thread pool
        ray.get(collector.add.remote(key, (message.message_id, context.replica_id)))

    with client.get_queue_sender(queue) as sender:
        sender.send_messages(_messages(40))
    with client.get_processor(
        queue, handler, max_concurrent_calls=3, prefetch_count=4, min_replicas=2
    ) as processor:
        assert processor.statistics.replicas == 2
        _wait(lambda: processor.statistics.handled == 40, 30, "40 handled")
    stats = processor.statistics
    assert (stats.handled, stats.failed, stats.replicas, stats.in_flight) == (40, 0, 0, 0)
    ids = Counter(mid for mid, _replica in ray.get(collector.items.remote(key)))
    assert ids == Counter(f"m{i}" for i in range(40))
    props = admin.get_queue_runtime_properties(queue)
    assert (props.active_message_count, props.dead_letter_message_count) == (0, 0)


async def test_every_message_handled_exactly_once_aio_with_explicit_settlement(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    collector: Any,
    key: str,
) -> None:
    queue = f"p-{uuid.uuid4().hex[:8]}"
    await aadmin.create_queue(queue)

    async def handler(message: Any, context: aio.ProcessorContext) -> None:
        await asyncio.sleep(0.01)
        await collector.add.remote(key, message.message_id)
        await context.complete_message()  # auto_complete is off

    processor = aclient.get_processor(queue, handler, max_concurrent_calls=4, auto_complete=False)
    async with processor:
        async with aclient.get_queue_sender(queue) as sender:
            await sender.send_messages(_messages(30))
        await _await(lambda: processor.statistics.handled == 30, 30, "30 handled")
    assert Counter(await collector.items.remote(key)) == Counter(f"m{i}" for i in range(30))
    props = await aadmin.get_queue_runtime_properties(queue)
    assert props.active_message_count == 0
    assert processor.statistics.failed == 0


async def test_replicas_use_the_clients_retry_policy(
    namespace: str, aadmin: aio.ServiceBusAdministrationClient
) -> None:
    """A replica's own connection takes the retry options of the client that made the
    processor (its receives ride out a partition restart as that client's would)."""
    queue = f"p-{uuid.uuid4().hex[:8]}"
    await aadmin.create_queue(queue)

    async def handler(message: Any) -> None:
        pass

    client = aio.ServiceBusClient(namespace, retry_total=7, retry_backoff_factor=0.05)
    async with client.get_processor(queue, handler) as processor:
        policy = await processor._handles[0].__ray_call__.remote(
            lambda replica: replica._conn.retry
        )
    assert policy == client._conn.retry
    assert (policy.total, policy.backoff_factor) == (7, 0.05)


# ---------------------------------------------------------------------- poison messages


def test_poison_message_is_dead_lettered_with_the_exception_after_max_delivery_count(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
) -> None:
    queue = _queue(admin, max_delivery_count=3)
    errors: list[tuple[BaseException, Any]] = []

    def handler(message: Any) -> None:  # the message alone: no context parameter
        if str(message.body) == "poison":
            raise ValueError("cannot parse the order")

    with client.get_queue_sender(queue) as sender:
        sender.send_messages([*_messages(5), ServiceBusMessage("poison", message_id="bad")])
    with client.get_processor(
        queue, handler, error_handler=lambda exc, msg: errors.append((exc, msg))
    ) as processor:
        _wait(lambda: processor.statistics.dead_lettered == 1, 30, "the poison message")
        _wait(lambda: processor.statistics.handled == 5, 10, "the good messages")
    stats = processor.statistics
    assert (stats.failed, stats.dead_lettered) == (3, 1)
    assert [type(exc) for exc, _msg in errors] == [ValueError] * 3
    assert sorted(msg.delivery_count for _exc, msg in errors) == [0, 1, 2]
    assert all(msg.message_id == "bad" for _exc, msg in errors)
    with client.get_queue_receiver(queue, sub_queue=DLQ, max_wait_time=5) as dlq:
        (dead,) = dlq.receive_messages(5)
        dlq.complete_message(dead)
    assert dead.message_id == "bad"
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.dead_letter_error_description == "ValueError: cannot parse the order"
    assert admin.get_queue_runtime_properties(queue).active_message_count == 0


# ---------------------------------------------------------------------- a killed replica


@pytest.mark.fault
async def test_killed_replicas_messages_are_handled_by_others_before_their_locks_expire(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    collector: Any,
    key: str,
) -> None:
    queue = f"p-{uuid.uuid4().hex[:8]}"
    # A long lock: the killed replica's messages must come back because the processor gives
    # them back, not because their locks ran out.
    await aadmin.create_queue(queue, lock_duration=timedelta(seconds=60))

    async def handler(message: Any, context: aio.ProcessorContext) -> None:
        await asyncio.sleep(0.8)
        await collector.add.remote(
            key, (message.message_id, context.replica_id, message.delivery_count)
        )

    processor = aclient.get_processor(
        queue, handler, max_concurrent_calls=2, prefetch_count=2, min_replicas=2
    )
    async with processor:
        async with aclient.get_queue_sender(queue) as sender:
            await sender.send_messages(_messages(12))
        await _await(lambda: processor.statistics.in_flight >= 3, 10, "handlers running")
        victim = processor._handles[0]
        pid = await victim.pid.remote()
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        await _await(lambda: processor.statistics.replicas_lost == 1, 10, "the loss noticed")
        await _await(lambda: processor.statistics.handled == 12, 30, "12 handled")
        took = time.monotonic() - killed_at
        await _await(lambda: processor.statistics.replicas == 2, 10, "a replacement")
    records = await collector.items.remote(key)
    assert Counter(mid for mid, _r, _dc in records) == Counter(f"m{i}" for i in range(12))
    assert all(replica != 0 for mid, replica, dc in records if dc > 0)
    stats = processor.statistics
    assert stats.replicas_lost == 1 and stats.replicas_started == 3
    assert stats.interrupted >= 1  # the victim's running handlers were given back
    assert sum(1 for _m, _r, dc in records if dc == 1) == stats.interrupted
    assert took < 30  # well before the 60 s locks would have expired
    props = await aadmin.get_queue_runtime_properties(queue)
    assert props.active_message_count == 0


# ---------------------------------------------------------------------- autoscaling


def test_pool_scales_up_with_the_backlog_and_down_once_drained(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    collector: Any,
    key: str,
) -> None:
    """Handlers wait at a gate until the pool has grown: on a loaded machine a replica can take
    longer to start than a free-running pool takes to drain the backlog (CI once saw two of
    three). The locks last 5 minutes, so no message waiting in a buffer expires meanwhile."""
    queue = _queue(admin, lock_duration=timedelta(minutes=5))
    gate = f"{key}:open"

    def handler(message: Any) -> None:
        deadline = time.monotonic() + 180  # bounded: a failed test leaves no handler waiting
        while not ray.get(collector.items.remote(gate)) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)
        ray.get(collector.add.remote(key, message.message_id))

    sizes: list[int] = []
    with client.get_processor(
        queue,
        handler,
        min_replicas=1,
        max_replicas=3,
        target_backlog_per_replica=5,
        scale_down_delay=1.0,
    ) as processor:
        assert processor.statistics.replicas == 1
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(_messages(45))

        def watch(done: Callable[[], bool]) -> Callable[[], bool]:
            def check() -> bool:
                sizes.append(processor.statistics.replicas)
                return done()

            return check

        # The backlog (45 waiting, 5 per replica wanted) grows the pool to max_replicas.
        _wait(watch(lambda: processor.statistics.replicas == 3), 120, "three replicas")
        assert processor.statistics.desired_replicas == 3
        assert processor.statistics.handled == 0
        ray.get(collector.add.remote(gate, True))
        _wait(watch(lambda: processor.statistics.handled == 45), 60, "45 handled")
        assert max(sizes) == 3  # never past max_replicas
        _wait(watch(lambda: processor.statistics.replicas == 1), 30, "scale down to 1")
        stats = processor.statistics
        assert stats.replicas_started == 3 and stats.replicas_lost == 0
        assert stats.desired_replicas == 1
    assert Counter(ray.get(collector.items.remote(key))) == Counter(f"m{i}" for i in range(45))


# ---------------------------------------------------------------------- sessions


async def test_session_processor_handles_each_session_in_order(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    collector: Any,
    key: str,
) -> None:
    queue = f"p-{uuid.uuid4().hex[:8]}"
    await aadmin.create_queue(queue, requires_session=True)
    sessions = ["red", "green", "blue"]
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages(
            [ServiceBusMessage(f"{s}:{i}", session_id=s) for i in range(6) for s in sessions]
        )

    async def handler(message: Any, context: aio.ProcessorContext) -> None:
        await asyncio.sleep(0.02)
        seen = int((await context.get_session_state() or b"0").decode())
        await context.set_session_state(str(seen + 1))
        await collector.add.remote(key, (context.session_id, str(message.body), seen))

    processor = aclient.get_processor(queue, handler, max_concurrent_calls=2, session=True)
    async with processor:
        await _await(lambda: processor.statistics.handled == 18, 30, "18 handled")
    records = await collector.items.remote(key)
    for s in sessions:
        mine = [(body, seen) for sid, body, seen in records if sid == s]
        assert mine == [(f"{s}:{i}", i) for i in range(6)]  # in order, each once


# ---------------------------------------------------------------------- stopping


async def test_stop_lets_running_handlers_finish_and_releases_prefetched_uncounted(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    collector: Any,
    key: str,
) -> None:
    queue = f"p-{uuid.uuid4().hex[:8]}"
    await aadmin.create_queue(queue)

    async def handler(message: Any) -> None:
        await asyncio.sleep(0.6)
        await collector.add.remote(key, message.message_id)

    processor = aclient.get_processor(queue, handler, prefetch_count=5)
    await processor.start()
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages(_messages(10))
    await _await(lambda: processor.statistics.in_flight == 1, 10, "a handler running")
    await processor.stop(timeout=10)
    stats = processor.statistics
    handled = await collector.items.remote(key)
    assert stats.handled == len(handled) >= 1 and stats.interrupted == 0
    assert stats.released >= 1
    async with aclient.get_queue_receiver(queue) as peeker:
        left = await peeker.peek_messages(20)
    assert all(m.delivery_count == 0 for m in left)  # released, not counted as deliveries
    assert sorted([*handled, *(m.message_id for m in left)]) == sorted(f"m{i}" for i in range(10))


async def test_stop_timeout_abandons_handlers_still_running(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
) -> None:
    queue = f"p-{uuid.uuid4().hex[:8]}"
    await aadmin.create_queue(queue)

    async def handler(message: Any) -> None:
        await asyncio.sleep(60)

    processor = aclient.get_processor(queue, handler)
    await processor.start()
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages(ServiceBusMessage("slow"))
    await _await(lambda: processor.statistics.in_flight == 1, 10, "the handler running")
    started = time.monotonic()
    await processor.stop(timeout=0.5)
    assert time.monotonic() - started < 5
    assert processor.statistics.interrupted == 1 and processor.statistics.handled == 0
    async with aclient.get_queue_receiver(queue) as peeker:
        (left,) = await peeker.peek_messages(5)
    assert left.delivery_count == 1  # abandoned: the cut-off delivery counts


# ---------------------------------------------------------------------- arguments


async def test_processor_on_a_missing_queue_raises_not_found(aclient: aio.ServiceBusClient) -> None:
    processor = aclient.get_processor("no-such-queue", lambda m: None)
    with pytest.raises(MessagingEntityNotFoundError):
        await processor.start()
    assert not processor.is_running


def test_session_flag_contradicting_the_queue_raises(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    queue = _queue(admin)
    with pytest.raises(InvalidArgumentError, match="requires_session"):
        client.get_processor(queue, lambda m: None, session=True).start()


def test_processor_works_a_topic_subscription(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    collector: Any,
    key: str,
) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin.create_topic(topic)
    admin.create_subscription(topic, "audit")

    def handler(message: Any) -> None:
        ray.get(collector.add.remote(key, message.message_id))

    try:
        with client.get_processor((topic, "audit"), handler) as processor:
            with client.get_topic_sender(topic) as sender:
                sender.send_messages(_messages(10))
            _wait(lambda: processor.statistics.handled == 10, 30, "10 handled")
        assert Counter(ray.get(collector.items.remote(key))) == Counter(f"m{i}" for i in range(10))
        props = admin.get_subscription_runtime_properties(topic, "audit")
        assert props.active_message_count == 0
        with pytest.raises(InvalidArgumentError, match="is a topic"):
            client.get_processor(topic, handler).start()
    finally:
        admin.delete_topic(topic)
