"""Auto-forwarding: a partition whose entity has ``forward_to`` moves its messages onward.

Runs inside the source partition actor while its entity forwards (``forward_to`` for the main
queue, ``forward_dead_lettered_messages_to`` for the dead-letter sub-queue). Each step locks up
to ``BATCH`` available messages and moves them in one two-phase-commit transaction through the
namespace's coordinator: *complete on the source* and *send to the destination* (a queue's
partitions, or a topic's subscriptions through the topic's rules) commit together, so a crash
at any point neither loses nor duplicates a message.

Service Bus's rules: a message forwarded more than ``MAX_HOPS`` times is dead-lettered at the
source with ``MaxTransferHopCountExceeded``; a destination that is missing, disabled, full, or
refuses the message otherwise dead-letters it at the source (reason: the error's type), and
so does a session-enabled destination queue a message without a session id ("Session ID is
null"); a forwarded dead letter carries ``dead_letter_source`` (the source's path) and keeps
its reason (a dead letter without a session id goes on: the source cannot dead-letter it
again, and the destination dead-letters it there). Transient failures
(an actor restarting) give the messages back and retry shortly.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from .. import _rpc
from .._core.fanout import plan
from .._core.record import SESSION_ID_IS_NULL, MessageRecord, snapshot, to_wire
from .._core.registry import partition_actor_name
from .._core.store import SettleOp
from ..exceptions import (
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    PartitionMovedError,
    ServiceBusConnectionError,
    ServiceBusError,
    TransactionAbortedError,
)

if TYPE_CHECKING:
    from .partition import PartitionActor

from .access import internal, named_actor
from .coordinator import CoordinatorCommit
from .handles import HandleCache

__all__ = ["BATCH", "MAX_HOPS", "Forwarder"]

_log = logging.getLogger("raybus.forward")

BATCH = 100
MAX_HOPS = 4
HOPS_EXCEEDED = "MaxTransferHopCountExceeded"
# A message without a session id, forwarded to a session-enabled queue: dead-lettered at the
# source, with the reason a session queue gives one sent to it.
NO_SESSION_ID = (
    SESSION_ID_IS_NULL,
    "The forwarding destination requires sessions and the message has no session id.",
)


def _transient(cause: BaseException | None) -> bool:
    """A refusal worth retrying: an actor restarting or moving keys, not the destination's
    own verdict. A partition that died for good reads as "deleted" (``raybus._rpc``) but
    restarts here, so it is retried too."""
    if isinstance(cause, ServiceBusConnectionError | OperationTimeoutError | PartitionMovedError):
        return True
    return cause is not None and _rpc.actor_gone(cause)


class _Registry:
    """The namespace actor, looked up once per forwarder rather than once per batch (a named
    actor lookup is a GCS round trip). It restarts under the same handle (``max_restarts=-1``),
    so the handle stays good through restarts; only a namespace deleted and created again has a
    new actor: a call that finds the cached one gone for good drops it and is made once more on
    a fresh lookup. Only for reads (``route``, ``router_config``): the call may run twice."""

    def __init__(self, namespace: str) -> None:
        from .namespace import namespace_actor_name  # import cycle: it imports us

        self._namespace = namespace
        self._name = namespace_actor_name(namespace)
        self._handles: HandleCache[Any] = HandleCache(self._look_up)

    async def _look_up(self, name: str) -> Any:
        return internal(await named_actor(name), self._namespace)

    async def call(self, entity: str, method: str, *args: Any) -> Any:
        for fresh in (self._name not in self._handles, True):
            handle = await self._handles.get(self._name)
            try:
                return await _rpc.call(entity, getattr(handle, method), *args)
            except MessagingEntityNotFoundError as exc:
                if fresh or not _rpc.actor_gone(exc):
                    raise
                _log.info("the namespace actor of %s is gone; looking it up again", entity)
                self._handles.forget(self._name)
        raise AssertionError("unreachable")


class Forwarder:
    """The forwarding loop of one partition actor."""

    def __init__(self, actor: PartitionActor) -> None:
        self._actor = actor
        self._turn = 0
        self._registry = _Registry(actor._namespace)
        self._coordinator = CoordinatorCommit(actor._namespace, actor._storage_path)

    async def run(self) -> None:
        while True:
            props = self._actor._core.properties
            moved = 0
            try:
                if props.forward_to:
                    moved += await self._step(False, props.forward_to)
                if props.forward_dead_lettered_messages_to:
                    moved += await self._step(True, props.forward_dead_lettered_messages_to)
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("forwarding from %s failed; retrying", props.name)
                await asyncio.sleep(1.0)
            if not props.forward_to and not props.forward_dead_lettered_messages_to:
                return  # no longer forwarding (update_properties restarts it if needed)
            if not moved:
                await self._actor._waits.wait(("forward",), 1.0)

    async def _step(self, dead_letter: bool, dest: str) -> int:
        actor = self._actor
        core = await actor._settled_core()
        if not core.properties.status.can_receive:
            return 0
        locked = core.receive(BATCH, dead_letter=dead_letter)
        if not locked:
            return 0
        source = core.entity
        go: list[tuple[MessageRecord, MessageRecord]] = []
        stop: list[MessageRecord] = []
        for rec in locked:
            if rec.transfer_hops >= MAX_HOPS and not dead_letter:
                stop.append(rec)
                continue
            copy = snapshot(rec)
            copy.transfer_hops = rec.transfer_hops + 1
            copy.lock_token, copy.locked_until, copy.state = None, 0.0, 0
            copy.copy_of = None  # a topic copy's identity there, not at the destination
            if dead_letter:
                copy.dead_letter_source = source
            go.append((rec, copy))
        if stop:
            await self._dead_letter(stop, HOPS_EXCEEDED, f"more than {MAX_HOPS} forwarding hops")
        if not go:
            return len(stop)
        try:
            route = await self._registry.call(dest, "route", dest)
            if not dead_letter and _takes_sessions_only(route):
                # Service Bus dead-letters at the source a message without a session id that
                # a session-enabled queue would not take.
                lacking = [(r, c) for r, c in go if c.session_id is None]
                if lacking:
                    await self._dead_letter([r for r, _c in lacking], *NO_SESSION_ID)
                    go = [(r, c) for r, c in go if c.session_id is not None]
                    if not go:
                        return len(stop) + len(lacking)
            participants = await self._destination(route, dest, [c for _r, c in go])
        except ServiceBusError as exc:  # missing destination: dead-letter at the source
            await self._refuse(dead_letter, [r for r, _c in go], type(exc).__name__, str(exc))
            return len(go)
        me = partition_actor_name(actor._namespace, source, actor._incarnation, actor._partition_id)
        ops = [SettleOp("complete", r.lock_token or "").to_wire() for r, _c in go]
        participants.insert(0, (me, source, [], ops, []))
        try:
            commit = await self._coordinator.method()
            await _rpc.call(source, commit, uuid.uuid4().hex, participants)
        except TransactionAbortedError as exc:
            if _transient(exc.cause):
                await self._release([r for r, _c in go])
                await asyncio.sleep(0.2)
                return 0
            reason = exc.reason or ""
            kind = type(exc.cause).__name__ if exc.cause is not None else type(exc).__name__
            await self._refuse(dead_letter, [r for r, _c in go], kind, reason)
        except ServiceBusError:  # outcome unknown: the coordinator finishes it either way
            await asyncio.sleep(0.5)
        return len(go)

    async def _destination(
        self, route: Any, dest: str, copies: list[MessageRecord]
    ) -> list[tuple[Any, ...]]:
        """The destination's shares (``route`` is its route) as transaction participants."""
        from .namespace import TopicRoute

        actor = self._actor
        if isinstance(route, TopicRoute):
            _version, _props, subs = await self._registry.call(dest, "router_config", dest)
            targets = [t for t, _r in subs]
            routes = {t.path: r for t, r in subs}
            copies_by_path = plan(targets, copies)
        else:
            routes = {route.properties.name: route}
            copies_by_path = {route.properties.name: copies}
        out: list[tuple[Any, ...]] = []
        for path, recs in copies_by_path.items():
            r = routes[path]
            dedup = r.properties.requires_duplicate_detection
            self._turn += 1
            live = r.pmap.live
            spread = live[self._turn % len(live)]
            for pid, idxs in r.pmap.place(recs, dedup, lambda s=spread: s).items():
                name = partition_actor_name(actor._namespace, path, r.incarnation, pid)
                share = [recs[i] for i in idxs]
                out.append((name, path, to_wire(share), [], []))
        return out

    async def _refuse(
        self, dead_letter: bool, recs: list[MessageRecord], reason: str, text: str
    ) -> None:
        """The destination refused: dead-letter at the source (a dead letter being forwarded
        cannot be dead-lettered again: it is given back and tried again later)."""
        if dead_letter:
            _log.warning("dead letters of %s not forwarded: %s", self._actor._core.entity, text)
            await self._release(recs)
            await asyncio.sleep(1.0)
        else:
            await self._dead_letter(recs, reason, text)

    async def _dead_letter(self, recs: list[MessageRecord], reason: str, text: str) -> None:
        ops = [SettleOp("dead_letter", r.lock_token or "", None, reason, text) for r in recs]
        await self._settle(ops)

    async def _release(self, recs: list[MessageRecord]) -> None:
        await self._settle([SettleOp("release", r.lock_token or "") for r in recs])

    async def _settle(self, ops: list[SettleOp]) -> None:
        actor = self._actor
        actor._core.settle(ops)
        await actor._commit.durable()
        actor._notify()


def _takes_sessions_only(route: Any) -> bool:
    """Whether ``route`` is a session-enabled queue's (a topic's subscriptions decide each
    for itself, as their copies arrive)."""
    from .namespace import TopicRoute

    return not isinstance(route, TopicRoute) and bool(route.properties.requires_session)
