"""Fail points without Ray: ``mode="raise"`` fails one call and leaves the process up; a bad
mode is refused by name. (``mode="exit"`` ends the process: the fault tests use it.)"""

from __future__ import annotations

import pickle

import pytest

from raybus import _failpoints
from raybus._failpoints import FailPointError
from raybus.exceptions import InvalidArgumentError


def test_a_point_armed_to_raise_fails_once_then_passes() -> None:
    _failpoints.hit("test.point")  # unarmed: nothing happens
    _failpoints.arm("test.point", "raise")
    with pytest.raises(FailPointError, match=r"test\.point") as info:
        _failpoints.hit("test.point")
    assert pickle.loads(pickle.dumps(info.value)).name == "test.point"  # crosses actors
    _failpoints.hit("test.point")  # fired once: disarmed


def test_a_bad_mode_is_refused_and_arms_nothing() -> None:
    with pytest.raises(InvalidArgumentError, match="'crash'") as info:
        _failpoints.arm("test.other", "crash")
    assert info.value.argument == "mode"
    _failpoints.hit("test.other")  # not armed
