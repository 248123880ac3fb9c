"""The partition's memory of ended waits (``raybus._core.ended_waits``): an end is kept until
its receive uses it up, or for END_KEEP_S when no receive comes; forgetting happens as later
ends arrive."""

from __future__ import annotations

from raybus._core.ended_waits import END_KEEP_S, EndedWaits
from raybus.testing import FakeClock


def test_an_end_is_kept_until_its_receive_uses_it_up() -> None:
    ended = EndedWaits(FakeClock().now)
    ended.end(["r:1", "r:2"])
    assert "r:1" in ended and "r:2" in ended
    ended.drop("r:1")
    assert "r:1" not in ended and "r:2" in ended
    ended.drop("r:1")  # a receive that was never ended drops nothing
    assert len(ended) == 1


def test_an_end_no_receive_came_for_is_forgotten_after_keep_s_when_another_end_arrives() -> None:
    clock = FakeClock()
    ended = EndedWaits(clock.now)
    ended.end(["early"])
    clock.advance(END_KEEP_S)
    ended.end(["later"])
    assert "early" in ended  # exactly END_KEEP_S old: still kept
    clock.advance(0.5)
    ended.end(["last"])
    assert "early" not in ended
    assert "later" in ended and "last" in ended
    assert len(ended) == 2


def test_ends_are_forgotten_only_when_a_later_end_arrives() -> None:
    clock = FakeClock()
    ended = EndedWaits(clock.now, keep_s=1.0)
    ended.end(["a"])
    clock.advance(10.0)
    assert "a" in ended  # no pruning on a lookup: a receive arriving late still sees it
    ended.end([])
    assert "a" not in ended and len(ended) == 0


def test_ending_a_wait_again_restarts_its_keep_time() -> None:
    clock = FakeClock()
    ended = EndedWaits(clock.now, keep_s=1.0)
    ended.end(["a"])
    clock.advance(0.8)
    ended.end(["a"])
    clock.advance(0.8)
    ended.end(["b"])
    assert "a" in ended  # 0.8 s since its second end, not 1.6 s
