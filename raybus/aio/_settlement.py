"""Settling messages: checks, the fast path that does not wait for the broker, and the
bookkeeping of refusals (see ``raybus.aio._receiver``'s docstring for the guarantee).

``Settlement`` is a mixin of ``ServiceBusReceiver``: the receiver owns the state (pending
settlements, refusals, the sync API's hand-off queue), this module the rules for settling.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import TYPE_CHECKING, Any

from .._connection import Connection, SettleResults
from .._core.partition import ABANDON, SettleOp
from .._core.record import check_application_properties
from ..exceptions import InvalidArgumentError, MessageAlreadySettled, MessageLockLostError
from ..message import ServiceBusReceivedMessage, sendable_properties
from ._refusal import Failure, refusal

if TYPE_CHECKING:
    from ._session import ServiceBusSession
    from ._transaction import ServiceBusTransaction

__all__ = ["Settlement"]


def checked_properties_to_modify(properties: Any, entity: str) -> dict[str, Any]:
    """A settlement's ``properties_to_modify`` as it is stored: names given as ``bytes`` (as
    the SDK takes application properties) as their ``str``, a copy of the caller's dict,
    checked as application properties are; errors name ``properties_to_modify``."""
    field = "properties_to_modify"
    if not isinstance(properties, dict):
        raise InvalidArgumentError(f"{field} must be a dict", entity, field)
    out = sendable_properties(properties, field)
    check_application_properties(out, field)
    return out


class Settlement:
    """The settling half of ``ServiceBusReceiver``."""

    if TYPE_CHECKING:
        entity_path: str
        session: ServiceBusSession | None
        _conn: Connection
        _delete: bool
        _transfer: bool
        _closed: bool
        _closing: bool
        _pending: set[asyncio.Future[SettleResults]]
        _answers: threading.Condition
        _handed: int
        _answered: int
        _failures: list[Failure]
        _handoff: list[tuple[ServiceBusReceivedMessage, SettleOp, str, Any]]
        _handoff_lock: threading.Lock
        _handoff_scheduled: bool

        async def _actor(self, partition: int = 0) -> tuple[str, Any, float]: ...

    async def _settle_pending(self) -> None:
        """Wait for the settlements sent without waiting; raise if the broker refused any."""
        await self._answered_pending()
        self._raise_failures()

    async def _answered_pending(self) -> None:
        """Wait for the settlements sent without waiting (their refusals are recorded)."""
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    def _take_failures(self) -> list[Failure]:
        """The refusals recorded so far, now the caller's to report."""
        failures, self._failures = self._failures, []
        return failures

    def _raise_failures(self) -> None:
        if self._failures:
            failures, self._failures = self._failures, []
            raise refusal(
                f"{len(failures)} settlement(s) sent without waiting were refused by the "
                "broker; those messages were not settled and will be delivered again",
                self.entity_path,
                failures,
            )

    def _no_transfer_locks(self) -> None:
        """A receiver of the transfer dead-letter sub-queue holds no locks: it never has a
        message (``raybus.aio._receiver``), and one received elsewhere is not its to settle."""
        if self._transfer:
            raise MessageLockLostError(
                "the transfer dead-letter sub-queue holds no messages, so no locks",
                self.entity_path,
            )

    def _settle_op(self, message: ServiceBusReceivedMessage, op: SettleOp) -> SettleOp:
        if not isinstance(message, ServiceBusReceivedMessage):
            raise InvalidArgumentError(
                f"settle a ServiceBusReceivedMessage, not {type(message).__name__}",
                self.entity_path,
                "message",
            )
        entity = message._entity
        if entity is not self.entity_path and entity.lower() != self.entity_path.lower():
            raise InvalidArgumentError(
                f"the message came from {message._entity!r}, not from this receiver's queue",
                self.entity_path,
                "message",
            )
        if message._kind == "peeked":
            raise MessageAlreadySettled("a peeked message cannot be settled")
        if message._kind == "deleted":
            raise MessageAlreadySettled(
                "a message received in RECEIVE_AND_DELETE mode is already settled"
            )
        if message._settled:
            raise MessageAlreadySettled()
        self._no_transfer_locks()
        if op.properties is not None:
            op.properties = checked_properties_to_modify(op.properties, self.entity_path)
        if op.reason is not None or op.description is not None:
            for value, name in ((op.reason, "reason"), (op.description, "error_description")):
                if value is not None and not isinstance(value, str):
                    raise InvalidArgumentError(f"{name} must be a str", self.entity_path, name)
        if self.session is not None:
            self.session.check_held()
        elif message._record.locked_until <= time.time():
            raise MessageLockLostError(
                "the message's lock has expired; it is being delivered again",
                self.entity_path,
                message._record.lock_token,
                message.sequence_number,
            )
        return op

    def _lock_expiry(self, message: ServiceBusReceivedMessage) -> float:
        """When the message's lock ends: its session's lock, in a session."""
        if self.session is not None:
            return self.session._locked_until
        return message._record.locked_until

    def _may_skip_answer(
        self, message: ServiceBusReceivedMessage, op: SettleOp, lock_s: float
    ) -> bool:
        """Whether the settlement may return before the broker answers. In a session an
        abandon waits: the abandoned message must be the next one a receive returns, so the
        receive must not overtake it. One that carries properties or a dead-letter reason
        waits too: the broker may refuse what it would add to the message (past the header's
        64 KB), and the call that asked for it raises that (``MessageSizeExceededError``)."""
        if self.session is not None and op.kind == ABANDON:
            return False
        if op.properties or op.reason is not None or op.description is not None:
            return False
        return self._lock_is_comfortable(message, lock_s)

    def _lock_is_comfortable(self, message: ServiceBusReceivedMessage, lock_s: float) -> bool:
        """Whether the lock has so much time left that the settlement need not be awaited."""
        return self._lock_expiry(message) - time.time() > min(5.0, lock_s / 2)

    def _session_error(self, error: BaseException) -> BaseException:
        """In a session, a refused message lock means the session lock is gone."""
        if self.session is not None and isinstance(error, MessageLockLostError):
            return self.session._lost()
        return error

    async def _settle(self, message: ServiceBusReceivedMessage, op: SettleOp) -> None:
        # Earlier refusals are not raised here: the error would name other messages, and this
        # one would go unsent. The calls the module docstring of ``raybus.aio._receiver``
        # lists (and close()) report them.
        self._settle_op(message, op)
        entity, actor, lock_s = await self._actor(message.partition_id)
        message._settled = True
        if self._may_skip_answer(message, op, lock_s):
            with self._answers:
                self._handed += 1
            self._submit_nowait([(message, op)], entity, actor)
            return
        try:
            (error,) = await self._conn.settler(entity, actor).submit([op])
        except BaseException:
            message._settled = False  # not settled: the broker left the message as it was
            raise
        if error is not None:
            message._settled = False
            raise self._session_error(error)

    def _submit_nowait(
        self, items: list[tuple[ServiceBusReceivedMessage, SettleOp]], entity: str, actor: Any
    ) -> None:
        """Send settlements of one partition as one request, without waiting for it."""
        fut = self._conn.settler(entity, actor, waited=False).submit([op for _, op in items])
        self._pending.add(fut)
        fut.add_done_callback(functools.partial(self._settled_later, messages=items))

    def settle_from_thread(
        self,
        message: ServiceBusReceivedMessage,
        op: SettleOp,
        loop: asyncio.AbstractEventLoop,
    ) -> bool:
        """The sync API's fast path, callable from any thread: validate here and hand the
        settlement to ``loop`` without waiting for the loop or the broker.

        Returns False (having changed nothing) when the settlement must take the waiting
        path instead: the route is not cached yet, the lock has little time left, or close()
        has started. Earlier refusals are left for the calls that report them (``_settle``).

        The close check and the hand-over are one step under ``_handoff_lock``, and close()
        sends what was handed over (``_send_handed``) only after it set ``_closing``: so a
        settlement handed over is sent and awaited by close(), which reports its refusal, and
        one that comes later waits for its own answer. (Checked outside the lock, a thread
        could hand one over just after close() looked, and its refusal would go unreported.)
        """
        self._settle_op(message, op)
        route = self._conn.cached_route(self.entity_path)
        if route is None:
            return False
        if not self._may_skip_answer(message, op, route.properties.lock_duration_s):
            return False
        handle = route.handle(message.partition_id)
        if handle is None:
            return False
        item = (message, op, route.properties.name, handle)
        with self._handoff_lock:
            if self._closing:
                return False
            message._settled = True
            with self._answers:
                self._handed += 1
            self._handoff.append(item)
            if self._handoff_scheduled:
                return True
            self._handoff_scheduled = True
        loop.call_soon_threadsafe(self._drain_handoff)
        return True

    async def _send_handed(self) -> None:
        """For close(), once ``_closing`` is set: send what the sync API's threads handed over
        and the loop has not sent yet, then wait for every settlement sent without waiting,
        those that others send meanwhile included (refusals are recorded)."""
        self._drain_handoff()
        while self._pending:
            await self._answered_pending()

    def _drain_handoff(self) -> None:
        with self._handoff_lock:
            items, self._handoff = self._handoff, []
            self._handoff_scheduled = False
        groups: dict[Any, tuple[str, Any, list[tuple[ServiceBusReceivedMessage, SettleOp]]]] = {}
        for message, op, entity, actor in items:
            groups.setdefault(actor._actor_id, (entity, actor, []))[2].append((message, op))
        for entity, actor, group in groups.values():
            self._submit_nowait(group, entity, actor)

    def _settled_later(
        self,
        fut: asyncio.Future[SettleResults],
        *,
        messages: list[tuple[ServiceBusReceivedMessage, SettleOp]],
    ) -> None:
        self._pending.discard(fut)
        if fut.cancelled() or fut.exception() is not None:
            why = "cancelled" if fut.cancelled() else fut.exception()
            errors: list[Any] = [why] * len(messages)
        else:
            errors = fut.result()
        for (message, _op), error in zip(messages, errors, strict=True):
            if error is not None:
                message._settled = False  # it was not settled (complete_messages does the same)
                self._failures.append((message.sequence_number, message.lock_token, error))
        with self._answers:
            self._answered += len(messages)
            self._answers.notify_all()

    async def _in_transaction(
        self, transaction: ServiceBusTransaction, message: ServiceBusReceivedMessage, op: SettleOp
    ) -> None:
        if self._delete:
            raise InvalidArgumentError(
                "a RECEIVE_AND_DELETE receiver cannot take part in a transaction",
                self.entity_path,
                "transaction",
            )
        self._settle_op(message, op)
        route = await self._conn.route(self.entity_path)
        await transaction.add_settle(route, message, op)

    async def _settle_or_join(
        self,
        message: ServiceBusReceivedMessage,
        op: SettleOp,
        transaction: ServiceBusTransaction | None,
    ) -> None:
        if transaction is None:
            await self._settle(message, op)
        else:
            await self._in_transaction(transaction, message, op)
