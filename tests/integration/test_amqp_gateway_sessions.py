"""The azure-servicebus SDK against the raybus AMQP gateway: sessions (named, next available,
state, lock renewal, listing), topics and subscriptions, a subscription's dead-letter queue,
and SAS tokens presented through CBS."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import amqp_gateway_fixtures
import pytest
from amqp_gateway_fixtures import receive_n
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus import ServiceBusClient as SdkClient
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusAuthenticationError

from raybus.amqp import GatewayHandle
from raybus.management import ServiceBusAdministrationClient

# The shared gateway fixtures (module-scoped gateway, SDK client, module namespace).
namespace = amqp_gateway_fixtures.namespace
gateway = amqp_gateway_fixtures.gateway
sdk = amqp_gateway_fixtures.sdk


@pytest.fixture
def session_queue(admin: ServiceBusAdministrationClient) -> str:
    """A fresh session queue per test (the test's cleanup deletes it)."""
    name = f"amqp-sess-{uuid.uuid4().hex[:6]}"
    admin.create_queue(name, requires_session=True)
    return name


def test_named_session_receives_only_its_messages_and_keeps_state(
    sdk: SdkClient, session_queue: str
) -> None:
    with sdk.get_queue_sender(session_queue) as sender:
        sender.send_messages(
            [
                ServiceBusMessage(f"{sid}-{i}", session_id=sid)
                for sid in ("a1", "b1")
                for i in range(2)
            ]
        )
    with sdk.get_queue_receiver(session_queue, session_id="b1", max_wait_time=2) as receiver:
        assert receiver.session.session_id == "b1"
        assert receiver.session.locked_until_utc is not None
        got = receive_n(receiver, 2)
        assert [str(m) for m in got] == ["b1-0", "b1-1"]
        assert all(m.session_id == "b1" for m in got)
        before = receiver.session.locked_until_utc
        assert receiver.session.renew_lock() >= before
        assert receiver.session.get_state() is None
        receiver.session.set_state(b"checkpoint-2")
        assert receiver.session.get_state() == b"checkpoint-2"
        # The SDK peeks from after the last message it received unless told where to start.
        assert receiver.peek_messages(5) == []
        peeked = receiver.peek_messages(5, sequence_number=got[0].sequence_number)
        assert [str(m) for m in peeked] == ["b1-0", "b1-1"]
        for m in got:
            receiver.complete_message(m)
    with sdk.get_queue_receiver(session_queue, session_id="b1", max_wait_time=1) as again:
        assert again.session.get_state() == b"checkpoint-2"
        assert again.receive_messages(max_wait_time=1) == []
    assert sorted(sdk.list_queue_sessions(session_queue)) == [
        "a1",
        "b1",
    ]  # a1 has messages, b1 state
    with sdk.get_queue_receiver(session_queue, session_id="a1", max_wait_time=2) as receiver:
        got = receive_n(receiver, 2)
        for m in got:
            receiver.complete_message(m)


def test_batch_delete_with_a_session_id_deletes_only_that_sessions_messages(
    gateway: GatewayHandle, sdk: SdkClient, session_queue: str
) -> None:
    """``batch-delete-messages`` with a ``session-id`` goes through the connection's receiver
    holding that session and deletes only its messages; without such a receiver it is refused
    and deletes nothing."""
    from amqp_proton_management import management_call

    with sdk.get_queue_sender(session_queue) as sender:
        sender.send_messages(
            [
                ServiceBusMessage(f"{sid}-{i}", session_id=sid)
                for sid in ("a", "b")
                for i in range(3)
            ]
        )
    count = {"message-count": 10}
    answer = management_call(
        gateway.port,
        session_queue,
        "batch-delete-messages",
        {**count, "session-id": "b"},
        session_id="b",
    )
    assert (answer.status, answer.body) == (200, {"message-count": 3})
    refused = management_call(
        gateway.port, session_queue, "batch-delete-messages", {**count, "session-id": "a"}
    )
    assert (refused.status, refused.condition) == (410, "com.microsoft:session-lock-lost")
    with sdk.get_queue_receiver(session_queue, session_id="a", max_wait_time=2) as receiver:
        assert [str(m) for m in receiver.peek_messages(10, sequence_number=1)] == [
            "a-0",
            "a-1",
            "a-2",
        ]
    with sdk.get_queue_receiver(session_queue, session_id="b", max_wait_time=1) as receiver:
        assert receiver.peek_messages(10, sequence_number=1) == []


def test_next_available_session_is_named_in_the_receiver(
    sdk: SdkClient, session_queue: str
) -> None:
    with sdk.get_queue_sender(session_queue) as sender:
        sender.send_messages(ServiceBusMessage("only", session_id="n1"))
    with sdk.get_queue_receiver(
        session_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=3
    ) as receiver:
        assert receiver.session.session_id == "n1"
        (msg,) = receiver.receive_messages(max_wait_time=3)
        assert str(msg) == "only"
        receiver.complete_message(msg)


def test_next_available_session_times_out_when_none_has_messages(
    sdk: SdkClient, session_queue: str
) -> None:
    with (
        pytest.raises(OperationTimeoutError),
        sdk.get_queue_receiver(
            session_queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
        ) as receiver,
    ):
        receiver.receive_messages(max_wait_time=1)


def test_topic_fans_out_to_subscriptions_and_their_dead_letter_queue(
    sdk: SdkClient, admin: ServiceBusAdministrationClient
) -> None:
    topic = f"amqp-t-{uuid.uuid4().hex[:6]}"
    admin.create_topic(topic)
    admin.create_subscription(topic, "s1")
    admin.create_subscription(topic, "s2")
    try:
        with sdk.get_topic_sender(topic) as sender:
            sender.send_messages([ServiceBusMessage("e0"), ServiceBusMessage("e1")])
        for sub in ("s1", "s2"):
            with sdk.get_subscription_receiver(topic, sub, max_wait_time=2) as receiver:
                got = receive_n(receiver, 2)
                assert [str(m) for m in got] == ["e0", "e1"]
                receiver.complete_message(got[0])
                receiver.dead_letter_message(got[1], reason="r", error_description="d")
        with sdk.get_subscription_receiver(
            topic, "s2", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=2
        ) as dlq:
            (dead,) = dlq.receive_messages(max_wait_time=3)
            assert str(dead) == "e1" and dead.dead_letter_reason == "r"
            dlq.complete_message(dead)
    finally:
        admin.delete_topic(topic)


def _rule_call(gateway: GatewayHandle, node: str, operation: str, body: dict[str, Any]) -> Any:
    from amqp_proton_management import management_call

    return management_call(gateway.port, node, operation, body)


def test_rule_manager_operations_add_enumerate_and_remove_a_subscriptions_rules(
    gateway: GatewayHandle, sdk: SdkClient, admin: ServiceBusAdministrationClient
) -> None:
    """``add-rule``, ``enumerate-rules`` and ``remove-rule`` as the .NET SDK's
    ``ServiceBusRuleManager`` sends them (``raybus.amqp._rules``): the filters and action as
    maps in, described lists out; a bad or clashing rule is refused and stores nothing."""
    from proton import Described as ProtonDescribed

    topic = f"amqp-t-{uuid.uuid4().hex[:6]}"
    admin.create_topic(topic)
    admin.create_subscription(topic, "s")
    node = f"{topic}/Subscriptions/s"
    none = dict.fromkeys(
        ["correlation-id", "message-id", "to", "reply-to", "session-id", "reply-to-session-id"]
    )
    requests = {
        "big": {"sql-filter": {"expression": "n > 5"}, "sql-rule-action": None},
        "hot": {
            "correlation-filter": {**none, "label": "hot", "properties": {"colour": "red"}},
            "sql-rule-action": {"expression": "SET tagged = 1"},
        },
        "every": {"sql-filter": {"expression": "1=1"}, "sql-rule-action": None},
    }
    try:
        for name, description in requests.items():
            answer = _rule_call(
                gateway,
                node,
                "add-rule",
                {"rule-name": name, "rule-description": {**description, "rule-name": name}},
            )
            assert answer.status == 200, answer
        bad_sql = {"sql-filter": {"expression": "n >"}}
        refused = [
            _rule_call(gateway, node, "add-rule", {"rule-name": "BIG", "rule-description": bad})
            for bad in (requests["big"], bad_sql, {"sql-rule-action": None})
        ]
        assert [(a.status, a.condition) for a in refused] == [
            (409, "com.microsoft:entity-already-exists"),
            (400, "com.microsoft:argument-error"),
            (400, "com.microsoft:argument-error"),
        ]
        listed = _rule_call(gateway, node, "enumerate-rules", {"top": 100, "skip": 0})
        assert listed.status == 200
        rules = [entry["rule-description"] for entry in listed.body["rules"]]
        assert all(isinstance(r, ProtonDescribed) for r in rules)
        assert {r.descriptor for r in rules} == {0x0000013700000004}
        shown = [(r.value[2], r.value[0].descriptor, r.value[1].descriptor) for r in rules]
        assert shown == [
            ("$Default", 0x0000013700000007, 0x0000013700000005),
            ("big", 0x0000013700000006, 0x0000013700000005),
            ("hot", 0x0000013700000009, 0x0000013700000006),
            ("every", 0x0000013700000007, 0x0000013700000005),
        ]
        assert rules[1].value[0].value[0] == "n > 5"
        hot_filter, hot_action = rules[2].value[0].value, rules[2].value[1].value
        assert (hot_filter[4], hot_filter[8]) == ("hot", {"colour": "red"})
        assert hot_action[0] == "SET tagged = 1"
        assert all(r.value[3] is not None for r in rules)  # each rule's creation time
        page = _rule_call(gateway, node, "enumerate-rules", {"top": 2, "skip": 3})
        assert [e["rule-description"].value[2] for e in page.body["rules"]] == ["every"]
        assert _rule_call(gateway, node, "enumerate-rules", {"top": 10, "skip": 4}).status == 204
        for name in ("$Default", "every"):
            assert _rule_call(gateway, node, "remove-rule", {"rule-name": name}).status == 200
        missing = _rule_call(gateway, node, "remove-rule", {"rule-name": "every"})
        assert (missing.status, missing.condition) == (404, "amqp:not-found")
        unnamed = _rule_call(gateway, node, "remove-rule", {})
        assert (unnamed.status, unnamed.condition) == (400, "com.microsoft:argument-error")
        on_topic = _rule_call(gateway, topic, "enumerate-rules", {"top": 10})
        assert (on_topic.status, on_topic.condition) == (400, "com.microsoft:argument-error")
        assert [r.name for r in admin.list_rules(topic, "s")] == ["big", "hot"]
        with sdk.get_topic_sender(topic) as sender:
            sender.send_messages(
                [
                    ServiceBusMessage("small", application_properties={"n": 1}),
                    ServiceBusMessage("large", application_properties={"n": 9}),
                    ServiceBusMessage(
                        "red", subject="hot", application_properties={"colour": "red"}
                    ),
                ]
            )
        with sdk.get_subscription_receiver(topic, "s", max_wait_time=2) as receiver:
            got = receive_n(receiver, 2)
            for m in got:
                receiver.complete_message(m)
        assert sorted(str(m) for m in got) == ["large", "red"]
    finally:
        admin.delete_topic(topic)


def test_schedule_on_a_topic_answers_its_numbers_and_cancel_takes_them(
    sdk: SdkClient, admin: ServiceBusAdministrationClient
) -> None:
    """The topic holds scheduled messages and numbers them (``raybus._core.topic_schedule``):
    the SDK's ``schedule-message`` and ``cancel-scheduled-message`` work on a topic sender."""
    topic = f"amqp-t-{uuid.uuid4().hex[:6]}"
    admin.create_topic(topic)
    admin.create_subscription(topic, "s1")
    try:
        now = datetime.now(timezone.utc)
        with sdk.get_topic_sender(topic) as sender:
            (far,) = sender.schedule_messages(ServiceBusMessage("far"), now + timedelta(hours=1))
            soon_at = now + timedelta(seconds=2)
            (soon,) = sender.schedule_messages(ServiceBusMessage("soon"), soon_at)
            assert soon == far + 1
            assert admin.get_topic_runtime_properties(topic).scheduled_message_count == 2
            sender.cancel_scheduled_messages(far)
        assert admin.get_topic_runtime_properties(topic).scheduled_message_count <= 1
        with sdk.get_subscription_receiver(topic, "s1", max_wait_time=5) as receiver:
            (got,) = receive_n(receiver, 1)
            assert str(got) == "soon" and got.scheduled_enqueue_time_utc is not None
            receiver.complete_message(got)
        assert admin.get_topic_runtime_properties(topic).scheduled_message_count == 0
    finally:
        admin.delete_topic(topic)


def test_malformed_sas_token_is_refused_with_an_authentication_error(
    gateway: GatewayHandle, pooled_queue: str
) -> None:
    conn_str = (
        f"Endpoint=sb://localhost:{gateway.port};SharedAccessSignature=not-a-token;"
        "UseDevelopmentEmulator=true;"
    )
    client = SdkClient.from_connection_string(conn_str, retry_total=0)
    sender = client.get_queue_sender(pooled_queue)
    with client, pytest.raises(ServiceBusAuthenticationError), sender:
        sender.send_messages(ServiceBusMessage("x"), timeout=10)
