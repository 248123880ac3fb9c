"""The namespace actor: the registry of entities, and the creator of their partition actors.

One named, detached actor per namespace (``raybus/ns/<namespace>`` in the Ray namespace
``raybus``), found or created by every client that connects, so two processes on the same Ray
cluster see the same entities. It holds no messages; clients resolve an entity once
(``route``) and then talk to the partition actors directly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import ray

from .._clock import SystemClock
from .._core.partition import PartitionCounts
from .._core.registry import EntityEntry, Registry
from .._models import QueueProperties
from ..exceptions import MessagingEntityNotFoundError
from .partition import partition_actor

__all__ = ["NamespaceActor", "Route", "namespace_actor", "namespace_actor_name"]

_log = logging.getLogger("raybus.namespace")


def namespace_actor_name(namespace: str) -> str:
    return f"raybus/ns/{namespace}"


@dataclass(frozen=True)
class Route:
    """How to reach an entity: its settings and one actor handle per partition.

    ``incarnation`` changes when the entity is deleted and created again.
    """

    properties: QueueProperties
    incarnation: int
    partitions: tuple[Any, ...]
    created_at: float
    updated_at: float


class NamespaceActor:
    """Entity registry of one namespace (async actor; see ``namespace_actor``)."""

    def __init__(self, namespace: str) -> None:
        self._namespace = namespace
        self._registry = Registry(namespace, SystemClock())
        self._handles: dict[str, tuple[Any, ...]] = {}

    async def ping(self) -> str:
        return self._namespace

    def _route(self, entry: EntityEntry) -> Route:
        return Route(
            entry.properties,
            entry.incarnation,
            self._handles[entry.properties.name.lower()],
            entry.created_at,
            entry.updated_at,
        )

    async def create_queue(self, properties: QueueProperties) -> Route:
        entry = self._registry.create(properties)
        handles = tuple(
            partition_actor(name, self._namespace, properties, pid, entry.incarnation)
            for pid, name in enumerate(entry.partitions)
        )
        self._handles[properties.name.lower()] = handles
        try:
            await asyncio.gather(*(h.ready.remote() for h in handles))
        except Exception:
            self._registry.delete(properties.name)
            del self._handles[properties.name.lower()]
            for h in handles:
                ray.kill(h, no_restart=True)
            raise
        return self._route(entry)

    async def route(self, name: str) -> Route:
        return self._route(self._registry.get(name))

    async def list_queues(self) -> list[Route]:
        return [self._route(e) for e in self._registry.list()]

    async def update_queue(self, properties: QueueProperties) -> Route:
        entry = self._registry.update(properties)
        handles = self._handles[entry.properties.name.lower()]
        await asyncio.gather(*(h.update_properties.remote(entry.properties) for h in handles))
        return self._route(entry)

    async def delete_queue(self, name: str) -> None:
        entry = self._registry.delete(name)
        for handle in self._handles.pop(entry.properties.name.lower()):
            ray.kill(handle, no_restart=True)

    async def counts(self, name: str) -> tuple[Route, list[PartitionCounts]]:
        route = self._route(self._registry.get(name))
        counts = await asyncio.gather(*(h.counts.remote() for h in route.partitions))
        return route, list(counts)

    async def delete_idle_queue(self, name: str, incarnation: int, accessed_at: float) -> bool:
        """Delete the queue if it is still that incarnation and every partition is idle."""
        try:
            route, counts = await self.counts(name)
        except MessagingEntityNotFoundError:
            return False
        idle = route.properties.auto_delete_on_idle_s
        if route.incarnation != incarnation or any(
            c.accessed_at + idle > time.time() for c in counts
        ):
            return False
        _log.info("deleting queue %s: idle since %s", name, accessed_at)
        await self.delete_queue(name)
        return True


def namespace_actor(namespace: str) -> Any:
    """Find or create the namespace's registry actor (named, detached, restarts forever)."""
    cls = ray.remote(NamespaceActor)
    return cls.options(
        name=namespace_actor_name(namespace),
        namespace="raybus",
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        max_restarts=-1,
        max_concurrency=1000,
    ).remote(namespace)
