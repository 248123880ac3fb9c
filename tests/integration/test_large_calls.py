"""Calls that carry more than Ray passes inline (100 KiB): the messages cross in pieces
(raybus._core.wire) and arrive whole and in order, on every path that sends or receives many."""

from __future__ import annotations

import pytest

import raybus
from raybus import ServiceBusMessage, aio
from raybus.management import ServiceBusAdministrationClient

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
    """One bad message among many pieces still refuses the list and stores nothing."""
    admin.create_queue("small", max_message_size_in_kilobytes=1024)
    messages = [ServiceBusMessage(b) for b in bodies("x")]
    messages[-1] = ServiceBusMessage(b"y" * (1024 * 1024 + 1))
    with (
        client.get_queue_sender("small") as sender,
        pytest.raises(raybus.exceptions.MessageSizeExceededError),
    ):
        sender.send_messages(messages)
    assert admin.get_queue_runtime_properties("small").total_message_count == 0
