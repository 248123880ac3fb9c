"""The sync ``complete_messages`` settles from the caller's thread on a single-partition queue
(no hop through the background loop): the same outcomes as the asyncio path it replaces."""

from __future__ import annotations

from typing import Any

import pytest
import settlement_support
from settlement_support import _lose_lock

import raybus
from raybus import ServiceBusMessage, ServiceBusReceivedMessage
from raybus._core.partition import RELEASE, SettleOp
from raybus._sync import run
from raybus.exceptions import SettlementFailedError
from raybus.management import ServiceBusAdministrationClient

# One namespace for the module, a fresh queue per test from the pool (see conftest).
namespace = settlement_support.namespace
queue = settlement_support.queue


def _receive(receiver: raybus.ServiceBusReceiver, n: int) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    while len(got) < n:
        batch = receiver.receive_messages(n - len(got), max_wait_time=5)
        assert batch, f"only {len(got)} of {n} messages arrived"
        got.extend(batch)
    return got


def _send(client: raybus.ServiceBusClient, queue: str, n: int) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(n)])


def test_complete_messages_completes_them_all(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, 5)
    with client.get_queue_receiver(queue) as receiver:
        got = _receive(receiver, 5)
        receiver.complete_messages(got)
        assert receiver.receive_messages(5, max_wait_time=0.3) == []
    assert admin.get_queue_runtime_properties(queue).active_message_count == 0


def test_complete_messages_names_a_refused_message_and_completes_the_others(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, 3)
    with client.get_queue_receiver(queue) as receiver:
        got = _receive(receiver, 3)
        lost = got[1]
        run(_lose_lock(receiver._aio, lost))
        with pytest.raises(SettlementFailedError) as info:
            receiver.complete_messages(got)
        assert [f[0] for f in info.value.failures] == [lost.sequence_number]
        (again,) = _receive(receiver, 1)  # only the refused one is still there
        assert again.sequence_number == lost.sequence_number
        receiver.complete_messages([again])
    assert admin.get_queue_runtime_properties(queue).active_message_count == 0


def _refused_in_the_background(
    receiver: raybus.ServiceBusReceiver,
) -> tuple[ServiceBusReceivedMessage, ServiceBusReceivedMessage]:
    """Receive two messages and complete the first without waiting after releasing its lock
    behind the receiver's back: the broker refuses that completion. Returns both."""
    first, second = _receive(receiver, 2)
    op: Any = SettleOp(RELEASE, first.lock_token or "").to_wire()
    assert run(receiver._aio._call("settle", [op])) == [None]
    receiver.complete_message(first)  # returns at once; the broker will refuse it
    return first, second


def test_complete_message_settles_its_own_and_leaves_an_earlier_refusal_to_the_next_receive(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    """An earlier settlement sent without waiting was refused: ``complete_message`` of
    another message does not raise it as its own (it would name another message, and leave
    its own unsent). It completes its message; the next receive reports the refusal."""
    _send(client, queue, 3)
    with client.get_queue_receiver(queue) as receiver:
        first, second = _refused_in_the_background(receiver)
        receiver._aio.wait_answers_blocking(receiver._aio._handed)
        receiver.complete_message(second)
        with pytest.raises(SettlementFailedError) as info:
            receiver.receive_messages(1, max_wait_time=5)
        assert [f[0] for f in info.value.failures] == [first.sequence_number]
    with client.get_queue_receiver(queue, max_wait_time=5) as other:
        rest = _receive(other, 2)
        assert sorted(m.sequence_number for m in rest) == sorted(
            {first.sequence_number, second.sequence_number + 1}
        )
        other.complete_messages(rest)
        assert other.receive_messages(1, max_wait_time=0.3) == []


def test_complete_messages_reports_a_refused_settlement_sent_without_waiting_first(
    client: raybus.ServiceBusClient, queue: str
) -> None:
    _send(client, queue, 2)
    with client.get_queue_receiver(queue) as receiver:
        first, second = _refused_in_the_background(receiver)
        with pytest.raises(SettlementFailedError) as info:
            receiver.complete_messages([second])
        assert [f[0] for f in info.value.failures] == [first.sequence_number]
        assert second._settled  # this call's own completion was sent, and taken
    with client.get_queue_receiver(queue, max_wait_time=5) as other:
        (again,) = _receive(other, 1)  # the refused one comes again; the completed one not
        assert again.sequence_number == first.sequence_number
        other.complete_messages([again])
        assert other.receive_messages(1, max_wait_time=0.3) == []
