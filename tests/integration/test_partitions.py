"""Queues of several partitions against a real local Ray cluster: how messages are spread and
routed (partition key, session id, message id under duplicate detection), fair receiving that
starves no partition and waits without polling, peek across partitions, runtime counts,
deferral and scheduling across partitions, and validation (sync and asyncio clients).

Most tests share one 4-partition queue (``partitioned_queue``): each starts from an empty
queue and the fixture drains whatever a test left, so a partition actor (a Ray worker process)
is started once per module rather than once per test. Keys that land in a given partition are
found with the queue's initial partition map.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import raybus
from raybus import (
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
    _rpc,
    aio,
)
from raybus._connection import ROUTE_TTL_S
from raybus._core.slots import PartitionMap
from raybus.exceptions import (
    InvalidArgumentError,
    MessageNotFoundError,
    MessagingEntityNotFoundError,
)
from raybus.management import ServiceBusAdministrationClient

PARTITIONS = 4
PMAP = PartitionMap.initial(PARTITIONS)
RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE
DLQ = ServiceBusSubQueue.DEAD_LETTER


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    return module_namespace


def _name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _key_for(pid: int, pmap: PartitionMap = PMAP, prefix: str = "key") -> str:
    """A partition key (or session id, or message id) that ``pmap`` places in ``pid``."""
    for i in range(100_000):
        key = f"{prefix}-{i}"
        if pmap.owner(key) == pid:
            return key
    raise AssertionError(f"no key for partition {pid}")


KEYS = [_key_for(pid) for pid in range(PARTITIONS)]


@pytest.fixture(scope="module")
def shared_partitioned_queue(module_namespace: str) -> str:
    name = _name("pq")
    ServiceBusAdministrationClient(module_namespace).create_queue(
        name, partition_count=PARTITIONS, lock_duration=timedelta(seconds=30)
    )
    return name


def _counts(admin: ServiceBusAdministrationClient, queue: str) -> tuple[int, int, int]:
    r = admin.get_queue_runtime_properties(queue)
    return r.active_message_count, r.dead_letter_message_count, r.scheduled_message_count


def _drain(client: raybus.ServiceBusClient, queue: str) -> None:
    """Remove everything: cancel scheduled, take deferred, receive-and-delete the rest."""
    with client.get_queue_receiver(queue) as peeker:
        peeked = peeker.peek_messages(1000)
    scheduled = [m.sequence_number for m in peeked if m.state == ServiceBusMessageState.SCHEDULED]
    deferred = [m.sequence_number for m in peeked if m.state == ServiceBusMessageState.DEFERRED]
    if scheduled:
        with client.get_queue_sender(queue) as sender:
            sender.cancel_scheduled_messages(scheduled)
    with client.get_queue_receiver(queue, receive_mode=RAD, max_wait_time=0.3) as receiver:
        if deferred:
            receiver.receive_deferred_messages(deferred)
        while receiver.receive_messages(100):
            pass
    with client.get_queue_receiver(
        queue, sub_queue=DLQ, receive_mode=RAD, max_wait_time=0.3
    ) as receiver:
        while receiver.receive_messages(100):
            pass


@pytest.fixture
def partitioned_queue(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    shared_partitioned_queue: str,
) -> Iterator[str]:
    """The module's 4-partition queue (lock 30 s), empty at the start of the test."""
    q = shared_partitioned_queue
    assert _counts(admin, q) == (0, 0, 0), "an earlier test left messages behind"
    yield q
    _drain(client, q)


def _receive_all(
    receiver: raybus.ServiceBusReceiver, n: int, batch: int = 10, max_wait_time: float = 5
) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    while len(got) < n:
        more = receiver.receive_messages(min(batch, n - len(got)), max_wait_time=max_wait_time)
        assert more, f"only {len(got)} of {n} messages arrived"
        got.extend(more)
    return got


# ------------------------------------------------------------------------------ creation


def test_partitioned_queue_reports_its_partition_count(
    admin: ServiceBusAdministrationClient, shared_partitioned_queue: str
) -> None:
    assert admin.get_queue(shared_partitioned_queue).partition_count == PARTITIONS


@pytest.mark.parametrize("count", [0, 65])
def test_partition_count_outside_1_to_64_is_rejected_and_nothing_is_created(
    admin: ServiceBusAdministrationClient, count: int
) -> None:
    name = _name("bad")
    with pytest.raises(InvalidArgumentError):
        admin.create_queue(name, partition_count=count)
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_queue(name)


# ------------------------------------------------------------------------------ spreading


def test_unkeyed_messages_spread_over_all_partitions_and_competing_receivers_get_each_once(
    client: raybus.ServiceBusClient, partitioned_queue: str
) -> None:
    q = partitioned_queue
    sent = [f"m{i}" for i in range(80)]
    with client.get_queue_sender(q) as sender:
        for i in range(0, len(sent), 10):  # eight sends of ten
            sender.send_messages([ServiceBusMessage(b) for b in sent[i : i + 10]])

    received: list[ServiceBusReceivedMessage] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with client.get_queue_receiver(q, max_wait_time=1) as receiver:
                while True:
                    batch = receiver.receive_messages(7)
                    if not batch:
                        return
                    for m in batch:
                        receiver.complete_message(m)
                    with lock:
                        received.extend(batch)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    counts = Counter(m.body for m in received)
    assert set(counts) == set(sent)
    assert all(n == 1 for n in counts.values()), "a message was received twice"
    assert {m.partition_id for m in received} == set(range(PARTITIONS))
    for m in received:
        assert m.sequence_number >> 48 == m.partition_id
        assert m.delivery_count == 0


async def test_aio_competing_receivers_drain_a_partitioned_queue_exactly_once(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    partitioned_queue: str,
) -> None:
    q = partitioned_queue
    sent = [f"a{i}" for i in range(60)]
    async with aclient.get_queue_sender(q) as sender:
        await asyncio.gather(
            *(
                sender.send_messages([ServiceBusMessage(b) for b in sent[i : i + 5]])
                for i in range(0, len(sent), 5)
            )
        )
    runtime = await aadmin.get_queue_runtime_properties(q)
    assert runtime.active_message_count == len(sent)

    async def worker() -> list[ServiceBusReceivedMessage]:
        mine: list[ServiceBusReceivedMessage] = []
        async with aclient.get_queue_receiver(q, max_wait_time=1) as receiver:
            while batch := await receiver.receive_messages(4):
                for m in batch:
                    await receiver.complete_message(m)
                mine.extend(batch)
        return mine

    results = await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(4))), 60)
    received = [m for mine in results for m in mine]
    counts = Counter(m.body for m in received)
    assert set(counts) == set(sent)
    assert all(n == 1 for n in counts.values()), "a message was received twice"
    assert len({m.partition_id for m in received}) > 1


# ------------------------------------------------------------------------------ fairness / waiting


def test_messages_only_in_the_last_partition_are_received_promptly(
    client: raybus.ServiceBusClient, partitioned_queue: str
) -> None:
    q = partitioned_queue
    last = PARTITIONS - 1
    bodies = [f"last{i}" for i in range(6)]
    with client.get_queue_sender(q) as sender:
        sender.send_messages([ServiceBusMessage(b, partition_key=KEYS[last]) for b in bodies])
    with client.get_queue_receiver(q, max_wait_time=5) as receiver:
        got: list[ServiceBusReceivedMessage] = []
        # One message per call: most calls first ask an empty partition.
        for _ in bodies:
            started = time.monotonic()
            (msg,) = receiver.receive_messages(1)
            assert time.monotonic() - started < 5
            got.append(msg)
            receiver.complete_message(msg)
        assert [m.body for m in got] == bodies
        assert {m.partition_id for m in got} == {last}


async def test_aio_receive_on_an_empty_partitioned_queue_waits_and_wakes_on_a_send(
    aclient: aio.ServiceBusClient, partitioned_queue: str
) -> None:
    q = partitioned_queue
    async with aclient.get_queue_receiver(q) as receiver:
        started = time.monotonic()
        assert await receiver.receive_messages(5, max_wait_time=1) == []
        elapsed = time.monotonic() - started
        assert 0.9 <= elapsed < 5

        async def send_later() -> float:
            await asyncio.sleep(0.5)
            async with aclient.get_queue_sender(q) as sender:
                await sender.send_messages(
                    ServiceBusMessage("wake", partition_key=KEYS[PARTITIONS - 1])
                )
            return time.monotonic()

        sending = asyncio.create_task(send_later())
        started = time.monotonic()
        got = await receiver.receive_messages(5, max_wait_time=20)
        done = time.monotonic()
        sent_at = await sending
        assert [m.body for m in got] == ["wake"]
        assert got[0].partition_id == PARTITIONS - 1
        assert done - sent_at < 5
        assert done - started < 10, "the waiting receive was not woken by the send"
        await receiver.complete_message(got[0])


async def test_aio_idle_receives_make_no_partition_calls_and_a_later_send_still_wakes_one(
    aclient: aio.ServiceBusClient, partitioned_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waits a receive leaves at the partitions stay out for the next receives, across
    the checks of the route (every ROUTE_TTL_S): short receives
    on the idle queue make no partition call; a message sent after them is received at
    once, from the partition whose wait answered."""
    q = partitioned_queue
    calls: Counter[str] = Counter()
    call = _rpc.call

    async def counting(entity: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        calls[str(getattr(method, "_method_name", method))] += 1
        return await call(entity, method, *args, **kwargs)

    async with aclient.get_queue_receiver(q) as receiver:
        # The route first: a receive leaves its waits only if its time has not run out by the
        # time it has asked every partition (0.2 s had not always covered the route too).
        assert await receiver.peek_messages(1) == []
        assert await receiver.receive_messages(5, max_wait_time=1) == []
        waits = dict(receiver._standing_waits._waits)
        assert sorted(waits) == list(range(PARTITIONS))
        monkeypatch.setattr(_rpc, "call", counting)
        started = time.monotonic()
        while time.monotonic() - started < 2.5 * ROUTE_TTL_S:
            assert await receiver.receive_messages(5, max_wait_time=0.1) == []
        assert calls["receive"] == 0, calls
        assert receiver._standing_waits._waits == waits  # the same calls, still out
        async with aclient.get_queue_sender(q) as sender:
            await sender.send_messages(ServiceBusMessage("wake", partition_key=KEYS[2]))
        got = await receiver.receive_messages(5, max_wait_time=5)
        assert [m.body for m in got] == ["wake"]
        assert calls["receive"] == 1, calls  # only at the partition whose wait answered
        await receiver.complete_message(got[0])


async def test_aio_receive_waiting_on_a_partitioned_queue_raises_not_found_when_it_is_deleted(
    admin: ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    """A receive waiting on every partition of a queue that is then deleted raises
    ``MessagingEntityNotFoundError``, as on a queue of one partition, and promptly: it does
    not wait on (calling the dead partitions again and again) until ``max_wait_time`` and
    then return []."""
    q = _name("pq-deleted")
    admin.create_queue(q, partition_count=2)
    async with aclient.get_queue_receiver(q, max_wait_time=15) as receiver:
        assert await receiver.receive_messages(1, max_wait_time=0.1) == []  # route resolved
        receiving = asyncio.ensure_future(receiver.receive_messages(1))
        await asyncio.sleep(0.5)  # waiting on both partitions now
        await asyncio.to_thread(admin.delete_queue, q)
        deleted_at = time.monotonic()
        with pytest.raises(MessagingEntityNotFoundError):
            await receiving
        assert time.monotonic() - deleted_at < 5


def _one_per_partition(client: raybus.ServiceBusClient, q: str, per: int = 2) -> list[str]:
    bodies = []
    with client.get_queue_sender(q) as sender:
        for pid in range(PARTITIONS):
            batch = [f"p{pid}-{i}" for i in range(per)]
            sender.send_messages([ServiceBusMessage(b, partition_key=KEYS[pid]) for b in batch])
            bodies += batch
    return bodies


def test_a_receive_on_a_partitioned_queue_locks_no_more_than_it_returns(
    client: raybus.ServiceBusClient, partitioned_queue: str
) -> None:
    q = partitioned_queue
    bodies = _one_per_partition(client, q)
    with (
        client.get_queue_receiver(q, max_wait_time=5) as first,
        client.get_queue_receiver(q, max_wait_time=5) as second,
    ):
        taken = first.receive_messages(3)
        assert 1 <= len(taken) <= 3
        # Everything the first receive did not return is available to the second at once.
        rest = _receive_all(second, len(bodies) - len(taken))
        assert sorted(str(m.body) for m in taken + rest) == sorted(bodies)
        assert second.receive_messages(max_wait_time=0.3) == []
        first.complete_messages(taken)
        second.complete_messages(rest)


def test_closing_a_prefetching_receiver_releases_what_it_buffered_from_every_partition(
    client: raybus.ServiceBusClient, partitioned_queue: str
) -> None:
    q = partitioned_queue
    bodies = _one_per_partition(client, q)
    with client.get_queue_receiver(q, max_wait_time=5, prefetch_count=20) as prefetching:
        (one,) = prefetching.receive_messages(1)
        prefetching.complete_message(one)
    started = time.monotonic()
    with client.get_queue_receiver(q, max_wait_time=5) as receiver:
        rest = _receive_all(receiver, len(bodies) - 1)
        assert time.monotonic() - started < 5  # released at once, not after the 30 s lock
        assert sorted(str(m.body) for m in [one, *rest]) == sorted(bodies)
        assert {m.delivery_count for m in rest} == {0}
        assert {m.partition_id for m in [one, *rest]} == set(range(PARTITIONS))
        receiver.complete_messages(rest)


# ------------------------------------------------------------------------------ routing


def test_messages_of_one_partition_key_stay_in_one_partition_in_order(
    client: raybus.ServiceBusClient, partitioned_queue: str
) -> None:
    q = partitioned_queue
    key_a, key_b = KEYS[0], KEYS[2]
    expected: dict[str, list[str]] = {key_a: [], key_b: []}
    with client.get_queue_sender(q) as sender:
        for round_ in range(4):
            messages = []
            for i in range(3):
                for key in (key_a, key_b):
                    body = f"{key}/{round_ * 3 + i}"
                    expected[key].append(body)
                    messages.append(ServiceBusMessage(body, partition_key=key))
            messages.append(ServiceBusMessage(f"free/{round_}"))
            sender.send_messages(messages)
    with client.get_queue_receiver(q, max_wait_time=5) as receiver:
        got = _receive_all(receiver, 28, batch=5)
        for m in got:
            receiver.complete_message(m)
    for key in (key_a, key_b):
        mine = [m for m in got if m.partition_key == key]
        assert [m.body for m in mine] == expected[key]
        assert {m.partition_id for m in mine} == {PMAP.owner(key)}
    assert sorted(str(m.body) for m in got if m.partition_key is None) == [
        f"free/{i}" for i in range(4)
    ]


def test_duplicate_detection_drops_repeated_message_ids_on_a_partitioned_queue(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name("dedup")
    admin.create_queue(name, partition_count=3, requires_duplicate_detection=True)
    pmap = PartitionMap.initial(3)
    ids = [f"id-{i}" for i in range(12)]
    with client.get_queue_sender(name) as sender:
        sender.send_messages([ServiceBusMessage(f"first {i}", message_id=i) for i in ids])
        sender.send_messages([ServiceBusMessage(f"again {i}", message_id=i) for i in ids])
        sender.send_messages(ServiceBusMessage("third", message_id=ids[5]))
        # A repeat inside one list, and one under a partition key.
        sender.send_messages(
            [ServiceBusMessage("x", message_id="twin"), ServiceBusMessage("y", message_id="twin")]
        )
        for body in ("keyed", "keyed again"):
            sender.send_messages(ServiceBusMessage(body, message_id="kid", partition_key="pk"))
        # The id with other keys: other messages (the key is MessageId + PartitionKey),
        # wherever the keys land; each repeated is dropped.
        keys = [f"pk-{i}" for i in range(8)]
        for _ in range(2):
            sender.send_messages(
                [ServiceBusMessage(k, message_id="kid", partition_key=k) for k in keys]
            )
    assert len({pmap.owner(k) for k in keys}) > 1
    total = len(ids) + 2 + len(keys)
    assert _counts(admin, name) == (total, 0, 0)
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        got = _receive_all(receiver, total)
        receiver.complete_messages(got)
        assert receiver.receive_messages(max_wait_time=0.5) == []
    bodies = {(m.message_id, m.partition_key): m.body for m in got}
    assert len(bodies) == len(got)
    assert bodies == {
        **{(i, None): f"first {i}" for i in ids},
        ("twin", None): "x",
        ("kid", "pk"): "keyed",
        **{("kid", k): k for k in keys},
    }
    for m in got:
        key = m.partition_key or m.message_id
        assert key is not None and m.partition_id == pmap.owner(key)
    assert len({m.partition_id for m in got}) > 1


def test_partition_key_differing_from_session_id_is_rejected_and_nothing_is_stored(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    partitioned_queue: str,
) -> None:
    q = partitioned_queue
    with client.get_queue_sender(q) as sender:
        with pytest.raises(InvalidArgumentError):
            sender.send_messages(ServiceBusMessage("bad", session_id="s", partition_key="other"))
        # Equal keys are fine.
        sender.send_messages(ServiceBusMessage("fine", session_id=KEYS[1], partition_key=KEYS[1]))
    assert _counts(admin, q) == (1, 0, 0)
    with client.get_queue_receiver(q, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        assert msg.body == "fine"
        assert msg.partition_id == 1
        receiver.complete_message(msg)


def test_a_list_with_one_bad_message_stores_nothing_even_when_it_spans_partitions(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    partitioned_queue: str,
) -> None:
    q = partitioned_queue
    good = [ServiceBusMessage(f"good {pid}", partition_key=KEYS[pid]) for pid in (0, 2)]
    bad = ServiceBusMessage("bad", session_id=KEYS[3], partition_key="mismatch")
    with client.get_queue_sender(q) as sender, pytest.raises(InvalidArgumentError):
        sender.send_messages([*good, bad])
    # All-or-nothing: the good messages (routed to other partitions) must not be stored.
    assert _counts(admin, q) == (0, 0, 0)


# ------------------------------------------------------------------------------ peek


def test_peek_covers_all_partitions_and_pages_forward_without_repeats(
    client: raybus.ServiceBusClient, partitioned_queue: str
) -> None:
    q = partitioned_queue
    with client.get_queue_sender(q) as sender:
        for pid in (3, 1, 0, 2):  # partitions filled in a scrambled order
            sender.send_messages(
                [ServiceBusMessage(f"p{pid}-{i}", partition_key=KEYS[pid]) for i in range(3)]
            )
    with client.get_queue_receiver(q) as receiver:
        pages = [receiver.peek_messages(5) for _ in range(4)]
        assert [len(p) for p in pages] == [5, 5, 2, 0]
        peeked = [m for page in pages for m in page]
        seqs = [m.sequence_number for m in peeked]
        assert len(set(seqs)) == 12, "a message was peeked twice"
        assert {m.partition_id for m in peeked} == set(range(PARTITIONS))
        times = [m.enqueued_time_utc for m in peeked]
        assert times == sorted(times)  # oldest first across partitions
        for pid in range(PARTITIONS):
            assert [m.body for m in peeked if m.partition_id == pid] == [
                f"p{pid}-{i}" for i in range(3)
            ]
        # Peeking from a sequence number reads that message's partition from there on.
        start = next(m for m in peeked if m.body == "p2-1")
        from_start = receiver.peek_messages(10, sequence_number=start.sequence_number)
        assert [m.body for m in from_start] == ["p2-1", "p2-2"]
        # Peeking locked nothing: everything can still be received.
        got = _receive_all(receiver, 12)
        assert sorted(m.sequence_number for m in got) == sorted(seqs)
        receiver.complete_messages(got)


# ------------------------------------------------------------------------------ counts


async def test_aio_runtime_counts_sum_over_all_partitions(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    aeventually: Callable[..., Awaitable[None]],
    partitioned_queue: str,
) -> None:
    q = partitioned_queue
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    async with aclient.get_queue_sender(q) as sender:
        for pid in range(PARTITIONS):
            await sender.send_messages(
                [ServiceBusMessage(f"p{pid}-{i}", partition_key=KEYS[pid]) for i in range(2)]
            )
        scheduled = await sender.schedule_messages(
            [ServiceBusMessage(f"later {pid}", partition_key=KEYS[pid]) for pid in range(3)],
            later,
        )
    assert sorted(s >> 48 for s in scheduled) == [0, 1, 2]

    async def counts_are(active: int, dead: int, sched: int) -> None:
        r = await aadmin.get_queue_runtime_properties(q)
        got = (r.active_message_count, r.dead_letter_message_count, r.scheduled_message_count)
        assert got == (active, dead, sched)

    await counts_are(8, 0, 3)
    async with aclient.get_queue_receiver(q, max_wait_time=5) as receiver:
        got: list[ServiceBusReceivedMessage] = []
        while len(got) < 8:
            batch = await receiver.receive_messages(8)
            assert batch
            got.extend(batch)
        for m in got:
            if m.partition_id in (1, 3):
                await receiver.dead_letter_message(m, reason="test")
            else:
                await receiver.complete_message(m)
    await aeventually(lambda: counts_are(0, 4, 3))
    async with aclient.get_queue_sender(q) as sender:
        await sender.cancel_scheduled_messages(scheduled)
    await counts_are(0, 4, 0)


# ------------------------------------------------------------------------------ deferral


def test_deferred_messages_of_different_partitions_are_received_together(
    client: raybus.ServiceBusClient, partitioned_queue: str
) -> None:
    q = partitioned_queue
    with client.get_queue_sender(q) as sender:
        for pid in range(PARTITIONS):
            sender.send_messages(ServiceBusMessage(f"d{pid}", partition_key=KEYS[pid]))
    with client.get_queue_receiver(q, max_wait_time=5) as receiver:
        got = _receive_all(receiver, PARTITIONS)
        for m in got:
            receiver.defer_message(m)
        seqs = sorted(m.sequence_number for m in got)
        assert sorted(s >> 48 for s in seqs) == list(range(PARTITIONS))
        assert receiver.receive_messages(max_wait_time=0.3) == []

        # All or none: an unknown number (in an existing partition) fails the whole call ...
        unknown = (2 << 48) + 999_999
        with pytest.raises(MessageNotFoundError) as info:
            receiver.receive_deferred_messages([*seqs, unknown])
        assert unknown in info.value.sequence_numbers
        # ... and leaves the found ones deferred.
        deferred = receiver.receive_deferred_messages(seqs)
        assert sorted(m.sequence_number for m in deferred) == seqs
        assert {m.state for m in deferred} == {ServiceBusMessageState.DEFERRED}
        assert sorted(str(m.body) for m in deferred) == [f"d{pid}" for pid in range(PARTITIONS)]
        receiver.complete_messages(deferred)
        with pytest.raises(MessageNotFoundError):
            receiver.receive_deferred_messages(seqs[:1])


# ------------------------------------------------------------------------------ scheduling


def test_scheduled_messages_of_several_partitions_can_be_cancelled(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    partitioned_queue: str,
) -> None:
    q = partitioned_queue
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    with client.get_queue_sender(q) as sender:
        seqs = sender.schedule_messages(
            [ServiceBusMessage(f"later {pid}", partition_key=KEYS[pid]) for pid in range(4)],
            later,
        )
        assert sorted(s >> 48 for s in seqs) == list(range(PARTITIONS))
        assert _counts(admin, q) == (0, 0, 4)
        sender.cancel_scheduled_messages(seqs)
        assert _counts(admin, q) == (0, 0, 0)
        with client.get_queue_receiver(q) as peeker:
            assert peeker.peek_messages(10) == []
        with pytest.raises(MessageNotFoundError):
            sender.cancel_scheduled_messages(seqs[:1])  # already cancelled
        # A message scheduled shortly into a later partition arrives on time.
        soon = datetime.now(timezone.utc) + timedelta(seconds=1)
        (kept,) = sender.schedule_messages(ServiceBusMessage("soon", partition_key=KEYS[3]), soon)
        assert kept >> 48 == 3
    with client.get_queue_receiver(q, max_wait_time=10) as receiver:
        (msg,) = receiver.receive_messages()
        assert msg.body == "soon"
        assert msg.partition_id == 3
        receiver.complete_message(msg)
        assert receiver.receive_messages(max_wait_time=0.3) == []


def test_cancelling_scheduled_messages_across_partitions_is_all_or_none(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    partitioned_queue: str,
) -> None:
    q = partitioned_queue
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    with client.get_queue_sender(q) as sender:
        seqs = sender.schedule_messages(
            [ServiceBusMessage(f"later {pid}", partition_key=KEYS[pid]) for pid in (0, 1)],
            later,
        )
        unknown = (2 << 48) + 999_999  # partition 2 exists, the message does not
        with pytest.raises(MessageNotFoundError) as info:
            sender.cancel_scheduled_messages([*seqs, unknown])
        assert unknown in info.value.sequence_numbers
    # Nothing was cancelled: both messages are still scheduled.
    assert _counts(admin, q) == (0, 0, 2)
