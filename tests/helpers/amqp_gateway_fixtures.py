"""Shared fixtures of the AMQP gateway suites: one gateway per module on a free port, serving
the module's raybus namespace, and azure-servicebus clients pointed at it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient as SdkClient

from raybus.amqp import GatewayHandle, start_gateway


@pytest.fixture
def namespace(module_namespace: str) -> str:
    """The tests of a gateway module share its namespace (each uses its own entities)."""
    return module_namespace


@pytest.fixture(scope="module")
def gateway(module_namespace: str) -> Iterator[GatewayHandle]:
    handle = start_gateway(module_namespace, port=0)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def sdk(gateway: GatewayHandle) -> Iterator[SdkClient]:
    """An SDK client that fails fast: no retries, short operation timeouts."""
    client = SdkClient.from_connection_string(
        gateway.connection_string, retry_total=0, retry_backoff_factor=0.1
    )
    with client:
        yield client


def receive_n(receiver: Any, n: int, timeout: float = 15.0) -> list[Any]:
    """Exactly ``n`` messages from an SDK receiver (they may come in several receives); fails
    if they do not all arrive within ``timeout`` seconds."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} messages arrived"
        got += receiver.receive_messages(max_message_count=n - len(got), max_wait_time=2)
    assert len(got) == n, f"{len(got)} messages arrived, {n} expected"
    return got
