"""``ray.util.queue.Queue`` as a system of the suite.

Its actor's own methods are called as the Queue class calls them (``put``/``get`` for single
messages, ``put_nowait_batch``/``get_nowait_batch`` for batches), awaited so one worker can run
many tasks. It has no acknowledgement (receive-and-delete only) and no blocking batch get: a
batch receiver asks for what ``qsize`` reports and polls every 0.5 ms when the queue is empty.
A topic of K subscriptions is K queues; the sender puts each batch into every one.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import ray
from _common import BenchError
from _peer_actor import RAY_NAMESPACE

_names = itertools.count(1)


class Admin:
    def __init__(self) -> None:
        self.queues: dict[str, Any] = {}

    def setup(self, topology: dict[str, Any], system: dict[str, Any]) -> dict[str, Any]:
        from ray.util.queue import Queue

        names = []
        for _ in range(max(1, topology.get("subscriptions", 0))):
            name = f"rq{next(_names)}"
            q = Queue(actor_options={"name": name, "namespace": RAY_NAMESPACE, "num_cpus": 0})
            q.qsize()
            self.queues[name] = q
            names.append(name)
        return {"names": names, "ray_namespace": RAY_NAMESPACE}

    def check_empty(self, target: dict[str, Any]) -> None:
        left = sum(self.queues[n].qsize() for n in target["names"])
        if left:
            raise BenchError(f"ray.util.queue: {left} messages left")

    def teardown(self, target: dict[str, Any]) -> None:
        for n in target["names"]:
            self.queues.pop(n).shutdown(force=True)

    def close(self) -> None:
        for q in self.queues.values():
            q.shutdown(force=True)
        self.queues.clear()


def _empty(exc: BaseException) -> bool:
    from ray.util.queue import Empty

    return isinstance(exc, Empty) or "Empty" in type(exc).__name__


class Endpoint:
    def __init__(
        self, target: dict[str, Any], source: int, system: dict[str, Any], cfg: dict[str, Any]
    ) -> None:
        ns = target["ray_namespace"]
        self.actors = [ray.get_actor(n, namespace=ns) for n in target["names"]]
        self.actor = self.actors[source]
        self.single = cfg["calls"] == "single"

    async def send(self, bodies: list[bytes]) -> None:
        if self.single:
            for b in bodies:
                await asyncio.gather(*(a.put.remote(b, None) for a in self.actors))
        else:
            await asyncio.gather(*(a.put_nowait_batch.remote(bodies) for a in self.actors))

    async def receive(self, max_n: int, wait: float) -> list[tuple[bytes, Any]]:
        if self.single:
            try:
                return [(await self.actor.get.remote(wait), None)]
            except Exception as exc:
                if _empty(exc):
                    return []
                raise
        deadline = time.monotonic() + wait
        while True:
            k = min(max_n, await self.actor.qsize.remote())
            if k:
                try:
                    return [(b, None) for b in await self.actor.get_nowait_batch.remote(k)]
                except Exception as exc:  # another receiver took some meanwhile
                    if not _empty(exc):
                        raise
            if time.monotonic() >= deadline:
                return []
            await asyncio.sleep(0.0005)

    async def settle(self, tokens: list[Any]) -> None:
        pass

    async def close(self) -> None:
        pass


Sender = Receiver = Endpoint
