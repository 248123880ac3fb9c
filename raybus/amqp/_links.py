"""AMQP links: the generic incoming/outgoing halves (credit, multi-frame transfers,
dispositions) and the two entity links that carry messages into and out of raybus.

* ``EntitySender`` (the SDK sends, we receive): each delivery (a message or a 0x80013700
  batch) goes to ``raybus.aio.ServiceBusSender.send_messages`` in arrival order; the outcome
  (accepted, or rejected with the condition the SDK maps to its exception) is sent only after
  raybus answered, so *accepted means stored*.
* ``EntityReceiver`` (we send): a pump turns link credit into
  ``ServiceBusReceiver.receive_messages`` calls, never asking raybus for more than the credit, so
  the gateway buffers nothing (a gateway crash leaves only locks, which expire).
  Peek-lock deliveries carry the lock token as a 16-byte .NET-order tag; the SDK's disposition
  is applied through raybus and, when the SDK waits for it, echoed as the settled outcome (or
  ``rejected{com.microsoft:message-lock-lost}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from ..enums import NEXT_AVAILABLE_SESSION, ServiceBusDisposition, ServiceBusReceiveMode
from ..exceptions import ServiceBusError, SettlementFailedError
from ._codec import DecodeError, Described, Symbol, UInt, ULong
from ._connection import ProtocolError, lock_tag
from ._errors import condition_of
from ._frames import (
    Performative,
    as_performative,
    described_list,
    error,
    is_coordinator,
    transactional,
    transactional_answer,
)
from ._message import BATCH_FORMAT, from_received, split_batch, to_raybus

if TYPE_CHECKING:
    from ..aio import ServiceBusClient, ServiceBusReceiver, ServiceBusSender, ServiceBusTransaction
    from ..message import ServiceBusReceivedMessage
    from ._connection import Session

__all__ = ["Link", "make_link"]

_LOG = logging.getLogger("raybus.amqp")

_CREDIT = 256  # credit we grant a sending peer, topped up at half
_MAX_FETCH = 128  # most messages one receive call asks raybus for
_IDLE_WAIT_S = 1.0  # one receive call's wait while credit is outstanding
_DRAIN_WAIT_S = 0.05
SESSION_FILTER = Symbol("com.microsoft:session-filter")
_DOTNET_EPOCH_TICKS = 621355968000000000


class Delivery(NamedTuple):
    """A whole delivery from the peer (its transfer frames joined)."""

    id: Any  # the delivery-id (None when the peer sent it settled and did not number it)
    message_format: int
    payload: bytes
    settled: bool
    state: Any  # the transfer's: a ``transactional-state`` when sent inside a transaction


@dataclass(frozen=True)
class Outcome:
    """How the peer settled a delivery, in raybus's terms (``settle`` applies it)."""

    disposition: ServiceBusDisposition
    properties: dict[str, Any] | None = None
    reason: str | None = None
    description: str | None = None


def _terminus(value: Any, kind: str) -> Performative | None:
    if value is None or is_coordinator(value):  # (a Coordinator link: _transactions)
        return None
    return as_performative(value, kind)


class Link:
    """One attached link of a session. Subclasses set up in ``setup`` (may raise: the attach is
    then refused with the error) and start work in ``started``."""

    our_role_receiver = False

    def __init__(self, session: Session, attach: Performative) -> None:
        self.session = session
        self.conn = session.conn
        self.gateway = session.conn.gateway
        self.attach_frame = attach
        self.name = str(attach.get("name", ""))
        self.handle = int(attach.get("handle", 0))
        self.source = _terminus(attach.get("source"), "source")
        self.target = _terminus(attach.get("target"), "target")
        self.closing: asyncio.Task[None] | None = None
        self.is_detached = False
        self.reply_source: Any = attach.get("source")
        self.reply_properties: dict[Any, Any] | None = None
        self.max_message_size: int | None = None

    @property
    def address(self) -> str:
        term = self.target if self.our_role_receiver else self.source
        return "" if term is None else str(term.get("address", ""))

    async def setup(self) -> None:
        """Prepare the link (resolve the entity, lock a session); raise to refuse it."""

    def started(self) -> None:
        """Called once the attach reply is out."""

    async def attach(self) -> None:
        try:
            await self.setup()
        except (ServiceBusError, ValueError, DecodeError) as exc:
            self._refuse(exc)
            return
        if self.is_detached:
            return
        a = self.attach_frame
        self._send_attach(
            self.reply_source,
            a.get("target"),
            snd_settle_mode=a.get("snd_settle_mode"),
            rcv_settle_mode=a.get("rcv_settle_mode"),
            max_message_size=None
            if self.max_message_size is None
            else ULong(self.max_message_size),
            properties=self.reply_properties,
        )
        self.started()

    def _send_attach(self, source: Any, target: Any, **fields: Any) -> None:
        self.session.send(
            "attach",
            name=self.name,
            handle=UInt(self.handle),
            role=self.our_role_receiver,
            source=source,
            target=target,
            initial_delivery_count=None if self.our_role_receiver else UInt(0),
            **fields,
        )

    def _refuse(self, exc: BaseException) -> None:
        """Refuse the attach the AMQP way: attach with no terminus, then detach with the error."""
        _LOG.info("amqp link %r refused: %s", self.address, exc)
        a = self.attach_frame
        self._send_attach(
            None if not self.our_role_receiver else a.get("source"),
            None if self.our_role_receiver else a.get("target"),
        )
        self.detach_with_error(exc)

    def detach_with_error(self, exc: BaseException) -> None:
        if self.is_detached:
            return
        self.session.send(
            "detach",
            handle=UInt(self.handle),
            closed=True,
            error=error(condition_of(exc), str(exc)),
        )
        self.session.links.pop(self.handle, None)
        self.detached(None)

    def detached(self, err: Any) -> None:
        """The link is gone (peer detach, session end, connection loss): clean up once."""
        if self.is_detached:
            return
        self.is_detached = True
        self.closing = asyncio.get_running_loop().create_task(self.cleanup())

    async def cleanup(self) -> None:
        """Give back what the link holds."""

    def on_flow(self, perf: Performative) -> None:
        pass

    def on_transfer(self, perf: Performative, payload: memoryview) -> None:
        raise ProtocolError("amqp:illegal-state", "transfer on a link that sends")

    def on_disposition(self, delivery_id: int, state: Any, settled: bool) -> None:
        pass


class IncomingLink(Link):
    """The peer sends; we grant credit and assemble multi-frame deliveries."""

    our_role_receiver = True

    def __init__(self, session: Session, attach: Performative) -> None:
        super().__init__(session, attach)
        self.delivery_count = int(attach.get("initial_delivery_count", 0))
        self.credit = 0
        self._partial: bytearray | None = None
        self._first: Performative | None = None

    def started(self) -> None:
        self._grant()

    def _grant(self) -> None:
        self.credit = _CREDIT
        self.session.flow(
            handle=UInt(self.handle),
            delivery_count=UInt(self.delivery_count),
            link_credit=UInt(self.credit),
        )

    def on_transfer(self, perf: Performative, payload: memoryview) -> None:
        if self._first is None:
            self._first = perf
            self._partial = bytearray()
        assert self._partial is not None
        self._partial += payload
        if len(self._partial) > 64 * 1024 * 1024:
            raise ProtocolError("amqp:link:message-size-exceeded", "delivery over 64 MiB")
        if perf.get("more"):
            return
        first, data = self._first, bytes(self._partial)
        self._first = self._partial = None
        self.delivery_count = (self.delivery_count + 1) & 0xFFFFFFFF
        self.credit -= 1
        if self.credit < _CREDIT // 2 and not self.is_detached:
            self._grant()
        if perf.get("aborted"):
            return
        self.on_message(
            Delivery(
                first.get("delivery_id"),
                int(first.get("message_format", 0)),
                data,
                bool(first.get("settled") or perf.get("settled")),
                first.get("state"),
            )
        )

    def on_message(self, delivery: Delivery) -> None:
        """A whole delivery from the peer."""
        raise NotImplementedError

    def settle(self, delivery_id: Any, state: Described) -> None:
        if delivery_id is None or self.is_detached:
            return
        self.session.send(
            "disposition", role=True, first=UInt(delivery_id), settled=True, state=state
        )


class OutgoingLink(Link):
    """We send, within the credit the peer grants."""

    def __init__(self, session: Session, attach: Performative) -> None:
        super().__init__(session, attach)
        self.delivery_count = 0
        self.credit = 0
        self.drain = False
        self.credit_ready = asyncio.Event()

    def on_flow(self, perf: Performative) -> None:
        peer_count = perf.get("delivery_count")
        link_credit = int(perf.get("link_credit", 0))
        base = self.delivery_count if peer_count is None else int(peer_count)
        # Delivery counts are serial numbers (AMQP 1.0 2.6.7, RFC 1982): a peer whose count
        # lags ours (it has not seen our drain's flow yet; azure-servicebus never reads a
        # sender's flow) grants less than what we used already, which is no credit, not
        # 2**32 minus the difference.
        credit = (base + link_credit - self.delivery_count) & 0xFFFFFFFF
        self.credit = credit if link_credit and credit < 0x80000000 else 0
        self.drain = bool(perf.get("drain"))
        if self.credit > 0:
            self.credit_ready.set()
        else:
            self.credit_ready.clear()
        if perf.get("echo"):
            self._send_flow()
        self.credit_changed()

    def credit_changed(self) -> None:
        pass

    def _send_flow(self) -> None:
        self.session.flow(
            handle=UInt(self.handle),
            delivery_count=UInt(self.delivery_count),
            link_credit=UInt(self.credit),
            drain=self.drain or None,
        )

    def send(self, tag: bytes, payload: bytes, *, settled: bool) -> int:
        self.credit -= 1
        if self.credit <= 0:
            self.credit_ready.clear()
        self.delivery_count = (self.delivery_count + 1) & 0xFFFFFFFF
        return self.session.transfer(self, tag, payload, settled=settled)

    def drained(self) -> None:
        """Nothing more to send on a drain request: use up the credit and say so."""
        if self.drain and self.credit > 0:
            self.delivery_count = (self.delivery_count + self.credit) & 0xFFFFFFFF
            self.credit = 0
            self.credit_ready.clear()
            self._send_flow()


class ReplyLink(OutgoingLink):
    """``$cbs`` / ``$management`` replies, queued until the peer gives credit."""

    def __init__(self, session: Session, attach: Performative) -> None:
        super().__init__(session, attach)
        self._queue: list[bytes] = []

    def reply(self, payload: bytes) -> None:
        self._queue.append(payload)
        self.credit_changed()

    def credit_changed(self) -> None:
        while self._queue and self.credit > 0 and not self.is_detached:
            self.send(uuid.uuid4().bytes, self._queue.pop(0), settled=True)
        if not self._queue:
            self.drained()


def _outcome_name(state: Any) -> str | None:
    if not isinstance(state, Described):
        return None
    try:
        return as_performative(state).name
    except DecodeError:
        return None


def outcome_of(state: Any) -> Outcome | None:
    """The raybus settlement an AMQP outcome asks for; None for no outcome (or an unknown one)."""
    name = _outcome_name(state)
    fields = as_performative(state).fields if name else {}
    if name == "accepted":
        return Outcome(ServiceBusDisposition.COMPLETED)
    if name == "modified":
        props = fields.get("message_annotations") or None
        props = {str(k): v for k, v in props.items()} if isinstance(props, dict) else None
        undeliverable = fields.get("undeliverable_here")
        return Outcome(
            ServiceBusDisposition.DEFERRED if undeliverable else ServiceBusDisposition.ABANDONED,
            props,
        )
    if name == "rejected":
        info: Any = {}
        err = fields.get("error")
        if isinstance(err, Described):
            info = as_performative(err).get("info", {}) or {}
        info = {str(k): v for k, v in info.items()} if isinstance(info, dict) else {}
        return Outcome(
            ServiceBusDisposition.DEAD_LETTERED,
            None,
            info.get("DeadLetterReason"),
            info.get("DeadLetterErrorDescription"),
        )
    if name == "released":
        return Outcome(ServiceBusDisposition.RELEASED)
    return None


class EntityReceiver(OutgoingLink):
    """Messages from a queue, subscription or dead-letter sub-queue to the peer."""

    receiver: ServiceBusReceiver

    def __init__(self, session: Session, attach: Performative) -> None:
        super().__init__(session, attach)
        self.unsettled: dict[int, ServiceBusReceivedMessage] = {}
        self.peek_lock = int(attach.get("snd_settle_mode", 2)) != 1
        self._pump: asyncio.Task[None] | None = None
        self._receiving = False

    async def setup(self) -> None:
        source = self.source
        if source is None:
            raise DecodeError("a receiver link needs a source")
        address = self.gateway.parse_address(self.address)
        props = self.attach_frame.get("properties", {})
        filters = source.get("filter", {})
        if not isinstance(filters, dict) or not isinstance(props, dict):
            raise DecodeError("attach filter and properties must be maps")
        session_id: Any = None
        if SESSION_FILTER in filters:
            value = filters[SESSION_FILTER]
            if isinstance(value, Described):
                value = value.value
            session_id = NEXT_AVAILABLE_SESSION if value is None else str(value)
        timeout_ms = props.get(Symbol("com.microsoft:timeout"))
        client = await self.gateway.client_for(self.conn, address.entity)
        self.receiver = address.receiver(
            client,
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK
            if self.peek_lock
            else ServiceBusReceiveMode.RECEIVE_AND_DELETE,
            session_id=session_id,
            max_wait_time=int(timeout_ms) / 1000 if timeout_ms else None,
        )
        await self.gateway.check_entity(client, address)
        if session_id is not None:
            await self.receiver.__aenter__()  # locks the session now, so we can name it
            session = self.receiver.session
            assert session is not None and session.session_id is not None
            fields = list(self.attach_frame.get("source").value)
            fields += [None] * (8 - len(fields))
            fields[7] = {**filters, SESSION_FILTER: session.session_id}
            self.reply_source = Described(self.attach_frame.get("source").descriptor, fields)
            until = session.locked_until_utc
            assert until is not None  # the session was just accepted
            ticks = _DOTNET_EPOCH_TICKS + int(until.timestamp() * 10_000_000)
            self.reply_properties = {Symbol("com.microsoft:locked-until-utc"): ticks}

    def started(self) -> None:
        self._pump = self.conn.spawn(self._run())

    async def _run(self) -> None:
        while not self.is_detached:
            await self.credit_ready.wait()
            if self.is_detached:
                break
            wait = _DRAIN_WAIT_S if self.drain else _IDLE_WAIT_S
            self._receiving = True
            try:
                got = await self.receiver.receive_messages(
                    max_message_count=min(self.credit, _MAX_FETCH), max_wait_time=wait
                )
            except SettlementFailedError as exc:
                _LOG.info("amqp receiver %s: %s", self.address, exc)
                continue
            except ServiceBusError as exc:
                # The SDK raises it from the receive under way (or reopens, if it retries).
                _LOG.warning("amqp receiver %s: detached on %r", self.address, exc)
                self.detach_with_error(exc)
                return
            finally:
                self._receiving = False
            # The credit may have shrunk meanwhile (an early drain): give back the excess.
            keep = 0 if self.is_detached else max(0, self.credit)
            for msg in got[:keep]:
                self._deliver(msg)
            if got[keep:]:
                await self._give_back(got[keep:])
            if not got:
                self.drained()

    def credit_changed(self) -> None:
        """Answer a drain at once while a receive is in flight (the SDK drains when it closes
        a receiver): in peek-lock mode whatever that receive still brings is given back, so
        the SDK need not wait for it. In receive-and-delete mode those messages are already
        deleted, so the drain waits for them instead."""
        if self.drain and self._receiving and self.peek_lock:
            self.drained()

    def _deliver(self, msg: ServiceBusReceivedMessage) -> None:
        payload = from_received(msg, locked=self.peek_lock)
        token = msg.lock_token
        if self.peek_lock and token:
            delivery_id = self.send(lock_tag(token), payload, settled=False)
            self.unsettled[delivery_id] = msg
            self.conn.hold(token, self, msg)
        else:
            self.send(uuid.uuid4().bytes_le, payload, settled=True)

    async def _give_back(self, messages: list[ServiceBusReceivedMessage]) -> None:
        for msg in messages:
            if msg.lock_token:
                with contextlib.suppress(ServiceBusError, ValueError):
                    await settle(
                        self.receiver, msg, Outcome(ServiceBusDisposition.RELEASED), confirm=False
                    )

    def on_disposition(self, delivery_id: int, state: Any, settled: bool) -> None:
        msg = self.unsettled.pop(delivery_id, None)
        if msg is None:
            return
        in_txn = transactional(state)
        if in_txn is not None:
            work = self.conn.spawn(self._apply_in(in_txn, delivery_id, msg, settled))
            self.conn.transactions.track(work)  # a discharge after this frame waits for it
            return
        self.conn.spawn(self._apply(delivery_id, msg, state, settled), finish=True)

    async def _apply_in(
        self,
        in_txn: tuple[Any, Any],
        delivery_id: int,
        msg: ServiceBusReceivedMessage,
        settled: bool,
    ) -> None:
        """Apply a ``transactional-state``'s outcome inside its transaction (``_transactions``)."""
        txn_id, state = in_txn
        reply: Described
        try:
            txn = self.conn.transactions.get(txn_id, self.address)
            entity = self.gateway.parse_address(self.address).entity
            client = await self.gateway.client_for(self.conn, entity)
            await txn.settle(client, self.receiver, msg, outcome_of(state))
            reply = transactional_answer(txn_id, state)
        except (ServiceBusError, ValueError) as exc:
            reply = described_list("rejected", error=error(condition_of(exc), str(exc)))
        self._answer(delivery_id, settled, reply)

    async def _apply(
        self, delivery_id: int, msg: ServiceBusReceivedMessage, state: Any, settled: bool
    ) -> None:
        outcome = outcome_of(state)
        if outcome is None:
            return  # settled with no outcome: the lock runs out and the message comes again
        reply: Described = state
        try:
            await settle(self.receiver, msg, outcome, confirm=self.gateway.confirm_settlements)
            self.conn.release(msg.lock_token or "")
        except (ServiceBusError, ValueError) as exc:
            reply = described_list("rejected", error=error(condition_of(exc), str(exc)))
        if _outcome_name(state) == "rejected" and reply is state:
            reply = described_list("rejected")  # the SDK reads any error as a failure
        self._answer(delivery_id, settled, reply)

    def _answer(self, delivery_id: int, settled: bool, reply: Described) -> None:
        """Settle our side of a delivery the peer left unsettled, with ``reply``."""
        if not settled and not self.is_detached:
            self.session.send(
                "disposition", role=False, first=UInt(delivery_id), settled=True, state=reply
            )

    async def cleanup(self) -> None:
        # Unsettled messages stay locked: the SDK may still settle them through $management
        # within their lock; otherwise the lock runs out and they are delivered again. A
        # receive in flight finishes first and gives back what it brings.
        self.credit_ready.set()
        if self._pump is not None and not self._pump.done():
            await asyncio.wait([self._pump], timeout=_IDLE_WAIT_S + 10)
        receiver = getattr(self, "receiver", None)  # None when the attach was refused
        if receiver is not None:
            with contextlib.suppress(ServiceBusError, ValueError):
                await receiver.close()


async def settle(
    receiver: ServiceBusReceiver,
    message: ServiceBusReceivedMessage,
    outcome: Outcome,
    *,
    confirm: bool,
) -> None:
    """Settle ``message`` through raybus; raises a refusal the settlement meets on the way.

    ``confirm=False`` is the native raybus receiver's own guarantee (``raybus.aio`` receiver
    docstring): with comfortable lock time left the settlement is handed to raybus's batcher
    and the SDK hears the outcome at once; a later refusal by the broker (the lock was lost to
    an actor restart) means the message is delivered again. ``confirm=True`` settles by lock
    token, which waits for the partition's answer (about four times slower for the SDK, which
    waits for every outcome in turn). A release (which the message API has no method for)
    always goes by lock token.
    """
    if confirm or outcome.disposition is ServiceBusDisposition.RELEASED:
        await settle_by_token(receiver, message.lock_token or "", message.sequence_number, outcome)
    elif outcome.disposition is ServiceBusDisposition.COMPLETED:
        await receiver.complete_message(message)
    elif outcome.disposition is ServiceBusDisposition.ABANDONED:
        await receiver.abandon_message(message, outcome.properties)
    elif outcome.disposition is ServiceBusDisposition.DEFERRED:
        await receiver.defer_message(message, outcome.properties)
    else:
        await receiver.dead_letter_message(
            message, outcome.reason, outcome.description, outcome.properties
        )


async def settle_by_token(
    receiver: ServiceBusReceiver,
    lock_token: str,
    sequence_number: int | None,
    outcome: Outcome,
    transaction: ServiceBusTransaction | None = None,
) -> None:
    """Apply ``outcome`` by lock token and wait for the partition's answer (with
    ``transaction``: join it, the lock checked now and settled at the commit)."""
    await receiver.settle_message_by_lock_token(
        lock_token,
        outcome.disposition,
        sequence_number=sequence_number,
        properties_to_modify=outcome.properties,
        dead_letter_reason=outcome.reason,
        dead_letter_error_description=outcome.description,
        transaction=transaction,
    )


_Transfer = tuple[Delivery, Any, "asyncio.Future[None] | None"]


class EntitySender(IncomingLink):
    """Messages from the peer into a queue or topic."""

    sender: ServiceBusSender

    def __init__(self, session: Session, attach: Performative) -> None:
        super().__init__(session, attach)
        # (the delivery, its txn-id or None, done once handled)
        self._queue: asyncio.Queue[_Transfer] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._client: ServiceBusClient | None = None

    async def setup(self) -> None:
        address = self.gateway.parse_address(self.address)
        if address.subscription is not None or address.sub_queue is not None:
            raise DecodeError(f"cannot send to {self.address!r}: send to a queue or topic")
        self._client = await self.gateway.client_for(self.conn, address.entity)
        self.sender = self._client.get_queue_sender(address.entity)
        self.max_message_size = await self.gateway.check_entity(self._client, address)

    def started(self) -> None:
        super().started()
        self._worker = self.conn.spawn(self._work())

    def on_message(self, delivery: Delivery) -> None:
        in_txn = transactional(delivery.state)
        if in_txn is None:
            self._queue.put_nowait((delivery, None, None))
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.conn.transactions.track(done)  # a discharge after this frame waits for it
        self._queue.put_nowait((delivery, in_txn[0], done))

    async def _work(self) -> None:
        while not self.is_detached:
            delivery, txn_id, done = await self._queue.get()
            state: Described
            try:
                payload = delivery.payload
                parts = (
                    split_batch(payload) if delivery.message_format == BATCH_FORMAT else [payload]
                )
                messages = [to_raybus(p) for p in parts]
                if txn_id is None:
                    await self.sender.send_messages(messages)
                    state = described_list("accepted")
                else:
                    txn = self.conn.transactions.get(txn_id, self.address)
                    assert self._client is not None  # set up before any transfer
                    await txn.send(self._client, self.sender, messages)
                    state = transactional_answer(txn_id, described_list("accepted"))
            except (ServiceBusError, ValueError) as exc:  # DecodeError is a ValueError
                state = described_list("rejected", error=error(condition_of(exc), str(exc)))
            finally:
                if done is not None and not done.done():
                    done.set_result(None)
            if not delivery.settled:
                self.settle(delivery.id, state)

    async def cleanup(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        while not self._queue.empty():  # never handled: a discharge must not wait for them
            done = self._queue.get_nowait()[-1]
            if done is not None and not done.done():
                done.set_result(None)


def make_link(session: Session, attach: Performative) -> Link:
    """The link class for an attach, by the peer's role and the node address."""
    from ._management import CbsRequests, ManagementRequests
    from ._transactions import Coordinator

    peer_is_receiver = bool(attach.get("role"))
    term = attach.get("source" if peer_is_receiver else "target")
    if not peer_is_receiver and is_coordinator(term):
        return Coordinator(session, attach)
    address = "" if term is None else str(as_performative(term).get("address", ""))
    special = address == "$cbs" or address.endswith("$management")
    if peer_is_receiver:
        return ReplyLink(session, attach) if special else EntityReceiver(session, attach)
    if address == "$cbs":
        return CbsRequests(session, attach)
    if address.endswith("$management"):
        return ManagementRequests(session, attach)
    return EntitySender(session, attach)
