"""A catalogue of bad inputs through the public API (issue 8).

Each case performs one bad operation and names the exception it must raise. For every case the
test checks that exactly that class is raised (with the expected ``argument`` where the class has
one), that its text is one line, and that nothing changed: the runtime counts of every entity of
the module, the entities themselves and the subscription's rules are as before. Settlement cases
then settle the same message validly, proving it was left where it was.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

import raybus
from raybus import ServiceBusMessage, aio
from raybus._core.record import snapshot
from raybus.enums import ServiceBusReceiveMode
from raybus.exceptions import (
    FilterSyntaxError,
    InvalidArgumentError,
    MessageAlreadySettled,
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityNotFoundError,
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

MAIN = "cat-main"
OTHER = "cat-other"
SMALL = "cat-small"  # max_message_size_in_kilobytes=1
SESS = "cat-sess"  # requires_session
TOPIC = "cat-topic"
SUB = "sub1"
SUB_PATH = f"{TOPIC}/Subscriptions/{SUB}"
MISSING = "cat-missing"
QUEUES = (MAIN, OTHER, SMALL, SESS)
FAR = datetime.now(UTC) + timedelta(days=30)


@pytest.fixture
def namespace(module_namespace: str) -> str:
    return module_namespace


@pytest.fixture(scope="module")
def env(module_namespace: str) -> Iterator[SimpleNamespace]:
    admin = ServiceBusAdministrationClient(module_namespace)
    admin.create_queue(MAIN)
    admin.create_queue(OTHER)
    admin.create_queue(SMALL, max_message_size_in_kilobytes=1)
    admin.create_queue(SESS, requires_session=True)
    admin.create_topic(TOPIC)
    admin.create_subscription(TOPIC, SUB)
    client = raybus.ServiceBusClient(module_namespace)
    e = SimpleNamespace(
        ns=module_namespace,
        admin=admin,
        client=client,
        senders={q: client.get_queue_sender(q) for q in (MAIN, OTHER, SMALL, SESS)},
        receivers={q: client.get_queue_receiver(q, max_wait_time=5) for q in (MAIN, OTHER)},
        rad=client.get_queue_receiver(
            MAIN, max_wait_time=5, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ),
    )
    try:
        yield e
    finally:
        client.close()
        try:
            admin.delete_topic(TOPIC)
        except Exception:
            pass


def state_of(e: SimpleNamespace) -> dict[str, Any]:
    """Everything a rejected call must leave unchanged."""
    out: dict[str, Any] = {}
    for q in QUEUES:
        p = e.admin.get_queue_runtime_properties(q)
        out[q] = (p.active_message_count, p.dead_letter_message_count, p.scheduled_message_count)
    s = e.admin.get_subscription_runtime_properties(TOPIC, SUB)
    out[SUB_PATH] = (s.active_message_count, s.dead_letter_message_count)
    out["queues"] = sorted(q.name for q in e.admin.list_queues())
    out["topics"] = sorted(t.name for t in e.admin.list_topics())
    out["subs"] = sorted(s.name for s in e.admin.list_subscriptions(TOPIC))
    out["rules"] = sorted(r.name for r in e.admin.list_rules(TOPIC, SUB))
    main = e.admin.get_queue(MAIN)
    out["main-settings"] = (main.lock_duration, main.max_delivery_count, main.partition_count)
    return out


def fresh(e: SimpleNamespace, queue: str = MAIN) -> ServiceBusReceivedMessage:
    """Send a new message to ``queue`` and receive it under a peek-lock (stale ones are
    completed on the way)."""
    mid = uuid.uuid4().hex
    e.senders[queue].send_messages(ServiceBusMessage("fresh", message_id=mid))
    receiver = e.receivers[queue]
    for _ in range(20):
        for m in receiver.receive_messages(max_message_count=10, max_wait_time=5):
            if m.message_id == mid:
                return m
            receiver.complete_messages([m])
    raise AssertionError("the fresh message never arrived")


def settle_ok(e: SimpleNamespace, m: ServiceBusReceivedMessage, queue: str = MAIN) -> None:
    """A valid settlement of the same message still succeeds (it was left where it was)."""
    e.receivers[queue].complete_messages([m])


def forged(m: ServiceBusReceivedMessage) -> ServiceBusReceivedMessage:
    record = snapshot(m._record)
    record.lock_token = str(uuid.uuid4())
    return ServiceBusReceivedMessage(record, entity=m._entity, kind="locked")


def arun(fn: Callable[[aio.ServiceBusClient, aio.ServiceBusAdministrationClient], Any], ns: str):
    async def main() -> None:
        client = aio.ServiceBusClient(ns)
        try:
            await fn(client, aio.ServiceBusAdministrationClient(ns))
        finally:
            await client.close()

    asyncio.run(main())


ANY = object()


@dataclasses.dataclass
class Case:
    name: str
    exc: type[BaseException]
    argument: Any
    bad: Callable[[SimpleNamespace, Any], object]
    setup: Callable[[SimpleNamespace], Any] | None = None
    after: Callable[[SimpleNamespace, Any], None] | None = None
    mentions: str | None = None  # what the text must name (default: the argument)


CASES: list[Case] = []


def case(
    name: str,
    exc: type[BaseException],
    argument: Any = ANY,
    *,
    setup: Callable[[SimpleNamespace], Any] | None = None,
    after: Callable[[SimpleNamespace, Any], None] | None = None,
) -> Callable[[Callable[[SimpleNamespace, Any], object]], Callable[[SimpleNamespace, Any], object]]:
    def deco(
        fn: Callable[[SimpleNamespace, Any], object],
    ) -> Callable[[SimpleNamespace, Any], object]:
        CASES.append(Case(name, exc, argument, fn, setup, after))
        return fn

    return deco


def simple(
    name: str,
    exc: type[BaseException],
    argument: Any,
    bad: Callable[[SimpleNamespace], object],
    mentions: str | None = None,
) -> None:
    CASES.append(Case(name, exc, argument, lambda e, _s: bad(e), mentions=mentions))


Msg = ServiceBusMessage
IAE = InvalidArgumentError
NF = MessagingEntityNotFoundError
AE = MessagingEntityAlreadyExistsError
PROPS = "application_properties"

# ----------------------------------------------------------------------------- messages

simple("body_set", IAE, "body", lambda e: Msg({1, 2}))
simple("body_object", IAE, "body", lambda e: Msg(object()))
simple("body_set_inside_list", IAE, "body[1]", lambda e: Msg([1, {2}]))
simple(
    "property_value_nested_dict",
    IAE,
    "application_properties['k']",
    lambda e: Msg("x", application_properties={"k": {"a": 1}}),
)
simple(
    "property_value_list",
    IAE,
    "application_properties['k']",
    lambda e: Msg("x", application_properties={"k": [1]}),
)
simple(
    "property_value_object",
    IAE,
    "application_properties['k']",
    lambda e: Msg("x", application_properties={"k": object()}),
)
simple(
    "property_value_int_overflow",
    IAE,
    "application_properties['k']",
    lambda e: Msg("x", application_properties={"k": 2**64}),
)
simple("property_key_int", IAE, PROPS, lambda e: Msg("x", application_properties={1: "v"}))
simple("properties_not_a_dict", IAE, PROPS, lambda e: Msg("x", application_properties=[("k", "v")]))
simple(
    "one_property_over_64k",
    MessageSizeExceededError,
    ANY,
    lambda e: Msg("x", application_properties={"k": "v" * 70_000}),
)
simple(
    "properties_total_over_64k",
    MessageSizeExceededError,
    ANY,
    lambda e: Msg("x", application_properties={f"k{i}": "v" * 10_000 for i in range(8)}),
)
simple("message_id_too_long", IAE, "message_id", lambda e: Msg("x", message_id="m" * 129))
simple("session_id_too_long", IAE, "session_id", lambda e: Msg("x", session_id="s" * 129))
simple("partition_key_too_long", IAE, "partition_key", lambda e: Msg("x", partition_key="p" * 129))
simple("message_id_empty", IAE, "message_id", lambda e: Msg("x", message_id=""))
simple("session_id_empty", IAE, "session_id", lambda e: Msg("x", session_id=""))
simple("message_id_not_str", IAE, "message_id", lambda e: Msg("x", message_id=5))
simple("ttl_negative", IAE, "time_to_live", lambda e: Msg("x", time_to_live=timedelta(seconds=-1)))
simple("ttl_zero", IAE, "time_to_live", lambda e: Msg("x", time_to_live=timedelta(0)))
simple("ttl_not_timedelta", IAE, "time_to_live", lambda e: Msg("x", time_to_live="1h"))
simple(
    "scheduled_time_not_datetime",
    IAE,
    "scheduled_enqueue_time_utc",
    lambda e: Msg("x", scheduled_enqueue_time_utc="tomorrow"),
)


def _mutated(e: SimpleNamespace) -> None:
    m = Msg("ok")
    m.application_properties = {"k": {1}}
    e.senders[MAIN].send_messages(m)


simple(
    "message_changed_after_construction_is_checked_at_send",
    IAE,
    "application_properties['k']",
    _mutated,
)


def _validated(e: SimpleNamespace) -> ServiceBusMessage:
    m = Msg("ok", application_properties={"a": 1})
    assert m.size_in_bytes > 0  # validated (and cached)
    return m


def _mutated_in_place(e: SimpleNamespace, m: ServiceBusMessage) -> None:
    assert m.application_properties is not None
    m.application_properties["k"] = object()
    e.senders[MAIN].send_messages(m)


CASES.append(
    Case(
        "properties_changed_in_place_are_checked_at_send",
        IAE,
        "application_properties['k']",
        _mutated_in_place,
        _validated,
    )
)

# ----------------------------------------------------------------------------- sending

simple(
    "partition_key_differs_from_session_id",
    IAE,
    "partition_key",
    lambda e: e.senders[SESS].send_messages(Msg("x", session_id="a", partition_key="b")),
)
simple(
    "body_over_queue_max_message_size",
    MessageSizeExceededError,
    ANY,
    lambda e: e.senders[SMALL].send_messages(Msg("x" * 2000)),
)
simple(
    "list_with_one_oversize_message_stores_nothing",
    MessageSizeExceededError,
    ANY,
    lambda e: e.senders[SMALL].send_messages([Msg("a"), Msg("b"), Msg("x" * 2000), Msg("c")]),
)
simple(
    "list_with_a_non_message_stores_nothing",
    IAE,
    "message",
    lambda e: e.senders[MAIN].send_messages([Msg("a"), "b"]),
)
simple("send_a_str", IAE, "message", lambda e: e.senders[MAIN].send_messages("hello"))
simple("send_a_dict", IAE, "message", lambda e: e.senders[MAIN].send_messages({"body": "x"}))
simple(
    "send_timeout_negative",
    IAE,
    "timeout",
    lambda e: e.senders[MAIN].send_messages(Msg("x"), timeout=-1),
)
simple(
    "send_to_unknown_queue",
    NF,
    ANY,
    lambda e: e.client.get_queue_sender(MISSING).send_messages(Msg("x")),
)
simple(
    "send_to_unknown_topic",
    NF,
    ANY,
    lambda e: e.client.get_topic_sender(MISSING).send_messages(Msg("x")),
)
simple(
    "send_to_a_subscription_path",
    IAE,
    "entity",
    lambda e: e.client.get_queue_sender(SUB_PATH).send_messages(Msg("x")),
)


def _batch_over(e: SimpleNamespace, _s: Any) -> None:
    batch = e.senders[SMALL].create_message_batch()
    batch.add_message(Msg("small"))
    e.batch = batch
    batch.add_message(Msg("x" * 2000))


def _batch_unchanged(e: SimpleNamespace, _s: Any) -> None:
    assert len(e.batch) == 1


CASES.append(
    Case(
        "batch_add_over_the_limit_leaves_batch_unchanged",
        MessageSizeExceededError,
        ANY,
        _batch_over,
        after=_batch_unchanged,
    )
)
simple(
    "batch_max_size_above_queue_limit",
    IAE,
    "max_size_in_bytes",
    lambda e: e.senders[SMALL].create_message_batch(10**9),
)
simple(
    "batch_max_size_zero",
    IAE,
    "max_size_in_bytes",
    lambda e: e.senders[MAIN].create_message_batch(0),
)
simple(
    "batch_add_a_str",
    IAE,
    "message",
    lambda e: e.senders[MAIN].create_message_batch().add_message("x"),
)
simple(
    "schedule_time_is_a_str",
    IAE,
    "schedule_time_utc",
    lambda e: e.senders[MAIN].schedule_messages(Msg("x"), "2030-01-01"),
)
simple(
    "schedule_time_is_a_number",
    IAE,
    "schedule_time_utc",
    lambda e: e.senders[MAIN].schedule_messages(Msg("x"), 1_900_000_000.0),
)
simple(
    "cancel_negative_sequence_number",
    IAE,
    "sequence_numbers",
    lambda e: e.senders[MAIN].cancel_scheduled_messages(-1),
)
simple(
    "cancel_str_sequence_number",
    IAE,
    "sequence_numbers",
    lambda e: e.senders[MAIN].cancel_scheduled_messages(["1"]),
)


def _schedule_one(e: SimpleNamespace) -> int:
    (seq,) = e.senders[MAIN].schedule_messages(Msg("later"), FAR)
    return seq


def _cancel_ok(e: SimpleNamespace, seq: int) -> None:
    e.senders[MAIN].cancel_scheduled_messages([seq])


CASES.append(
    Case(
        "cancel_known_and_unknown_numbers_cancels_none",
        MessageNotFoundError,
        ANY,
        lambda e, seq: e.senders[MAIN].cancel_scheduled_messages([seq, seq + 10_000_000]),
        _schedule_one,
        _cancel_ok,
    )
)

# ----------------------------------------------------------------------------- entity names

simple("create_queue_empty_name", IAE, "name", lambda e: e.admin.create_queue(""))
simple("create_queue_name_too_long", IAE, "name", lambda e: e.admin.create_queue("a" * 261))
simple("create_queue_name_bad_characters", IAE, "name", lambda e: e.admin.create_queue("bad name!"))
simple("create_queue_name_leading_dash", IAE, "name", lambda e: e.admin.create_queue("-abc"))
simple("create_queue_name_empty_segment", IAE, "name", lambda e: e.admin.create_queue("a//b"))
simple(
    "create_queue_reserved_suffix",
    IAE,
    "name",
    lambda e: e.admin.create_queue("orders/$DeadLetterQueue"),
)
simple("create_queue_name_not_a_str", IAE, "name", lambda e: e.admin.create_queue(42))
simple("get_queue_unknown", NF, ANY, lambda e: e.admin.get_queue(MISSING))
simple("delete_queue_unknown", NF, ANY, lambda e: e.admin.delete_queue(MISSING))
simple(
    "runtime_properties_unknown_queue",
    NF,
    ANY,
    lambda e: e.admin.get_queue_runtime_properties(MISSING),
)
simple("create_queue_duplicate", AE, ANY, lambda e: e.admin.create_queue(MAIN))
simple("create_queue_duplicate_other_case", AE, ANY, lambda e: e.admin.create_queue(MAIN.upper()))
simple("receiver_for_empty_name", IAE, "name", lambda e: e.client.get_queue_receiver(""))
simple("sender_for_non_str_name", IAE, "name", lambda e: e.client.get_queue_sender(5))
simple(
    "receive_from_unknown_queue",
    NF,
    ANY,
    lambda e: e.client.get_queue_receiver(MISSING, max_wait_time=1).receive_messages(),
)

# ----------------------------------------------------------------------------- queue settings

simple(
    "lock_duration_zero",
    IAE,
    "lock_duration",
    lambda e: e.admin.create_queue("cat-x", lock_duration=timedelta(0)),
)
simple(
    "lock_duration_over_5_minutes",
    IAE,
    "lock_duration",
    lambda e: e.admin.create_queue("cat-x", lock_duration=timedelta(minutes=6)),
)
simple(
    "lock_duration_a_str",
    IAE,
    "lock_duration",
    lambda e: e.admin.create_queue("cat-x", lock_duration="60s"),
)
simple(
    "max_delivery_count_zero",
    IAE,
    "max_delivery_count",
    lambda e: e.admin.create_queue("cat-x", max_delivery_count=0),
)
simple(
    "max_delivery_count_a_str",
    IAE,
    "max_delivery_count",
    lambda e: e.admin.create_queue("cat-x", max_delivery_count="10"),
)
simple(
    "partition_count_zero",
    IAE,
    "partition_count",
    lambda e: e.admin.create_queue("cat-x", partition_count=0),
)
simple(
    "partition_count_65",
    IAE,
    "partition_count",
    lambda e: e.admin.create_queue("cat-x", partition_count=65),
)
simple(
    "default_ttl_negative",
    IAE,
    "default_message_time_to_live",
    lambda e: e.admin.create_queue("cat-x", default_message_time_to_live=timedelta(seconds=-5)),
)
simple(
    "dedup_window_too_short",
    IAE,
    "duplicate_detection_history_time_window",
    lambda e: e.admin.create_queue(
        "cat-x", duplicate_detection_history_time_window=timedelta(seconds=5)
    ),
)
simple(
    "dedup_window_too_long",
    IAE,
    "duplicate_detection_history_time_window",
    lambda e: e.admin.create_queue(
        "cat-x", duplicate_detection_history_time_window=timedelta(days=8)
    ),
)
simple(
    "max_message_size_zero",
    IAE,
    "max_message_size_in_kilobytes",
    lambda e: e.admin.create_queue("cat-x", max_message_size_in_kilobytes=0),
)
simple(
    "requires_session_a_str",
    IAE,
    "requires_session",
    lambda e: e.admin.create_queue("cat-x", requires_session="yes"),
)
simple("status_unknown", IAE, "status", lambda e: e.admin.create_queue("cat-x", status="Sleeping"))
simple("unknown_queue_option", IAE, "colour", lambda e: e.admin.create_queue("cat-x", colour="red"))
simple(
    "forward_to_bad_name",
    IAE,
    "forward_to",
    lambda e: e.admin.create_queue("cat-x", forward_to="bad name!"),
)
simple(
    "update_queue_lock_duration_zero",
    IAE,
    "lock_duration",
    lambda e: e.admin.update_queue(e.admin.get_queue(MAIN), lock_duration=timedelta(0)),
)
simple(
    "update_queue_requires_session",
    IAE,
    "requires_session",
    lambda e: e.admin.update_queue(e.admin.get_queue(MAIN), requires_session=True),
)
simple("update_queue_not_properties", IAE, "queue", lambda e: e.admin.update_queue(MAIN))
simple(
    "update_queue_unknown_option",
    IAE,
    "colour",
    lambda e: e.admin.update_queue(e.admin.get_queue(MAIN), colour="red"),
)
simple(
    "wait_for_partitions_timeout_zero",
    IAE,
    "timeout",
    lambda e: e.admin.wait_for_partitions(MAIN, timeout=0),
)

# ----------------------------------------------------------------------------- receiving

simple(
    "receive_count_zero",
    IAE,
    "max_message_count",
    lambda e: e.receivers[MAIN].receive_messages(max_message_count=0),
)
simple(
    "receive_count_negative",
    IAE,
    "max_message_count",
    lambda e: e.receivers[MAIN].receive_messages(max_message_count=-1),
)
simple(
    "receive_count_a_str",
    IAE,
    "max_message_count",
    lambda e: e.receivers[MAIN].receive_messages(max_message_count="3"),
)
simple(
    "receive_count_a_bool",
    IAE,
    "max_message_count",
    lambda e: e.receivers[MAIN].receive_messages(max_message_count=True),
)
simple(
    "receive_wait_zero",
    IAE,
    "max_wait_time",
    lambda e: e.receivers[MAIN].receive_messages(max_wait_time=0),
)
simple(
    "receive_wait_negative",
    IAE,
    "max_wait_time",
    lambda e: e.receivers[MAIN].receive_messages(max_wait_time=-1),
)
simple(
    "receive_wait_a_str",
    IAE,
    "max_wait_time",
    lambda e: e.receivers[MAIN].receive_messages(max_wait_time="x"),
)
simple(
    "receiver_wait_negative",
    IAE,
    "max_wait_time",
    lambda e: e.client.get_queue_receiver(MAIN, max_wait_time=-1),
)
simple(
    "receiver_prefetch_negative",
    IAE,
    "prefetch_count",
    lambda e: e.client.get_queue_receiver(MAIN, prefetch_count=-1),
)
simple(
    "receiver_mode_unknown",
    IAE,
    "receive_mode",
    lambda e: e.client.get_queue_receiver(MAIN, receive_mode="bogus"),
)
simple(
    "receiver_sub_queue_unknown",
    IAE,
    "sub_queue",
    lambda e: e.client.get_queue_receiver(MAIN, sub_queue="bogus"),
)
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
        "abandon_property_value_a_set",
        IAE,
        "application_properties['k']",
        lambda e, m: e.receivers[MAIN].abandon_message(m, {"k": {1}}),
        fresh,
        settle_ok,
    ),
    Case(
        "abandon_property_key_int",
        IAE,
        PROPS,
        lambda e, m: e.receivers[MAIN].abandon_message(m, {1: "v"}),
        fresh,
        settle_ok,
    ),
    Case(
        "defer_properties_not_a_dict",
        IAE,
        PROPS,
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

POSITIONED = {
    "sql_filter_syntax",
    "sql_filter_unbalanced_paren",
    "sql_filter_trailing_operator",
    "sql_action_syntax",
}


def test_catalogue_is_large_and_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) >= 60
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("bad", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_refused_with_a_typed_one_line_error_and_changes_nothing(
    env: SimpleNamespace, bad: Case
) -> None:
    state = bad.setup(env) if bad.setup is not None else None
    before = state_of(env)
    with pytest.raises(BaseException) as info:
        bad.bad(env, state)
    error = info.value
    assert type(error) is bad.exc, f"{type(error).__name__}: {error}"
    text = str(error)
    assert text.strip(), "empty error text"
    assert "\n" not in text, f"multi-line error: {text!r}"
    if bad.argument is not ANY:
        assert error.argument == bad.argument, f"argument {error.argument!r}: {text}"  # type: ignore[attr-defined]
        wanted = bad.mentions or bad.argument.split("[")[0]
        spoken = text.lower().replace("_", " ")
        assert wanted.lower().replace("_", " ") in spoken, (
            f"the text does not name {wanted!r}: {text}"
        )
    if bad.name in POSITIONED:
        assert isinstance(error, FilterSyntaxError) and error.position is not None, text
    assert state_of(env) == before
    if bad.after is not None:
        bad.after(env, state)
