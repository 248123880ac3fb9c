"""The small interface every system in the suite implements, and the message format they
all carry.

A *system* is a row of the results table: a peer (raybus, rabbitmq, actor, rayqueue) with its
options (durable or express storage, peek-lock or receive-and-delete). Each peer module
provides two halves:

* ``Admin`` (the suite's main process): ``setup(topology, system) -> target`` creates the
  entities and returns a JSON-able description of them; ``check_empty(target)`` raises
  ``BenchError`` if anything is left (unsettled, redelivered, dead-lettered);
  ``teardown(target)``; ``close()``.
* ``Sender(target, source, system, cfg)`` / ``Receiver(target, source, system, cfg)`` (in the
  sender and receiver worker processes): ``Endpoint`` classes (``source`` is the subscription
  a receiver reads; 0 for a sender).

Bodies carry their own index and send time, so every peer is checked (each message exactly
once, body intact) and timed (send-to-receive latency) in the same way.
"""

from __future__ import annotations

import struct
import time
from typing import Any, Protocol

HEADER = struct.Struct(">Qd")  # message index, time.time() at send

# system name -> (peer module, options). Order: the order systems run within a cell.
SYSTEMS: dict[str, dict[str, Any]] = {
    "raybus": {"peer": "raybus", "express": False, "settle": "peek-lock"},
    "raybus-express": {"peer": "raybus", "express": True, "settle": "peek-lock"},
    "raybus-rd": {"peer": "raybus", "express": False, "settle": "delete"},
    "raybus-express-rd": {"peer": "raybus", "express": True, "settle": "delete"},
    "rabbitmq": {"peer": "rabbitmq", "settle": "peek-lock"},
    "rabbitmq-rd": {"peer": "rabbitmq", "settle": "delete"},
    "actor": {"peer": "actor", "settle": "peek-lock"},
    "actor-rd": {"peer": "actor", "settle": "delete"},
    "rayqueue": {"peer": "rayqueue", "settle": "delete"},
}

LABELS = {
    "raybus": "raybus durable, peek-lock + complete",
    "raybus-express": "raybus express, peek-lock + complete",
    "raybus-rd": "raybus durable, receive-and-delete",
    "raybus-express-rd": "raybus express, receive-and-delete",
    "rabbitmq": "RabbitMQ quorum, confirms + manual ack",
    "rabbitmq-rd": "RabbitMQ quorum, confirms + auto-ack",
    "actor": "bare Ray actor, put / get + ack",
    "actor-rd": "bare Ray actor, put / get",
    "rayqueue": "ray.util.queue.Queue",
}


def make_body(i: int, size: int) -> bytes:
    """``size`` bytes: the index, the send time, then filler."""
    return HEADER.pack(i, time.time()) + b"\xa5" * (size - HEADER.size)


def parse_body(body: Any, size: int) -> tuple[int, float] | None:
    """(index, send time), or None if the body is not one this suite sent with that size."""
    if not isinstance(body, (bytes, bytearray, memoryview)) or len(body) != size:
        return None
    return HEADER.unpack_from(body, 0)  # type: ignore[return-value]


class Endpoint(Protocol):
    """One sender or receiver, used by one asyncio task of a worker process."""

    async def send(self, bodies: list[bytes]) -> None:
        """One call: ``bodies`` as one batch (calls="batch") or a single message."""

    async def receive(self, max_n: int, wait: float) -> list[tuple[bytes, Any]]:
        """Up to max_n (body, settle token) pairs; [] after ``wait`` seconds without any."""

    async def settle(self, tokens: list[Any]) -> None:
        """Complete/ack what receive returned (peek-lock); a no-op for receive-and-delete."""

    async def close(self) -> None: ...

    # Optional, receivers: ``stop()`` is called when every message is settled, before the
    # worker cancels a receive still waiting; an endpoint whose receive runs on a thread
    # of its own makes that receive return (asyncio's cancel cannot reach it).
