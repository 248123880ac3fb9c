"""``ServiceBusRuleManager`` (``client.get_rule_manager``): a subscription's rules changed and
listed with Listen rights, as .NET's rule manager does, where the administration client
needs Manage; the topic's router follows every change."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import raybus
from raybus import ServiceBusMessage, aio
from raybus.auth import SharedAccessKeyCredential
from raybus.exceptions import (
    FilterSyntaxError,
    InvalidArgumentError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityNotFoundError,
    ServiceBusAuthorizationError,
)
from raybus.management import (
    CorrelationRuleFilter,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

ROOT_KEY = "R" * 44


@pytest.fixture
def closed(namespace: str) -> Iterator[ServiceBusAdministrationClient]:
    """A namespace closed by a Manage rule, with topic ``t`` and subscriptions ``s`` and
    ``all``; yields the Manage admin client."""
    ServiceBusAdministrationClient(namespace).create_authorization_rule(
        "root", ["Manage"], primary_key=ROOT_KEY
    )
    root = ServiceBusAdministrationClient(
        namespace, credential=SharedAccessKeyCredential("root", ROOT_KEY)
    )
    root.create_topic("t")
    root.create_subscription("t", "s")
    root.create_subscription("t", "all")
    yield root


def _key(admin: ServiceBusAdministrationClient, rights: str) -> SharedAccessKeyCredential:
    """A key with ``rights`` on topic ``t``."""
    rule = admin.create_authorization_rule(f"t-{rights.lower()}", [rights], entity="t")
    return SharedAccessKeyCredential(rule.key_name, rule.primary_key)


def _client(namespace: str, admin: ServiceBusAdministrationClient, rights: str) -> Any:
    return raybus.ServiceBusClient(namespace, credential=_key(admin, rights))


def _drain(client: raybus.ServiceBusClient, sub: str) -> list[ServiceBusMessage]:
    got = []
    with client.get_subscription_receiver("t", sub, max_wait_time=2) as receiver:
        while batch := receiver.receive_messages(max_message_count=50, max_wait_time=2):
            for m in batch:
                receiver.complete_message(m)
            got += batch
    return got


def test_a_listen_right_changes_the_rules_and_the_router_follows(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    listen = _key(closed, "Listen")
    listener = raybus.ServiceBusClient(namespace, credential=listen)
    with listener, listener.get_rule_manager("t", "s") as rules:
        assert rules.subscription_path == "t/Subscriptions/s"
        before = datetime.now(timezone.utc) - timedelta(seconds=5)
        made = rules.create_rule(
            "big", filter=SqlRuleFilter("n > 5"), action=SqlRuleAction("SET tagged = 1")
        )
        assert made.created_at_utc is not None and made.created_at_utc >= before
        rules.create_rule("red", filter=CorrelationRuleFilter(properties={"colour": "red"}))
        rules.delete_rule("$Default")
        listed = rules.list_rules()
        assert [(r.name, r.filter, r.action) for r in listed] == [
            ("big", SqlRuleFilter("n > 5"), SqlRuleAction("SET tagged = 1")),
            ("red", CorrelationRuleFilter(properties={"colour": "red"}), None),
        ]
        # The administration client, which needs Manage, sees the same rules.
        assert [r.name for r in closed.list_rules("t", "s")] == ["big", "red"]
        # With Listen only, the administration client's rule calls are refused.
        listen_admin = ServiceBusAdministrationClient(namespace, credential=listen)
        with pytest.raises(ServiceBusAuthorizationError):
            listen_admin.create_rule("t", "s", "nope")
    sender = _client(namespace, closed, "Send")
    with sender:
        sender.get_topic_sender("t").send_messages(
            [
                ServiceBusMessage(f"m{n}", application_properties={"n": n, "colour": colour})
                for n, colour in [(1, "blue"), (2, "red"), (7, "blue"), (9, "red")]
            ]
        )
        with pytest.raises(ServiceBusAuthorizationError):  # Send is not enough
            sender.get_rule_manager("t", "s").create_rule("mine")
    with _client(namespace, closed, "Manage") as reader:
        got = _drain(reader, "s")
        # m9 matches both rules: one copy per rule with an action, one for those without.
        tagged = sorted((str(m), m.application_properties.get("tagged") or 0) for m in got)
        assert tagged == [("m2", 0), ("m7", 1), ("m9", 0), ("m9", 1)]
        assert len(_drain(reader, "all")) == 4  # the other subscription kept its $Default
    assert [r.name for r in closed.list_rules("t", "s")] == ["big", "red"]


async def test_bad_rule_changes_are_refused_by_name_and_change_nothing(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    rule = closed.create_authorization_rule("t-listen", ["Listen"], entity="t")
    client = aio.ServiceBusClient(
        namespace, credential=SharedAccessKeyCredential(rule.key_name, rule.primary_key)
    )
    async with client, client.get_rule_manager("t", "s") as rules:
        await rules.create_rule("only", filter=TrueRuleFilter())
        with pytest.raises(MessagingEntityAlreadyExistsError):
            await rules.create_rule("ONLY")  # names are case-insensitive
        with pytest.raises(FilterSyntaxError):
            await rules.create_rule("bad", filter=SqlRuleFilter("n >"))
        with pytest.raises(InvalidArgumentError) as err:
            await rules.create_rule("x" * 51)
        assert err.value.argument == "name"
        with pytest.raises(MessagingEntityNotFoundError):
            await rules.delete_rule("missing")
        with pytest.raises(InvalidArgumentError):
            await rules.delete_rule("")
        assert [r.name async for r in rules.list_rules()] == ["$Default", "only"]
        with pytest.raises(MessagingEntityNotFoundError):
            await client.get_rule_manager("t", "nosuch").list_rules()
    with pytest.raises(InvalidArgumentError, match="closed"):
        await rules.list_rules()
    assert [r.name for r in closed.list_rules("t", "s")] == ["$Default", "only"]
