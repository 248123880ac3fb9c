"""Calls that carry more than Ray passes inline (100 KiB): the messages cross in pieces
(raybus._core.wire) and arrive whole and in order, on every path that sends or receives many."""

from __future__ import annotations

from typing import Any

import pytest
import ray
import settlement_support

import raybus
from raybus import ServiceBusMessage, _rpc, aio
from raybus._core.record import MessageRecord
from raybus._core.wire import send_args
from raybus.exceptions import MessageSizeExceededError, MessagingEntityNotFoundError
from raybus.management import ServiceBusAdministrationClient

# One namespace for the module, a fresh queue per test from the pool (see conftest).
namespace = settlement_support.namespace
queue = settlement_support.queue

N = 300  # messages of 1 KiB: a call of about 350 KiB, several pieces


def bodies(tag: str) -> list[bytes]:
    return [f"{tag}-{i:04d}-".encode().ljust(1024, b"x") for i in range(N)]


def drain(receiver: raybus.ServiceBusReceiver, n: int) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < n:
        batch = receiver.receive_messages(max_message_count=n - len(got), max_wait_time=5)
        assert batch, f"only {len(got)} of {n} arrived"
        receiver.complete_messages(batch)
        got.extend(m.body for m in batch)
    return got


def test_sync_send_and_receive_of_300_kib_calls(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    sent = bodies("a")
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(b) for b in sent])
    with client.get_queue_receiver(queue, prefetch_count=N) as receiver:
        assert drain(receiver, N) == sent
        # The first receive learned the rows' size: the next asks for its result in pieces.
        assert receiver._aio._receive_args(N, None)[-1] > 1
        sender2 = client.get_queue_sender(queue)
        sender2.send_messages([ServiceBusMessage(b) for b in bodies("b")])
        assert drain(receiver, N) == bodies("b")
        sender2.close()


async def test_aio_partitioned_queue_and_sessions_in_pieces(
    aclient: aio.ServiceBusClient, aadmin: aio.ServiceBusAdministrationClient
) -> None:
    await aadmin.create_queue("parts", partition_count=2)
    await aadmin.create_queue("sess", requires_session=True)
    async with aclient.get_queue_sender("parts") as sender:
        await sender.send_messages([ServiceBusMessage(b, partition_key="k") for b in bodies("p")])
    async with aclient.get_queue_sender("sess") as sender:
        await sender.send_messages([ServiceBusMessage(b, session_id="s1") for b in bodies("s")])
    for name, kwargs, tag in (("parts", {}, "p"), ("sess", {"session_id": "s1"}, "s")):
        async with aclient.get_queue_receiver(name, prefetch_count=N, **kwargs) as receiver:
            got: list[bytes] = []
            while len(got) < N:
                batch = await receiver.receive_messages(N - len(got), max_wait_time=5)
                assert batch, f"{name}: only {len(got)} of {N} arrived"
                await receiver.complete_messages(batch)
                got.extend(m.body for m in batch)
            assert got == bodies(tag), name


def test_topic_publish_of_a_large_list_reaches_every_subscription(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    admin.create_topic("t")
    for s in ("s1", "s2"):
        admin.create_subscription("t", s)
    with client.get_topic_sender("t") as sender:
        sender.send_messages([ServiceBusMessage(b) for b in bodies("t")])
    for s in ("s1", "s2"):
        with client.get_subscription_receiver("t", s, prefetch_count=N) as receiver:
            assert drain(receiver, N) == bodies("t")


def test_a_large_list_that_breaks_a_limit_is_refused_whole(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    """The client refuses a large list holding one oversize message before any call: nothing
    is stored (the partition's own check of a list in pieces is the next test)."""
    admin.create_queue("small", max_message_size_in_kilobytes=1024)
    messages = [ServiceBusMessage(b) for b in bodies("x")]
    messages[-1] = ServiceBusMessage(b"y" * (1024 * 1024 + 1))
    with (
        client.get_queue_sender("small") as sender,
        pytest.raises(MessageSizeExceededError),
    ):
        sender.send_messages(messages)
    assert admin.get_queue_runtime_properties("small").total_message_count == 0


def test_the_partition_refuses_a_list_in_pieces_whole_and_a_malformed_call(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, queue: str
) -> None:
    """Straight to the partition actor: one oversize record in the last piece refuses the
    whole group (the groups beside it are stored); a layout that does not match the rows it
    carries raises and stores nothing."""
    partition = ray.get(client._aio._conn.registry.route.remote(queue)).partitions[0]
    limit = admin.get_queue(queue).max_message_size_in_kilobytes * 1024
    # 120 of 1 KiB and one just over the limit (256 KiB): still few enough bytes for pieces.
    big = [MessageRecord(body=b, size=len(b)) for b in bodies("p")[:120]]
    big[-1] = MessageRecord(body=b"y", size=limit + 1)  # as a sender that skipped the check
    small = [MessageRecord(body=b"ok", size=2)]
    layout, *pieces = send_args([big, small])
    assert len(pieces) > 1
    refused, stored = ray.get(partition.send_groups.remote(layout, *pieces))
    assert isinstance(refused, MessageSizeExceededError)
    assert isinstance(stored, list) and len(stored) == 1
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(partition.send_groups.remote([len(big) + 5], *pieces))
    assert isinstance(info.value.cause, ValueError)
    assert admin.get_queue_runtime_properties(queue).total_message_count == 1


def test_a_receive_in_pieces_of_a_deleted_queue_raises_not_found(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, queue: str
) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(b) for b in bodies("d")])
    with client.get_queue_receiver(queue, prefetch_count=N) as receiver:
        assert len(drain(receiver, N)) == N
        assert receiver._aio._receive_args(N, None)[-1] > 1  # the next call asks for pieces
        admin.delete_queue(queue)
        with pytest.raises(MessagingEntityNotFoundError):
            receiver.receive_messages(max_message_count=N, max_wait_time=1)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(method, pieces asked for) of every partition call that returns rows in pieces, as
    the client makes them (sync calls of peeks and deferred receives run the same code)."""
    calls: list[tuple[str, int]] = []
    real = _rpc.call

    async def recording(entity: str | None, method: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(method, "_method_name", "")
        if name in ("peek", "receive_deferred"):
            # A peek across partitions asks each for one value more, last: how long since it
            # moved messages out (its ``quiet`` argument); the rest are the rows' pieces.
            quiet = name == "peek" and len(args) > 5 and args[5]
            calls.append((name, kwargs.get("returns", 1) - quiet))
        return await real(entity, method, *args, **kwargs)

    monkeypatch.setattr(_rpc, "call", recording)
    return calls


def assert_second_asks_pieces(asked: list[tuple[str, int]], method: str, partitions: int) -> None:
    """Two calls of ``method`` were made, one call a partition each: the first asked for one
    value (no row size known yet), the second for several (300 rows of 1 KiB)."""
    assert [m for m, _ in asked] == [method] * 2 * partitions, asked
    first, second = asked[:partitions], asked[partitions:]
    assert all(n == 1 for _, n in first) and all(n > 1 for _, n in second), asked


def test_sync_peek_and_receive_deferred_of_300_kib_in_pieces(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    asked: list[tuple[str, int]],
) -> None:
    for name, partitions in (("single", 1), ("parts", 2)):
        admin.create_queue(name, partition_count=partitions)
        sent = bodies(name)
        with client.get_queue_sender(name) as sender:
            sender.send_messages([ServiceBusMessage(b, partition_key="k") for b in sent])
        asked.clear()
        with client.get_queue_receiver(name) as peeker:
            # A fresh receiver knows no row size: its first peek asks for one value.
            peeked = peeker.peek_messages(N // 2) + peeker.peek_messages(N)
            assert [m.body for m in peeked] == sent, name
        assert_second_asks_pieces(asked, "peek", partitions)
        seqs = deferred(client, name, sent)
        asked.clear()
        with client.get_queue_receiver(name) as receiver:
            got = receiver.receive_deferred_messages(seqs[: N // 2])
            got += receiver.receive_deferred_messages(seqs[N // 2 :])
            assert [m.body for m in got] == sent, name
            receiver.complete_messages(got)
        # The messages are all in one partition (one key): one call each.
        assert_second_asks_pieces(asked, "receive_deferred", 1)
        assert admin.get_queue_runtime_properties(name).total_message_count == 0, name


def deferred(client: raybus.ServiceBusClient, name: str, sent: list[bytes]) -> list[int]:
    """Receive the ``sent`` messages of queue ``name`` and defer them all: their sequence
    numbers, in order."""
    with client.get_queue_receiver(name, prefetch_count=N) as receiver:
        got: list[raybus.ServiceBusReceivedMessage] = []
        while len(got) < len(sent):
            batch = receiver.receive_messages(len(sent) - len(got), max_wait_time=5)
            assert batch, f"{name}: only {len(got)} of {len(sent)} arrived"
            got.extend(batch)
        for m in got:
            receiver.defer_message(m)
    assert [m.body for m in got] == sent
    return [m.sequence_number for m in got]


async def test_aio_peek_and_receive_deferred_of_300_kib_in_pieces(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    asked: list[tuple[str, int]],
) -> None:
    # A session's peeks and deferred receives take the session's own path.
    for name, partitions, session in (("single", 1, None), ("parts", 2, None), ("sess", 1, "s")):
        await aadmin.create_queue(
            name, partition_count=partitions, requires_session=session is not None
        )
        sent = bodies(name)
        key = {"partition_key": "k"} if session is None else {"session_id": session}
        async with aclient.get_queue_sender(name) as sender:
            await sender.send_messages([ServiceBusMessage(b, **key) for b in sent])
        async with aclient.get_queue_receiver(name, session_id=session) as receiver:
            asked.clear()
            peeked = await receiver.peek_messages(N // 2)
            peeked += await receiver.peek_messages(N)
            assert [m.body for m in peeked] == sent, name
            assert_second_asks_pieces(asked, "peek", partitions)
            got: list[raybus.ServiceBusReceivedMessage] = []
            while len(got) < N:
                batch = await receiver.receive_messages(N - len(got), max_wait_time=5)
                assert batch, f"{name}: only {len(got)} of {N} arrived"
                got.extend(batch)
            for m in got:
                await receiver.defer_message(m)
            seqs = [m.sequence_number for m in got]
            asked.clear()
            again = await receiver.receive_deferred_messages(seqs[: N // 2])
            again += await receiver.receive_deferred_messages(seqs[N // 2 :])
            assert [m.body for m in again] == sent, name
            # This receiver has seen rows: every deferred call asks for pieces.
            assert asked and all(n > 1 for _, n in asked), (name, asked)
            await receiver.complete_messages(again)
        props = await aadmin.get_queue_runtime_properties(name)
        assert props.total_message_count == 0, name


def test_a_peek_in_pieces_of_a_deleted_queue_raises_not_found(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    queue: str,
    asked: list[tuple[str, int]],
) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(b) for b in bodies("d")])
    with client.get_queue_receiver(queue) as receiver:
        assert len(receiver.peek_messages(N)) == N
        admin.delete_queue(queue)
        with pytest.raises(MessagingEntityNotFoundError):
            receiver.peek_messages(N, sequence_number=1)
    assert asked[-1] == ("peek", receiver._aio._pieces(N)) and asked[-1][1] > 1
