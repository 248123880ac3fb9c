"""Parsing and rendering of the topic, subscription and rule commands, without Ray.

Entity references (``TOPIC/Subscriptions/SUB``, ``--subscription``), ``--param`` and
``--correlation`` items, the one-filter rule, the settings options of ``raybus topic`` and
``raybus subscription``, how filters are shown (one line; JSON with a ``type``), and the one
error line of a ``FilterSyntaxError``.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import typer
from rich.console import Console

from raybus._models import MAX_DURATION
from raybus._topic_models import (
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
)
from raybus.cli._errors import error_line, exit_code
from raybus.cli._filters import (
    build_action,
    build_filter,
    build_rule,
    parse_correlation,
    parse_params,
)
from raybus.cli._parse import EntityRef, parse_entity
from raybus.cli._render import (
    filter_json,
    filter_text,
    properties_json,
    properties_table,
    rule_json,
    rule_table,
    rules_table,
)
from raybus.cli.queue import Status
from raybus.cli.subscription import default_rule, subscription_options
from raybus.cli.topic import topic_options
from raybus.exceptions import FilterSyntaxError, InvalidArgumentError
from raybus.management import (
    CorrelationRuleFilter,
    EntityStatus,
    FalseRuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

# --------------------------------------------------------------------------- entities


@pytest.mark.parametrize(
    ("entity", "subscription", "expected"),
    [
        ("orders", None, EntityRef("orders")),
        ("app/orders", None, EntityRef("app/orders")),  # a queue name may contain '/'
        ("orders/Subscriptions/big", None, EntityRef("orders", "big")),
        ("orders/subscriptions/big", None, EntityRef("orders", "big")),
        ("app/orders/SUBSCRIPTIONS/big", None, EntityRef("app/orders", "big")),
        (None, "orders/big", EntityRef("orders", "big")),
        (None, "app/orders/big", EntityRef("app/orders", "big")),  # sub names have no '/'
        (None, "orders/Subscriptions/big", EntityRef("orders", "big")),
        ("orders", "big", EntityRef("orders", "big")),
        (" orders ", " big ", EntityRef("orders", "big")),
    ],
)
def test_entities_are_queues_or_subscriptions(
    entity: str | None, subscription: str | None, expected: EntityRef
) -> None:
    assert parse_entity(entity, subscription) == expected


@pytest.mark.parametrize(
    ("entity", "subscription", "message"),
    [
        (None, None, "give a queue name"),
        ("", None, "give a queue name"),
        (None, "big", "give TOPIC/SUB"),
        ("orders", "orders/big", "not both"),
        ("orders/Subscriptions/big", "big", "already a subscription path"),
        (None, "/big", "both the topic and the subscription"),
        (None, "orders/", "both the topic and the subscription"),
    ],
)
def test_bad_entity_references_explain_the_forms(
    entity: str | None, subscription: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_entity(entity, subscription)


def test_entity_paths() -> None:
    assert EntityRef("q").path == "q" and not EntityRef("q").is_subscription
    sub = EntityRef("orders", "big")
    assert sub.is_subscription
    assert sub.path == str(sub) == "orders/Subscriptions/big"


# --------------------------------------------------------------------------- parameters


def test_params_take_an_optional_at_and_typed_values() -> None:
    assert parse_params(None) is None and parse_params([]) is None
    assert parse_params(["min=100", "@who=alice", "f=1.5", "ok=true", 's="5"']) == {
        "@min": 100,
        "@who": "alice",
        "@f": 1.5,
        "@ok": True,
        "@s": "5",
    }


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["min"], "key=value"),
        (["=5"], "key=value"),
        (["@=5"], "needs a name"),
        (["min=1", "@MIN=2"], "given twice"),
    ],
)
def test_bad_params_are_refused(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_params(items)


# --------------------------------------------------------------------------- correlation


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("correlation_id", "correlation_id"),
        ("CorrelationId", "correlation_id"),
        ("correlation-id", "correlation_id"),
        ("sys.CorrelationId", "correlation_id"),
        ("label", "label"),
        ("Subject", "label"),
        ("sys.Label", "label"),
        ("to", "to"),
        ("ReplyToSessionId", "reply_to_session_id"),
        ("content_type", "content_type"),
        ("message-id", "message_id"),
        ("session_id", "session_id"),
        ("reply_to", "reply_to"),
    ],
)
def test_correlation_keys_naming_message_fields(key: str, field: str) -> None:
    assert parse_correlation([f"{key}=5"]) == ({field: "5"}, {})  # a field value stays text


def test_other_correlation_keys_are_typed_application_properties() -> None:
    fields, props = parse_correlation(
        ["tier=vip", "n=5", "ok=false", "user.label=x", "User.Tier2=y", "eq=a=b"]
    )
    assert fields == {}
    assert props == {"tier": "vip", "n": 5, "ok": False, "label": "x", "Tier2": "y", "eq": "a=b"}


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["novalue"], "key=value"),
        (["=x"], "key=value"),
        (["sys.Priority=1"], "matches only"),
        (["label=a", "subject=b"], "given twice"),
    ],
)
def test_bad_correlation_items_are_refused(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_correlation(items)


# --------------------------------------------------------------------------- filters and rules


def test_one_filter_true_by_default() -> None:
    assert build_filter() == TrueRuleFilter()
    assert build_filter(true=True) == TrueRuleFilter()
    assert build_filter(false=True) == FalseRuleFilter()
    sql = build_filter(sql="amount > @min", parameters={"@min": 100})
    assert isinstance(sql, SqlRuleFilter) and sql.parameters == {"@min": 100}
    corr = build_filter(correlation={"label": "order"}, properties={"tier": "vip"})
    assert corr == CorrelationRuleFilter(label="order", properties={"tier": "vip"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sql": "a = 1", "true": True}, "not --sql and --true"),
        ({"sql": "a = 1", "correlation": {"label": "x"}}, "correlation conditions"),
        ({"true": True, "false": True}, "--true and --false"),
        ({"properties": {"a": 1}, "false": True}, "correlation conditions and --false"),
        ({"sql": "  "}, "needs an expression"),
    ],
)
def test_conflicting_or_empty_filters_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_filter(**options)


def test_bad_sql_raises_filter_syntax_error_with_its_position() -> None:
    with pytest.raises(FilterSyntaxError) as info:
        build_filter(sql="amount > ")
    assert info.value.position is not None and "position" in str(info.value)
    with pytest.raises(FilterSyntaxError, match="@min"):
        build_filter(sql="amount > @min")  # a parameter that is not supplied


def test_actions() -> None:
    assert build_action(None) is None
    action = build_action("SET tagged = @how", {"@how": "yes"})
    assert action == SqlRuleAction("SET tagged = @how", {"@how": "yes"})
    with pytest.raises(ValueError, match="needs statements"):
        build_action(" ")
    with pytest.raises(FilterSyntaxError):
        build_action("SET = 1")


def test_build_rule_merges_field_options_correlation_items_and_properties() -> None:
    rule = build_rule(
        "vip",
        fields={"label": "order", "correlation_id": None},
        correlation=["to=shop", "tier=vip"],
        properties=["n=5"],
        action="SET seen = TRUE",
    )
    assert rule.name == "vip"
    assert rule.filter == CorrelationRuleFilter(
        label="order", to="shop", properties={"tier": "vip", "n": 5}
    )
    assert rule.action is not None and rule.action.sql_expression == "SET seen = TRUE"
    sql = build_rule("big", sql="amount > @min", params=["min=100"])
    assert sql.filter == SqlRuleFilter("amount > @min", {"@min": 100}) and sql.action is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"params": ["min=1"]}, "--param needs --sql or --action"),
        ({"params": ["min=1"], "true": True}, "--param needs --sql or --action"),
        ({"fields": {"label": "a"}, "correlation": ["label=b"]}, "given twice"),
        ({"fields": {"label": "a"}, "sql": "1=1"}, "give one filter"),
        ({"properties": ["novalue"]}, "key=value"),
    ],
)
def test_build_rule_refuses_inconsistent_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_rule("r", **options)


def test_build_rule_name_is_checked_by_the_model() -> None:
    with pytest.raises(InvalidArgumentError, match="rule name"):
        build_rule("x" * 51)


def test_subscription_default_rule_replaces_default_only_when_asked() -> None:
    assert default_rule() is None
    rule = default_rule(sql="amount > @min", params=["min=100"])
    assert rule is not None and rule.name == "$Default"
    assert rule.filter == SqlRuleFilter("amount > @min", {"@min": 100})
    corr = default_rule(correlation=["label=order"], action="SET x = 1")
    assert corr is not None and corr.filter == CorrelationRuleFilter(label="order")
    with pytest.raises(typer.BadParameter, match="--param needs"):
        default_rule(params=["min=1"])
    with pytest.raises(FilterSyntaxError):
        default_rule(sql="a = = 1")


# --------------------------------------------------------------------------- settings options


def test_topic_options_only_those_given() -> None:
    assert topic_options() == {}
    assert topic_options(
        ttl="never",
        dedup=True,
        dedup_window="1m",
        max_size=100,
        status=Status.SEND_DISABLED,
        auto_delete_on_idle="1h",
        ordering=False,
        batched_operations=False,
        user_metadata="m",
    ) == {
        "default_message_time_to_live": MAX_DURATION,
        "requires_duplicate_detection": True,
        "duplicate_detection_history_time_window": timedelta(minutes=1),
        "max_size_in_megabytes": 100,
        "status": "SendDisabled",
        "auto_delete_on_idle": timedelta(hours=1),
        "support_ordering": False,
        "enable_batched_operations": False,
        "user_metadata": "m",
    }
    assert set(topic_options(max_message_size=5)) <= TopicProperties.option_names()


def test_subscription_options_only_those_given() -> None:
    assert subscription_options() == {}
    options = subscription_options(
        lock_duration="30s",
        max_delivery_count=3,
        ttl="PT1H",
        dead_letter_on_expiration=True,
        dead_letter_on_filter_errors=False,
        sessions=True,
        partitions=2,
        status=Status.RECEIVE_DISABLED,
        auto_delete_on_idle="never",
        batched_operations=True,
        forward_to="q",
        forward_dead_lettered_to="dlq",
        user_metadata="m",
    )
    assert set(options) == SubscriptionProperties.option_names()
    assert options["lock_duration"] == timedelta(seconds=30)
    assert options["dead_lettering_on_filter_evaluation_exceptions"] is False
    assert options["auto_delete_on_idle"] == MAX_DURATION


def test_bad_durations_in_settings_are_usage_errors() -> None:
    with pytest.raises(typer.BadParameter, match="not a duration"):
        topic_options(ttl="soon")
    with pytest.raises(typer.BadParameter, match="finite"):
        subscription_options(lock_duration="never")


# --------------------------------------------------------------------------- rendering


def test_filters_on_one_readable_line() -> None:
    assert filter_text(TrueRuleFilter()).startswith("TRUE")
    assert filter_text(FalseRuleFilter()).startswith("FALSE")
    sql = SqlRuleFilter("amount > @min AND who = @who", {"@min": 100, "who": "o'brien"})
    assert filter_text(sql) == "SQL: amount > @min AND who = @who [@min=100, @who='o''brien']"
    corr = CorrelationRuleFilter(correlation_id="c1", label="order", properties={"vip": True})
    assert filter_text(corr) == "correlation: correlation_id='c1', label='order', user.vip=TRUE"


def test_filters_as_json_objects_with_a_type() -> None:
    assert filter_json(TrueRuleFilter()) == {"type": "true", "sql_expression": "1=1"}
    assert filter_json(FalseRuleFilter()) == {"type": "false", "sql_expression": "1=0"}
    at = datetime(2024, 1, 2, tzinfo=timezone.utc)
    uid = uuid.UUID(int=7)
    sql = filter_json(SqlRuleFilter("t > @at AND id = @id", {"@at": at, "@id": uid}))
    assert sql == {
        "type": "sql",
        "sql_expression": "t > @at AND id = @id",
        "parameters": {"@at": "2024-01-02T00:00:00+00:00", "@id": str(uid)},
    }
    corr = filter_json(CorrelationRuleFilter(label="order", properties={"n": 5}))
    assert corr["type"] == "correlation" and corr["label"] == "order"
    assert corr["correlation_id"] is None and corr["properties"] == {"n": 5}


def test_rule_json_and_tables_show_user_text_as_written() -> None:
    rule = RuleProperties(
        "[tag]",
        SqlRuleFilter("amount > @min", {"@min": 100}),
        SqlRuleAction("SET [x] = 'y'"),
        created_at_utc=datetime(2024, 1, 2, tzinfo=timezone.utc),
    )
    out = rule_json(rule)
    json.dumps(out)
    assert out["name"] == "[tag]" and out["created_at_utc"].startswith("2024-01-02")
    assert out["action"] == {"sql_expression": "SET [x] = 'y'", "parameters": {}}
    console = Console(width=200, record=True)
    console.print(rules_table("t", "s", [rule]))
    console.print(rule_table("t", "s", rule))
    text = console.export_text()
    # Rich markup is not applied to filters, actions and names.
    assert "SQL: amount > @min [@min=100]" in text and "SET [x] = 'y'" in text
    assert "[tag]" in text
    empty = Console(width=200, record=True)
    empty.print(rules_table("t", "s", []))
    assert "receives nothing" in empty.export_text()


def test_topic_and_subscription_settings_json_and_table() -> None:
    topic = TopicProperties("orders", default_message_time_to_live=timedelta(hours=1))
    out = properties_json(topic, TopicRuntimeProperties("orders", subscription_count=2))
    assert out["name"] == "orders" and out["default_message_time_to_live"] == 3600.0
    assert out["status"] == "Active" and out["auto_delete_on_idle"] is None
    assert out["runtime"]["subscription_count"] == 2 and "name" not in out["runtime"]

    sub = SubscriptionProperties("orders", "big", status=EntityStatus.RECEIVE_DISABLED)
    rules = [RuleProperties("$Default", CorrelationRuleFilter(label="order"))]
    runtime = SubscriptionRuntimeProperties("orders", "big", active_message_count=3)
    out = properties_json(sub, runtime, rules=rules)
    assert out["topic_name"] == "orders" and out["status"] == "ReceiveDisabled"
    assert out["runtime"]["active_message_count"] == 3 and "topic_name" not in out["runtime"]
    assert out["rules"][0]["filter"]["label"] == "order"
    json.dumps(out)

    console = Console(width=200, record=True)
    console.print(properties_table(sub, runtime, rules=rules))
    console.print(properties_table(topic))
    text = console.export_text()
    assert "subscription orders/Subscriptions/big" in text and "topic orders" in text
    assert "rule $Default" in text and "correlation: label='order'" in text
    assert "active_message_count" in text


# --------------------------------------------------------------------------- errors


def test_filter_syntax_error_line_marks_the_position() -> None:
    with pytest.raises(FilterSyntaxError) as info:
        SqlRuleFilter("a = = 1")
    assert exit_code(info.value) == 2
    line = error_line(info.value)
    assert line.startswith("error: FilterSyntaxError: SQL syntax error at position 4: ")
    assert line.endswith(" near: a = >>>= 1")


def test_filter_syntax_error_line_is_one_line_with_a_window_of_long_text() -> None:
    text = "a = 1 AND\n" + "b = 2 AND " * 10 + "c = = 3" + " AND d = 4" * 10
    with pytest.raises(FilterSyntaxError) as info:
        SqlRuleFilter(text)
    line = error_line(info.value)
    assert "\n" not in line
    near = line.split(" near: ", 1)[1]
    assert near.startswith("...") and near.endswith("...")
    assert "c = >>>= 3" in near and len(near) <= 3 + 30 + 3 + 30 + 3


def test_filter_syntax_error_without_a_position_has_no_marker() -> None:
    with pytest.raises(FilterSyntaxError) as info:
        SqlRuleFilter("a = @x", {"@x": [1]})
    assert info.value.position is None
    line = error_line(info.value)
    assert line.startswith("error: FilterSyntaxError: ") and "near:" not in line
