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
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs
import ray

from .._clock import SystemClock
from .._core.access import ANY, INTERNAL, Guard
from .._core.partition import PartitionCounts
from .._core.registry import EntityEntry, Registry, entity_storage_dirs
from .._core.slots import PartitionMap
from .._models import QueueProperties
from .._storage import open_storage
from .._topic_models import is_subscription
from ..auth import AccessRights
from ..exceptions import InvalidArgumentError, MessagingEntityNotFoundError
from .access import BROKER_ACTOR_OPTIONS, guarded, internal_token
from .access_admin import AccessOps
from .changelog import ChangeLog, LoggedOnce
from .partition import partition_actor
from .router import router_actor
from .scaling import Scaler
from .self_call import call_self_until_answered
from .topics import TopicOps, check_names, each_present

__all__ = ["NamespaceActor", "Route", "namespace_actor", "namespace_actor_name", "route_stamp"]

_log = logging.getLogger("raybus.namespace")
MANAGE = AccessRights.MANAGE
MARK_DELETED_TIMEOUT_S = 10.0  # a live actor answers in milliseconds; a restarting one in ~1 s


def namespace_actor_name(namespace: str) -> str:
    return f"raybus/ns/{namespace}"


# How many times ``tell_each`` calls a partition that restarts under its call, and the pause
# before the n-th repeat (n times this): Ray restarts a killed partition in about a second.
TELL_TRIES = 5
TELL_PAUSE_S = 0.5


async def tell_each(
    handles: Iterable[Any],
    call: Callable[[Any], Awaitable[Any]],
    *,
    tries: int = TELL_TRIES,
    pause_s: float = TELL_PAUSE_S,
) -> None:
    """``await call(handle)`` for every handle at once, and again for a handle whose actor
    restarted under the call, up to ``tries`` calls in all.

    For a settings change sent to an entity's partitions (idempotent): a partition killed
    under it comes back with the settings its log has, which may be the old ones, and the
    change went through the registry already. Ray (2.60) fails a call in flight to an actor
    that restarts with ``ActorUnavailableError``; ``ActorDiedError`` means the actor is gone
    for good and is raised at once (the caller holds the entity's partition-change lock, so
    that is a deleted entity, not a removed partition). Raises the last error of a partition
    that still fails after ``tries`` calls, and at once what a partition raises itself."""

    async def tell(handle: Any) -> None:
        for attempt in range(1, tries + 1):
            try:
                await call(handle)
                return
            except ray.exceptions.ActorDiedError:
                raise
            except ray.exceptions.RayActorError:
                if attempt == tries:
                    raise
                await asyncio.sleep(pause_s * attempt)

    await asyncio.gather(*(tell(h) for h in handles))


@dataclass(frozen=True)
class Route:
    """How to reach an entity: its settings, partition map and partition actor handles.

    ``partitions[pid]`` is the handle of partition ``pid`` (None for ids that no longer
    exist); ``pmap`` says which partition serves which key. ``incarnation`` changes when the
    entity is deleted and created again.
    """

    properties: QueueProperties
    incarnation: int
    partitions: tuple[Any, ...]
    created_at: float
    updated_at: float
    pmap: PartitionMap

    @property
    def single(self) -> bool:
        """One partition and no change under way: every call goes to ``partitions[0]``."""
        return len(self.partitions) == 1

    def handle(self, pid: int) -> Any | None:
        """Partition ``pid``'s actor, or None if it does not exist (any more)."""
        return self.partitions[pid] if 0 <= pid < len(self.partitions) else None

    def existing(self) -> list[tuple[int, Any]]:
        """(partition id, handle) of every partition that exists, live ones first."""
        return [(pid, self.partitions[pid]) for pid in self.pmap.partition_ids]


@dataclass(frozen=True)
class TopicRoute:
    """How to reach a topic: its settings and its router actor."""

    properties: Any  # TopicProperties
    incarnation: int
    router: Any
    created_at: float
    updated_at: float


def route_stamp(route: Route | TopicRoute) -> tuple[Any, ...]:
    """What tells two routes of one entity apart: equal stamps, same route. Every change of
    an entry moves its ``updated_at``; the partition actors that exist can change without one
    (a retired partition's actor goes once it is empty), so a queue's stamp names them too."""
    if isinstance(route, TopicRoute):
        return (route.incarnation, route.updated_at)
    present = tuple(pid for pid, handle in enumerate(route.partitions) if handle is not None)
    return (route.incarnation, route.updated_at, route.pmap.version, present)


class NamespaceActor(TopicOps, AccessOps):
    """Entity registry of one namespace (async actor; see ``namespace_actor``).

    With a ``storage_path`` the registry is durable: every change is logged before it is
    answered, and a restarted actor (or one started on a fresh cluster with the same
    ``storage_path``) finds every entity again and re-creates its partition actors, which
    recover their own messages.
    """

    def __init__(self, namespace: str, storage_path: str | None = None) -> None:
        self._namespace = namespace
        self._storage_path = storage_path
        self._registry = Registry(namespace, SystemClock())
        self._handles: dict[str, dict[int, Any]] = {}
        self._routers: dict[str, Any] = {}  # topic name -> its router actor
        self._router_version = 0
        self._log: ChangeLog | None = None
        self._scaler = Scaler(self)
        if storage_path is not None:
            self._log = ChangeLog(
                storage_path, namespace, "registry", self._registry.snapshot, every=100
            )
            self._registry.restore((kind, value) for kind, value in self._log.replay())
            for entry in self._registry.list():
                key = entry.properties.name.lower()
                if entry.kind == "topic":
                    self._routers[key] = router_actor(
                        namespace, entry.properties, entry.incarnation, storage_path
                    )
                else:
                    self._handles[key] = self._partition_actors(entry)
            if self._registry.list() or self._registry.access.version:
                # Resume partition changes and rule pushes without waiting for a client.
                actor = ray.get_runtime_context().current_actor
                call_self_until_answered(actor.ping.remote, "namespace-resume")
        # A new namespace (or one logged before creation times were kept) is born now; the
        # change is logged by the first ping or namespace_created (``__init__`` has no loop).
        born = self._registry.born() is not None
        self._birth = LoggedOnce(self._log if born else None, ("born", self._registry.created_at))
        # The namespace holds the rules itself: its guard never fetches them.
        self._guard = Guard(internal_token(namespace), SystemClock())
        self._guard.load(*self._registry.access.snapshot())

    def _partition_actors(self, entry: EntityEntry) -> dict[int, Any]:
        pmap = entry.pmap
        single = len(pmap.partition_ids) == 1
        return {
            pid: partition_actor(
                name,
                self._namespace,
                entry.properties,
                pid,
                entry.incarnation,
                self._storage_path,
                None if single else pmap.owned_by(pid),
            )
            for pid, name in entry.partition_names(self._namespace).items()
        }

    async def _persist(self, change: tuple[str, Any]) -> None:
        """Log one registry change durably (a no-op without storage)."""
        if self._log is not None:
            await self._log.append(change)

    @guarded(ANY)
    async def storage_path(self) -> str | None:
        return self._storage_path

    @guarded(INTERNAL)
    async def partition_map(self, name: str, incarnation: int) -> PartitionMap | None:
        """The entity's current map, if ``incarnation`` is still the current one."""
        self._scaler.start()
        try:
            entry = self._registry.get(name)
        except MessagingEntityNotFoundError:
            return None
        return entry.pmap if entry.incarnation == incarnation else None

    async def ping(self) -> str:
        self._scaler.start()  # (re)started lazily: the actor may have restarted
        self._push_after_restart()
        self._birth.start()
        return self._namespace

    @guarded(MANAGE, lambda: None)
    async def namespace_created(self) -> float:
        """When the namespace was created (epoch seconds): its registry's first start, kept
        with a ``storage_path`` (logged before it is answered)."""
        created = self._registry.created_at
        assert created is not None  # set in __init__
        await self._birth.written()
        return created

    def _route(self, entry: EntityEntry) -> Route:
        handles = self._handles[entry.properties.name.lower()]
        by_id = tuple(handles.get(pid) for pid in range(max(handles) + 1))
        return Route(
            entry.properties,
            entry.incarnation,
            by_id,
            entry.created_at,
            entry.updated_at,
            entry.pmap,
        )

    @guarded(MANAGE, lambda props: props.name)
    async def create_queue(self, properties: QueueProperties) -> Route:
        self._scaler.start()  # (re)started lazily: the actor may have restarted
        if is_subscription(properties.name):
            raise InvalidArgumentError(
                "a queue name may not contain '/Subscriptions/' (subscriptions' paths)",
                properties.name,
                "name",
            )
        self._check_forwarding(properties)
        entry = self._registry.create(properties)
        handles = self._partition_actors(entry)
        self._handles[properties.name.lower()] = handles
        try:
            await asyncio.gather(*(self._in(h).ready.remote() for h in handles.values()))
            await self._persist(("put", entry))
        except Exception:
            self._registry.delete(properties.name)
            del self._handles[properties.name.lower()]
            for h in handles.values():
                ray.kill(h, no_restart=True)
            await self._delete_storage(entry)
            raise
        return self._route(entry)

    async def _kill_deleted(self, handles: Iterable[Any]) -> None:
        """Kill the actors of a deleted entity, each once it refuses calls (``mark_deleted``):
        ``ray.kill`` alone returns before the process is gone, and a sender holding the old
        handle could meanwhile have a message acknowledged into the deleted entity. An actor
        that does not answer within ``MARK_DELETED_TIMEOUT_S`` (dead, restarting) is killed
        all the same: whatever it answers from then on is nobody's."""
        handles = list(handles)
        marks = asyncio.gather(
            *(self._in(h).mark_deleted.remote() for h in handles), return_exceptions=True
        )
        try:
            for result in await asyncio.wait_for(marks, MARK_DELETED_TIMEOUT_S):
                if isinstance(result, BaseException):
                    _log.info("an actor of a deleted entity did not mark itself: %r", result)
        except asyncio.TimeoutError:
            _log.warning("actors of a deleted entity did not answer in time; killed anyway")
        for handle in handles:
            ray.kill(handle, no_restart=True)

    async def _delete_storage(self, entry: EntityEntry) -> None:
        if self._storage_path is None:
            return
        dirs = entity_storage_dirs(self._namespace, entry.properties.name, entry.incarnation)
        try:
            fs, path = open_storage(self._storage_path, *dirs)
            await asyncio.to_thread(fs.delete_dir, path)
            parent = path.rsplit("/", 1)[0]  # the entity's folder, if no incarnation is left
            if not await asyncio.to_thread(fs.get_file_info, pafs.FileSelector(parent)):
                await asyncio.to_thread(fs.delete_dir, parent)
        except Exception as exc:  # already gone, or storage unreachable: leave it
            _log.info("could not delete storage of %s: %s", entry.properties.name, exc)

    @guarded(ANY, lambda name: name)
    async def route(self, name: str) -> Any:
        """A queue's or subscription's ``Route``, or a topic's ``TopicRoute``."""
        self._scaler.start()
        return self._any_route(self._registry.get(name))

    @guarded(ANY, lambda _stamps: None)
    async def routes_changed(
        self, stamps: dict[str, tuple[Any, ...]]
    ) -> dict[str, Route | TopicRoute | None]:
        """The routes a client holds that are out of date, in one call: ``stamps`` maps each
        entity name to the ``route_stamp`` of the client's route; the answer maps those whose
        route differs now to the current one, and those no longer registered to None.

        A namespace-wide call (a client refreshes every route it caches once a second: one
        call for all of them rather than one per entity); clients with a credential, whose
        tokens may each cover one entity, ask ``route`` per entity instead.
        """
        self._scaler.start()
        changed: dict[str, Route | TopicRoute | None] = {}
        for name, stamp in stamps.items():
            try:
                route = self._any_route(self._registry.get(name))
            except MessagingEntityNotFoundError:
                changed[name] = None
                continue
            if route_stamp(route) != tuple(stamp):
                changed[name] = route
        return changed

    def _any_route(self, entry: EntityEntry) -> Route | TopicRoute:
        if entry.kind == "topic":
            return TopicRoute(
                entry.properties,
                entry.incarnation,
                self._routers[entry.properties.name.lower()],
                entry.created_at,
                entry.updated_at,
            )
        return self._route(entry)

    @guarded(MANAGE, lambda: None)
    async def list_queues(self) -> list[Route]:
        self._scaler.start()  # (re)started lazily: the actor may have restarted
        return [self._route(e) for e in self._registry.list() if e.kind == "queue"]

    @guarded(MANAGE, lambda props: props.name)
    async def update_queue(self, properties: QueueProperties) -> Route:
        """Change settings. A new ``partition_count`` is reached in the background (see
        ``raybus._actors.scaling``); the returned route still shows the map of now."""
        old = self._registry.get(properties.name)
        self._check_forwarding(properties)
        entry = self._registry.update(properties)
        try:
            await self._persist(("put", entry))
        except Exception:
            self._registry.restore([("put", old)])
            raise
        await self._tell_properties(entry.properties)
        self._scaler.start()
        self._scaler.wake(entry.properties.name)
        return self._route(entry)

    async def _tell_properties(self, properties: QueueProperties) -> None:
        """``update_properties`` on every partition of the entity (``tell_each``), holding its
        partition-change lock (``Scaler.holding``), so that no partition is removed under
        the call."""
        async with self._scaler.holding(properties.name):
            handles = list(self._handles[properties.name.lower()].values())
            await tell_each(handles, lambda h: self._in(h).update_properties.remote(properties))

    @guarded(ANY, lambda name, _t: name)
    async def wait_partitions(self, name: str, timeout_s: float) -> Route:
        """Wait until the entity's partitions match its ``partition_count`` (every slot
        balanced, nothing retiring) or ``timeout_s`` passed; the route of then."""
        self._scaler.start()  # (re)started lazily: the actor may have restarted
        deadline = time.monotonic() + timeout_s
        while True:
            entry = self._registry.get(name)
            if self._scaler.converged(entry) or time.monotonic() > deadline:
                return self._route(entry)
            await asyncio.sleep(0.05)

    @guarded(MANAGE, lambda name: name)
    async def delete_queue(self, name: str) -> None:
        await self._delete_queue(name)

    async def _delete_queue(self, name: str) -> None:
        entry = self._registry.get(name)
        if entry.kind != "queue":
            raise MessagingEntityNotFoundError(f"no queue named {name!r}", name)
        self._scaler.stop(entry.properties.name)
        await self._persist(("del", entry.properties.name))
        self._registry.delete(name)
        await self._kill_deleted(self._handles.pop(entry.properties.name.lower()).values())
        await self._delete_storage(entry)
        await self._forget_rules(entry.properties.name)

    @guarded(ANY, lambda name: name)
    async def counts(self, name: str) -> tuple[Route, list[PartitionCounts]]:
        return await self._counts(name)

    @guarded(MANAGE, lambda names: None)
    async def queue_counts(
        self, names: list[str]
    ) -> list[tuple[Route, list[PartitionCounts]] | None]:
        """``counts`` of each queue in ``names``, in one call, for
        ``list_queues_runtime_properties``: 40 queues took 170-184 ms with one call each and
        124-141 ms so (the calls this actor makes to the partitions are most of the rest).
        None for a name that is no queue any more (deleted since it was listed). Needs the
        namespace's Manage right, as ``list_queues`` does."""
        check_names(names, "queue")

        async def queue(name: str) -> tuple[Route, list[PartitionCounts]]:
            if is_subscription(name):  # ``_counts`` serves subscriptions too: not here
                raise MessagingEntityNotFoundError(f"{name!r} is a subscription", name)
            return await self._counts(name)  # raises for a topic or no entity

        return await each_present(names, queue)

    async def _counts(self, name: str) -> tuple[Route, list[PartitionCounts]]:
        self._scaler.start()  # (re)started lazily: the actor may have restarted
        entry = self._registry.get(name)
        if not entry.has_partitions:
            raise MessagingEntityNotFoundError(f"{name!r} is a topic, not a queue", name)
        # Held, no partition change step moves messages or removes a partition meanwhile.
        async with self._scaler.holding(entry.properties.name):
            route = self._route(self._registry.get(name))
            counts = await asyncio.gather(
                *(self._in(h).counts.remote() for _pid, h in route.existing())
            )
        return route, list(counts)

    @guarded(INTERNAL)
    async def delete_idle_queue(self, name: str, incarnation: int, accessed_at: float) -> bool:
        """Delete the queue (or subscription, whose store is a queue's) if it is still that
        incarnation and every partition is idle."""
        try:
            route, counts = await self._counts(name)
        except MessagingEntityNotFoundError:
            return False
        idle = route.properties.auto_delete_on_idle_s
        if route.incarnation != incarnation or any(
            c.accessed_at + idle > time.time() for c in counts
        ):
            return False
        entry = self._registry.get(name)
        if entry.kind == "subscription":
            _log.info("deleting subscription %s: idle since %s", name, accessed_at)
            await self._delete_subscription(entry)
            return True
        _log.info("deleting queue %s: idle since %s", name, accessed_at)
        await self._delete_queue(name)
        return True


def namespace_actor(namespace: str, storage_path: str | None = None) -> Any:
    """Find or create the namespace's registry actor (named, detached, restarts forever).

    ``storage_path`` only matters when the actor is created; an existing one keeps its own.
    """
    cls = ray.remote(NamespaceActor)
    return cls.options(
        name=namespace_actor_name(namespace),
        max_concurrency=1000,
        **BROKER_ACTOR_OPTIONS,
    ).remote(namespace, storage_path)
