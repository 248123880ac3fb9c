"""Fixtures and helpers of the session suites (``test_sessions*.py``).

Queues are few and shared by a module: most tests use their own uniquely named sessions on
``session_queue`` (lock 30 s) or ``short_lock_queue`` (lock 2 s, for expiry and renewal with
real durations). Tests that need a queue without any other session take a fresh one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from settlement_support import _areceive_n as _areceive_n
from settlement_support import _receive_n as _receive_n

import raybus
from raybus import ServiceBusMessage, ServiceBusReceivedMessage
from raybus.management import ServiceBusAdministrationClient

LONG_LOCK_S = 30.0
SHORT_LOCK_S = 2.0
PARTITIONS = 3


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    # Tests use their own uniquely named sessions (or queues); see ``module_namespace``.
    return module_namespace


def _name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _sid(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _session_queue(namespace: str, prefix: str, lock_s: float) -> str:
    name = _name(prefix)
    ServiceBusAdministrationClient(namespace).create_queue(
        name, requires_session=True, lock_duration=timedelta(seconds=lock_s)
    )
    return name


@pytest.fixture(scope="module")
def session_queue(module_namespace: str) -> str:
    """A session-enabled queue with a comfortable lock, shared by the module."""
    return _session_queue(module_namespace, "sq", LONG_LOCK_S)


@pytest.fixture(scope="module")
def short_lock_queue(module_namespace: str) -> str:
    """A session-enabled queue whose session locks run out after ``SHORT_LOCK_S``."""
    return _session_queue(module_namespace, "short", SHORT_LOCK_S)


@pytest.fixture(scope="module")
def plain_queue(module_namespace: str) -> str:
    """A queue without sessions (left empty)."""
    name = _name("plain")
    ServiceBusAdministrationClient(module_namespace).create_queue(name)
    return name


@pytest.fixture(scope="module")
def partitioned_session_queue(module_namespace: str) -> str:
    name = _name("psq")
    ServiceBusAdministrationClient(module_namespace).create_queue(
        name,
        requires_session=True,
        partition_count=PARTITIONS,
        lock_duration=timedelta(seconds=LONG_LOCK_S),
    )
    return name


@pytest.fixture
def lonely_session_queue(admin: ServiceBusAdministrationClient) -> Iterator[str]:
    """A fresh session-enabled queue no other test touches (deleted after the test)."""
    name = _name("lonely")
    admin.create_queue(name, requires_session=True, lock_duration=timedelta(seconds=LONG_LOCK_S))
    yield name


def _send(client: raybus.ServiceBusClient, queue: str, messages: list[ServiceBusMessage]) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(messages)


def _msgs(session_id: str | None, *bodies: str, **kwargs: Any) -> list[ServiceBusMessage]:
    return [ServiceBusMessage(b, session_id=session_id, **kwargs) for b in bodies]


def _bodies(messages: list[ServiceBusReceivedMessage]) -> list[Any]:
    return [m.body for m in messages]
