"""Shared fixtures of the AMQP gateway suites: one gateway per module on a free port, serving
the module's raybus namespace, and azure-servicebus clients pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

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
