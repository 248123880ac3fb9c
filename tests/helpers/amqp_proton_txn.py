"""A transactional AMQP 1.0 client for the gateway's tests: python-qpid-proton, an independent
implementation of the AMQP transaction protocol (coordinator link, declare / discharge,
``transactional-state`` on transfers and dispositions). azure-servicebus for Python has no
transactions (Service Bus's .NET and Java SDKs do), so the gateway's transactions are driven
with this instead.

``run_transaction`` runs one scripted transaction in its own proton container (a thread) and
returns what the client saw; it fails the test if the script does not finish in time.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cproton
from proton import UNDESCRIBED, Array, Data, Described, Message, ulong
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container

from raybus.amqp._connection import tag_token

ACCEPTED, REJECTED, RELEASED, MODIFIED = 0x24, 0x25, 0x26, 0x27
TRANSACTIONAL_STATE = 0x34


@dataclass
class TxnRun:
    """What the client saw: the bodies received, their sequence numbers and lock tokens, the
    gateway's answers (the outcome codes of the states it settled the received deliveries and
    the sent ones with), and how the discharge ended."""

    received: list[Any] = field(default_factory=list)
    sequence_numbers: list[int | None] = field(default_factory=list)
    lock_tokens: list[str] = field(default_factory=list)
    received_answers: list[int | None] = field(default_factory=list)
    sent_answers: list[int | None] = field(default_factory=list)
    management_status: int | None = None  # the answer to the ``$management`` request
    management_condition: str | None = None  # its errorCondition
    management_description: str | None = None
    management_body: Any = None
    result: str = "not discharged"  # committed, aborted, commit failed, declare failed
    condition: str | None = None


def _tag(delivery: Any) -> bytes:
    """A delivery's tag as bytes (proton's ``Delivery.tag`` decodes it as UTF-8, which a
    lock token's 16 bytes are not)."""
    tag = cproton.lib.pn_delivery_tag(delivery._impl)
    return bytes(cproton.ffi.unpack(tag.start, tag.size))


def _answer(delivery: Any) -> int | None:
    """The outcome code in the state the gateway settled ``delivery`` with (inside a
    ``transactional-state``, its inner outcome)."""
    state = delivery.remote_state
    if state == TRANSACTIONAL_STATE:
        data = delivery.remote.data or []
        inner = data[1] if len(data) > 1 else None
        return int(inner.descriptor) if isinstance(inner, Described) else None
    return int(state) if state else None


def uuids(lock_tokens: Sequence[str]) -> Array:
    """Lock tokens as the array of uuids ``$management`` requests carry."""
    return Array(UNDESCRIBED, Data.UUID, *(uuid.UUID(t) for t in lock_tokens))


def management_request(operation: str, body: dict[str, Any]) -> Message:
    """A ``$management`` request ``com.microsoft:<operation>`` (its reply-to set on sending)."""
    return Message(
        id=str(uuid.uuid4()), properties={"operation": f"com.microsoft:{operation}"}, body=body
    )


class _Script(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    def __init__(
        self,
        url: str,
        source: str | None,
        count: int,
        outcome: int,
        target: str | None,
        bodies: Sequence[str],
        commit: bool,
        txn_id: bytes | None,
        before_discharge: Callable[[TxnRun], None] | None,
        request: Callable[[TxnRun], Message] | None,
        node: str | None,
    ) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.url, self.source, self.count, self.outcome = url, source, count, outcome
        self.target, self.bodies, self.commit = target, list(bodies), commit
        self.txn_id, self.before_discharge = txn_id, before_discharge
        self.request, self.node = request, node
        self.mgmt_sender: Any = None
        self.mgmt_receiver: Any = None
        self.run = TxnRun()
        self.txn: Any = None
        self.sender: Any = None
        self.receiver: Any = None
        self.deliveries: list[Any] = []
        self.acted = False
        self.expected_answers = 0

    def on_start(self, event: Any) -> None:
        container = event.container
        self.conn = container.connect(self.url, allowed_mechs="ANONYMOUS")
        if self.source is not None:
            self.receiver = container.create_receiver(self.conn, self.source)
        if self.target is not None:
            self.sender = container.create_sender(self.conn, self.target)
        if self.request is not None:
            node = f"{self.node or self.source}/$management"
            self.mgmt_sender = container.create_sender(self.conn, node)
            self.mgmt_receiver = container.create_receiver(self.conn, node)
            self.mgmt_receiver.flow(1)
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.txn = event.transaction
        if self.receiver is not None and self.count:
            self.receiver.flow(self.count)
        self._act()

    def on_transaction_declare_failed(self, event: Any) -> None:
        self._end("declare failed", event.delivery)

    def on_message(self, event: Any) -> None:
        if self.mgmt_receiver is not None and event.receiver.name == self.mgmt_receiver.name:
            props = event.message.properties or {}
            self.run.management_condition = props.get("errorCondition")
            self.run.management_description = props.get("statusDescription")
            self.run.management_body = event.message.body
            self.run.management_status = props.get("statusCode")
            self._maybe_discharge()
            return
        self.deliveries.append(event.delivery)
        body = event.message.body
        self.run.received.append(bytes(body) if isinstance(body, memoryview) else body)
        annotations = event.message.annotations or {}
        self.run.sequence_numbers.append(annotations.get("x-opt-sequence-number"))
        self.run.lock_tokens.append(tag_token(_tag(event.delivery)))
        self._act()

    def on_sendable(self, event: Any) -> None:
        self._act()

    def _act(self) -> None:
        ready = (
            self.txn is not None
            and not self.acted
            and len(self.deliveries) == self.count
            and (not self.bodies or (self.sender is not None and self.sender.credit > 0))
            and (self.request is None or self.mgmt_sender.credit > 0)
        )
        if not ready:
            return
        self.acted = True
        if self.request is not None:
            request = self.request(self.run)
            request.reply_to = f"{self.node or self.source}/$management"
            self.txn.send(self.mgmt_sender, request)
        for delivery in [] if self.request is not None else self.deliveries:
            if self.txn_id is not None:  # a transaction this connection never declared
                delivery.local.data = [self.txn_id, Described(ulong(self.outcome), [])]
                delivery.update(TRANSACTIONAL_STATE)
            else:
                # (not through ``txn.accept``: that would settle or release them after the
                # discharge; the script decides what happens after an abort)
                self.txn.update(delivery, ulong(self.outcome))
        for body in self.bodies:
            self.txn.send(self.sender, Message(body=body))
        if self.before_discharge is not None:
            self.before_discharge(self.run)
        self.expected_answers = len(self.bodies) + (
            1 if self.request is not None else len(self.deliveries)
        )
        self._maybe_discharge()

    def on_settled(self, event: Any) -> None:
        delivery = event.delivery
        if self.receiver is not None and delivery.link.name == self.receiver.name:
            self.run.received_answers.append(_answer(delivery))
        elif self.sender is not None and delivery.link.name == self.sender.name:
            self.run.sent_answers.append(_answer(delivery))
        self._maybe_discharge()

    def _maybe_discharge(self) -> None:
        answered = len(self.run.received_answers) + len(self.run.sent_answers)
        answered += self.run.management_status is not None
        if self.acted and answered >= self.expected_answers and self.run.result == "not discharged":
            self.run.result = "discharging"
            if self.commit:
                self.txn.commit()
            else:
                self.txn.abort()

    def on_transaction_committed(self, event: Any) -> None:
        self._end("committed", None)

    def on_transaction_aborted(self, event: Any) -> None:
        self._end("aborted", None)

    def on_transaction_commit_failed(self, event: Any) -> None:
        self._end("commit failed", event.delivery)

    def _end(self, result: str, delivery: Any) -> None:
        self.run.result = result
        if delivery is not None and delivery.remote.condition is not None:
            self.run.condition = delivery.remote.condition.name
        self.conn.close()


def run_transaction(
    port: int,
    *,
    receive_from: str | None = None,
    count: int = 0,
    outcome: int = ACCEPTED,
    send_to: str | None = None,
    bodies: Sequence[str] = (),
    commit: bool = True,
    txn_id: bytes | None = None,
    before_discharge: Callable[[TxnRun], None] | None = None,
    via_management: bool | list[str] = False,
    request: Callable[[TxnRun], Message] | None = None,
    node: str | None = None,
    timeout: float = 30.0,
) -> TxnRun:
    """Declare a transaction on a new connection to the gateway on ``port``; receive ``count``
    messages from ``receive_from`` (peek-lock) and settle each with ``outcome`` inside it;
    send ``bodies`` to ``send_to`` inside it; once the gateway has answered all of those,
    commit (or abort); then close. ``txn_id`` settles in a transaction never declared.
    ``before_discharge`` runs (on the client's thread) after the operations are sent.
    ``via_management``: complete the received messages with one ``$management``
    ``update-disposition`` request sent inside the transaction, instead of dispositions (a
    list: complete these lock tokens instead of the received messages'). ``request``: send
    the ``$management`` request it builds (from what was received) inside the transaction
    instead, to ``node`` (default ``receive_from``) + ``/$management``; the received messages
    are then not settled by dispositions."""
    if via_management:
        tokens = via_management if isinstance(via_management, list) else None

        def request(run: TxnRun) -> Message:
            return management_request(
                "update-disposition",
                {
                    "disposition-status": "completed",
                    "lock-tokens": uuids(tokens or run.lock_tokens),
                },
            )

    script = _Script(
        f"amqp://127.0.0.1:{port}",
        receive_from,
        count,
        outcome,
        send_to,
        bodies,
        commit,
        txn_id,
        before_discharge,
        request,
        node,
    )
    container = Container(script)
    thread = threading.Thread(target=container.run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        container.stop()
        thread.join(5)
        raise AssertionError(f"the transaction script did not finish in {timeout} s: {script.run}")
    return script.run
