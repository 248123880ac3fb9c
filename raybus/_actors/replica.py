"""The Ray actor of a processor replica: receivers and handler tasks around the user's handler.

A ``ProcessorReplica`` opens its own raybus connection inside its actor (it joins the Ray
cluster it runs in and finds the namespace's registry by name) and works the entity:

* **Without sessions**: one receiver and a pump that keeps messages for every free handler slot
  (``max_concurrent_calls``) plus up to ``prefetch_count`` more in hand, each handled by its
  own task. The prefetched ones are topped up in the background while handlers run (as an
  AMQP link's credit keeps Service Bus's prefetch full), so a handler that finishes finds its
  next message without a round trip; they are not renewed while they wait.
* **With sessions**: ``max_concurrent_calls`` slots; each accepts the next available session,
  handles its messages one at a time in sequence order, and gives the session up after
  ``SESSION_IDLE_S`` without a message (so other sessions get their turn).

Coroutine-function handlers run on the actor's event loop; plain functions run in a thread
pool of ``max_concurrent_calls`` threads. A message's lock (a session's, with sessions) is
renewed while its handler runs, for up to ``max_auto_lock_renewal_duration``.

Settlement after the handler: it returned → complete (with ``auto_complete``; a message the
handler settled itself is left alone, and with ``auto_complete=False`` an unsettled one keeps
its lock until it expires, as in Service Bus); it raised → abandon, or dead-letter with reason
``MaxDeliveryCountExceeded`` and the exception as description once this delivery is the
entity's last allowed one (poison messages).

The controller (``raybus.aio._processor``) long-polls ``report``: the replica answers as soon
as anything changed (a receive, a handler finishing, an error). Each report lists the locks the
replica holds, so the controller can give them back at once if the replica dies.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import ray
from ray import cloudpickle
from ray import exceptions as rex

# ``_context`` as a module: it imports ``raybus.aio``, which imports this module.
from .. import _context, _rpc
from .._connection import Connection
from .._core.partition import MAX_DELIVERY_COUNT_EXCEEDED
from .._core.pool import HeldLock, HeldSession, ReplicaReport
from ..aio._auto_lock_renewer import RENEW_REMAINING_S
from ..aio._context import ProcessorContext
from ..aio._receiver import ServiceBusReceiver
from ..aio._sender import ServiceBusSender
from ..enums import NEXT_AVAILABLE_SESSION
from ..exceptions import (
    AutoLockRenewFailed,
    InvalidArgumentError,
    OperationTimeoutError,
    ServiceBusError,
    SettlementFailedError,
)
from ..message import ServiceBusReceivedMessage

__all__ = [
    "RESERVED_ACTOR_OPTIONS",
    "ProcessorReplica",
    "ReplicaConfig",
    "ReplicaGone",
    "call_replica",
    "kill_replica",
    "replica_actor",
]

_log = logging.getLogger("raybus.processor.replica")
_dumps: Callable[[Any], bytes] = cloudpickle.dumps

RECEIVE_WAIT_S = 0.5  # a pump's receive wait: how soon it notices a drain
SESSION_IDLE_S = 1.0  # a session slot gives its session up after this long without a message
ERROR_PAUSE_S = 1.0  # after a failed receive or accept (entity disabled, deleted, ...)
MAX_ERRORS = 1000  # unreported handler errors kept; later ones are only logged
MAX_DESCRIPTION = 1024  # characters of the exception kept as dead-letter description
# Set by the processor: its replicas are its own (it replaces them) and unique per processor.
RESERVED_ACTOR_OPTIONS = frozenset(
    {"name", "namespace", "lifetime", "max_restarts", "get_if_exists"}
)


@dataclass(frozen=True)
class ReplicaConfig:
    """What a replica needs besides the handler (validated by the processor)."""

    namespace: str
    entity: str
    replica_id: int
    max_concurrent_calls: int
    prefetch_count: int
    auto_complete: bool
    max_lock_renewal_s: float
    session: bool
    handler_is_async: bool
    handler_takes_context: bool
    credential: Any = None  # the processor's client credential, if any
    retry: Any = None  # the processor's client retry policy (``raybus._retry.RetryPolicy``)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_DESCRIPTION]


def _portable(exc: BaseException, entity: str) -> BaseException:
    """``exc`` if it pickles (it goes to the controller), else a ``ServiceBusError`` with its
    text."""
    try:
        _dumps(exc)
        return exc
    except Exception:
        return ServiceBusError(f"the handler raised {_describe(exc)}", entity)


class ProcessorReplica:
    """One replica (see the module docstring); created by ``replica_actor``."""

    def __init__(self, config: ReplicaConfig, handler: Callable[..., Any]) -> None:
        self._cfg = config
        self._handler = handler
        self._conn = Connection(config.namespace, credential=config.credential, retry=config.retry)
        self._threads = (
            None
            if config.handler_is_async
            else ThreadPoolExecutor(config.max_concurrent_calls, thread_name_prefix="handler")
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._receivers: set[ServiceBusReceiver] = set()
        self._senders: dict[str, ServiceBusSender] = {}
        self._held: dict[str, int] = {}  # lock token -> partition of messages in a handler
        self._sessions: dict[int, HeldSession] = {}  # per session slot
        self._tasks: set[asyncio.Task[None]] = set()  # handler tasks (without sessions)
        self._workers: list[asyncio.Task[None]] = []  # the pump, or the session slots
        self._free = config.max_concurrent_calls
        self._prefetched: deque[ServiceBusReceivedMessage] = deque()
        self._wake_pump = asyncio.Event()
        self._counts = {"handled": 0, "failed": 0, "dead_lettered": 0, "interrupted": 0}
        self._released = 0
        self._in_flight = 0
        self._version = 0
        self._changed = asyncio.Event()
        self._errors: list[tuple[int, BaseException, Any]] = []
        self._stopping = False
        self._start_done: asyncio.Event | None = None

    # ------------------------------------------------------------------ control (controller)

    async def start(self) -> int:
        """Check the entity and start receiving; returns this process's id."""
        self._start_done = asyncio.Event()
        try:
            self._loop = asyncio.get_running_loop()
            cfg = self._cfg
            route = await self._conn.route(cfg.entity)
            if route.properties.requires_session != cfg.session:
                raise InvalidArgumentError(
                    f"queue {cfg.entity!r} requires_session is "
                    f"{route.properties.requires_session}, but the processor was made for "
                    f"{'a session' if cfg.session else 'an'} entity"
                    f"{'' if cfg.session else ' without sessions'}",
                    cfg.entity,
                    "session",
                )
            if self._stopping:
                return os.getpid()
            if cfg.session:
                for slot in range(cfg.max_concurrent_calls):
                    self._workers.append(asyncio.create_task(self._session_slot(slot)))
            else:
                # The pump prefetches itself (see the module docstring).
                receiver = ServiceBusReceiver(self._conn, cfg.entity)
                self._receivers.add(receiver)
                self._workers.append(asyncio.create_task(self._pump(receiver)))
            return os.getpid()
        finally:
            self._start_done.set()

    async def report(self, after: int, wait_s: float) -> ReplicaReport:
        """The replica's state, as soon as it differs from version ``after`` (the last one
        the controller received; errors up to it are dropped) or after ``wait_s``."""
        if self._version <= after:
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
        return self._report(after)

    async def drain(self, timeout_s: float, after: int) -> ReplicaReport:
        """Stop receiving, let running handlers finish for up to ``timeout_s`` (then cancel
        them: their messages are abandoned), release prefetched messages and sessions, and
        return the final report. The actor may then be killed."""
        self._stopping = True
        self._wake_pump.set()
        if self._start_done is not None:
            await self._start_done.wait()
        deadline = time.monotonic() + timeout_s
        if self._workers:
            await asyncio.wait(self._workers, timeout=max(0.0, deadline - time.monotonic()))
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=max(0.0, deadline - time.monotonic()))
        leftover = [t for t in [*self._tasks, *self._workers] if not t.done()]
        for task in leftover:
            task.cancel()
        if leftover:
            await asyncio.gather(*leftover, return_exceptions=True)
        for receiver in list(self._receivers):
            if receiver.session is None:  # closing the receiver releases them
                await receiver.put_back(list(self._prefetched))
                self._prefetched.clear()
            await self._close_receiver(receiver)
        for sender in self._senders.values():
            try:
                await sender.close()
            except Exception:
                pass
        if self._threads is not None:
            # A sync handler cut off by the timeout keeps its thread until the actor is killed.
            self._threads.shutdown(wait=False, cancel_futures=True)
        self._bump()
        return self._report(after, final=True)

    async def pid(self) -> int:
        return os.getpid()

    # ------------------------------------------------------------------ state

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def _error(self, exc: BaseException, message: ServiceBusReceivedMessage | None) -> None:
        seq = None if message is None else message.sequence_number
        _log.info("processor on %s: %s (message %s)", self._cfg.entity, _describe(exc), seq)
        if len(self._errors) >= MAX_ERRORS:
            _log.warning(
                "processor on %s: error not reported (too many): %r", self._cfg.entity, exc
            )
            return
        self._errors.append((self._version + 1, _portable(exc, self._cfg.entity), message))
        self._bump()

    def _report(self, after: int, *, final: bool = False) -> ReplicaReport:
        self._errors = [e for e in self._errors if e[0] > after]
        locks = [HeldLock(pid, token, True) for token, pid in self._held.items()]
        now = time.time()  # (a session's prefetched messages go with the session)
        for m in self._prefetched:
            if m._record.locked_until > now:
                locks.append(HeldLock(m.partition_id, m.lock_token or "", False))
        return ReplicaReport(
            version=self._version,
            handled=self._counts["handled"],
            failed=self._counts["failed"],
            dead_lettered=self._counts["dead_lettered"],
            interrupted=self._counts["interrupted"],
            released=self._released,
            in_flight=self._in_flight,
            locks=tuple(locks),
            sessions=tuple(self._sessions.values()),
            errors=tuple((exc, msg) for _v, exc, msg in self._errors),
            final=final,
        )

    def _count(self, name: str) -> None:
        self._counts[name] += 1
        self._bump()

    def _sender(self, queue_name: str) -> ServiceBusSender:
        key = queue_name.lower()
        sender = self._senders.get(key)
        if sender is None:
            sender = self._senders[key] = ServiceBusSender(self._conn, queue_name)
        return sender

    async def _close_receiver(self, receiver: ServiceBusReceiver) -> None:
        """Close (releasing prefetched messages and the session) and count the releases."""
        now = time.time()
        buffered = sum(
            1
            for m in receiver._buffer
            if not m._settled and m._kind == "locked" and m._record.locked_until > now
        )
        try:
            await receiver.close()
        except Exception as exc:  # refused settlements: those messages come again
            self._error(exc, None)
        self._released += buffered
        self._receivers.discard(receiver)
        self._bump()

    # ------------------------------------------------------------------ receiving

    async def _pump(self, receiver: ServiceBusReceiver) -> None:
        """Without sessions: keep a message for every free slot plus ``prefetch_count`` in
        hand. Fetches once the prefetched ones are down to half (or a slot is idle)."""
        prefetch = self._cfg.prefetch_count
        while not self._stopping:
            held = len(self._prefetched)
            room = self._free + prefetch - held
            if room <= 0 or (self._free == 0 and held > prefetch // 2):
                self._wake_pump.clear()
                await self._wake_pump.wait()
                continue
            try:
                got = await receiver.receive_messages(room, max_wait_time=RECEIVE_WAIT_S)
            except Exception as exc:
                self._error(exc, None)
                if not isinstance(exc, SettlementFailedError):  # (those were reported only)
                    await asyncio.sleep(ERROR_PAUSE_S)
                continue
            self._prefetched.extend(got)
            if self._stopping:  # drain() releases them with the receiver
                return
            self._dispatch(receiver)

    def _dispatch(self, receiver: ServiceBusReceiver) -> None:
        """Give prefetched messages to free slots (skipping any whose lock ran out while it
        waited: it is back in the queue already)."""
        now = time.time()
        while self._free and self._prefetched and not self._stopping:
            message = self._prefetched.popleft()
            if message._record.locked_until <= now:
                continue
            self._free -= 1
            task = asyncio.create_task(self._handle(receiver, message))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._handler_done, receiver))
        self._wake_pump.set()

    def _handler_done(self, receiver: ServiceBusReceiver, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._free += 1
        self._dispatch(receiver)

    async def _session_slot(self, slot: int) -> None:
        """With sessions: accept the next available session, work it, give it up; repeat."""
        cfg = self._cfg
        while not self._stopping:
            receiver = ServiceBusReceiver(
                self._conn,
                cfg.entity,
                session_id=NEXT_AVAILABLE_SESSION,
                max_wait_time=RECEIVE_WAIT_S,
                prefetch_count=cfg.prefetch_count,
            )
            session = receiver.session
            assert session is not None
            try:
                await session.ensure()
            except OperationTimeoutError:
                continue  # no session free right now
            except Exception as exc:
                self._error(exc, None)
                await asyncio.sleep(ERROR_PAUSE_S)
                continue
            self._receivers.add(receiver)
            assert session.session_id is not None and session._token is not None
            self._sessions[slot] = HeldSession(session._pid, session.session_id, session._token)
            self._bump()
            keeper = asyncio.create_task(self._keep_session_lock(receiver))
            try:
                await self._work_session(receiver)
            finally:
                keeper.cancel()
                self._sessions.pop(slot, None)
                await self._close_receiver(receiver)

    async def _work_session(self, receiver: ServiceBusReceiver) -> None:
        """Handle the session's messages in order until it is idle or the lock is lost."""
        session = receiver.session
        assert session is not None
        while not self._stopping and session._token is not None:
            try:
                got = await receiver.receive_messages(1, max_wait_time=SESSION_IDLE_S)
            except Exception as exc:  # e.g. the session lock was lost
                self._error(exc, None)
                return
            if not got:
                return
            if self._stopping:
                await receiver.put_back(got)
                return
            await self._handle(receiver, got[0])
            if session._locked_until <= time.time():
                return  # the lock ran out under a slow handler: accept again

    # ------------------------------------------------------------------ handling

    async def _handle(
        self, receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage
    ) -> None:
        """Run the handler on ``message`` and settle it. Never raises."""
        token = message.lock_token or ""
        self._held[token] = message.partition_id
        self._in_flight += 1
        self._bump()
        keeper = None
        if receiver.session is None:
            keeper = asyncio.create_task(self._keep_message_lock(receiver, message))
        try:
            await self._call_handler(receiver, message)
        except asyncio.CancelledError:  # the drain timed out: give the message back
            if not message._settled:
                await self._settle_quietly(receiver.abandon_message(message), message)
                self._count("interrupted")
        except Exception as exc:
            await self._failed(receiver, message, exc)
        else:
            self._count("handled")
            if self._cfg.auto_complete and not message._settled:
                await self._settle_quietly(receiver.complete_message(message), message)
        finally:
            if keeper is not None:
                keeper.cancel()
            self._held.pop(token, None)
            self._in_flight -= 1
            self._bump()

    async def _call_handler(
        self, receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage
    ) -> None:
        cfg = self._cfg
        ctx = ProcessorContext(
            receiver,
            message,
            cfg.replica_id,
            self._sender,
            functools.partial(self._count, "dead_lettered"),
        )
        if cfg.handler_is_async:
            await (
                self._handler(message, ctx) if cfg.handler_takes_context else self._handler(message)
            )
            return
        assert self._loop is not None
        sync_ctx = _context.ProcessorContext(ctx, self._loop)
        call_args = (message, sync_ctx) if cfg.handler_takes_context else (message,)
        await self._loop.run_in_executor(
            self._threads, functools.partial(self._handler, *call_args)
        )

    async def _failed(
        self, receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage, exc: Exception
    ) -> None:
        """The handler raised: abandon, or dead-letter on the last allowed delivery."""
        self._counts["failed"] += 1
        self._error(exc, message)
        if message._settled:
            return
        try:
            route = await self._conn.route(self._cfg.entity)
            last = message.delivery_count + 1 >= route.properties.max_delivery_count
        except Exception:
            last = False  # the broker still dead-letters it when the count is reached
        if last:
            await self._settle_quietly(
                receiver.dead_letter_message(message, MAX_DELIVERY_COUNT_EXCEEDED, _describe(exc)),
                message,
            )
            if message._settled:
                self._count("dead_lettered")
        else:
            await self._settle_quietly(receiver.abandon_message(message), message)

    async def _settle_quietly(self, settle: Any, message: ServiceBusReceivedMessage) -> None:
        try:
            await settle
        except Exception as exc:  # lock lost: the message comes again anyway
            self._error(exc, message)

    # ------------------------------------------------------------------ lock renewal

    async def _keep_message_lock(
        self, receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage
    ) -> None:
        """Renew the message's lock while its handler runs (cancelled when it returns)."""
        route = await self._conn.route(self._cfg.entity)
        margin = min(RENEW_REMAINING_S, route.properties.lock_duration_s / 2)
        until = time.time() + self._cfg.max_lock_renewal_s
        while True:
            wake = min(message._record.locked_until - margin, until)
            await asyncio.sleep(max(0.0, wake - time.time()))
            if message._settled or time.time() >= until:
                return
            try:
                await receiver._renew(message)
            except Exception as exc:
                if not message._settled:
                    self._error(
                        AutoLockRenewFailed(f"lock renewal failed: {exc}", self._cfg.entity),
                        message,
                    )
                return

    async def _keep_session_lock(self, receiver: ServiceBusReceiver) -> None:
        """Renew the session lock while the slot holds the session."""
        session = receiver.session
        assert session is not None
        route = await self._conn.route(self._cfg.entity)
        margin = min(RENEW_REMAINING_S, route.properties.lock_duration_s / 2)
        until = time.time() + self._cfg.max_lock_renewal_s
        while session._token is not None:
            wake = min(session._locked_until - margin, until)
            await asyncio.sleep(max(0.0, wake - time.time()))
            if session._token is None or time.time() >= until:
                return
            try:
                await session.renew_lock()
            except Exception as exc:
                if session._token is not None:
                    self._error(
                        AutoLockRenewFailed(
                            f"session lock renewal failed: {exc}", self._cfg.entity
                        ),
                        None,
                    )
                return


# ---------------------------------------------------------------------- the controller's side


class ReplicaGone(Exception):
    """The replica's actor is dead (its process exited or was killed, or its constructor
    failed). Replicas have ``max_restarts=0``: it will not come back."""


def replica_actor(
    name: str, config: ReplicaConfig, handler: Callable[..., Any], actor_options: dict[str, Any]
) -> Any:
    """Create a replica actor named ``name`` in Ray namespace ``raybus``. It is owned by
    this process (not detached): it goes when the process that started the processor goes.
    ``num_cpus`` is 0 unless ``actor_options`` say otherwise; Ray pickles ``handler`` with
    cloudpickle."""
    options: dict[str, Any] = {"num_cpus": 0, **actor_options}
    options.update(name=name, namespace="raybus", max_restarts=0)
    return ray.remote(ProcessorReplica).options(**options).remote(config, handler)


async def call_replica(entity: str, method: Any, *args: Any) -> Any:
    """Await ``method.remote(*args)`` on a replica.

    ``ActorDiedError`` means the replica is gone for good (``ReplicaGone``; the controller
    gives its messages back and replaces it). Anything else from Ray (``ActorUnavailableError``:
    unreachable for now) becomes the retryable ``ServiceBusConnectionError``; an exception the
    replica raised on purpose is re-raised as it was (``raybus._rpc.translate``).
    """
    try:
        return await method.remote(*args)
    except rex.ActorDiedError as exc:
        raise ReplicaGone(str(exc)) from None
    except rex.RayError as exc:
        raise _rpc.translate(exc, entity) from None


def kill_replica(handle: Any) -> None:
    """Stop the replica's process now (its work was drained, or it is being given up)."""
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # already gone
        pass
