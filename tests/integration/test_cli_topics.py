"""The ``raybus`` topic, subscription and rule commands, and messages through subscriptions.

As in ``test_cli.py``, commands run in this process through typer's ``CliRunner`` against the
session's Ray cluster, in one raybus namespace for the module. Every topic has a router actor
and every subscription partition is an actor (a worker process, ~0.8 s to start), so the tests
keep to three topics and four subscriptions in all; the topics a test created are deleted after
it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cli_support import cli_runner, error_line, json_lines

from raybus.exceptions import ServiceBusError
from raybus.management import ServiceBusAdministrationClient


@pytest.fixture
def namespace(module_namespace: str) -> str:
    return module_namespace


@pytest.fixture
def admin(namespace: str) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient(namespace)


@pytest.fixture(autouse=True)
def _delete_topics(admin: ServiceBusAdministrationClient) -> Iterator[None]:
    """Delete the topics a test created (the shared fixtures only know about queues)."""
    yield
    try:
        topics = admin.list_topics()
    except ServiceBusError:
        return
    for topic in topics:
        try:
            admin.delete_topic(topic.name)
        except ServiceBusError:
            pass


@pytest.fixture
def cli(namespace: str) -> Any:
    """``cli(*args, input=None, code=0)``: run ``raybus --namespace NS *args``, check the exit
    code, return the result. Tables are rendered 200 columns wide (no wrapped cells)."""
    return cli_runner(namespace, env={"COLUMNS": "200"})


def _name(prefix: str = "cli") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_topic_create_show_update_list_delete(cli: Any) -> None:
    t = _name("topic")
    created = json_lines(
        cli(
            "topic",
            "create",
            t,
            "--ttl",
            "1h",
            "--dedup",
            "--dedup-window",
            "00:01:00",
            "--max-size",
            "100",
            "--ordering",
            "--user-metadata",
            "orders",
            "--json",
        )
    )[0]
    assert created["name"] == t
    assert created["default_message_time_to_live"] == 3600.0
    assert created["requires_duplicate_detection"] is True
    assert created["duplicate_detection_history_time_window"] == 60.0
    assert created["max_size_in_megabytes"] == 100
    assert created["support_ordering"] is True and created["user_metadata"] == "orders"
    assert created["auto_delete_on_idle"] is None  # never

    shown = json_lines(cli("topic", "show", t, "--json"))[0]
    assert shown["runtime"]["subscription_count"] == 0
    assert "support_ordering" in cli("topic", "show", t).stdout  # the table

    updated = json_lines(
        cli("topic", "update", t, "--max-size", "200", "--status", "senddisabled", "--json")
    )[0]
    assert updated["max_size_in_megabytes"] == 200 and updated["status"] == "SendDisabled"
    assert updated["default_message_time_to_live"] == 3600.0  # unchanged
    line = error_line(cli("topic", "update", t, "--no-dedup", code=2), "InvalidArgumentError")
    assert "requires_duplicate_detection" in line

    assert t in {row["name"] for row in json_lines(cli("topic", "list", "--json"))}
    assert t in cli("topic", "list").stdout
    error_line(cli("topic", "create", t, code=1), "MessagingEntityAlreadyExistsError")
    error_line(
        cli("queue", "create", t, code=1), "MessagingEntityAlreadyExistsError"
    )  # one name set
    assert "not a duration" in cli("topic", "create", _name(), "--ttl", "soon", code=2).stderr

    assert f"deleted topic {t}" in cli("topic", "delete", t).stderr
    error_line(cli("topic", "show", t, code=3), "MessagingEntityNotFoundError")
    error_line(cli("subscription", "list", t, code=3), "MessagingEntityNotFoundError")


def test_subscriptions_rules_and_messages_through_them(cli: Any) -> None:
    t = _name("topic")
    cli("topic", "create", t)
    everything = json_lines(cli("subscription", "create", t, "all", "--json"))[0]
    assert everything["topic_name"] == t and everything["name"] == "all"
    assert everything["rules"] == [
        {
            "name": "$Default",
            "filter": {"type": "true", "sql_expression": "1=1"},
            "action": None,
            "created_at_utc": None,
        }
    ]
    big = json_lines(
        cli(
            "subscription",
            "create",
            t,
            "big",
            "--sql",
            "amount > @min",
            "--param",
            "min=100",
            "--max-delivery-count",
            "3",
            "--json",
        )
    )[0]
    assert big["max_delivery_count"] == 3
    assert big["rules"][0]["filter"] == {
        "type": "sql",
        "sql_expression": "amount > @min",
        "parameters": {"@min": 100},
    }
    vip = cli(
        "subscription",
        "create",
        t,
        "vip",
        "--correlation",
        "label=order",
        "--correlation",
        "tier=vip",
        "--lock-duration",
        "30s",
    ).stdout
    assert "correlation: label='order', user.tier='vip'" in vip

    # Rules: an extra copy for VIP orders in "big", stamped by its action.
    tag = json_lines(
        cli(
            "rule",
            "create",
            t,
            "big",
            "tag",
            "--property",
            "tier=vip",
            "--action",
            "SET tagged = @how",
            "--param",
            "how=yes",
            "--json",
        )
    )[0]
    assert tag["filter"]["type"] == "correlation" and tag["filter"]["properties"] == {"tier": "vip"}
    assert tag["action"] == {"sql_expression": "SET tagged = @how", "parameters": {"@how": "yes"}}
    rules = json_lines(cli("rule", "list", t, "big", "--json"))
    assert [r["name"] for r in rules] == ["$Default", "tag"]
    assert "SET tagged = @how" in cli("rule", "show", t, "big", "tag").stdout
    assert "SQL: amount > @min [@min=100]" in cli("rule", "list", t, "big").stdout
    error_line(cli("rule", "create", t, "big", "tag", code=1), "MessagingEntityAlreadyExistsError")
    nothing = json_lines(cli("rule", "create", t, "vip", "never", "--false", "--json"))[0]
    assert nothing["filter"] == {"type": "false", "sql_expression": "1=0"}
    cli("rule", "delete", t, "vip", "never")
    error_line(cli("rule", "show", t, "vip", "never", code=3), "MessagingEntityNotFoundError")
    line = error_line(
        cli("rule", "create", t, "vip", "bad", "--sql", "amount >", code=2), "FilterSyntaxError"
    )
    assert "position 8" in line

    subs = json_lines(cli("subscription", "list", t, "--json"))
    assert sorted(s["name"] for s in subs) == ["all", "big", "vip"]
    assert "vip" in cli("subscription", "list", t).stdout

    # A topic's name is auto-detected by send.
    assert (
        f"sent 1 message to topic {t}"
        in cli("send", t, "small", "-p", "amount=5", "--subject", "order").stderr
    )
    cli("send", t, "large", "-p", "amount=500", "-p", "tier=vip", "--subject", "order")

    got = json_lines(cli("receive", f"{t}/Subscriptions/all", "-c", "2", "--complete", "-w", "5"))
    assert sorted(m["body"] for m in got) == ["large", "small"]
    got = json_lines(
        cli("receive", "--subscription", f"{t}/big", "-c", "2", "--complete", "-w", "5")
    )
    assert [m["body"] for m in got] == ["large", "large"]
    tagged = [m["application_properties"] for m in got if "tagged" in m["application_properties"]]
    assert tagged == [{"amount": 500, "tier": "vip", "tagged": "yes", "RuleName": "tag"}]
    [peeked] = json_lines(cli("peek", t, "--subscription", "vip", "--count", "5"))
    assert peeked["body"] == "large" and peeked["lock_token"] is None

    shown = json_lines(cli("subscription", "show", t, "vip", "--json"))[0]
    assert shown["runtime"]["active_message_count"] == 1 and shown["lock_duration"] == 30.0
    assert [r["filter"]["label"] for r in shown["rules"]] == ["order"]
    assert "user.tier='vip'" in cli("subscription", "show", t, "vip").stdout

    rows = json_lines(cli("stats", t, "--once", "--interval", "0.2", "--json"))
    assert {r["name"]: r["active"] for r in rows} == {
        f"{t}/Subscriptions/all": 0,
        f"{t}/Subscriptions/big": 0,
        f"{t}/Subscriptions/vip": 1,
    }
    [row] = json_lines(cli("stats", f"{t}/Subscriptions/vip", "--once", "-i", "0.1", "--json"))
    assert row["active"] == 1

    updated = json_lines(
        cli("subscription", "update", t, "all", "--max-delivery-count", "5", "--json")
    )[0]
    assert updated["max_delivery_count"] == 5
    line = error_line(
        cli("subscription", "update", t, "all", "--sessions", code=2), "InvalidArgumentError"
    )
    assert "requires_session" in line

    # Errors: a subscription is receive-only, a topic is received through its subscriptions;
    # unknown entities are not found.
    assert "receive-only" in cli("send", f"{t}/Subscriptions/all", "x", code=2).stderr
    assert "is a topic" in cli("receive", t, "-w", "0.2", code=2).stderr
    assert "is a topic" in cli("dlq", "list", t, code=2).stderr
    missing = cli("receive", "--subscription", f"{t}/nope", "-w", "0.2", code=3)
    error_line(missing, "MessagingEntityNotFoundError")
    error_line(cli("subscription", "show", t, "nope", code=3), "MessagingEntityNotFoundError")
    cli("receive", t, "--subscription", f"{t}/vip", code=2)  # the topic twice

    cli("subscription", "delete", t, "vip")
    error_line(cli("subscription", "show", t, "vip", code=3), "MessagingEntityNotFoundError")


def test_dead_letters_of_a_subscription(cli: Any) -> None:
    t = _name("topic")
    cli("topic", "create", t)
    cli("subscription", "create", t, "s", "--max-delivery-count", "1")
    path = f"{t}/Subscriptions/s"
    cli("send", t, "d0", "d1", "--message-id", "d-{n}")
    # With max delivery count 1, an abandoned message is dead-lettered at once.
    assert len(json_lines(cli("receive", path, "--count", "2", "--abandon", "--wait", "5"))) == 2
    dead = json_lines(cli("dlq", "list", path))
    assert sorted(d["body"] for d in dead) == ["d0", "d1"]
    assert all(d["dead_letter_reason"] == "MaxDeliveryCountExceeded" for d in dead)
    assert len(json_lines(cli("peek", "--subscription", f"{t}/s", "--dlq", "-c", "5"))) == 2

    # Resubmitting goes through the topic, only when asked to.
    assert "--via-topic" in cli("dlq", "resubmit", path, code=2).stderr
    out = cli("dlq", "resubmit", "--subscription", f"{t}/s", "--via-topic", "--count", "1")
    assert f"resubmitted 1 message to topic {t}" in out.stderr
    [back] = json_lines(cli("peek", path, "--count", "5"))
    assert back["message_id"] in ("d-0", "d-1") and back["delivery_count"] == 0
    assert "purged 1 dead-lettered message" in cli("dlq", "purge", t, "--subscription", "s").stderr
    assert json_lines(cli("dlq", "list", path)) == []
