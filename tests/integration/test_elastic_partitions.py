"""Changing a queue's partition count while senders and receivers run (raybus extension).

Each test records what was acknowledged, received and completed, and checks the guarantees of
``raybus._actors.scaling``: nothing acknowledged is lost, nothing is delivered twice without a
lost lock (delivery count), sessions keep their order and one holder at a time, duplicate
detection spans the change, moved deferred/scheduled/dead-lettered messages keep working.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
import ray

import raybus
from raybus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, aio
from raybus._actors.namespace import namespace_actor_name
from raybus._core.slots import PartitionMap
from raybus.exceptions import InvalidArgumentError, OperationTimeoutError, ServiceBusError
from raybus.management import ServiceBusAdministrationClient


@pytest.fixture
def namespace(module_namespace: str) -> str:
    return module_namespace


def _name() -> str:
    return f"elastic-{uuid.uuid4().hex[:8]}"


async def _scale(admin: aio.ServiceBusAdministrationClient, name: str, count: int) -> None:
    props = await admin.get_queue(name)
    await admin.update_queue(props, partition_count=count)


def test_scale_up_then_down_under_load_loses_and_duplicates_nothing(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    async def main() -> None:
        name = _name()
        await aadmin.create_queue(name, partition_count=1, requires_duplicate_detection=True)
        acked: set[str] = set()
        deliveries: dict[str, list[int]] = defaultdict(list)
        completed: list[str] = []
        sending = True

        async def send(worker: int) -> None:
            async with aclient.get_queue_sender(name) as sender:
                i = 0
                while sending:
                    batch = []
                    for _ in range(10):
                        mid = f"w{worker}-{i}"
                        key = {"partition_key": f"k{i % 7}"} if i % 3 == 0 else {}
                        batch.append(ServiceBusMessage(mid, message_id=mid, **key))
                        i += 1
                    await sender.send_messages(batch)
                    acked.update(str(m.body) for m in batch)
                    await asyncio.sleep(0.005)

        async def receive() -> None:
            async with aclient.get_queue_receiver(name, max_wait_time=1) as receiver:
                idle_since = time.monotonic()
                while sending or time.monotonic() - idle_since < 3:
                    got = await receiver.receive_messages(50, max_wait_time=0.5)
                    if got:
                        idle_since = time.monotonic()
                    for msg in got:
                        deliveries[msg.message_id].append(msg.delivery_count)
                    await receiver.complete_messages(got)
                    completed.extend(m.message_id for m in got)

        tasks = [asyncio.ensure_future(send(w)) for w in range(3)]
        tasks += [asyncio.ensure_future(receive()) for _ in range(2)]
        await asyncio.sleep(1.0)
        await _scale(aadmin, name, 4)
        assert await aadmin.wait_for_partitions(name, timeout=60) == 4
        await asyncio.sleep(1.0)
        await _scale(aadmin, name, 2)
        assert await aadmin.wait_for_partitions(name, timeout=60) == 2
        await asyncio.sleep(0.5)
        sending = False
        await asyncio.gather(*tasks)

        runtime = await aadmin.get_queue_runtime_properties(name)
        assert runtime.partition_count == 2
        assert runtime.active_message_count == 0
        assert len(acked) > 300
        assert set(completed) == acked  # nothing acknowledged lost
        # Anything delivered twice was delivered again only after its lock ended.
        for mid, counts in deliveries.items():
            assert counts == sorted(set(counts)), (mid, counts)
        assert len(completed) == len(set(completed))

    asyncio.run(main())


def test_sessions_keep_order_and_one_holder_across_partition_changes(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    sessions = [f"s{i}" for i in range(12)]
    per_session = 40

    async def main() -> None:
        name = _name()
        await aadmin.create_queue(name, partition_count=2, requires_session=True)
        received: dict[str, list[int]] = defaultdict(list)
        holders: dict[str, int] = {}
        violations: list[str] = []
        done = asyncio.Event()

        async def send() -> None:
            async with aclient.get_queue_sender(name) as sender:
                for i in range(per_session):
                    await sender.send_messages(
                        [ServiceBusMessage(str(i), session_id=s) for s in sessions]
                    )
                    await asyncio.sleep(0.01)

        async def work(worker: int) -> None:
            while not done.is_set():
                receiver = aclient.get_queue_receiver(
                    name, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0.5
                )
                try:
                    await receiver.__aenter__()
                except OperationTimeoutError:
                    continue
                session = receiver.session
                assert session is not None and session.session_id is not None
                sid = session.session_id
                if sid in holders:
                    violations.append(f"{sid} held by {holders[sid]} and {worker}")
                holders[sid] = worker
                try:
                    while True:
                        got = await receiver.receive_messages(10, max_wait_time=0.2)
                        if not got:
                            break
                        for msg in got:
                            assert msg.session_id == sid
                            received[sid].append(int(str(msg)))
                            await receiver.complete_message(msg)
                finally:
                    del holders[sid]
                    await receiver.close()
                if sum(len(v) for v in received.values()) >= len(sessions) * per_session:
                    done.set()

        workers = [asyncio.ensure_future(work(w)) for w in range(3)]
        sender = asyncio.ensure_future(send())
        await asyncio.sleep(0.3)
        await _scale(aadmin, name, 4)
        await asyncio.sleep(0.5)
        await _scale(aadmin, name, 1)
        await sender
        await asyncio.wait_for(done.wait(), 60)
        await asyncio.gather(*workers)
        assert await aadmin.wait_for_partitions(name, timeout=60) == 1

        assert not violations
        for s in sessions:  # each session in order, each message once
            assert received[s] == list(range(per_session)), (s, received[s])

    asyncio.run(main())


def test_duplicate_detection_spans_a_partition_change(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, requires_duplicate_detection=True)
    ids = [f"id-{i}" for i in range(40)]
    with client.get_queue_sender(name) as sender:
        sender.send_messages([ServiceBusMessage(i, message_id=i) for i in ids])
        admin.update_queue(admin.get_queue(name), partition_count=4)
        assert admin.wait_for_partitions(name, timeout=60) == 4
        # The same sender (holding the old map) sends every id again, then new ones.
        sender.send_messages([ServiceBusMessage(i, message_id=i) for i in ids])
        sender.send_messages([ServiceBusMessage("new", message_id="id-new")])
    assert admin.get_queue_runtime_properties(name).active_message_count == 41
    admin.update_queue(admin.get_queue(name), partition_count=2)
    assert admin.wait_for_partitions(name, timeout=60) == 2
    with client.get_queue_sender(name) as sender:
        sender.send_messages([ServiceBusMessage(i, message_id=i) for i in ids[:10]])
    assert admin.get_queue_runtime_properties(name).active_message_count == 41


def test_scale_down_moves_deferred_scheduled_and_dead_lettered_messages(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, partition_count=3)
    later = datetime.now(UTC) + timedelta(hours=1)
    with client.get_queue_sender(name) as sender:
        for i in range(30):  # one by one: spread over the partitions
            sender.send_messages(ServiceBusMessage(f"m{i}"))
        scheduled = sender.schedule_messages(
            [ServiceBusMessage(f"sched{i}") for i in range(6)], later
        )
    deferred: list[int] = []
    with client.get_queue_receiver(name, max_wait_time=2) as receiver:
        got = receiver.receive_messages(30)
        while len(got) < 30:
            got += receiver.receive_messages(30 - len(got))
        for i, msg in enumerate(got):
            if i % 3 == 0:
                receiver.defer_message(msg)
                deferred.append(msg.sequence_number)
            elif i % 3 == 1:
                receiver.dead_letter_message(msg, reason="test", error_description=str(msg))
            else:
                receiver.abandon_message(msg)  # delivery_count becomes 1
    assert {s >> 48 for s in deferred} == {0, 1, 2}  # every partition holds some

    admin.update_queue(admin.get_queue(name), partition_count=1)
    assert admin.wait_for_partitions(name, timeout=60) == 1
    runtime = admin.get_queue_runtime_properties(name)
    assert (runtime.active_message_count, runtime.dead_letter_message_count) == (20, 10)
    assert runtime.scheduled_message_count == 6

    with client.get_queue_receiver(name, max_wait_time=2) as receiver:
        back = receiver.receive_deferred_messages(deferred)  # by their old numbers
        assert len(back) == 10 and all(
            m.state == raybus.ServiceBusMessageState.DEFERRED for m in back
        )
        receiver.complete_messages(back)
        rest = receiver.receive_messages(10)
        while len(rest) < 10:
            rest += receiver.receive_messages(10 - len(rest))
        assert all(m.delivery_count == 1 for m in rest)
        receiver.complete_messages(rest)
    with client.get_queue_sender(name) as sender:
        sender.cancel_scheduled_messages(scheduled)  # by their old numbers
    with client.get_queue_receiver(name, sub_queue="deadletter", max_wait_time=2) as dlq:
        dead = dlq.receive_messages(10)
        while len(dead) < 10:
            dead += dlq.receive_messages(10 - len(dead))
        assert {m.dead_letter_reason for m in dead} == {"test"}
        assert all(m.dead_letter_error_description == str(m) for m in dead)
        dlq.complete_messages(dead)
    runtime = admin.get_queue_runtime_properties(name)
    assert (runtime.active_message_count, runtime.scheduled_message_count) == (0, 0)


def test_receivers_waiting_through_a_scale_down_get_moved_and_new_messages_at_once(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    """Four receivers wait (30 s each) on an empty 2-partition queue holding only scheduled
    messages, on both partitions. A scale-down to one moves the retiring partition's into
    the other while they wait. At their time all six reach the receivers, each once, and so
    do messages sent after the change: far sooner than the receivers' own 30 s waits, which
    is how long a receive left waiting on the retired partition, or in a line nobody wakes
    at the remaining one, would take. (Measured by mutation: with the remaining partition's
    wakes cut the scheduled six still arrive, as the receivers' waits move there with the
    route and see their time, and the new messages do not.)"""

    async def main() -> None:
        name = _name()
        await aadmin.create_queue(name, partition_count=2)
        due = datetime.now(UTC) + timedelta(seconds=8)
        async with aclient.get_queue_sender(name) as sender:
            numbers = [
                (await sender.schedule_messages(ServiceBusMessage(f"sched{i}"), due))[0]
                for i in range(6)  # one by one: spread over the partitions
            ]
        assert {n >> 48 for n in numbers} == {0, 1}
        receivers = [aclient.get_queue_receiver(name) for _ in range(4)]
        got: dict[str, float] = {}  # body: when it arrived
        wanted = 6 + 5

        async def take(receiver: aio.ServiceBusReceiver) -> None:
            while len(got) < wanted:
                for msg in await receiver.receive_messages(max_wait_time=30):
                    assert str(msg) not in got, f"{msg} delivered twice"
                    got[str(msg)] = time.monotonic()
                    await receiver.complete_message(msg)

        tasks = [asyncio.ensure_future(take(r)) for r in receivers]
        try:
            await asyncio.sleep(1.0)  # all four waiting
            await _scale(aadmin, name, 1)
            assert await aadmin.wait_for_partitions(name, timeout=60) == 1
            runtime = await aadmin.get_queue_runtime_properties(name)
            assert runtime.scheduled_message_count == 6
            assert datetime.now(UTC) < due - timedelta(seconds=1)  # moved while scheduled
            wait = (due - datetime.now(UTC)).total_seconds()
            started = time.monotonic()
            while len(got) < 6 and time.monotonic() - started < wait + 10:
                await asyncio.sleep(0.05)
            assert sorted(got) == [f"sched{i}" for i in range(6)]
            assert max(got.values()) - started < wait + 10  # not the 30 s waits
            sent = time.monotonic()
            async with aclient.get_queue_sender(name) as sender:
                for i in range(5):
                    await sender.send_messages(ServiceBusMessage(f"new{i}"))
            while len(got) < wanted and time.monotonic() - sent < 10:
                await asyncio.sleep(0.05)
            assert len(got) == wanted
            assert max(got.values()) - sent < 10
        finally:
            for t in tasks:
                t.cancel()
            for r in receivers:
                await r.close()
            await asyncio.gather(*tasks, return_exceptions=True)
        runtime = await aadmin.get_queue_runtime_properties(name)
        assert (runtime.active_message_count, runtime.scheduled_message_count) == (0, 0)

    asyncio.run(main())


def test_a_held_session_stays_pinned_until_its_receiver_closes(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, partition_count=2, requires_session=True)
    with client.get_queue_sender(name) as sender:
        sender.send_messages([ServiceBusMessage("a", session_id=f"s{i}") for i in range(20)])
    runtime = admin.get_queue_runtime_properties(name)
    version = runtime.partition_map_version
    # Hold a session that partition 1 serves, then remove partition 1.
    initial = PartitionMap.initial(2)
    sid = next(f"s{i}" for i in range(20) if initial.owner(f"s{i}") == 1)
    receiver = client.get_queue_receiver(name, session_id=sid, max_wait_time=1)
    with receiver:
        held = receiver.receive_messages(1)
        assert [str(m) for m in held] == ["a"]
        admin.update_queue(admin.get_queue(name), partition_count=1)
        time.sleep(2.0)
        runtime = admin.get_queue_runtime_properties(name)
        assert runtime.partition_count == 1 and runtime.partition_map_version > version
        # Still there: the change waits for the session.
        assert admin.wait_for_partitions(name, timeout=0.5) == 1
        with client.get_queue_sender(name) as sender:
            sender.send_messages(ServiceBusMessage("b", session_id=sid))
        more = receiver.receive_messages(1, max_wait_time=2)
        assert [str(m) for m in more] == ["b"]  # future messages go to the holder
        receiver.complete_message(held[0])
        receiver.complete_message(more[0])
    assert admin.wait_for_partitions(name, timeout=60) == 1
    with client.get_queue_receiver(name, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1):
        pass
    assert admin.get_queue_runtime_properties(name).active_message_count == 19


def test_autoscaling_grows_with_the_backlog_and_shrinks_when_drained(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(
        name, partition_count=1, min_partitions=1, max_partitions=3, target_backlog_per_partition=50
    )
    with client.get_queue_sender(name) as sender:
        for _ in range(4):
            sender.send_messages([ServiceBusMessage("x") for _ in range(50)])
    deadline = time.monotonic() + 30
    while admin.get_queue_runtime_properties(name).partition_count < 3:
        assert time.monotonic() < deadline, "did not grow"
        time.sleep(0.5)
    assert admin.get_queue(name).partition_count == 3
    with client.get_queue_receiver(name, max_wait_time=1) as receiver:
        drained = 0
        while drained < 200:
            got = receiver.receive_messages(100)
            receiver.complete_messages(got)
            drained += len(got)
    deadline = time.monotonic() + 40
    while admin.get_queue_runtime_properties(name).partition_count > 1:
        assert time.monotonic() < deadline, "did not shrink"
        time.sleep(0.5)
    assert admin.wait_for_partitions(name, timeout=30) == 1


@pytest.mark.parametrize(
    "option",
    [{"partition_count": 0}, {"partition_count": 65}, {"min_partitions": 3, "max_partitions": 2}],
)
def test_invalid_partition_settings_are_refused_and_change_nothing(
    admin: ServiceBusAdministrationClient, option: dict[str, int]
) -> None:
    name = _name()
    admin.create_queue(name, partition_count=2)
    with pytest.raises(InvalidArgumentError):
        admin.update_queue(admin.get_queue(name), **option)
    assert admin.get_queue(name).partition_count == 2
    assert admin.get_queue_runtime_properties(name).partition_count == 2


def _wait_converged(admin: ServiceBusAdministrationClient, name: str, count: int) -> None:
    """Wait for the change, riding out the namespace actor's restart."""
    deadline = time.monotonic() + 90
    while True:
        try:
            if admin.wait_for_partitions(name, timeout=5) == count:
                runtime = admin.get_queue_runtime_properties(name)
                if runtime.partition_count == count:
                    return
        except ServiceBusError:
            pass  # restarting
        assert time.monotonic() < deadline, "the change did not finish"
        time.sleep(0.2)


@pytest.mark.fault
def test_a_change_resumes_after_the_namespace_actor_restarts(
    namespace: str, admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, partition_count=1, requires_duplicate_detection=True)
    with client.get_queue_sender(name) as sender:
        for i in range(20):
            sender.send_messages(
                [ServiceBusMessage(f"{i}-{j}", message_id=f"{i}-{j}") for j in range(10)]
            )
    registry = ray.get_actor(namespace_actor_name(namespace), namespace="raybus")
    for count in (3, 1):
        admin.update_queue(admin.get_queue(name), partition_count=count)
        ray.kill(registry, no_restart=False)  # mid-change: it restarts and resumes
        _wait_converged(admin, name, count)
    runtime = admin.get_queue_runtime_properties(name)
    assert runtime.active_message_count == 200
    seen: list[str] = []
    with client.get_queue_receiver(name, max_wait_time=1) as receiver:
        while got := receiver.receive_messages(100):
            seen += [str(m) for m in got]
            receiver.complete_messages(got)
    assert sorted(seen) == sorted(f"{i}-{j}" for i in range(20) for j in range(10))
