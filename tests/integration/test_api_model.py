"""The public API against a model: hypothesis drives random sequences of send, send batch,
receive, complete, abandon, dead-letter, defer, receive_deferred, peek, schedule and cancel
against one real queue (a fresh one per example) and against a plain in-test model of the
queue, and compares what comes back: which messages, their delivery counts, peeked contents,
counts, and the error types of calls that must fail.

The queue has one partition (so order is by sequence number), a long lock (no expiry during
an example) and a max delivery count of 2 (abandons reach it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import raybus
from raybus import ServiceBusMessage, ServiceBusSubQueue
from raybus.exceptions import MessageAlreadySettled, MessageNotFoundError
from raybus.management import ServiceBusAdministrationClient

pytestmark = pytest.mark.timeout(240)

MAX_DELIVERY = 2
OPS = ["complete", "abandon", "dead_letter", "defer"]
# What receive_and_settle does with each message: abandon twice as likely, so that messages
# reach the max delivery count within an example.
STEP_OPS = [*OPS, "abandon", "hold"]


@dataclass
class Model:
    """One message as the model sees it."""

    mid: str
    seq: int = -1  # learnt when first received or peeked
    state: str = "active"  # active, locked, deferred, scheduled, dead
    delivery_count: int = 0


class QueueMachine(RuleBasedStateMachine):
    client: raybus.ServiceBusClient
    admin: ServiceBusAdministrationClient

    def __init__(self) -> None:
        super().__init__()
        self.queue = f"m-{uuid.uuid4().hex[:8]}"
        self.admin.create_queue(
            self.queue, max_delivery_count=MAX_DELIVERY, lock_duration=timedelta(minutes=5)
        )
        self.sender = self.client.get_queue_sender(self.queue)
        self.receiver = self.client.get_queue_receiver(self.queue, max_wait_time=2)
        self.msgs: dict[str, Model] = {}
        self.order: list[str] = []  # send order = sequence order (one partition)
        self.held: dict[str, object] = {}  # mid -> received message still locked
        self.settled: list[object] = []  # received messages already settled
        self.n = 0

    def teardown(self) -> None:
        self.receiver.close()
        self.sender.close()
        self.admin.delete_queue(self.queue)

    # -- helpers --------------------------------------------------------------------------

    def _new(self) -> ServiceBusMessage:
        self.n += 1
        mid = f"m{self.n}"
        self.msgs[mid] = Model(mid)
        self.order.append(mid)
        return ServiceBusMessage(f"body {mid}", message_id=mid)

    def _in(self, *states: str) -> list[str]:
        return [m for m in self.order if self.msgs[m].state in states]

    def _flush(self) -> None:
        """Wait for settlements sent without waiting (and raise any refusal)."""
        self.receiver.complete_messages([])

    def _take(self, mid: str) -> object:
        msg = self.held.pop(mid)
        self.settled.append(msg)
        return msg

    # -- sending --------------------------------------------------------------------------

    @initialize(n=st.integers(1, 4))
    def start_with_messages(self, n: int) -> None:
        self.sender.send_messages([self._new() for _ in range(n)])

    @rule(n=st.integers(1, 4))
    def send(self, n: int) -> None:
        """One message, or a list (a batch: all or nothing)."""
        self.sender.send_messages(self._new() if n == 1 else [self._new() for _ in range(n)])

    @rule()
    def schedule(self) -> None:
        msg = self._new()
        self.msgs[msg.message_id].state = "scheduled"
        at = datetime.now(timezone.utc) + timedelta(hours=1)
        (seq,) = self.sender.schedule_messages(msg, at)
        self.msgs[msg.message_id].seq = seq

    @precondition(lambda self: self._in("scheduled"))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(self._in("scheduled")))
        self.sender.cancel_scheduled_messages(self.msgs[mid].seq)
        self.msgs[mid].state = "gone"

    @rule(kind=st.sampled_from(["cancel", "settle twice", "deferred of settled"]), i=st.integers())
    def misuse_fails_with_the_documented_error(self, kind: str, i: int) -> None:
        """Calls that must fail, and with which error type (nothing changes: the invariant)."""
        gone = [m for m in self._in("gone") if self.msgs[m].seq >= 0]
        if kind == "cancel":
            with pytest.raises(MessageNotFoundError):
                self.sender.cancel_scheduled_messages(10**9)
        elif kind == "settle twice" and self.settled:
            with pytest.raises(MessageAlreadySettled):
                self.receiver.complete_message(self.settled[i % len(self.settled)])
        elif kind == "deferred of settled" and gone:
            with pytest.raises(MessageNotFoundError):
                self.receiver.receive_deferred_messages([self.msgs[gone[i % len(gone)]].seq])

    # -- receiving ------------------------------------------------------------------------

    def _receive(self, k: int) -> None:
        available = self._in("active")
        got = self.receiver.receive_messages(k, max_wait_time=1.0 if available else 0.2)
        expected = available[: len(got)]
        assert [m.message_id for m in got] == expected, f"expected a prefix of {available}"
        assert len(got) >= min(1, len(available))
        for m in got:
            model = self.msgs[m.message_id]
            assert m.delivery_count == model.delivery_count, m
            if model.seq >= 0:
                assert m.sequence_number == model.seq
            model.seq, model.state = m.sequence_number, "locked"
            self.held[m.message_id] = m

    @rule(k=st.integers(1, 4), ops=st.lists(st.sampled_from(STEP_OPS), min_size=4))
    def receive_and_settle(self, k: int, ops: list[str]) -> None:
        """The common case, as one step: receive, then settle each message (or hold it)."""
        held_before = set(self.held)
        self._receive(k)
        for mid, op in zip(sorted(set(self.held) - held_before), ops, strict=False):
            if op != "hold":
                self._settle(mid, op)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), op=st.sampled_from(OPS))
    def settle(self, data: st.DataObject, op: str) -> None:
        self._settle(data.draw(st.sampled_from(sorted(self.held))), op)

    def _settle(self, mid: str, op: str) -> None:
        msg = self._take(mid)
        model = self.msgs[mid]
        if op == "complete":
            self.receiver.complete_message(msg)
            model.state = "gone"
        elif op == "abandon":  # a deferred message stays deferred
            self.receiver.abandon_message(msg)
            model.delivery_count += 1
            back = "deferred" if model.state == "locked-deferred" else "active"
            model.state = "dead" if model.delivery_count >= MAX_DELIVERY else back
        elif op == "dead_letter":
            self.receiver.dead_letter_message(msg, reason="model")
            model.state = "dead"
        else:
            self.receiver.defer_message(msg)
            model.state = "deferred"
        self._flush()

    @precondition(lambda self: self._in("deferred"))
    @rule(data=st.data())
    def receive_deferred(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(self._in("deferred")))
        (m,) = self.receiver.receive_deferred_messages([self.msgs[mid].seq])
        assert m.message_id == mid
        assert m.delivery_count == self.msgs[mid].delivery_count
        self.msgs[mid].state = "locked-deferred"
        self.held[mid] = m

    @rule(n=st.integers(1, 6), dead=st.booleans())
    def peek(self, n: int, dead: bool) -> None:
        """Peek (a fresh receiver starts at the lowest sequence number) sees locked, deferred
        and scheduled messages in sequence order; the dead-letter queue its own."""
        sub = ServiceBusSubQueue.DEAD_LETTER if dead else None
        with self.client.get_queue_receiver(self.queue, sub_queue=sub) as fresh:
            got = fresh.peek_messages(n)
        if dead:
            expected = self._in("dead")
            assert len(got) == min(n, len(expected))
            assert {m.message_id for m in got} <= set(expected)
            assert all(m.dead_letter_reason for m in got)
            return
        visible = [m for m in self.order if self.msgs[m].state not in ("gone", "dead")]
        assert [m.message_id for m in got] == visible[:n]
        for m in got:
            model = self.msgs[m.message_id]
            assert str(m) == f"body {m.message_id}"
            assert m.delivery_count == model.delivery_count
            if model.seq >= 0:
                assert m.sequence_number == model.seq
            assert (m.state.name == "SCHEDULED") == (model.state == "scheduled")
            assert (m.state.name == "DEFERRED") == model.state.endswith("deferred")

    # -- counts ---------------------------------------------------------------------------

    @invariant()
    def counts_match_the_model(self) -> None:
        props = self.admin.get_queue_runtime_properties(self.queue)
        active = len(self._in("active", "locked", "deferred", "locked-deferred"))
        assert (
            props.active_message_count,
            props.dead_letter_message_count,
            props.scheduled_message_count,
        ) == (active, len(self._in("dead")), len(self._in("scheduled")))


def test_public_api_matches_a_model_of_one_queue(module_namespace: str, ray_cluster: str) -> None:
    QueueMachine.client = raybus.ServiceBusClient(module_namespace)
    QueueMachine.admin = ServiceBusAdministrationClient(module_namespace)
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=6,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            # No shrinking: each step is a broker round trip, and a failure already prints
            # the sequence of calls that produced it.
            phases=[Phase.explicit, Phase.generate],
        ),
    )
