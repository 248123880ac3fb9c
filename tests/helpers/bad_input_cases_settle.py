"""Bad-input cases of receiving, settling, sessions, transactions, topics and rules, closed
clients and the asyncio client (registered in ``bad_input_catalogue.CASES`` on import; run
by ``test_bad_input_catalogue.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from bad_input_catalogue import (
    AE,
    ANY,
    CASES,
    IAE,
    MAIN,
    MISSING,
    MODIFY,
    NF,
    OTHER,
    SESS,
    SMALL,
    SUB,
    SUB_PATH,
    TOPIC,
    Case,
    Msg,
    arun,
    forged,
    fresh,
    settle_ok,
    simple,
)

import raybus
from raybus import aio
from raybus.exceptions import (
    FilterSyntaxError,
    MessageAlreadySettled,
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    SettlementFailedError,
    TransactionSizeExceededError,
)
from raybus.management import (
    CorrelationRuleFilter,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
)
from raybus.message import ServiceBusReceivedMessage

# ----------------------------------------------------------------------------- receiving


def _receive_with(option: str, value: object) -> Callable[[SimpleNamespace], object]:
    return lambda e: e.receivers[MAIN].receive_messages(**{option: value})


def _receiver_with(option: str, value: object) -> Callable[[SimpleNamespace], object]:
    return lambda e: e.client.get_queue_receiver(MAIN, **{option: value})


# (case name, how the bad option is passed, the option, its bad value); the error names it.
for _name, _how, _option, _value in [
    ("receive_count_zero", _receive_with, "max_message_count", 0),
    ("receive_count_negative", _receive_with, "max_message_count", -1),
    ("receive_count_a_str", _receive_with, "max_message_count", "3"),
    ("receive_count_a_bool", _receive_with, "max_message_count", True),
    ("receive_wait_zero", _receive_with, "max_wait_time", 0),
    ("receive_wait_negative", _receive_with, "max_wait_time", -1),
    ("receive_wait_a_str", _receive_with, "max_wait_time", "x"),
    ("receiver_wait_negative", _receiver_with, "max_wait_time", -1),
    ("receiver_prefetch_negative", _receiver_with, "prefetch_count", -1),
    ("receiver_mode_unknown", _receiver_with, "receive_mode", "bogus"),
    ("receiver_sub_queue_unknown", _receiver_with, "sub_queue", "bogus"),
]:
    simple(_name, IAE, _option, _how(_option, _value))
simple(
    "peek_negative_sequence_number",
    IAE,
    "sequence_number",
    lambda e: e.receivers[MAIN].peek_messages(1, sequence_number=-1),
)
simple("peek_count_zero", IAE, "max_message_count", lambda e: e.receivers[MAIN].peek_messages(0))
simple(
    "deferred_negative_number",
    IAE,
    "sequence_numbers",
    lambda e: e.receivers[MAIN].receive_deferred_messages([-1]),
)
simple(
    "deferred_str_number",
    IAE,
    "sequence_numbers",
    lambda e: e.receivers[MAIN].receive_deferred_messages(["5"]),
)


def _deferred(e: SimpleNamespace) -> int:
    m = fresh(e)
    e.receivers[MAIN].defer_message(m)
    return m.sequence_number


def _deferred_still_receivable(e: SimpleNamespace, seq: int) -> None:
    (m,) = e.receivers[MAIN].receive_deferred_messages([seq])
    e.receivers[MAIN].complete_messages([m])


CASES.append(
    Case(
        "deferred_known_and_unknown_numbers_locks_none",
        MessageNotFoundError,
        ANY,
        lambda e, seq: e.receivers[MAIN].receive_deferred_messages([seq, seq + 10_000_000]),
        _deferred,
        _deferred_still_receivable,
    )
)

# ----------------------------------------------------------------------------- settling


def _settled(e: SimpleNamespace) -> ServiceBusReceivedMessage:
    m = fresh(e)
    e.receivers[MAIN].complete_messages([m])
    return m


def _peeked(e: SimpleNamespace) -> tuple[ServiceBusReceivedMessage, ServiceBusReceivedMessage]:
    m = fresh(e)
    (p,) = e.receivers[MAIN].peek_messages(1, sequence_number=m.sequence_number)
    assert p.sequence_number == m.sequence_number
    return m, p


def _deleted(e: SimpleNamespace) -> ServiceBusReceivedMessage:
    mid = uuid.uuid4().hex
    e.senders[MAIN].send_messages(Msg("rad", message_id=mid))
    for _ in range(20):
        for m in e.rad.receive_messages(max_message_count=10, max_wait_time=5):
            if m.message_id == mid:
                return m
    raise AssertionError("not received")


def _with_forged(e: SimpleNamespace) -> tuple[ServiceBusReceivedMessage, ServiceBusReceivedMessage]:
    m = fresh(e)
    return m, forged(m)


def _ok_first(e: SimpleNamespace, s: tuple[ServiceBusReceivedMessage, Any]) -> None:
    settle_ok(e, s[0])


def _forged_complete(e: SimpleNamespace, s: Any) -> None:
    e.receivers[MAIN].complete_message(s[1])
    e.receivers[MAIN].peek_messages(1)  # a settlement refused later is reported by the next call


CASES += [
    Case(
        "complete_twice",
        MessageAlreadySettled,
        ANY,
        lambda e, m: e.receivers[MAIN].complete_message(m),
        _settled,
    ),
    Case(
        "abandon_after_complete",
        MessageAlreadySettled,
        ANY,
        lambda e, m: e.receivers[MAIN].abandon_message(m),
        _settled,
    ),
    Case(
        "renew_a_settled_message",
        MessageAlreadySettled,
        ANY,
        lambda e, m: e.receivers[MAIN].renew_message_lock(m),
        _settled,
    ),
    Case(
        "complete_a_peeked_message",
        MessageAlreadySettled,
        ANY,
        lambda e, s: e.receivers[MAIN].complete_message(s[1]),
        _peeked,
        _ok_first,
    ),
    Case(
        "dead_letter_a_peeked_message",
        MessageAlreadySettled,
        ANY,
        lambda e, s: e.receivers[MAIN].dead_letter_message(s[1], "r"),
        _peeked,
        _ok_first,
    ),
    Case(
        "complete_a_receive_and_delete_message",
        MessageAlreadySettled,
        ANY,
        lambda e, m: e.rad.complete_message(m),
        _deleted,
    ),
    Case(
        "settle_with_another_queues_receiver",
        IAE,
        "message",
        lambda e, m: e.receivers[OTHER].complete_message(m),
        fresh,
        settle_ok,
    ),
    Case(
        "settle_a_plain_message",
        IAE,
        "message",
        lambda e, _s: e.receivers[MAIN].complete_message(Msg("x")),
    ),
    Case(
        "abandon_a_plain_message",
        IAE,
        "message",
        lambda e, _s: e.receivers[MAIN].abandon_message(Msg("x")),
    ),
    Case(
        "renew_a_plain_message",
        IAE,
        "message",
        lambda e, _s: e.receivers[MAIN].renew_message_lock(Msg("x")),
    ),
    Case(
        "renew_with_forged_lock_token",
        MessageLockLostError,
        ANY,
        lambda e, s: e.receivers[MAIN].renew_message_lock(s[1]),
        _with_forged,
        _ok_first,
    ),
    Case(
        "complete_with_forged_lock_token",
        SettlementFailedError,
        ANY,
        _forged_complete,
        _with_forged,
        _ok_first,
    ),
    Case(
        "dead_letter_reason_not_str",
        IAE,
        "reason",
        lambda e, m: e.receivers[MAIN].dead_letter_message(m, reason=5),
        fresh,
        settle_ok,
    ),
    Case(
        "dead_letter_description_not_str",
        IAE,
        "error_description",
        lambda e, m: e.receivers[MAIN].dead_letter_message(m, "r", error_description=b"x"),
        fresh,
        settle_ok,
    ),
    Case(
        "dead_letter_reason_over_32_kib",
        MessageSizeExceededError,
        ANY,
        lambda e, m: e.receivers[MAIN].dead_letter_message(m, reason="r" * 33_000),
        fresh,
        settle_ok,
    ),
    Case(
        "abandon_properties_past_the_64_kib_header",
        MessageSizeExceededError,
        ANY,
        lambda e, m: e.receivers[MAIN].abandon_message(
            m, {"a": "x" * 30_000, "b": "y" * 30_000, "c": "z" * 30_000}
        ),
        fresh,
        settle_ok,
    ),
    Case(
        "abandon_property_value_a_set",
        IAE,
        "properties_to_modify['k']",
        lambda e, m: e.receivers[MAIN].abandon_message(m, {"k": {1}}),
        fresh,
        settle_ok,
    ),
    Case(
        "abandon_property_key_int",
        IAE,
        MODIFY,
        lambda e, m: e.receivers[MAIN].abandon_message(m, {1: "v"}),
        fresh,
        settle_ok,
    ),
    Case(
        "defer_properties_not_a_dict",
        IAE,
        MODIFY,
        lambda e, m: e.receivers[MAIN].defer_message(m, ["k"]),
        fresh,
        settle_ok,
    ),
]

# ----------------------------------------------------------------------------- sessions


def _session_on_plain_queue(e: SimpleNamespace) -> None:
    with e.client.get_queue_receiver(MAIN, session_id="s1", max_wait_time=1) as r:
        r.receive_messages()


def _plain_on_session_queue(e: SimpleNamespace) -> None:
    with e.client.get_queue_receiver(SESS, max_wait_time=1) as r:
        r.receive_messages()


simple(
    "session_receiver_empty_session_id",
    IAE,
    "session_id",
    lambda e: e.client.get_queue_receiver(SESS, session_id=""),
)
simple(
    "session_receiver_session_id_too_long",
    IAE,
    "session_id",
    lambda e: e.client.get_queue_receiver(SESS, session_id="s" * 129),
)
simple(
    "session_receiver_session_id_not_str",
    IAE,
    "session_id",
    lambda e: e.client.get_queue_receiver(SESS, session_id=7),
)
simple(
    "session_receiver_on_dead_letter_queue",
    IAE,
    "session_id",
    lambda e: e.client.get_queue_receiver(SESS, session_id="s1", sub_queue="deadletter"),
)
simple("session_receiver_on_non_session_queue", IAE, "session_id", _session_on_plain_queue)
simple("plain_receiver_on_session_queue", IAE, "session_id", _plain_on_session_queue, "session")

# ----------------------------------------------------------------------------- transactions


def _rad_in_txn(e: SimpleNamespace, m: ServiceBusReceivedMessage) -> None:
    with e.client.transaction() as txn:
        e.rad.complete_message(m, transaction=txn)


def _txn_101(e: SimpleNamespace, _s: Any) -> None:
    txn = e.client.transaction()
    try:
        e.senders[OTHER].send_messages([Msg(f"t{i}") for i in range(100)], transaction=txn)
        e.senders[OTHER].send_messages(Msg("one too many"), transaction=txn)
    finally:
        txn.rollback()


def _committed(e: SimpleNamespace) -> Any:
    txn = e.client.transaction()
    txn.commit()
    return txn


def _txn_to_subscription(e: SimpleNamespace, _s: Any) -> None:
    txn = e.client.transaction()
    try:
        e.client.get_queue_sender(SUB_PATH).send_messages(Msg("x"), transaction=txn)
    finally:
        txn.rollback()


CASES += [
    Case(
        "receive_and_delete_receiver_joins_transaction", IAE, "transaction", _rad_in_txn, _deleted
    ),
    Case("transaction_101st_message", TransactionSizeExceededError, ANY, _txn_101),
    Case(
        "send_in_committed_transaction",
        IAE,
        "transaction",
        lambda e, t: e.senders[OTHER].send_messages(Msg("x"), transaction=t),
        _committed,
    ),
    Case("commit_a_committed_transaction", IAE, "transaction", lambda e, t: t.commit(), _committed),
    Case("send_to_subscription_in_transaction", IAE, "entity", _txn_to_subscription),
]

# ----------------------------------------------------------------------------- topics and rules

simple(
    "sql_filter_syntax",
    FilterSyntaxError,
    ANY,
    lambda e: e.admin.create_rule(TOPIC, SUB, "r1", filter=SqlRuleFilter("amount = = 1")),
)
simple(
    "sql_filter_unbalanced_paren",
    FilterSyntaxError,
    ANY,
    lambda e: e.admin.create_rule(TOPIC, SUB, "r1", filter=SqlRuleFilter("(amount = 1")),
)
simple(
    "sql_filter_trailing_operator",
    FilterSyntaxError,
    ANY,
    lambda e: e.admin.create_rule(TOPIC, SUB, "r1", filter=SqlRuleFilter("amount >")),
)
simple(
    "sql_action_syntax",
    FilterSyntaxError,
    ANY,
    lambda e: e.admin.create_rule(TOPIC, SUB, "r1", action=SqlRuleAction("SET = 1")),
)
simple("sql_filter_not_a_str", IAE, "sql_expression", lambda e: SqlRuleFilter(5))
simple(
    "correlation_filter_without_fields",
    IAE,
    "properties",
    lambda e: e.admin.create_rule(TOPIC, SUB, "r1", filter=CorrelationRuleFilter()),
    "property",
)
simple("rule_name_empty", IAE, "name", lambda e: e.admin.create_rule(TOPIC, SUB, ""))
simple("rule_name_too_long", IAE, "name", lambda e: e.admin.create_rule(TOPIC, SUB, "r" * 51))
simple(
    "rule_filter_a_str",
    IAE,
    "filter",
    lambda e: e.admin.create_rule(TOPIC, SUB, "r1", filter="amount > 1"),
)
simple("rule_duplicate_default", AE, ANY, lambda e: e.admin.create_rule(TOPIC, SUB, "$Default"))
simple("rule_on_missing_subscription", NF, ANY, lambda e: e.admin.create_rule(TOPIC, "nosub", "r1"))
simple("get_rule_unknown", NF, ANY, lambda e: e.admin.get_rule(TOPIC, SUB, "nope"))
simple("delete_rule_unknown", NF, ANY, lambda e: e.admin.delete_rule(TOPIC, SUB, "nope"))
simple(
    "subscription_on_missing_topic", NF, ANY, lambda e: e.admin.create_subscription(MISSING, "s")
)
simple("subscription_duplicate", AE, ANY, lambda e: e.admin.create_subscription(TOPIC, SUB))
simple(
    "subscription_name_too_long",
    IAE,
    "name",
    lambda e: e.admin.create_subscription(TOPIC, "s" * 51),
)
simple(
    "subscription_unknown_option",
    IAE,
    "colour",
    lambda e: e.admin.create_subscription(TOPIC, "s2", colour="red"),
)
simple("topic_duplicate", AE, ANY, lambda e: e.admin.create_topic(TOPIC))
simple("topic_duplicate_of_a_queue_name", AE, ANY, lambda e: e.admin.create_topic(MAIN))
simple("topic_bad_name", IAE, "name", lambda e: e.admin.create_topic("bad topic"))
simple(
    "receive_from_unknown_subscription",
    NF,
    ANY,
    lambda e: e.client.get_subscription_receiver(
        TOPIC, "nosub", max_wait_time=1
    ).receive_messages(),
)
simple(
    "receive_from_a_topic",
    IAE,
    "entity",
    lambda e: e.client.get_queue_receiver(TOPIC, max_wait_time=1).receive_messages(),
)

# ----------------------------------------------------------------------------- clients

simple("namespace_bad_characters", IAE, "namespace", lambda e: raybus.ServiceBusClient("bad name!"))
simple("namespace_empty", IAE, "namespace", lambda e: raybus.ServiceBusClient(""))
simple("namespace_not_a_str", IAE, "namespace", lambda e: raybus.ServiceBusClient(5))
simple(
    "admin_namespace_too_long", IAE, "namespace", lambda e: ServiceBusAdministrationClient("n" * 51)
)


def _closed_sender(e: SimpleNamespace) -> None:
    sender = e.client.get_queue_sender(MAIN)
    sender.close()
    sender.send_messages(Msg("x"))


def _closed_receiver(e: SimpleNamespace) -> None:
    receiver = e.client.get_queue_receiver(MAIN, max_wait_time=1)
    receiver.close()
    receiver.receive_messages()


simple("closed_sender_sends", IAE, "sender", _closed_sender)
simple("closed_receiver_receives", IAE, "receiver", _closed_receiver)

# ----------------------------------------------------------------------------- asyncio


async def _aio_count_zero(c: aio.ServiceBusClient, _a: Any) -> None:
    async with c.get_queue_receiver(MAIN, max_wait_time=1) as r:
        await r.receive_messages(max_message_count=0)


async def _aio_oversize(c: aio.ServiceBusClient, _a: Any) -> None:
    async with c.get_queue_sender(SMALL) as s:
        await s.send_messages([Msg("a"), Msg("x" * 2000)])


async def _aio_duplicate(_c: Any, a: aio.ServiceBusAdministrationClient) -> None:
    await a.create_queue(MAIN)


async def _aio_schedule(c: aio.ServiceBusClient, _a: Any) -> None:
    async with c.get_queue_sender(MAIN) as s:
        await s.schedule_messages(Msg("x"), "soon")


async def _aio_complete_twice(c: aio.ServiceBusClient, _a: Any) -> None:
    mid = uuid.uuid4().hex
    async with c.get_queue_sender(OTHER) as s:
        await s.send_messages(Msg("x", message_id=mid))
    async with c.get_queue_receiver(OTHER, max_wait_time=5) as r:
        for _ in range(20):
            for m in await r.receive_messages(max_message_count=10):
                await r.complete_messages([m])
                if m.message_id == mid:
                    await r.complete_message(m)
    raise AssertionError("not received")


async def _aio_bad_sql(_c: Any, a: aio.ServiceBusAdministrationClient) -> None:
    await a.create_rule(TOPIC, SUB, "r1", filter=SqlRuleFilter("a = @missing"))


async def _aio_plain_message(c: aio.ServiceBusClient, _a: Any) -> None:
    async with c.get_queue_receiver(MAIN, max_wait_time=1) as r:
        await r.complete_message(Msg("x"))


simple("aio_settle_a_plain_message", IAE, "message", lambda e: arun(_aio_plain_message, e.ns))
simple("aio_receive_count_zero", IAE, "max_message_count", lambda e: arun(_aio_count_zero, e.ns))
simple(
    "aio_list_with_oversize_message",
    MessageSizeExceededError,
    ANY,
    lambda e: arun(_aio_oversize, e.ns),
)
simple("aio_create_queue_duplicate", AE, ANY, lambda e: arun(_aio_duplicate, e.ns))
simple("aio_schedule_time_a_str", IAE, "schedule_time_utc", lambda e: arun(_aio_schedule, e.ns))
simple("aio_complete_twice", MessageAlreadySettled, ANY, lambda e: arun(_aio_complete_twice, e.ns))
simple(
    "aio_sql_filter_missing_parameter", FilterSyntaxError, ANY, lambda e: arun(_aio_bad_sql, e.ns)
)
