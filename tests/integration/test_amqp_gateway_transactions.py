"""AMQP 1.0 transactions through the gateway: a coordinator link declares and discharges,
settlements (``transactional-state`` dispositions) and sends (``transactional-state``
transfers) join the transaction, a commit applies them all, a rollback none.

The client is python-qpid-proton (``amqp_proton_txn``): azure-servicebus for Python has no
transactions. What the broker did is checked with the native raybus client."""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from typing import Any
from unittest import mock

import amqp_gateway_fixtures
import pytest
from amqp_proton_txn import (
    ACCEPTED,
    MODIFIED,
    REJECTED,
    TxnRun,
    management_request,
    run_transaction,
    uuids,
)
from proton import Message, symbol, timestamp
from proton.reactor import Transaction

import raybus
from raybus._sync import run
from raybus.amqp import GatewayHandle
from raybus.management import ServiceBusAdministrationClient

namespace = amqp_gateway_fixtures.namespace
gateway = amqp_gateway_fixtures.gateway


@pytest.fixture
def target(admin: ServiceBusAdministrationClient) -> str:
    name = f"amqp-txn-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name)
    return name


def _send(client: raybus.ServiceBusClient, queue: str, *bodies: str) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([raybus.ServiceBusMessage(b) for b in bodies])


def _peek(client: raybus.ServiceBusClient, queue: str, sub_queue: object = None) -> list[str]:
    with client.get_queue_receiver(queue, sub_queue=sub_queue) as r:  # type: ignore[arg-type]
        return sorted(str(m) for m in r.peek_messages(20))


def _move(gateway: GatewayHandle, source: str, target: str, body: str, **script: Any) -> TxnRun:
    """Receive one message from ``source`` and settle it (complete, unless ``script`` says
    otherwise), and send ``body`` to ``target``, in one transaction."""
    return run_transaction(
        gateway.port, receive_from=source, count=1, send_to=target, bodies=[body], **script
    )


def test_commit_completes_the_received_message_and_sends_with_it(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, pooled_queue: str, target: str
) -> None:
    _send(client, pooled_queue, "order-1")
    run = _move(gateway, pooled_queue, target, "shipped-1")
    assert run.result == "committed"
    assert run.received == [b"order-1"]
    assert run.received_answers == [ACCEPTED] and run.sent_answers == [ACCEPTED]
    assert _peek(client, pooled_queue) == []
    assert _peek(client, target) == ["shipped-1"]


def test_rollback_discards_the_send_and_leaves_the_message_locked_by_its_receiver(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, pooled_queue: str, target: str
) -> None:
    _send(client, pooled_queue, "order-2")
    run = _move(gateway, pooled_queue, target, "shipped-2", commit=False)
    assert run.result == "aborted"
    assert _peek(client, target) == []  # the send never happened
    with client.get_queue_receiver(pooled_queue) as r:
        (left,) = r.peek_messages(5)
        assert str(left) == "order-2" and left.delivery_count == 0  # not completed, not abandoned
        # Still locked under the token it was delivered with: settling by it works once.
        (token,) = run.lock_tokens
        r.settle_message_by_lock_token(token, raybus.ServiceBusDisposition.COMPLETED)
    assert _peek(client, pooled_queue) == []


@pytest.mark.parametrize(
    ("outcome", "in_queue", "in_dead_letters"),
    [(REJECTED, [], ["m"]), (MODIFIED, ["m"], [])],
    ids=["rejected-dead-letters", "modified-abandons"],
)
def test_other_outcomes_apply_inside_the_transaction_at_commit(
    gateway: GatewayHandle,
    client: raybus.ServiceBusClient,
    pooled_queue: str,
    outcome: int,
    in_queue: list[str],
    in_dead_letters: list[str],
) -> None:
    _send(client, pooled_queue, "m")
    run = run_transaction(gateway.port, receive_from=pooled_queue, count=1, outcome=outcome)
    assert run.result == "committed" and run.received_answers == [outcome]
    assert _peek(client, pooled_queue) == in_queue
    dlq = raybus.ServiceBusSubQueue.DEAD_LETTER
    assert _peek(client, pooled_queue, dlq) == in_dead_letters
    if outcome == MODIFIED:
        with client.get_queue_receiver(pooled_queue, max_wait_time=2) as r:
            (again,) = r.receive_messages(max_wait_time=5)
            assert again.delivery_count == 1  # abandoned once, at the commit
            r.complete_message(again)


def test_a_lock_lost_before_the_commit_rolls_everything_back(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, pooled_queue: str, target: str
) -> None:
    _send(client, pooled_queue, "order-3")

    def settle_elsewhere(run: TxnRun) -> None:  # another process completes it meanwhile
        with client.get_queue_receiver(pooled_queue) as r:
            r.settle_message_by_lock_token(
                run.lock_tokens[0], raybus.ServiceBusDisposition.COMPLETED
            )

    run = _move(gateway, pooled_queue, target, "shipped-3", before_discharge=settle_elsewhere)
    assert run.result == "commit failed"
    assert run.condition == "amqp:transaction:rollback"
    assert _peek(client, target) == []  # the send went with the rollback


def test_a_settlement_naming_an_undeclared_transaction_is_rejected_and_changes_nothing(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, pooled_queue: str
) -> None:
    _send(client, pooled_queue, "order-4")
    run = run_transaction(
        gateway.port, receive_from=pooled_queue, count=1, outcome=ACCEPTED, txn_id=b"no-such"
    )
    assert run.received_answers == [REJECTED]
    assert run.result == "committed"  # the declared transaction had nothing in it
    with client.get_queue_receiver(pooled_queue) as r:
        (left,) = r.peek_messages(5)
        assert str(left) == "order-4"
        (token,) = run.lock_tokens  # still locked by the gateway's receiver: settle it
        r.settle_message_by_lock_token(token, raybus.ServiceBusDisposition.COMPLETED)
    assert _peek(client, pooled_queue) == []


def test_a_send_only_transaction_is_invisible_until_committed(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, target: str
) -> None:
    aborted = run_transaction(gateway.port, send_to=target, bodies=["x", "y"], commit=False)
    assert aborted.result == "aborted" and aborted.sent_answers == [ACCEPTED, ACCEPTED]
    assert _peek(client, target) == []
    committed = run_transaction(gateway.port, send_to=target, bodies=["a", "b"])
    assert committed.result == "committed"
    with client.get_queue_receiver(target, max_wait_time=2) as r:
        got = r.receive_messages(max_message_count=5, max_wait_time=3)
        assert [str(m) for m in got] == ["a", "b"]  # in the transaction's order
        for m in got:
            r.complete_message(m)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_update_disposition_on_management_joins_the_transaction(
    gateway: GatewayHandle,
    client: raybus.ServiceBusClient,
    pooled_queue: str,
    target: str,
    commit: bool,
) -> None:
    """The .NET SDK settles deferred messages this way: a ``$management`` request whose
    transfer carries the transaction."""
    _send(client, pooled_queue, "by-token")
    run = _move(gateway, pooled_queue, target, "with-it", commit=commit, via_management=True)
    assert run.management_status == 200
    assert run.result == ("committed" if commit else "aborted")
    assert _peek(client, pooled_queue) == ([] if commit else ["by-token"])
    assert _peek(client, target) == (["with-it"] if commit else [])


def test_a_management_request_that_cannot_join_dooms_the_transaction(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, pooled_queue: str, target: str
) -> None:
    """A lock token no partition holds is refused when the request joins (the lock is
    asked for at once), with Service Bus's lock-lost error, and the commit with it; the
    connection's own lock is untouched."""
    _send(client, pooled_queue, "mine")
    txn = _move(gateway, pooled_queue, target, "not-sent", via_management=[str(uuid.uuid4())])
    assert txn.management_status == 410
    assert txn.management_condition == "com.microsoft:message-lock-lost"
    assert txn.result == "commit failed" and txn.condition == "amqp:transaction:rollback"
    assert _peek(client, target) == []
    with client.get_queue_receiver(pooled_queue) as r:  # untouched, still locked by the run
        (token,) = txn.lock_tokens
        r.settle_message_by_lock_token(token, raybus.ServiceBusDisposition.COMPLETED)
    assert _peek(client, pooled_queue) == []


# ------------------------------------------------- schedule-message inside a transaction


def _schedule_request(*bodies: str, at: datetime | None) -> Message:
    """``schedule-message`` of ``bodies`` at ``at`` (None: without a time, a bad request)."""
    entries = []
    for body in bodies:
        msg = Message(body=body, id=str(uuid.uuid4()))
        if at is not None:
            ms = round(at.timestamp() * 1000)
            msg.annotations = {symbol("x-opt-scheduled-enqueue-time"): timestamp(ms)}
        entries.append({"message-id": msg.id, "message": msg.encode()})
    return management_request("schedule-message", {"messages": entries})


def _in_an_hour() -> datetime:
    return datetime.fromtimestamp(time.time() + 3600)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_schedule_message_joins_the_transaction(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, target: str, commit: bool
) -> None:
    """Scheduled at the commit, not at all on a rollback; raybus numbers a transaction's
    messages at its commit, so the answer carries no sequence numbers."""
    at = _in_an_hour()
    txn = run_transaction(
        gateway.port,
        node=target,
        request=lambda _run: _schedule_request("later-1", "later-2", at=at),
        commit=commit,
    )
    assert txn.management_status == 200
    assert list(txn.management_body["sequence-numbers"]) == []
    assert txn.result == ("committed" if commit else "aborted")
    with client.get_queue_receiver(target) as r:
        peeked = r.peek_messages(10)  # scheduled messages included
    assert sorted(str(m) for m in peeked) == (["later-1", "later-2"] if commit else [])
    for m in peeked:
        assert m.state == raybus.ServiceBusMessageState.SCHEDULED
        assert abs(m.scheduled_enqueue_time_utc.timestamp() - at.timestamp()) < 0.01


def test_a_bad_schedule_request_schedules_nothing_and_dooms_its_transaction(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, target: str
) -> None:
    """The second message has no time: the answer names what is missing, the first message
    is not scheduled either, and the commit is refused."""
    at = _in_an_hour()

    def request(_run: TxnRun) -> Message:
        good, bad = _schedule_request("fine", at=at), _schedule_request("no-time", at=None)
        good.body["messages"] += bad.body["messages"]
        return good

    txn = run_transaction(gateway.port, node=target, request=request)
    assert txn.management_status == 400
    assert txn.management_condition == "com.microsoft:argument-error"
    assert "x-opt-scheduled-enqueue-time" in (txn.management_description or "")
    assert txn.result == "commit failed" and txn.condition == "amqp:transaction:rollback"
    assert _peek(client, target) == []


# ------------------------------------------------------- renew-lock inside a transaction


def _lock_expiry(client: raybus.ServiceBusClient, queue: str, token: str) -> datetime:
    """Where the broker's lock under ``token`` ends now, read without changing it."""
    with client.get_queue_receiver(queue) as r:
        expiry: datetime = run(r._aio._held_lock(token, 0))
        return expiry


def _renew_request(run_: TxnRun) -> Message:
    return management_request("renew-lock", {"lock-tokens": uuids(run_.lock_tokens)})


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_renew_lock_joins_the_transaction(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, pooled_queue: str, commit: bool
) -> None:
    """Service Bus counts a renewal among a transaction's operations: the lock is extended
    at the commit and left as it was on a rollback. The answer is the expiry as it stands."""
    _send(client, pooled_queue, "keep-me")
    before: list[datetime] = []

    def look(run_: TxnRun) -> None:  # the request is out; the commit waits for its answer
        before.append(_lock_expiry(client, pooled_queue, run_.lock_tokens[0]))

    txn = run_transaction(
        gateway.port,
        receive_from=pooled_queue,
        count=1,
        request=_renew_request,
        before_discharge=look,
        commit=commit,
    )
    assert txn.management_status == 200 and txn.result == ("committed" if commit else "aborted")
    (answered,) = txn.management_body["expirations"]
    (token,) = txn.lock_tokens
    after = _lock_expiry(client, pooled_queue, token)
    assert abs(int(answered) / 1000 - before[0].timestamp()) < 0.01  # as it stood
    if commit:
        assert after > before[0]
    else:
        assert after == before[0]
    with client.get_queue_receiver(pooled_queue) as r:  # still locked either way
        r.settle_message_by_lock_token(token, raybus.ServiceBusDisposition.COMPLETED)
    assert _peek(client, pooled_queue) == []


def test_renew_lock_of_an_unknown_token_is_refused_and_changes_no_lock(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, pooled_queue: str
) -> None:
    """The known token in the same request is not renewed either: the transaction that
    would have renewed it is rolled back."""
    _send(client, pooled_queue, "held")
    before: list[datetime] = []

    def request(run_: TxnRun) -> Message:
        before.append(_lock_expiry(client, pooled_queue, run_.lock_tokens[0]))
        tokens = [run_.lock_tokens[0], str(uuid.uuid4())]
        return management_request("renew-lock", {"lock-tokens": uuids(tokens)})

    txn = run_transaction(gateway.port, receive_from=pooled_queue, count=1, request=request)
    assert txn.management_status == 410
    assert txn.management_condition == "com.microsoft:message-lock-lost"
    assert txn.result == "commit failed" and txn.condition == "amqp:transaction:rollback"
    (token,) = txn.lock_tokens
    assert _lock_expiry(client, pooled_queue, token) == before[0]
    with client.get_queue_receiver(pooled_queue) as r:
        r.settle_message_by_lock_token(token, raybus.ServiceBusDisposition.COMPLETED)


# ----------------------------- update-disposition of another connection's lock in a transaction


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_update_disposition_of_a_lock_received_elsewhere_joins_the_transaction(
    gateway: GatewayHandle,
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    target: str,
    commit: bool,
) -> None:
    """The lock was taken by a native receiver (the gateway never saw the token) on a queue
    of two partitions: the gateway asks each partition, the one holding it joins."""
    queue = f"amqp-txn-p-{uuid.uuid4().hex[:8]}"
    admin.create_queue(queue, partition_count=2)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(
            [raybus.ServiceBusMessage(f"m{i}", partition_key=f"k{i}") for i in range(4)]
        )
    with client.get_queue_receiver(queue) as r:
        got = amqp_gateway_fixtures.receive_n(r, 4)
    assert len({m.sequence_number >> 48 for m in got}) == 2  # both partitions hold one
    tokens = [str(m.lock_token) for m in got]
    txn = run_transaction(
        gateway.port,
        node=queue,
        request=lambda _run: management_request(
            "update-disposition",
            {
                "disposition-status": "suspended",
                "lock-tokens": uuids(tokens),
                "deadletter-reason": "bad",
            },
        ),
        send_to=target,
        bodies=["with-them"],
        commit=commit,
    )
    assert txn.management_status == 200
    assert txn.result == ("committed" if commit else "aborted")
    dlq = raybus.ServiceBusSubQueue.DEAD_LETTER
    bodies = sorted(str(m) for m in got)
    assert _peek(client, queue, dlq) == (bodies if commit else [])
    assert _peek(client, target) == (["with-them"] if commit else [])
    if not commit:  # each still locked by the native receiver's token: settle them now
        with client.get_queue_receiver(queue) as r:
            for m in got:
                r.settle_message_by_lock_token(
                    str(m.lock_token),
                    raybus.ServiceBusDisposition.COMPLETED,
                    sequence_number=m.sequence_number,
                )
        assert _peek(client, queue) == []


def test_a_distributed_transaction_is_refused_at_declare(
    gateway: GatewayHandle, client: raybus.ServiceBusClient, target: str
) -> None:
    """A ``declare`` with a ``global-id`` (a transaction another manager coordinates) is
    rejected, naming the field; nothing of the script runs. (A guard of kept behaviour.)"""

    def declare_global(txn: Transaction) -> None:
        txn._declare = txn._send_ctrl(symbol("amqp:declare:list"), [b"global-txn-1"])

    with mock.patch.object(Transaction, "declare", declare_global):
        txn = run_transaction(gateway.port, send_to=target, bodies=["never"])
    assert txn.result == "declare failed"
    assert txn.condition == "com.microsoft:argument-error"
    assert txn.sent_answers == []
    assert _peek(client, target) == []
