"""The ceiling: bare Ray actor calls carrying the same batches, with no broker semantics.

One async actor holds a deque per source (1 for a queue, K for a topic: a publish is one call
that appends the batch to every deque, as a topic's router fans one call out) and a dict of
messages in flight for peek-lock's peer. ``get`` waits on an event instead of polling, as
raybus's partition actor does. ``num_cpus=0``, like raybus's actors.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import deque
from typing import Any

import ray
from _common import BenchError

_names = itertools.count(1)
RAY_NAMESPACE = f"raybus-suite-{uuid.uuid4().hex[:8]}"


class BareTopic:
    def __init__(self, sources: int) -> None:
        self.items: list[deque[bytes]] = [deque() for _ in range(sources)]
        self.inflight: list[dict[int, bytes]] = [{} for _ in range(sources)]
        self.tags = itertools.count()
        self.changed = asyncio.Event()

    async def ping(self) -> bool:
        return True

    async def put(self, bodies: list[bytes]) -> int:
        for d in self.items:
            d.extend(bodies)
        self.changed.set()
        self.changed = asyncio.Event()
        return len(bodies)

    async def get(self, source: int, n: int, wait: float, delete: bool) -> list[tuple[bytes, int]]:
        deadline = time.monotonic() + wait
        items = self.items[source]
        while not items:
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except asyncio.TimeoutError:
                pass
        out = []
        for _ in range(min(n, len(items))):
            body = items.popleft()
            tag = next(self.tags)
            if not delete:
                self.inflight[source][tag] = body
            out.append((body, tag))
        return out

    async def ack(self, source: int, tags: list[int]) -> int:
        """Settle; returns how many tags were not in flight (0 when all is well)."""
        return sum(self.inflight[source].pop(t, None) is None for t in tags)

    async def left(self) -> int:
        return sum(map(len, self.items)) + sum(map(len, self.inflight))


class Admin:
    def __init__(self) -> None:
        self.handles: dict[str, Any] = {}  # a named actor lives while a handle does

    def setup(self, topology: dict[str, Any], system: dict[str, Any]) -> dict[str, Any]:
        name = f"bare{next(_names)}"
        sources = max(1, topology.get("subscriptions", 0))
        handle = (
            ray.remote(BareTopic)
            .options(name=name, namespace=RAY_NAMESPACE, num_cpus=0, max_concurrency=1000)
            .remote(sources)
        )
        ray.get(handle.ping.remote(), timeout=120)
        self.handles[name] = handle
        return {"name": name, "ray_namespace": RAY_NAMESPACE, "sources": sources}

    def check_empty(self, target: dict[str, Any]) -> None:
        left = ray.get(self._handle(target).left.remote(), timeout=60)
        if left:
            raise BenchError(f"bare actor {target['name']}: {left} messages left")

    def teardown(self, target: dict[str, Any]) -> None:
        ray.kill(self.handles.pop(target["name"]), no_restart=True)

    def close(self) -> None:
        for h in self.handles.values():
            ray.kill(h, no_restart=True)
        self.handles.clear()

    @staticmethod
    def _handle(target: dict[str, Any]) -> Any:
        return ray.get_actor(target["name"], namespace=target["ray_namespace"])


class Endpoint:
    def __init__(
        self, target: dict[str, Any], source: int, system: dict[str, Any], cfg: dict[str, Any]
    ) -> None:
        self.actor = Admin._handle(target)
        self.source = source
        self.delete = system["settle"] == "delete"
        self.single = cfg["calls"] == "single"

    async def send(self, bodies: list[bytes]) -> None:
        if self.single:
            for b in bodies:
                await self.actor.put.remote([b])
        else:
            await self.actor.put.remote(bodies)

    async def receive(self, max_n: int, wait: float) -> list[tuple[bytes, Any]]:
        got = await self.actor.get.remote(self.source, max_n, wait, self.delete)
        return [(b, t) for b, t in got]

    async def settle(self, tokens: list[Any]) -> None:
        if self.delete or not tokens:
            return
        calls = [[t] for t in tokens] if self.single else [tokens]
        for tags in calls:
            if await self.actor.ack.remote(self.source, tags):
                raise BenchError("bare actor: acknowledged a message not in flight")

    async def close(self) -> None:
        pass


Sender = Receiver = Endpoint
