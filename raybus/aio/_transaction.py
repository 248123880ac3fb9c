"""Transactions: sends and settlements that all take effect or none does.

``async with client.transaction() as txn:`` collects the operations given ``transaction=txn``
and commits them on a clean exit (rolls back on an exception); ``txn.commit()`` and
``txn.rollback()`` do it explicitly. Operations: ``send_messages``, ``schedule_messages``,
``complete_message``, ``abandon_message``, ``dead_letter_message``, ``defer_message``,
``renew_message_lock``, and by lock token ``settle_message_by_lock_token`` and
``renew_message_lock_by_lock_token`` (``add_settle_in`` / ``add_renew_in``). Receiving is
not transactional (receive in PEEK_LOCK mode, then settle inside the transaction); a
RECEIVE_AND_DELETE receiver cannot join one.

Guarantees: atomic across every partition, queue and topic of the namespace (a send to a topic
joins with the copies its subscriptions' rules select) (two-phase commit through
the namespace's coordinator actor, ``raybus._actors.coordinator``). Until ``commit`` returns,
nothing of the transaction is visible: its sends are not in any queue and its settlements have
not happened. The operations are checked when added (what the client can check: sizes,
settled-twice) and by the broker at commit (locks still held, quotas, status); any refusal
rolls everything back and raises ``TransactionAbortedError``. A rollback leaves the messages
it would have settled locked by you (until their locks end) and discards the sends. Messages
sent get their sequence numbers at commit, in the transaction's order, so
``schedule_messages`` in a transaction returns no numbers. At most 100 messages per
transaction (``TransactionSizeExceededError``); a transaction not committed within two minutes
of its first operation is rolled back (``TransactionTimeoutError``). If ``commit`` raises
``ServiceBusConnectionError`` or ``OperationTimeoutError`` the outcome is unknown (it is
still all-or-nothing).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from .. import _rpc
from .._actors.namespace import Route, TopicRoute
from .._connection import Connection
from .._core.fanout import plan
from .._core.record import MessageRecord, to_wire
from .._core.registry import partition_actor_name
from .._core.store import SettleOp
from ..exceptions import (
    InvalidArgumentError,
    MessagingEntityNotFoundError,
    PartitionMovedError,
    TransactionAbortedError,
    TransactionSizeExceededError,
    TransactionTimeoutError,
)
from ..message import ServiceBusReceivedMessage

if TYPE_CHECKING:
    from ._sender import ServiceBusSender

__all__ = ["MAX_MESSAGES", "TIMEOUT_S", "ServiceBusTransaction"]

MAX_MESSAGES = 100
TIMEOUT_S = 120.0
_MOVED_RETRIES = 5


class _Share:
    __slots__ = ("entity", "name", "ops", "renews", "sends")

    def __init__(self, name: str, entity: str) -> None:
        self.name, self.entity = name, entity
        self.sends: list[MessageRecord] = []
        self.ops: list[SettleOp] = []
        self.renews: list[str] = []


class ServiceBusTransaction:
    """One transaction (get it from ``ServiceBusClient.transaction()``); not reusable."""

    def __init__(self, connection: Connection) -> None:
        self._conn = connection
        self.transaction_id = uuid.uuid4().hex
        self._shares: dict[str, _Share] = {}
        self._sent: list[tuple[ServiceBusSender, list[MessageRecord]]] = []
        self._settled: list[ServiceBusReceivedMessage] = []
        self._renewed: list[tuple[ServiceBusReceivedMessage, float]] = []
        self._count = 0
        self._started: float | None = None
        self.state = "open"  # open, committed, rolled back

    # ------------------------------------------------------------------ collecting

    def _admit(self, count: int, entity: str | None) -> None:
        if self.state != "open":
            raise InvalidArgumentError(
                f"the transaction is {self.state}; start a new one", entity, "transaction"
            )
        if self._count + count > MAX_MESSAGES:
            raise TransactionSizeExceededError(
                f"a transaction holds at most {MAX_MESSAGES} messages; it has {self._count} "
                f"and this adds {count}",
                entity,
            )
        if self._started is None:
            self._started = time.monotonic()

    def _share(self, route: Route, pid: int) -> _Share:
        name = partition_actor_name(
            self._conn.namespace, route.properties.name, route.incarnation, pid
        )
        share = self._shares.get(name)
        if share is None:
            share = self._shares[name] = _Share(name, route.properties.name)
        return share

    async def add_send(self, sender: ServiceBusSender, records: list[MessageRecord]) -> None:
        self._admit(len(records), sender.entity_path)
        self._count += len(records)
        self._sent.append((sender, records))

    async def add_settle(
        self, route: Route, message: ServiceBusReceivedMessage, op: SettleOp
    ) -> None:
        await self.add_settle_in(route, message.partition_id, op)
        message._settled = True  # settled by this transaction (undone if it rolls back)
        self._settled.append(message)

    async def add_renew(self, route: Route, message: ServiceBusReceivedMessage) -> None:
        await self.add_renew_in(route, message.partition_id, message.lock_token or "")
        self._renewed.append((message, route.properties.lock_duration_s))

    async def add_settle_in(self, route: Route, partition_id: int, op: SettleOp) -> None:
        """A settlement by lock token alone (no message object: settle by lock token) of a
        lock that partition ``partition_id`` holds."""
        self._admit(1, route.properties.name)
        self._count += 1
        self._share(route, partition_id).ops.append(op)

    async def add_renew_in(self, route: Route, partition_id: int, lock_token: str) -> None:
        """A renewal by lock token alone, as ``add_settle_in``."""
        self._admit(1, route.properties.name)
        self._count += 1
        self._share(route, partition_id).renews.append(lock_token)

    # ------------------------------------------------------------------ ending

    async def _place_sends(self, refresh: bool) -> dict[str, _Share]:
        """The shares with this transaction's sends placed by the current partition maps."""
        shares = {n: _Share(s.name, s.entity) for n, s in self._shares.items()}
        for name, s in self._shares.items():
            shares[name].ops, shares[name].renews = s.ops, s.renews
        for sender, records in self._sent:
            route = await self._conn.route(sender.entity_path, refresh=refresh)
            if isinstance(route, TopicRoute):
                # The topic's copies, by its subscriptions' rules, join the transaction.
                _v, _props, subs = await _rpc.call(
                    route.properties.name,
                    self._conn.registry_for(route.properties.name).router_config,
                    route.properties.name,
                )
                routes = {t.path: r for t, r in subs}
                placed = [
                    (routes[path], copies)
                    for path, copies in plan([t for t, _r in subs], records).items()
                ]
            else:
                placed = [(route, records)]
            for target, recs in placed:
                for pid, idxs in sender._groups(target, recs).items():
                    name = partition_actor_name(
                        self._conn.namespace, target.properties.name, target.incarnation, pid
                    )
                    share = shares.get(name)
                    if share is None:
                        share = shares[name] = _Share(name, target.properties.name)
                    share.sends.extend(recs[i] for i in idxs)
        return shares

    async def commit(self) -> None:
        """Make every operation take effect, atomically; raises ``TransactionAbortedError``
        (nothing took effect) or ``TransactionTimeoutError``."""
        if self.state != "open":
            raise InvalidArgumentError(
                f"the transaction is {self.state}; start a new one", None, "transaction"
            )
        if self._started is not None and time.monotonic() - self._started > TIMEOUT_S:
            self._end("rolled back")
            raise TransactionTimeoutError(
                f"the transaction was not committed within {TIMEOUT_S:.0f} s of its first "
                "operation and was rolled back",
                None,
                self.transaction_id,
                "timeout",
            )
        try:
            for attempt in range(_MOVED_RETRIES):
                shares = await self._place_sends(refresh=attempt > 0)
                participants = [
                    (
                        s.name,
                        s.entity,
                        to_wire(s.sends),
                        [op.to_wire() for op in s.ops],
                        s.renews,
                    )
                    for s in shares.values()
                    if s.sends or s.ops or s.renews
                ]
                if not participants:
                    break
                try:
                    await _rpc.call(
                        None, self._conn.coordinator.commit, self.transaction_id, participants
                    )
                    break
                except TransactionAbortedError as exc:
                    moved = isinstance(
                        exc.cause, PartitionMovedError | MessagingEntityNotFoundError
                    )
                    if not moved or attempt == _MOVED_RETRIES - 1:
                        raise
        except BaseException:
            self._end("rolled back")
            raise
        self.state = "committed"
        now = time.time()
        for message, lock_s in self._renewed:  # the broker extended them at commit
            record = message._record
            record.locked_until = max(record.locked_until, now + lock_s)

    async def rollback(self) -> None:
        """Discard the transaction: nothing of it takes effect."""
        if self.state == "open":
            self._end("rolled back")

    def _end(self, state: str) -> None:
        self.state = state
        for message in self._settled:
            message._settled = False  # still locked by its receiver: it may settle again

    async def __aenter__(self) -> ServiceBusTransaction:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            await self.rollback()
        elif self.state == "open":
            await self.commit()
