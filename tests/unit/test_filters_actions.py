"""SQL rule actions: SET/REMOVE on user and system properties, statement lists, errors."""

from __future__ import annotations

import pickle
import uuid
from datetime import datetime
from typing import Any

import pytest

from raybus._core.filters import MAX_STATEMENTS, compile_action, parse_action
from raybus._core.record import MessageRecord, snapshot
from raybus.exceptions import FilterEvaluationError, FilterSyntaxError


def record(props: dict[str, Any] | None = None, **fields: Any) -> MessageRecord:
    base: dict[str, Any] = dict(message_id="msg-1", subject="Label1", to="dest", sequence_number=9)
    base.update(fields)
    default = {"color": "red", "count": 3, "Mixed": 1, "mixed": 2}
    return MessageRecord(application_properties=dict(default if props is None else props), **base)


def applied(text: str, rec: MessageRecord | None = None, params: Any = None) -> MessageRecord:
    rec = record() if rec is None else rec
    compile_action(text, params).apply(rec)
    return rec


def props_after(text: str, params: Any = None) -> dict[str, Any]:
    return applied(text, params=params).application_properties or {}


# ------------------------------------------------------------------ user properties

B = {"color": "red", "count": 3, "Mixed": 1, "mixed": 2}

USER_CASES: list[tuple[str, dict[str, Any]]] = [
    ("SET x = 1", {**B, "x": 1}),
    ("SET color = 'blue'", {**B, "color": "blue"}),
    # an existing key is updated in place, keeping its spelling
    ("SET COLOR = 'blue'", {**B, "color": "blue"}),
    ("SET mixed = 5", {**B, "Mixed": 5}),
    ("SET x = color + '!'", {**B, "x": "red!"}),
    ("SET x = missing", {**B, "x": None}),
    ("SET x = NULL", {**B, "x": None}),
    ("SET x = count > 1", {**B, "x": True}),
    ("SET x = 1 = 2", {**B, "x": False}),
    ("SET x = 7 / 2", {**B, "x": 3}),
    ("SET x = sys.Label", {**B, "x": "Label1"}),
    ("SET x = sys.SequenceNumber", {**B, "x": 9}),
    ("REMOVE color", {"count": 3, "Mixed": 1, "mixed": 2}),
    ("REMOVE COLOR", {"count": 3, "Mixed": 1, "mixed": 2}),
    ("REMOVE missing", B),
    ("REMOVE mixed", {"color": "red", "count": 3}),  # every case variant goes
    ("SET [my prop] = 1", {**B, "my prop": 1}),
    ("SET user.x = 1", {**B, "x": 1}),
    ('SET "a""b" = 1', {**B, 'a"b': 1}),
    ("set x = 1", {**B, "x": 1}),
    ("Remove Color", {"count": 3, "Mixed": 1, "mixed": 2}),
    # statements run in order, each seeing the earlier ones
    (
        "SET a = 1; SET b = a + 1",
        {**B, "a": 1, "b": 2},
    ),
    (
        "SET a = 1, SET b = a * 10;",
        {**B, "a": 1, "b": 10},
    ),
    ("REMOVE color; SET x = color", {"count": 3, "Mixed": 1, "mixed": 2, "x": None}),
    (
        "SET count = count + 1; SET count = count + 1",
        {**B, "count": 5},
    ),
    ("SET set = 1", {**B, "set": 1}),
    ("REMOVE remove", B),
]


@pytest.mark.parametrize(("text", "expected"), USER_CASES)
def test_set_and_remove_change_user_properties(text: str, expected: dict[str, Any]) -> None:
    assert props_after(text) == expected


def test_set_stores_uuids_and_aware_datetimes_as_such() -> None:
    props = props_after("SET g = newid(), SET t = sys.EnqueuedTimeUtc")
    assert isinstance(props["g"], uuid.UUID)
    assert isinstance(props["t"], datetime) and props["t"].tzinfo is not None


def test_set_with_parameters() -> None:
    assert props_after("SET x = @v + 1", {"@v": 41})["x"] == 42
    with pytest.raises(FilterSyntaxError):
        compile_action("SET x = @v")


def test_set_creates_the_properties_dict_and_remove_leaves_none_alone() -> None:
    rec = MessageRecord(application_properties=None)
    compile_action("REMOVE x").apply(rec)
    assert rec.application_properties is None
    compile_action("SET x = 1").apply(rec)
    assert rec.application_properties == {"x": 1}


def test_apply_never_mutates_a_dict_shared_with_other_snapshots() -> None:
    original = record()
    copy = snapshot(original)
    shared = original.application_properties
    compile_action("SET color = 'blue'; REMOVE count").apply(copy)
    assert original.application_properties is shared
    assert shared == {"color": "red", "count": 3, "Mixed": 1, "mixed": 2}
    assert copy.application_properties == {"color": "blue", "Mixed": 1, "mixed": 2}


# ------------------------------------------------------------------ system properties

SYSTEM_FIELDS = [
    ("MessageId", "message_id"),
    ("CorrelationId", "correlation_id"),
    ("To", "to"),
    ("ReplyTo", "reply_to"),
    ("Label", "subject"),
    ("Subject", "subject"),
    ("SessionId", "session_id"),
    ("ReplyToSessionId", "reply_to_session_id"),
    ("ContentType", "content_type"),
]


@pytest.mark.parametrize(("name", "field"), SYSTEM_FIELDS)
def test_set_string_system_property(name: str, field: str) -> None:
    rec = applied(f"SET sys.{name} = 'new-' + sys.{name}", record(**{field: "v"}))
    assert getattr(rec, field) == "new-v"
    rec = applied(f"SET SYS.{name.upper()} = NULL")
    assert getattr(rec, field) is None


EVALUATION_ERRORS = [
    ("SET sys.To = 1", "TypeMismatch"),
    ("SET sys.Label = TRUE", "TypeMismatch"),
    ("SET sys.SequenceNumber = 1", "ReadOnlySystemProperty"),
    ("SET sys.PartitionKey = 'k'", "ReadOnlySystemProperty"),
    ("SET sys.EnqueuedTimeUtc = NULL", "ReadOnlySystemProperty"),
    ("SET sys.Foo = 'x'", "MissingSystemProperty"),
    ("SET x = sys.Foo", "MissingSystemProperty"),
    ("SET x = 1 / 0", "DivideByZero"),
    ("SET x = 9223372036854775807 + 1", "Overflow"),
    ("SET x = color - 1", "TypeMismatch"),
    ("SET x = NOT count", "NotBoolean"),
]


@pytest.mark.parametrize(("text", "type_name"), EVALUATION_ERRORS)
def test_action_evaluation_errors(text: str, type_name: str) -> None:
    with pytest.raises(FilterEvaluationError) as info:
        applied(text)
    assert info.value.type_name == type_name


def test_set_of_the_scheduled_enqueue_time_is_ignored_but_its_value_is_evaluated() -> None:
    # Service Bus ignores a subscription rule's SET of ScheduledEnqueueTimeUtc.
    before = record(scheduled_enqueue_time=None)
    rec = applied("SET sys.ScheduledEnqueueTimeUtc = sys.EnqueuedTimeUtc; SET a = 1", before)
    assert rec.scheduled_enqueue_time is None
    assert rec.application_properties is not None and rec.application_properties["a"] == 1
    with pytest.raises(FilterEvaluationError) as info:
        applied("SET sys.ScheduledEnqueueTimeUtc = 1 / 0")
    assert info.value.type_name == "DivideByZero"


def test_failed_action_leaves_the_record_unchanged() -> None:
    rec = record()
    before = (dict(rec.application_properties or {}), rec.subject, rec.to)
    with pytest.raises(FilterEvaluationError):
        compile_action("SET a = 1; SET sys.Label = 'changed'; REMOVE color; SET b = 1 / 0").apply(
            rec
        )
    assert (rec.application_properties, rec.subject, rec.to) == before


def test_action_size_is_not_recomputed() -> None:
    rec = record(size=123)
    compile_action("SET x = 'a long value'").apply(rec)
    assert rec.size == 123


# ------------------------------------------------------------------ syntax

ACTION_SYNTAX_ERRORS = [
    ("", 0),
    (";", 0),
    ("SET", 3),
    ("SET x", 5),
    ("SET x =", 7),
    ("SET x = 1,", 10),
    ("SET x = 1;;", 10),
    ("SET x = 1 SET y = 2", 10),
    ("SET x = 1,, SET y = 2", 10),
    ("UPDATE x = 1", 0),
    ("x = 1", 0),
    ("REMOVE sys.Label", 7),
    ("REMOVE sys.Foo", 7),
    ("REMOVE 'x'", 7),
    ("SET 'x' = 1", 4),
    ("SET sys.To == 'x'", 12),
    ("SET x = @missing", 8),
    ("[SET] x = 1", 0),
    ("SET x = (1", 10),
]


@pytest.mark.parametrize(("text", "position"), ACTION_SYNTAX_ERRORS)
def test_action_syntax_errors_carry_the_position(text: str, position: int) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        compile_action(text)
    assert info.value.position == position, info.value.message
    assert info.value.text == text


def test_action_may_have_32_statements_but_not_33() -> None:
    ok = "; ".join(f"SET p{i} = {i}" for i in range(MAX_STATEMENTS))
    assert len(parse_action(ok).statements) == MAX_STATEMENTS
    assert len(props_after(ok)) == 4 + MAX_STATEMENTS
    too_many = ok + "; SET last = 1"
    with pytest.raises(FilterSyntaxError) as info:
        compile_action(too_many)
    assert info.value.position == too_many.index("SET last")


def test_action_text_limit_is_1024_characters() -> None:
    ok = "SET x = '" + "y" * (1024 - 10) + "'"
    assert len(ok) == 1024
    compile_action(ok)
    with pytest.raises(FilterSyntaxError):
        compile_action(ok[:-1] + "y'")


def test_compiled_action_pickles_as_text_and_parameters() -> None:
    action = compile_action("SET x = @v; REMOVE color", {"v": 5})
    loaded = pickle.loads(pickle.dumps(action))
    rec = record()
    loaded.apply(rec)
    assert rec.application_properties == {"count": 3, "Mixed": 1, "mixed": 2, "x": 5}
