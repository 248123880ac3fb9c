"""The rule manager's wire (``raybus.amqp._rules``): ``add-rule`` bodies to ``RuleProperties``
and rules to ``enumerate-rules`` descriptions, as the .NET SDK's codecs read them; bad bodies
refused by name."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from raybus.amqp._codec import Described, decode, encode
from raybus.amqp._management import _page_bounds
from raybus.amqp._rules import rule_description, rule_from_request
from raybus.exceptions import FilterSyntaxError, InvalidArgumentError
from raybus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

CODE = 0x0000013700000000


def _request(name: str, **description: Any) -> dict[str, Any]:
    return {"rule-name": name, "rule-description": {**description, "rule-name": name}}


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ({"sql-filter": {"expression": "n > 5"}}, SqlRuleFilter("n > 5")),
        ({"sql-filter": {"expression": "1=1"}}, TrueRuleFilter()),
        ({"sql-filter": {"expression": " 1=0 "}}, FalseRuleFilter()),
        (
            {"correlation-filter": {"label": "hot", "to": None, "properties": {"c": 1}}},
            CorrelationRuleFilter(label="hot", properties={"c": 1}),
        ),
        (
            {"correlation-filter": {"session-id": "s", "properties": {}}},
            CorrelationRuleFilter(session_id="s"),
        ),
    ],
    ids=["sql", "true", "false", "correlation", "correlation-no-properties"],
)
def test_an_add_rule_body_is_the_rule_it_describes(description: Any, expected: Any) -> None:
    rule = rule_from_request(_request("r", **description, **{"sql-rule-action": None}))
    assert (rule.name, rule.filter, rule.action) == ("r", expected, None)


def test_an_add_rule_body_with_an_action() -> None:
    body = _request(
        "r",
        **{"sql-filter": {"expression": "a = 1"}, "sql-rule-action": {"expression": "SET b = 2"}},
    )
    assert rule_from_request(body).action == SqlRuleAction("SET b = 2")


@pytest.mark.parametrize(
    ("body", "error", "argument"),
    [
        ({"rule-name": "r"}, InvalidArgumentError, "rule-description"),
        (_request("r"), InvalidArgumentError, "rule-description"),
        (
            _request(
                "r", **{"sql-filter": {"expression": "1=1"}, "correlation-filter": {"to": "x"}}
            ),
            InvalidArgumentError,
            "rule-description",
        ),
        (_request("r", **{"sql-filter": {"expression": 5}}), InvalidArgumentError, "sql-filter"),
        (_request("r", **{"sql-filter": "1=1"}), InvalidArgumentError, "sql-filter"),
        (_request("r", **{"sql-filter": {"expression": "n >"}}), FilterSyntaxError, None),
        (_request("r", **{"correlation-filter": {}}), InvalidArgumentError, "properties"),
        (_request("", **{"sql-filter": {"expression": "1=1"}}), InvalidArgumentError, "name"),
        (
            _request("r", **{"sql-filter": {"expression": "1=1"}, "sql-rule-action": {}}),
            InvalidArgumentError,
            "sql-rule-action",
        ),
    ],
    ids=[
        "no-description",
        "no-filter",
        "two-filters",
        "expression-not-text",
        "filter-not-a-map",
        "bad-sql",
        "empty-correlation",
        "blank-name",
        "action-without-expression",
    ],
)
def test_a_bad_add_rule_body_is_refused_naming_what_is_wrong(
    body: dict[str, Any], error: type[Exception], argument: str | None
) -> None:
    with pytest.raises(error) as info:
        rule_from_request(body)
    if argument is not None:
        assert getattr(info.value, "argument", None) == argument


def test_a_rule_is_described_as_the_sdks_codecs_read_it() -> None:
    created = datetime(2026, 12, 7, 8, 0, tzinfo=timezone.utc)
    rules = [
        RuleProperties("$Default", TrueRuleFilter(), None, created),
        RuleProperties("never", FalseRuleFilter()),
        RuleProperties("sql", SqlRuleFilter("n > 5"), SqlRuleAction("SET t = 1")),
        RuleProperties("corr", CorrelationRuleFilter(correlation_id="c", properties={"k": "v"})),
    ]
    # Through the codec, as they cross the wire.
    described = [decode(encode(rule_description(r))) for r in rules]
    assert all(isinstance(d, Described) and d.descriptor == CODE + 4 for d in described)
    fields = [d.value for d in described]
    assert [f[2] for f in fields] == ["$Default", "never", "sql", "corr"]
    assert [(f[0].descriptor - CODE, f[1].descriptor - CODE) for f in fields] == [
        (7, 5),
        (8, 5),
        (6, 6),  # a SQL filter and a SQL action share a code; the place tells them apart
        (9, 5),
    ]
    assert fields[0][3] == int(created.timestamp() * 1000) and fields[1][3] is None
    assert fields[2][0].value == ["n > 5", 20] and fields[2][1].value == ["SET t = 1", 20]
    assert fields[3][0].value == ["c", None, None, None, None, None, None, None, {"k": "v"}]
    assert fields[0][0].value == [] and fields[0][1].value == []


def test_what_is_described_reads_back_as_the_same_rule() -> None:
    """A rule listed by one gateway and added again through another is the same rule."""
    for rule in [
        RuleProperties("a", SqlRuleFilter("x = 'y'"), SqlRuleAction("REMOVE x")),
        RuleProperties("b", CorrelationRuleFilter(label="l", reply_to="r")),
        RuleProperties("c", TrueRuleFilter()),
    ]:
        f, a, name, _ = decode(encode(rule_description(rule))).value
        if f.descriptor == CODE + 9:
            keys = ["correlation-id", "message-id", "to", "reply-to", "label", "session-id"]
            keys += ["reply-to-session-id", "content-type", "properties"]
            filters = {"correlation-filter": dict(zip(keys, f.value, strict=True))}
        elif f.descriptor == CODE + 6:
            filters = {"sql-filter": {"expression": f.value[0]}}
        else:
            filters = {"sql-filter": {"expression": "1=1"}}
        action = {"expression": a.value[0]} if a.descriptor == CODE + 6 else None
        again = rule_from_request(_request(name, **filters, **{"sql-rule-action": action}))
        assert (again.name, again.filter, again.action) == (rule.name, rule.filter, rule.action)


@pytest.mark.parametrize(
    ("args", "bounds"),
    [({}, (0, 7)), ({"skip": 2, "top": 3}, (2, 3)), ({"top": 0}, (0, 7)), ({"skip": 9}, (9, 7))],
)
def test_page_bounds(args: dict[str, Any], bounds: tuple[int, int]) -> None:
    assert _page_bounds(args, 7) == bounds


@pytest.mark.parametrize("args", [{"skip": -1}, {"top": "10"}, {"top": True}, {"skip": 1.5}])
def test_bad_page_bounds_are_refused_by_name(args: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        _page_bounds(args, 7)
    assert info.value.argument == next(iter(args))
