"""SQL rule filters: the grammar, three-valued logic, types and errors (spec §1.8 and the
package docstring of ``raybus._core.filters``), as a table of hand-written cases."""

from __future__ import annotations

import pickle
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from raybus._core.filters import MAX_DEPTH, compile_filter, parse
from raybus._core.filters.nodes import Arith, BoolOp, Compare
from raybus._core.record import MessageRecord
from raybus.exceptions import FilterEvaluationError, FilterSyntaxError

T, F, U = True, False, None
SYNTAX = "syntax"
ENQUEUED = 1_700_000_000.0
GUID = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")
WHEN = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)

PROPS: dict[str, Any] = {
    "color": "red",
    "count": 3,
    "price": 2.5,
    "flag": True,
    "off": False,
    "nothing": None,
    "big": 2**63 - 1,
    "small": -(2**63),
    "guid": GUID,
    "when": WHEN,
    "naive": datetime(2024, 5, 1, 12, 0),
    "blob": b"\x01\x02",
    "name": "Widget_%1",
    "Mixed": 1,
    "mixed": 2,
    "my prop": 7,
    "a]b": 8,
    'a"b': 9,
    "and": 10,
    "p": 11,
    "newid": 12,
    "set": 13,
    "sys.Label": "user-scoped",
    "pat": "r%",
    "colorname": "color",
    "empty": "",
    "nl": "a\nb",
}


def record(props: dict[str, Any] | None = None, **fields: Any) -> MessageRecord:
    base: dict[str, Any] = dict(
        message_id="msg-1",
        correlation_id="corr-1",
        to="dest",
        reply_to="replyq",
        subject="Label1",
        session_id="sess-1",
        reply_to_session_id="rsess",
        content_type="application/json",
        partition_key="sess-1",
        sequence_number=42,
        delivery_count=1,
        enqueued_time=ENQUEUED,
        scheduled_enqueue_time=None,
        time_to_live=60.0,
        size=100,
    )
    base.update(fields)
    return MessageRecord(application_properties=dict(PROPS if props is None else props), **base)


def outcome(
    text: str, params: dict[str, Any] | None = None, rec: MessageRecord | None = None
) -> Any:
    """True/False/None, ``"syntax"``, or the ``type_name`` of the evaluation error."""
    try:
        compiled = compile_filter(text, params)
    except FilterSyntaxError:
        return SYNTAX
    try:
        return compiled.evaluate(record())
    except FilterEvaluationError as e:
        return e.type_name


def check(text: str, expected: Any, params: dict[str, Any] | None = None) -> None:
    assert outcome(text, params) == expected, text


# ------------------------------------------------------------------ comparisons

COMPARISONS = [
    ("color = 'red'", T),
    ("'red' = color", T),
    ("color <> 'red'", F),
    ("color != 'blue'", T),
    ("color < 's'", T),
    ("color <= 'red'", T),
    ("color > 'red'", F),
    ("color >= 'a'", T),
    ("color = 'RED'", F),  # ordinal, case-sensitive
    ("'B' < 'a'", T),  # ordinal: upper case sorts first
    ("empty = ''", T),
    ("count = 3", T),
    ("count = 3.0", T),
    ("count <> 4", T),
    ("count >= 3", T),
    ("count < 3", F),
    ("price > 2", T),
    ("price < 3", T),
    ("price = 2.5", T),
    ("2.5 = price", T),
    ("big = 9223372036854775807", T),
    ("big + 1.0 = big", T),  # the long is promoted to double
    ("flag = TRUE", T),
    ("flag <> FALSE", T),
    ("flag = off", F),
    ("TRUE = TRUE", T),
    ("guid = '0F8FAD5B-D9CB-469F-A165-70867728950E'", T),  # uuid vs str, ignoring case
    ("'0f8fad5b-d9cb-469f-a165-70867728950e' = guid", T),
    ("guid <> 'x'", T),
    ("guid = guid", T),
    ("guid <> newid()", T),
    ("when = when", T),
    ("when > sys.EnqueuedTimeUtc", T),
    ("when = naive", T),  # naive datetimes are UTC
    ("when <= naive", T),
    ("blob = blob", T),
    ("blob <> blob", F),
    # NULL / missing operands: UNKNOWN, before any type check
    ("missing = 1", U),
    ("missing <> 1", U),
    ("nothing = 1", U),
    ("NULL = NULL", U),
    ("NULL <> NULL", U),
    ("NULL = 'a'", U),
    ("NULL < TRUE", U),
    ("missing < guid", U),
    # type mismatches
    ("color = 1", "TypeMismatch"),
    ("count = '3'", "TypeMismatch"),
    ("flag = 1", "TypeMismatch"),
    ("flag < TRUE", "TypeMismatch"),
    ("flag >= off", "TypeMismatch"),
    ("guid < guid", "TypeMismatch"),
    ("guid > 'a'", "TypeMismatch"),
    ("guid = 1", "TypeMismatch"),
    ("when < 1", "TypeMismatch"),
    ("when = 'x'", "TypeMismatch"),
    ("blob < blob", "TypeMismatch"),
    ("blob = 'x'", "TypeMismatch"),
    ("color = TRUE", "TypeMismatch"),
    # nan per IEEE
    ("0.0 / 0 = 0.0 / 0", F),
    ("0.0 / 0 <> 0.0 / 0", T),
    ("0.0 / 0 < 1", F),
]


@pytest.mark.parametrize(("text", "expected"), COMPARISONS)
def test_comparison_follows_the_type_rules(text: str, expected: Any) -> None:
    check(text, expected)


# ------------------------------------------------------------------ three-valued logic

LOGIC_VALUES = {"T": "TRUE", "F": "FALSE", "U": "missing = 1"}
AND_TABLE = {
    "TT": T, "TF": F, "TU": U,
    "FT": F, "FF": F, "FU": F,
    "UT": U, "UF": F, "UU": U,
}  # fmt: skip
OR_TABLE = {
    "TT": T, "TF": T, "TU": T,
    "FT": T, "FF": F, "FU": U,
    "UT": T, "UF": U, "UU": U,
}  # fmt: skip


@pytest.mark.parametrize("pair", sorted(AND_TABLE))
def test_and_truth_table_false_dominates_then_unknown(pair: str) -> None:
    a, b = (LOGIC_VALUES[c] for c in pair)
    check(f"{a} AND {b}", AND_TABLE[pair])
    check(f"({a}) AND ({b}) AND TRUE", AND_TABLE[pair])


@pytest.mark.parametrize("pair", sorted(OR_TABLE))
def test_or_truth_table_true_dominates_then_unknown(pair: str) -> None:
    a, b = (LOGIC_VALUES[c] for c in pair)
    check(f"{a} OR {b}", OR_TABLE[pair])
    check(f"FALSE OR ({a}) OR ({b})", OR_TABLE[pair])


@pytest.mark.parametrize(("value", "expected"), [("T", F), ("F", T), ("U", U)])
def test_not_truth_table(value: str, expected: Any) -> None:
    check(f"NOT ({LOGIC_VALUES[value]})", expected)
    check(f"NOT NOT ({LOGIC_VALUES[value]})", None if expected is None else not expected)


LOGIC = [
    ("flag", T),
    ("off", F),
    ("missing", U),
    ("nothing", U),
    ("NULL", U),
    ("NOT NULL", U),
    ("flag AND count = 3", T),
    ("user.flag OR off", T),
    ("TRUE OR FALSE AND FALSE", T),  # AND binds tighter
    ("(TRUE OR FALSE) AND FALSE", F),
    ("NOT FALSE AND FALSE", F),  # NOT binds tighter than AND
    ("NOT (FALSE AND FALSE)", T),
    ("NOT color = 'blue'", T),
    ("color = 'x' -- comment", U),
    # non-boolean results and operands
    ("1", "NotBoolean"),
    ("'a'", "NotBoolean"),
    ("count", "NotBoolean"),
    ("color", "NotBoolean"),
    ("1 + 1", "NotBoolean"),
    ("NOT 1", "NotBoolean"),
    ("NOT color", "NotBoolean"),
    ("1 AND TRUE", "NotBoolean"),
    ("count OR TRUE", "NotBoolean"),
    # every operand is evaluated: no short-circuit
    ("FALSE AND 1", "NotBoolean"),
    ("TRUE OR 'a'", "NotBoolean"),
    ("FALSE AND 1 / 0 = 1", "DivideByZero"),
    ("TRUE OR sys.Foo = 1", "MissingSystemProperty"),
    ("1 / 0 = 1 OR TRUE", "DivideByZero"),
]


@pytest.mark.parametrize(("text", "expected"), LOGIC)
def test_logical_operators_and_predicates(text: str, expected: Any) -> None:
    check(text, expected)


# ------------------------------------------------------------------ IS NULL, EXISTS, IN

NULLS_AND_SETS = [
    ("missing IS NULL", T),
    ("nothing IS NULL", T),
    ("color IS NULL", F),
    ("color IS NOT NULL", T),
    ("missing IS NOT NULL", F),
    ("NULL IS NULL", T),
    ("1 + missing IS NULL", T),
    ("NOT missing IS NULL", F),
    ("sys.ReplyTo IS NULL", F),
    ("sys.ScheduledEnqueueTimeUtc IS NULL", T),
    ("sys.Foo IS NULL", "MissingSystemProperty"),
    ("1 / 0 IS NULL", "DivideByZero"),
    ("missing is not null", F),
    ("EXISTS(color)", T),
    ("EXISTS(COLOR)", T),
    ("EXISTS(nothing)", T),  # present, holding None
    ("EXISTS(missing)", F),
    ("NOT EXISTS(missing)", T),
    ("EXISTS([my prop])", T),
    ("EXISTS(user.color)", T),
    ("EXISTS(sys.MessageId)", T),
    ("EXISTS(sys.ScheduledEnqueueTimeUtc)", F),
    ("EXISTS(sys.Foo)", "MissingSystemProperty"),
    ("exists(color) and color = 'red'", T),
    ("color IN ('red', 'blue')", T),
    ("color IN ('blue')", F),
    ("color NOT IN ('blue')", T),
    ("color NOT IN ('red')", F),
    ("color IN ('red', NULL)", T),
    ("color IN ('blue', NULL)", U),
    ("color NOT IN ('blue', NULL)", U),
    ("color NOT IN ('red', NULL)", F),
    ("missing IN ('red')", U),
    ("missing NOT IN ('red')", U),
    ("NULL IN (NULL)", U),
    ("count IN (1, 2, 3)", T),
    ("count IN (3.0)", T),
    ("price IN (1, 2.5)", T),
    ("count IN (count + 0)", T),
    ("count IN (4, count - 1)", F),
    ("color IN ('red', 1)", "TypeMismatch"),  # mismatch even though 'red' matches
    ("count IN ('a')", "TypeMismatch"),
    ("count IN (1, 1 / 0)", "DivideByZero"),
    ("missing IN (1 / 0)", "DivideByZero"),  # elements are evaluated even for NULL
    ("guid IN ('0F8FAD5B-D9CB-469F-A165-70867728950E')", T),
    ("flag IN (TRUE)", T),
]


@pytest.mark.parametrize(("text", "expected"), NULLS_AND_SETS)
def test_is_null_exists_and_in(text: str, expected: Any) -> None:
    check(text, expected)


# ------------------------------------------------------------------ LIKE

LIKES = [
    ("color LIKE 'red'", T),
    ("color LIKE 're%'", T),
    ("color LIKE '%ed'", T),
    ("color LIKE '%e%'", T),
    ("color LIKE 'r_d'", T),
    ("color LIKE '___'", T),
    ("color LIKE '____'", F),
    ("color LIKE '_'", F),
    ("color LIKE 'R%'", F),  # case-sensitive
    ("color LIKE '%'", T),
    ("color LIKE 'r%d'", T),
    ("color LIKE 'r%e%d'", T),
    ("color LIKE 'r%x%d'", F),
    ("color LIKE 'e'", F),  # whole string
    ("color NOT LIKE 'b%'", T),
    ("color NOT LIKE 'r%'", F),
    ("empty LIKE '%'", T),
    ("empty LIKE '_'", F),
    ("'abc' LIKE 'a%%c'", T),
    ("'ab' LIKE 'a%b%'", T),
    ("'ab' LIKE '%a%b%c'", F),
    ("'aaa' LIKE 'a%a%a'", T),
    ("'aa' LIKE 'a%a%a'", F),
    ("'aXbXc' LIKE 'a%X%c'", T),
    ("'abcabd' LIKE '%ab_'", T),
    ("'a.b' LIKE 'a.b'", T),  # regex metacharacters are literal
    ("'axb' LIKE 'a.b'", F),
    ("'[abc]' LIKE '[abc]'", T),  # no [] character classes
    ("'a' LIKE '[abc]'", F),
    ("nl LIKE 'a_b'", T),  # _ matches a newline too
    ("nl LIKE 'a%'", T),
    # ESCAPE
    ("name LIKE 'Widget!_!%1' ESCAPE '!'", T),
    ("'Widgetx%1' LIKE 'Widget!_!%1' ESCAPE '!'", F),
    ("'Widget_x1' LIKE 'Widget!_!%1' ESCAPE '!'", F),
    ("'50%' LIKE '50!%' ESCAPE '!'", T),
    ("'500' LIKE '50!%' ESCAPE '!'", F),
    ("'a!b' LIKE 'a!!b' ESCAPE '!'", T),
    ("'abc' LIKE 'a!bc' ESCAPE '!'", T),  # escaping an ordinary character
    ("'ab!' LIKE 'ab!' ESCAPE '!'", T),  # a trailing escape matches itself
    ("'a%' LIKE 'a%' ESCAPE '%'", T),
    ("'ab' LIKE 'a%' ESCAPE '%'", F),
    ("'a''b' LIKE 'a''%'", T),
    # NULL and types
    ("missing LIKE 'a%'", U),
    ("missing NOT LIKE 'a%'", U),
    ("color LIKE NULL", U),
    ("color NOT LIKE NULL", U),
    ("NULL LIKE 3", U),
    ("count LIKE '3'", "TypeMismatch"),
    ("color LIKE 3", "TypeMismatch"),
    ("flag LIKE 'T%'", "TypeMismatch"),
    # a pattern computed at evaluation
    ("color LIKE pat", T),
    ("color LIKE p('pat')", T),
    ("color LIKE 'r' + '%'", T),
    ("color LIKE missing", U),
]


@pytest.mark.parametrize(("text", "expected"), LIKES)
def test_like_wildcards_escapes_and_types(text: str, expected: Any) -> None:
    check(text, expected)


def test_like_with_many_wildcards_runs_in_polynomial_time() -> None:
    value = "a" * 20_000
    rec = record({"v": value})
    compiled = compile_filter("v LIKE '" + "%a" * 200 + "%b'")
    assert compiled.evaluate(rec) is False
    assert compile_filter("v LIKE '" + "%a" * 200 + "%'").evaluate(rec) is True


# ------------------------------------------------------------------ arithmetic

ARITHMETIC = [
    ("count + 1 = 4", T),
    ("count - 5 = -2", T),
    ("count * 2 = 6", T),
    ("7 / 2 = 3", T),  # integer division truncates toward zero
    ("-7 / 2 = -3", T),
    ("7 / -2 = -3", T),
    ("-7 / -2 = 3", T),
    ("7 % 3 = 1", T),  # remainder takes the sign of the dividend
    ("-7 % 3 = -1", T),
    ("7 % -3 = 1", T),
    ("-7 % -3 = -1", T),
    ("7 / 2.0 = 3.5", T),
    ("7.0 / 2 = 3.5", T),
    ("price * 2 = 5", T),
    ("1 + 0.5 = 1.5", T),
    ("5.5 % 2 = 1.5", T),
    ("-5.5 % 2 = -1.5", T),
    ("1 / 0 = 0", "DivideByZero"),
    ("1 % 0 = 0", "DivideByZero"),
    ("count / (count - 3) = 1", "DivideByZero"),
    ("1.0 / 0 > 1e308", T),
    ("-1.0 / 0 < -1e308", T),
    ("1 / 0.0 > 1e308", T),
    ("1.0 / -0.0 < 0", T),
    ("1 % 0.0 = 1", F),  # nan
    ("big + 1 = 0", "Overflow"),
    ("small - 1 = 0", "Overflow"),
    ("big * 2 = 0", "Overflow"),
    ("-small = 0", "Overflow"),
    ("small / -1 = 0", "Overflow"),
    ("small % -1 = 0", T),
    ("big + 0 = big", T),
    ("9223372036854775807 = big", T),
    ("1e308 * 10 > 1e308", T),  # double overflow is infinity, not an error
    ("'a' + 'b' = 'ab'", T),
    ("color + '!' = 'red!'", T),
    ("'a' - 'b' = 'c'", "TypeMismatch"),
    ("'a' + 1 = 'a1'", "TypeMismatch"),
    ("flag + 1 = 2", "TypeMismatch"),
    ("flag + flag = 2", "TypeMismatch"),
    ("guid + 'a' = 'x'", "TypeMismatch"),
    ("when + 1 = 1", "TypeMismatch"),
    ("blob + blob = blob", "TypeMismatch"),
    ("missing + 1 = 1", U),
    ("missing + 'a' = 'a'", U),
    ("NULL + TRUE IS NULL", T),
    ("-count = -3", T),
    ("+count = 3", T),
    ("- -count = 3", T),
    ("--1 = 1", T),  # no comments: minus minus one
    ("-price = -2.5", T),
    ("-missing IS NULL", T),
    ("-color = 'x'", "TypeMismatch"),
    ("-flag = 1", "TypeMismatch"),
    ("+'a' = 'a'", "TypeMismatch"),
    ("1 + 2 * 3 = 7", T),
    ("(1 + 2) * 3 = 9", T),
    ("10 - 2 - 3 = 5", T),
    ("100 / 10 / 5 = 2", T),
    ("2 * 3 % 4 = 2", T),
    ("-2 * 3 = -6", T),
    ("1.5e1 = 15", T),
    ("1E3 = 1000", T),
    ("1.5E-1 = 0.15", T),
    (".5 = 0.5", T),
    ("5. = 5", T),
]


@pytest.mark.parametrize(("text", "expected"), ARITHMETIC)
def test_arithmetic_follows_csharp_integer_and_double_rules(text: str, expected: Any) -> None:
    check(text, expected)


# ------------------------------------------------------------------ names and scopes

NAMES = [
    ("[color] = 'red'", T),
    ("\"color\" = 'red'", T),
    ("COLOR = 'red'", T),
    ("CoLoR = 'red'", T),
    ("USER.color = 'red'", T),
    ("user.[color] = 'red'", T),
    ("[my prop] = 7", T),
    ("user.[my prop] = 7", T),
    ("[a]]b] = 8", T),
    ('"a""b" = 9', T),
    ("[and] = 10", T),
    ("p = 11", T),  # function names are names unless called
    ("newid = 12", T),
    ("set = 13", T),
    ("mixed = 1", T),  # two keys differing only by case: the first wins
    ("MIXED = 1", T),
    ("[sys.Label] = 'user-scoped'", T),  # a delimited name is never scoped
    ("sys.[Label] = 'Label1'", T),
    ("sys.\"Label\" = 'Label1'", T),
    ("SYS.LABEL = 'Label1'", T),
    ("sys.label = 'Label1'", T),
    ("sys = 1", U),  # a user property named sys
]


@pytest.mark.parametrize(("text", "expected"), NAMES)
def test_identifiers_are_case_insensitive_and_may_be_delimited(text: str, expected: Any) -> None:
    check(text, expected)


SYSTEM = [
    ("sys.MessageId = 'msg-1'", T),
    ("sys.CorrelationId = 'corr-1'", T),
    ("sys.To = 'dest'", T),
    ("sys.ReplyTo = 'replyq'", T),
    ("sys.Label = 'Label1'", T),
    ("sys.Subject = 'Label1'", T),
    ("sys.SessionId = 'sess-1'", T),
    ("sys.ReplyToSessionId = 'rsess'", T),
    ("sys.ContentType = 'application/json'", T),
    ("sys.PartitionKey = 'sess-1'", T),
    ("sys.SequenceNumber = 42", T),
    ("sys.sequencenumber > 40", T),
    ("sys.DeliveryCount = 1", T),
    ("sys.TimeToLive = 60", T),
    ("sys.Size = 100", T),
    ("sys.ScheduledEnqueueTimeUtc IS NULL", T),
    ("sys.ScheduledEnqueueTimeUtc > sys.EnqueuedTimeUtc", U),
    ("sys.EnqueuedTimeUtc > when", F),
    ("sys.Foo = 1", "MissingSystemProperty"),
    ("sys.ExpiresAtUtc = 1", "MissingSystemProperty"),
    ("sys.LockToken IS NOT NULL", "MissingSystemProperty"),
    ("sys.MessageId = 1", "TypeMismatch"),
    ("property('sys.MessageId') = 'msg-1'", T),
    ("p('SYS.label') = 'Label1'", T),
    ("p('sys.Foo') = 1", "MissingSystemProperty"),
    ("p('user.color') = 'red'", T),
    ("p('COLOR') = 'red'", T),
    ("p('my prop') = 7", T),
    ("p('[color]') IS NULL", T),  # the string is a name, taken verbatim
    ("p(NULL) IS NULL", T),
    ("p(missing) IS NULL", T),
    ("p(1) = 1", "TypeMismatch"),
    ("p('col' + 'or') = 'red'", T),
    ("p(colorname) = 'red'", T),
    ("PROPERTY('color') = 'red'", T),
    ("newid() IS NOT NULL", T),
    ("NEWID() = newid()", F),
    ("newid() <> newid()", T),
]


@pytest.mark.parametrize(("text", "expected"), SYSTEM)
def test_system_properties_and_functions(text: str, expected: Any) -> None:
    check(text, expected)


def test_enqueued_time_is_an_aware_utc_datetime() -> None:
    moment = datetime.fromtimestamp(ENQUEUED, tz=timezone.utc)
    check("sys.EnqueuedTimeUtc = @t", T, {"t": moment})
    check("sys.EnqueuedTimeUtc = @t", T, {"t": moment.replace(tzinfo=None)})


def test_system_property_holding_none_is_null() -> None:
    rec = record(to=None, scheduled_enqueue_time=ENQUEUED + 5, time_to_live=None)
    assert compile_filter("sys.To IS NULL").evaluate(rec) is True
    assert compile_filter("sys.To = 'x'").evaluate(rec) is None
    assert compile_filter("EXISTS(sys.To)").evaluate(rec) is False
    assert compile_filter("sys.TimeToLive IS NULL").evaluate(rec) is True
    assert compile_filter("sys.ScheduledEnqueueTimeUtc > sys.EnqueuedTimeUtc").evaluate(rec)


def test_missing_application_properties_are_all_unknown() -> None:
    rec = MessageRecord(application_properties=None, subject="x")
    assert compile_filter("color = 'red'").evaluate(rec) is None
    assert compile_filter("color IS NULL").evaluate(rec) is True
    assert compile_filter("EXISTS(color)").evaluate(rec) is False


def test_newid_is_fresh_on_each_evaluation() -> None:
    compiled = compile_filter("newid() = @g", {"g": GUID})
    assert compiled.evaluate(record()) is False
    assert compile_filter("newid() = newid()").evaluate(record()) is False


# ------------------------------------------------------------------ parameters

PARAMETERS: list[tuple[str, dict[str, Any], Any]] = [
    ("color = @c", {"@c": "red"}, T),
    ("color = @c", {"c": "red"}, T),
    ("color = @C", {"@c": "red"}, T),
    ("color = @c", {"@C": "red"}, T),
    ("count > @n", {"n": 2}, T),
    ("price = @f", {"f": 2.5}, T),
    ("flag = @b", {"b": True}, T),
    ("@b", {"b": True}, T),
    ("@nul IS NULL", {"nul": None}, T),
    ("guid = @g", {"g": GUID}, T),
    ("when = @w", {"w": datetime(2024, 5, 1, 12, 0)}, T),  # naive parameter is UTC
    ("blob = @y", {"y": b"\x01\x02"}, T),
    ("color IN (@a, @b)", {"a": "blue", "b": "red"}, T),
    ("color LIKE @pat", {"pat": "r%"}, T),
    ("color = 'red'", {"unused": "x"}, T),
    ("@x = 1", {}, SYNTAX),
    ("@x = 1", {"y": 1}, SYNTAX),
    ("color = @c", {"c": [1]}, SYNTAX),
    ("color = @c", {"c": 2**63}, SYNTAX),
    ("color = @c", {"c": 1, "@C": 2}, SYNTAX),
    ("color = 'red'", {"bad": {1: 2}}, SYNTAX),
    ("color = 'red'", {"": 1}, SYNTAX),
]


@pytest.mark.parametrize(("text", "params", "expected"), PARAMETERS)
def test_parameters_are_resolved_at_compile_time(
    text: str, params: dict[str, Any], expected: Any
) -> None:
    check(text, expected, params)


def test_missing_parameter_error_points_at_it() -> None:
    with pytest.raises(FilterSyntaxError) as info:
        compile_filter("color = 'red' AND count = @n")
    assert info.value.position == 26
    assert info.value.text == "color = 'red' AND count = @n"


# ------------------------------------------------------------------ syntax errors

SYNTAX_ERRORS = [
    ("", 0),
    ("   ", 3),
    ("color =", 7),
    ("color = 'red", 8),
    ("color == 'red'", 7),
    ("(color = 'red'", 14),
    ("color = 'red')", 13),
    ("color = 'red' AND", 17),
    ("AND color", 0),
    ("color IN 'red'", 9),
    ("color IN ('red'", 15),
    ("color IN ()", 10),
    ("color IS 'red'", 9),
    ("color IS NOT 1", 13),
    ("color LIKE 'a' ESCAPE 'ab'", 22),
    ("color LIKE 'a' ESCAPE ''", 22),
    ("color LIKE 'a' ESCAPE 1", 22),
    ("foo(1) = 1", 0),
    ("1abc = 1", 0),
    ("1e = 1", 0),
    ("9223372036854775808 = 1", 0),
    ("-9223372036854775808 = 1", 1),
    ("1e999 = 1", 0),
    ("color = 'x' # comment", 12),
    ("a = b = c", 6),
    ("a IS NULL = TRUE", 10),
    ("a < b LIKE 'x'", 6),
    ("NOT", 3),
    ("a = NOT b", 4),
    ("-NOT a", 1),
    ("@ = 1", 0),
    ("a.b = 1", 1),
    ("sys. Label = 1", 4),
    ("sys.", 4),
    ("[] = 1", 0),
    ('"" = 1', 0),
    ("[abc = 1", 0),
    ('"abc = 1', 0),
    ("EXISTS(1)", 7),
    ("EXISTS color", 7),
    ("EXISTS(a + 1)", 9),
    ("newid(1)", 6),
    ("p()", 2),
    ("p(1, 2)", 3),
    ("sys.newid()", 9),
    ("a NOT b", 2),
    ("color = 'red' 1", 14),
    ("a ! b", 2),
    ("a = 1;", 5),
    ("SET a = 1", 4),
    ("a = 1.2.3", 7),
]


@pytest.mark.parametrize(("text", "position"), SYNTAX_ERRORS)
def test_syntax_error_carries_text_and_position(text: str, position: int) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        compile_filter(text)
    assert info.value.position == position, info.value.message
    assert info.value.text == text
    assert info.value.retryable is False
    assert f"position {position}" in str(info.value)


def test_text_of_1024_characters_is_allowed_and_1025_is_not() -> None:
    prefix = "color = '"
    ok = prefix + "x" * (1024 - len(prefix) - 1) + "'"
    assert len(ok) == 1024
    assert compile_filter(ok).evaluate(record()) is False
    too_long = ok[:-1] + "x'"
    with pytest.raises(FilterSyntaxError) as info:
        compile_filter(too_long)
    assert info.value.position == 1024


@pytest.mark.parametrize(
    "build",
    [
        lambda n: "(" * n + "TRUE" + ")" * n,
        lambda n: "NOT " * n + "TRUE",
        lambda n: "-" * n + "1 = -1" if n % 2 else "-" * n + "1 = 1",
        lambda n: "p(" * n + "'x'" + ")" * n + " IS NULL",
        lambda n: "1 IN (" + "-" * (n - 1) + "1)",
    ],
    ids=["parentheses", "not", "unary", "property", "in"],
)
def test_nesting_up_to_the_limit_compiles_and_one_more_level_does_not(build: Any) -> None:
    compile_filter(build(MAX_DEPTH))
    with pytest.raises(FilterSyntaxError, match="nested"):
        compile_filter(build(MAX_DEPTH + 1))


def test_non_string_text_is_a_syntax_error() -> None:
    with pytest.raises(FilterSyntaxError):
        compile_filter(42)  # type: ignore[arg-type]


# ------------------------------------------------------------------ tree shape and pickling


def test_same_precedence_chains_are_flat() -> None:
    tree = parse("a OR b OR c AND d AND e")
    assert isinstance(tree, BoolOp) and tree.op == "OR" and len(tree.operands) == 3
    inner = tree.operands[2]
    assert isinstance(inner, BoolOp) and inner.op == "AND" and len(inner.operands) == 3
    sums = parse("1 + 2 - 3 * 4 / 5 = 0")
    assert isinstance(sums, Compare) and sums.op == "="
    assert isinstance(sums.left, Arith) and [op for op, _ in sums.left.rest] == ["+", "-"]


def test_long_chains_evaluate_without_deep_recursion() -> None:
    rec = record({"n": 1, "f": True})
    text = "+".join(["n"] * 500) + "=500"
    assert len(text) <= 1024
    assert compile_filter(text).evaluate(rec) is True
    text = " AND ".join(["f"] * 170)
    assert compile_filter(text).evaluate(rec) is True


def test_compiled_filter_pickles_as_text_and_parameters() -> None:
    compiled = compile_filter("color = @c AND count > 1", {"@c": "red"})
    loaded = pickle.loads(pickle.dumps(compiled))
    assert loaded.text == compiled.text and loaded.parameters == {"@c": "red"}
    assert loaded.evaluate(record()) is True


def test_matches_is_true_only_for_true() -> None:
    assert compile_filter("color = 'red'").matches(record()) is True
    assert compile_filter("color = 'blue'").matches(record()) is False
    assert compile_filter("missing = 1").matches(record()) is False
    with pytest.raises(FilterEvaluationError) as info:
        compile_filter("1 / 0 = 1").matches(record())
    assert info.value.type_name == "DivideByZero"


def test_evaluation_does_not_change_the_record() -> None:
    rec = record()
    before = dict(rec.application_properties or {})
    compile_filter("EXISTS(color) AND p('count') + 1 = 4 AND newid() IS NOT NULL").evaluate(rec)
    assert rec.application_properties == before


def test_public_surface_of_the_filters_package() -> None:
    import raybus._core.filters as filters

    assert {
        "compile_filter",
        "compile_action",
        "parse",
        "parse_action",
        "CompiledFilter",
        "CompiledAction",
        "SqlRuleFilter",
        "CorrelationRuleFilter",
        "TrueRuleFilter",
        "FalseRuleFilter",
        "SqlRuleAction",
        "RuleProperties",
        "fan_out",
        "matches",
    } <= set(filters.__all__)
    for name in filters.__all__:
        assert hasattr(filters, name), name
