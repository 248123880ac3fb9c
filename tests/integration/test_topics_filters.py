"""Topic rules against a real local Ray cluster: the ``$Default`` rule gives every
subscription a copy; SQL and correlation filters select (correlation: exact and
case-sensitive); rules without actions are OR-ed into one copy; each matching rule with an
action gives its own copy carrying ``RuleName`` and the action's changes; no rules or a false
filter receive nothing; a filter evaluation error dead-letters the message on that
subscription only (or drops it there). Fixtures: ``topics_support``.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import topics_support
from topics_support import (
    DLQ,
    RULE_NAME,
    _acounts,
    _adrain,
    _bodies,
    _counts,
    _drain,
    _props,
    _rule_names,
)

import raybus
from raybus import ServiceBusMessage, aio
from raybus.exceptions import (
    FilterSyntaxError,
    InvalidArgumentError,
    MessagingEntityNotFoundError,
)
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


def test_with_duplicate_detection_each_rules_copy_arrives_once(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    # Service Bus detects duplicates at the topic, before the rules: each matching rule with
    # an action still gives its copy, an action that sets the message id makes no duplicates
    # of other messages, and a message published again adds nothing.
    t = f"dedup-{uuid.uuid4().hex[:8]}"
    admin.create_topic(t, requires_duplicate_detection=True)
    try:
        admin.create_subscription(t, "s", default_rule=RuleProperties("a", TrueRuleFilter()))
        admin.create_rule(t, "s", "d", filter=TrueRuleFilter(), action=SqlRuleAction("SET y = 1"))
        admin.create_rule(
            t, "s", "e", filter=TrueRuleFilter(), action=SqlRuleAction("SET sys.MessageId = 'x'")
        )
        with client.get_topic_sender(t) as sender:
            for _ in range(2):
                sender.send_messages([ServiceBusMessage(b, message_id=b) for b in ("one", "two")])
        assert _counts(admin, t, "s") == (6, 0)
        got = _drain(client, t, "s", 6)
        assert sorted((str(m.body), str(_props(m).get(RULE_NAME, ""))) for m in got) == [
            ("one", ""),
            ("one", "d"),
            ("one", "e"),
            ("two", ""),
            ("two", "d"),
            ("two", "e"),
        ]
    finally:
        admin.delete_topic(t)


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
    assert _props(dead) == {
        "a": 1,
        "b": 0,
        "DeadLetterReason": "DivideByZero",
        "DeadLetterErrorDescription": dead.dead_letter_error_description,
    }
    assert _bodies(_drain(client, t, "drop", 1)) == ["good"]
    assert _bodies(_drain(client, t, "healthy", 4)) == ["good", "zero", "unknown", "small"]


# ------------------------------------------------------------------------------ update_rule


def test_update_rule_replaces_a_rules_filter_and_action_in_place(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    topic: str,
) -> None:
    t = topic
    admin.create_subscription(t, "s")
    admin.delete_rule(t, "s", "$Default")
    admin.create_rule(t, "s", "first", filter=SqlRuleFilter("n > 5"))
    admin.create_rule(t, "s", "big", filter=SqlRuleFilter("n > 100"))
    before = admin.get_rule(t, "s", "big")
    stored = admin.update_rule(
        t,
        "s",
        before,
        filter=SqlRuleFilter("n < 5"),
        action=SqlRuleAction("SET sys.Label = 'small'"),
    )
    after = admin.get_rule(t, "s", "BIG")  # names are case-insensitive
    assert stored == after  # what update_rule returns is what is stored
    assert after.filter == SqlRuleFilter("n < 5") and after.created_at_utc == before.created_at_utc
    assert _rule_names(admin, t, "s") == ["first", "big"]  # its place kept
    with client.get_topic_sender(t) as sender:
        sender.send_messages(
            [ServiceBusMessage(f"n{n}", application_properties={"n": n}) for n in (3, 7, 200)]
        )
    # n3 matches only the updated rule (before it, no rule took it); n7 and n200 "first".
    got = _drain(client, t, "s", 3)
    assert {m.body: m.subject for m in got} == {"n3": "small", "n7": None, "n200": None}


def test_update_rule_refuses_bad_input_and_changes_nothing(
    admin: ServiceBusAdministrationClient, topic: str
) -> None:
    t = topic
    admin.create_subscription(t, "s")
    rule = admin.get_rule(t, "s", "$Default")
    with pytest.raises(InvalidArgumentError, match="unknown option"):
        admin.update_rule(t, "s", rule, name="renamed")
    with pytest.raises(FilterSyntaxError):
        admin.update_rule(t, "s", rule, filter=SqlRuleFilter("n >"))
    with pytest.raises(InvalidArgumentError, match="RuleProperties"):
        admin.update_rule(t, "s", "$Default")  # type: ignore[arg-type]
    with pytest.raises(MessagingEntityNotFoundError, match="no rule named 'other'"):
        admin.update_rule(t, "s", RuleProperties("other", TrueRuleFilter()))
    assert admin.list_rules(t, "s") == [rule]


async def test_aio_update_rule_and_the_runtime_property_lists(
    aclient: aio.ServiceBusClient, aadmin: aio.ServiceBusAdministrationClient, topic: str
) -> None:
    t = topic
    for sub in ("a", "b"):
        await aadmin.create_subscription(t, sub)
    rule = await aadmin.get_rule(t, "a", "$Default")
    await aadmin.update_rule(t, "a", rule, filter=FalseRuleFilter())
    async with aclient.get_topic_sender(t) as sender:
        await sender.send_messages(ServiceBusMessage("only b"))
    subs = await aadmin.list_subscriptions_runtime_properties(t)
    assert [(s.name, s.active_message_count) for s in subs] == [("a", 0), ("b", 1)]
    topics = {p.name: p for p in await aadmin.list_topics_runtime_properties()}
    assert topics[t].subscription_count == 2
    # A subscription deleted between the list and its counts is left out, not an error.
    listed = await aadmin.list_subscriptions(t)
    await aadmin.delete_subscription(t, "a")

    async def stale_list(topic_name: str) -> list[Any]:
        return listed

    aadmin.list_subscriptions = stale_list  # type: ignore[method-assign]
    subs = await aadmin.list_subscriptions_runtime_properties(t)
    assert [(s.name, s.active_message_count) for s in subs] == [("b", 1)]
