"""Robustness: no text makes the filter/action parser or compiler fail with anything but
FilterSyntaxError, and no compiled expression fails evaluation with anything but
FilterEvaluationError."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raybus._core.filters import compile_action, compile_filter
from raybus._core.record import MessageRecord
from raybus.exceptions import FilterEvaluationError, FilterSyntaxError

PARAMS: dict[str, Any] = {"@p": 1, "@s": "red", "@n": None, "@f": 2.5, "@b": True}

RECORD = MessageRecord(
    application_properties={
        "a": 1,
        "b": "red",
        "c": 2.5,
        "d": True,
        "e": None,
        "g": uuid.UUID(int=7),
        "t": datetime(2024, 1, 1, tzinfo=timezone.utc),
        "y": b"\x00",
        "big": 2**63 - 1,
    },
    message_id="m",
    subject="s",
    enqueued_time=1.0,
)

TOKENS = [
    "AND", "OR", "NOT", "IS", "NULL", "IN", "LIKE", "ESCAPE", "EXISTS", "TRUE", "FALSE",
    "SET", "REMOVE", "newid", "property", "p",
    "=", "<>", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "(", ")", ",", ";", ".",
    "@", "[", "]", '"', "'",
    "a", "b", "c", "d", "e", "g", "t", "y", "big", "missing",
    "sys.Label", "sys.MessageId", "sys.Foo", "sys.EnqueuedTimeUtc", "user.a", "[a]", '"b"',
    "[x]]y]", "@p", "@s", "@n", "@f", "@b", "@zz",
    "0", "1", "-1", "9223372036854775807", "9223372036854775808", "1.5", ".5", "5.", "1e3",
    "1e400", "'red'", "'%'", "'_'", "'!'", "'r%'", "''", "'it''s'",
]  # fmt: skip

text_soup = st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join)
tight_soup = st.lists(st.sampled_from(TOKENS), max_size=40).map("".join)


def run_filter(text: str) -> None:
    try:
        compiled = compile_filter(text, PARAMS)
    except FilterSyntaxError as e:
        assert e.position is None or 0 <= e.position <= len(text)
        return
    try:
        assert compiled.evaluate(RECORD) in (True, False, None)
    except FilterEvaluationError:
        pass


def run_action(text: str) -> None:
    try:
        compiled = compile_action(text, PARAMS)
    except FilterSyntaxError as e:
        assert e.position is None or 0 <= e.position <= len(text)
        return
    record = MessageRecord(application_properties=dict(RECORD.application_properties or {}))
    try:
        compiled.apply(record)
    except FilterEvaluationError:
        pass


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text(max_size=120))
def test_arbitrary_text_only_ever_raises_filter_syntax_error(text: str) -> None:
    run_filter(text)
    run_action(text)


@FUZZ
@given(st.one_of(text_soup, tight_soup))
def test_token_soup_only_ever_raises_filter_errors(text: str) -> None:
    run_filter(text)


@FUZZ
@given(st.one_of(text_soup, tight_soup).map(lambda s: "SET a = " + s))
def test_action_token_soup_only_ever_raises_filter_errors(text: str) -> None:
    run_action(text)


# A grammar-shaped generator: almost always syntactically valid, exercising evaluation.
_atoms = st.sampled_from(
    [
        "a", "b", "c", "d", "e", "g", "t", "y", "big", "missing", "NULL", "TRUE", "FALSE",
        "0", "1", "-1", "2.5", "'red'", "'r%'", "sys.Label", "sys.SequenceNumber",
        "sys.EnqueuedTimeUtc", "sys.Foo", "newid()", "p('a')", "@p", "@s", "@n", "@f",
    ]
)  # fmt: skip


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.sampled_from(
        ["+", "-", "*", "/", "%", "=", "<>", "<", ">=", "AND", "OR", "LIKE", "NOT LIKE"]
    )
    return st.one_of(
        st.tuples(inner, binary, inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda x: f"(NOT {x})"),
        inner.map(lambda x: f"(-{x})"),
        inner.map(lambda x: f"({x} IS NULL)"),
        st.tuples(inner, st.lists(inner, min_size=1, max_size=3)).map(
            lambda t: f"({t[0]} IN ({', '.join(t[1])}))"
        ),
        inner.map(lambda x: f"EXISTS({x})" if x.isidentifier() else f"({x} IS NOT NULL)"),
    )


expressions = st.recursive(_atoms, _extend, max_leaves=12)


@FUZZ
@given(expressions)
def test_generated_expressions_evaluate_or_raise_filter_evaluation_error(text: str) -> None:
    run_filter(text)
    run_action(f"SET r = {text}; REMOVE a")


def test_deep_nesting_within_the_length_limit_is_a_syntax_error_not_a_crash() -> None:
    for text in ("(" * 1000, "NOT " * 255 + "TRUE", "-" * 1000 + "1", "p(" * 400 + "'a'"):
        try:
            compile_filter(text)
        except FilterSyntaxError as e:
            assert "nested" in e.message or "end of the text" in e.message
