"""Joining Ray and a raybus namespace; the per-client cache of routes and coalescers.

``ensure_ray`` connects this process to Ray once. ``Connection`` is what every client object
of one ``ServiceBusClient`` shares: the namespace actor's handle, the routes it resolved, and
one send/settle coalescer per partition actor, so concurrent calls from one client share
actor calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import ray

from . import _rpc
from ._actors.access import AuthedHandle
from ._actors.namespace import Route, namespace_actor, route_stamp
from ._batching import Coalescer
from ._core.partition import SettleOp
from ._core.record import SCHEDULED, MessageRecord
from ._core.wire import send_args
from ._retry import RetryPolicy
from .auth import CredentialLike, as_credential, resource_path
from .exceptions import (
    InvalidArgumentError,
    MessageNotFoundError,
    MessagesMovedError,
    MessagingEntityNotFoundError,
    ServiceBusCommunicationError,
    ServiceBusError,
)

__all__ = ["Connection", "ensure_ray"]

_log = logging.getLogger("raybus.connection")

SettleResults = list[ServiceBusError | None]
_init_lock = threading.Lock()
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,49}$")

# Embedded clusters get a small object store: messages are small and live in actor memory.
EMBEDDED_OBJECT_STORE_BYTES = 256 * 1024 * 1024


def ensure_ray(address: str | None = None) -> None:
    """Connect this process to Ray, once.

    ``address`` (or ``RAYBUS_ADDRESS``/``RAY_ADDRESS``) joins that cluster. Without one, join
    the Ray cluster already running on this machine, or start an embedded single-machine one.
    An embedded cluster listens on 127.0.0.1 only (it serves this machine alone). Raises
    ``ServiceBusCommunicationError`` (a ``ServiceBusConnectionError``) when Ray cannot be
    joined or started.
    """
    try:
        _ensure_ray(address)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        raise ServiceBusCommunicationError(
            f"could not join or start Ray ({address or 'local'}): {exc}"
        ) from None


def _ensure_ray(address: str | None) -> None:
    with _init_lock:
        if ray.is_initialized():
            return
        address = address or os.environ.get("RAYBUS_ADDRESS") or os.environ.get("RAY_ADDRESS")
        common: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
        if address:
            ray.init(address=address, **common)
            return
        try:
            ray.init(address="auto", **common)
            return
        except ConnectionError:
            pass
        if "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ:
            # Ray read this variable when it was imported: set its constant too, so the
            # embedded cluster listens on 127.0.0.1 only.
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            from ray._private import ray_constants

            ray_constants.ENABLE_RAY_CLUSTER = False
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(
            address="local",
            include_dashboard=False,
            object_store_memory=EMBEDDED_OBJECT_STORE_BYTES,
            **common,
        )


MEMORY = "memory://"
DEFAULT_STORAGE_PATH = os.path.join("~", ".raybus", "storage")


def resolve_storage_path(storage_path: str | None) -> str | None:
    """Where a namespace keeps its data: ``storage_path``, else ``RAYBUS_STORAGE_PATH``, else
    ``~/.raybus/storage`` (one machine; give a shared mount or an object-store URI on a
    multi-node cluster). ``"memory://"`` keeps the namespace in memory only (returns None).
    """
    path = storage_path if storage_path is not None else os.environ.get("RAYBUS_STORAGE_PATH")
    if path is None:
        path = DEFAULT_STORAGE_PATH
    if not isinstance(path, str) or not path:
        raise InvalidArgumentError(
            f"storage_path must be a directory or URI, not {path!r}", None, "storage_path"
        )
    if path == MEMORY:
        return None
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


# A cached route older than this is refreshed in the background (the partition map may have
# changed: receivers must learn of new partitions even if no send is ever redirected).
ROUTE_TTL_S = 1.0
ROUTE_RETRIES = 5
# Send calls one client has under way to one partition at a time (``raybus._batching``).
SENDS_IN_FLIGHT = 2
# A deferred or scheduled message that a partition change moves between a client's lookup and
# its call is followed to where it went, up to this many times (``Connection.follow_moves``).
MOVE_HOPS = 3
T = TypeVar("T")


class Connection:
    """The shared state of one client: namespace actor, routes, coalescers.

    Routes are cached per entity name and refreshed in the background once older than
    ``ROUTE_TTL_S`` (the stale one is used meanwhile: a partition that moved keys away
    redirects, and one that was removed is only removed once empty). The routes due are
    checked together, one namespace call for all of them (``NamespaceActor.routes_changed``:
    a client of a topic with 100 subscriptions otherwise asks 100 times a second); with a
    credential, whose tokens may each cover one entity, each is fetched on its own. ``forget``
    drops one after the entity turned out to be deleted, so the next use resolves it again.
    """

    def __init__(
        self,
        namespace: str = "default",
        address: str | None = None,
        storage_path: str | None = None,
        credential: CredentialLike | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not isinstance(namespace, str) or not _NAMESPACE_RE.match(namespace):
            raise InvalidArgumentError(
                f"namespace {namespace!r} must be 1-50 letters, digits, '-' or '_', starting "
                "with a letter or digit",
                None,
                "namespace",
            )
        ensure_ray(address)
        self.namespace = namespace
        self.storage_path = resolve_storage_path(storage_path)
        self.credential = as_credential(credential)
        self.retry = retry or RetryPolicy()  # the client's retry options (``raybus._retry``)
        self._registry = namespace_actor(namespace, self.storage_path)
        self.registry = self.authed(self._registry, None)
        self._coordinator: Any = None
        self._routes: dict[str, Route] = {}
        self._fetched: dict[str, float] = {}
        self._refreshing: dict[str, asyncio.Task[Any]] = {}
        self._due: dict[str, str] = {}  # key -> name: routes to check in the next batch
        self._checking: asyncio.Task[None] | None = None
        self._senders: dict[Any, Coalescer[Sequence[MessageRecord], list[int]]] = {}
        self._settlers: dict[Any, Coalescer[list[SettleOp], SettleResults]] = {}
        self._publishers: dict[Any, Coalescer[Sequence[MessageRecord], None]] = {}

    @property
    def coordinator(self) -> Any:
        """The namespace's transaction coordinator (created on first use)."""
        if self._coordinator is None:
            from ._actors.coordinator import coordinator_actor

            self._coordinator = self.authed(
                coordinator_actor(self.namespace, self.storage_path), None
            )
        return self._coordinator

    def authed(self, handle: Any, entity: str | None) -> Any:
        """``handle`` presenting this client's token for ``entity`` (None: the namespace) with
        every call; the handle itself when the client has no credential."""
        credential = self.credential
        if credential is None or handle is None:
            return handle
        path = resource_path(entity or "/")
        return AuthedHandle(handle, lambda: credential.token_for(path))

    def registry_for(self, entity: str | None) -> Any:
        """The namespace actor, presenting the token for ``entity``."""
        return self.authed(self._registry, entity)

    def _authed_route(self, route: Any, name: str) -> Any:
        if self.credential is None:
            return route
        if isinstance(route, Route):
            return dataclasses.replace(
                route, partitions=tuple(self.authed(h, name) for h in route.partitions)
            )
        return dataclasses.replace(route, router=self.authed(route.router, name))

    async def route(self, name: str, *, refresh: bool = False) -> Route:
        key = name.lower() if isinstance(name, str) else name
        route = None if refresh else self._routes.get(key)
        if route is None:
            return await self._fetch(name, key)
        if self._stale(key):
            if self.credential is None:
                self._due[key] = name
                if self._checking is None or self._checking.done():
                    self._checking = asyncio.ensure_future(self._check_due())
            else:
                task = self._refreshing.get(key)
                if task is None or task.done():
                    self._refreshing[key] = asyncio.ensure_future(self._fetch(name, key))
        return route

    async def _check_due(self) -> None:
        """Check every route due in one namespace call (and again for those that fell due
        meanwhile); keep those unchanged, take the new ones, forget those whose entity is gone
        (their next use resolves them again)."""
        await asyncio.sleep(0)  # let the callers of this turn of the loop add theirs
        while self._due:
            due, self._due = self._due, {}
            stamps = {due[k]: route_stamp(r) for k in due if (r := self._routes.get(k)) is not None}
            if not stamps:
                continue
            try:
                changed = await _rpc.call(
                    None, self.registry.routes_changed, stamps, retries=_rpc.READ_RETRIES
                )
            except ServiceBusError as exc:  # the stale routes serve on; the next use asks again
                _log.info("could not check %d routes: %s", len(stamps), exc)
                return
            now = time.monotonic()
            for name in stamps:
                key = name.lower()
                if name not in changed:
                    self._fetched[key] = now
                elif changed[name] is None:
                    self.forget(name)
                else:
                    self._store(key, changed[name])
            # Those used again while this call was out are fresh now: not due any more.
            self._due = {k: n for k, n in self._due.items() if self._stale(k)}

    async def _fetch(self, name: str, key: str) -> Route:
        route: Route = self._authed_route(
            await _rpc.call(None, self.registry_for(name).route, name, retries=_rpc.READ_RETRIES),
            name,
        )
        self._store(key, route)
        return route

    def _store(self, key: str, route: Any) -> None:
        """Cache ``route`` unless the one cached is of the same incarnation with a newer map
        (two fetches crossed)."""
        old = self._routes.get(key)
        old_map, new_map = getattr(old, "pmap", None), getattr(route, "pmap", None)
        if (
            old is None
            or old.incarnation != route.incarnation
            or old_map is None
            or new_map is None
            or old_map.version <= new_map.version
        ):
            self._routes[key] = route
            self._fetched[key] = time.monotonic()

    def cached_route(self, name: str) -> Route | None:
        """The route if resolved and fresh (safe to call from any thread); None sends the
        caller to the event-loop path, which refreshes it."""
        key = name.lower()
        return None if self._stale(key) else self._routes.get(key)

    def known_current(self, name: str) -> float:
        """When (``time.monotonic``) the route cached for ``name`` was fetched or found
        current; 0 if none is."""
        return self._fetched.get(name.lower(), 0.0)

    def _stale(self, key: str) -> bool:
        """Whether the route cached under ``key`` (if any) is due for a check."""
        return time.monotonic() - self.known_current(key) > ROUTE_TTL_S

    async def locate(
        self, route: Route, seqs: list[int], state: int | None = None, dead_letter: bool = False
    ) -> tuple[dict[int, list[int]], list[int]]:
        """Which partition holds each (deferred or scheduled) sequence number (of the
        dead-letter sub-queue with ``dead_letter``): the one its top bits name, unless a
        partition change moved it (then the one that adopted it).

        Returns (numbers per partition, numbers found nowhere (in ``state``, when given));
        those found nowhere are also given to the partition they name, which reports them.
        A message a partition change moved is given to its new partition, which may be one
        this route does not have yet: then ``MessagingEntityNotFoundError``, which
        ``retrying`` answers with a fresh route.
        """
        by_partition: dict[int, list[int]] = {}
        parts = route.existing()
        missing: list[int] = []
        if len(parts) > 1 or state is not None:
            name = route.properties.name
            if state == SCHEDULED and not dead_letter:  # a sender's cancel: the Send right
                asks = (_rpc.call(name, h.locate_scheduled, seqs) for _pid, h in parts)
            else:
                asks = (_rpc.call(name, h.locate, seqs, state, dead_letter) for _pid, h in parts)
            found = await asyncio.gather(*asks)
            where: dict[int, int] = {}
            moved: dict[int, int] = {}
            for (pid, _h), (held, gone) in zip(parts, found, strict=True):
                where.update(dict.fromkeys(held, pid))
                moved.update(gone)
            for seq, target in moved.items():  # moved by a partition change (see the actor)
                if seq in where:
                    continue
                if route.handle(target) is None:  # a partition this route predates
                    raise MessagingEntityNotFoundError(
                        f"partition {target} is not in this client's map yet", name
                    )
                where[seq] = target
        else:
            where = dict.fromkeys(seqs, parts[0][0])
        for seq in seqs:
            if seq not in where:
                missing.append(seq)
            pid = where.get(seq, seq >> 48)
            if route.handle(pid) is None:
                pid = parts[0][0]
            by_partition.setdefault(pid, []).append(seq)
        return by_partition, missing

    async def recheck(self, name: str) -> bool:
        """After a partition actor turned out to be gone: True if the entity still exists (a
        partition change removed that partition; the route is now fresh), False if the entity
        was deleted (the route is forgotten; the caller raises)."""
        key = name.lower()
        old = self._routes.get(key)
        try:
            new = await self._fetch(name, key)
        except MessagingEntityNotFoundError:
            self.forget(name)
            return False
        return old is None or new.incarnation == old.incarnation

    async def retrying(self, name: str, op: Callable[[], Awaitable[T]]) -> T:
        """Run ``op`` (which must be safe to repeat), again with a fresh route when a
        partition it reached had been removed by a partition change."""
        for attempt in range(ROUTE_RETRIES):
            try:
                return await op()
            except MessagingEntityNotFoundError:
                if attempt == ROUTE_RETRIES - 1 or not await self.recheck(name):
                    raise
        raise AssertionError("unreachable")

    async def follow_moves(
        self,
        name: str,
        pid: int,
        share: list[int],
        call: Callable[[int, list[int]], Awaitable[T]],
        hops: int = MOVE_HOPS,
    ) -> list[T | Exception]:
        """``call(pid, share)`` for sequence numbers of deferred or scheduled messages, made
        again where partition ``pid`` answers that a partition change moved some of them
        away (``MessagesMovedError``, which names where; the partition did nothing, as it
        answers all or none): the moved numbers go to their new partitions, the rest back to
        ``pid``. Up to ``hops`` times; past them, the last ``MessagesMovedError`` (a
        ``MessageNotFoundError``) stands. A new partition missing from this client's map
        fetches a fresh one first; a share whose partition that map still lacks (a scale-down
        removed it meanwhile) is not found, and every share is ``MessagingEntityNotFoundError``
        if the entity turns out deleted.

        Returns the outcome of each call made last, in no set order: its result, or the
        error it raised (the caller decides what a failed share means: all or none for a
        deferred receive, the share alone for a cancel)."""
        try:
            return [await call(pid, share)]
        except MessagesMovedError as moved:
            if hops == 0:
                return [moved]
            shares: dict[int, list[int]] = {}
            for seq in share:
                shares.setdefault(moved.moved.get(seq, pid), []).append(seq)
            route = await self.route(name)
            if any(route.handle(target) is None for target in shares):
                if not await self.recheck(name):
                    return [MessagingEntityNotFoundError(f"{name} was deleted", name)]
                route = await self.route(name)
            gone = [t for t in shares if route.handle(t) is None]
            outcomes = await asyncio.gather(
                *(
                    self.follow_moves(name, t, ss, call, hops - 1)
                    for t, ss in shares.items()
                    if t not in gone
                )
            )
            return [
                *(outcome for each in outcomes for outcome in each),
                *(
                    MessageNotFoundError(
                        f"no message has sequence number(s) {shares[t]}: partition {t}, "
                        "where they were to be found, was removed by a partition change",
                        name,
                        shares[t],
                    )
                    for t in gone
                ),
            ]
        except Exception as exc:
            return [exc]

    def forget(self, name: str) -> None:
        self._routes.pop(name.lower(), None)
        self._fetched.pop(name.lower(), None)

    def sender(self, entity: str, actor: Any) -> Coalescer[Sequence[MessageRecord], list[int]]:
        """The coalescer of sends to one partition actor."""
        key = actor._actor_id
        co = self._senders.get(key)
        if co is None:
            # Looked up once: each read of a handle's method makes a new method object (two,
            # through an ``AuthedHandle``), and a dispatch would read it twice. The token is
            # still asked for at each call.
            method = actor.send_groups

            async def dispatch(
                groups: list[Sequence[MessageRecord]],
            ) -> list[list[int] | ServiceBusError]:
                result: list[list[int] | ServiceBusError] = await _rpc.call(
                    entity, method, *send_args(groups)
                )
                return result

            co = self._senders[key] = Coalescer(
                dispatch,
                max_inflight=SENDS_IN_FLIGHT,
                ordered=lambda: _rpc.over_lane(method),
            )
        return co

    def publisher(self, entity: str, router: Any) -> Coalescer[Sequence[MessageRecord], None]:
        """The coalescer of publishes to one topic's router."""
        key = router._actor_id
        co = self._publishers.get(key)
        if co is None:
            publish = router.publish  # looked up once, as ``sender``'s method

            async def dispatch(
                groups: list[Sequence[MessageRecord]],
            ) -> list[ServiceBusError | None]:
                result: list[ServiceBusError | None] = await _rpc.call(
                    entity, publish, *send_args(groups)
                )
                return result

            co = self._publishers[key] = Coalescer(dispatch)
        return co

    def settler(
        self, entity: str, actor: Any, *, waited: bool = True
    ) -> Coalescer[list[SettleOp], SettleResults]:
        """The coalescer of settlements to one partition actor.

        A request is a list of ops (one future for many messages); its result lists ``None``
        or the broker's error per op, in order. ``waited=False``: settlements whose callers
        returned without waiting for the answer, in calls of their own that tell the
        partition so (their flush may wait for another's; ``raybus._core.committer``).
        """
        key = (actor._actor_id, waited)
        co = self._settlers.get(key)
        if co is None:
            settle = actor.settle  # looked up once, as ``sender``'s method

            async def dispatch(groups: list[list[SettleOp]]) -> list[SettleResults]:
                wire = [op.to_wire() for group in groups for op in group]
                flat: SettleResults = await _rpc.call(entity, settle, wire, waited)
                out, start = [], 0
                for group in groups:
                    out.append(flat[start : start + len(group)])
                    start += len(group)
                return out

            co = self._settlers[key] = Coalescer(dispatch)
        return co
