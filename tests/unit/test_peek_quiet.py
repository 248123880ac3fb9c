"""Whether a peek across the partitions is made again (``raybus.aio._fanout.peek_partitioned``):
when a partition's answer says it moved messages out within the round's own round trip, or has
some on their way (a moved bundle is in neither partition while it travels), and for at most
``PEEK_BUDGET_S``. Without Ray: a fake receiver's partitions answer with scripted quiet times,
and each round takes ``ROUND_S`` on a fake clock."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace
from typing import Any

import pytest

from raybus.aio import _fanout
from raybus.aio._fanout import PEEK_BUDGET_S, PEEK_SLACK_S, peek_partitioned
from raybus.exceptions import InvalidArgumentError, MessagingEntityNotFoundError

ROUND_S = 0.1
INF = math.inf


class _Receiver:
    """Partition ``pid`` answers its n-th peek with one message (enqueued at ``pid``) and the
    n-th of its scripted quiet times, the last one repeated. The first peek of a round moves
    the fake clock on by ``ROUND_S``. A refreshed route adds the partitions of ``later``."""

    entity_path = "q"

    def __init__(
        self,
        *quiet: list[float],
        later: tuple[list[float], ...] = (),
        age: float = 0.0,
        checked: bool = False,
    ) -> None:
        self.checked = checked  # a check in the background stores a new route meanwhile
        self.deleted = False  # the entity was deleted: fetching its route again raises
        self.quiet = quiet + later
        self.now = 0.0
        self.fetched = -age  # when the route was last known current
        self.asked: list[int] = []
        self.refreshed = 0
        self._peek_cursors: dict[int, int] = {}
        first = SimpleNamespace(existing=lambda: [(pid, object()) for pid in range(len(quiet))])
        fresh = SimpleNamespace(
            existing=lambda: [(pid, object()) for pid in range(len(self.quiet))]
        )

        async def route(_entity: str, *, refresh: bool = False) -> Any:
            if refresh:
                if self.deleted:
                    raise MessagingEntityNotFoundError("deleted meanwhile", "q")
                self.refreshed += 1
                self.fetched = self.now
            return fresh if refresh else first

        def known_current(_entity: str) -> float:
            return self.fetched

        self._conn = SimpleNamespace(route=route, known_current=known_current)

    async def _peek_quiet(
        self, start: int, count: int, pid: int, timeout: Any
    ) -> tuple[list[Any], float]:
        assert start == pid << 48 and count == 5
        if pid == 0:
            self.now += ROUND_S
            if self.checked:
                self.checked, self.fetched = False, self.now
        n = self.asked.count(pid)
        self.asked.append(pid)
        message = SimpleNamespace(_record=SimpleNamespace(enqueued_time=pid), sequence_number=n)
        script = self.quiet[pid]
        return [message], script[min(n, len(script) - 1)]


def _peek(monkeypatch: pytest.MonkeyPatch, receiver: _Receiver, timeout: Any = None) -> list[Any]:
    monkeypatch.setattr(_fanout, "PEEK_PAUSE_S", 0.0)
    monkeypatch.setattr(_fanout, "time", SimpleNamespace(monotonic=lambda: receiver.now))
    return asyncio.run(peek_partitioned(receiver, 5, 0, timeout))  # type: ignore[arg-type]


def _rounds(receiver: _Receiver, pid: int = 0) -> int:
    return receiver.asked.count(pid)


@pytest.mark.parametrize(
    ("quiet", "rounds"),
    [
        (([INF], [INF], [INF]), 1),  # nothing ever moved
        (([60.0], [INF]), 1),  # long before this round
        (([ROUND_S + 2 * PEEK_SLACK_S], [INF]), 1),  # just before this round
        (([ROUND_S / 2, 60.0], [INF]), 2),  # within the round: made again
        (([INF], [0.0, 0.0, 60.0]), 3),  # some on their way: again until they arrive
        (([ROUND_S, 60.0], [INF]), 2),  # as long ago as the round took: again, to be sure
    ],
)
def test_the_peek_is_made_again_while_a_move_may_have_passed_it_by(
    monkeypatch: pytest.MonkeyPatch, quiet: tuple[list[float], ...], rounds: int
) -> None:
    receiver = _Receiver(*quiet)
    peeked = _peek(monkeypatch, receiver)
    assert sorted(receiver.asked) == sorted(list(range(len(quiet))) * rounds)
    # the answers of the last round, oldest first
    assert [(m._record.enqueued_time, m.sequence_number) for m in peeked] == [
        (pid, rounds - 1) for pid in range(len(quiet))
    ]


def test_a_change_that_goes_on_lets_the_last_round_stand_after_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = _Receiver([0.0], [INF])
    peeked = _peek(monkeypatch, receiver)
    assert _rounds(receiver) == round(PEEK_BUDGET_S / ROUND_S)
    assert [m.sequence_number for m in peeked] == [_rounds(receiver) - 1] * 2


def test_a_shorter_timeout_ends_the_rounds_sooner(monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = _Receiver([0.0], [INF])
    _peek(monkeypatch, receiver, timeout=0.5)
    assert _rounds(receiver) == round(0.5 / ROUND_S)


def test_a_bad_timeout_is_refused_before_any_peek(monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = _Receiver([INF], [INF])
    with pytest.raises(InvalidArgumentError, match="timeout"):
        _peek(monkeypatch, receiver, timeout="soon")
    assert receiver.asked == []


def test_a_move_since_the_route_was_current_peeks_a_fresh_routes_partitions_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scale-up moves messages to a partition this client's map may lack: here the route
    is 60 s old and a partition moved messages out 5 s ago, then some more, twice."""
    receiver = _Receiver([5.0, 0.0, 0.0, 60.0], [INF], later=([INF],), age=60.0)
    peeked = _peek(monkeypatch, receiver)
    assert receiver.refreshed == 1
    assert (_rounds(receiver, 0), _rounds(receiver, 1), _rounds(receiver, 2)) == (4, 4, 3)
    assert sorted(m._record.enqueued_time for m in peeked) == [0, 1, 2]


def test_a_route_stored_by_a_check_during_the_round_does_not_stand_for_the_one_peeked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The peek went on with the partitions of the 60 s old route; a check in the background
    stored a current one meanwhile (the connection's age is then 0). The partitions peeked
    are what count: the route is fetched again and the new partition peeked."""
    receiver = _Receiver([5.0, 60.0], [INF], later=([INF],), age=60.0, checked=True)
    peeked = _peek(monkeypatch, receiver)
    assert receiver.refreshed == 1
    assert sorted(m._record.enqueued_time for m in peeked) == [0, 1, 2]


@pytest.mark.parametrize("age", [0.5, 60.0])
def test_a_route_current_since_the_last_move_is_kept(
    monkeypatch: pytest.MonkeyPatch, age: float
) -> None:
    """Quiet for longer than the route is old, or than the round took: one round."""
    receiver = _Receiver([age * 2], [INF], later=([INF],), age=age)
    peeked = _peek(monkeypatch, receiver)
    assert receiver.refreshed == 0 and _rounds(receiver) == 1 and len(peeked) == 2


def test_an_entity_deleted_before_the_route_is_fetched_again_fails_the_peek(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The error ``route(refresh=True)`` raises for a deleted entity ends the peek after its
    one round (``peek_messages``'s ``Connection.retrying`` then finds the entity deleted on
    its recheck and raises it too, as for any call)."""
    receiver = _Receiver([5.0, 60.0], [INF], later=([INF],), age=60.0)
    receiver.deleted = True
    with pytest.raises(MessagingEntityNotFoundError, match="deleted meanwhile"):
        _peek(monkeypatch, receiver)
    assert sorted(receiver.asked) == [0, 1]
