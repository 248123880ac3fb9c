"""Topic subscriptions with sessions and partitions, and a fan-out to ten subscriptions
with mixed rules checked copy by copy against an independent model (real local Ray).
Fixtures: ``topics_support``.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import topics_support
from topics_support import DLQ, RULE_NAME, _acounts, _adrain, _bodies, _counts, _drain, _props

import raybus
from raybus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, aio
from raybus.exceptions import OperationTimeoutError
from raybus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleProperties,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

namespace = topics_support.namespace
_delete_topics = topics_support._delete_topics
shared_topic = topics_support.shared_topic
topic = topics_support.topic


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
