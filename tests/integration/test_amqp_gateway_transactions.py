"""AMQP 1.0 transactions through the gateway: a coordinator link declares and discharges,
settlements (``transactional-state`` dispositions) and sends (``transactional-state``
transfers) join the transaction, a commit applies them all, a rollback none.

The client is python-qpid-proton (``amqp_proton_txn``): azure-servicebus for Python has no
transactions. What the broker did is checked with the native raybus client."""

from __future__ import annotations

import uuid
from typing import Any

import amqp_gateway_fixtures
import pytest
from amqp_proton_txn import ACCEPTED, MODIFIED, REJECTED, TxnRun, run_transaction

import raybus
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
    """Inside a transaction only the connection's own locks can be settled by token (it
    holds their messages): another token is refused, and the commit with it."""
    _send(client, pooled_queue, "mine")
    run = _move(gateway, pooled_queue, target, "not-sent", via_management=[str(uuid.uuid4())])
    assert run.management_status == 400  # com.microsoft:argument-error
    assert run.result == "commit failed" and run.condition == "amqp:transaction:rollback"
    assert _peek(client, target) == []
    with client.get_queue_receiver(pooled_queue) as r:  # untouched, still locked by the run
        (token,) = run.lock_tokens
        r.settle_message_by_lock_token(token, raybus.ServiceBusDisposition.COMPLETED)
    assert _peek(client, pooled_queue) == []
