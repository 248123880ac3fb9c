"""The gateway's message mapping (AMQP message <-> raybus message), link addresses and error
conditions, without Ray."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from raybus import exceptions as ex
from raybus._client_cache import ClientCache
from raybus._core.record import MessageRecord
from raybus.amqp._codec import (
    Array,
    DecodeError,
    Described,
    Symbol,
    Timestamp,
    UInt,
    ULong,
    decode_all,
    encode,
)
from raybus.amqp._connection import AmqpConnection
from raybus.amqp._errors import condition_of, status_of
from raybus.amqp._gateway import Gateway, parse_address
from raybus.amqp._locks import LockIndex
from raybus.amqp._message import (
    RAW_BODY_PROPERTY,
    encode_body,
    from_received,
    split_batch,
    to_raybus,
)
from raybus.auth import SasTokenCredential, generate_sas_token
from raybus.enums import ServiceBusSubQueue
from raybus.message import ServiceBusReceivedMessage


def _section(code: int, value: object) -> bytes:
    return encode(Described(ULong(code), value))


def _stored(payload: bytes) -> ServiceBusReceivedMessage:
    """What a receiver would get for ``payload`` (stored by raybus, then peeked)."""
    rec = to_raybus(payload)._to_record()
    rec.sequence_number, rec.enqueued_time, rec.lock_token = 5, 1_700_000_000.0, None
    return ServiceBusReceivedMessage(rec, entity="q", kind="peeked")


def _body_sections(payload: bytes) -> bytes:
    """The encoded body sections (data/sequence/value) of a message."""
    sections = decode_all(payload)
    body = [(s, e) for v, s, e in sections if v.descriptor in (0x75, 0x76, 0x77)]
    return payload[body[0][0] : body[-1][1]]


def test_properties_and_annotations_map_onto_raybus_fields() -> None:
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    payload = (
        _section(0x70, [True, None, UInt(60_000)])
        + _section(
            0x72,
            {
                Symbol("x-opt-partition-key"): "pk",
                Symbol("x-opt-scheduled-enqueue-time"): Timestamp(int(at.timestamp() * 1000)),
            },
        )
        + _section(
            0x73,
            [
                "mid",
                None,
                "to",
                "subj",
                "reply",
                "cid",
                Symbol("text/plain"),
                None,
                None,
                None,
                "pk",
                None,
                "rsid",
            ],
        )
        + _section(0x74, {"n": UInt(3), "when": Timestamp(0)})
        + _section(0x75, b"body")
    )
    msg = to_raybus(payload)
    assert (msg.message_id, msg.to, msg.subject, msg.reply_to, msg.correlation_id) == (
        "mid",
        "to",
        "subj",
        "reply",
        "cid",
    )
    assert msg.content_type == "text/plain" and msg.session_id == "pk"
    assert msg.reply_to_session_id == "rsid" and msg.partition_key == "pk"
    assert msg.time_to_live == timedelta(seconds=60)
    assert msg.scheduled_enqueue_time_utc == at
    assert msg.body == b"body"
    assert msg.application_properties == {"n": 3, "when": datetime(1970, 1, 1, tzinfo=timezone.utc)}
    assert type(msg.application_properties["n"]) is UInt  # re-encodes as the uint it was


@pytest.mark.parametrize(
    "body",
    [
        _section(0x75, b"one data section"),
        _section(0x77, {b"bin": [1, 2]}),
        _section(0x77, [1, None, 2.5]),
    ],
)
def test_bodies_with_a_native_form_need_no_raw_copy(body: bytes) -> None:
    msg = to_raybus(body)
    assert RAW_BODY_PROPERTY not in (msg.application_properties or {})
    assert _body_sections(from_received(_stored(body), locked=False)) == body


@pytest.mark.parametrize(
    "body",
    [
        _section(0x75, b"a") + _section(0x75, b"b"),
        _section(0x76, [1, "x"]),
        _section(0x77, "a string value"),  # natively a str, which raybus sends as data
        _section(0x77, Array(0xA3, (Symbol("s"),))),
        _section(0x77, Described(Symbol("custom"), 1)),
    ],
)
def test_other_bodies_come_back_byte_for_byte(body: bytes) -> None:
    msg = to_raybus(body)
    assert msg.application_properties[RAW_BODY_PROPERTY] == body
    out = from_received(_stored(body), locked=False)
    assert _body_sections(out) == body
    assert RAW_BODY_PROPERTY.encode() not in out  # the reserved property is not re-emitted


def test_native_bodies_encode_as_the_sdk_expects() -> None:
    assert encode_body(b"x") == _section(0x75, b"x")
    assert encode_body("x") == _section(0x75, b"x")
    assert encode_body([1]) == _section(0x77, [1])


def test_a_received_message_carries_the_broker_annotations() -> None:
    rec = MessageRecord(
        body=b"b",
        message_id="m",
        sequence_number=9,
        enqueued_time=100.0,
        locked_until=160.0,
        delivery_count=2,
        dead_letter_reason="why",
        dead_letter_source="q",
        lock_token="x",
    )
    received = ServiceBusReceivedMessage(rec, entity="q", kind="locked")
    sections = {
        int(v.descriptor): v.value for v, _s, _e in decode_all(from_received(received, locked=True))
    }
    ann = sections[0x72]
    assert ann[Symbol("x-opt-sequence-number")] == 9
    assert ann[Symbol("x-opt-enqueued-time")] == Timestamp(100_000)
    assert ann[Symbol("x-opt-locked-until")] == Timestamp(160_000)
    assert ann[Symbol("x-opt-deadletter-source")] == "q"
    assert sections[0x70][4] == UInt(2)
    assert sections[0x74] == {"DeadLetterReason": "why"}
    unlocked = {
        int(v.descriptor): v.value
        for v, _s, _e in decode_all(from_received(received, locked=False))
    }
    assert Symbol("x-opt-locked-until") not in unlocked[0x72]


@pytest.mark.parametrize(
    ("ttl_s", "header_ttl"),
    [(60.0, UInt(60_000)), (2**32 / 1000 - 0.001, UInt(2**32 - 1)), (60 * 86400.0, None)],
)
def test_a_ttl_past_the_headers_uint_is_left_out_and_the_expiry_stays_exact(
    ttl_s: float, header_ttl: UInt | None
) -> None:
    """The header's ttl holds up to 2**32 - 1 ms (49.7 days). Capped, a 60-day ttl made the
    SDK's expires_at_utc (enqueued time + ttl) 10 days early; left out, the SDK reads none,
    and absolute-expiry-time keeps the exact expiry."""
    rec = MessageRecord(
        body=b"b",
        sequence_number=1,
        enqueued_time=100.0,
        time_to_live=ttl_s,
        expires_at=100.0 + ttl_s,
    )
    received = ServiceBusReceivedMessage(rec, entity="q", kind="peeked")
    sections = {
        int(v.descriptor): v.value
        for v, _s, _e in decode_all(from_received(received, locked=False))
    }
    assert sections[0x70][2] == header_ttl
    assert sections[0x73][8] == Timestamp(round((100.0 + ttl_s) * 1000))


def test_a_batch_envelope_splits_into_its_messages() -> None:
    inner = [_section(0x75, b"1"), _section(0x75, b"2")]
    envelope = _section(0x73, ["mid"]) + b"".join(_section(0x75, m) for m in inner)
    assert split_batch(envelope) == inner
    with pytest.raises(DecodeError):
        split_batch(_section(0x77, "not data"))


def test_malformed_messages_raise_typed_errors() -> None:
    with pytest.raises(DecodeError):
        to_raybus(b"\x00\x53\x75\xa0\x09")
    with pytest.raises(DecodeError, match="not a described section"):
        to_raybus(encode("bare value"))
    with pytest.raises(ex.InvalidArgumentError):
        to_raybus(_section(0x74, {1: "int key"}) + _section(0x75, b""))


@pytest.mark.parametrize(
    ("address", "entity", "sub", "sub_queue", "mgmt"),
    [
        ("amqps://localhost:5672/orders", "orders", None, None, False),
        (
            "amqps://localhost/orders/$DeadLetterQueue",
            "orders",
            None,
            ServiceBusSubQueue.DEAD_LETTER,
            False,
        ),
        ("orders/$management", "orders", None, None, True),
        ("amqps://h/t/Subscriptions/s", "t/Subscriptions/s", "s", None, False),
        (
            "t/Subscriptions/s/$DeadLetterQueue/$management",
            "t/Subscriptions/s",
            "s",
            ServiceBusSubQueue.DEAD_LETTER,
            True,
        ),
        (
            "amqps://h/q/$Transfer/$DeadLetterQueue",
            "q",
            None,
            ServiceBusSubQueue.TRANSFER_DEAD_LETTER,
            False,
        ),
    ],
)
def test_link_addresses_parse(
    address: str, entity: str, sub: str | None, sub_queue: ServiceBusSubQueue | None, mgmt: bool
) -> None:
    parsed = parse_address(address)
    assert (parsed.entity, parsed.subscription, parsed.sub_queue, parsed.management) == (
        entity,
        sub,
        sub_queue,
        mgmt,
    )


@pytest.mark.parametrize("address", ["", "amqps://h/", "$cbs", "amqps://h/$management"])
def test_addresses_without_an_entity_are_refused(address: str) -> None:
    with pytest.raises(ex.InvalidArgumentError):
        parse_address(address)


@pytest.mark.parametrize(
    ("error", "condition", "status"),
    [
        (ex.ServiceBusAuthenticationError("x", None), "amqp:unauthorized-access", 401),
        (ex.ServiceBusAuthorizationError("x", None), "amqp:unauthorized-access", 401),
        (ex.MessagingEntityNotFoundError("x", None), "amqp:not-found", 404),
        (ex.MessageSizeExceededError("x", None, 2, 1), "amqp:link:message-size-exceeded", 413),
        (ex.SettlementFailedError("x", None, []), "com.microsoft:message-lock-lost", 410),
        (DecodeError("x"), "amqp:decode-error", 400),
        (RuntimeError("x"), "amqp:internal-error", 500),
    ],
)
def test_errors_map_to_the_conditions_the_sdk_knows(
    error: BaseException, condition: str, status: int
) -> None:
    assert condition_of(error) == condition
    assert status_of(error) == status


async def test_links_use_the_token_put_for_the_most_specific_audience() -> None:
    gateway = Gateway("ns")

    async def client(token: str | None) -> Any:  # no Ray: the token stands for its client
        return token

    gateway._client = client  # type: ignore[method-assign]
    conn: Any = SimpleNamespace(
        tokens={"sb://localhost:5672/": "T-ns", "sb://localhost:5672/orders": "T-orders"}
    )
    assert await gateway.client_for(conn, "orders") == "T-orders"
    assert await gateway.client_for(conn, "Orders") == "T-orders"  # paths: case-insensitive
    assert await gateway.client_for(conn, "other") == "T-ns"
    assert await gateway.client_for(conn, "t/Subscriptions/s") == "T-ns"
    conn.tokens = {"sb://localhost:5672/orders": "T-orders"}
    assert await gateway.client_for(conn, "orders-2") is None  # no token covers it


async def test_clients_are_reused_per_token_and_those_of_expired_tokens_dropped() -> None:
    gateway = Gateway("ns")
    made: list[SasTokenCredential | None] = []

    def factory(credential: SasTokenCredential | None) -> object:
        made.append(credential)
        return object()

    gateway._clients = ClientCache(factory, 16)  # type: ignore[assignment]  # no Ray
    past = generate_sas_token("sb://h/q", "k", "key-0123456789abcdef", expiry=1)
    fresh = generate_sas_token("sb://h/q", "k", "key-0123456789abcdef", ttl=600)
    anonymous = await gateway._client(None)
    await gateway._client(past)
    assert past in gateway._clients
    new = await gateway._client(fresh)  # a new token's client: expired ones go first
    assert past not in gateway._clients
    assert await gateway._client(fresh) is new and await gateway._client(None) is anonymous
    assert len(made) == 3


def test_locks_held_past_their_expiry_are_pruned() -> None:
    index = LockIndex()
    gateway = SimpleNamespace(lock_index=index)  # the one part of a gateway ``hold`` uses
    conn = AmqpConnection(gateway, None, None)  # type: ignore[arg-type]  # no socket needed

    def locked(until: float) -> ServiceBusReceivedMessage:
        rec = MessageRecord(body=b"", sequence_number=1, lock_token="t", locked_until=until)
        return ServiceBusReceivedMessage(rec, entity="q", kind="locked")

    old = locked(1.0)
    conn.hold("old", None, old)
    fresh = locked(time.time() + 60)
    for i in range(1022):
        conn.hold(f"t{i}", None, fresh)
    assert "old" in conn.locks  # pruning runs every 1024th call
    conn.hold("last", None, fresh)
    assert "old" not in conn.locks and len(conn.locks) == 1023
    assert index.sequence_number("last") == 1  # the gateway-wide index knows every token
    conn.release("last")
    assert "last" not in conn.locks and index.sequence_number("last") is None


def test_a_close_lets_settlements_under_way_finish_and_cancels_the_rest() -> None:
    """A disposition that arrived just before the client closed still reaches the broker."""

    async def scenario() -> tuple[bool, bool, bool]:
        gateway = SimpleNamespace(lock_index=LockIndex(), forget=lambda conn: None)
        conn = AmqpConnection(gateway, None, None)  # type: ignore[arg-type]  # no socket
        conn.writer = SimpleNamespace(close=lambda: None, wait_closed=asyncio.sleep)  # type: ignore[assignment]
        settled = asyncio.Event()

        async def settle() -> None:
            await asyncio.sleep(0.05)  # the broker call under way when the close comes
            settled.set()

        async def pump() -> None:
            await asyncio.sleep(60)

        settling = conn.spawn(settle(), finish=True)
        pumping = conn.spawn(pump())
        await asyncio.sleep(0)
        await conn._teardown()
        await asyncio.sleep(0)
        return settled.is_set(), settling.cancelled(), pumping.cancelled()

    assert asyncio.run(scenario()) == (True, False, True)
