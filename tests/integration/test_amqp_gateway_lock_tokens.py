"""``$management`` operations by lock token for locks another connection holds: the official
azure-servicebus SDK renews and settles, through one connection (or another gateway), messages
received through another, as Service Bus allows for any lock of the entity; unknown, used and
foreign tokens are refused with MessageLockLostError and change nothing.

Deferred messages are what the SDK always settles through ``$management`` (by lock token), and
``renew_message_lock`` always goes that way, so these tests need no private SDK call. Two SDK
clients (``ServiceBusClient`` instances) are two AMQP connections."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator

import amqp_gateway_fixtures
import pytest
from azure.servicebus import ServiceBusClient as SdkClient
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import MessageLockLostError

import raybus
from raybus.amqp import GatewayHandle, start_gateway
from raybus.management import ServiceBusAdministrationClient

namespace = amqp_gateway_fixtures.namespace
gateway = amqp_gateway_fixtures.gateway
sdk = amqp_gateway_fixtures.sdk


def _client(handle: GatewayHandle) -> SdkClient:
    return SdkClient.from_connection_string(
        handle.connection_string, retry_total=0, retry_backoff_factor=0.1
    )


@pytest.fixture
def other_sdk(gateway: GatewayHandle) -> Iterator[SdkClient]:
    """A second SDK client of the same gateway: its own AMQP connection."""
    with _client(gateway) as client:
        yield client


def _deferred(sdk: SdkClient, queue: str, bodies: list[str]) -> list[object]:
    """Send ``bodies``, receive and defer them, then receive them by sequence number: locked
    messages (by the connection of ``sdk``) that the SDK settles through ``$management``."""
    with sdk.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(b) for b in bodies])
    with sdk.get_queue_receiver(queue, max_wait_time=2) as receiver:
        got = amqp_gateway_fixtures.receive_n(receiver, len(bodies))
        for m in got:
            receiver.defer_message(m)
        deferred = receiver.receive_deferred_messages([m.sequence_number for m in got])
        assert sorted(str(m) for m in deferred) == sorted(bodies)
        return list(deferred)


def _left(client: raybus.ServiceBusClient, queue: str, sub_queue: object = None) -> list[str]:
    with client.get_queue_receiver(queue, sub_queue=sub_queue) as r:  # type: ignore[arg-type]
        return sorted(str(m) for m in r.peek_messages(20))


def test_renew_lock_through_another_connection_extends_the_lock(
    sdk: SdkClient, other_sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    with sdk.get_queue_sender(pooled_queue) as sender:
        sender.send_messages(ServiceBusMessage("renew me"))
    with (
        sdk.get_queue_receiver(pooled_queue, max_wait_time=2) as receiver,
        other_sdk.get_queue_receiver(pooled_queue) as elsewhere,
    ):
        (msg,) = amqp_gateway_fixtures.receive_n(receiver, 1)
        before = msg.locked_until_utc
        after = elsewhere.renew_message_lock(msg)
        assert after > before
        receiver.complete_message(msg)
    assert _left(client, pooled_queue) == []


def test_deferred_messages_settle_through_another_connection(
    sdk: SdkClient, other_sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    done, dead = _deferred(sdk, pooled_queue, ["done", "dead"])
    if str(done) != "done":
        done, dead = dead, done
    with other_sdk.get_queue_receiver(pooled_queue) as elsewhere:
        elsewhere.complete_message(done)
        elsewhere.dead_letter_message(dead, reason="poison", error_description="bad body")
    assert _left(client, pooled_queue) == []
    with client.get_queue_receiver(
        pooled_queue, sub_queue=raybus.ServiceBusSubQueue.DEAD_LETTER, max_wait_time=2
    ) as r:
        (dlq,) = r.receive_messages(max_wait_time=3)
        assert str(dlq) == "dead"
        assert (dlq.dead_letter_reason, dlq.dead_letter_error_description) == (
            "poison",
            "bad body",
        )
        r.complete_message(dlq)


def test_a_token_settled_elsewhere_is_lock_lost_on_the_second_settlement(
    sdk: SdkClient, other_sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    (msg,) = _deferred(sdk, pooled_queue, ["once"])
    stale = copy.copy(msg)  # what a second holder of the same token has
    with other_sdk.get_queue_receiver(pooled_queue) as elsewhere:
        elsewhere.complete_message(msg)
    with sdk.get_queue_receiver(pooled_queue) as receiver:
        with pytest.raises(MessageLockLostError):
            receiver.abandon_message(stale)
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock(stale)
    assert _left(client, pooled_queue) == []  # not abandoned back into the queue
    assert _left(client, pooled_queue, raybus.ServiceBusSubQueue.DEAD_LETTER) == []


def test_an_unknown_token_is_lock_lost_and_changes_nothing(
    sdk: SdkClient, other_sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    (msg,) = _deferred(sdk, pooled_queue, ["keep"])
    forged = copy.copy(msg)
    forged._received_lock_token = uuid.uuid4()
    with other_sdk.get_queue_receiver(pooled_queue) as elsewhere:
        with pytest.raises(MessageLockLostError):
            elsewhere.dead_letter_message(forged, reason="never")
        with pytest.raises(MessageLockLostError):
            elsewhere.renew_message_lock(forged)
    # The real lock is untouched: the message is still deferred and locked, and its own
    # token completes it.
    with client.get_queue_receiver(pooled_queue) as r:
        (peeked,) = r.peek_messages(5)
        assert str(peeked) == "keep" and peeked.delivery_count == msg.delivery_count
    assert _left(client, pooled_queue, raybus.ServiceBusSubQueue.DEAD_LETTER) == []
    with other_sdk.get_queue_receiver(pooled_queue) as elsewhere:
        elsewhere.complete_message(msg)
    assert _left(client, pooled_queue) == []


def test_a_token_of_another_entity_is_lock_lost(
    sdk: SdkClient, other_sdk: SdkClient, admin: ServiceBusAdministrationClient
) -> None:
    first, second = (f"amqp-lt-{uuid.uuid4().hex[:8]}" for _ in range(2))
    admin.create_queue(first)
    admin.create_queue(second)
    (msg,) = _deferred(sdk, first, ["mine"])
    with other_sdk.get_queue_receiver(second) as wrong, pytest.raises(MessageLockLostError):
        wrong.complete_message(msg)
    with other_sdk.get_queue_receiver(first) as right:
        right.complete_message(copy.copy(msg))  # (the SDK marked ``msg`` settled)


def test_partitioned_queue_tokens_from_another_gateway_renew_and_settle(
    sdk: SdkClient, namespace: str, admin: ServiceBusAdministrationClient
) -> None:
    """The second gateway never delivered these tokens, so it knows no sequence number and
    asks every partition."""
    queue = f"amqp-lt-{uuid.uuid4().hex[:8]}"
    admin.create_queue(queue, partition_count=2)
    with sdk.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", partition_key=f"k{i}") for i in range(6)])
    with sdk.get_queue_receiver(queue, max_wait_time=2) as receiver:
        got = amqp_gateway_fixtures.receive_n(receiver, 6)
        assert len({m.sequence_number >> 48 for m in got}) == 2  # both partitions
        for m in got:
            receiver.defer_message(m)
        deferred = receiver.receive_deferred_messages([m.sequence_number for m in got])
    second = start_gateway(namespace, port=0)
    try:
        with _client(second) as far, far.get_queue_receiver(queue) as elsewhere:
            for m in deferred:
                before = m.locked_until_utc
                assert elsewhere.renew_message_lock(m) > before
            stale = copy.copy(deferred[0])
            for m in deferred[:3]:
                elsewhere.complete_message(m)
            for m in deferred[3:]:
                elsewhere.dead_letter_message(m, reason="far")
            with pytest.raises(MessageLockLostError):
                elsewhere.complete_message(stale)
    finally:
        second.stop()
    with sdk.get_queue_receiver(queue) as receiver:
        assert receiver.peek_messages(10) == []
    with sdk.get_queue_receiver(
        queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=2
    ) as dlq:
        dead = amqp_gateway_fixtures.receive_n(dlq, 3)
        assert sorted(str(m) for m in dead) == sorted(str(m) for m in deferred[3:])
        assert {m.dead_letter_reason for m in dead} == {"far"}


def test_a_session_message_settles_only_through_the_session_owner(
    sdk: SdkClient, other_sdk: SdkClient, admin: ServiceBusAdministrationClient
) -> None:
    """The owner of the session's lock settles its messages; another connection's receiver
    (of another session) is refused and the message stays locked by the owner."""
    queue = f"amqp-lt-{uuid.uuid4().hex[:8]}"
    admin.create_queue(queue, requires_session=True)
    with sdk.get_queue_sender(queue) as sender:
        sender.send_messages(
            [ServiceBusMessage("s1", session_id="s1"), ServiceBusMessage("s2", session_id="s2")]
        )
    with sdk.get_queue_receiver(queue, session_id="s1", max_wait_time=2) as owner:
        (msg,) = amqp_gateway_fixtures.receive_n(owner, 1)
        owner.defer_message(msg)
        (deferred,) = owner.receive_deferred_messages([msg.sequence_number])
        with (
            other_sdk.get_queue_receiver(queue, session_id="s2", max_wait_time=2) as other,
            pytest.raises(MessageLockLostError),
        ):
            other.complete_message(copy.copy(deferred))
        owner.complete_message(deferred)
        assert owner.peek_messages(5, sequence_number=1) == []


def test_a_lock_outlives_the_receiver_link_that_delivered_it(
    sdk: SdkClient, pooled_queue: str, client: raybus.ServiceBusClient
) -> None:
    """The SDK's receiver closed (its link detached; the message it handed out stays locked),
    and another receiver of the same client renews the lock by its token."""
    with sdk.get_queue_sender(pooled_queue) as sender:
        sender.send_messages(ServiceBusMessage("outlive"))
    with sdk.get_queue_receiver(pooled_queue, max_wait_time=2) as first:
        (msg,) = amqp_gateway_fixtures.receive_n(first, 1)
    with sdk.get_queue_receiver(pooled_queue) as second:
        before = msg.locked_until_utc
        assert second.renew_message_lock(msg) > before
    with client.get_queue_receiver(pooled_queue) as r:  # still locked under its token
        r.settle_message_by_lock_token(str(msg.lock_token), raybus.ServiceBusDisposition.COMPLETED)
    assert _left(client, pooled_queue) == []
