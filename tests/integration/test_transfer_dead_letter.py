"""The transfer dead-letter sub-queue: a receiver of it works as on an empty sub-queue, because
raybus never puts a message there (``raybus.aio._receiver``'s docstring says why), and it shows
nothing of its entity's other messages: no receive, peek, deferred receive or settlement of it
reaches them. That a failed forward dead-letters at the source and not here is in
``test_forwarding.py``."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

import raybus
from raybus import ServiceBusMessage, ServiceBusSubQueue, aio
from raybus.exceptions import (
    InvalidArgumentError,
    MessageLockLostError,
    MessageNotFoundError,
    MessagingEntityNotFoundError,
)
from raybus.management import ServiceBusAdministrationClient

TDLQ = ServiceBusSubQueue.TRANSFER_DEAD_LETTER


@pytest.fixture
def namespace(module_namespace: str) -> str:
    return module_namespace


def _n(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_the_transfer_sub_queue_shows_none_of_the_queue_s_messages_and_locks_none(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    q = queue
    with client.get_queue_sender(q) as sender:
        sender.send_messages([ServiceBusMessage("active"), ServiceBusMessage("deferred")])
    with client.get_queue_receiver(q, max_wait_time=3) as main:
        got = main.receive_messages(2)
        while len(got) < 2:
            got += main.receive_messages(2 - len(got))
        locked, deferred = sorted(got, key=lambda m: str(m))
        main.defer_message(deferred)
        with client.get_queue_receiver(q, sub_queue=TDLQ, max_wait_time=0.3) as tdlq:
            assert tdlq.receive_messages(5) == []
            assert list(tdlq) == []  # iteration ends after max_wait_time with nothing
            assert tdlq.peek_messages(5, sequence_number=1) == []
            with pytest.raises(MessageNotFoundError) as missing:
                tdlq.receive_deferred_messages([deferred.sequence_number])
            assert missing.value.sequence_numbers == [deferred.sequence_number]
            # Neither a message received elsewhere nor its lock token settles through it.
            with pytest.raises(MessageLockLostError):
                tdlq.complete_message(locked)
            with pytest.raises(MessageLockLostError):
                tdlq.settle_message_by_lock_token(locked.lock_token, "completed")
            with pytest.raises(MessageLockLostError):
                tdlq.renew_message_lock(locked)
        # Everything is where it was: the lock still held, the deferred message still there.
        main.complete_message(locked)
        (again,) = main.receive_deferred_messages([deferred.sequence_number])
        main.complete_message(again)
    props = admin.get_queue_runtime_properties(q)
    assert props.active_message_count == 0
    assert props.transfer_dead_letter_message_count == 0


async def test_a_receive_waiting_on_the_transfer_sub_queue_ends_at_close(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    topic = _n("t")
    await aadmin.create_topic(topic)
    await aadmin.create_subscription(topic, "s")
    receiver = aclient.get_subscription_receiver(topic, "s", sub_queue=TDLQ)
    waiting = asyncio.ensure_future(receiver.receive_messages(max_wait_time=None))
    await asyncio.sleep(0.5)
    assert not waiting.done()  # no max_wait_time: it waits, as on an empty queue
    started = time.monotonic()
    await receiver.close()
    assert await asyncio.wait_for(waiting, 5) == []
    assert time.monotonic() - started < 2
    with pytest.raises(InvalidArgumentError):
        await receiver.receive_messages(max_wait_time=0.1)


async def test_the_transfer_sub_queue_of_a_missing_entity_or_a_session_is_refused(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    async with aclient.get_queue_receiver(_n("none"), sub_queue=TDLQ) as receiver:
        with pytest.raises(MessagingEntityNotFoundError):
            await receiver.receive_messages(max_wait_time=0.2)
        with pytest.raises(MessagingEntityNotFoundError):
            await receiver.peek_messages()
        with pytest.raises(MessagingEntityNotFoundError):
            await receiver.receive_deferred_messages([1])
    with pytest.raises(InvalidArgumentError, match="no sessions"):
        aclient.get_queue_receiver(_n("q"), sub_queue=TDLQ, session_id="s")
    with pytest.raises(InvalidArgumentError, match="TRANSFER_DEAD_LETTER"):
        aclient.get_queue_receiver(_n("q"), sub_queue="nonsense")
