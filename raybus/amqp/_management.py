"""The ``$cbs`` (claims-based security) and ``$management`` request/response nodes.

Both are request/response over a link pair: requests arrive on the node's incoming link and the
answer goes out on the same connection's outgoing link for the node, with ``correlation-id`` =
the request's ``message-id``.

* ``$cbs`` ``put-token``: the token is parsed with ``raybus.auth.parse_sas_token`` (malformed or
  expired -> 401) and kept per connection and audience; links attached afterwards run their
  raybus calls through a client holding ``SasTokenCredential(token)``. The actors check it.
* ``$management``: the operations of the Service Bus request/response protocol, each translated
  to one raybus client call (table in ``docs/AMQP.md``). Status codes: 200 (or 204 when
  nothing matched), else the code and ``errorCondition`` of ``raybus.amqp._errors``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..aio import EntityInfo, ServiceBusClient, ServiceBusSender, ServiceBusTransaction
from ..auth import parse_sas_token
from ..enums import ServiceBusDisposition, ServiceBusReceiveMode
from ..exceptions import (
    InvalidArgumentError,
    MessageLockLostError,
    ServiceBusAuthenticationError,
    ServiceBusError,
    SessionLockLostError,
)
from ..message import ServiceBusMessage
from ._codec import Array, Described, Int, Symbol, Timestamp, ULong, encode
from ._errors import condition_of, status_of
from ._frames import transactional
from ._links import (
    Delivery,
    EntityReceiver,
    IncomingLink,
    Outcome,
    ReplyLink,
    settle,
    settle_by_token,
)
from ._locks import by_token
from ._message import Sections, from_received, to_raybus
from ._rules import rule_description, rule_from_request
from ._transactions import AmqpTransaction

__all__ = ["CbsRequests", "ManagementRequests"]

_LOG = logging.getLogger("raybus.amqp")
_PREFIX = "com.microsoft:"
_MAX_DATETIME_MS = 253402300800000
_DISPOSITIONS = {  # the protocol's names (its spelling)
    "completed": ServiceBusDisposition.COMPLETED,
    "abandoned": ServiceBusDisposition.ABANDONED,
    "defered": ServiceBusDisposition.DEFERRED,
    "suspended": ServiceBusDisposition.DEAD_LETTERED,
}


def _response(
    correlation_id: Any,
    status: int,
    description: str,
    body: Any = None,
    condition: str | None = None,
    *,
    status_key: str = "statusCode",
) -> bytes:
    props = [None, None, None, None, None, correlation_id]
    app: dict[str, Any] = {
        status_key: Int(status),
        status_key.replace("Code", "Description").replace("code", "description"): description,
    }
    if condition is not None:
        app["errorCondition"] = Symbol(condition)
    return (
        encode(Described(ULong(0x73), props))
        + encode(Described(ULong(0x74), app))
        + encode(Described(ULong(0x77), body))
    )


def _sequence_numbers(args: dict[str, Any]) -> list[int]:
    """The request's ``sequence-numbers`` (an array of longs) as ints."""
    seqs = args.get("sequence-numbers")
    items = seqs.items if isinstance(seqs, Array) else seqs
    if not isinstance(items, list | tuple) or not all(
        isinstance(s, int) and not isinstance(s, bool) for s in items
    ):
        raise InvalidArgumentError(
            "sequence-numbers must be an array of longs", None, "sequence-numbers"
        )
    return [int(s) for s in items]


def _disposition_outcome(args: dict[str, Any]) -> Outcome:
    """The settlement an ``update-disposition`` request asks for."""
    kind = _DISPOSITIONS.get(str(args.get("disposition-status")))
    if kind is None:
        raise InvalidArgumentError(
            f"unknown disposition-status {args.get('disposition-status')!r}",
            None,
            "disposition-status",
        )
    props = args.get("properties-to-modify")
    props = {str(k): v for k, v in props.items()} if isinstance(props, dict) else None
    reason = args.get("deadletter-reason")
    description = args.get("deadletter-description")
    dead_letter = kind is ServiceBusDisposition.DEAD_LETTERED
    return Outcome(
        kind,
        props,
        None if reason is None or not dead_letter else str(reason),
        None if description is None or not dead_letter else str(description),
    )


def _scheduled(args: dict[str, Any]) -> list[tuple[ServiceBusMessage, datetime]]:
    """The messages a ``schedule-message`` request names, each with its time; all checked
    before any is scheduled, so a bad entry schedules none."""
    entries = args.get("messages")
    if not isinstance(entries, list):
        raise InvalidArgumentError("messages must be a list", None, "messages")
    out = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("message"), bytes):
            raise InvalidArgumentError(
                "each scheduled message needs an encoded message", None, "messages"
            )
        msg = to_raybus(entry["message"])
        at = msg.scheduled_enqueue_time_utc
        if at is None:
            raise InvalidArgumentError(
                "a scheduled message needs x-opt-scheduled-enqueue-time", None, "messages"
            )
        out.append((msg, at))
    return out


def _schedule_in(
    sender: ServiceBusSender, message: ServiceBusMessage, at: datetime
) -> Callable[[ServiceBusTransaction], Awaitable[list[int]]]:
    """Scheduling ``message`` as an operation joining a transaction."""
    return lambda transaction: sender.schedule_messages(message, at, transaction=transaction)


def _reply_link(link: IncomingLink, address: str) -> ReplyLink | None:
    """The connection's outgoing link for ``address`` (this session's first)."""
    sessions = [link.session, *link.conn.sessions.values()]
    for session in sessions:
        for other in session.links.values():
            if isinstance(other, ReplyLink) and other.address == address:
                return other
    return None


class CbsRequests(IncomingLink):
    """``put-token`` requests on ``$cbs``."""

    def on_message(self, delivery: Delivery) -> None:
        req = Sections(delivery.payload)
        app = {str(k): v for k, v in req.app_properties.items()}
        message_id = req.properties.get("message_id")
        status, text = 202, "Accepted"
        try:
            if app.get("operation") != "put-token":
                raise InvalidArgumentError(
                    f"unknown $cbs operation {app.get('operation')!r}", None, "operation"
                )
            token = req.body[0][1] if req.body else None
            if not isinstance(token, str):
                raise ServiceBusAuthenticationError(
                    "the put-token body is not a string token", None
                )
            parsed = parse_sas_token(token)
            if parsed.expiry <= time.time():
                raise ServiceBusAuthenticationError("the SAS token has expired", None)
            self.conn.tokens[str(app.get("name") or parsed.resource)] = token
        except ServiceBusError as exc:
            status, text = status_of(exc), str(exc)
        if not delivery.settled:
            self.settle(delivery.id, Described(ULong(0x24), []))
        reply = _reply_link(self, "$cbs")
        if reply is not None:
            reply.reply(_response(message_id, status, text, status_key="status-code"))


class ManagementRequests(IncomingLink):
    """Requests on ``<entity>/$management``; each runs as its own task."""

    def on_message(self, delivery: Delivery) -> None:
        if not delivery.settled:
            self.settle(delivery.id, Described(ULong(0x24), []))
        in_txn = transactional(delivery.state)
        txn_id = None if in_txn is None else in_txn[0]
        work = self.conn.spawn(self._serve(delivery.payload, txn_id))
        if txn_id is not None:
            self.conn.transactions.track(work)  # a discharge after this frame waits for it

    async def _serve(self, payload: bytes, txn_id: Any = None) -> None:
        req = Sections(payload)
        props = req.properties
        app = {str(k): v for k, v in req.app_properties.items()}
        body = req.body[0][1] if req.body else None
        operation = str(app.get("operation", ""))
        reply_to = str(props.get("reply_to") or self.address)
        try:
            if not isinstance(body, dict):
                raise InvalidArgumentError("a management request body must be a map", None, "body")
            args = {str(k): v for k, v in body.items()}
            if txn_id is None:
                status, result = await self._run(operation, args, app)
            else:
                status, result = await self._run_in(txn_id, operation, args)
            text = "OK" if status == 200 else "No Content"
            response = _response(props.get("message_id"), status, text, result)
        except (ServiceBusError, ValueError, TypeError) as exc:  # TypeError: ill-typed fields
            _LOG.info("amqp $management %s on %s: %s", operation, self.address, exc)
            response = _response(
                props.get("message_id"), status_of(exc), str(exc), None, condition_of(exc)
            )
        reply = _reply_link(self, reply_to)
        if reply is not None:
            reply.reply(response)

    def _entity_link(self, app: dict[str, Any], args: dict[str, Any]) -> EntityReceiver | None:
        """The receiver link the request is about: ``associated-link-name``, else one on this
        connection for the same entity (and session, if named)."""
        name = app.get("associated-link-name")
        entity = self.address[: -len("$management")].rstrip("/").lower()
        session_id = args.get("session-id")
        for session in self.conn.sessions.values():
            for link in session.links.values():
                # (a link still attaching has no receiver yet)
                if not isinstance(link, EntityReceiver) or link.is_detached:
                    continue
                if getattr(link, "receiver", None) is None:
                    continue
                if name is not None and link.name == str(name):
                    return link
                path = self.gateway.parse_address(link.address).raw.lower()
                if path != entity:
                    continue
                own = link.receiver.session
                same = session_id is None or (own is not None and own.session_id == session_id)
                if same and name is None:
                    return link
        return None

    async def _run_in(self, txn_id: Any, op: str, args: dict[str, Any]) -> tuple[int, Any]:
        """A request inside a transaction (its transfer's ``transactional-state``). Three
        operations join it, as Service Bus lets them (settle, renew lock, schedule):

        * ``update-disposition``: of a lock this connection delivered (through the receiver
          holding the message), or of any other lock token of the entity: the partition holding
          it is found as outside a transaction (``_locks``), asked (changing nothing) that the
          lock is held, and the settlement joins; at the commit the broker applies it.
        * ``renew-lock``: Service Bus counts a renewal among a transaction's operations, and
          raybus's transactions take one: the lock is extended at the commit (by the lock
          duration from then), and not at all on a rollback. The ``expirations`` answered are
          the locks' expiries as they stand (the renewal can only move them later).
        * ``schedule-message``: the messages are scheduled at the commit, nothing on a
          rollback. raybus numbers a transaction's messages at its commit, so the answer's
          ``sequence-numbers`` is empty (Service Bus numbers them at once; a deviation: cancel
          one after the commit, by the number a peek shows).

        Anything else is refused. A refused request (a lock not held, a bad argument) answers
        its error and makes the transaction rollback-only, as any operation that fails to join
        does (``_transactions``); it changes nothing else."""
        txn = self.conn.transactions.get(txn_id, self.address)
        joining = {
            _PREFIX + "update-disposition": self._settle_in,
            _PREFIX + "renew-lock": self._renew_in,
            _PREFIX + "schedule-message": self._schedule_in,
        }
        try:
            handler = joining.get(op)
            if handler is None:
                raise InvalidArgumentError(
                    f"{op!r} cannot run inside a transaction (update-disposition, renew-lock "
                    "and schedule-message can)",
                    self.address,
                    "operation",
                )
            address = self.gateway.parse_address(self.address)
            client = await self.gateway.client_for(self.conn, address.entity)
            return await handler(txn, client, args)
        except (ServiceBusError, ValueError) as exc:
            txn.failure = txn.failure or exc
            raise

    async def _settle_in(
        self, txn: AmqpTransaction, client: ServiceBusClient, args: dict[str, Any]
    ) -> tuple[int, Any]:
        outcome = _disposition_outcome(args)
        for lock in await self._locked(args.get("lock-tokens")):
            if lock.message is not None:
                await txn.settle(client, lock.receiver, lock.message, outcome)
            else:
                await txn.join(client, lock.settle_in(outcome), settles=lock.token)
        return 200, {}

    async def _renew_in(
        self, txn: AmqpTransaction, client: ServiceBusClient, args: dict[str, Any]
    ) -> tuple[int, Any]:
        expirations = []
        for lock in await self._locked(args.get("lock-tokens")):
            until = await txn.join(client, lock.renew)
            expirations.append(Timestamp(round(until.timestamp() * 1000)))
        return 200, {"expirations": Array(0x83, tuple(expirations))}

    async def _schedule_in(
        self, txn: AmqpTransaction, client: ServiceBusClient, args: dict[str, Any]
    ) -> tuple[int, Any]:
        scheduled = _scheduled(args)
        sender = await self.gateway.management_sender(self.conn, self.address)
        for msg, at in scheduled:
            await txn.join(client, _schedule_in(sender, msg, at))
        return 200, {"sequence-numbers": Array(0x81, ())}  # numbered at the commit

    async def _run(self, op: str, args: dict[str, Any], app: dict[str, Any]) -> tuple[int, Any]:
        if not op.startswith(_PREFIX):
            raise InvalidArgumentError(f"unknown management operation {op!r}", None, "operation")
        op = op[len(_PREFIX) :]
        handler = getattr(self, "_op_" + op.replace("-", "_"), None)
        if handler is None:
            raise InvalidArgumentError(
                f"management operation {op!r} is not supported", None, "operation"
            )
        result: tuple[int, Any] = await handler(args, app)
        return result

    def _session_receiver(self, args: dict[str, Any], app: dict[str, Any]) -> Any:
        link = self._entity_link(app, args)
        if link is None or link.receiver.session is None:
            raise SessionLockLostError(
                f"no receiver on this connection holds session {args.get('session-id')!r}",
                self.address,
            )
        return link.receiver

    async def _plain_receiver(
        self, args: dict[str, Any], app: dict[str, Any], mode: Any = None
    ) -> Any:
        link = self._entity_link(app, args)
        if link is not None:
            return link.receiver
        return await self.gateway.management_receiver(self.conn, self.address, mode)

    async def _op_peek_message(self, args: dict[str, Any], app: dict[str, Any]) -> tuple[int, Any]:
        start = int(args.get("from-sequence-number") or 0)
        count = max(1, int(args.get("message-count") or 1))
        if args.get("session-id") is not None:
            # A session lives in one partition, where 1 is before every sequence number.
            receiver = self._session_receiver(args, app)
            peeked = await receiver.peek_messages(count, sequence_number=max(start, 1))
        else:
            # The SDK's paging (from 1, then after the last shown) goes through every
            # partition; another number names one partition, as a native peek's does.
            peeked = await self.gateway.peek_pages(self.conn, self.address, start, count)
            if peeked is None:
                receiver = await self._plain_receiver(args, app)
                peeked = await receiver.peek_messages(count, sequence_number=start)
        if not peeked:
            return 204, None
        return 200, {"messages": [{"message": from_received(m, locked=False)} for m in peeked]}

    async def _locked(self, tokens: Any) -> list[_Lock]:
        """The locks the request names: those this connection delivered (settled through the
        receiver that received them), then any other of this entity's (see ``_locks``)."""
        items = tokens.items if isinstance(tokens, Array) else tokens
        if not isinstance(items, list | tuple):
            raise InvalidArgumentError("lock-tokens must be an array of uuids", None, "lock-tokens")
        out: list[_Lock] = []
        info: EntityInfo | None = None
        receiver: Any = None
        for t in items:
            token = str(t.value if isinstance(t, Described) else t)
            held = self.conn.locks.get(token)
            if held is not None:
                link, msg = held
                out.append(_Lock(token, link.receiver, msg.sequence_number, (), msg))
                continue
            if info is None:  # looked up once, for the first token held elsewhere
                address = self.gateway.parse_address(self.address)
                client = await self.gateway.client_for(self.conn, address.entity)
                info = await client.resolve_entity(address.entity)
                if not info.requires_session:
                    receiver = await self.gateway.management_receiver(self.conn, self.address)
            if info.requires_session:
                # The session's lock owner settles its messages (Service Bus ties them to
                # the link that accepted the session), and this connection holds none.
                raise MessageLockLostError(
                    f"lock token {token} is not held by this connection: a session's messages "
                    "are settled and renewed by the receiver holding the session",
                    self.address,
                    token,
                )
            seq = self.gateway.lock_index.sequence_number(token)
            out.append(_Lock(token, receiver, seq, info.partition_ids, None))
        return out

    async def _op_renew_lock(self, args: dict[str, Any], app: dict[str, Any]) -> tuple[int, Any]:
        expirations = []
        for lock in await self._locked(args.get("lock-tokens")):
            until = await lock.renew()
            expirations.append(Timestamp(round(until.timestamp() * 1000)))
        return 200, {"expirations": Array(0x83, tuple(expirations))}

    async def _op_update_disposition(
        self, args: dict[str, Any], app: dict[str, Any]
    ) -> tuple[int, Any]:
        outcome = _disposition_outcome(args)
        for lock in await self._locked(args.get("lock-tokens")):
            await lock.settle(outcome, confirm=self.gateway.confirm_settlements)
            self.conn.release(lock.token)
        return 200, {}

    async def _op_receive_by_sequence_number(
        self, args: dict[str, Any], app: dict[str, Any]
    ) -> tuple[int, Any]:
        seqs = _sequence_numbers(args)
        delete = int(args.get("receiver-settle-mode", 1)) == 0
        mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE if delete else None
        if args.get("session-id") is not None:
            receiver = self._session_receiver(args, app)
        else:
            receiver = await self._plain_receiver(args, app, mode)
        got = await receiver.receive_deferred_messages(seqs)
        if not got:
            return 204, None
        out = []
        for m in got:
            item: dict[str, Any] = {"message": from_received(m, locked=not delete)}
            if m.lock_token:
                item["lock-token"] = uuid.UUID(m.lock_token)
                self.conn.hold(m.lock_token, _Held(receiver), m)
            out.append(item)
        return 200, {"messages": out}

    async def _op_batch_delete_messages(
        self, args: dict[str, Any], app: dict[str, Any]
    ) -> tuple[int, Any]:
        """Service Bus's batch delete (the .NET SDK's ``DeleteMessagesAsync``): up to
        ``message-count`` messages enqueued before ``enqueued-time-utc`` (default: now),
        deleted unreceived (``ServiceBusReceiver.delete_messages``); answers how many."""
        count = args.get("message-count")
        before = args.get("enqueued-time-utc")
        if isinstance(before, Timestamp):
            before = before.to_datetime()
        if args.get("session-id") is not None:
            receiver = self._session_receiver(args, app)
        else:
            receiver = await self._plain_receiver(args, app)
        deleted = await receiver.delete_messages(count, before_enqueued_time_utc=before)
        return 200, {"message-count": Int(deleted)}

    async def _op_schedule_message(
        self, args: dict[str, Any], app: dict[str, Any]
    ) -> tuple[int, Any]:
        scheduled = _scheduled(args)
        sender = await self.gateway.management_sender(self.conn, self.address)
        seqs: list[int] = []
        for msg, at in scheduled:
            seqs += await sender.schedule_messages(msg, at)
        return 200, {"sequence-numbers": Array(0x81, tuple(seqs))}

    async def _op_cancel_scheduled_message(
        self, args: dict[str, Any], app: dict[str, Any]
    ) -> tuple[int, Any]:
        seqs = _sequence_numbers(args)
        sender = await self.gateway.management_sender(self.conn, self.address)
        await sender.cancel_scheduled_messages(seqs)
        return 200, {}

    async def _op_get_session_state(
        self, args: dict[str, Any], app: dict[str, Any]
    ) -> tuple[int, Any]:
        receiver = self._session_receiver(args, app)
        state = await receiver.session.get_state()
        return 200, {"session-state": state}

    async def _op_set_session_state(
        self, args: dict[str, Any], app: dict[str, Any]
    ) -> tuple[int, Any]:
        receiver = self._session_receiver(args, app)
        state = args.get("session-state")
        if state is not None and not isinstance(state, bytes | str):
            raise InvalidArgumentError(
                "session-state must be binary or null", None, "session-state"
            )
        await receiver.session.set_state(state)
        return 200, {}

    async def _op_renew_session_lock(
        self, args: dict[str, Any], app: dict[str, Any]
    ) -> tuple[int, Any]:
        receiver = self._session_receiver(args, app)
        until = await receiver.session.renew_lock()
        return 200, {"expiration": Timestamp(round(until.timestamp() * 1000))}

    async def _rule_manager(self) -> Any:
        """The raybus rule manager of the subscription this node belongs to (``add-rule``,
        ``remove-rule`` and ``enumerate-rules``; ``raybus.aio.ServiceBusRuleManager``: the
        connection's token needs Listen on the subscription, as in Service Bus)."""
        address = self.gateway.parse_address(self.address)
        if address.topic is None or address.subscription is None or address.sub_queue:
            raise InvalidArgumentError(
                f"rules belong to a subscription, not to {address.raw!r}", address.raw, "address"
            )
        client = await self.gateway.client_for(self.conn, address.entity)
        return client.get_rule_manager(address.topic, address.subscription)

    async def _op_add_rule(self, args: dict[str, Any], app: dict[str, Any]) -> tuple[int, Any]:
        rule = rule_from_request(args)
        await (await self._rule_manager()).create_rule(
            rule.name, filter=rule.filter, action=rule.action
        )
        return 200, {}

    async def _op_remove_rule(self, args: dict[str, Any], app: dict[str, Any]) -> tuple[int, Any]:
        # The rule manager refuses a missing or empty name (InvalidArgumentError: 400).
        await (await self._rule_manager()).delete_rule(args.get("rule-name"))
        return 200, {}

    async def _op_enumerate_rules(
        self, args: dict[str, Any], app: dict[str, Any]
    ) -> tuple[int, Any]:
        rules = await (await self._rule_manager()).list_rules()
        skip, top = _page_bounds(args, len(rules))
        page = rules[skip : skip + top]
        if not page:
            return 204, None
        return 200, {"rules": [{"rule-description": rule_description(r)} for r in page]}

    async def _op_get_message_sessions(
        self, args: dict[str, Any], app: dict[str, Any]
    ) -> tuple[int, Any]:
        address = self.gateway.parse_address(self.address)
        client = await self.gateway.client_for(self.conn, address.entity)
        after = args.get("last-updated-time")
        after_dt: datetime | None = None
        # .NET's DateTime.MaxValue (253402300800000 ms) or beyond means "no filter": sessions
        # with messages or state (the service's default listing mode).
        if isinstance(after, int) and 0 < int(after) < _MAX_DATETIME_MS:
            after_dt = Timestamp(after).to_datetime()
        if address.subscription is not None and address.topic is not None:
            ids = await client.list_subscription_sessions(
                address.topic, address.subscription, state_updated_after=after_dt
            )
        else:
            ids = await client.list_queue_sessions(address.entity, state_updated_after=after_dt)
        skip, top = _page_bounds(args, len(ids))
        page = ids[skip : skip + top]
        if not page:
            return 204, None
        return 200, {"sessions-ids": Array(0xB1, tuple(page))}


def _page_bounds(args: dict[str, Any], count: int) -> tuple[int, int]:
    """A listing request's ``skip`` and ``top`` (absent or 0: all ``count``), checked."""
    bounds = []
    for name, default in (("skip", 0), ("top", count)):
        value = args.get(name)
        if value is None or (name == "top" and value == 0):
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(
                f"{name} must be a non-negative integer, not {value!r}", None, name
            )
        bounds.append(int(value))
    return bounds[0], bounds[1]


@dataclass(frozen=True)
class _Lock:
    """One lock a request names: ``message`` when this connection delivered it, else the
    entity's receiver, the sequence number if the gateway knows it, and the partitions to ask
    when it does not."""

    token: str
    receiver: Any
    sequence_number: int | None
    partition_ids: tuple[int, ...]
    message: Any

    async def renew(self, transaction: ServiceBusTransaction | None = None) -> datetime:
        """Renew the lock; with ``transaction``, join it (renewed at the commit) and return
        the lock's expiry as it stands."""
        if self.message is not None:
            until: datetime | None = await self.receiver.renew_message_lock(
                self.message, transaction=transaction
            )
            if until is None:  # joined: the lock is as it was until the commit
                until = self.message.locked_until_utc
            assert until is not None
            return until

        async def renew_in(seq: int | None) -> datetime:
            until: datetime = await self.receiver.renew_message_lock_by_lock_token(
                self.token, sequence_number=seq, transaction=transaction
            )
            return until

        return await by_token(renew_in, self.sequence_number, self.partition_ids)

    async def settle(self, outcome: Outcome, *, confirm: bool) -> None:
        if self.message is not None:
            await settle(self.receiver, self.message, outcome, confirm=confirm)
            return
        await self._settle_by_token(outcome, None)

    def settle_in(self, outcome: Outcome) -> Callable[[ServiceBusTransaction], Awaitable[None]]:
        """The settlement by lock token as an operation joining a transaction (only one
        partition holds the lock, so only it joins; the others refuse, changing nothing)."""
        return lambda transaction: self._settle_by_token(outcome, transaction)

    async def _settle_by_token(
        self, outcome: Outcome, transaction: ServiceBusTransaction | None
    ) -> None:
        async def settle_in(seq: int | None) -> None:
            await settle_by_token(self.receiver, self.token, seq, outcome, transaction)

        await by_token(settle_in, self.sequence_number, self.partition_ids)


class _Held:
    """Stands in for a link in ``conn.locks`` for messages received through $management."""

    def __init__(self, receiver: Any) -> None:
        self.receiver = receiver
