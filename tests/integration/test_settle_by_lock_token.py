"""Settling and renewing by lock token (``settle_message_by_lock_token``,
``renew_message_lock_by_lock_token``) and ``resolve_entity``: every disposition, from a receiver
that never held the message object, and the refusals that change nothing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import raybus
from raybus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusDisposition,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
    aio,
)
from raybus.exceptions import (
    InvalidArgumentError,
    MessageLockLostError,
    MessagingEntityNotFoundError,
)
from raybus.management import ServiceBusAdministrationClient


@pytest.fixture
def namespace(module_namespace: str) -> str:
    """One namespace for the module: every test uses its own queues."""
    return module_namespace


def _queue(admin: ServiceBusAdministrationClient, **options: Any) -> str:
    name = f"tok-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, **options)
    return name


def _lock_one(client: raybus.ServiceBusClient, name: str, body: str = "m") -> tuple[str, int]:
    """Send one message, receive it, and forget the message object: (lock token, seq)."""
    client.get_queue_sender(name).send_messages(ServiceBusMessage(body))
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        assert msg.lock_token is not None
        token, seq = msg.lock_token, msg.sequence_number
        # Closing the receiver does not release a message it returned: the lock stays.
    return token, seq


def _nothing_available(client: raybus.ServiceBusClient, name: str) -> bool:
    with client.get_queue_receiver(name, max_wait_time=0.3) as receiver:
        got = receiver.receive_messages()
        for msg in got:
            receiver.abandon_message(msg)
        return not got


def _completed_is_gone(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, name: str, seq: int
) -> None:
    with client.get_queue_receiver(name) as receiver:
        assert receiver.peek_messages(5) == []
    assert admin.get_queue_runtime_properties(name).active_message_count == 0


def _comes_again_with(delivery_count: int) -> Callable[..., None]:
    def check(
        admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, name: str, seq: int
    ) -> None:
        with client.get_queue_receiver(name, max_wait_time=5) as receiver:
            (again,) = receiver.receive_messages()
            assert again.delivery_count == delivery_count
            assert again.application_properties == {"why": "retry"}
            receiver.complete_message(again)

    return check


def _deferred_by_sequence_number(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, name: str, seq: int
) -> None:
    assert _nothing_available(client, name)
    with client.get_queue_receiver(name) as receiver:
        (deferred,) = receiver.receive_deferred_messages([seq])
        receiver.complete_message(deferred)


def _dead_lettered_with_reason(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient, name: str, seq: int
) -> None:
    dlq = client.get_queue_receiver(name, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5)
    with dlq:
        (dead,) = dlq.receive_messages()
        assert (dead.dead_letter_reason, dead.dead_letter_error_description) == (
            "bad",
            "unparseable",
        )
        # The dead-letter receiver settles its own locks by token too.
        assert dead.lock_token is not None
        dlq.settle_message_by_lock_token(dead.lock_token, ServiceBusDisposition.COMPLETED)
    assert admin.get_queue_runtime_properties(name).dead_letter_message_count == 0


# One row per disposition: (disposition as passed, settle options, whether the sequence number is
# passed, the check of its effect). ABANDONED/RELEASED pass no sequence number (the queue has one
# partition) and DEFERRED is given as its string value, as callers may.
_DISPOSITIONS = [
    pytest.param(ServiceBusDisposition.COMPLETED, {}, True, _completed_is_gone, id="completed"),
    *(
        pytest.param(
            disposition,
            # RELEASED names its property as bytes, as SDK code reading received ones may.
            {"properties_to_modify": {b"why" if name == "released" else "why": "retry"}},
            False,
            _comes_again_with(delivery_count),
            id=name,
        )
        for disposition, delivery_count, name in [
            (ServiceBusDisposition.ABANDONED, 1, "abandoned"),
            (ServiceBusDisposition.RELEASED, 0, "released"),
        ]
    ),
    pytest.param("deferred", {}, True, _deferred_by_sequence_number, id="deferred"),
    pytest.param(
        ServiceBusDisposition.DEAD_LETTERED,
        {"dead_letter_reason": "bad", "dead_letter_error_description": "unparseable"},
        True,
        _dead_lettered_with_reason,
        id="dead_lettered",
    ),
]


@pytest.mark.parametrize(("disposition", "options", "with_seq", "effect"), _DISPOSITIONS)
def test_settled_by_lock_token_from_another_receiver_has_the_dispositions_effect(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    disposition: ServiceBusDisposition | str,
    options: dict[str, Any],
    with_seq: bool,
    effect: Callable[..., None],
) -> None:
    name = _queue(admin)
    token, seq = _lock_one(client, name)
    if with_seq:
        options = {**options, "sequence_number": seq}
    with client.get_queue_receiver(name) as other:
        other.settle_message_by_lock_token(token, disposition, **options)
    effect(admin, client, name, seq)


@pytest.mark.parametrize(
    ("token", "kwargs"),
    [
        ("not-a-uuid", {}),
        (42, {}),
        ("", {}),
        (None, {"disposition": "shredded"}),
        (None, {"properties_to_modify": {"a": 1}}),  # with COMPLETED
        (None, {"dead_letter_reason": "only for DEAD_LETTERED"}),
        (None, {"sequence_number": -1}),
        (None, {"sequence_number": True}),
    ],
)
def test_bad_input_is_invalid_argument_and_the_message_stays_locked(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    token: Any,
    kwargs: dict[str, Any],
) -> None:
    name = _queue(admin)
    real, _seq = _lock_one(client, name)
    disposition = kwargs.pop("disposition", ServiceBusDisposition.COMPLETED)
    with client.get_queue_receiver(name) as receiver:
        with pytest.raises(InvalidArgumentError):
            receiver.settle_message_by_lock_token(
                real if token is None else token, disposition, **kwargs
            )
        assert _nothing_available(client, name)  # still locked: nothing changed
        receiver.settle_message_by_lock_token(real, ServiceBusDisposition.COMPLETED)
    assert admin.get_queue_runtime_properties(name).active_message_count == 0


def test_unknown_lock_token_is_lock_lost_and_changes_nothing(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _queue(admin)
    real, seq = _lock_one(client, name)
    bogus = str(uuid.uuid4())
    with client.get_queue_receiver(name) as receiver:
        with pytest.raises(MessageLockLostError) as info:
            receiver.settle_message_by_lock_token(bogus, ServiceBusDisposition.COMPLETED)
        assert info.value.lock_token == bogus
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock_by_lock_token(bogus)
        assert _nothing_available(client, name)
        # An upper-case token is the same lock (REST callers may send either form).
        receiver.settle_message_by_lock_token(
            real.upper(), ServiceBusDisposition.COMPLETED, sequence_number=seq
        )


def test_settling_twice_by_lock_token_is_lock_lost_the_second_time(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _queue(admin)
    token, seq = _lock_one(client, name)
    with client.get_queue_receiver(name) as receiver:
        receiver.settle_message_by_lock_token(token, ServiceBusDisposition.DEFERRED)
        with pytest.raises(MessageLockLostError):
            receiver.settle_message_by_lock_token(token, ServiceBusDisposition.ABANDONED)
        # The first settlement stands: the message is deferred, not back in the queue.
        assert _nothing_available(client, name)
        (deferred,) = receiver.receive_deferred_messages(seq)
        receiver.complete_message(deferred)


def test_expired_lock_is_lock_lost_and_the_message_comes_again(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _queue(admin, lock_duration=timedelta(milliseconds=300))
    token, seq = _lock_one(client, name)
    time.sleep(0.6)
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        with pytest.raises(MessageLockLostError):
            receiver.settle_message_by_lock_token(
                token, ServiceBusDisposition.COMPLETED, sequence_number=seq
            )
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock_by_lock_token(token, sequence_number=seq)
        (again,) = receiver.receive_messages()
        assert again.sequence_number == seq and again.delivery_count == 1
        receiver.complete_message(again)


def test_renew_by_lock_token_extends_the_lock(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _queue(admin, lock_duration=timedelta(seconds=2))
    token, seq = _lock_one(client, name)
    with client.get_queue_receiver(name) as receiver:
        before = time.time()
        until = receiver.renew_message_lock_by_lock_token(token, sequence_number=seq)
        assert until.timestamp() >= before + 1.9
        time.sleep(1.2)
        receiver.renew_message_lock_by_lock_token(token)
        time.sleep(1.2)  # past the first lock's end, 0.8 s within the renewed ones
        receiver.settle_message_by_lock_token(token, ServiceBusDisposition.COMPLETED)


def test_partitioned_queue_needs_the_sequence_number(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _queue(admin, partition_count=2)
    sender = client.get_queue_sender(name)
    sender.send_messages([ServiceBusMessage(str(i), partition_key=f"k{i}") for i in range(8)])
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        got: list[Any] = []
        while len(got) < 8:
            got += receiver.receive_messages(8)
    held = [(m.lock_token, m.sequence_number) for m in got]
    assert {seq >> 48 for _t, seq in held} == {0, 1}
    with client.get_queue_receiver(name) as other:
        with pytest.raises(InvalidArgumentError) as info:
            other.settle_message_by_lock_token(held[0][0], ServiceBusDisposition.COMPLETED)
        assert info.value.argument == "sequence_number"
        for token, seq in held:
            other.settle_message_by_lock_token(
                token, ServiceBusDisposition.COMPLETED, sequence_number=seq
            )
    assert admin.get_queue_runtime_properties(name).active_message_count == 0


def test_receive_and_delete_receiver_has_no_locks_to_settle(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _queue(admin)
    token, _seq = _lock_one(client, name)
    receiver = client.get_queue_receiver(
        name, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    )
    with receiver:
        with pytest.raises(InvalidArgumentError):
            receiver.settle_message_by_lock_token(token, ServiceBusDisposition.COMPLETED)
        with pytest.raises(InvalidArgumentError):
            receiver.renew_message_lock_by_lock_token(token)


def test_session_receiver_settles_by_lock_token_without_sequence_number(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _queue(admin, requires_session=True)
    client.get_queue_sender(name).send_messages(ServiceBusMessage("s", session_id="a"))
    with client.get_queue_receiver(
        name, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
    ) as receiver:
        (msg,) = receiver.receive_messages()
        assert msg.lock_token is not None
        with pytest.raises(InvalidArgumentError):  # locked by the session: renew that
            receiver.renew_message_lock_by_lock_token(msg.lock_token)
        receiver.settle_message_by_lock_token(msg.lock_token, ServiceBusDisposition.COMPLETED)
    assert admin.get_queue_runtime_properties(name).active_message_count == 0


async def test_aio_settle_and_renew_by_lock_token(
    admin: ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    name = _queue(admin)
    async with aclient.get_queue_sender(name) as sender:
        await sender.send_messages(ServiceBusMessage("a"))
    async with aclient.get_queue_receiver(name, max_wait_time=5) as receiver:
        (msg,) = await receiver.receive_messages()
        token, seq = msg.lock_token, msg.sequence_number
        assert token is not None
    async with aclient.get_queue_receiver(name) as other:
        until = await other.renew_message_lock_by_lock_token(token, sequence_number=seq)
        assert until.timestamp() > time.time()
        await other.settle_message_by_lock_token(token, ServiceBusDisposition.COMPLETED)
        with pytest.raises(MessageLockLostError):
            await other.settle_message_by_lock_token(token, ServiceBusDisposition.COMPLETED)


def test_resolve_entity_describes_queues_topics_and_subscriptions(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _queue(admin, lock_duration=timedelta(seconds=7), requires_session=True)
    info = client.resolve_entity(name)
    assert (info.entity_path, info.kind, info.requires_session) == (name, "queue", True)
    assert info.lock_duration == timedelta(seconds=7)
    assert info.max_message_size_in_bytes == 256 * 1024
    assert info.partition_ids == (0,)
    assert client.resolve_entity(_queue(admin, partition_count=3)).partition_ids == (0, 1, 2)
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin.create_topic(topic, max_message_size_in_kilobytes=1024)
    try:
        admin.create_subscription(topic, "s")
        tinfo = client.resolve_entity(topic)
        assert (tinfo.kind, tinfo.max_message_size_in_bytes) == ("topic", 1024 * 1024)
        assert tinfo.lock_duration is None and tinfo.partition_ids == ()
        sinfo = client.resolve_entity(f"{topic}/Subscriptions/s")
        assert sinfo.kind == "subscription"
        assert sinfo.entity_path.lower() == f"{topic}/subscriptions/s"
    finally:
        admin.delete_topic(topic)
    with pytest.raises(MessagingEntityNotFoundError):
        client.resolve_entity("no-such-queue")
    with pytest.raises(InvalidArgumentError):
        client.resolve_entity("")


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_settle_by_lock_token_joins_a_transaction(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, commit: bool
) -> None:
    """Dead-lettered at the commit with the transaction's send; a rollback leaves the lock as
    it was (settle it again)."""
    name, target = _queue(admin), _queue(admin)
    token, seq = _lock_one(client, name, "by-token")
    txn = client.transaction()
    with client.get_queue_receiver(name) as receiver:
        receiver.settle_message_by_lock_token(
            token, ServiceBusDisposition.DEAD_LETTERED, dead_letter_reason="r", transaction=txn
        )
        client.get_queue_sender(target).send_messages(ServiceBusMessage("w"), transaction=txn)
        assert receiver.peek_messages(5)[0].sequence_number == seq  # not yet
        if commit:
            txn.commit()
        else:
            txn.rollback()
        dlq = client.get_queue_receiver(name, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        with dlq:
            assert [m.dead_letter_reason for m in dlq.peek_messages(5)] == (["r"] if commit else [])
        if not commit:
            receiver.settle_message_by_lock_token(token, ServiceBusDisposition.COMPLETED)
    assert _nothing_available(client, name)
    with client.get_queue_receiver(target) as r:
        assert len(r.peek_messages(5)) == (1 if commit else 0)


def test_renew_by_lock_token_in_a_transaction_extends_the_lock_at_the_commit(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    """Joining answers the expiry as it stands; a rollback leaves it, a commit extends it."""
    name = _queue(admin)
    token, _seq = _lock_one(client, name)

    def expiry_now(receiver: raybus.ServiceBusReceiver) -> Any:
        look = client.transaction()
        try:
            return receiver.renew_message_lock_by_lock_token(token, transaction=look)
        finally:
            look.rollback()

    with client.get_queue_receiver(name) as receiver:
        before = expiry_now(receiver)
        txn = client.transaction()
        assert receiver.renew_message_lock_by_lock_token(token, transaction=txn) == before
        txn.rollback()
        assert expiry_now(receiver) == before
        txn = client.transaction()
        receiver.renew_message_lock_by_lock_token(token, transaction=txn)
        txn.commit()
        assert expiry_now(receiver) > before
        receiver.settle_message_by_lock_token(token, ServiceBusDisposition.COMPLETED)


def test_a_lock_token_not_held_cannot_join_a_transaction(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    """Refused when it joins, and the transaction holds nothing of it: it commits."""
    name, target = _queue(admin), _queue(admin)
    token, _seq = _lock_one(client, name)
    with client.get_queue_receiver(name) as receiver:
        receiver.settle_message_by_lock_token(token, ServiceBusDisposition.COMPLETED)  # used
        txn = client.transaction()
        with pytest.raises(MessageLockLostError):
            receiver.settle_message_by_lock_token(
                token, ServiceBusDisposition.COMPLETED, transaction=txn
            )
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock_by_lock_token(str(uuid.uuid4()), transaction=txn)
        with pytest.raises(InvalidArgumentError):
            receiver.settle_message_by_lock_token(
                token, ServiceBusDisposition.RELEASED, transaction=txn
            )
        client.get_queue_sender(target).send_messages(ServiceBusMessage("w"), transaction=txn)
        txn.commit()
    with client.get_queue_receiver(target) as r:
        assert [str(m) for m in r.peek_messages(5)] == ["w"]
