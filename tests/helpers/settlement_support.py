"""Fixtures and helpers of the settlement suites (``test_settlement*.py``): a module-wide
namespace, a fresh pooled queue per test, and send/receive shorthands.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import raybus
from raybus import (
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
    aio,
)
from raybus._core.partition import RELEASE, SettleOp
from raybus.management import ServiceBusAdministrationClient

DLQ = ServiceBusSubQueue.DEAD_LETTER
RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    # Each test uses its own uniquely named queues; see ``module_namespace`` in conftest.
    return module_namespace


@pytest.fixture
def queue(pooled_queue: str) -> str:
    # A fresh default queue, started ahead of time; see ``QueuePool`` in conftest.
    return pooled_queue


def _name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _runtime(admin: ServiceBusAdministrationClient, queue: str) -> tuple[int, int, int]:
    """(active, dead-letter, scheduled) counts."""
    r = admin.get_queue_runtime_properties(queue)
    return r.active_message_count, r.dead_letter_message_count, r.scheduled_message_count


def _send(client: raybus.ServiceBusClient, queue: str, *bodies: Any, **kwargs: Any) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(b, **kwargs) for b in bodies])


async def _asend(aclient: aio.ServiceBusClient, queue: str, *bodies: Any) -> None:
    async with aclient.get_queue_sender(queue) as sender:
        await sender.send_messages([ServiceBusMessage(b) for b in bodies])


def _receive_n(
    receiver: raybus.ServiceBusReceiver, n: int, max_wait_time: float = 5
) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    while len(got) < n:
        batch = receiver.receive_messages(n - len(got), max_wait_time=max_wait_time)
        assert batch, f"only {len(got)} of {n} messages arrived"
        got.extend(batch)
    return got


async def _areceive_n(
    receiver: aio.ServiceBusReceiver, n: int, max_wait_time: float = 5
) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    while len(got) < n:
        batch = await receiver.receive_messages(n - len(got), max_wait_time=max_wait_time)
        assert batch, f"only {len(got)} of {n} messages arrived"
        got.extend(batch)
    return got


async def _lose_lock(receiver: aio.ServiceBusReceiver, msg: ServiceBusReceivedMessage) -> None:
    """Make the broker drop ``msg``'s lock behind the receiver's back (as an actor restart
    would): release it through the receiver's internal actor call. The message is available
    again and the receiver still believes its lock is valid."""
    op: Any = SettleOp(RELEASE, msg.lock_token or "")
    if hasattr(op, "to_wire"):  # the wire form, where the actor takes one
        op = op.to_wire()
    (error,) = await receiver._call("settle", [op])
    assert error is None


def hold_answers(receiver: aio.ServiceBusReceiver) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold the answers of ``receiver``'s row calls (receives, its standing request) on their
    way back: returns (``answered``, set once a partition answered; ``proceed``, set it to let
    the answer reach the receiver). For the race of an answer with close() or a cancel."""
    answered, proceed = asyncio.Event(), asyncio.Event()
    call_rows = receiver._call_rows

    async def held(*args: Any, **kwargs: Any) -> Any:
        rows = await call_rows(*args, **kwargs)
        answered.set()
        await proceed.wait()
        return rows

    receiver._call_rows = held  # type: ignore[method-assign]
    return answered, proceed
