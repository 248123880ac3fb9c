"""Settling by lock token: the receiver's side of Service Bus's REST settlement
(``DELETE|PUT|POST {entity}/messages/{sequence-number}/{lock-token}``) and of the AMQP
``$management`` operations ``update-disposition`` and ``renew-lock``.

Why a second way to settle: ``complete_message`` and friends take the
``ServiceBusReceivedMessage`` that a receive returned, which is what an application holds. A
gateway serving a stateless protocol, or a process that settles what another one received,
holds only the lock token and the sequence number. (Azure's own Python SDK has no such
methods; the older .NET and Java SDKs did: ``CompleteAsync(lockToken)``, ``renewMessageLock``.)

How it differs from settling a message object, and why:

* It always waits for the broker's answer. Without the message the receiver knows neither
  when the lock ends nor whether the message was already settled, so only the broker can tell;
  a return therefore means done, and ``MessageLockLostError`` (an unknown, expired, or
  already used lock token) means nothing changed.
* It does not report the refused fire-and-forget settlements of *other* messages (see
  ``raybus.aio._receiver``): a caller settling one token must not be told another's outcome.
* The partition holding the lock is the one the sequence number's top 16 bits name; without a
  sequence number only an entity of one partition (or a session receiver, whose session lives
  in one partition) can be addressed.
* With ``transaction=`` it joins the transaction (settled or renewed at its commit, as the
  message object's methods with ``transaction=``). The client knows nothing of the lock, so it
  asks the partition, changing nothing, that the lock is held before joining: an unknown,
  expired or used token is refused then (``MessageLockLostError``) and the transaction does
  not hold it; the broker checks again at the commit.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .._clock import from_timestamp
from .._core.partition import ABANDON, COMPLETE, DEAD_LETTER, DEFER, RELEASE, SettleOp
from ..enums import ServiceBusDisposition
from ..exceptions import InvalidArgumentError, ServiceBusError
from ._settlement import checked_properties_to_modify

if TYPE_CHECKING:
    from .._connection import Connection
    from ._session import ServiceBusSession
    from ._transaction import ServiceBusTransaction

__all__ = ["LockTokenSettlement", "check_lock_token"]

_KINDS = {
    ServiceBusDisposition.COMPLETED: COMPLETE,
    ServiceBusDisposition.ABANDONED: ABANDON,
    ServiceBusDisposition.DEFERRED: DEFER,
    ServiceBusDisposition.DEAD_LETTERED: DEAD_LETTER,
    ServiceBusDisposition.RELEASED: RELEASE,
}


def check_lock_token(lock_token: Any, entity: str | None) -> str:
    """The lock token in the broker's form (a lower-case UUID string); ``InvalidArgumentError``
    for anything that cannot be a lock token, so a typo is not reported as a lost lock."""
    if isinstance(lock_token, uuid.UUID):
        return str(lock_token)
    if isinstance(lock_token, str):
        try:
            return str(uuid.UUID(lock_token))
        except ValueError:
            pass
    raise InvalidArgumentError(
        f"lock_token must be a UUID string, not {lock_token!r:.80}", entity, "lock_token"
    )


def _check_sequence_number(value: Any, entity: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise InvalidArgumentError(
            f"sequence_number must be an int >= 0 or None, not {value!r}",
            entity,
            "sequence_number",
        )
    return value


class LockTokenSettlement:
    """The settle-by-lock-token half of ``ServiceBusReceiver`` (see the module docstring)."""

    if TYPE_CHECKING:
        entity_path: str
        session: ServiceBusSession | None
        _conn: Connection
        _delete: bool
        _transfer: bool

        async def _actor(self, partition: int = 0) -> tuple[str, Any, float]: ...

        async def _call(
            self, method_name: str, *args: Any, partition: int = 0, timeout: Any = None
        ) -> Any: ...

        def _session_error(self, error: BaseException) -> BaseException: ...

        def _no_transfer_locks(self) -> None: ...

        def _check_receivable(self, route: Any) -> None: ...

    async def settle_message_by_lock_token(
        self,
        lock_token: str,
        disposition: ServiceBusDisposition | str,
        *,
        sequence_number: int | None = None,
        properties_to_modify: dict[str, Any] | None = None,
        dead_letter_reason: str | None = None,
        dead_letter_error_description: str | None = None,
        transaction: ServiceBusTransaction | None = None,
    ) -> None:
        """Settle the message locked under ``lock_token`` (received by any receiver of this
        entity, in any process) and wait for the broker's answer.

        ``sequence_number`` (the message's) names the partition holding the lock; it may be
        left out on an entity of one partition and in a session receiver.
        ``properties_to_modify`` is merged into the application properties (not with
        COMPLETED); ``dead_letter_reason`` / ``dead_letter_error_description`` go with
        DEAD_LETTERED only.

        Raises ``InvalidArgumentError`` for a malformed token or argument,
        ``MessageLockLostError`` when the broker holds no such lock (unknown, expired, or
        already used to settle) and ``SessionLockLostError`` in a session whose lock is gone;
        in every one of those cases nothing changed. A transport error may leave it unknown
        whether the settlement happened: settling again then raises ``MessageLockLostError``
        if it did. With ``transaction`` the settlement happens at its commit (see the module
        docstring; RELEASED cannot join one).
        """
        op = self._token_op(
            lock_token,
            disposition,
            properties_to_modify,
            dead_letter_reason,
            dead_letter_error_description,
        )
        pid = await self._token_partition(sequence_number)
        if transaction is not None:
            if op.kind == RELEASE:
                raise InvalidArgumentError(
                    "RELEASED cannot be part of a transaction (ABANDONED can)",
                    self.entity_path,
                    "disposition",
                )
            await self._held_lock(op.lock_token, pid)
            route = await self._conn.route(self.entity_path)
            await transaction.add_settle_in(route, pid, op)
            return
        entity, actor, _ = await self._actor(pid)
        (error,) = await self._conn.settler(entity, actor).submit([op])
        if error is not None:
            raise self._session_error(error)

    async def renew_message_lock_by_lock_token(
        self,
        lock_token: str,
        *,
        sequence_number: int | None = None,
        timeout: Any = None,
        transaction: ServiceBusTransaction | None = None,
    ) -> datetime:
        """Extend the lock held under ``lock_token`` by the entity's lock duration; returns the
        new expiry. ``sequence_number`` as for ``settle_message_by_lock_token``.

        Raises ``MessageLockLostError`` (nothing changed) when the broker holds no such lock,
        and ``InvalidArgumentError`` in a session receiver (renew the session's lock instead).
        With ``transaction`` the lock is extended at the commit (by the lock duration from
        then); the expiry returned is the lock's as it stands now, which the renewal can only
        move later.
        """
        token = check_lock_token(lock_token, self.entity_path)
        if self.session is not None:
            raise InvalidArgumentError(
                "a session's messages are locked by the session: renew the session lock "
                "(receiver.session.renew_lock()) instead",
                self.entity_path,
                "lock_token",
            )
        self._check_peek_lock()
        pid = await self._token_partition(sequence_number)
        if transaction is not None:
            now = await self._held_lock(token, pid)
            route = await self._conn.route(self.entity_path)
            await transaction.add_renew_in(route, pid, token)
            return now
        (result,) = await self._call("renew_locks", [token], partition=pid, timeout=timeout)
        if isinstance(result, ServiceBusError):
            raise result
        expiry = from_timestamp(result)
        assert expiry is not None
        return expiry

    async def _held_lock(self, token: str, partition: int) -> datetime:
        """The lock's expiry, asked of the partition without changing it; raises
        ``MessageLockLostError`` when the partition holds no such lock."""
        (result,) = await self._call("lock_expiries", [token], partition=partition)
        if isinstance(result, ServiceBusError):
            raise self._session_error(result)
        expiry = from_timestamp(result)
        assert expiry is not None
        return expiry

    def _check_peek_lock(self) -> None:
        if self._delete:
            raise InvalidArgumentError(
                "a RECEIVE_AND_DELETE receiver holds no locks to settle or renew",
                self.entity_path,
                "receive_mode",
            )

    def _token_op(
        self,
        lock_token: Any,
        disposition: Any,
        properties: Any,
        reason: Any,
        description: Any,
    ) -> SettleOp:
        """The settlement, validated before anything is sent."""
        entity = self.entity_path
        token = check_lock_token(lock_token, entity)
        try:
            kind = _KINDS[ServiceBusDisposition(disposition)]
        except ValueError:
            raise InvalidArgumentError(
                f"disposition {disposition!r} is not a ServiceBusDisposition", entity, "disposition"
            ) from None
        self._check_peek_lock()
        if properties is not None:
            if kind == COMPLETE:
                raise InvalidArgumentError(
                    "a completed message is gone: properties_to_modify does not apply",
                    entity,
                    "properties_to_modify",
                )
            properties = checked_properties_to_modify(properties, entity)
        for value, name in (
            (reason, "dead_letter_reason"),
            (description, "dead_letter_error_description"),
        ):
            if value is None:
                continue
            if kind != DEAD_LETTER:
                raise InvalidArgumentError(f"{name} goes with DEAD_LETTERED only", entity, name)
            if not isinstance(value, str):
                raise InvalidArgumentError(f"{name} must be a str", entity, name)
        return SettleOp(kind, token, properties or None, reason, description)

    async def _token_partition(self, sequence_number: Any) -> int:
        """The partition holding the lock (see the module docstring)."""
        seq = _check_sequence_number(sequence_number, self.entity_path)
        self._no_transfer_locks()
        if self.session is not None:
            self.session.check_held()
            _sid, _token, pid = await self.session.ensure()
            return pid if seq is None else seq >> 48
        if seq is not None:
            return seq >> 48
        route = await self._conn.route(self.entity_path)
        self._check_receivable(route)
        if not route.single:
            raise InvalidArgumentError(
                f"{self.entity_path!r} has {len(route.partitions)} partitions: pass the "
                "message's sequence_number, which names the one holding the lock",
                self.entity_path,
                "sequence_number",
            )
        return 0
