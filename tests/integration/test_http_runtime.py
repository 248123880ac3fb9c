"""The HTTP gateway's runtime API (Service Bus REST) against a real Serve application.

One gateway per module (Serve starts a controller and a proxy: seconds), on a free loopback
port, serving the module's namespace; each test uses its own queue, except the tests of refused
requests, which share one (``refusals``). Serve is shut down after.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from net import free_port

import raybus.http
from raybus import ServiceBusMessage
from raybus.auth import SharedAccessKeyCredential, generate_sas_token
from raybus.management import CorrelationRuleFilter, ServiceBusAdministrationClient

BATCH = "application/vnd.microsoft.servicebus.json"


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    return module_namespace


@pytest.fixture(scope="module")
def gateway(module_namespace: str) -> Iterator[str]:
    from ray import serve

    url = raybus.http.start_http_gateway(
        module_namespace, port=free_port(), max_receive_timeout_s=5.0, max_replicas=2
    )
    try:
        yield url
    finally:
        raybus.http.stop_http_gateway(module_namespace)
        serve.shutdown()


@pytest.fixture
def http(gateway: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway, timeout=30) as c:
        yield c


@pytest.fixture
def queue(pooled_queue: str) -> str:
    return pooled_queue  # a fresh queue started ahead of time (``QueuePool`` in conftest)


@pytest.fixture(scope="module")
def refusals(module_namespace: str) -> str:
    """One queue for the module's tests of refused requests (22 of them, each a partition
    actor to start with a fresh queue): a refusal stores nothing, and those that could store
    something check that it did not, so each finds the queue as empty as a fresh one."""
    name = f"refusals-{uuid.uuid4().hex[:8]}"
    ServiceBusAdministrationClient(module_namespace).create_queue(name)
    return name


def _props(resp: httpx.Response) -> dict[str, object]:
    value: dict[str, object] = json.loads(resp.headers["BrokerProperties"])
    return value


def _error_detail(resp: httpx.Response) -> str:
    assert resp.headers["content-type"].startswith("application/xml")
    assert f"<Code>{resp.status_code}</Code>" in resp.text
    return resp.text


# ------------------------------------------------------------------ send and receive


def test_send_then_peek_lock_round_trips_body_broker_and_custom_properties(
    http: httpx.Client, queue: str
) -> None:
    sent = http.post(
        f"/{queue}/messages",
        content=b"hello over http",
        headers={
            "Content-Type": "text/plain",
            "BrokerProperties": json.dumps(
                {
                    "MessageId": "m-1",
                    "CorrelationId": "c-1",
                    "Label": "greeting",
                    "SessionId": None,
                    "ReplyTo": "replies",
                    "To": "someone",
                    "TimeToLive": 3600,
                    "UnknownProperty": "ignored",
                }
            ),
            "Priority": '"High"',
            "Amount": "42",
            "Flag": "true",
            "Plain": "just text",
        },
    )
    assert sent.status_code == 201, sent.text
    got = http.post(f"/{queue}/messages/head", params={"timeout": 5})
    assert got.status_code == 201, got.text
    assert got.content == b"hello over http"
    assert got.headers["content-type"].startswith("text/plain")
    props = _props(got)
    assert props["MessageId"] == "m-1"
    assert props["CorrelationId"] == "c-1"
    assert props["Label"] == "greeting"
    assert props["ReplyTo"] == "replies"
    assert props["To"] == "someone"
    assert props["TimeToLive"] == 3600
    assert props["DeliveryCount"] == 1
    assert props["State"] == "Active"
    assert isinstance(props["SequenceNumber"], int)
    assert isinstance(props["LockToken"], str)
    assert "GMT" in str(props["LockedUntilUtc"])
    assert "UnknownProperty" not in props
    assert got.headers["priority"] == '"High"'
    assert got.headers["amount"] == "42"
    assert got.headers["flag"] == "true"
    assert got.headers["plain"] == '"just text"'
    location = got.headers["Location"]
    assert location.endswith(f"/{queue}/messages/{props['SequenceNumber']}/{props['LockToken']}")
    done = http.delete(location)
    assert done.status_code == 200, done.text
    assert http.post(f"/{queue}/messages/head", params={"timeout": 0}).status_code == 204


def test_custom_properties_reach_a_python_receiver_typed(
    http: httpx.Client, client: object, queue: str
) -> None:
    assert (
        http.post(f"/{queue}/messages", content=b"x", headers={"Amount": "250", "Tier": "vip"})
    ).status_code == 201
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:  # type: ignore[attr-defined]
        (msg,) = receiver.receive_messages(1)
        assert msg.body == b"x"
        assert msg.application_properties["amount"] == 250
        assert msg.application_properties["tier"] == "vip"
        assert "user-agent" not in msg.application_properties
        assert "host" not in msg.application_properties
        receiver.complete_message(msg)


def test_python_sent_message_is_received_over_http_with_its_properties(
    http: httpx.Client, client: object, queue: str
) -> None:
    with client.get_queue_sender(queue) as sender:  # type: ignore[attr-defined]
        sender.send_messages(
            ServiceBusMessage(
                "text body",
                subject="s",
                session_id=None,
                application_properties={"n": 7, "when": datetime(2026, 1, 2, tzinfo=timezone.utc)},
            )
        )
        sender.send_messages(ServiceBusMessage({"a": [1, 2]}))
    first = http.delete(f"/{queue}/messages/head", params={"timeout": 5})
    assert first.status_code == 200
    assert first.content == b"text body"
    assert first.headers["n"] == "7"
    assert first.headers["when"] == '"Fri, 02 Jan 2026 00:00:00 GMT"'
    assert "LockToken" not in _props(first)
    second = http.delete(f"/{queue}/messages/head", params={"timeout": 5})
    assert json.loads(second.content) == {"a": [1, 2]}


def test_json_batch_sends_every_message_with_its_properties(http: httpx.Client, queue: str) -> None:
    batch = [
        {"Body": "one", "BrokerProperties": {"MessageId": "b-1", "Label": "L"}},
        {"Body": "two", "UserProperties": {"Color": "red", "Size": 3}},
        {"Body": "three"},
    ]
    sent = http.post(
        f"/{queue}/messages", content=json.dumps(batch), headers={"Content-Type": BATCH}
    )
    assert sent.status_code == 201, sent.text
    bodies, props = [], []
    for _ in range(3):
        resp = http.delete(f"/{queue}/messages/head", params={"timeout": 5})
        assert resp.status_code == 200
        bodies.append(resp.content)
        props.append((_props(resp), resp.headers))
    assert bodies == [b"one", b"two", b"three"]
    assert props[0][0]["MessageId"] == "b-1"
    assert props[0][0]["Label"] == "L"
    assert props[1][1]["Color"] == '"red"'
    assert props[1][1]["Size"] == "3"


def test_receive_and_delete_on_an_empty_queue_waits_for_the_timeout_then_204(
    http: httpx.Client, queue: str
) -> None:
    started = time.monotonic()
    resp = http.delete(f"/{queue}/messages/head", params={"timeout": 1})
    assert resp.status_code == 204
    assert time.monotonic() - started >= 0.9


def test_long_poll_returns_a_message_sent_while_it_waits(
    http: httpx.Client, gateway: str, queue: str
) -> None:
    import threading

    result: dict[str, httpx.Response] = {}

    def poll() -> None:
        with httpx.Client(base_url=gateway, timeout=30) as c:
            result["r"] = c.delete(f"/{queue}/messages/head", params={"timeout": 5})

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.5)
    assert http.post(f"/{queue}/messages", content=b"late").status_code == 201
    t.join(30)
    assert result["r"].status_code == 200
    assert result["r"].content == b"late"


def test_waiting_receives_do_not_block_other_requests(
    gateway: str, queue: str, admin: ServiceBusAdministrationClient
) -> None:
    """Thirty long polls wait on an empty queue while a send and a receive on another queue
    are served: the handlers await the broker instead of holding a thread each."""
    import asyncio

    other = f"h-{uuid.uuid4().hex[:8]}"
    admin.create_queue(other)

    async def run() -> tuple[list[int], float, float]:
        async with httpx.AsyncClient(base_url=gateway, timeout=60) as c:

            async def poll() -> tuple[int, float]:
                r = await c.delete(f"/{queue}/messages/head", params={"timeout": 5})
                return r.status_code, time.monotonic()

            polls = [asyncio.ensure_future(poll()) for _ in range(30)]
            await asyncio.sleep(0.5)
            assert (await c.post(f"/{other}/messages", content=b"through")).status_code == 201
            got = await c.delete(f"/{other}/messages/head", params={"timeout": 0})
            assert got.status_code == 200 and got.content == b"through"
            served_at = time.monotonic()
            results = await asyncio.gather(*polls)
            return [r[0] for r in results], served_at, min(r[1] for r in results)

    try:
        statuses, served_at, first_poll_done = asyncio.run(run())
    finally:
        admin.delete_queue(other)
    assert statuses == [204] * 30
    assert served_at < first_poll_done


def test_timeout_above_the_cap_is_capped(http: httpx.Client, queue: str) -> None:
    started = time.monotonic()
    resp = http.post(f"/{queue}/messages/head", params={"timeout": 3600})
    assert resp.status_code == 204
    assert time.monotonic() - started < 25  # the module's cap is 5 s


def test_scheduled_message_arrives_at_its_time(http: httpx.Client, queue: str) -> None:
    """Not before its time, and then at once.

    The header has whole seconds, so the message is due at the stamp, not at ``now + 2 s``. A
    receive that ends before that must find nothing; one that the machine's load delays past it
    may find the message, and that is no fault of the broker's.
    """
    stamp = (datetime.now(timezone.utc) + timedelta(seconds=2)).strftime(
        "%a, %d %b %Y %H:%M:%S GMT"
    )
    due = datetime.strptime(stamp, "%a, %d %b %Y %H:%M:%S GMT").replace(tzinfo=timezone.utc)
    broker = json.dumps({"ScheduledEnqueueTimeUtc": stamp})
    sent = http.post(f"/{queue}/messages", content=b"later", headers={"BrokerProperties": broker})
    assert sent.status_code == 201
    early = http.delete(f"/{queue}/messages/head", params={"timeout": 0})
    assert early.status_code in (200, 204), early.text
    if datetime.now(timezone.utc) < due:
        assert early.status_code == 204, "delivered before its scheduled time"
    got = early if early.status_code == 200 else None
    if got is None:
        got = http.delete(f"/{queue}/messages/head", params={"timeout": 10})
        assert datetime.now(timezone.utc) >= due
    assert got.status_code == 200 and got.content == b"later"
    assert _props(got)["ScheduledEnqueueTimeUtc"] == stamp


def test_duplicate_message_ids_are_accepted_once(
    http: httpx.Client, admin: ServiceBusAdministrationClient
) -> None:
    name = f"h-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, requires_duplicate_detection=True)
    try:
        broker = {"BrokerProperties": '{"MessageId": "same"}'}
        for _ in range(2):
            assert http.post(f"/{name}/messages", content=b"d", headers=broker).status_code == 201
        assert admin.get_queue_runtime_properties(name).active_message_count == 1
    finally:
        admin.delete_queue(name)


def test_session_queue_takes_sends_but_receives_need_a_session_client(
    http: httpx.Client, admin: ServiceBusAdministrationClient
) -> None:
    """The REST API has no session receive; the broker's refusal comes back as a 400."""
    name = f"h-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, requires_session=True)
    try:
        broker = {"BrokerProperties": '{"SessionId": "s1"}'}
        assert http.post(f"/{name}/messages", content=b"s", headers=broker).status_code == 201
        resp = http.post(f"/{name}/messages/head", params={"timeout": 0})
        assert resp.status_code == 400, resp.text
        assert "session" in _error_detail(resp).lower()
        assert admin.get_queue_runtime_properties(name).active_message_count == 1
    finally:
        admin.delete_queue(name)


# ------------------------------------------------------------------ settlement


def _lock(http: httpx.Client, queue: str, body: bytes = b"m") -> httpx.Response:
    assert http.post(f"/{queue}/messages", content=body).status_code == 201
    resp = http.post(f"/{queue}/messages/head", params={"timeout": 5})
    assert resp.status_code == 201, resp.text
    return resp


def test_unlock_makes_the_message_available_again_with_a_higher_delivery_count(
    http: httpx.Client, queue: str
) -> None:
    first = _lock(http, queue)
    assert http.put(first.headers["Location"]).status_code == 200
    again = http.post(f"/{queue}/messages/head", params={"timeout": 5})
    assert again.status_code == 201
    assert _props(again)["SequenceNumber"] == _props(first)["SequenceNumber"]
    assert _props(again)["DeliveryCount"] == 2
    # The first lock is gone: settling with it is refused and changes nothing.
    assert http.delete(first.headers["Location"]).status_code == 404
    assert http.delete(again.headers["Location"]).status_code == 200


def test_renew_extends_the_lock(http: httpx.Client, admin: ServiceBusAdministrationClient) -> None:
    name = f"h-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, lock_duration=timedelta(seconds=3))
    try:
        resp = _lock(http, name)
        before = _props(resp)["LockedUntilUtc"]
        time.sleep(1.6)
        renewed = http.post(resp.headers["Location"])
        assert renewed.status_code == 200, renewed.text
        after = _props(renewed)["LockedUntilUtc"]
        from email.utils import parsedate_to_datetime

        assert parsedate_to_datetime(str(after)) > parsedate_to_datetime(str(before))
        time.sleep(1.6)  # past the first lock's end, 1.4 s within the renewed one
        assert http.delete(resp.headers["Location"]).status_code == 200
    finally:
        admin.delete_queue(name)


def test_complete_after_lock_expiry_is_404_and_the_message_comes_again(
    http: httpx.Client, admin: ServiceBusAdministrationClient
) -> None:
    name = f"h-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, lock_duration=timedelta(milliseconds=300))
    try:
        resp = _lock(http, name)
        time.sleep(0.6)
        lost = http.delete(resp.headers["Location"])
        assert lost.status_code == 404  # Service Bus: no message with that lock token
        assert "MessageLockLost" in _error_detail(lost)
        again = http.post(f"/{name}/messages/head", params={"timeout": 5})
        assert again.status_code == 201
        assert _props(again)["DeliveryCount"] == 2
    finally:
        admin.delete_queue(name)


def test_unknown_lock_token_is_404_for_every_settlement(http: httpx.Client, queue: str) -> None:
    bogus = f"/{queue}/messages/1/{uuid.uuid4()}"
    assert http.delete(bogus).status_code == 404
    assert http.put(bogus).status_code == 404
    assert http.post(bogus).status_code == 404


def test_malformed_lock_token_is_400_and_the_message_stays_locked(
    http: httpx.Client, queue: str
) -> None:
    resp = _lock(http, queue)
    seq = _props(resp)["SequenceNumber"]
    for method in ("DELETE", "PUT", "POST"):
        bad = http.request(method, f"/{queue}/messages/{seq}/not-a-lock-token")
        assert bad.status_code == 400 and "lock_token" in bad.text
    assert http.post(f"/{queue}/messages/head", params={"timeout": 0}).status_code == 204
    assert http.delete(resp.headers["Location"]).status_code == 200


def test_message_id_in_place_of_the_sequence_number_needs_a_single_partition(
    http: httpx.Client, admin: ServiceBusAdministrationClient
) -> None:
    name = f"parts-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, partition_count=2)
    try:
        resp = _lock(http, name)
        token = _props(resp)["LockToken"]
        by_id = http.delete(f"/{name}/messages/some-message-id/{token}")
        assert by_id.status_code == 400 and "sequence_number" in by_id.text
        assert http.delete(resp.headers["Location"]).status_code == 200  # still locked
        assert admin.get_queue_runtime_properties(name).active_message_count == 0
    finally:
        admin.delete_queue(name)


# ------------------------------------------------------------------ topics and sub-queues


def test_topic_send_and_subscription_receive_and_settle(
    http: httpx.Client, admin: ServiceBusAdministrationClient
) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin.create_topic(topic)
    admin.create_subscription(topic, "all")
    admin.create_subscription(topic, "red")
    admin.delete_rule(topic, "red", "$Default")
    admin.create_rule(
        topic, "red", "red", filter=CorrelationRuleFilter(properties={"color": "red"})
    )
    try:
        assert (
            http.post(f"/{topic}/messages", content=b"blue", headers={"Color": "blue"}).status_code
            == 201
        )
        assert (
            http.post(f"/{topic}/messages", content=b"red", headers={"Color": "red"}).status_code
            == 201
        )
        red = http.post(f"/{topic}/subscriptions/red/messages/head", params={"timeout": 5})
        assert red.status_code == 201
        assert red.content == b"red"
        assert "/subscriptions/red/messages/" in red.headers["Location"]
        assert http.delete(red.headers["Location"]).status_code == 200
        assert (
            http.post(
                f"/{topic}/subscriptions/red/messages/head", params={"timeout": 0}
            ).status_code
            == 204
        )
        seen = [
            http.delete(f"/{topic}/subscriptions/all/messages/head", params={"timeout": 5}).content
            for _ in range(2)
        ]
        assert sorted(seen) == [b"blue", b"red"]
        # A topic itself cannot be received from.
        assert http.post(f"/{topic}/messages/head", params={"timeout": 0}).status_code == 400
    finally:
        admin.delete_topic(topic)


def test_dead_letter_queue_is_reachable(http: httpx.Client, client: object, queue: str) -> None:
    assert http.post(f"/{queue}/messages", content=b"poison").status_code == 201
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:  # type: ignore[attr-defined]
        (msg,) = receiver.receive_messages(1)
        receiver.dead_letter_message(msg, reason="bad", error_description="cannot parse")
    resp = http.post(f"/{queue}/$DeadLetterQueue/messages/head", params={"timeout": 5})
    assert resp.status_code == 201, resp.text
    assert resp.content == b"poison"
    assert resp.headers["DeadLetterReason"] == '"bad"'
    assert resp.headers["DeadLetterErrorDescription"] == '"cannot parse"'
    assert "/$DeadLetterQueue/messages/" in resp.headers["Location"]
    assert http.delete(resp.headers["Location"]).status_code == 200


def test_the_transfer_dead_letter_queue_is_reachable_and_empty(
    http: httpx.Client, client: object, queue: str
) -> None:
    assert http.post(f"/{queue}/messages", content=b"stays").status_code == 201
    tdlq = f"/{queue}/$Transfer/$DeadLetterQueue/messages"
    assert http.post(f"{tdlq}/head", params={"timeout": 1}).status_code == 204
    assert http.delete(f"{tdlq}/head", params={"timeout": 1}).status_code == 204
    # Nothing of the queue's own goes through it: its message is still there, unlocked.
    resp = http.post(f"/{queue}/messages/head", params={"timeout": 5})
    assert resp.status_code == 201 and resp.content == b"stays"
    seq_token = resp.headers["Location"].split("/messages/")[1]
    assert http.delete(f"{tdlq}/{seq_token}").status_code == 404  # not its lock
    assert http.delete(resp.headers["Location"]).status_code == 200


# ------------------------------------------------------------------ errors


def test_missing_entity_is_410(http: httpx.Client) -> None:
    """Service Bus's runtime REST API: 410, the specified queue or topic does not exist."""
    missing = f"nope-{uuid.uuid4().hex[:6]}"
    assert http.post(f"/{missing}/messages", content=b"x").status_code == 410
    assert http.post(f"/{missing}/messages/head", params={"timeout": 0}).status_code == 410
    assert http.delete(f"/{missing}/messages/1/{uuid.uuid4()}").status_code == 410
    gone = http.post(f"/{missing}/subscriptions/s/messages/head", params={"timeout": 0})
    assert gone.status_code == 410


def test_oversize_message_is_403_and_nothing_is_stored(
    http: httpx.Client, queue: str, admin: ServiceBusAdministrationClient
) -> None:
    too_big = b"x" * (300 * 1024)  # over the queue's 256 KiB, under the gateway's 1 MiB
    resp = http.post(f"/{queue}/messages", content=too_big)
    assert resp.status_code == 403  # Service Bus: quota exceeded or message too large
    assert "MessageSizeExceeded" in _error_detail(resp)
    huge = b"x" * (2 * 1024 * 1024)  # over the gateway's own request limit: HTTP's 413
    assert http.post(f"/{queue}/messages", content=huge).status_code == 413
    assert admin.get_queue_runtime_properties(queue).active_message_count == 0


@pytest.mark.parametrize(
    ("headers", "content", "why"),
    [
        ({"BrokerProperties": "{not json"}, b"x", "not valid JSON"),
        ({"BrokerProperties": "[1, 2]"}, b"x", "must be a JSON object"),
        ({"BrokerProperties": '{"MessageId": 5}'}, b"x", "MessageId must be a string"),
        ({"BrokerProperties": '{"TimeToLive": -1}'}, b"x", "TimeToLive"),
        ({"BrokerProperties": '{"TimeToLive": "soon"}'}, b"x", "TimeToLive"),
        ({"BrokerProperties": '{"ScheduledEnqueueTimeUtc": "yesterday"}'}, b"x", "not an RFC"),
        ({"BrokerProperties": '{"MessageId": "' + "m" * 200 + '"}'}, b"x", "message_id"),
        ({"Content-Type": BATCH}, b"{broken", "not valid JSON"),
        ({"Content-Type": BATCH}, b"[]", "non-empty JSON array"),
        ({"Content-Type": BATCH}, b'[{"Body": 5}]', "Body must be a string"),
        ({"Content-Type": BATCH}, b'["x"]', "must be a JSON object"),
        (
            {"Content-Type": BATCH},
            b'[{"Body": "x", "UserProperties": {"a": [1]}}]',
            "UserProperties",
        ),
        ({"Content-Type": BATCH}, b"[" * 100_000, "not valid JSON"),
    ],
)
def test_malformed_input_is_400_with_a_reason_and_stores_nothing(
    http: httpx.Client,
    refusals: str,
    admin: ServiceBusAdministrationClient,
    headers: dict[str, str],
    content: bytes,
    why: str,
) -> None:
    resp = http.post(f"/{refusals}/messages", content=content, headers=headers)
    assert resp.status_code == 400, resp.text
    assert why in _error_detail(resp)
    assert admin.get_queue_runtime_properties(refusals).active_message_count == 0


@pytest.mark.parametrize("timeout", ["abc", "-1", "nan", "inf"])
def test_bad_timeout_is_400(http: httpx.Client, refusals: str, timeout: str) -> None:
    assert http.post(f"/{refusals}/messages/head", params={"timeout": timeout}).status_code == 400


def test_wrong_methods_and_paths_are_refused(http: httpx.Client, queue: str) -> None:
    assert http.get(f"/{queue}/messages").status_code == 405
    assert http.put(f"/{queue}/messages/head").status_code == 405
    assert http.get(f"/{queue}/messages/1/abc").status_code == 405
    assert http.post(f"/{queue}/subscriptions/s/messages", content=b"x").status_code == 400
    assert http.post("/messages", content=b"x").status_code in (400, 404, 501)


def _raw_status(gateway: str, request: bytes) -> int:
    """The status code the gateway answers to raw bytes (for requests httpx will not send)."""
    host, port = gateway.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        status_line = s.makefile("rb").readline()
    return int(status_line.split()[1])


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: abc\r\n",
        b"Content-Length: 5\r\nContent-Length: 7\r\n",
        b"BrokerProperties {no colon}\r\n",
        b"Bad Header Name: x\r\n",
    ],
)
def test_malformed_http_is_refused_with_400(
    gateway: str, refusals: str, admin: ServiceBusAdministrationClient, head: bytes
) -> None:
    request = (
        f"POST /{refusals}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
        + head
        + b"Connection: close\r\n\r\nhello"
    )
    assert _raw_status(gateway, request) == 400
    assert admin.get_queue_runtime_properties(refusals).active_message_count == 0


# ------------------------------------------------------------------ access control


def test_malformed_or_expired_authorization_is_401(http: httpx.Client, queue: str) -> None:
    for header in (
        "Bearer abc",
        "SharedAccessSignature sr=x",
        "SharedAccessSignature sr=x&sig=y&se=soon&skn=k",
        generate_sas_token("sb://raybus/", "rule", "a2V5", expiry=int(time.time()) - 10),
        "SharedAccessSignature " + "a" * 5000,
    ):
        resp = http.post(f"/{queue}/messages", content=b"x", headers={"Authorization": header})
        assert resp.status_code == 401, (header[:40], resp.text)
    assert http.post(f"/{queue}/messages/head", params={"timeout": 0}).status_code == 204


def test_open_namespace_accepts_requests_without_a_token(http: httpx.Client, queue: str) -> None:
    assert http.post(f"/{queue}/messages", content=b"open").status_code == 201
    assert http.delete(f"/{queue}/messages/head", params={"timeout": 5}).content == b"open"


# A namespace with access rules, served by a second gateway application on the same Serve
# proxy (at /closed): the module's own namespace stays open for the other tests.

ROOT_KEY = "R" * 44


@dataclass(frozen=True)
class Closed:
    url: str
    root: ServiceBusAdministrationClient
    send_key: str
    listen_key: str

    def token(self, rule: str, key: str, entity: str = "q") -> str:
        return generate_sas_token(f"sb://raybus/{entity}", rule, key, ttl=600)

    def send(self, entity: str = "q") -> dict[str, str]:
        return {"Authorization": self.token("send", self.send_key, entity)}

    def listen(self, entity: str = "q") -> dict[str, str]:
        return {"Authorization": self.token("listen", self.listen_key, entity)}


@pytest.fixture(scope="module")
def closed(gateway: str) -> Iterator[Closed]:
    import ray

    from raybus._actors.namespace import namespace_actor_name

    ns = f"test-closed-{uuid.uuid4().hex[:8]}"
    open_admin = ServiceBusAdministrationClient(ns)
    open_admin.create_queue("q")
    open_admin.create_queue("other")
    open_admin.create_authorization_rule("root", ["Manage"], primary_key=ROOT_KEY)
    root = ServiceBusAdministrationClient(
        ns, credential=SharedAccessKeyCredential("root", ROOT_KEY)
    )
    send = root.create_authorization_rule("send", ["Send"])
    listen = root.create_authorization_rule("listen", ["Listen"])
    port = int(gateway.rsplit(":", 1)[1])
    url = raybus.http.start_http_gateway(ns, port=port, route_prefix="/closed")
    try:
        yield Closed(url, root, send.primary_key, listen.primary_key)
    finally:
        raybus.http.stop_http_gateway(ns, shutdown_serve=False)
        for q in ("q", "other"):
            root.delete_queue(q)
        ray.kill(ray.get_actor(namespace_actor_name(ns), namespace="raybus"), no_restart=True)


def test_closed_namespace_needs_a_token_and_a_bad_signature_is_401(closed: Closed) -> None:
    with httpx.Client(base_url=closed.url, timeout=30) as c:
        no_token = c.post("/q/messages", content=b"x")
        assert no_token.status_code == 401, no_token.text
        assert "ServiceBusAuthenticationError" in _error_detail(no_token)
        forged = {"Authorization": closed.token("send", "a2V5IHRoYXQgaXMgd3Jvbmc=")}
        assert c.post("/q/messages", content=b"x", headers=forged).status_code == 401
        unknown_rule = {"Authorization": closed.token("nobody", closed.send_key)}
        assert c.post("/q/messages", content=b"x", headers=unknown_rule).status_code == 401
    assert closed.root.get_queue_runtime_properties("q").active_message_count == 0


def test_rights_decide_what_a_token_may_do(closed: Closed) -> None:
    with httpx.Client(base_url=closed.url, timeout=30) as c:
        assert c.post("/q/messages", content=b"m", headers=closed.send()).status_code == 201
        refused = c.post("/q/messages/head", params={"timeout": 0}, headers=closed.send())
        assert refused.status_code == 401, refused.text  # as Service Bus: 401, not 403
        assert "ServiceBusAuthorizationError" in _error_detail(refused)
        assert c.post("/q/messages", content=b"m", headers=closed.listen()).status_code == 401
        got = c.post("/q/messages/head", params={"timeout": 5}, headers=closed.listen())
        assert got.status_code == 201, got.text
        assert got.content == b"m"
        assert got.headers["Location"].startswith(f"{closed.url}/q/messages/")
        # Settling needs Listen too.
        assert c.delete(got.headers["Location"], headers=closed.send()).status_code == 401
        assert c.delete(got.headers["Location"], headers=closed.listen()).status_code == 200
    assert closed.root.get_queue_runtime_properties("q").active_message_count == 0


def test_a_token_for_one_entity_does_not_reach_another(closed: Closed) -> None:
    with httpx.Client(base_url=closed.url, timeout=30) as c:
        wrong = c.post("/other/messages", content=b"x", headers=closed.send("q"))
        assert wrong.status_code == 401, wrong.text
        right = c.post("/other/messages", content=b"x", headers=closed.send("other"))
        assert right.status_code == 201, right.text
        taken = c.delete(
            "/other/messages/head", params={"timeout": 5}, headers=closed.listen("other")
        )
        assert taken.content == b"x"


# ------------------------------------------------------------------ the curl example


def test_curl_example_runs_against_the_gateway(
    gateway: str, queue: str, admin: ServiceBusAdministrationClient
) -> None:
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "http_curl.sh"
    proc = subprocess.run(
        ["bash", str(script), gateway, queue], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.count("status 201") == 4  # single send, two peek-locks, batch send
    assert "renew status 200" in out and "unlock status 200" in out
    assert '"DeliveryCount":2' in out
    assert "Amount: 250" in out and 'Priority: "high"' in out
    assert "received: order 2" in out and "received: order 3" in out
    assert out.rstrip().endswith("status 204")
    assert admin.get_queue_runtime_properties(queue).active_message_count == 0


# ------------------------------------------------------------------ TLS (last: restarts Serve)


@pytest.mark.slow
def test_tls_gateway_serves_https_with_the_self_signed_certificate(
    gateway: str,
    namespace: str,
    queue: str,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Serve's HTTP options are per cluster, so this replaces the module's plain gateway
    (it runs last in the module)."""
    from ray import serve

    tls_dir = tmp_path_factory.mktemp("tls")
    monkeypatch.setenv("RAYBUS_TLS_DIR", str(tls_dir))
    raybus.http.stop_http_gateway(namespace, shutdown_serve=True)
    try:
        url = raybus.http.start_http_gateway(namespace, port=free_port(), tls=True)
        assert url.startswith("https://127.0.0.1:")
        certfile = str(tls_dir / "raybus-gateway.crt")
        with httpx.Client(base_url=url, verify=certfile, timeout=30) as c:
            assert c.post(f"/{queue}/messages", content=b"secret").status_code == 201
            got = c.delete(f"/{queue}/messages/head", params={"timeout": 5})
            assert got.status_code == 200 and got.content == b"secret"
        with pytest.raises(httpx.ConnectError):  # not trusted without the certificate
            httpx.get(f"{url}/{queue}/messages/head")
    finally:
        raybus.http.stop_http_gateway(namespace, shutdown_serve=True)
        serve.shutdown()


@pytest.mark.slow
def test_cli_http_serves_until_sigterm(ray_cluster: str, namespace: str, queue: str) -> None:
    """``raybus http`` in its own process (after the TLS test, which shut Serve down: Serve's
    port is per cluster)."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    from ray import serve

    serve.shutdown()  # whatever an earlier test left: the CLI starts Serve on its own port
    port = free_port()
    env = dict(os.environ, RAY_ADDRESS=ray_cluster)
    proc = subprocess.Popen(
        [sys.executable, "-m", "raybus.cli", "--namespace", namespace, "http", "--port", str(port)],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "Ctrl-C to stop" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(180), "".join(lines)
        assert any(f"http://127.0.0.1:{port}" in line for line in lines), "".join(lines)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            assert c.post(f"/{queue}/messages", content=b"cli").status_code == 201
            assert c.delete(f"/{queue}/messages/head", params={"timeout": 5}).content == b"cli"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, "".join(lines)
        reader.join(10)
        assert any("stopped" in line for line in lines)
        with pytest.raises(httpx.ConnectError):  # Serve's proxy is gone with the gateway
            httpx.get(f"http://127.0.0.1:{port}/{queue}/messages/head", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.mark.slow
def test_replicas_scale_up_with_requests_in_flight(gateway: str, admin: object) -> None:
    """A second app on the same proxy, told to scale at 2 requests in flight per replica after
    1 s: 10 waiting receives make Serve add replicas; they all still get their messages."""
    from ray import serve

    ns = f"test-scale-{uuid.uuid4().hex[:8]}"
    ServiceBusAdministrationClient(ns).create_queue("q")
    port = int(gateway.rsplit(":", 1)[1])
    url = raybus.http.start_http_gateway(
        ns,
        port=port,
        route_prefix="/scale",
        max_replicas=3,
        target_ongoing_requests=2,
        upscale_delay_s=1.0,
        max_receive_timeout_s=30.0,
    )

    def running() -> int:
        app = serve.status().applications[raybus.http.app_name(ns)]
        return sum(d.replica_states.get("RUNNING", 0) for d in app.deployments.values())

    try:
        assert running() == 1
        with ThreadPoolExecutor(10) as pool, httpx.Client(base_url=url, timeout=60) as c:
            polls = [
                pool.submit(c.delete, "/q/messages/head", params={"timeout": "30"})
                for _ in range(10)
            ]
            deadline = time.monotonic() + 45
            while running() < 2 and time.monotonic() < deadline:
                time.sleep(0.5)
            scaled = running()
            for i in range(10):
                assert c.post("/q/messages", content=f"m{i}".encode()).status_code == 201
            bodies = sorted(p.result().content for p in polls)
        assert scaled >= 2, "Serve did not add a replica with 10 requests waiting"
        assert bodies == sorted(f"m{i}".encode() for i in range(10))
    finally:
        raybus.http.stop_http_gateway(ns, shutdown_serve=False)
