"""Topics, subscriptions and rules against a real local Ray cluster (sync and asyncio clients).

Covered: the ``$Default`` rule gives every subscription a copy; SQL and correlation filters
select (correlation: exact and case-sensitive); rules without actions are OR-ed into one copy;
each matching rule with an action gives its own copy carrying ``RuleName`` and the action's
changes; no rules or a false filter receive nothing; a filter evaluation error dead-letters the
message on that subscription only (or drops it there); sessions and partitions on
subscriptions; a fan-out to ten subscriptions with mixed rules checked copy by copy against an
independent model; disabled topics; bad SQL and duplicate rule names change nothing; deleting a
subscription or a topic; runtime counts; a killed router comes back with its configuration;
a publish is all-or-nothing when one subscription refuses its copy.

Cost: every subscription of one partition is one Ray actor (a worker process, ~0.8 s to
start) and every topic has a router actor, so the tests share one raybus namespace (one
registry, one coordinator) and, unless they change the topic itself, one topic (``topic``);
they keep to a few subscriptions each, and what a test created is deleted after it (its actors
go away). The 100-subscription case is in ``benchmarks/topics.py``.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import ray

import raybus
from raybus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
    aio,
)
from raybus.exceptions import (
    FilterSyntaxError,
    InvalidArgumentError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
)
from raybus.management import (
    CorrelationRuleFilter,
    EntityStatus,
    FalseRuleFilter,
    RuleProperties,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

DLQ = ServiceBusSubQueue.DEAD_LETTER
RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE
RULE_NAME = "RuleName"


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> Iterator[str]:
    # One namespace for the module (see ``module_namespace`` in conftest); every test uses its
    # own uniquely named topics.
    yield module_namespace
    # The coordinator actor (detached; used by publishes spanning several partitions) is not
    # one the shared fixtures know about.
    from raybus._actors.coordinator import coordinator_actor_name

    try:
        actor = ray.get_actor(coordinator_actor_name(module_namespace), namespace="raybus")
        ray.kill(actor, no_restart=True)
    except Exception:  # never created
        pass


SHARED_PREFIX = "shared-"


@pytest.fixture(autouse=True)
def _delete_topics(namespace: str) -> Iterator[None]:
    """Delete the topics a test created (with their subscriptions' and routers' actors): the
    shared fixtures only know about queues."""
    yield
    admin = ServiceBusAdministrationClient(namespace)
    try:
        topics = admin.list_topics()
    except ServiceBusError:
        return
    for topic in topics:
        if topic.name.startswith(SHARED_PREFIX):
            continue
        try:
            admin.delete_topic(topic.name)
        except ServiceBusError:
            pass


@pytest.fixture(scope="module")
def shared_topic(namespace: str) -> Iterator[str]:
    name = f"{SHARED_PREFIX}{uuid.uuid4().hex[:8]}"
    admin = ServiceBusAdministrationClient(namespace)
    admin.create_topic(name)
    yield name
    try:
        admin.delete_topic(name)
    except ServiceBusError:
        pass


@pytest.fixture
def topic(shared_topic: str, admin: ServiceBusAdministrationClient) -> Iterator[str]:
    """A topic with default settings and no subscription: the module's, whose router actor
    the tests share (a router is a worker process). Each test creates its own subscriptions,
    deleted after it; a subscription only gets what is published while it exists, so the
    tests do not see each other's messages. Tests that change the topic itself (status,
    size, deletion, its router) create their own."""
    _delete_subscriptions(admin, shared_topic)  # left by a test that failed to clean up
    yield shared_topic
    _delete_subscriptions(admin, shared_topic)


def _delete_subscriptions(admin: ServiceBusAdministrationClient, topic: str) -> None:
    for sub in admin.list_subscriptions(topic):
        try:
            admin.delete_subscription(topic, sub.name)
        except ServiceBusError:
            pass


def _name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _counts(admin: ServiceBusAdministrationClient, topic: str, sub: str) -> tuple[int, int]:
    """(active, dead-lettered) messages of a subscription."""
    props = admin.get_subscription_runtime_properties(topic, sub)
    return props.active_message_count, props.dead_letter_message_count


async def _acounts(
    aadmin: aio.ServiceBusAdministrationClient, topic: str, sub: str
) -> tuple[int, int]:
    props = await aadmin.get_subscription_runtime_properties(topic, sub)
    return props.active_message_count, props.dead_letter_message_count


def _drain(
    client: raybus.ServiceBusClient,
    topic: str,
    sub: str,
    n: int,
    *,
    sub_queue: ServiceBusSubQueue | None = None,
    timeout: float = 30.0,
) -> list[raybus.ServiceBusReceivedMessage]:
    """Receive (and delete) exactly ``n`` messages of a subscription, then check it has no
    more."""
    got: list[raybus.ServiceBusReceivedMessage] = []
    with client.get_subscription_receiver(
        topic, sub, sub_queue=sub_queue, receive_mode=RAD, max_wait_time=5
    ) as receiver:
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            got.extend(receiver.receive_messages(max_message_count=n - len(got), max_wait_time=5))
        assert len(got) == n, f"{topic}/{sub}: {len(got)} of {n} messages arrived"
        assert receiver.receive_messages(max_message_count=10, max_wait_time=0.2) == []
    return got


async def _adrain(
    aclient: aio.ServiceBusClient,
    topic: str,
    sub: str,
    n: int,
    *,
    sub_queue: ServiceBusSubQueue | None = None,
    timeout: float = 30.0,
) -> list[raybus.ServiceBusReceivedMessage]:
    got: list[raybus.ServiceBusReceivedMessage] = []
    async with aclient.get_subscription_receiver(
        topic, sub, sub_queue=sub_queue, receive_mode=RAD, max_wait_time=5
    ) as receiver:
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            got.extend(await receiver.receive_messages(n - len(got), max_wait_time=5))
        assert len(got) == n, f"{topic}/{sub}: {len(got)} of {n} messages arrived"
        assert await receiver.receive_messages(10, max_wait_time=0.2) == []
    return got


def _bodies(msgs: list[raybus.ServiceBusReceivedMessage]) -> list[Any]:
    return [m.body for m in msgs]


def _props(msg: raybus.ServiceBusReceivedMessage) -> dict[str, Any]:
    return dict(msg.application_properties or {})


def _rule_names(admin: ServiceBusAdministrationClient, topic: str, sub: str) -> list[str]:
    return [r.name for r in admin.list_rules(topic, sub)]


# ------------------------------------------------------------------------------ default rule


def test_default_rule_gives_every_subscription_a_copy(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    subs = ["a", "b", "c"]
    for s in subs:
        admin.create_subscription(t, s)
    assert sorted(s.name for s in admin.list_subscriptions(t)) == subs
    (rule,) = admin.list_rules(t, "a")
    assert rule.name == "$Default" and isinstance(rule.filter, TrueRuleFilter)
    assert rule.action is None
    assert admin.get_rule(t, "a", "$default").name == "$Default"

    with client.get_topic_sender(t) as sender:
        sender.send_messages(
            [ServiceBusMessage(f"m{i}", application_properties={"i": i}) for i in range(5)]
        )
        sender.send_messages(ServiceBusMessage("single", subject="one"))
    for s in subs:
        assert _counts(admin, t, s) == (6, 0)
        got = _drain(client, t, s, 6)
        assert _bodies(got) == [f"m{i}" for i in range(5)] + ["single"]
        # A copy of the $Default rule (no action) carries no RuleName.
        assert [_props(m) for m in got[:5]] == [{"i": i} for i in range(5)]
        assert got[5].subject == "one"


async def test_default_rule_gives_every_subscription_a_copy_aio(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    await asyncio.gather(aadmin.create_subscription(t, "a"), aadmin.create_subscription(t, "b"))
    async with aclient.get_topic_sender(t) as sender:
        await asyncio.gather(
            *(
                sender.send_messages(ServiceBusMessage(f"m{i}", message_id=f"id{i}"))
                for i in range(8)
            )
        )
    for s in ("a", "b"):
        assert await _acounts(aadmin, t, s) == (8, 0)
        got = await _adrain(aclient, t, s, 8)
        assert sorted(m.message_id for m in got) == sorted(f"id{i}" for i in range(8))
        assert all(m.body == f"m{m.message_id[2:]}" for m in got)
        assert all(RULE_NAME not in _props(m) for m in got)


# ------------------------------------------------------------------------------ filters


def test_sql_filter_selects_matching_messages_only(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(
        t,
        "big-orders",
        default_rule=RuleProperties(
            "big", SqlRuleFilter("amount > @min AND sys.Label = 'order'", {"@min": 100})
        ),
    )
    admin.create_subscription(
        t, "colors", default_rule=RuleProperties("c", SqlRuleFilter("color IN ('red', 'blue')"))
    )
    assert _rule_names(admin, t, "big-orders") == ["big"]  # the explicit rule replaced $Default
    msgs = [
        ("o1", "order", {"amount": 150, "color": "red"}),  # both
        ("o2", "order", {"amount": 100}),  # not > 100
        ("o3", "invoice", {"amount": 500, "color": "green"}),  # wrong label
        ("o4", "order", {"amount": 101.5, "color": "blue"}),  # both (int vs double)
        ("o5", None, {"amount": 1000}),  # no label: NULL, unknown
        ("o6", "order", {"color": "Red"}),  # no amount: unknown; 'Red' is not 'red'
        ("o7", "order", {"amount": "200"}),  # a string vs a number: an evaluation error
    ]
    with client.get_topic_sender(t) as sender:
        sender.send_messages(
            [ServiceBusMessage(b, subject=s, application_properties=p) for b, s, p in msgs]
        )
    assert _counts(admin, t, "big-orders") == (2, 1)
    assert _bodies(_drain(client, t, "big-orders", 2)) == ["o1", "o4"]
    (dead,) = _drain(client, t, "big-orders", 1, sub_queue=DLQ)
    assert (dead.body, dead.dead_letter_reason) == ("o7", "TypeMismatch")
    assert _bodies(_drain(client, t, "colors", 2)) == ["o1", "o4"]


def test_correlation_filter_matches_exactly_and_case_sensitively(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(
        t,
        "eu-orders",
        default_rule=RuleProperties(
            "eu", CorrelationRuleFilter(label="Order", properties={"region": "EU", "prio": 1})
        ),
    )
    admin.create_subscription(
        t,
        "by-id",
        default_rule=RuleProperties(
            "ids", CorrelationRuleFilter(correlation_id="corr-1", content_type="application/json")
        ),
    )
    cases = [
        # (body, subject, properties, correlation id, content type)
        ("exact", "Order", {"region": "EU", "prio": 1}, None, None),
        ("more-props", "Order", {"region": "EU", "prio": 1, "x": 9}, "corr-1", None),
        ("label-case", "order", {"region": "EU", "prio": 1}, None, None),
        ("value-case", "Order", {"region": "eu", "prio": 1}, None, None),
        ("key-case", "Order", {"Region": "EU", "prio": 1}, None, None),
        ("missing-prop", "Order", {"region": "EU"}, None, None),
        ("prio-string", "Order", {"region": "EU", "prio": "1"}, None, None),
        ("prio-bool", "Order", {"region": "EU", "prio": True}, None, None),
        ("prio-double", "Order", {"region": "EU", "prio": 1.0}, None, None),
        ("no-label", None, {"region": "EU", "prio": 1}, None, None),
        ("id-match", None, {}, "corr-1", "application/json"),
        ("id-case", None, {}, "Corr-1", "application/json"),
        ("id-only", None, {}, "corr-1", None),
    ]
    with client.get_topic_sender(t) as sender:
        sender.send_messages(
            [
                ServiceBusMessage(
                    b, subject=s, application_properties=p, correlation_id=c, content_type=ct
                )
                for b, s, p, c, ct in cases
            ]
        )
    # 1 equals 1.0 by value; a bool never equals a number; everything else exact.
    assert _bodies(_drain(client, t, "eu-orders", 3)) == ["exact", "more-props", "prio-double"]
    assert _bodies(_drain(client, t, "by-id", 1)) == ["id-match"]


# ------------------------------------------------------------------------------ copy semantics


def test_rules_without_actions_are_ored_into_one_copy(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(t, "s", default_rule=RuleProperties("big", SqlRuleFilter("n > 5")))
    admin.create_rule(t, "s", "even", filter=SqlRuleFilter("n % 2 = 0"))
    admin.create_rule(t, "s", "seven", filter=CorrelationRuleFilter(properties={"n": 7}))
    admin.create_rule(t, "s", "all-true", filter=TrueRuleFilter())
    admin.delete_rule(t, "s", "all-true")
    assert _rule_names(admin, t, "s") == ["big", "even", "seven"]
    with client.get_topic_sender(t) as sender:
        sender.send_messages(
            [ServiceBusMessage(f"n{n}", application_properties={"n": n}) for n in range(10)]
        )
    # n=8 matches "big" and "even", n=7 "big" and "seven": still one copy each.
    got = _drain(client, t, "s", 7)
    assert _bodies(got) == ["n0", "n2", "n4", "n6", "n7", "n8", "n9"]
    assert all(_props(m) == {"n": int(m.body[1:])} for m in got)


async def test_each_matching_rule_with_an_action_gives_its_own_copy_aio(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    await aadmin.create_subscription(t, "s", default_rule=RuleProperties("a", TrueRuleFilter()))
    await aadmin.create_rule(t, "s", "b", filter=SqlRuleFilter("x > 0"))
    await aadmin.create_rule(t, "s", "c", filter=CorrelationRuleFilter(label="L"))
    await aadmin.create_rule(
        t, "s", "d", filter=SqlRuleFilter("x = 1"), action=SqlRuleAction("SET y = x + 1")
    )
    await aadmin.create_rule(
        t,
        "s",
        "e",
        filter=CorrelationRuleFilter(properties={"x": 1}),
        action=SqlRuleAction("SET sys.Label = 'changed'; REMOVE x; SET z = 'e'"),
    )
    await aadmin.create_rule(
        t, "s", "f", filter=FalseRuleFilter(), action=SqlRuleAction("SET never = 1")
    )
    rule = await aadmin.get_rule(t, "s", "e")
    assert rule.action is not None and "REMOVE x" in rule.action.sql_expression

    async with aclient.get_topic_sender(t) as sender:
        # x=1, subject L: a, b, c match (no action: one copy), d and e match with actions
        # (one copy each), f does not match -> 5 rules matching, 2 with actions -> 3 copies.
        await sender.send_messages(
            ServiceBusMessage("one", subject="L", application_properties={"x": 1})
        )
        # x=2: a and b match, without actions -> 1 copy.
        await sender.send_messages(
            ServiceBusMessage("two", subject="M", application_properties={"x": 2})
        )
    assert await _acounts(aadmin, t, "s") == (4, 0)
    got = await _adrain(aclient, t, "s", 4)
    copies = {(m.body, _props(m).get(RULE_NAME)): m for m in got}
    assert set(copies) == {("one", None), ("one", "d"), ("one", "e"), ("two", None)}
    plain = copies[("one", None)]
    assert (_props(plain), plain.subject) == ({"x": 1}, "L")
    d = copies[("one", "d")]
    assert (_props(d), d.subject) == ({"x": 1, "y": 2, RULE_NAME: "d"}, "L")
    e = copies[("one", "e")]
    assert (_props(e), e.subject) == ({"z": "e", RULE_NAME: "e"}, "changed")
    assert _props(copies[("two", None)]) == {"x": 2}


def test_subscription_without_rules_receives_nothing(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(t, "empty")
    admin.create_subscription(t, "control")
    admin.delete_rule(t, "empty", "$Default")
    assert admin.list_rules(t, "empty") == []
    with pytest.raises(MessagingEntityNotFoundError):
        admin.delete_rule(t, "empty", "$Default")
    with client.get_topic_sender(t) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
    assert _counts(admin, t, "empty") == (0, 0)
    assert _counts(admin, t, "control") == (3, 0)
    # A rule added later takes effect for messages published after it.
    admin.create_rule(t, "empty", "again", filter=SqlRuleFilter("1 = 1"))
    with client.get_topic_sender(t) as sender:
        sender.send_messages(ServiceBusMessage("after"))
    assert _bodies(_drain(client, t, "empty", 1)) == ["after"]
    assert _counts(admin, t, "control") == (4, 0)


def test_false_filter_receives_nothing(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(t, "never", default_rule=RuleProperties("no", FalseRuleFilter()))
    admin.create_rule(t, "never", "sql-false", filter=SqlRuleFilter("1 = 0"))
    with client.get_topic_sender(t) as sender:
        sender.send_messages(
            [ServiceBusMessage(f"m{i}", application_properties={"i": i}) for i in range(5)]
        )
    assert _counts(admin, t, "never") == (0, 0)
    (rule, _sql) = admin.list_rules(t, "never")
    assert isinstance(rule.filter, FalseRuleFilter)


def test_filter_evaluation_error_dead_letters_on_that_subscription_only(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    ratio = SqlRuleFilter("a / b > 1")
    admin.create_subscription(t, "dl", default_rule=RuleProperties("ratio", ratio))
    admin.create_subscription(
        t,
        "drop",
        default_rule=RuleProperties("ratio", ratio),
        dead_lettering_on_filter_evaluation_exceptions=False,
    )
    admin.create_subscription(t, "healthy")
    assert admin.get_subscription(t, "dl").dead_lettering_on_filter_evaluation_exceptions
    assert not admin.get_subscription(t, "drop").dead_lettering_on_filter_evaluation_exceptions
    with client.get_topic_sender(t) as sender:
        sender.send_messages(
            [
                ServiceBusMessage("good", application_properties={"a": 4, "b": 2}),
                ServiceBusMessage("zero", application_properties={"a": 1, "b": 0}),
                ServiceBusMessage("unknown", application_properties={"a": 1}),  # b NULL
                ServiceBusMessage("small", application_properties={"a": 1, "b": 1}),
            ]
        )
    assert _counts(admin, t, "dl") == (1, 1)
    assert _counts(admin, t, "drop") == (1, 0)
    assert _counts(admin, t, "healthy") == (4, 0)
    assert _bodies(_drain(client, t, "dl", 1)) == ["good"]
    (dead,) = _drain(client, t, "dl", 1, sub_queue=DLQ)
    assert dead.body == "zero"
    assert dead.dead_letter_reason == "DivideByZero"
    assert "ratio" in (dead.dead_letter_error_description or "")
    assert _props(dead) == {"a": 1, "b": 0}
    assert _bodies(_drain(client, t, "drop", 1)) == ["good"]
    assert _bodies(_drain(client, t, "healthy", 4)) == ["good", "zero", "unknown", "small"]


# ------------------------------------------------------------------------------ sessions


def test_session_subscription_hands_out_sessions_with_next_available(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(t, "sess", requires_session=True, lock_duration=timedelta(seconds=30))
    assert admin.get_subscription(t, "sess").requires_session
    with client.get_topic_sender(t) as sender:
        sender.send_messages(
            [ServiceBusMessage(f"{s}-{i}", session_id=s) for s in ("s1", "s2") for i in range(3)]
        )
        sender.send_messages(ServiceBusMessage("no-session"))
    assert sorted(client.list_subscription_sessions(t, "sess")) == ["s1", "s2"]
    seen: dict[str, list[str]] = {}
    for _ in range(2):
        with client.get_subscription_receiver(
            t, "sess", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        ) as receiver:
            assert receiver.session is not None
            sid = receiver.session.session_id
            assert sid is not None and sid not in seen
            receiver.session.set_state(f"done-{sid}")
            got: list[raybus.ServiceBusReceivedMessage] = []
            while len(got) < 3:
                batch = receiver.receive_messages(max_message_count=3, max_wait_time=5)
                assert batch
                for m in batch:
                    receiver.complete_message(m)
                got.extend(batch)
            seen[sid] = _bodies(got)
            assert receiver.session.get_state() == f"done-{sid}".encode()
    assert seen == {s: [f"{s}-{i}" for i in range(3)] for s in ("s1", "s2")}
    # A message without a session id cannot be delivered on a session subscription.
    (dead,) = _drain(client, t, "sess", 1, sub_queue=DLQ)
    assert (dead.body, dead.dead_letter_reason) == ("no-session", "Session ID is null")
    nothing = client.get_subscription_receiver(
        t, "sess", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=0.5
    )
    with pytest.raises(OperationTimeoutError):
        nothing.__enter__()
    nothing.close()


async def test_session_subscription_with_next_available_aio(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    await aadmin.create_subscription(
        t,
        "sess",
        requires_session=True,
        default_rule=RuleProperties("eu", CorrelationRuleFilter(properties={"region": "eu"})),
    )
    async with aclient.get_topic_sender(t) as sender:
        await sender.send_messages(
            [
                ServiceBusMessage(
                    f"{s}-{i}", session_id=s, application_properties={"region": region}
                )
                for s in ("a", "b")
                for i, region in enumerate(["eu", "us", "eu", "eu"])
            ]
        )
    assert sorted(await aclient.list_subscription_sessions(t, "sess")) == ["a", "b"]
    seen: dict[str, list[str]] = {}

    async def take_one() -> None:
        async with aclient.get_subscription_receiver(
            t, "sess", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        ) as receiver:
            assert receiver.session is not None
            sid = receiver.session.session_id
            got: list[Any] = []
            while len(got) < 3:
                batch = await receiver.receive_messages(3, max_wait_time=5)
                assert batch
                await receiver.complete_messages(batch)
                got.extend(batch)
            seen[sid] = _bodies(got)

    await asyncio.gather(take_one(), take_one())  # two receivers, two different sessions
    assert seen == {"a": ["a-0", "a-2", "a-3"], "b": ["b-0", "b-2", "b-3"]}
    assert await _acounts(aadmin, t, "sess") == (0, 0)


# ------------------------------------------------------------------------------ partitions


def test_partitioned_subscription_receives_all_its_copies(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(t, "parts", partition_count=2)
    admin.create_rule(
        t, "parts", "odd", filter=SqlRuleFilter("n % 2 = 1"), action=SqlRuleAction("SET odd = 1")
    )
    assert admin.get_subscription(t, "parts").partition_count == 2
    n = 40
    with client.get_topic_sender(t) as sender:
        # Keyed messages are placed by their key (so over both partitions); unkeyed ones go
        # to one partition per publish.
        sender.send_messages(
            [
                ServiceBusMessage(f"m{i}", partition_key=f"k{i}", application_properties={"n": i})
                for i in range(n // 2)
            ]
        )
        for i in range(n // 2, n, 5):
            sender.send_messages(
                [
                    ServiceBusMessage(f"m{j}", application_properties={"n": j})
                    for j in range(i, i + 5)
                ]
            )
    # Every message once ($Default), odd ones once more (the rule with an action).
    assert _counts(admin, t, "parts") == (n + n // 2, 0)
    got = _drain(client, t, "parts", n + n // 2)
    plain = [m for m in got if RULE_NAME not in _props(m)]
    odd = [m for m in got if RULE_NAME in _props(m)]
    assert sorted(_bodies(plain)) == sorted(f"m{i}" for i in range(n))
    assert sorted(_bodies(odd)) == sorted(f"m{i}" for i in range(1, n, 2))
    assert all(_props(m) == {"n": int(m.body[1:]), "odd": 1, RULE_NAME: "odd"} for m in odd)
    assert {m.partition_id for m in got} == {0, 1}
    # Within one partition, the copies of $Default keep their publish order.
    for pid in (0, 1):
        ns = [int(m.body[1:]) for m in plain if m.partition_id == pid]
        assert ns == sorted(ns)


# ------------------------------------------------------------------------------ fan-out


Props = dict[str, Any]
# A rule of the model: name, predicate, action (props, subject) -> (props, subject) or None.
ModelRule = tuple[str, Callable[[Props, Any], bool], Any]


def _set(**changes: Any) -> Callable[[Props, Any], tuple[Props, Any]]:
    def act(props: Props, subject: Any) -> tuple[Props, Any]:
        return {**props, **changes}, subject

    return act


def _fanout_model() -> list[tuple[str, list[RuleProperties], list[ModelRule]]]:
    """Ten subscriptions: their raybus rules and, written independently, what each rule
    means (predicate over (properties, subject), action)."""

    def relabel(props: Props, subject: Any) -> tuple[Props, Any]:
        return {k: v for k, v in props.items() if k != "region"}, "routed"

    def halve(props: Props, subject: Any) -> tuple[Props, Any]:
        return {**props, "half": int(props["amount"] / 2)}, subject

    return [
        (
            "all",
            [RuleProperties("$Default", TrueRuleFilter())],
            [("$Default", lambda p, s: True, None)],
        ),
        (
            "sql-amount",
            [RuleProperties("big", SqlRuleFilter("amount > 100"))],
            [("big", lambda p, s: p["amount"] > 100, None)],
        ),
        (
            "corr-label",
            [RuleProperties("orders", CorrelationRuleFilter(label="order"))],
            [("orders", lambda p, s: s == "order", None)],
        ),
        (
            "corr-props",
            [RuleProperties("eu1", CorrelationRuleFilter(properties={"region": "eu", "prio": 1}))],
            [("eu1", lambda p, s: p["region"] == "eu" and p["prio"] == 1, None)],
        ),
        (
            "ored",
            [
                RuleProperties("cheap", SqlRuleFilter("region IN ('eu', 'us') AND amount < 50")),
                RuleProperties("invoices", CorrelationRuleFilter(label="invoice")),
            ],
            [
                ("cheap", lambda p, s: p["region"] in ("eu", "us") and p["amount"] < 50, None),
                ("invoices", lambda p, s: s == "invoice", None),
            ],
        ),
        (
            "gold",
            [
                RuleProperties(
                    "gold", SqlRuleFilter("amount > 150"), SqlRuleAction("SET tier = 'gold'")
                ),
                RuleProperties("p3", SqlRuleFilter("prio = 3")),
            ],
            [
                ("gold", lambda p, s: p["amount"] > 150, _set(tier="gold")),
                ("p3", lambda p, s: p["prio"] == 3, None),
            ],
        ),
        (
            "relabel",
            [
                RuleProperties(
                    "route",
                    CorrelationRuleFilter(label="order"),
                    SqlRuleAction("SET sys.Label = 'routed'; REMOVE region"),
                ),
                RuleProperties("seen", TrueRuleFilter(), SqlRuleAction("SET seen = TRUE")),
            ],
            [
                ("route", lambda p, s: s == "order", relabel),
                ("seen", lambda p, s: True, _set(seen=True)),
            ],
        ),
        (
            "novip",
            [RuleProperties("novip", SqlRuleFilter("vip IS NULL OR vip = FALSE"))],
            [("novip", lambda p, s: p.get("vip") is not True, None)],
        ),
        (
            "corrid",
            [RuleProperties("c", SqlRuleFilter("sys.CorrelationId LIKE 'c-%'"))],
            # The model gets the correlation id through the properties' "cid" mirror.
            [("c", lambda p, s: str(p.get("cid", "")).startswith("c-"), None)],
        ),
        (
            "even",
            [
                RuleProperties("never", FalseRuleFilter()),
                RuleProperties(
                    "half", SqlRuleFilter("amount % 2 = 0"), SqlRuleAction("SET half = amount / 2")
                ),
            ],
            [
                ("never", lambda p, s: False, None),
                ("half", lambda p, s: p["amount"] % 2 == 0, halve),
            ],
        ),
    ]


def _expected_copies(
    model: list[ModelRule], props: Props, subject: Any
) -> list[tuple[str | None, Props, Any]]:
    """Service Bus copy semantics, computed from the model: one copy for the matching rules
    without actions together, one per matching rule with an action (stamped with RuleName)."""
    out: list[tuple[str | None, Props, Any]] = []
    matched = [(name, act) for name, pred, act in model if pred(props, subject)]
    if any(act is None for _n, act in matched):
        out.append((None, dict(props), subject))
    for name, act in matched:
        if act is not None:
            new_props, new_subject = act(dict(props), subject)
            out.append((name, {**new_props, RULE_NAME: name}, new_subject))
    return out


async def test_fan_out_to_ten_subscriptions_with_mixed_rules_and_actions_aio(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    subs = _fanout_model()
    assert len(subs) == 10

    async def create(name: str, rules: list[RuleProperties]) -> None:
        await aadmin.create_subscription(t, name, default_rule=rules[0])
        for rule in rules[1:]:
            await aadmin.create_rule(t, name, rule.name, filter=rule.filter, action=rule.action)

    await asyncio.gather(*(create(name, rules) for name, rules, _m in subs))

    rng = random.Random(20261130)
    messages: list[tuple[str, Any, Props, str | None]] = []
    for i in range(100):
        props: Props = {
            "i": i,
            "region": rng.choice(["eu", "us", "apac", "EU"]),
            "amount": rng.randrange(0, 200),
            "prio": rng.choice([1, 2, 3]),
        }
        vip = rng.choice([True, False, None])
        if vip is not None:
            props["vip"] = vip
        cid = rng.choice([f"c-{i}", "x", None])
        if cid is not None:
            props["cid"] = cid
        subject = rng.choice(["order", "invoice", "Order", None])
        messages.append((f"m{i}", subject, props, cid))

    # Four concurrent senders, lists of 5 (the client coalesces them into router calls).
    async def send(part: list[tuple[str, Any, Props, str | None]]) -> None:
        async with aclient.get_topic_sender(t) as sender:
            for k in range(0, len(part), 5):
                await sender.send_messages(
                    [
                        ServiceBusMessage(b, subject=s, application_properties=p, correlation_id=c)
                        for b, s, p, c in part[k : k + 5]
                    ]
                )

    await asyncio.gather(*(send(messages[j::4]) for j in range(4)))

    expected: dict[str, Counter[tuple[Any, ...]]] = {}
    for name, _rules, model in subs:
        want: Counter[tuple[Any, ...]] = Counter()
        for body, subject, props, _cid in messages:
            for rule, p, s in _expected_copies(model, props, subject):
                want[(body, rule, s, tuple(sorted(p.items())))] += 1
        expected[name] = want
    # Sanity of the data: every kind of subscription got something, and several got more
    # copies than messages (actions).
    assert all(sum(w.values()) > 0 for w in expected.values())
    assert sum(expected["relabel"].values()) > 100 and sum(expected["gold"].values()) > 0

    async def check(name: str) -> None:
        want = expected[name]
        assert await _acounts(aadmin, t, name) == (sum(want.values()), 0), name
        got = await _adrain(aclient, t, name, sum(want.values()))
        have = Counter(
            (m.body, _props(m).get(RULE_NAME), m.subject, tuple(sorted(_props(m).items())))
            for m in got
        )
        assert have == want, name

    await asyncio.gather(*(check(name) for name, _r, _m in subs))
    runtime = await aadmin.get_topic_runtime_properties(t)
    assert runtime.subscription_count == 10


# ------------------------------------------------------------------------------ status, errors


def test_send_to_disabled_topic_raises_and_stores_nothing(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    t = _name()
    admin.create_topic(t)
    admin.create_subscription(t, "s")
    for status in (EntityStatus.DISABLED, EntityStatus.SEND_DISABLED):
        admin.update_topic(admin.get_topic(t), status=status)
        assert admin.get_topic(t).status is status
        with client.get_topic_sender(t) as sender, pytest.raises(MessagingEntityDisabledError):
            sender.send_messages([ServiceBusMessage("refused"), ServiceBusMessage("too")])
        assert _counts(admin, t, "s") == (0, 0)
    admin.update_topic(admin.get_topic(t), status=EntityStatus.ACTIVE)
    with client.get_topic_sender(t) as sender:
        sender.send_messages(ServiceBusMessage("accepted"))
    assert _bodies(_drain(client, t, "s", 1)) == ["accepted"]


def test_bad_sql_filter_raises_filter_syntax_error_and_changes_nothing(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(t, "s")
    with pytest.raises(FilterSyntaxError) as info:
        admin.create_rule(t, "s", "bad", filter=SqlRuleFilter("amount > "))
    assert info.value.position == len("amount > ")
    with pytest.raises(FilterSyntaxError):
        admin.create_rule(
            t, "s", "bad-action", filter=TrueRuleFilter(), action=SqlRuleAction("SET = 1")
        )
    with pytest.raises(FilterSyntaxError):
        admin.create_subscription(
            t, "never", default_rule=RuleProperties("x", SqlRuleFilter("a = = 1"))
        )
    assert _rule_names(admin, t, "s") == ["$Default"]
    assert [s.name for s in admin.list_subscriptions(t)] == ["s"]
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_rule(t, "s", "bad")
    with client.get_topic_sender(t) as sender:
        sender.send_messages(ServiceBusMessage("still routed", application_properties={"a": 1}))
    (only,) = _drain(client, t, "s", 1)
    assert (only.body, _props(only)) == ("still routed", {"a": 1})


def test_duplicate_rule_name_raises_already_exists(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(t, "s")
    admin.create_rule(
        t, "s", "r1", filter=SqlRuleFilter("x = 1"), action=SqlRuleAction("SET y = 1")
    )
    for name in ("r1", "R1", "$Default", "$DEFAULT"):
        with pytest.raises(MessagingEntityAlreadyExistsError):
            admin.create_rule(t, "s", name, filter=FalseRuleFilter())
    with pytest.raises(MessagingEntityAlreadyExistsError):
        admin.create_subscription(t, "S")  # subscription names are case-insensitive too
    assert _rule_names(admin, t, "s") == ["$Default", "r1"]
    rule = admin.get_rule(t, "s", "r1")
    assert isinstance(rule.filter, SqlRuleFilter) and rule.filter.sql_expression == "x = 1"
    # The original r1 (with its action) still routes.
    with client.get_topic_sender(t) as sender:
        sender.send_messages(ServiceBusMessage("m", application_properties={"x": 1}))
    got = _drain(client, t, "s", 2)
    assert sorted((_props(m).get(RULE_NAME) or "") for m in got) == ["", "r1"]


# ------------------------------------------------------------------------------ deletion


def test_deleting_a_subscription_stops_its_copies(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(t, "gone")
    admin.create_subscription(t, "kept")
    with client.get_topic_sender(t) as sender:
        sender.send_messages([ServiceBusMessage(f"before{i}") for i in range(3)])
        admin.delete_subscription(t, "gone")
        with pytest.raises(MessagingEntityNotFoundError):
            admin.get_subscription(t, "gone")
        with pytest.raises(MessagingEntityNotFoundError):
            admin.get_subscription_runtime_properties(t, "gone")
        assert [s.name for s in admin.list_subscriptions(t)] == ["kept"]
        # The same sender keeps publishing, to the remaining subscription only.
        sender.send_messages([ServiceBusMessage(f"after{i}") for i in range(2)])
        assert admin.get_topic_runtime_properties(t).subscription_count == 1
        # Created again under the same name: a new, empty subscription.
        admin.create_subscription(t, "gone")
        assert _counts(admin, t, "gone") == (0, 0)
        sender.send_messages(ServiceBusMessage("new"))
    assert _bodies(_drain(client, t, "gone", 1)) == ["new"]
    assert _bodies(_drain(client, t, "kept", 6)) == [
        "before0",
        "before1",
        "before2",
        "after0",
        "after1",
        "new",
    ]


def test_delete_topic_removes_its_subscriptions(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    t = _name()
    admin.create_topic(t)
    admin.create_subscription(t, "a", default_rule=RuleProperties("x", SqlRuleFilter("x = 1")))
    admin.create_rule(t, "a", "y", filter=TrueRuleFilter(), action=SqlRuleAction("SET y = 1"))
    with client.get_topic_sender(t) as sender:
        sender.send_messages(ServiceBusMessage("old", application_properties={"x": 1}))
    assert _counts(admin, t, "a") == (2, 0)
    registry = client._aio._conn.registry
    _entry, router = ray.get(registry.get_topic.remote(t))
    part = ray.get(registry.route.remote(f"{t}/Subscriptions/a")).partitions[0]
    assert ray.get(router.stats.remote())["subscriptions"] == 1

    admin.delete_topic(t)
    assert t not in [x.name for x in admin.list_topics()]
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_topic(t)
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_subscription(t, "a")
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_subscription_runtime_properties(t, "a")
    with pytest.raises(MessagingEntityNotFoundError):
        admin.list_subscriptions(t)
    with client.get_topic_sender(t) as sender, pytest.raises(MessagingEntityNotFoundError):
        sender.send_messages(ServiceBusMessage("nowhere"))
    # Their actors are gone (router and subscription partitions: no processes left behind).
    for actor in (router, part):
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.__ray_ready__.remote(), timeout=30)

    # The names can be used again, for new and empty entities (with the $Default rule).
    admin.create_topic(t)
    assert admin.list_subscriptions(t) == []
    admin.create_subscription(t, "a")
    assert _counts(admin, t, "a") == (0, 0)
    assert _rule_names(admin, t, "a") == ["$Default"]
    with client.get_topic_sender(t) as sender:
        sender.send_messages(ServiceBusMessage("new"))
    assert _bodies(_drain(client, t, "a", 1)) == ["new"]


# ------------------------------------------------------------------------------ counts


def test_topic_and_subscription_runtime_counts(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(t, "all")
    admin.create_subscription(
        t, "x", default_rule=RuleProperties("x", CorrelationRuleFilter(label="x"))
    )
    empty = admin.get_topic_runtime_properties(t)
    assert (empty.name, empty.subscription_count, empty.size_in_bytes) == (t, 2, 0)
    assert empty.scheduled_message_count == 0
    assert empty.created_at_utc is not None

    later = datetime.now(timezone.utc) + timedelta(hours=1)
    with client.get_topic_sender(t) as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b", subject="x")])
        sender.send_messages(ServiceBusMessage("c", subject="x"))
        assert (
            sender.schedule_messages([ServiceBusMessage("s1"), ServiceBusMessage("s2")], later)
            == []
        )
    runtime = admin.get_topic_runtime_properties(t)
    assert runtime.subscription_count == 2
    assert runtime.scheduled_message_count == 2  # both on "all" only
    assert runtime.size_in_bytes > 0
    all_rt = admin.get_subscription_runtime_properties(t, "all")
    assert (all_rt.topic_name, all_rt.name) == (t, "all")
    assert (all_rt.active_message_count, all_rt.dead_letter_message_count) == (3, 0)
    assert all_rt.total_message_count == 5  # 3 active + 2 scheduled
    x_rt = admin.get_subscription_runtime_properties(t, "x")
    assert (x_rt.active_message_count, x_rt.total_message_count) == (2, 2)

    with client.get_subscription_receiver(t, "x", max_wait_time=5) as receiver:
        (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.dead_letter_message(first, reason="test", error_description="counted")
    x_rt = admin.get_subscription_runtime_properties(t, "x")
    assert (x_rt.active_message_count, x_rt.dead_letter_message_count) == (1, 1)
    assert x_rt.total_message_count == 2
    before = runtime.size_in_bytes

    _drain(client, t, "all", 3)
    _drain(client, t, "x", 1)
    _drain(client, t, "x", 1, sub_queue=DLQ)
    drained = admin.get_topic_runtime_properties(t)
    assert drained.scheduled_message_count == 2
    assert 0 < drained.size_in_bytes < before
    admin.delete_subscription(t, "x")
    assert admin.get_topic_runtime_properties(t).subscription_count == 1


# ------------------------------------------------------------------------------ router restart


def test_killed_router_comes_back_and_routes_with_its_configuration(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    t = _name()
    admin.create_topic(t)
    admin.create_subscription(t, "all")
    admin.create_subscription(
        t, "even", default_rule=RuleProperties("e", SqlRuleFilter("n % 2 = 0"))
    )
    _entry, router = ray.get(client._aio._conn.registry.get_topic.remote(t))

    acknowledged: list[int] = []
    failed: list[int] = []
    with client.get_topic_sender(t) as sender:
        for n in range(10):
            sender.send_messages(ServiceBusMessage(f"m{n}", application_properties={"n": n}))
            acknowledged.append(n)
        assert ray.get(router.stats.remote())["published"] == 10

        ray.kill(router, no_restart=False)
        # Keep publishing while it restarts: a send may fail while the router is down, but
        # every send that returns must have stored its copies under the topic's rules.
        n = 10
        deadline = time.monotonic() + 60
        while len([a for a in acknowledged if a >= 10]) < 20:
            assert time.monotonic() < deadline, f"sends kept failing: {failed}"
            try:
                sender.send_messages(ServiceBusMessage(f"m{n}", application_properties={"n": n}))
                acknowledged.append(n)
            except ServiceBusError:
                failed.append(n)
                time.sleep(0.1)
            n += 1
    stats = ray.get(router.stats.remote())
    assert stats["subscriptions"] == 2
    assert stats["published"] <= n - 10  # a new instance: it only saw sends after the kill

    all_got = [int(m.body[1:]) for m in _drain(client, t, "all", len(acknowledged))]
    even_want = [a for a in acknowledged if a % 2 == 0]
    even_got = [int(m.body[1:]) for m in _drain(client, t, "even", len(even_want))]
    assert all_got == acknowledged
    assert even_got == even_want

    # Its configuration follows later changes too: a new subscription gets copies.
    admin.create_subscription(t, "late")
    with client.get_topic_sender(t) as sender:
        sender.send_messages(ServiceBusMessage("m1000", application_properties={"n": 1000}))
    assert _bodies(_drain(client, t, "late", 1)) == ["m1000"]
    assert _bodies(_drain(client, t, "even", 1)) == ["m1000"]


# ------------------------------------------------------------------------------ atomicity


def test_publish_is_all_or_nothing_when_one_subscription_is_full(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    t = _name()
    admin.create_topic(t, max_size_in_megabytes=1)
    admin.create_subscription(
        t, "full", default_rule=RuleProperties("f", SqlRuleFilter("sys.Label IN ('big', 'both')"))
    )
    admin.create_subscription(
        t, "healthy", default_rule=RuleProperties("h", CorrelationRuleFilter(label="both"))
    )
    body = b"x" * 200_000
    filled = 0
    with client.get_topic_sender(t) as sender:
        # Only "full" gets the big ones: fill it until its store refuses (one partition: the
        # plain send's own quota error).
        with pytest.raises(ServiceBusQuotaExceededError):
            for _ in range(10):
                sender.send_messages(ServiceBusMessage(body, subject="big"))
                filled += 1
        assert 3 <= filled < 10
        assert _counts(admin, t, "full") == (filled, 0)

        # A publish whose copies go to both: "full" refuses, so "healthy" gets none either.
        with pytest.raises(ServiceBusError) as info:
            sender.send_messages(ServiceBusMessage(body, subject="both"))
        assert _counts(admin, t, "healthy") == (0, 0)
        assert _counts(admin, t, "full") == (filled, 0)
        # The caller sees the cause, as a send to a full queue does.
        assert isinstance(info.value, ServiceBusQuotaExceededError), repr(info.value)

    # Room again: the same publish reaches both.
    _drain(client, t, "full", filled)
    with client.get_topic_sender(t) as sender:
        sender.send_messages(ServiceBusMessage(body, subject="both"))
    assert _counts(admin, t, "healthy") == (1, 0)
    assert _counts(admin, t, "full") == (1, 0)


# ------------------------------------------------------------------------------ receive-only


def test_a_subscription_cannot_be_sent_to_directly(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    """A subscription gets messages only through its topic's rules (in Service Bus a
    subscription is a receive-only entity): a sender aimed at its path is refused and stores
    nothing."""
    t = topic
    admin.create_subscription(t, "s", default_rule=RuleProperties("f", FalseRuleFilter()))
    path = f"{t}/Subscriptions/s"
    with client.get_queue_sender(path) as sender:
        try:
            sender.send_messages(ServiceBusMessage("bypassed the rules"))
        except ServiceBusError:
            pass
    assert _counts(admin, t, "s") == (0, 0), "a message reached a subscription past its rules"


def test_a_topic_is_not_a_queue_for_receivers_and_queue_admin(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = f"notq-{uuid.uuid4().hex[:6]}"
    admin.create_topic(name)
    try:
        with client.get_queue_receiver(name, max_wait_time=1) as receiver:
            with pytest.raises(InvalidArgumentError):
                receiver.receive_messages(1)
            with pytest.raises(InvalidArgumentError):
                receiver.peek_messages(1)
        with pytest.raises(MessagingEntityNotFoundError):
            admin.get_queue(name)
        with pytest.raises(MessagingEntityNotFoundError):
            admin.get_queue_runtime_properties(name)
    finally:
        admin.delete_topic(name)


def test_sends_to_a_topic_join_a_transaction(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    topic, src = f"txt-{uuid.uuid4().hex[:6]}", f"txq-{uuid.uuid4().hex[:6]}"
    admin.create_topic(topic)
    admin.create_subscription(topic, "all")
    admin.create_subscription(
        topic, "red", default_rule=RuleProperties("red", SqlRuleFilter("color = 'red'"))
    )
    admin.create_queue(src)
    try:
        with client.get_queue_sender(src) as sender:
            sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])

        def counts() -> tuple[int, int, int]:
            return (
                admin.get_queue_runtime_properties(src).active_message_count,
                admin.get_subscription_runtime_properties(topic, "all").active_message_count,
                admin.get_subscription_runtime_properties(topic, "red").active_message_count,
            )

        with (
            client.get_queue_receiver(src, max_wait_time=2) as receiver,
            client.get_topic_sender(topic) as publisher,
        ):
            first, second = receiver.receive_messages(2)
            with pytest.raises(RuntimeError), client.transaction() as txn:
                receiver.complete_message(first, transaction=txn)
                publisher.send_messages(
                    ServiceBusMessage("x", application_properties={"color": "red"}),
                    transaction=txn,
                )
                raise RuntimeError("roll back")
            assert counts() == (2, 0, 0)
            with client.transaction() as txn:
                receiver.complete_message(first, transaction=txn)
                receiver.complete_message(second, transaction=txn)
                publisher.send_messages(
                    [
                        ServiceBusMessage("r", application_properties={"color": "red"}),
                        ServiceBusMessage("g", application_properties={"color": "green"}),
                    ],
                    transaction=txn,
                )
                assert counts() == (2, 0, 0)  # nothing before commit
        assert counts() == (0, 2, 1)
    finally:
        admin.delete_topic(topic)
        admin.delete_queue(src)


def test_publishing_goes_on_while_a_subscription_changes_its_partition_count(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    """The router's cached map goes stale when a subscription grows: a partition that gave a
    slot away refuses keys it no longer owns (PartitionMovedError, inside the router's
    two-phase publish), and the router refreshes its routes and sends again. Every keyed copy
    arrives exactly once."""
    admin.create_subscription(topic, "grows", partition_count=1)
    admin.create_subscription(topic, "fixed")
    n = 300
    with client.get_topic_sender(topic) as sender:
        for i in range(0, n, 10):
            if i == 100:
                sub = admin.get_subscription(topic, "grows")
                admin.update_subscription(topic, sub, partition_count=3)
            sender.send_messages(
                [ServiceBusMessage(f"m{j}", partition_key=f"k{j % 37}") for j in range(i, i + 10)]
            )
    for sub in ("grows", "fixed"):
        got = _drain(client, topic, sub, n, timeout=60)
        assert sorted(_bodies(got)) == sorted(f"m{i}" for i in range(n)), sub
    assert admin.get_subscription(topic, "grows").partition_count == 3
