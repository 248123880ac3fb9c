"""A catalogue of bad inputs through the public API (issue 8).

Each case performs one bad operation and names the exception it must raise. For every case the
test checks that exactly that class is raised (with the expected ``argument`` where the class has
one), that its text is one line, and that nothing changed: the runtime counts of every entity of
the module, the entities themselves and the subscription's rules are as before. Settlement cases
then settle the same message validly, proving it was left where it was.

The cases live in ``tests/helpers/bad_input_cases_*.py`` (the frame in ``bad_input_catalogue``).
"""

from __future__ import annotations

from types import SimpleNamespace

import bad_input_cases_io  # noqa: F401 (registers its cases in CASES)
import bad_input_cases_settle  # noqa: F401 (registers its cases in CASES)
import bad_input_catalogue
import pytest
from bad_input_catalogue import ANY, CASES, Case, state_of

from raybus.exceptions import FilterSyntaxError

namespace = bad_input_catalogue.namespace
env = bad_input_catalogue.env


POSITIONED = {
    "sql_filter_syntax",
    "sql_filter_unbalanced_paren",
    "sql_filter_trailing_operator",
    "sql_action_syntax",
}


def test_catalogue_is_large_and_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) >= 60
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("bad", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_refused_with_a_typed_one_line_error_and_changes_nothing(
    env: SimpleNamespace, bad: Case
) -> None:
    state = bad.setup(env) if bad.setup is not None else None
    before = state_of(env)
    with pytest.raises(BaseException) as info:
        bad.bad(env, state)
    error = info.value
    assert type(error) is bad.exc, f"{type(error).__name__}: {error}"
    text = str(error)
    assert text.strip(), "empty error text"
    assert "\n" not in text, f"multi-line error: {text!r}"
    if bad.argument is not ANY:
        assert error.argument == bad.argument, f"argument {error.argument!r}: {text}"  # type: ignore[attr-defined]
        wanted = bad.mentions or bad.argument.split("[")[0]
        spoken = text.lower().replace("_", " ")
        assert wanted.lower().replace("_", " ") in spoken, (
            f"the text does not name {wanted!r}: {text}"
        )
    if bad.name in POSITIONED:
        assert isinstance(error, FilterSyntaxError) and error.position is not None, text
    assert state_of(env) == before
    if bad.after is not None:
        bad.after(env, state)
