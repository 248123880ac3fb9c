"""The asyncio ``ServiceBusProcessor``: competing consumers in an elastic pool of Ray actors.

``client.get_processor(queue_name, handler, ...)`` (or ``(topic_name, subscription_name)``)
returns a processor; ``start()`` starts replica actors (``raybus._actors.replica``), each
running up to ``max_concurrent_calls`` handler calls, and a controller that sizes the pool by
the entity's backlog (``raybus._core.pool``). ``stop()`` drains them.

**Where the controller runs.** In the process that calls ``start()``, as asyncio tasks on the
caller's event loop (for the sync ``raybus.ServiceBusProcessor``: raybus's background loop),
not in an actor of its own. The replicas are owned by this process (not detached), so the pool
never outlives the program that started it and needs no extra process; statistics and
``error_handler`` calls stay local. If the process dies, Ray stops its replicas and their
messages come back when their locks expire.

**Replica failures.** Replicas have ``max_restarts=0``: the controller replaces a dead replica
itself, so it knows and counts it. Each replica reports the locks it holds whenever they change
(at most every 50 ms, by a long poll that returns early); when one dies the controller at once
abandons the messages its handlers were running (a delivery is counted, as a lock expiry would:
a message that kills its replica every time is dead-lettered at the max delivery count) and
releases its prefetched messages and sessions (no delivery counted). Only messages whose
receive was in transit at the moment of death wait for their locks to expire.

**error_handler** is called in this process, on the controller's loop, as
``error_handler(exception, message)``: for every handler exception (``message`` is a copy of
the message it failed on, already abandoned or dead-lettered: do not settle it), and with
``message=None`` for the processor's own troubles (a failed receive, a lock renewal that failed,
a replica that died or could not start, a failed backlog reading). A handler exception that
cannot be pickled arrives as a ``ServiceBusError`` carrying its text. Without an
``error_handler`` these are logged (logger ``raybus.processor``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from ray import cloudpickle

from .. import _rpc

# The module, not its names: a replica's worker process imports ``raybus._actors.replica``
# first, which imports ``raybus.aio`` and so this module while it is still half loaded.
from .._actors import replica as _replica
from .._actors.namespace import TopicRoute
from .._clock import Clock, SystemClock
from .._connection import Connection
from .._core.partition import ABANDON, RELEASE, SettleOp
from .._core.pool import (
    RUNNING,
    STARTING,
    LostWork,
    PoolSettings,
    ProcessorStatistics,
    ReplicaPool,
)
from .._models import validate_entity_name
from .._topic_models import subscription_path
from ..exceptions import InvalidArgumentError, ServiceBusError
from ..message import ServiceBusReceivedMessage

__all__ = ["ErrorHandler", "Handler", "Seconds", "ServiceBusProcessor", "in_thread"]

_log = logging.getLogger("raybus.processor")
_dumps: Callable[[Any], bytes] = cloudpickle.dumps

ErrorHandler = Callable[[BaseException, ServiceBusReceivedMessage | None], Awaitable[None] | None]
Handler = Callable[..., Any]  # handler(message) or handler(message, context); sync or async
Seconds = float | timedelta

SCALE_INTERVAL_S = 0.5  # how often the controller reads the backlog
REPORT_WAIT_S = 2.0  # a replica's report long poll returns after this long at the latest
REPORT_MIN_INTERVAL_S = 0.05  # and at most this often
DEFAULT_STOP_TIMEOUT_S = 30.0  # how long stop() and a scale-down let handlers finish
DRAIN_CALL_MARGIN_S = 10.0  # beyond the drain timeout, before a replica is given up
# A replica not ready by then is given up (Ray may be unable to place it: actor_options asking
# for resources the cluster lacks) and retried with the pool's back-off.
REPLICA_START_TIMEOUT_S = 120.0
_CONTROL_ERROR_EVERY = 20  # a failing backlog reading is reported once per this many


def _seconds(value: Any, name: str, entity: str | None) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidArgumentError(
            f"{name} must be a timedelta or a number of seconds >= 0, not {value!r}", entity, name
        )
    return float(value)


def _check_int(value: Any, name: str, low: int, entity: str | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(f"{name} must be an int >= {low}, not {value!r}", entity, name)
    return value


def inspect_handler(handler: Any, entity: str | None) -> tuple[bool, bool]:
    """(whether ``handler`` is a coroutine function, whether it takes a context argument).

    It takes the context when it accepts two positional arguments (or ``*args``); otherwise
    it is called with the message alone.
    """
    if not callable(handler):
        raise InvalidArgumentError(
            f"handler must be callable, not {type(handler).__name__}", entity, "handler"
        )
    call = getattr(handler, "__call__", None)  # noqa: B004 (callable objects' own __call__)
    is_async = inspect.iscoroutinefunction(handler) or (
        not inspect.isroutine(handler) and inspect.iscoroutinefunction(call)
    )
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return is_async, True
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return is_async, True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional:
        raise InvalidArgumentError(
            "handler must take the message as its first positional argument", entity, "handler"
        )
    return is_async, len(positional) >= 2


def in_thread(error_handler: Any) -> ErrorHandler | None:
    """For the sync API: a plain-function ``error_handler`` runs in a worker thread (so it may
    call the sync raybus API, which must not be called from raybus's own loop)."""
    if error_handler is None:
        return None
    if inspect.iscoroutinefunction(error_handler):
        coroutine_handler: ErrorHandler = error_handler
        return coroutine_handler

    async def threaded(exc: BaseException, message: ServiceBusReceivedMessage | None) -> None:
        await asyncio.to_thread(error_handler, exc, message)

    return threaded


class ServiceBusProcessor:
    """Runs ``handler`` on every message of a queue or a topic's subscription (given as
    ``(topic_name, subscription_name)``), in a pool of Ray actors that grows and shrinks with
    its backlog. Get one from ``ServiceBusClient.get_processor``.

    Options (keyword-only; durations in seconds or as ``timedelta``):

    * ``handler(message)`` or ``handler(message, context)``: a coroutine function runs on the
      replica's event loop and gets a ``raybus.aio.ProcessorContext``; a plain function runs in
      the replica's thread pool and gets a ``raybus.ProcessorContext`` (blocking methods). It
      must be picklable (Ray ships it with cloudpickle).
    * ``max_concurrent_calls`` (1): handler calls at a time per replica; with sessions, the
      sessions a replica works at a time.
    * ``auto_complete`` (True): complete the message when the handler returns (unless the
      handler settled it). With False the handler settles through its context.
    * ``prefetch_count`` (0): messages per replica kept locked in hand beyond the running ones.
    * ``max_auto_lock_renewal_duration`` (300 s): how long a handler's lock is renewed.
    * ``error_handler`` (None: log): see the module docstring.
    * ``session`` (None): None follows the queue's ``requires_session``; True or False must
      match it (``InvalidArgumentError`` from ``start()`` otherwise).
    * ``min_replicas`` (1, may be 0), ``max_replicas`` (default ``min_replicas``),
      ``target_backlog_per_replica`` (100), ``scale_down_delay`` (5 s): see
      ``raybus._core.pool`` for the policy.
    * ``actor_options``: extra ``ray.remote`` options for the replicas (``num_cpus`` defaults
      to 0; ``name``, ``namespace``, ``lifetime``, ``max_restarts`` and ``get_if_exists`` are
      the processor's).

    Guarantees (peek-lock, at least once): a message is handled again only if its handler
    raised, its lock was lost (a replica died, or a handler outlived
    ``max_auto_lock_renewal_duration``), or ``stop()``'s timeout cut its handler off. Handlers
    must therefore be idempotent. Without sessions, messages are handled in no particular
    order; with sessions each session's messages are handled one at a time, in order.
    """

    def __init__(
        self,
        connection: Connection,
        entity: str | tuple[str, str],
        handler: Callable[..., Any],
        *,
        max_concurrent_calls: int = 1,
        auto_complete: bool = True,
        prefetch_count: int = 0,
        max_auto_lock_renewal_duration: float | timedelta = 300.0,
        error_handler: ErrorHandler | None = None,
        session: bool | None = None,
        min_replicas: int = 1,
        max_replicas: int | None = None,
        target_backlog_per_replica: int = 100,
        scale_down_delay: float | timedelta = 5.0,
        actor_options: dict[str, Any] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if isinstance(entity, tuple):
            if len(entity) != 2:
                raise InvalidArgumentError(
                    "pass a queue name or a (topic_name, subscription_name) pair",
                    None,
                    "queue_name",
                )
            topic, subscription = entity
            validate_entity_name(topic, kind="topic")
            validate_entity_name(subscription, max_length=50, kind="subscription")
            # A subscription is a queue-like entity: receivers, counts and sessions work on it
            # as on a queue.
            name = subscription_path(topic, subscription)
        else:
            name = validate_entity_name(entity)
        self.entity_path = name
        self._conn = connection
        self._is_async, self._takes_context = inspect_handler(handler, name)
        try:
            _dumps(handler)
        except Exception as exc:
            raise InvalidArgumentError(
                f"handler must be picklable (Ray ships it to the replica actors with "
                f"cloudpickle): {exc}",
                name,
                "handler",
            ) from None
        self._handler = handler
        self._max_concurrent = _check_int(max_concurrent_calls, "max_concurrent_calls", 1, name)
        self._prefetch = _check_int(prefetch_count, "prefetch_count", 0, name)
        if not isinstance(auto_complete, bool):
            raise InvalidArgumentError("auto_complete must be a bool", name, "auto_complete")
        self._auto_complete = auto_complete
        self._renew_s = _seconds(
            max_auto_lock_renewal_duration, "max_auto_lock_renewal_duration", name
        )
        if session is not None and not isinstance(session, bool):
            raise InvalidArgumentError("session must be None, True or False", name, "session")
        self._session = session
        if error_handler is not None and not callable(error_handler):
            raise InvalidArgumentError("error_handler must be callable", name, "error_handler")
        self._error_handler = error_handler
        if max_replicas is None:
            max_replicas = max(1, min_replicas) if isinstance(min_replicas, int) else 1
        try:
            self._settings = PoolSettings(
                min_replicas=min_replicas,
                max_replicas=max_replicas,
                target_backlog_per_replica=target_backlog_per_replica,
                scale_down_delay_s=_seconds(scale_down_delay, "scale_down_delay", name),
            )
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(exc.message, name, exc.argument) from None
        if not isinstance(actor_options, dict | None):
            raise InvalidArgumentError("actor_options must be a dict", name, "actor_options")
        options = dict(actor_options or {})
        reserved = sorted(_replica.RESERVED_ACTOR_OPTIONS & set(options))
        if reserved:
            raise InvalidArgumentError(
                f"actor_options may not set {', '.join(reserved)}: the processor names its "
                "replicas and replaces them itself",
                name,
                "actor_options",
            )
        self._actor_options = options
        self._clock = clock or SystemClock()
        self._id = uuid.uuid4().hex[:12]
        self._pool = ReplicaPool(self._settings, self._clock)
        self._stats = ProcessorStatistics()
        self._requires_session = False
        self._running = False
        self._handles: dict[int, Any] = {}
        self._watchers: dict[int, asyncio.Task[None]] = {}
        self._ready: dict[int, asyncio.Future[BaseException | None]] = {}
        self._retiring: dict[int, asyncio.Task[None]] = {}
        self._after: dict[int, int] = {}  # the last report version seen per replica
        self._control: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._control_errors = 0

    # ------------------------------------------------------------------ public

    @property
    def statistics(self) -> ProcessorStatistics:
        """The latest ``ProcessorStatistics`` (an immutable snapshot; safe from any thread)."""
        return self._stats

    @property
    def is_running(self) -> bool:
        return self._running

    async def start(self) -> None:
        """Start the replicas the backlog asks for (at least ``min_replicas``) and the
        controller; return once those replicas receive.

        Raises ``MessagingEntityNotFoundError`` if the queue does not exist,
        ``InvalidArgumentError`` if ``session`` contradicts the queue, and ``ServiceBusError``
        if a replica could not start (e.g. the handler cannot be unpickled in the replica):
        the processor is then stopped. Calling it on a running processor does nothing.
        """
        if self._running:
            return
        route = await self._conn.route(self.entity_path)
        if isinstance(route, TopicRoute):
            raise InvalidArgumentError(
                f"{self.entity_path!r} is a topic, which is sent to, not received from: "
                "process one of its subscriptions with (topic_name, subscription_name)",
                self.entity_path,
                "queue_name",
            )
        requires = route.properties.requires_session
        if self._session is not None and self._session != requires:
            raise InvalidArgumentError(
                f"session={self._session} but queue {self.entity_path!r} has "
                f"requires_session={requires}",
                self.entity_path,
                "session",
            )
        self._requires_session = requires
        self._pool = ReplicaPool(self._settings, self._clock)
        self._running = True
        self._wake = asyncio.Event()
        try:
            backlog: int | None = await self._read_backlog()
        except ServiceBusError:
            backlog = None
        plan = self._pool.observe(backlog)
        results = await asyncio.gather(*(self._spawn() for _ in range(plan.start)))
        self._publish()
        failure = next((r for r in results if r is not None), None)
        if failure is not None:
            await self.stop(timeout=5.0)
            raise failure
        self._control = asyncio.get_running_loop().create_task(self._run_control())

    async def stop(self, *, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """Stop receiving, let running handlers finish for up to ``timeout`` seconds (those
        still running then are cancelled and their messages abandoned), release prefetched
        messages and held sessions, and stop the replicas.

        Every message is settled at most once: the replicas settle what their handlers
        finished, and release only what no handler got. Calling it again does nothing.
        """
        timeout = _seconds(timeout, "timeout", self.entity_path)
        if not self._running:
            return
        self._running = False
        self._pool.stop()
        if self._control is not None:
            self._control.cancel()
            await asyncio.gather(self._control, return_exceptions=True)
            self._control = None
        rids = self._pool.ids(STARTING, RUNNING)
        await asyncio.gather(
            *(self._retire(rid, timeout) for rid in rids),
            *list(self._retiring.values()),
            return_exceptions=True,
        )
        for watcher in list(self._watchers.values()):
            watcher.cancel()
        self._publish()

    async def __aenter__(self) -> ServiceBusProcessor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ controller

    def _publish(self) -> None:
        self._stats = self._pool.statistics()

    async def _read_backlog(self) -> int:
        registry = self._conn.registry_for(self.entity_path)
        _route, counts = await _rpc.call(
            self.entity_path, registry.counts, self.entity_path, retries=_rpc.READ_RETRIES
        )
        return sum(c.active for c in counts)

    async def _run_control(self) -> None:
        while self._running:
            backlog: int | None = None
            try:
                backlog = await self._read_backlog()
                self._control_errors = 0
            except ServiceBusError as exc:
                if self._control_errors % _CONTROL_ERROR_EVERY == 0:
                    await self._on_error(exc, None)
                self._control_errors += 1
            plan = self._pool.observe(backlog)
            for _ in range(plan.start):
                self._spawn()
            for rid in plan.drain:
                task = asyncio.get_running_loop().create_task(
                    self._retire(rid, DEFAULT_STOP_TIMEOUT_S)
                )
                self._retiring[rid] = task
                task.add_done_callback(functools.partial(self._retired, rid))
            self._publish()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), SCALE_INTERVAL_S)
            except asyncio.TimeoutError:
                pass

    def _retired(self, rid: int, _task: asyncio.Task[None]) -> None:
        self._retiring.pop(rid, None)

    def _spawn(self) -> asyncio.Future[BaseException | None]:
        """Start a replica; the future resolves to None once it is ready, or to the error
        that kept it from starting."""
        loop = asyncio.get_running_loop()
        rid = self._pool.add()
        ready: asyncio.Future[BaseException | None] = loop.create_future()
        config = _replica.ReplicaConfig(
            namespace=self._conn.namespace,
            entity=self.entity_path,
            replica_id=rid,
            max_concurrent_calls=self._max_concurrent,
            prefetch_count=self._prefetch,
            auto_complete=self._auto_complete,
            max_lock_renewal_s=self._renew_s,
            session=self._requires_session,
            handler_is_async=self._is_async,
            handler_takes_context=self._takes_context,
            credential=self._conn.credential,
            retry=self._conn.retry,
        )
        name = f"raybus/processor/{self._conn.namespace}/{self._id}/{rid}"
        try:
            handle = _replica.replica_actor(name, config, self._handler, self._actor_options)
        except Exception as exc:  # bad actor_options (Ray checks them here)
            self._pool.start_failed(rid)
            ready.set_result(
                InvalidArgumentError(
                    f"could not create a replica actor: {exc}", self.entity_path, "actor_options"
                )
            )
            return ready
        self._handles[rid] = handle
        self._ready[rid] = ready
        self._watchers[rid] = loop.create_task(self._watch(rid, handle, ready))
        self._publish()
        return ready

    async def _watch(
        self, rid: int, handle: Any, ready: asyncio.Future[BaseException | None]
    ) -> None:
        """Start the replica, then follow its reports until it dies or is retired."""
        entity = self.entity_path
        try:
            await asyncio.wait_for(
                _replica.call_replica(entity, handle.start), REPLICA_START_TIMEOUT_S
            )
        except Exception as exc:
            if isinstance(exc, asyncio.TimeoutError):
                why = (
                    f"not ready within {REPLICA_START_TIMEOUT_S:g} s (can Ray place an actor "
                    f"with actor_options {self._actor_options}?)"
                )
            else:
                why = str(exc)
            error = (
                exc
                if isinstance(exc, ServiceBusError)
                else ServiceBusError(f"processor replica {rid} could not start: {why}", entity)
            )
            self._pool.start_failed(rid)
            self._handles.pop(rid, None)
            self._watchers.pop(rid, None)
            _replica.kill_replica(handle)
            if not ready.done():
                ready.set_result(error)
            self._publish()
            self._wake.set()
            await self._on_error(error, None)
            return
        self._pool.ready(rid)
        if not ready.done():
            ready.set_result(None)
        self._publish()
        after = 0
        while True:
            try:
                report = await _replica.call_replica(entity, handle.report, after, REPORT_WAIT_S)
            except _replica.ReplicaGone as exc:
                self._watchers.pop(rid, None)
                await self._lost(rid, str(exc))
                return
            except ServiceBusError:  # unreachable for now: ask again shortly
                await asyncio.sleep(0.5)
                continue
            after = self._after[rid] = report.version
            self._pool.report(rid, report)
            self._publish()
            for error, message in report.errors:
                await self._on_error(error, message)
            await asyncio.sleep(REPORT_MIN_INTERVAL_S)

    async def _retire(self, rid: int, timeout: float) -> None:
        """Drain the replica (handlers finish, prefetched messages are released), then stop
        it. If it dies meanwhile, its messages are given back as for a lost replica."""
        handle = self._handles.get(rid)
        watcher = self._watchers.pop(rid, None)
        self._pool.draining(rid)
        self._publish()
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        ready = self._ready.pop(rid, None)
        if ready is not None and not ready.done():
            ready.set_result(ServiceBusError("the processor stopped", self.entity_path))
        if handle is None:
            return
        try:
            final = await asyncio.wait_for(
                _replica.call_replica(
                    self.entity_path, handle.drain, timeout, self._after.get(rid, 0)
                ),
                timeout + DRAIN_CALL_MARGIN_S,
            )
        except Exception as exc:  # died or hung while draining: give its messages back
            _replica.kill_replica(handle)
            self._handles.pop(rid, None)
            await self._lost(rid, f"while draining: {exc}")
            return
        self._pool.drained(rid, final)
        _replica.kill_replica(handle)
        self._handles.pop(rid, None)
        self._after.pop(rid, None)
        self._publish()
        for error, message in final.errors:
            await self._on_error(error, message)

    async def _lost(self, rid: int, why: str) -> None:
        """A replica died: give back what it held, count it, and let the controller replace
        it."""
        self._handles.pop(rid, None)
        self._ready.pop(rid, None)
        self._after.pop(rid, None)
        work = self._pool.lost(rid)
        interrupted, released = await self._give_back(work)
        self._pool.gave_back(interrupted, released)
        self._publish()
        self._wake.set()
        await self._on_error(
            ServiceBusError(
                f"processor replica {rid} died ({why}); {interrupted} message(s) its handlers "
                f"held were abandoned and {released} prefetched one(s) released",
                self.entity_path,
            ),
            None,
        )

    async def _give_back(self, work: LostWork) -> tuple[int, int]:
        """Abandon the lost replica's in-handler messages, release its prefetched ones and its
        sessions. Returns how many of each the broker accepted (a lock already used or expired
        is refused: nothing is settled twice)."""
        if not (work.abandon or work.release or work.sessions):
            return 0, 0
        entity = self.entity_path
        by_partition: dict[int, list[SettleOp]] = {}
        for lock in work.abandon:
            by_partition.setdefault(lock.partition_id, []).append(
                SettleOp(ABANDON, lock.lock_token)
            )
        for lock in work.release:
            by_partition.setdefault(lock.partition_id, []).append(
                SettleOp(RELEASE, lock.lock_token)
            )
        interrupted = released = 0
        try:
            route = await self._conn.route(entity)
            for pid, ops in by_partition.items():
                handle = route.handle(pid)
                if handle is None:
                    continue
                results = await _rpc.call(entity, handle.settle, [op.to_wire() for op in ops])
                for op, result in zip(ops, results, strict=True):
                    if result is None and op.kind == ABANDON:
                        interrupted += 1
                    elif result is None:
                        released += 1
            for s in work.sessions:  # after the abandons: they keep their place in order
                handle = route.handle(s.partition_id)
                if handle is not None:
                    await _rpc.call(entity, handle.release_session, s.session_id, s.token)
        except ServiceBusError as exc:  # their locks expire instead
            _log.warning("could not give back the messages of replica %s: %s", work.replica_id, exc)
        return interrupted, released

    async def _on_error(
        self, exc: BaseException, message: ServiceBusReceivedMessage | None
    ) -> None:
        if self._error_handler is None:
            seq = None if message is None else message.sequence_number
            _log.warning("processor on %s: %r (message %s)", self.entity_path, exc, seq)
            return
        try:
            result = self._error_handler(exc, message)
            if inspect.isawaitable(result):
                await result
        except Exception:
            _log.exception("the error_handler of the processor on %s raised", self.entity_path)
