"""A receive or cancel by number that reaches a partition after a partition change took the
message away: the partition answers where it went (``PartitionActor._or_moved``, raising
``MessagesMovedError``), and the client calls that partition on (``Connection.follow_moves``).

Without Ray: the actor's two helpers run on plain ``Partition`` objects on a ``FakeClock``
(``self`` stands in, as they use nothing of the actor but the core), and ``follow_moves`` on a
stand-in connection whose partitions answer from a script.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from partition_moves_support import ALL, KEYED_QUEUE, NONE, move, part, rec, settle_one
from transactions_core_support import durable, flush, rebuilt

from raybus._actors import partition as partition_actor
from raybus._actors.partition import PartitionActor
from raybus._connection import MOVE_HOPS, Connection
from raybus._core import migration
from raybus._core.partition import DEFER, Partition
from raybus._core.slots import slot_of
from raybus.exceptions import (
    MessageNotFoundError,
    MessagesMovedError,
    MessagingEntityNotFoundError,
    ServiceBusError,
)

# ------------------------------------------------------------------ the partition's answer


def _answer(core: Partition, asked: list[int], *, deferred: bool = True) -> MessageNotFoundError:
    """What the actor raises for ``asked`` at ``core``: the core's own error, as
    ``receive_deferred`` or ``cancel_scheduled`` raises it, passed through ``_or_moved``."""
    actor = SimpleNamespace()
    actor._moved_to = lambda c, seqs: PartitionActor._moved_to(actor, c, seqs)  # type: ignore[arg-type]
    what = "deferred" if deferred else "scheduled"
    try:
        core.receive_deferred(asked) if deferred else core.cancel_scheduled(asked)
    except MessageNotFoundError as missing:
        return asyncio.run(PartitionActor._or_moved(actor, core, asked, missing, what))  # type: ignore[arg-type]
    raise AssertionError("the core found them all")


def _deferred(p: Partition, key: str = "k") -> int:
    [seq] = p.send([rec(message_id=f"d-{key}", partition_key=key)])
    [r] = p.receive(1)
    settle_one(p, DEFER, r.lock_token)
    return seq


def test_a_partition_names_where_its_moved_messages_went(clock):
    a, b = part(clock, 0, ALL, **KEYED_QUEUE), part(clock, 1, NONE, **KEYED_QUEUE)
    seq = _deferred(a)
    [scheduled] = a.send([rec(partition_key="k", scheduled_enqueue_time=clock.now() + 60)])
    move(a, b, {slot_of("k")})

    moved = _answer(a, [seq])
    assert isinstance(moved, MessagesMovedError)
    assert moved.moved == {seq: 1} and moved.sequence_numbers == [seq]
    cancel = _answer(a, [scheduled], deferred=False)
    assert isinstance(cancel, MessagesMovedError) and cancel.moved == {scheduled: 1}
    # The target has them, by the numbers the client asked with.
    assert [r.message_id for r in b.receive_deferred([seq])] == ["d-k"]
    b.cancel_scheduled([scheduled])


def test_a_message_moved_twice_is_named_by_the_partition_it_last_left(clock):
    a, b, c = (part(clock, pid, ALL if pid == 0 else NONE, **KEYED_QUEUE) for pid in range(3))
    seq = _deferred(a)
    move(a, b, {slot_of("k")})
    move(b, c, {slot_of("k")})
    moved = _answer(b, [seq])  # b knew it by an alias of a's number
    assert isinstance(moved, MessagesMovedError) and moved.moved == {seq: 2}


def test_a_source_restarted_after_a_move_still_names_where_it_went(clock):
    """Where a move finished since the last checkpoint took a number comes back with the
    journal (its hand-over and its end are logged): a lookup racing the move and a restart
    is answered, not told "not found". A checkpoint keeps no such memory."""
    a, b = part(clock, 0, ALL, **KEYED_QUEUE), part(clock, 1, NONE, **KEYED_QUEUE)
    log = durable(a)
    [seq] = a.send([rec(message_id="d", partition_key="k")])
    [scheduled] = a.send([rec(partition_key="k", scheduled_enqueue_time=clock.now() + 60)])
    flush(a, log)  # visible once durable
    [r] = a.receive(1)
    settle_one(a, DEFER, r.lock_token)
    move(a, b, {slot_of("k")})
    flush(a, log)

    restarted = rebuilt(a, clock, log)
    assert migration.moved(restarted, [seq, scheduled]) == {seq: (1, None), scheduled: (1, None)}
    moved = _answer(restarted, [seq])
    assert isinstance(moved, MessagesMovedError) and moved.moved == {seq: 1}
    clock.advance(migration.MOVED_OUT_KEEP_S + 1)  # remembered for as long as before
    migration.finish(restarted, "another move")  # (a move's end is what forgets old ones)
    assert migration.moved(rebuilt(a, clock, log), [seq]) == {seq: (1, None)}
    assert migration.moved(rebuilt(a, clock, a.snapshot_entries()), [seq]) == {}


def test_numbers_found_nowhere_are_named_alone_as_not_found(clock):
    a, b = part(clock, 0, ALL, **KEYED_QUEUE), part(clock, 1, NONE, **KEYED_QUEUE)
    seq = _deferred(a)
    move(a, b, {slot_of("k")})
    # One moved, one that never existed: the call is all or none, so it fails, not found,
    # naming the one that is nowhere.
    answer = _answer(a, [seq, 777])
    assert type(answer) is MessageNotFoundError and answer.sequence_numbers == [777]
    assert answer.message == "no deferred message is available with sequence number(s) [777]"
    [kept] = [_deferred(a, "other")]  # a's own slot after the move: not in any move
    a.receive_deferred([kept])
    answer = _answer(a, [kept])  # locked now, not deferred: not found, nowhere moved
    assert type(answer) is MessageNotFoundError


def test_a_move_still_on_its_way_is_waited_for_then_named(clock):
    a, b = part(clock, 0, ALL, **KEYED_QUEUE), part(clock, 1, NONE, **KEYED_QUEUE)
    seq = _deferred(a)
    out, _ = migration.hand_over(a, {1: frozenset({slot_of("k")})}, None)
    [(move_id, (_target, bundle))] = out.items()

    async def arrive() -> None:
        await asyncio.sleep(0.05)
        migration.adopt(b, move_id, bundle)
        migration.finish(a, move_id)

    async def ask() -> MessageNotFoundError:
        actor = SimpleNamespace()
        actor._moved_to = lambda c, s: PartitionActor._moved_to(actor, c, s)  # type: ignore[arg-type]
        try:
            a.receive_deferred([seq])
        except MessageNotFoundError as missing:
            arriving = asyncio.create_task(arrive())
            answer = await PartitionActor._or_moved(actor, a, [seq], missing, "deferred")  # type: ignore[arg-type]
            await arriving
            return answer
        raise AssertionError("found at the source")

    answer = asyncio.run(ask())
    assert isinstance(answer, MessagesMovedError) and answer.moved == {seq: 1}
    assert b.locate([seq]) == [seq]  # the target holds it when the answer names it


def test_a_move_that_does_not_arrive_in_time_leaves_the_number_not_found(clock, monkeypatch):
    monkeypatch.setattr(partition_actor, "MOVE_WAIT_S", 0.05)
    a = part(clock, 0, ALL, **KEYED_QUEUE)
    seq = _deferred(a)
    migration.hand_over(a, {1: frozenset({slot_of("k")})}, None)  # never delivered
    answer = _answer(a, [seq])
    assert type(answer) is MessageNotFoundError and answer.sequence_numbers == [seq]


# ------------------------------------------------------------------ the client following on


class _Connection:
    """``Connection.follow_moves`` on a route that knows the partitions in ``known``; a
    ``recheck`` (a fresh route) learns every partition."""

    follow_moves = Connection.follow_moves

    def __init__(self, known: set[int], *, fresh: set[int] | None = None) -> None:
        self.known = set(known)
        self.fresh = set(range(8)) if fresh is None else fresh  # what a fresh route has
        self.rechecked = 0

    async def route(self, name: str) -> Any:
        assert name == "q"
        return SimpleNamespace(handle=lambda pid: object() if pid in self.known else None)

    async def recheck(self, name: str) -> bool:
        """True if the entity still exists (an empty fresh route: it was deleted)."""
        self.rechecked += 1
        self.known = set(self.fresh)
        return bool(self.fresh)


def _follow(conn: _Connection, pid: int, share: list[int], answers: dict[int, Any]) -> Any:
    """Follow ``share`` from ``pid``; partition p answers each call with the next of
    ``answers[p]``: an exception (raised) or True (it holds the share: returns it)."""
    calls: list[tuple[int, list[int]]] = []

    async def call(p: int, ss: list[int]) -> tuple[int, list[int]]:
        calls.append((p, ss))
        answer = answers[p].pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert p in conn.known, "called a partition missing from the route"
        return p, ss

    outcomes = asyncio.run(conn.follow_moves("q", pid, share, call))  # type: ignore[arg-type]
    return outcomes, calls


def _moved(moved: dict[int, int]) -> MessagesMovedError:
    return MessagesMovedError("moved", "q", list(moved), moved)


def test_a_moved_share_is_split_between_the_new_partitions_and_the_rest_stays():
    conn = _Connection({0, 1, 2})
    outcomes, calls = _follow(
        conn, 0, [10, 11, 12], {0: [_moved({10: 1, 11: 2}), True], 1: [True], 2: [True]}
    )
    assert sorted(outcomes) == [(0, [12]), (1, [10]), (2, [11])]
    assert calls[0] == (0, [10, 11, 12]) and conn.rechecked == 0


def test_a_new_partition_missing_from_the_route_fetches_a_fresh_one_first():
    conn = _Connection({0})
    outcomes, _calls = _follow(conn, 0, [10], {0: [_moved({10: 3})], 3: [True]})
    assert outcomes == [(3, [10])] and conn.rechecked == 1


def test_a_message_that_keeps_moving_is_followed_up_to_the_hops_then_not_found():
    conn = _Connection({0, 1})
    answers = {0: [_moved({10: 1})] * 5, 1: [_moved({10: 0})] * 5}
    [outcome], calls = _follow(conn, 0, [10], answers)
    assert isinstance(outcome, MessageNotFoundError) and len(calls) == MOVE_HOPS + 1


def test_other_errors_are_outcomes_of_their_share():
    conn = _Connection({0, 1})
    refused = ServiceBusError("refused", "q")
    outcomes, _calls = _follow(conn, 0, [10, 11], {0: [_moved({10: 1}), True], 1: [refused]})
    assert refused in outcomes and (0, [11]) in outcomes and len(outcomes) == 2


def test_a_share_whose_partition_a_scale_down_removed_meanwhile_is_not_found():
    """The partition named is missing from the fresh route too: that share fails as
    not-found without a call, the others go on."""
    conn = _Connection({0}, fresh={0})
    outcomes, calls = _follow(conn, 0, [10, 11], {0: [_moved({10: 1}), True]})
    [gone] = [o for o in outcomes if isinstance(o, Exception)]
    assert type(gone) is MessageNotFoundError and gone.sequence_numbers == [10]
    assert "partition 1" in str(gone) and (0, [11]) in outcomes and len(outcomes) == 2
    assert calls == [(0, [10, 11]), (0, [11])] and conn.rechecked == 1


def test_an_entity_deleted_while_its_messages_moved_fails_every_share():
    conn = _Connection({0}, fresh=set())
    outcomes, calls = _follow(conn, 0, [10, 11], {0: [_moved({10: 3})]})
    assert [type(o) for o in outcomes] == [MessagingEntityNotFoundError]
    assert calls == [(0, [10, 11])]


@pytest.mark.parametrize("hops", [0, 1])
def test_a_call_that_is_answered_needs_no_follow(hops):
    conn = _Connection({0})
    outcomes = asyncio.run(
        conn.follow_moves("q", 0, [1], lambda p, ss: _true(), hops)  # type: ignore[arg-type]
    )
    assert outcomes == [True]


async def _true() -> bool:
    return True


def test_a_cancel_whose_partition_left_the_route_after_the_lookup_is_not_found():
    """``ServiceBusSender._cancel_located``: the lookup named partition 5; by the call, a
    fresh route no longer has it. Nothing is called; the numbers are not found."""
    from raybus.aio._sender import ServiceBusSender

    located = SimpleNamespace(handle=lambda pid: object() if pid == 5 else None)
    now = SimpleNamespace(handle=lambda pid: None)
    routes = [located, now]

    async def route(name: str, refresh: bool = False) -> Any:
        return routes.pop(0)

    async def retrying(name: str, op: Any) -> Any:
        return await op()

    async def locate(route: Any, seqs: list[int], state: Any) -> Any:
        assert route is located
        return {5: list(seqs)}, []

    conn = _Connection({0})
    conn.retrying, conn.locate = retrying, locate  # type: ignore[attr-defined]
    conn.route = route  # type: ignore[method-assign]
    sender = SimpleNamespace(entity_path="q", _conn=conn, _closed=False)
    sender._route = lambda refresh=False: ServiceBusSender._route(sender, refresh)  # type: ignore[arg-type]
    with pytest.raises(MessageNotFoundError, match="partition 5 is gone") as gone:
        asyncio.run(ServiceBusSender._cancel_located(sender, [10, 11], None))  # type: ignore[arg-type]
    assert gone.value.sequence_numbers == [10, 11] and routes == []
