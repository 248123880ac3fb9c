"""The topic router's publish log (``raybus._core.publish_log``): numbering, undelivered
publishes, replay and checkpoints, known rooms. Pure, no Ray."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raybus._core.publish_log import PublishLog


def shares(*names: str) -> dict[str, tuple[str, list[Any]]]:
    return {n: ("t/Subscriptions/" + n, [("row", n)]) for n in names}


def test_an_empty_history_draws_a_fresh_source_key_and_a_replayed_one_keeps_its_key() -> None:
    a, first_a = PublishLog.replayed([], "router")
    b, first_b = PublishLog.replayed([], "router")
    assert a.source.startswith("router#") and a.source != b.source
    assert first_a == ("source", a.source) and first_b == ("source", b.source)
    again, first = PublishLog.replayed([first_a], "router")
    assert again.source == a.source and first is None


def test_publishes_are_numbered_in_order_and_done_when_every_partition_acked() -> None:
    log, _ = PublishLog.replayed([], "r")
    n, change = log.begin(shares("p1", "p2"), {"p1": 10, "p2": 10})
    assert n == 0 and change == ("pub", 0, shares("p1", "p2"))
    with pytest.raises(RuntimeError):  # nothing new while one is undelivered
        log.begin(shares("p1"), {})
    assert log.acked(0, "p1", 100) is None
    assert log.acked(0, "p2", None) == ("done", 0)  # p2 is gone: nothing is due to it
    assert log.pending == {} and log.rooms == {"p1": 100}
    assert log.begin(shares("p1"), {"p1": 1})[0] == 1
    with pytest.raises(ValueError):
        PublishLog().begin({}, {})


def test_room_is_known_from_answers_and_taken_by_each_publish() -> None:
    log, _ = PublishLog.replayed([], "r")
    assert log.fits("p1", 1) is None
    log.rooms["p1"] = 100
    assert log.fits("p1", 100) is True and log.fits("p1", 101) is False
    n, _ = log.begin(shares("p1"), {"p1": 60})
    assert log.fits("p1", 41) is False  # taken before the answer comes
    log.acked(n, "p1", 90)
    assert log.fits("p1", 90) is True
    log.forget_rooms()
    assert log.fits("p1", 1) is None


def test_a_publish_that_was_not_logged_never_happened() -> None:
    log, _ = PublishLog.replayed([], "r")
    log.rooms["p1"] = 100
    n, _ = log.begin(shares("p1"), {"p1": 10})
    log.abandon(n)
    assert log.pending == {} and log.rooms == {}


def test_a_refused_share_becomes_a_new_publish_in_one_change() -> None:
    log, first = PublishLog.replayed([], "r")
    n, pub = log.begin(shares("p1", "p2"), {})
    log.acked(n, "p1", 5)
    new, redo = log.redo(n, "p2", shares("p2a", "p2b"))
    assert new == n + 1
    assert log.pending == {new: shares("p2a", "p2b")}
    replayed, _ = PublishLog.replayed([first, pub, redo], "r")
    # p1's ack was not logged: the restarted router delivers n to p1 again (p1 skips it).
    assert replayed.pending == {n: shares("p1"), new: shares("p2a", "p2b")}
    assert replayed.next_number == new + 1


def test_a_redo_that_was_not_logged_is_undone() -> None:
    log, _ = PublishLog.replayed([], "r")
    n, _ = log.begin(shares("p1", "p2"), {})
    log.acked(n, "p1", 5)
    new, _ = log.redo(n, "p2", shares("p2a"))
    log.undo_redo(n, "p2", shares("p2")["p2"], new)
    assert log.pending == {n: shares("p2")}
    assert log.next_number == new + 1  # the number stays used


# One step of a router's life: begin a publish to some partitions, ack one partition of the
# oldest undelivered publish, redo one of its shares, or fail to log the next publish.
_step = st.one_of(
    st.tuples(st.just("begin"), st.sets(st.sampled_from("abcd"), min_size=1)),
    st.tuples(st.just("ack"), st.integers(0, 3)),
    st.tuples(st.just("redo"), st.integers(0, 3)),
    st.tuples(st.just("abandon"), st.sets(st.sampled_from("abcd"), min_size=1)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_step, max_size=30))
def test_replaying_the_logged_changes_or_a_checkpoint_gives_the_undelivered_publishes(
    steps: list[tuple[str, Any]],
) -> None:
    """Whatever happened, a restart from the log (or from a checkpoint of it) has exactly the
    publishes not yet delivered everywhere, minus acks not logged, and numbers every new
    publish above every number ever delivered."""
    log, first = PublishLog.replayed([], "r")
    written: list[Any] = [first]
    delivered_numbers: set[int] = set()
    acked: dict[int, set[str]] = {}
    for kind, arg in steps:
        oldest = min(log.pending) if log.pending else None
        if kind == "begin" and oldest is None:
            n, change = log.begin(shares(*sorted(arg)), {})
            written.append(change)
            delivered_numbers.add(n)
        elif kind == "abandon" and oldest is None:
            n, _ = log.begin(shares(*sorted(arg)), {})
            log.abandon(n)
        elif kind in ("ack", "redo") and oldest is not None:
            names = sorted(log.pending[oldest])
            name = names[arg % len(names)]
            if kind == "ack":
                done = log.acked(oldest, name, 1)
                acked.setdefault(oldest, set()).add(name)
                if done is not None:
                    written.append(done)
            else:
                new, change = log.redo(oldest, name, shares(name + "'"))
                written.append(change)
                delivered_numbers.add(new)
    replayed, again = PublishLog.replayed(written, "r")
    assert again is None and replayed.source == log.source
    # Acks are not logged until a publish is done: a partition that acked may be due again
    # after a restart (it skips the number), one that did not is always due.
    for n in set(replayed.pending) | set(log.pending):
        due, still = set(replayed.pending.get(n, {})), set(log.pending.get(n, {}))
        assert still <= due
        assert due - still <= acked.get(n, set())
    assert all(replayed.next_number > n for n in delivered_numbers)
    from_checkpoint, _ = PublishLog.replayed(replayed.snapshot(), "r")
    assert from_checkpoint == replayed
