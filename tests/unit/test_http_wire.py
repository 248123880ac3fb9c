"""The HTTP gateway's pure parts, without Ray: routes, messages on the wire, tokens, statuses."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from raybus._client_cache import ClientCache
from raybus._core.record import MessageRecord
from raybus.auth import SasTokenCredential, generate_sas_token
from raybus.enums import ServiceBusSubQueue
from raybus.exceptions import (
    InvalidArgumentError,
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
    ServiceBusQuotaExceededError,
    ServiceBusServerBusyError,
    SettlementFailedError,
)
from raybus.http import GatewaySettings
from raybus.http._runtime import (
    RuntimeRoute,
    error_response,
    match_runtime,
    receive_timeout,
    status_of,
)
from raybus.http._sas import credential_from_header
from raybus.http._wire import (
    HttpError,
    batch_messages,
    received_body,
    received_headers,
    single_message,
)
from raybus.message import ServiceBusReceivedMessage

# ------------------------------------------------------------------ routes


DLQ = ServiceBusSubQueue.DEAD_LETTER
TDLQ = ServiceBusSubQueue.TRANSFER_DEAD_LETTER


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/orders/messages", RuntimeRoute("send", "orders")),
        ("post", "/Orders/Messages", RuntimeRoute("send", "Orders")),
        ("POST", "/a/b/messages", RuntimeRoute("send", "a/b")),
        ("POST", "/orders/messages/head", RuntimeRoute("peek_lock", "orders")),
        ("DELETE", "/orders/messages/head", RuntimeRoute("receive_delete", "orders")),
        (
            "POST",
            "/t/subscriptions/s/messages/head",
            RuntimeRoute("peek_lock", "t", "s"),
        ),
        (
            "DELETE",
            "/t/Subscriptions/s/$DeadLetterQueue/messages/head",
            RuntimeRoute("receive_delete", "t", "s", DLQ),
        ),
        (
            "POST",
            "/orders/%24DeadLetterQueue/messages/head",
            RuntimeRoute("peek_lock", "orders", None, DLQ),
        ),
        (
            "POST",
            "/orders/$Transfer/$DeadLetterQueue/messages/head",
            RuntimeRoute("peek_lock", "orders", None, TDLQ),
        ),
        (
            "DELETE",
            "/t/subscriptions/s/$transfer/$deadletterqueue/messages/9/tok",
            RuntimeRoute("complete", "t", "s", TDLQ, 9, "tok"),
        ),
        ("DELETE", "/q/messages/42/tok", RuntimeRoute("complete", "q", None, None, 42, "tok")),
        ("PUT", "/q/messages/42/tok", RuntimeRoute("unlock", "q", None, None, 42, "tok")),
        ("POST", "/q/messages/42/tok", RuntimeRoute("renew", "q", None, None, 42, "tok")),
        ("PUT", "/q/messages/msg-id/tok", RuntimeRoute("unlock", "q", None, None, None, "tok")),
        (
            "DELETE",
            "/t/subscriptions/s/messages/7/a%2Fb",
            RuntimeRoute("complete", "t", "s", None, 7, "a/b"),
        ),
    ],
)
def test_runtime_paths_parse_to_their_route(method: str, path: str, expected: RuntimeRoute) -> None:
    assert match_runtime(method, path) == expected


@pytest.mark.parametrize("path", ["/orders", "/$Resources/queues", "/t/subscriptions/s", "/"])
def test_paths_without_a_messages_tail_are_not_runtime(path: str) -> None:
    assert match_runtime("GET", path) is None


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/q/messages", 405),
        ("PATCH", "/q/messages/head", 405),
        ("GET", "/q/messages/1/t", 405),
        ("POST", "/t/subscriptions/s/messages", 400),
        ("POST", "/q/$DeadLetterQueue/messages", 400),
        ("POST", "/$DeadLetterQueue/messages/head", 400),
        ("DELETE", "/q/messages/1/" + "x" * 200, 400),
        ("DELETE", "/q/messages/1/%0A", 400),
    ],
)
def test_malformed_runtime_paths_are_refused(method: str, path: str, status: int) -> None:
    with pytest.raises(HttpError) as info:
        match_runtime(method, path)
    assert info.value.status == status


def test_receive_timeout_defaults_caps_and_refuses_bad_values() -> None:
    assert receive_timeout({}, 300) == 60
    assert receive_timeout({}, 5) == 5
    assert receive_timeout({"timeout": "2.5"}, 60) == 2.5
    assert receive_timeout({"timeout": "0"}, 60) == 0
    assert receive_timeout({"timeout": "3600"}, 60) == 60
    for bad in ("x", "-1", "nan", "inf", ""):
        with pytest.raises(HttpError) as info:
            receive_timeout({"timeout": bad}, 60)
        assert info.value.status == 400


# ------------------------------------------------------------------ messages in


def test_single_message_takes_broker_properties_content_type_and_custom_headers() -> None:
    msg = single_message(
        [
            ("host", "127.0.0.1"),
            ("user-agent", "curl"),
            ("authorization", "SharedAccessSignature x"),
            ("x-ms-retrypolicy", "NoRetry"),
            (
                "brokerproperties",
                json.dumps(
                    {
                        "MessageId": "m",
                        "CorrelationId": "c",
                        "SessionId": "s",
                        "PartitionKey": "s",
                        "Label": "l",
                        "ReplyTo": "r",
                        "ReplyToSessionId": "rs",
                        "To": "t",
                        "TimeToLive": 90,
                        "ScheduledEnqueueTimeUtc": "Sun, 06 Nov 2044 08:49:37 GMT",
                        "ForcePersistence": True,
                    }
                ),
            ),
            ("priority", '"High"'),
            ("amount", "10"),
            ("ratio", "0.5"),
            ("flag", "false"),
            ("text", "plain words"),
            ("list", "[1, 2]"),
        ],
        "text/plain",
        b"body",
    )
    assert msg.body == b"body"
    assert (msg.message_id, msg.correlation_id, msg.session_id, msg.partition_key) == (
        "m",
        "c",
        "s",
        "s",
    )
    assert (msg.subject, msg.reply_to, msg.reply_to_session_id, msg.to) == ("l", "r", "rs", "t")
    assert msg.time_to_live == timedelta(seconds=90)
    assert msg.scheduled_enqueue_time_utc == datetime(2044, 11, 6, 8, 49, 37, tzinfo=timezone.utc)
    assert msg.content_type == "text/plain"
    assert msg.application_properties == {
        "priority": "High",
        "amount": 10,
        "ratio": 0.5,
        "flag": False,
        "text": "plain words",
        "list": "[1, 2]",
    }


def test_iso_dates_and_broker_content_type_are_accepted() -> None:
    msg = single_message(
        [
            (
                "BrokerProperties",
                '{"ScheduledEnqueueTimeUtc": "2044-01-02T03:04:05Z", "ContentType": "a/b"}',
            )
        ],
        "text/plain",
        b"",
    )
    assert msg.scheduled_enqueue_time_utc == datetime(2044, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert msg.content_type == "a/b"
    assert msg.application_properties is None


@pytest.mark.parametrize(
    ("broker", "why"),
    [
        ("{", "not valid JSON"),
        ("7", "must be a JSON object"),
        ('{"Label": 1}', "Label must be a string"),
        ('{"TimeToLive": 0}', "TimeToLive"),
        ('{"TimeToLive": true}', "TimeToLive"),
        ('{"ScheduledEnqueueTimeUtc": 5}', "ScheduledEnqueueTimeUtc"),
        ('{"ScheduledEnqueueTimeUtc": "not a date"}', "not an RFC 1123"),
        ('{"MessageId": "' + "x" * 129 + '"}', "message_id"),
    ],
)
def test_bad_broker_properties_are_400_with_the_reason(broker: str, why: str) -> None:
    with pytest.raises(HttpError) as info:
        single_message([("BrokerProperties", broker)], None, b"x")
    assert info.value.status == 400
    assert why in info.value.reason


def test_two_broker_properties_headers_are_refused() -> None:
    with pytest.raises(HttpError, match="one BrokerProperties"):
        single_message([("BrokerProperties", "{}"), ("brokerproperties", "{}")], None, b"")


def test_batch_messages_parse_bodies_and_properties() -> None:
    msgs = batch_messages(
        json.dumps(
            [
                {"Body": "a", "BrokerProperties": {"MessageId": "1"}},
                {"Body": "b", "UserProperties": {"k": "v", "n": 2, "none": None}},
                {},
            ]
        ).encode()
    )
    assert [m.body for m in msgs] == [b"a", b"b", b""]
    assert msgs[0].message_id == "1"
    assert msgs[1].application_properties == {"k": "v", "n": 2, "none": None}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{}",
        b"[]",
        b"[1]",
        b'[{"Body": 1}]',
        b'[{"UserProperties": []}]',
        b'[{"BrokerProperties": 0}]',
        b"\xff\xfe",
    ],
)
def test_bad_batches_are_400(body: bytes) -> None:
    with pytest.raises(HttpError) as info:
        batch_messages(body)
    assert info.value.status == 400


# ------------------------------------------------------------------ messages out


def _received(**fields: object) -> ServiceBusReceivedMessage:
    record = MessageRecord(
        sequence_number=5,
        enqueued_sequence_number=5,
        enqueued_time=1_700_000_000.0,
        lock_token="tok",
        locked_until=1_700_000_060.0,
        **fields,  # type: ignore[arg-type]
    )
    return ServiceBusReceivedMessage(record, entity="q", kind="locked")


def test_received_headers_carry_broker_and_custom_properties() -> None:
    msg = _received(
        body="text",
        message_id="m",
        subject="l",
        time_to_live=30.0,
        content_type="text/plain",
        delivery_count=2,
        application_properties={
            "s": "v",
            "n": 1,
            "b": True,
            "when": datetime(2026, 1, 2, tzinfo=timezone.utc),
            "raw": b"\x00\x01",
            "bad name": "skipped",
            "Location": "cannot override",
            "Transfer-Encoding": "chunked",
            "x-ms-thing": "reserved",
            "line": "a\r\nInjected: yes",
        },
        dead_letter_reason="r",
    )
    headers = received_headers(msg)
    props = json.loads(headers["BrokerProperties"])
    assert props["SequenceNumber"] == 5
    assert props["DeliveryCount"] == 3
    assert props["LockToken"] == "tok"
    assert props["MessageId"] == "m" and props["Label"] == "l" and props["TimeToLive"] == 30
    assert props["EnqueuedTimeUtc"] == "Tue, 14 Nov 2023 22:13:20 GMT"
    assert props["State"] == "Active"
    assert headers["Content-Type"] == "text/plain"
    assert headers["s"] == '"v"' and headers["n"] == "1" and headers["b"] == "true"
    assert headers["when"] == '"Fri, 02 Jan 2026 00:00:00 GMT"'
    assert headers["raw"] == '"AAE="'
    assert headers["line"] == '"a\\r\\nInjected: yes"'
    assert "bad name" not in headers and "Location" not in headers
    assert "Transfer-Encoding" not in headers and "x-ms-thing" not in headers
    assert headers["DeadLetterReason"] == '"r"'
    assert received_body(msg) == b"text"
    assert received_body(_received(body={"a": 1})) == b'{"a": 1}'
    assert received_body(_received(body=b"\xff")) == b"\xff"
    assert received_headers(_received(body=b""))["Content-Type"] == "application/octet-stream"
    odd = _received(body=b"", content_type="text/plain\r\nX-Injected: 1")
    assert received_headers(odd)["Content-Type"] == "application/octet-stream"


# ------------------------------------------------------------------ tokens and clients


def test_authorization_header_parsing() -> None:
    assert credential_from_header(None) is None
    assert credential_from_header("  ") is None
    good = generate_sas_token("sb://raybus/q", "rule", "a2V5", ttl=60)
    assert credential_from_header(f"  {good} ") == good
    for bad in (
        "Basic abc",
        "SharedAccessSignature sr=a&sig=b&skn=c",
        "SharedAccessSignature sr=a&sig=b&se=x&skn=c",
        generate_sas_token("sb://raybus/q", "rule", "a2V5", expiry=int(time.time()) - 1),
        "SharedAccessSignature " + "x" * 5000,
    ):
        with pytest.raises(ServiceBusAuthenticationError):
            credential_from_header(bad)


async def test_client_cache_is_per_token_and_bounded() -> None:
    made: list[object] = []

    def factory(cred: SasTokenCredential | None) -> object:
        made.append(cred)
        return object()

    cache: ClientCache[object] = ClientCache(factory, capacity=2)
    tokens = [generate_sas_token("sb://raybus/", "r", "a2V5", ttl=60 + i) for i in range(3)]
    anonymous = await cache.get(None)
    assert made == [None]
    first = await cache.get(tokens[0])
    assert isinstance(made[-1], SasTokenCredential) and made[-1].token == tokens[0]
    # A second request with the same token reuses the client.
    assert await cache.get(tokens[0]) is first and len(made) == 2
    await cache.get(tokens[1])  # evicts the least recently used: the anonymous client
    assert len(cache) == 2
    assert await cache.get(tokens[0]) is first
    assert await cache.get(None) is not anonymous


async def test_client_cache_creates_off_the_event_loop_once_for_concurrent_requests() -> None:
    loop_thread = threading.get_ident()
    release = threading.Event()
    made: list[int] = []

    def factory(cred: SasTokenCredential | None) -> object:
        made.append(threading.get_ident())
        release.wait(10)  # a slow, blocking namespace-actor lookup
        return object()

    cache: ClientCache[object] = ClientCache(factory, capacity=4)
    token = generate_sas_token("sb://raybus/", "r", "a2V5", ttl=60)
    first = asyncio.ensure_future(cache.get(token))
    second = asyncio.ensure_future(cache.get(token))
    # The loop keeps running while the factory blocks: these sleeps return. (Polled: the
    # factory's thread may take a while to start on a busy machine.)
    for _ in range(200):
        await asyncio.sleep(0.01)
        if made:
            break
    await asyncio.sleep(0.05)  # time for a second factory call, if there were one
    assert not first.done() and len(made) == 1
    release.set()
    a, b = await asyncio.gather(first, second)
    assert a is b and len(made) == 1 and made[0] != loop_thread
    assert await cache.get(token) is a and len(made) == 1


async def test_client_cache_does_not_keep_a_failed_creation() -> None:
    calls = 0

    def factory(cred: SasTokenCredential | None) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ServiceBusConnectionError("Ray is unreachable")
        return object()

    cache: ClientCache[object] = ClientCache(factory, capacity=1)
    with pytest.raises(ServiceBusConnectionError):
        await cache.get(None)
    assert len(cache) == 0
    client = await cache.get(None)
    assert calls == 2 and await cache.get(None) is client


# ------------------------------------------------------------------ status codes


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ServiceBusAuthenticationError("no token"), 401),
        (ServiceBusAuthorizationError("no Send right"), 401),
        (MessagingEntityNotFoundError("gone", "q"), 410),
        (MessageNotFoundError("no such message", "q", [1]), 404),
        (MessageLockLostError("lock lost", "q", "t", 1), 404),
        (SettlementFailedError("refused", "q", [(1, "t", "lock lost")]), 404),
        (MessageSizeExceededError("too big", "q", 10, 5), 403),
        (ServiceBusQuotaExceededError("full", "q"), 403),
        (InvalidArgumentError("bad", "q", "x"), 400),
        (ServiceBusServerBusyError("busy"), 503),
        (ServiceBusConnectionError("down"), 503),
        (OperationTimeoutError("slow"), 503),
    ],
)
def test_raybus_errors_map_to_service_bus_status_codes(error: Exception, status: int) -> None:
    assert status_of(error) == status


def test_error_body_is_service_bus_xml_with_the_reason_escaped() -> None:
    status, headers, body = error_response(503, "<busy> & slow")
    assert status == 503 and headers["Retry-After"] == "2"
    assert body == b"<Error><Code>503</Code><Detail>&lt;busy&gt; &amp; slow</Detail></Error>"


def test_gateway_settings_are_validated() -> None:
    assert GatewaySettings().deployment_options()["ray_actor_options"] == {"num_cpus": 0.0}
    for bad in (
        {"max_request_bytes": 10},
        {"min_replicas": 3, "max_replicas": 2},
        {"max_receive_timeout_s": 0},
        {"target_ongoing_requests": 10, "max_ongoing_requests": 5},
    ):
        with pytest.raises(ValueError):
            GatewaySettings(**bad)  # type: ignore[arg-type]
