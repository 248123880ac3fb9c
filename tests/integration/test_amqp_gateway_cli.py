"""``raybus gateway`` as a process, and the gateway's confirmed-settlement mode."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from amqp_gateway_fixtures import receive_n
from azure.servicebus import ServiceBusClient as SdkClient
from azure.servicebus import ServiceBusMessage
from net import free_port

import raybus
from raybus.amqp import start_gateway


@pytest.fixture
def namespace(module_namespace: str) -> str:
    return module_namespace


def _connection_string(port: int) -> str:
    return (
        f"Endpoint=sb://localhost:{port};SharedAccessKeyName=k;SharedAccessKey=v;"
        "UseDevelopmentEmulator=true;"
    )


def _round_trip(port: int, queue: str, n: int) -> list[str]:
    with SdkClient.from_connection_string(_connection_string(port), retry_total=0) as sdk:
        with sdk.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"c{i}") for i in range(n)])
        with sdk.get_queue_receiver(queue, max_wait_time=3) as receiver:
            got = receive_n(receiver, n)
            for m in got:
                receiver.complete_message(m)
            return [str(m) for m in got]


def test_the_cli_command_serves_the_sdk_until_its_duration_ends(
    ray_cluster: str, namespace: str, pooled_queue: str
) -> None:
    port = free_port()
    env = {**os.environ, "RAY_ADDRESS": ray_cluster}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raybus.cli",
            "--namespace",
            namespace,
            "gateway",
            "--port",
            str(port),
            "--duration",
            "20s",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()  # printed once it listens
        assert f"127.0.0.1:{port}" in banner, banner
        assert _round_trip(port, pooled_queue, 3) == ["c0", "c1", "c2"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_confirmed_settlements_complete_as_before(
    namespace: str, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    with start_gateway(namespace, port=0, confirm_settlements=True) as gw:
        assert _round_trip(gw.port, pooled_queue, 5) == [f"c{i}" for i in range(5)]
    # Confirmed: every completion was applied before the SDK heard of it.
    assert client.get_queue_receiver(pooled_queue).peek_messages(10) == []
