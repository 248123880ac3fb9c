"""AMQP 1.0 transactions (part 4 of the spec) onto raybus transactions.

* A link whose target is the ``coordinator`` is a ``Coordinator``: ``declare`` answers
  ``declared`` with a new transaction id; ``discharge`` commits (``fail`` false) or rolls back.
* A transfer on a sender link whose ``state`` is ``transactional-state(txn-id)`` is sent
  inside that transaction (``send_messages(..., transaction=)``), and answered
  ``transactional-state(txn-id, accepted)``.
* A disposition of a delivery we sent whose state is ``transactional-state(txn-id, outcome)``
  applies ``outcome`` inside the transaction (``complete_message(..., transaction=)`` and the
  abandon / defer / dead-letter twins); the delivery is answered
  ``transactional-state(txn-id, outcome)``, settled.

Each declared AMQP transaction is one ``raybus.aio.ServiceBusTransaction``, created at its
first operation with the raybus client of that operation's entity (the credential the
connection presented for it), so raybus's guarantees hold: nothing is visible before the
commit, a commit is atomic across entities and partitions, a rollback discards the sends and
leaves the settled messages locked by their receiver. After a rollback such a message can
be settled again by its lock token (``$management`` ``update-disposition``), or its lock runs
out and it is delivered again; its delivery on the link was settled by the answer.

Guarantees at discharge: the transactional transfers and dispositions that arrived on the
connection before the ``discharge`` are part of the transaction (their joining finishes
first). An operation that could not join (a bad outcome, an oversize message, a transaction
over 100 messages) is answered ``rejected`` at once and makes the transaction
rollback-only: its commit is refused with ``amqp:transaction:rollback`` and nothing of it
takes effect. A transaction the connection leaves undischarged is rolled back (nothing of it
was sent to the broker). A ``$management`` request whose transfer carries a
``transactional-state`` joins too when it is ``update-disposition`` (of any lock token of the
entity), ``renew-lock`` or ``schedule-message`` (``_management.ManagementRequests._run_in``);
other requests are refused in one. Distributed transactions (``declare`` with a
``global-id``) are refused: raybus's coordinator is the only transaction manager.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..enums import ServiceBusDisposition
from ..exceptions import (
    InvalidArgumentError,
    ServiceBusError,
    TransactionAbortedError,
)
from ._codec import DecodeError, Described
from ._errors import TransactionUnknownError, condition_of
from ._frames import as_performative, described_list, error
from ._links import Delivery, IncomingLink, Outcome
from ._message import Sections

if TYPE_CHECKING:
    from .. import aio
    from ._connection import AmqpConnection

__all__ = ["AmqpTransaction", "Coordinator", "Transactions"]

_LOG = logging.getLogger("raybus.amqp")
_T = TypeVar("_T")


def _rejected(exc: BaseException) -> Described:
    return described_list("rejected", error=error(condition_of(exc), str(exc)))


class AmqpTransaction:
    """One declared transaction: its raybus transaction (from the first operation on), the
    deliveries it settled, and the first operation that failed to join it."""

    def __init__(self, txn_id: bytes) -> None:
        self.id = txn_id
        self.failure: BaseException | None = None
        self._raybus: aio.ServiceBusTransaction | None = None
        self._settled: list[str] = []  # lock tokens, released from the locks at commit

    def _joined(self, client: aio.ServiceBusClient) -> aio.ServiceBusTransaction:
        if self._raybus is None:
            self._raybus = client.transaction()
        return self._raybus

    async def join(
        self,
        client: aio.ServiceBusClient,
        work: Callable[[aio.ServiceBusTransaction], Awaitable[_T]],
        settles: str | None = None,
    ) -> _T:
        """``work(transaction)``: one operation joining this transaction, a raybus call given
        ``transaction=``. Its failure makes the transaction rollback-only. ``settles``: the
        lock token it settles (forgotten by the connection at the commit)."""
        try:
            result = await work(self._joined(client))
        except (ServiceBusError, ValueError) as exc:
            self.failure = self.failure or exc
            raise
        if settles is not None:
            self._settled.append(settles)
        return result

    async def send(
        self, client: aio.ServiceBusClient, sender: aio.ServiceBusSender, messages: list[Any]
    ) -> None:
        await self.join(client, lambda txn: sender.send_messages(messages, transaction=txn))

    async def settle(
        self,
        client: aio.ServiceBusClient,
        receiver: aio.ServiceBusReceiver,
        message: Any,
        outcome: Outcome | None,
    ) -> None:
        async def apply(txn: aio.ServiceBusTransaction) -> None:
            if outcome is None:
                raise DecodeError("a transactional disposition needs an outcome")
            kind = outcome.disposition
            if kind is ServiceBusDisposition.COMPLETED:
                await receiver.complete_message(message, transaction=txn)
            elif kind is ServiceBusDisposition.ABANDONED:
                await receiver.abandon_message(message, outcome.properties, transaction=txn)
            elif kind is ServiceBusDisposition.DEFERRED:
                await receiver.defer_message(message, outcome.properties, transaction=txn)
            elif kind is ServiceBusDisposition.DEAD_LETTERED:
                await receiver.dead_letter_message(
                    message,
                    outcome.reason,
                    outcome.description,
                    outcome.properties,
                    transaction=txn,
                )
            else:  # released: raybus's transactions have no such operation
                raise InvalidArgumentError(
                    "a released outcome cannot join a transaction (use modified: abandon)",
                    receiver.entity_path,
                    "outcome",
                )

        await self.join(client, apply, settles=message.lock_token or "")

    async def commit(self, conn: AmqpConnection) -> None:
        """Commit; raises what refused it (then nothing of it took effect)."""
        if self.failure is not None:
            await self.rollback()
            raise TransactionAbortedError(
                f"an operation of the transaction failed: {self.failure}",
                None,
                self.id.hex(),
                "operation",
                self.failure,
            )
        if self._raybus is not None:
            await self._raybus.commit()
        for token in self._settled:
            conn.release(token)

    async def rollback(self) -> None:
        if self._raybus is not None:
            await self._raybus.rollback()
        self._settled.clear()  # still locked: ``$management`` can settle them by lock token


class Transactions:
    """A connection's declared transactions and its transactional work in flight."""

    def __init__(self) -> None:
        self.declared: dict[bytes, AmqpTransaction] = {}
        self._in_flight: set[asyncio.Future[Any]] = set()

    def declare(self) -> AmqpTransaction:
        txn = AmqpTransaction(uuid.uuid4().bytes)
        self.declared[txn.id] = txn
        return txn

    def get(self, txn_id: Any, entity: str | None = None) -> AmqpTransaction:
        txn = self.declared.get(bytes(txn_id)) if isinstance(txn_id, bytes) else None
        if txn is None:
            raise TransactionUnknownError(
                f"transaction {txn_id!r:.60} is not declared on this connection",
                entity,
                "txn-id",
            )
        return txn

    def track(self, work: asyncio.Future[Any]) -> None:
        """Transactional work a later discharge must wait for (called in frame order)."""
        self._in_flight.add(work)
        work.add_done_callback(self._in_flight.discard)

    async def discharge(self, conn: AmqpConnection, txn_id: Any, fail: bool) -> Described:
        """The outcome state answering a ``discharge``."""
        try:
            txn = self.get(txn_id)
        except TransactionUnknownError as exc:
            return _rejected(exc)
        # Work that arrived before this discharge joins first (it looks the transaction up,
        # so the transaction stays declared until that is done).
        if self._in_flight:
            await asyncio.gather(*list(self._in_flight), return_exceptions=True)
        if self.declared.pop(txn.id, None) is None:
            return _rejected(TransactionUnknownError("discharged twice", None, "txn-id"))
        if fail:
            await txn.rollback()
            return described_list("accepted")
        try:
            await txn.commit(conn)
        except (ServiceBusError, ValueError) as exc:
            # A refusal (amqp:transaction:rollback or :timeout): nothing took effect. Any
            # other error (the coordinator unreachable) leaves the outcome unknown, and says
            # so by its own condition.
            _LOG.info("amqp %s: transaction %s not committed: %s", conn.id, txn.id.hex(), exc)
            return _rejected(exc)
        return described_list("accepted")

    async def close(self) -> None:
        """The connection is gone: roll back what it left undischarged."""
        for txn in list(self.declared.values()):
            await txn.rollback()
        self.declared.clear()


class Coordinator(IncomingLink):
    """The transaction controller's link (target ``coordinator``): declare and discharge."""

    def on_message(self, delivery: Delivery) -> None:
        self.conn.spawn(self._control(delivery.id, delivery.payload, delivery.settled))

    async def _control(self, delivery_id: Any, payload: bytes, settled: bool) -> None:
        transactions = self.conn.transactions
        try:
            body = Sections(payload).body
            control = as_performative(body[0][1] if body else None)
            if control.name == "declare":
                if control.get("global_id") is not None:
                    raise InvalidArgumentError(
                        "global (distributed) transactions are not supported", None, "global-id"
                    )
                reply = described_list("declared", txn_id=transactions.declare().id)
            elif control.name == "discharge":
                fail = bool(control.get("fail"))
                reply = await transactions.discharge(self.conn, control.get("txn_id"), fail)
            else:
                raise InvalidArgumentError(
                    f"a coordinator takes declare or discharge, not {control.name}",
                    None,
                    "body",
                )
        except (ServiceBusError, ValueError) as exc:  # DecodeError is a ValueError
            reply = _rejected(exc)
        if not settled:
            self.settle(delivery_id, reply)
