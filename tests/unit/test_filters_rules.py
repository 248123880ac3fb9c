"""Rule models (SqlRuleFilter, CorrelationRuleFilter, True/False, SqlRuleAction,
RuleProperties) and fan-out copy semantics (spec §1.8 "Rules model")."""

from __future__ import annotations

import pickle
from datetime import datetime, timezone
from typing import Any

import pytest

from raybus._core.filters import (
    DEFAULT_RULE_NAME,
    CompiledAction,
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
    fan_out,
    matches,
)
from raybus._core.record import MessageRecord, snapshot
from raybus.exceptions import FilterEvaluationError, FilterSyntaxError, InvalidArgumentError


def record(**props: Any) -> MessageRecord:
    return MessageRecord(
        application_properties=props or {"color": "red", "n": 1, "flag": True},
        message_id="m-1",
        correlation_id="c-1",
        to="dest",
        reply_to="rq",
        subject="orders",
        session_id="s-1",
        reply_to_session_id="rs-1",
        content_type="text/plain",
    )


# ------------------------------------------------------------------ SQL filter and action


def test_sql_rule_filter_compiles_on_construction() -> None:
    with pytest.raises(FilterSyntaxError) as info:
        SqlRuleFilter("color = ")
    assert info.value.position == 8
    with pytest.raises(FilterSyntaxError):
        SqlRuleFilter("color = @c")
    with pytest.raises(InvalidArgumentError):
        SqlRuleFilter(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        SqlRuleFilter("a = 1", [1])  # type: ignore[arg-type]


def test_sql_rule_filter_evaluates_three_valued() -> None:
    assert SqlRuleFilter("color = @c", {"@c": "red"}).evaluate(record()) is True
    assert SqlRuleFilter("color = 'blue'").evaluate(record()) is False
    assert SqlRuleFilter("missing = 1").evaluate(record()) is None
    assert SqlRuleFilter("missing = 1").matches(record()) is False
    assert matches(SqlRuleFilter("missing = 1"), record()) is None
    with pytest.raises(FilterEvaluationError):
        SqlRuleFilter("sys.Nope = 1").evaluate(record())


def test_sql_rule_filter_copies_its_parameters() -> None:
    params = {"c": "red"}
    rule_filter = SqlRuleFilter("color = @c", params)
    params["c"] = "blue"
    assert rule_filter.parameters == {"c": "red"}
    assert rule_filter.evaluate(record()) is True


def test_sql_rule_filter_pickles_without_its_compiled_form_and_recompiles_lazily() -> None:
    rule_filter = SqlRuleFilter("color = @c", {"c": "red"})
    state = rule_filter.__getstate__()
    assert "_compiled" not in state
    loaded = pickle.loads(pickle.dumps(rule_filter))
    assert loaded == rule_filter
    assert "_compiled" not in loaded.__dict__
    assert loaded.evaluate(record()) is True
    assert "_compiled" in loaded.__dict__


def test_sql_rule_action_compiles_applies_and_pickles() -> None:
    with pytest.raises(FilterSyntaxError):
        SqlRuleAction("SET")
    with pytest.raises(FilterSyntaxError):
        SqlRuleAction("REMOVE sys.To")
    action = pickle.loads(pickle.dumps(SqlRuleAction("SET x = @v", {"v": 2})))
    rec = record()
    action.apply(rec)
    assert (rec.application_properties or {})["x"] == 2
    assert isinstance(action.compiled, CompiledAction)


def test_true_and_false_filters() -> None:
    assert TrueRuleFilter().evaluate(record()) is True
    assert FalseRuleFilter().evaluate(record()) is False
    assert TrueRuleFilter().sql_expression == "1=1"
    assert FalseRuleFilter().sql_expression == "1=0"
    assert matches(TrueRuleFilter(), MessageRecord()) is True
    assert pickle.loads(pickle.dumps(TrueRuleFilter())) == TrueRuleFilter()


# ------------------------------------------------------------------ correlation filter

CORRELATION_CASES: list[tuple[dict[str, Any], bool]] = [
    ({"correlation_id": "c-1"}, True),
    ({"correlation_id": "C-1"}, False),  # case-sensitive
    ({"message_id": "m-1"}, True),
    ({"to": "dest"}, True),
    ({"reply_to": "rq"}, True),
    ({"label": "orders"}, True),  # label is the subject
    ({"label": "Orders"}, False),
    ({"session_id": "s-1"}, True),
    ({"reply_to_session_id": "rs-1"}, True),
    ({"content_type": "text/plain"}, True),
    ({"content_type": "text/plain", "label": "orders", "to": "dest"}, True),
    ({"content_type": "text/plain", "label": "other"}, False),  # AND-ed
    ({"properties": {"color": "red"}}, True),
    ({"properties": {"Color": "red"}}, False),  # exact key
    ({"properties": {"color": "Red"}}, False),
    ({"properties": {"color": "red", "n": 1}}, True),
    ({"properties": {"n": 1.0}}, True),  # numbers compare by value
    ({"properties": {"n": True}}, False),  # a bool is not a number
    ({"properties": {"flag": 1}}, False),
    ({"properties": {"flag": True}}, True),
    ({"properties": {"missing": None}}, False),
    ({"properties": {"color": "red"}, "label": "orders"}, True),
    ({"properties": {"color": "red"}, "label": "x"}, False),
]


@pytest.mark.parametrize(("fields", "expected"), CORRELATION_CASES)
def test_correlation_filter_is_exact_case_sensitive_equality_and_ed(
    fields: dict[str, Any], expected: bool
) -> None:
    rule_filter = CorrelationRuleFilter(**fields)
    assert rule_filter.matches(record()) is expected
    assert matches(rule_filter, record()) is expected
    assert pickle.loads(pickle.dumps(rule_filter)).matches(record()) is expected


def test_correlation_filter_property_holding_none_matches_none() -> None:
    rec = record(k=None)
    assert CorrelationRuleFilter(properties={"k": None}).matches(rec) is True
    assert CorrelationRuleFilter(properties={"k": None}).matches(MessageRecord()) is False


def test_correlation_filter_against_missing_fields_never_raises() -> None:
    assert CorrelationRuleFilter(to="dest").matches(MessageRecord()) is False
    assert CorrelationRuleFilter(properties={"a": 1}).matches(MessageRecord()) is False


def test_correlation_filter_validation() -> None:
    with pytest.raises(InvalidArgumentError):
        CorrelationRuleFilter()
    with pytest.raises(InvalidArgumentError):
        CorrelationRuleFilter(properties={})
    with pytest.raises(InvalidArgumentError) as info:
        CorrelationRuleFilter(to=5)  # type: ignore[arg-type]
    assert info.value.argument == "to"
    with pytest.raises(InvalidArgumentError):
        CorrelationRuleFilter(properties={1: "x"})  # type: ignore[dict-item]


# ------------------------------------------------------------------ RuleProperties


@pytest.mark.parametrize("name", ["r", "a" * 50, DEFAULT_RULE_NAME, "rule-1.b_c"])
def test_rule_names_of_1_to_50_characters_are_valid(name: str) -> None:
    assert RuleProperties(name, TrueRuleFilter()).name == name


@pytest.mark.parametrize("name", ["", "   ", "a" * 51, None, 5])
def test_invalid_rule_names_are_rejected(name: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        RuleProperties(name, TrueRuleFilter())
    assert info.value.argument == "name"


def test_rule_properties_check_filter_action_and_time_types() -> None:
    with pytest.raises(InvalidArgumentError):
        RuleProperties("r", "color = 'red'")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        RuleProperties("r", TrueRuleFilter(), "SET x = 1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        RuleProperties("r", TrueRuleFilter(), None, "yesterday")  # type: ignore[arg-type]
    when = datetime(2024, 1, 1, tzinfo=timezone.utc)
    assert RuleProperties("r", TrueRuleFilter(), None, when).created_at_utc == when


def test_rules_pickle_with_every_filter_kind() -> None:
    rules = [
        RuleProperties(DEFAULT_RULE_NAME, TrueRuleFilter()),
        RuleProperties("none", FalseRuleFilter()),
        RuleProperties("sql", SqlRuleFilter("n > @m", {"m": 0}), SqlRuleAction("SET y = n")),
        RuleProperties("corr", CorrelationRuleFilter(label="orders", properties={"n": 1})),
    ]
    loaded = pickle.loads(pickle.dumps(rules))
    assert loaded == rules
    copies, error = fan_out(loaded, record())
    assert error is None
    assert [name for name, _ in copies] == [None, "sql"]


# ------------------------------------------------------------------ fan-out


def rule(name: str, sql: str, action: str | None = None) -> RuleProperties:
    return RuleProperties(name, SqlRuleFilter(sql), SqlRuleAction(action) if action else None)


def test_no_rules_give_no_copies() -> None:
    assert fan_out([], record()) == ([], None)


def test_default_rule_gives_one_copy_without_rule_name() -> None:
    assert fan_out([RuleProperties(DEFAULT_RULE_NAME, TrueRuleFilter())], record()) == (
        [(None, None)],
        None,
    )


def test_five_matching_rules_two_with_actions_give_three_copies() -> None:
    rules = [
        rule("a", "color = 'red'"),
        rule("b", "n = 1", "SET x = 'b'"),
        rule("c", "flag"),
        rule("d", "EXISTS(color)", "SET x = 'd'"),
        RuleProperties("e", CorrelationRuleFilter(label="orders")),
        rule("f", "color = 'blue'"),  # no match
        rule("g", "color = 'blue'", "SET x = 'g'"),  # no match, has an action
        rule("h", "missing = 1", "SET x = 'h'"),  # UNKNOWN does not match
    ]
    copies, error = fan_out(rules, record())
    assert error is None
    assert [name for name, _ in copies] == [None, "b", "d"]
    assert copies[0][1] is None
    results = []
    for _, action in copies[1:]:
        assert action is not None
        copy = snapshot(record())
        action.apply(copy)
        results.append((copy.application_properties or {})["x"])
    assert results == ["b", "d"]


def test_only_action_rules_give_one_copy_each_and_no_plain_copy() -> None:
    rules = [rule("x", "TRUE", "SET a = 1"), rule("y", "TRUE", "SET a = 2")]
    copies, error = fan_out(rules, record())
    assert error is None
    assert [name for name, _ in copies] == ["x", "y"]


def test_plain_rules_are_or_ed_into_a_single_copy() -> None:
    rules = [rule(f"r{i}", "TRUE") for i in range(5)]
    assert fan_out(rules, record()) == ([(None, None)], None)


def test_no_matching_rule_gives_no_copy() -> None:
    rules = [RuleProperties("f", FalseRuleFilter()), rule("u", "missing = 1")]
    assert fan_out(rules, record()) == ([], None)


def test_an_evaluation_error_in_any_rule_returns_the_error_and_no_copies() -> None:
    rules = [
        rule("ok", "TRUE"),
        rule("bad", "sys.Nope = 1"),
        rule("worse", "1 / 0 = 1"),
    ]
    copies, error = fan_out(rules, record())
    assert copies == []
    assert isinstance(error, FilterEvaluationError)
    assert error.type_name == "MissingSystemProperty"
    assert "'bad'" in error.message
    assert pickle.loads(pickle.dumps(error)).type_name == "MissingSystemProperty"


def test_fan_out_does_not_change_the_record() -> None:
    rec = record()
    before = dict(rec.application_properties or {})
    fan_out([rule("a", "TRUE", "SET color = 'x'")], rec)
    assert rec.application_properties == before
