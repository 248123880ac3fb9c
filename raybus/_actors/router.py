"""The router of a topic: fans published messages out to the subscriptions' partitions.

One named, detached actor per topic (restarted forever by Ray). The namespace actor pushes it
the topic's settings and every subscription's rules and route (``configure``, versioned);
senders call ``publish`` with many callers' batches at once (coalesced by the client).

A publish evaluates each subscription's compiled rules (``raybus._core.fanout``) and delivers
each subscription partition's copies in one call — never one call per message per
subscription. One delivery is in flight at a time: the publish calls (of any clients) that
arrive meanwhile are delivered together as the next one. A delivery is all-or-nothing across
subscriptions, in one of three ways:

* copies for one subscription partition only: that partition's atomic batch send;
* copies for several, each of a subscription with one partition, each of which that
  subscription would accept, with room for them, in a namespace with a storage path: the
  router's publish log (``raybus._core.publish_log``, ``raybus._actors.deliverer``), one durable
  write and one call per partition;
* otherwise one transaction through the namespace's coordinator (two-phase commit), which
  refuses the whole publish if one subscription refuses its copies.

A crash of the router (or of a subscription partition) in the middle neither loses nor
duplicates a copy — the caller's send either returns (every copy stored) or raises (none
stored, or, if the error is ``ServiceBusConnectionError``/``OperationTimeoutError``,
all-or-nothing with the outcome unknown: a logged publish is finished by the restarted router).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import ray

from .. import _rpc
from .._batching import Coalescer, deliver_apart
from .._core.access import INTERNAL
from .._core.fanout import Target, plan
from .._core.record import WireRecord, from_wire, to_wire, wire_sizes
from .._core.registry import partition_actor_name, router_log_name, topic_schedule_log_name
from .._core.sendable import check_sendable
from .._core.wire import INLINE_BYTES, join_groups, send_args
from .._models import MAX_DURATION
from .._topic_models import TopicProperties
from ..auth import AccessRights
from ..exceptions import (
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    PartitionMovedError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusServerBusyError,
    TransactionAbortedError,
)
from .access import BROKER_ACTOR_OPTIONS, Guarded, guarded, internal, named_actor
from .coordinator import CoordinatorCommit
from .deliverer import Deliverer
from .self_call import call_self_until_answered
from .topic_scheduler import TopicScheduler

__all__ = ["RouterActor", "router_actor", "router_actor_name"]

_log = logging.getLogger("raybus.router")
_ROUTE_RETRIES = 5
# Publish calls combined into one delivery at most (each up to a client's coalesced batch).
_COMBINE_CALLS = 64


def router_actor_name(namespace: str, topic: str, incarnation: int) -> str:
    return f"raybus/{namespace}/topic/{topic.lower()}/{incarnation}/router"


def _later(rec: Any, now: float) -> bool:
    """Whether ``rec`` is scheduled for after ``now`` (the topic holds it until then)."""
    return (rec.scheduled_enqueue_time or 0.0) > now


class RouterActor(Guarded):
    """Fan-out for one topic (see the module docstring)."""

    def __init__(
        self,
        namespace: str,
        topic: TopicProperties,
        storage_path: str | None,
        incarnation: int = 0,
    ) -> None:
        self._namespace = namespace
        self._storage_path = storage_path
        self._props = topic
        self._version = -1
        self._targets: list[Target] = []
        self._routes: dict[str, Any] = {}  # subscription path -> its Route
        self._turn = 0
        self._coordinator = CoordinatorCommit(namespace, storage_path)
        # One delivery in flight; the publishes arriving meanwhile go together as the next.
        self._combiner: Coalescer[list[Any], None] = Coalescer(
            self._deliver_combined, max_batch=_COMBINE_CALLS
        )
        self.published = 0
        self.copies = 0
        # When the topic was last used (publishes, schedules, settings and subscription
        # changes), for auto_delete_on_idle; a restart counts as use (``_idle_loop``).
        self.accessed_at = time.time()
        self._incarnation = incarnation
        self._idle_task: asyncio.Task[None] | None = None
        self._deliverer = Deliverer(
            namespace,
            storage_path,
            router_log_name(topic.name, incarnation),
            router_actor_name(namespace, topic.name, incarnation),
            topic.name,
        )
        self._scheduler = TopicScheduler(
            namespace,
            storage_path,
            topic_schedule_log_name(topic.name, incarnation),
            topic.name,
            self._publish_due,
        )
        # Deliver what a restart left undelivered, time what is scheduled, and run the idle
        # timer, unasked (an idle topic gets no call that would start it).
        idles = topic.auto_delete_on_idle < MAX_DURATION
        if self._deliverer.log.pending or self._scheduler.count or idles:
            actor = ray.get_runtime_context().current_actor
            call_self_until_answered(actor.resume.remote, "router-resume")

    def _access_path(self) -> str:
        return str(self._props.name)

    @guarded(INTERNAL)
    async def configure(
        self, version: int, topic: TopicProperties, subscriptions: list[tuple[Target, Any]]
    ) -> None:
        """Install the topic's settings and subscriptions (ignored if older than the current).
        A change of them counts as use of the topic; the first starts its idle timer."""
        self._configure(version, topic, subscriptions)
        self.accessed_at = time.time()
        self._start_idle()

    def _start_idle(self) -> None:
        if self._idle_task is None:
            self._idle_task = asyncio.get_running_loop().create_task(self._idle_loop())

    def _configure(
        self, version: int, topic: TopicProperties, subscriptions: list[tuple[Target, Any]]
    ) -> None:
        if version < self._version:
            return
        self._version = version
        self._props = topic
        self._targets = [t for t, _route in subscriptions]
        self._routes = {t.path: route for t, route in subscriptions}
        self._deliverer.log.forget_rooms()  # a subscription's size may have changed

    async def _idle_loop(self) -> None:
        """Ask the namespace to delete the topic once it has been idle long enough
        (``auto_delete_on_idle``): no publishes, schedules or changes here, and none of its
        subscriptions used (the namespace checks those)."""
        while True:
            idle = self._props.auto_delete_on_idle
            if idle >= MAX_DURATION:
                await asyncio.sleep(60)
                continue
            wait = self.accessed_at + idle.total_seconds() - time.time()
            if wait > 0:
                await asyncio.sleep(min(wait, 60))
                continue
            try:
                registry = await self._registry()
                await registry.delete_idle_topic.remote(
                    self._props.name, self._incarnation, self.accessed_at
                )
            except Exception:  # the registry may be restarting; try again later
                _log.warning("auto-delete of idle topic %s failed", self._props.name)
            await asyncio.sleep(5)

    @guarded(AccessRights.MANAGE)
    async def stats(self) -> dict[str, int]:
        return {
            "published": self.published,
            "copies": self.copies,
            "subscriptions": len(self._targets),
            "logged": self._deliverer.delivered,
            "undelivered": len(self._deliverer.log.pending),
            "scheduled": self._scheduler.count,
            "scheduled_bytes": self._scheduler.size_in_bytes,
        }

    async def resume(self) -> None:
        """Start delivering what the log holds undelivered, and the timer of the scheduled
        messages (called by the actor itself after a restart). Delivering needs no
        configuration: the log names the partitions. The idle timer starts too; until the
        namespace configures this router again it reads the settings the router was made with
        (the namespace checks the topic's current ones before it deletes anything)."""
        self._deliverer.start_resume(self._replace)
        if self._scheduler.count:
            self._scheduler.start()
        self._start_idle()

    @guarded(AccessRights.SEND)
    async def schedule(self, layout: list[int], *pieces: list[WireRecord]) -> list[int]:
        """Hold one group of messages (as ``publish`` takes groups) until their
        ``scheduled_enqueue_time``, then publish them (``raybus._core.topic_schedule``); their
        sequence numbers, of the topic's own. The topic's checks first: a refused schedule
        stores nothing."""
        self.accessed_at = time.time()
        (group,) = join_groups(layout, pieces)
        records = from_wire(group)
        await self._admit(records)
        return await self._scheduler.schedule(records)

    @guarded(AccessRights.SEND)
    async def cancel_scheduled(self, sequence_numbers: list[int]) -> None:
        """Cancel scheduled messages, all or none (``MessageNotFoundError`` names those not
        scheduled, any more, here)."""
        await self._scheduler.cancel(list(sequence_numbers))

    async def _publish_due(self, records: list[Any]) -> None:
        """A scheduled message whose time has come: published as a publish call is."""
        await self._admit(records)
        await self._combiner.submit(records)

    async def _admit(self, records: Sequence[Any]) -> None:
        """The topic's checks on one group (``_check``), with the configuration a restarted
        router fetches first; raises the refusal."""
        await self._ensure_configured()
        self._check(records)

    def _check(self, records: Sequence[Any]) -> None:
        props = self._props
        if not props.status.can_send:
            raise MessagingEntityDisabledError(
                f"the topic is {props.status.value}; sending is not allowed",
                props.name,
                props.status.value,
            )
        limit = props.max_message_size_in_kilobytes * 1024
        for rec in records:
            if rec.size > limit:
                raise MessageSizeExceededError(
                    f"message of {rec.size} bytes exceeds the topic's limit of {limit} bytes",
                    props.name,
                    rec.size,
                    limit,
                )

    async def _ensure_configured(self) -> None:
        """A restarted router has lost its configuration: fetch it before routing anything
        (routing with none would drop every copy)."""
        if self._version >= 0:
            return
        registry = await self._registry()
        version, topic, subscriptions = await registry.router_config.remote(self._props.name)
        self._configure(version, topic, subscriptions)

    @guarded(AccessRights.SEND, lane=True)
    async def publish(
        self, layout: list[int], *pieces: list[WireRecord]
    ) -> list[ServiceBusError | None]:
        """Deliver each group's copies; ``None`` or the error per group (one error for all
        the groups of the call when delivery itself failed). The groups arrive as their
        lengths and their rows in pieces (``raybus._core.wire``). A group with messages
        whose scheduled time is to come is published after the others, those messages held
        in the topic's schedule (``_publish_holding``)."""
        now = self.accessed_at = time.time()
        groups = join_groups(layout, pieces)
        await self._ensure_configured()
        results: list[ServiceBusError | None] = []
        records = []
        holding: list[tuple[int, list[Any]]] = []  # groups with messages scheduled later
        for group in groups:
            recs = from_wire(group)
            try:
                self._check(recs)
            except ServiceBusError as exc:
                results.append(exc)
                continue
            if any(_later(r, now) for r in recs):
                holding.append((len(results), recs))
            else:
                records.extend(recs)
            results.append(None)
        if records:
            try:
                await self._combiner.submit(records)
            except ServiceBusError as exc:
                results = [exc if r is None else r for r in results]
                holding = []
        if holding:  # at once: their schedules and deliveries are batched by the log and combiner
            held = await asyncio.gather(*(self._publish_holding(recs, now) for _i, recs in holding))
            for (index, _recs), result in zip(holding, held, strict=True):
                results[index] = result
        return results

    async def _publish_holding(self, recs: list[Any], now: float) -> ServiceBusError | None:
        """A group sent with messages whose ``scheduled_enqueue_time_utc`` is to come: those
        wait in the topic's schedule, as ``schedule_messages``' do (Service Bus keeps them in
        the topic: each subscription sees a message at its time, through its rules as they
        stand then, and neither its peek nor its counts show it before); the others are
        delivered now. All or none: a refused delivery cancels the group's schedule."""
        later = [r for r in recs if _later(r, now)]
        at_once = [r for r in recs if not _later(r, now)]
        try:
            seqs = await self._scheduler.schedule(later)
        except ServiceBusError as exc:
            return exc
        if at_once:
            try:
                await self._combiner.submit(at_once)
            except ServiceBusError as exc:
                try:
                    await self._scheduler.cancel(seqs)
                except ServiceBusError as cancel_exc:  # due already, or the log failed
                    _log.warning("a refused send's scheduled messages stay: %r", cancel_exc)
                return exc
        return None

    async def _deliver_combined(self, calls: list[list[Any]]) -> list[ServiceBusError | None]:
        """Deliver the records of every publish call waiting now as ONE delivery (one
        transaction: per-transaction costs — a prepare and a commit call and two durable
        writes on every subscription partition, the coordinator's calls and its decision —
        were most of a publish's cost, paid once per client call before).

        A refusal (the transaction rolled back, or one partition refused: nothing stored)
        must not fail another caller's publish that alone would have been accepted, so the
        calls are then delivered in halves, recursively, down to the refused calls alone
        (``deliver_apart``: k refused calls among N cost about 2k·log2(N) more deliveries, not
        N). An unknown outcome (``ServiceBusConnectionError``, ``OperationTimeoutError``) is
        reported to every call of that delivery, never retried: it may have committed. So is
        ``ServiceBusServerBusyError`` (a subscription partition has not taken an earlier
        publish: every call would be refused alike).
        """

        async def deliver(part: Sequence[list[Any]]) -> None:
            records = [r for call in part for r in call]
            await self._deliver(records)
            self.published += len(records)

        return await deliver_apart(
            calls,
            deliver,
            refused=ServiceBusError,
            unknown=(ServiceBusConnectionError, OperationTimeoutError),
            busy=(ServiceBusServerBusyError,),
        )

    async def _deliver(self, records: list[Any]) -> None:
        copies = plan(self._targets, records)
        for attempt in range(_ROUTE_RETRIES):
            shares = self._shares(copies)
            try:
                await self._send(shares)
                self.copies += sum(len(c) for c in copies.values())
                return
            except (PartitionMovedError, TransactionAbortedError) as exc:
                cause = exc.cause if isinstance(exc, TransactionAbortedError) else exc
                moved = isinstance(cause, PartitionMovedError | MessagingEntityNotFoundError)
                if attempt == _ROUTE_RETRIES - 1 or not moved:
                    raise self._as_sent(exc) from None
                await self._refresh(copies)

    def _as_sent(self, exc: ServiceBusError) -> ServiceBusError:
        """The error a send raises: a subscription's refusal as its own type (a full store
        raises ``ServiceBusQuotaExceededError``, as a full queue does), not as the internal
        transaction's ``TransactionAbortedError``."""
        cause = exc.cause if isinstance(exc, TransactionAbortedError) else None
        if not isinstance(cause, ServiceBusError) or isinstance(cause, TransactionAbortedError):
            return exc
        # The same error, naming the topic the caller sent to (entity is the second argument).
        return type(cause)(cause.args[0], self._props.name, *cause.args[2:])

    def _shares(self, copies: dict[str, list[Any]]) -> dict[tuple[str, int], list[Any]]:
        """Copies per (subscription path, partition id), placed as a sender places them."""
        shares: dict[tuple[str, int], list[Any]] = {}
        for path, recs in copies.items():
            route = self._routes[path]
            if route.single:
                shares[(path, 0)] = list(recs)
                continue
            dedup = route.properties.requires_duplicate_detection
            for pid, idxs in route.pmap.place(recs, dedup, lambda r=route: self._spread(r)).items():
                shares[(path, pid)] = [recs[i] for i in idxs]
        return shares

    def _spread(self, route: Any) -> int:
        """The live partition unkeyed copies go to (rotating)."""
        live = route.pmap.live
        self._turn += 1
        return int(live[self._turn % len(live)])

    async def _send(self, shares: dict[tuple[str, int], list[Any]]) -> None:
        if not shares:  # no subscription selected any of the messages
            return
        if len(shares) == 1:  # one partition's batch send is atomic by itself
            (((path, pid), recs),) = shares.items()
            handle = self._routes[path].handle(pid)
            sender = internal(handle, self._namespace).send_groups
            (result,) = await _rpc.call(path, sender, *send_args([recs]))
            if isinstance(result, BaseException):
                raise result
            return
        targets = self._logged_targets(shares) if self._deliverer.enabled else None
        if targets is not None and await self._deliverer.fits(targets):
            await self._deliverer.deliver(targets, self._replace)
            return
        # A share too big to travel inline (raybus._core.wire) travels as an object ref: the
        # coordinator passes it on to the participant untouched (Ray resolves it there),
        # instead of deserialising every copy and serialising it again per participant; shares
        # of the same copies (subscriptions whose rules select the same messages unchanged)
        # are put once. A smaller share travels inline: putting it in the object store and
        # fetching it in every participant cost more than copying it (a one-message publish
        # to 10 subscriptions paid a put and 10 fetches).
        participants: list[tuple[Any, ...]] = []
        refs: dict[tuple[int, ...], Any] = {}
        for (path, pid), recs in shares.items():
            route = self._routes[path]
            name = partition_actor_name(self._namespace, path, route.incarnation, pid)
            key = tuple(map(id, recs))  # the records outlive this call: ids are stable
            ref = refs.get(key)
            if ref is None:
                rows = to_wire(recs)
                inline = sum(wire_sizes(rows)) <= INLINE_BYTES
                ref = refs[key] = rows if inline else ray.put(rows)
            participants.append((name, path, ref, [], []))
        commit = await self._coordinator.method()
        await _rpc.call(self._props.name, commit, uuid.uuid4().hex, participants)

    def _logged_targets(
        self, shares: dict[tuple[str, int], list[Any]]
    ) -> list[tuple[str, str, list[Any]]] | None:
        """The shares by partition name, if the publish may go through the publish log
        (``raybus._core.publish_log``): only subscriptions of one partition, and copies each
        would accept as a send (else the two-phase commit refuses them as a send would)."""
        targets = []
        for (path, pid), recs in shares.items():
            route = self._routes[path]
            if not route.single:
                return None
            try:
                check_sendable(path, route.properties, recs)
            except ServiceBusError:
                return None
            name = partition_actor_name(self._namespace, path, route.incarnation, pid)
            targets.append((name, path, recs))
        return targets

    async def _registry(self) -> Any:
        """The namespace actor, with the broker's own token (routes and configuration)."""
        from .namespace import namespace_actor_name

        return internal(await named_actor(namespace_actor_name(self._namespace)), self._namespace)

    async def _replace(self, path: str, records: list[Any]) -> list[tuple[str, list[Any]]]:
        """Place one subscription's copies again on its refreshed route: (partition name,
        copies) each. Raises the error if the route cannot be had."""
        route = await _rpc.call(path, (await self._registry()).route, path)
        self._routes[path] = route
        placed = self._shares({path: records})
        return [
            (partition_actor_name(self._namespace, p, route.incarnation, pid), recs)
            for (p, pid), recs in placed.items()
        ]

    async def _refresh(self, copies: dict[str, list[Any]]) -> None:
        registry = await self._registry()
        for path in copies:
            try:
                self._routes[path] = await registry.route.remote(path)
            except Exception as exc:  # deleted meanwhile: the next publish has no such target
                _log.info("route of %s not refreshed: %s", path, exc)


def router_actor(
    namespace: str, topic: TopicProperties, incarnation: int, storage_path: str | None
) -> Any:
    """Create (or find) a topic's router actor."""
    cls = ray.remote(RouterActor)
    return cls.options(
        name=router_actor_name(namespace, topic.name, incarnation),
        max_concurrency=1000,
        **BROKER_ACTOR_OPTIONS,
    ).remote(namespace, topic, storage_path, incarnation)
