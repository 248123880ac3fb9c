"""Partition maps and slot moves between partitions (``raybus._core.slots``, ``.migration``).

Pure unit tests: plain ``Partition`` objects on a ``FakeClock``, no Ray. A is the source
(partition id 0), B the target (id 1, created serving no slot, as a new partition actor is),
C a spill target (id 2). Durability tests collect a partition's journal into a list (what a
group commit writes), pass it through the Arrow table format and replay it into a fresh
partition, as the Committer does on recovery.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raybus._core import journal, migration
from raybus._core.partition import (
    ABANDON,
    COMPLETE,
    DEAD_LETTER,
    DEFER,
    RELEASE,
    Partition,
    SettleOp,
)
from raybus._core.record import ACTIVE, DEFERRED, SCHEDULED, MessageRecord, encoded_size, to_wire
from raybus._core.slots import SLOTS, PartitionMap, partition_key, slot_of
from raybus._models import QueueProperties
from raybus.exceptions import MessageNotFoundError, PartitionMovedError
from raybus.testing import FakeClock

ALL = frozenset(range(SLOTS))
EVERYTHING = 10_000
NONE: frozenset[int] = frozenset()
LOCK = 30.0

SESSION_QUEUE = {"requires_session": True, "requires_duplicate_detection": True}
KEYED_QUEUE = {"requires_duplicate_detection": True}


# ---------------------------------------------------------------------------- helpers


def rec(body: Any = None, **fields: Any) -> MessageRecord:
    """A fresh, validated record ready to send."""
    r = MessageRecord(body=body if body is not None else f"body {fields}".encode(), **fields)
    encoded_size(r)
    return r


def props(**options: Any) -> QueueProperties:
    return QueueProperties(name="orders", lock_duration=LOCK, **options)


def part(clock: FakeClock, pid: int, owned: frozenset[int] | None, **options: Any) -> Partition:
    """A partition of queue ``orders`` serving ``owned`` (None: every slot)."""
    p = Partition(props(**options), clock, pid)
    p.owned = owned
    return p


def keys_in_distinct_slots(prefix: str, n: int, avoid: Iterable[int] = ()) -> list[str]:
    """``n`` keys ``prefix0``, ``prefix1``, ... whose slots differ from each other and
    from ``avoid``."""
    taken = set(avoid)
    out: list[str] = []
    i = 0
    while len(out) < n:
        key = f"{prefix}{i}"
        i += 1
        if slot_of(key) not in taken:
            taken.add(slot_of(key))
            out.append(key)
    return out


def deliver(
    parts: dict[int, Partition], src: Partition, outbox: dict[str, tuple[int, Any]]
) -> None:
    """What the source actor's outbox flush does: each target adopts, then the source
    forgets the move."""
    for move_id, (target, bundle) in outbox.items():
        assert migration.adopt(parts[target], move_id, bundle) is True
        migration.finish(src, move_id)


def move(
    src: Partition,
    dst: Partition,
    slots: Iterable[int],
    spill: Partition | None = None,
) -> frozenset[int]:
    """Hand ``slots`` from ``src`` over to ``dst`` (and with ``spill`` retire ``src``),
    deliver the bundles, finish; return the pinned slots."""
    parts = {dst.partition_id: dst}
    if spill is not None:
        parts[spill.partition_id] = spill
    out, pinned = migration.hand_over(
        src,
        {dst.partition_id: frozenset(slots)},
        spill.partition_id if spill is not None else None,
    )
    deliver(parts, src, out)
    assert not src.outbox
    return pinned


def accept(p: Partition, session_id: str) -> tuple[str, str]:
    token, _ = p.accept_session(session_id)
    return session_id, token


def settle_one(p: Partition, kind: str, token: str | None, **fields: Any) -> None:
    [result] = p.settle([SettleOp(kind, token, **fields)])  # type: ignore[arg-type]
    assert result is None, result


def all_records(p: Partition) -> list[MessageRecord]:
    """Every message (main, then dead-letter), as peek shows it."""
    return p.peek(0, EVERYTHING) + p.peek(0, EVERYTHING, dead_letter=True)


def ids_of(records: Iterable[MessageRecord]) -> list[str | None]:
    return [r.message_id for r in records]


def without_numbers(r: MessageRecord) -> dict[str, Any]:
    """A record's fields except the sequence numbers (a moved message gets a new one)."""
    d = {name: getattr(r, name) for name in MessageRecord.__dataclass_fields__}
    for name in ("sequence_number", "enqueued_sequence_number", "lock_token", "locked_until"):
        d.pop(name)
    return d


def counted(p: Partition) -> tuple[int, int, int, int]:
    """A partition's counters (without its last access time)."""
    c = p.counts()
    return c.active, c.dead_letter, c.scheduled, c.size_in_bytes


def total_size(*ps: Partition) -> int:
    return sum(p.counts().size_in_bytes for p in ps)


def flush(p: Partition, log: list[journal.Entry]) -> None:
    """A successful group commit: the journal goes to ``log``, everything becomes visible."""
    entries, last = p.take_journal()
    log.extend(entries)
    p.visible_seq = max(p.visible_seq or 0, last)


def recover(
    clock: FakeClock,
    pid: int,
    owned: frozenset[int] | None,
    entries: Iterable[journal.Entry],
    **options: Any,
) -> Partition:
    """A restarted durable partition: created as the actor creates it, then loaded from the
    replay of ``entries`` (after a round trip through the log's table format)."""
    state = journal.replay(journal.from_table(journal.to_table(list(entries))))
    p = part(clock, pid, owned, **options)
    p.load(state)
    p.enable_journal()
    return p


# ============================================================================ 1. slots


def test_slot_of_is_pinned_to_fixed_values():
    """Golden values: slots are stored (durable partitions own slots, messages sit in them),
    so a change of the hash would send existing keys to partitions that do not hold them."""
    assert SLOTS == 1024
    keys = ("", "a", "session-1", "orders/42", "é")
    assert [slot_of(k) for k in keys] == [0, 1001, 72, 901, 464]
    assert slot_of("\ud800") == 714  # a lone surrogate does not raise


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=130))
def test_slot_of_is_stable_and_in_range(key):
    slot = slot_of(key)
    assert 0 <= slot < SLOTS
    assert slot == slot_of(key) == slot_of("".join(list(key)))  # by value, not identity


def test_similar_keys_spread_over_many_slots():
    for pattern in ("s{}", "session-{}", "order/{}/x"):
        slots = Counter(slot_of(pattern.format(i)) for i in range(1000))
        assert len(slots) > 550, pattern  # about 1024 * (1 - e**-(1000/1024)) = 638 expected
        assert max(slots.values()) <= 8, pattern


_ids = st.none() | st.text(min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(session_id=_ids, pkey=_ids, message_id=_ids, dedup=st.booleans())
def test_partition_key_precedence(session_id, pkey, message_id, dedup):
    r = MessageRecord(session_id=session_id, partition_key=pkey, message_id=message_id)
    if session_id is not None:
        expected = session_id
    elif pkey is not None:
        expected = pkey
    elif dedup:
        expected = message_id
    else:
        expected = None
    assert partition_key(r, dedup) == expected


def test_message_id_places_a_message_only_with_duplicate_detection():
    r = MessageRecord(message_id="m")
    assert partition_key(r, True) == "m"
    assert partition_key(r, False) is None


@pytest.mark.parametrize("n", range(1, 65))
def test_initial_map_gives_every_slot_a_contiguous_even_share(n):
    pmap = PartitionMap.initial(n)
    assert pmap.version == 1
    assert len(pmap.slots) == SLOTS
    assert pmap.live == tuple(range(n)) == pmap.partition_ids
    assert pmap.retiring == ()
    assert pmap.next_id == n
    assert set(pmap.slots) == set(range(n))
    counts = Counter(pmap.slots)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert list(pmap.slots) == sorted(pmap.slots)  # each partition one contiguous run
    owned = [pmap.owned_by(p) for p in range(n)]
    assert sum(len(o) for o in owned) == SLOTS
    assert frozenset().union(*owned) == ALL
    for key in ("a", "session-1", "orders/42"):
        assert pmap.owner(key) == pmap.slots[slot_of(key)]
        assert slot_of(key) in pmap.owned_by(pmap.owner(key))


def test_next_id_counts_retiring_partitions_too():
    pmap = PartitionMap(3, PartitionMap.initial(2).slots, (0, 1), (4,))
    assert pmap.partition_ids == (0, 1, 4)
    assert pmap.next_id == 5
    assert pmap.owned_by(4) == frozenset()


def test_balanced_needs_a_live_partition():
    with pytest.raises(ValueError):
        PartitionMap.initial(2).balanced([])


@st.composite
def maps_and_live_sets(draw: st.DrawFn) -> tuple[PartitionMap, list[int]]:
    """Any current map over up to 64 partition ids (random, skewed or contiguous), and any
    non-empty live set of up to 64 ids overlapping it or not."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    ids = list(range(128))
    rnd.shuffle(ids)
    current = ids[: draw(st.integers(1, 64))]
    style = draw(st.sampled_from(["random", "skewed", "contiguous"]))
    if style == "random":
        slots = rnd.choices(current, k=SLOTS)
    elif style == "skewed":
        weights = [rnd.random() ** 4 + 1e-3 for _ in current]
        slots = rnd.choices(current, weights, k=SLOTS)
    else:
        base = PartitionMap.initial(len(current)).slots
        slots = [current[i] for i in base]
    keep = [p for p in current if rnd.random() < draw(st.sampled_from([0.0, 0.5, 1.0]))]
    new = rnd.sample(range(128, 300), draw(st.integers(0, 64)))
    live = (keep + new)[:64] or [current[0]]
    return PartitionMap(1, tuple(slots), tuple(current)), live


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(maps_and_live_sets())
def test_balanced_assigns_every_slot_evenly_with_the_fewest_moves(case):
    pmap, live = case
    out = pmap.balanced(live)
    assert len(out) == SLOTS
    assert set(out) <= set(live)
    counts = Counter(out)
    per_live = [counts.get(p, 0) for p in live]
    assert max(per_live) - min(per_live) <= 1
    assert sum(per_live) == SLOTS
    # Fewest moves: every live partition ends with its quota q (base or base + 1, the
    # ``extra`` larger quotas going anywhere) and can keep at most min(its count, q) of its
    # own slots; so the most that can stay is the sum of min(count, base) plus one for each
    # larger quota given to a partition holding more than base. Nothing else stays or moves.
    base, extra = divmod(SLOTS, len(live))
    before = Counter(pmap.slots)
    stayed = Counter(a for a, b in zip(pmap.slots, out, strict=True) if a == b)
    for p in live:
        quota = counts[p]
        assert quota in (base, base + 1)
        assert stayed[p] == min(before[p], quota), p  # keeps all it can of its own
    most = sum(min(before[p], base) for p in live) + min(
        extra, sum(1 for p in live if before[p] > base)
    )
    assert sum(stayed.values()) == most
    # A balanced map is a fixed point.
    again = PartitionMap(2, out, tuple(live)).balanced(live)
    assert again == out


def test_balanced_moves_no_slot_of_an_already_balanced_map():
    """``balanced`` promises the fewest moves; an evenly spread map needs none. The initial
    map of n partitions is evenly spread (counts differ by at most one), and the scaler calls
    an entity converged only when ``pmap.slots == pmap.balanced(pmap.live)``."""
    churn = {}
    for n in range(1, 65):
        pmap = PartitionMap.initial(n)
        moved = sum(1 for a, b in zip(pmap.slots, pmap.balanced(pmap.live), strict=True) if a != b)
        if moved:
            churn[n] = moved
    assert churn == {}, f"partition counts whose fresh map is not balanced(): {churn}"


# ============================================================================ 2. moves


def _session_history(
    clock: FakeClock, a: Partition, log: list[journal.Entry] | None = None
) -> dict[str, int]:
    """Session s1 on ``a`` with messages in every state, plus session state; returns the
    message ids' original sequence numbers. m0 abandoned once (with a property), m1 released,
    m2 deferred, m3 scheduled, m4 active with a time to live, m5 active. A journaled ``a`` is
    flushed to ``log`` as it goes."""
    seqs = a.send(
        [
            rec(message_id="m0", session_id="s1", application_properties={"k": 1}),
            rec(message_id="m1", session_id="s1"),
            rec(message_id="m2", session_id="s1", time_to_live=500.0),
            rec(message_id="m3", session_id="s1", scheduled_enqueue_time=clock.now() + 50),
            rec(message_id="m4", session_id="s1", time_to_live=100.0),
            rec(message_id="m5", session_id="s1", application_properties={"x": "y"}),
        ]
    )
    if log is not None:
        flush(a, log)
    session = accept(a, "s1")
    m0, m1, m2 = a.receive(3, session=session)
    settle_one(a, ABANDON, m0.lock_token, properties={"retry": True})
    settle_one(a, RELEASE, m1.lock_token)
    settle_one(a, DEFER, m2.lock_token)
    a.set_session_state("s1", session[1], b"state of s1")
    assert a.release_session(*session)
    clock.advance(5)
    return dict(zip(["m0", "m1", "m2", "m3", "m4", "m5"], seqs, strict=True))


@pytest.mark.parametrize("owned", [None, ALL], ids=["unpartitioned-source", "partitioned-source"])
def test_session_moves_whole_in_order_with_every_field(clock, owned):
    a = part(clock, 0, owned, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    old = _session_history(clock, a)
    before = {r.message_id: r for r in a.peek(0, EVERYTHING, session_id="s1")}
    size_before = total_size(a, b)
    assert [before[m].state for m in old] == [ACTIVE, ACTIVE, DEFERRED, SCHEDULED, ACTIVE, ACTIVE]

    pinned = move(a, b, {slot_of("s1")})

    assert pinned == frozenset()
    assert a.peek(0, EVERYTHING, session_id="s1") == []
    assert "s1" not in a.list_sessions()
    assert a.counts().size_in_bytes == 0
    moved = b.peek(0, EVERYTHING, session_id="s1")
    assert ids_of(moved) == list(old)  # original order
    new = [r.sequence_number for r in moved]
    assert new == sorted(new) and len(set(new)) == len(new)
    assert all(s >> 48 == 1 for s in new)  # numbers of B
    for r in moved:
        assert without_numbers(r) == without_numbers(before[r.message_id])
    assert total_size(a, b) == size_before
    assert b.owned == frozenset({slot_of("s1")})
    assert a.owned == ALL - {slot_of("s1")}

    session = accept(b, "s1")
    assert b.get_session_state(*session) == b"state of s1"
    got = b.receive(EVERYTHING, session=session)
    assert ids_of(got) == ["m0", "m1", "m4", "m5"]
    assert [r.delivery_count for r in got] == [1, 0, 0, 0]
    assert got[0].application_properties == {"k": 1, "retry": True}
    assert got[3].application_properties == {"x": "y"}
    [deferred] = b.receive_deferred([old["m2"]], session=session)
    assert deferred.message_id == "m2" and deferred.state == DEFERRED


def test_moved_messages_keep_their_expiry(clock):
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    a.send([rec(message_id="short", session_id="s1", time_to_live=100.0)])
    a.send([rec(message_id="long", session_id="s1", time_to_live=1000.0)])
    clock.advance(60)
    move(a, b, {slot_of("s1")})
    clock.advance(39)
    assert ids_of(b.peek(0, EVERYTHING)) == ["short", "long"]
    clock.advance(2)  # 101 s after "short" was sent
    assert ids_of(b.peek(0, EVERYTHING)) == ["long"]
    assert b.counts().active == 1


def test_moved_message_expiring_is_dead_lettered_when_the_queue_says_so(clock):
    options = {**KEYED_QUEUE, "dead_lettering_on_message_expiration": True}
    a = part(clock, 0, ALL, **options)
    b = part(clock, 1, NONE, **options)
    a.send([rec(message_id="m", partition_key="k", time_to_live=10.0)])
    move(a, b, {slot_of("k")})
    clock.advance(11)
    [dead] = b.peek(0, EVERYTHING, dead_letter=True)
    assert dead.message_id == "m"
    assert dead.dead_letter_reason == "TTLExpiredException"


def test_source_refuses_moved_keys_and_still_serves_the_kept_ones(clock):
    s1, s2 = keys_in_distinct_slots("s", 2)
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    a.send([rec(message_id="x", session_id=s1), rec(message_id="y", session_id=s2)])
    out, pinned = migration.hand_over(a, {1: frozenset({slot_of(s1)})}, None)
    assert pinned == frozenset()
    counts = counted(a)

    with pytest.raises(PartitionMovedError):
        a.send([rec(message_id="x2", session_id=s1)])
    with pytest.raises(PartitionMovedError):  # a batch is refused whole
        a.send([rec(message_id="y2", session_id=s2), rec(message_id="x3", session_id=s1)])
    with pytest.raises(PartitionMovedError):
        a.accept_session(s1)
    assert counted(a) == counts
    assert ids_of(a.peek(0, EVERYTHING)) == ["y"]

    # Until it has adopted the move the target refuses the key too (the sender retries).
    with pytest.raises(PartitionMovedError):
        b.send([rec(message_id="x2", session_id=s1)])
    with pytest.raises(PartitionMovedError):
        b.accept_session(s1)
    deliver({1: b}, a, out)
    b.send([rec(message_id="x2", session_id=s1)])
    assert ids_of(b.peek(0, EVERYTHING)) == ["x", "x2"]

    a.send([rec(message_id="y2", session_id=s2)])
    session = accept(a, s2)
    assert ids_of(a.receive(EVERYTHING, session=session)) == ["y", "y2"]


def test_keyed_messages_of_a_non_session_queue_move_with_their_slot(clock):
    k1, k2 = keys_in_distinct_slots("key", 2)
    a = part(clock, 0, ALL)
    b = part(clock, 1, NONE)
    a.send([rec(message_id=f"{k}-{i}", partition_key=k) for i in range(3) for k in (k1, k2)])
    a.send([rec(message_id="unkeyed")])
    move(a, b, {slot_of(k1)})
    assert ids_of(b.peek(0, EVERYTHING)) == [f"{k1}-{i}" for i in range(3)]
    assert ids_of(a.peek(0, EVERYTHING)) == [f"{k2}-{i}" for i in range(3)] + ["unkeyed"]
    with pytest.raises(PartitionMovedError):
        a.send([rec(partition_key=k1)])
    a.send([rec(message_id="still unkeyed")])  # a live partition takes unkeyed messages
    assert ids_of(b.receive(EVERYTHING)) == [f"{k1}-{i}" for i in range(3)]


@pytest.mark.parametrize("owned", [None, ALL], ids=["unpartitioned-source", "partitioned-source"])
@pytest.mark.parametrize("kind", ["session", "partition_key"])
def test_duplicate_detection_ids_move_with_their_slot(clock, owned, kind):
    """A message id accepted before the move is a duplicate at the target afterwards.

    The id is placed by the message's key (its session or partition key), which here lies in
    another slot than the message id itself would."""
    options = SESSION_QUEUE if kind == "session" else KEYED_QUEUE
    key, mid = "s1", "m1"
    assert slot_of(key) != slot_of(mid)
    field = {"session_id": key} if kind == "session" else {"partition_key": key}
    a = part(clock, 0, owned, **options)
    b = part(clock, 1, NONE, **options)
    [first] = a.send([rec(message_id=mid, **field)])
    move(a, b, {slot_of(key)})
    assert b.counts().active == 1

    again = b.send([rec(message_id=mid, **field)])

    assert b.counts().active == 1, "the repeated message id was stored again at the target"
    assert again == [first]


def test_duplicate_detection_window_keeps_running_at_the_target(clock):
    a = part(clock, 0, ALL, duplicate_detection_history_time_window=60, **SESSION_QUEUE)
    b = part(clock, 1, NONE, duplicate_detection_history_time_window=60, **SESSION_QUEUE)
    a.send([rec(message_id="m", session_id="s1")])
    clock.advance(40)
    move(a, b, {slot_of("s1")})
    b.send([rec(message_id="m", session_id="s1")])
    assert b.counts().active == 1  # 40 s: still a duplicate
    clock.advance(21)
    b.send([rec(message_id="m", session_id="s1")])
    assert b.counts().active == 2  # 61 s after the first copy: a new message


def test_a_session_held_by_a_receiver_pins_its_slot(clock):
    held, free = keys_in_distinct_slots("s", 2)
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    a.send([rec(message_id=f"{s}-{i}", session_id=s) for i in range(2) for s in (held, free)])
    session = accept(a, held)
    [first] = a.receive(1, session=session)
    a.set_session_state(held, session[1], b"kept")
    slots = {slot_of(held), slot_of(free)}

    pinned = move(a, b, slots)

    assert pinned == frozenset({slot_of(held)})
    assert a.owned == ALL - {slot_of(free)}
    assert b.owned == frozenset({slot_of(free)})
    assert ids_of(b.peek(0, EVERYTHING)) == [f"{free}-0", f"{free}-1"]
    assert ids_of(a.peek(0, EVERYTHING)) == [f"{held}-0", f"{held}-1"]
    # A keeps serving the pinned session: its lock, its messages, its state, new sends.
    a.send([rec(message_id=f"{held}-2", session_id=held)])
    settle_one(a, COMPLETE, first.lock_token)
    assert ids_of(a.receive(EVERYTHING, session=session)) == [f"{held}-1", f"{held}-2"]
    assert a.get_session_state(*session) == b"kept"
    assert a.release_session(*session)

    # Released, it moves on the next try, with everything not yet completed.
    assert move(a, b, {slot_of(held)}) == frozenset()
    assert ids_of(b.peek(0, EVERYTHING, session_id=held)) == [f"{held}-1", f"{held}-2"]
    assert [r.delivery_count for r in b.peek(0, EVERYTHING, session_id=held)] == [0, 0]
    assert b.get_session_state(*accept(b, held)) == b"kept"
    assert b.owned == frozenset(slots)
    assert a.owned == ALL - slots


def test_locked_non_session_messages_are_never_moved(clock):
    a = part(clock, 0, ALL)
    b = part(clock, 1, NONE)
    a.send([rec(message_id=f"k-{i}", partition_key="k") for i in range(3)])
    [locked] = a.receive(1)
    move(a, b, {slot_of("k")})
    assert ids_of(a.peek(0, EVERYTHING)) == ["k-0"]
    assert ids_of(b.peek(0, EVERYTHING)) == ["k-1", "k-2"]
    settle_one(a, COMPLETE, locked.lock_token)  # its receiver settles it where it is
    assert a.counts().active == 0


def test_retiring_source_spills_everything_unlocked_and_empties_after_settlement(clock):
    key = "k"
    a = part(clock, 0, ALL)
    b = part(clock, 1, NONE)
    c = part(clock, 2, NONE)
    parts = {1: b, 2: c}
    a.send([rec(message_id="u0"), rec(message_id="u1")])
    a.send([rec(message_id="dead")])
    a.send([rec(message_id="keyed", partition_key=key)])
    a.send([rec(message_id="later", scheduled_enqueue_time=clock.now() + 100)])
    first, second, dead = a.receive(3)
    assert ids_of([first, second, dead]) == ["u0", "u1", "dead"]
    settle_one(a, RELEASE, second.lock_token)
    settle_one(a, DEAD_LETTER, dead.lock_token, reason="bad", description="very")
    size_before = total_size(a, b, c)

    out, pinned = migration.hand_over(a, {1: ALL}, 2)

    assert pinned == frozenset()
    assert a.retiring and a.owned == frozenset()
    assert sorted(t for t, _ in out.values()) == [1, 2]
    with pytest.raises(PartitionMovedError):  # retiring: no unkeyed message either
        a.send([rec(message_id="new")])
    with pytest.raises(PartitionMovedError):
        a.send([rec(message_id="new", partition_key=key)])
    assert not migration.is_empty(a)  # bundles in transit, u0 locked
    deliver(parts, a, out)
    assert ids_of(a.peek(0, EVERYTHING)) == ["u0"]
    assert a.peek(0, EVERYTHING, dead_letter=True) == []
    assert not migration.is_empty(a)  # u0 is still locked here
    assert ids_of(b.peek(0, EVERYTHING)) == ["keyed"]
    assert ids_of(c.peek(0, EVERYTHING)) == ["u1", "later"]
    assert [r.state for r in c.peek(0, EVERYTHING)] == [ACTIVE, SCHEDULED]
    [spilled_dead] = c.peek(0, EVERYTHING, dead_letter=True)
    assert (spilled_dead.message_id, spilled_dead.dead_letter_reason) == ("dead", "bad")
    assert spilled_dead.dead_letter_error_description == "very"
    assert total_size(a, b, c) == size_before

    settle_one(a, ABANDON, first.lock_token)  # back in the queue, still here
    assert not migration.is_empty(a)
    out, _ = migration.hand_over(a, {}, 2)
    assert not migration.is_empty(a)  # in transit
    deliver(parts, a, out)
    assert migration.is_empty(a)
    u0 = c.peek(0, EVERYTHING)[-1]
    assert (u0.message_id, u0.delivery_count) == ("u0", 1)
    assert total_size(a, b, c) == size_before
    assert ids_of(c.receive(EVERYTHING)) == ["u1", "u0"]
    assert ids_of(c.receive(EVERYTHING, dead_letter=True)) == ["dead"]


def test_retiring_source_with_a_held_session_empties_once_it_is_released(clock):
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    a.send([rec(message_id="m", session_id="s1")])
    session = accept(a, "s1")
    out, pinned = migration.hand_over(a, {1: ALL}, 1)
    deliver({1: b}, a, out)
    assert pinned == frozenset({slot_of("s1")})
    assert a.owned == pinned
    assert not migration.is_empty(a)
    assert ids_of(a.receive(1, session=session)) == ["m"]
    assert a.release_session(*session)
    assert not migration.is_empty(a)
    out, pinned = migration.hand_over(a, {1: frozenset({slot_of("s1")})}, 1)
    assert pinned == frozenset()
    deliver({1: b}, a, out)
    assert migration.is_empty(a)
    assert b.owned == ALL
    assert ids_of(b.receive(1, session=accept(b, "s1"))) == ["m"]


def test_adopt_is_idempotent_per_move_id(clock):
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    _session_history(clock, a)
    out, _ = migration.hand_over(a, {1: frozenset({slot_of("s1")})}, None)
    [(move_id, (target, bundle))] = out.items()
    assert target == 1
    assert migration.adopt(b, move_id, bundle) is True
    view = [to_wire([r])[0] for r in all_records(b)]
    counts = counted(b)
    resent = journal.from_table(journal.to_table([(0, 0, 0, bundle)]))[0][3]  # a fresh copy

    assert migration.adopt(b, move_id, bundle) is False
    assert migration.adopt(b, move_id, resent) is False

    assert [to_wire([r])[0] for r in all_records(b)] == view
    assert counted(b) == counts
    # Another move id is another move (the source never reuses one).
    assert migration.adopt(b, "another", migration.Bundle(frozenset())) is True


def test_finish_drops_the_outbox_entry(clock):
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    c = part(clock, 2, NONE, **SESSION_QUEUE)
    s1, s2 = keys_in_distinct_slots("s", 2)
    a.send([rec(session_id=s1), rec(session_id=s2)])
    out, _ = migration.hand_over(
        a, {1: frozenset({slot_of(s1)}), 2: frozenset({slot_of(s2)})}, None
    )
    assert a.outbox == out and len(out) == 2
    assert {t: bun.slots for t, bun in out.values()} == {
        1: frozenset({slot_of(s1)}),
        2: frozenset({slot_of(s2)}),
    }
    (id1, (_, b1)), (id2, (_, b2)) = sorted(out.items(), key=lambda kv: kv[1][0])
    migration.adopt(b, id1, b1)
    migration.finish(a, id1)
    assert set(a.outbox) == {id2}
    migration.finish(a, id1)  # again: nothing
    migration.finish(a, "unknown")
    assert set(a.outbox) == {id2}
    migration.adopt(c, id2, b2)
    migration.finish(a, id2)
    assert a.outbox == {}


def test_a_move_with_no_message_still_carries_its_slots(clock):
    a = part(clock, 0, ALL)
    b = part(clock, 1, NONE)
    slots = frozenset(range(10, 20))
    out, _ = migration.hand_over(a, {1: slots}, None)
    [(target, bundle)] = out.values()
    assert (target, bundle.slots, bundle.records) == (1, slots, [])
    deliver({1: b}, a, out)
    assert b.owned == slots
    assert a.owned == ALL - slots


@pytest.mark.parametrize("sessions", [False, True], ids=["keyed", "session"])
def test_deferred_and_scheduled_messages_are_found_by_their_old_numbers(clock, sessions):
    options = SESSION_QUEUE if sessions else KEYED_QUEUE
    field = {"session_id": "s1"} if sessions else {"partition_key": "s1"}
    a = part(clock, 0, ALL, **options)
    b = part(clock, 1, NONE, **options)
    d_seq, s_seq, s2_seq = a.send(
        [
            rec(message_id="deferred", **field),
            rec(message_id="scheduled", scheduled_enqueue_time=clock.now() + 60, **field),
            rec(message_id="scheduled2", scheduled_enqueue_time=clock.now() + 60, **field),
        ]
    )
    session = accept(a, "s1") if sessions else None
    [d] = a.receive(1, session=session)
    settle_one(a, DEFER, d.lock_token)
    if session is not None:
        a.release_session(*session)

    move(a, b, {slot_of("s1")})

    assert a.locate([d_seq, s_seq, s2_seq]) == []
    assert b.locate([d_seq, s_seq, s2_seq]) == [d_seq, s_seq, s2_seq]
    assert b.resolve(d_seq) != d_seq and b.resolve(d_seq) >> 48 == 1
    assert b.counts().scheduled == 2
    b.cancel_scheduled([s_seq])
    assert b.counts().scheduled == 1
    assert b.locate([s_seq]) == []
    with pytest.raises(MessageNotFoundError):
        b.cancel_scheduled([s_seq])
    session = accept(b, "s1") if sessions else None
    [got] = b.receive_deferred([d_seq], session=session)
    assert got.message_id == "deferred"
    assert got.sequence_number == b.resolve(d_seq)
    settle_one(b, COMPLETE, got.lock_token)
    if session is not None:
        b.release_session(*session)
    # The other scheduled message turns active at its time, at the target.
    clock.advance(61)
    session = accept(b, "s1") if sessions else None
    assert "scheduled2" in ids_of(b.receive(EVERYTHING, session=session))


def test_a_message_moved_twice_is_still_found_by_its_original_number(clock):
    """A deferred message keeps working under the number its sender was given, however many
    times its slot moves (A -> B -> C here, as two consecutive scale-ups would do)."""
    a = part(clock, 0, ALL, **KEYED_QUEUE)
    b = part(clock, 1, NONE, **KEYED_QUEUE)
    c = part(clock, 2, NONE, **KEYED_QUEUE)
    [seq] = a.send([rec(message_id="d", partition_key="k")])
    [r] = a.receive(1)
    settle_one(a, DEFER, r.lock_token)
    move(a, b, {slot_of("k")})
    assert b.locate([seq]) == [seq]
    move(b, c, {slot_of("k")})
    assert ids_of(c.peek(0, EVERYTHING)) == ["d"]

    assert c.locate([seq]) == [seq], "the deferred message is lost to its original number"
    [got] = c.receive_deferred([seq])
    assert got.message_id == "d"


def test_size_is_conserved_with_session_state_and_dead_letters(clock):
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    _session_history(clock, a)
    a.send([rec(message_id="no session")])  # dead-lettered: Session ID is null
    before = total_size(a, b)
    assert before > 0
    move(a, b, {slot_of("s1")})
    assert total_size(a, b) == before
    assert a.counts().size_in_bytes == sum(r.size for r in all_records(a))
    state = len(b"state of s1")
    assert b.counts().size_in_bytes == sum(r.size for r in all_records(b)) + state


# ============================================================================ 3. journal


def _journaled_source(clock: FakeClock) -> tuple[Partition, list[journal.Entry]]:
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    a.enable_journal()
    log: list[journal.Entry] = []
    _session_history(clock, a, log)
    a.send([rec(message_id="other", session_id="stays")])
    assert slot_of("stays") != slot_of("s1")
    flush(a, log)
    return a, log


@pytest.mark.parametrize("source", ["log", "checkpoint", "checkpoint-then-tail"])
@pytest.mark.parametrize("spill", [None, 1], ids=["live", "retiring"])
def test_source_journal_replays_to_the_outbox_without_the_moved_messages(clock, source, spill):
    a, log = _journaled_source(clock)
    early_checkpoint = a.snapshot_entries()
    moves = {1: frozenset({slot_of("s1")})} if spill is None else {1: ALL - {slot_of("stays")}}
    out, _ = migration.hand_over(a, moves, spill)
    tail: list[journal.Entry] = []
    flush(a, tail)
    entries = {
        "log": log + tail,
        "checkpoint": a.snapshot_entries(),
        "checkpoint-then-tail": early_checkpoint + tail,
    }[source]

    r = recover(clock, 0, ALL, entries, **SESSION_QUEUE)

    assert set(r.outbox) == set(out)
    for move_id, (target, bundle) in out.items():
        r_target, r_bundle = r.outbox[move_id]
        assert r_target == target
        assert r_bundle.slots == bundle.slots
        assert r_bundle.records == bundle.records
        assert r_bundle.sessions == bundle.sessions
        assert r_bundle.dedup == bundle.dedup
    assert (r.owned, r.retiring) == (a.owned, a.retiring)
    assert r.retiring is (spill is not None)
    assert ids_of(all_records(r)) == ids_of(all_records(a)) == ["other"]
    assert r.list_sessions() == ["stays"]
    assert counted(r) == counted(a)
    with pytest.raises(PartitionMovedError):
        r.send([rec(message_id="x", session_id="s1")])


def test_finish_is_journaled(clock):
    a, log = _journaled_source(clock)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    out, _ = migration.hand_over(a, {1: frozenset({slot_of("s1")})}, None)
    deliver({1: b}, a, out)
    flush(a, log)
    assert recover(clock, 0, ALL, log, **SESSION_QUEUE).outbox == {}
    assert recover(clock, 0, ALL, a.snapshot_entries(), **SESSION_QUEUE).outbox == {}


@pytest.mark.parametrize("target_saw_it", [False, True], ids=["not-adopted", "adopted"])
def test_recovered_source_resends_its_outbox_exactly_once(clock, target_saw_it):
    a, log = _journaled_source(clock)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    out, _ = migration.hand_over(a, {1: frozenset({slot_of("s1")})}, None)
    flush(a, log)
    if target_saw_it:  # the source crashed after the target adopted, before finish
        assert [migration.adopt(b, m, bun) for m, (_, bun) in out.items()] == [True]

    r = recover(clock, 0, ALL, log, **SESSION_QUEUE)
    for move_id, (_, bundle) in list(r.outbox.items()):
        assert migration.adopt(b, move_id, bundle) is (not target_saw_it)
        migration.finish(r, move_id)

    assert r.outbox == {}
    assert ids_of(b.peek(0, EVERYTHING)) == ["m0", "m1", "m2", "m3", "m4", "m5"]


@pytest.mark.parametrize("source", ["log", "checkpoint"])
def test_target_journal_replays_the_adopted_move(clock, source):
    a = part(clock, 0, ALL, **SESSION_QUEUE)
    old = _session_history(clock, a)
    b = part(clock, 1, NONE, **SESSION_QUEUE)
    b.enable_journal()
    log: list[journal.Entry] = []
    out, _ = migration.hand_over(a, {1: frozenset({slot_of("s1")})}, None)
    [(move_id, (_, bundle))] = out.items()
    assert migration.adopt(b, move_id, bundle)
    flush(b, log)
    entries = log if source == "log" else b.snapshot_entries()

    r = recover(clock, 1, NONE, entries, **SESSION_QUEUE)

    view = [to_wire([x])[0] for x in all_records(r)]
    assert view == [to_wire([x])[0] for x in all_records(b)]
    assert ids_of(all_records(r)) == list(old)
    assert r.owned == b.owned == frozenset({slot_of("s1")})
    assert counted(r) == counted(b)
    assert r.locate(list(old.values())) == [old["m2"], old["m3"]]  # the aliases
    assert migration.adopt(r, move_id, bundle) is False  # the move id
    assert [to_wire([x])[0] for x in all_records(r)] == view
    r.send([rec(message_id="m0", session_id="s1")])  # a duplicate: the dedup ids
    assert counted(r) == counted(b)
    session = accept(r, "s1")
    assert r.get_session_state(*session) == b"state of s1"
    assert ids_of(r.receive(EVERYTHING, session=session)) == ["m0", "m1", "m4", "m5"]
    r.cancel_scheduled([old["m3"]])
    [d] = r.receive_deferred([old["m2"]], session=session)
    assert d.message_id == "m2"
    # New numbers continue after the adopted ones.
    [n] = r.send([rec(message_id="n", session_id="s1")])
    assert n > max(x.sequence_number for x in all_records(b))


# ============================================================================ 4. model


N_SESSIONS = 5
SESSIONS = keys_in_distinct_slots("session-", N_SESSIONS)
SESSION_SLOTS = [slot_of(s) for s in SESSIONS]

# An op: (kind, session, sessions, flag, count); each kind reads what it needs. Sends, moves,
# deliveries and consumption are listed twice to come up more often.
_KINDS = [
    "send", "send", "move", "move", "deliver", "deliver", "hold", "release", "state",
    "consume", "consume", "resend", "crash",
]  # fmt: skip
_session = st.integers(0, N_SESSIONS - 1)
_op = st.tuples(
    st.sampled_from(_KINDS),
    _session,
    st.sets(_session, min_size=1),
    st.booleans(),
    st.integers(1, 3),
)


class _Model:
    """Two durable partitions of a session queue and what a client expects of them."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.initial = [ALL, NONE]
        self.parts = [part(self.clock, i, o, **SESSION_QUEUE) for i, o in enumerate(self.initial)]
        for p in self.parts:
            p.enable_journal()
        self.logs: list[list[journal.Entry]] = [[], []]
        self.expected: dict[str, list[str]] = {s: [] for s in SESSIONS}  # accepted, in order
        self.waiting: dict[str, list[str]] = {s: [] for s in SESSIONS}  # refused, to retry
        self.accepted: list[tuple[str, str]] = []
        self.held: dict[str, tuple[int, str]] = {}  # session -> (partition, token)
        self.states: dict[str, bytes | None] = {}
        self.delivered: list[tuple[int, str, Any]] = []
        self.next_id = 0

    def owner(self, session: str) -> int | None:
        owners = [i for i, p in enumerate(self.parts) if slot_of(session) in (p.owned or ())]
        assert len(owners) <= 1, f"{session} served by {owners}"
        return owners[0] if owners else None

    def flush(self) -> None:
        for p, log in zip(self.parts, self.logs, strict=True):
            flush(p, log)

    def try_send(self, session: str) -> None:
        """Send what waits for ``session`` (the client retrying with a fresh map)."""
        if not self.waiting[session]:
            return
        o = self.owner(session)
        for i, p in enumerate(self.parts):
            if i != o:
                counts = counted(p)
                with pytest.raises(PartitionMovedError):
                    p.send([rec(message_id="probe", session_id=session)])
                assert counted(p) == counts
        if o is None:
            event("send refused while in transit")
            return  # in transit: nobody serves it until the target adopts
        batch = [rec(message_id=m, session_id=session) for m in self.waiting[session]]
        self.parts[o].send(batch)
        self.expected[session].extend(self.waiting[session])
        self.accepted.extend((m, session) for m in self.waiting[session])
        self.waiting[session] = []

    def deliver(self, resend: bool) -> None:
        for src, p in enumerate(self.parts):
            for move_id, (target, bundle) in list(p.outbox.items()):
                assert target == 1 - src
                assert migration.adopt(self.parts[target], move_id, bundle) is True
                migration.finish(p, move_id)
                self.delivered.append((target, move_id, bundle))
        if resend:
            for target, move_id, bundle in self.delivered:
                assert migration.adopt(self.parts[target], move_id, bundle) is False

    def step(self, op: tuple[Any, ...]) -> None:
        kind, index, chosen, flag, count = op
        session = SESSIONS[index]
        if kind == "send":
            for _ in range(count):
                self.waiting[session].append(f"{session}/{self.next_id}")
                self.next_id += 1
            self.try_send(session)
        elif kind == "move":  # each chosen session's slot to the other partition
            by_source: dict[int, set[int]] = {}
            for i in chosen:
                o = self.owner(SESSIONS[i])
                if o is not None:
                    by_source.setdefault(o, set()).add(SESSION_SLOTS[i])
            for src, slots in by_source.items():
                p = self.parts[src]
                out, pinned = migration.hand_over(p, {1 - src: frozenset(slots)}, None)
                held_here = {slot_of(s) for s, (i, _) in self.held.items() if i == src}
                assert pinned == frozenset(slots & held_here)
                assert slots - pinned <= ALL - p.owned
                event(f"move from {src}, pinned" if pinned else f"move from {src}")
                assert set(out) <= set(p.outbox)
        elif kind == "deliver":
            self.deliver(resend=flag)
        elif kind == "hold":
            o = self.owner(session)
            if session not in self.held and o is not None:
                self.held[session] = (o, self.parts[o].accept_session(session)[0])
        elif kind == "release":
            if session in self.held:
                i, token = self.held.pop(session)
                assert self.parts[i].release_session(session, token)
        elif kind == "state":
            if session in self.held:
                i, token = self.held[session]
                data = f"{session}@{self.next_id}".encode() if flag else None
                self.next_id += 1
                self.parts[i].set_session_state(session, token, data)
                self.states[session] = data
        elif kind == "consume":
            o = self.owner(session)
            if o is None:
                return
            p = self.parts[o]
            if session in self.held:
                assert self.held[session][0] == o
                lock = (session, self.held[session][1])
            else:
                lock = accept(p, session)
            got = p.receive(1, session=lock)
            if self.expected[session]:
                assert ids_of(got) == [self.expected[session].pop(0)]
                settle_one(p, COMPLETE, got[0].lock_token)
                event(f"consumed from partition {o}")
            else:
                assert got == []
            if session not in self.held:
                assert p.release_session(*lock)
        elif kind == "resend":
            if self.accepted:
                mid, sid = self.accepted[(index * 7919 + count) % len(self.accepted)]
                o = self.owner(sid)
                if o is not None:
                    counts = counted(self.parts[o])
                    self.parts[o].send([rec(message_id=mid, session_id=sid)])
                    assert counted(self.parts[o]) == counts, f"{mid} stored twice"
                    event(f"duplicate refused by partition {o}")
        elif kind == "crash":
            i = index % 2
            if flag:  # a checkpoint replaces the log
                self.logs[i] = self.parts[i].snapshot_entries()
            self.parts[i] = recover(self.clock, i, self.initial[i], self.logs[i], **SESSION_QUEUE)
            self.held = {s: h for s, h in self.held.items() if h[0] != i}  # locks are lost
            event(f"crash with {len(self.parts[i].outbox)} moves in the outbox")
        self.flush()

    def check_exactly_once(self) -> None:
        """Every accepted, unconsumed message is in exactly one place: A, B or in transit."""
        places: list[str | None] = []
        for p in self.parts:
            places += ids_of(all_records(p))
            for _, bundle in p.outbox.values():
                places += [MessageRecord(*row).message_id for _, row in bundle.records]
        assert Counter(places) == Counter(m for ms in self.expected.values() for m in ms)
        served = [p.owned or frozenset() for p in self.parts]
        assert not served[0] & served[1]

    def finish(self) -> None:
        for session in list(self.held):
            self.step(("release", SESSIONS.index(session), set(), False, 1))
        self.deliver(False)
        for session in SESSIONS:
            self.try_send(session)
        self.flush()
        self.check_exactly_once()
        a, b = self.parts
        assert (a.owned or frozenset()) | (b.owned or frozenset()) == ALL
        assert not a.outbox and not b.outbox
        records = [r for p in self.parts for r in all_records(p)]
        states = sum(len(v) for v in self.states.values() if v is not None)
        assert total_size(a, b) == sum(r.size for r in records) + states
        for session in SESSIONS:
            o = self.owner(session)
            assert o is not None
            other = self.parts[1 - o]
            assert session not in other.list_sessions()
            lock = accept(self.parts[o], session)
            assert self.parts[o].get_session_state(*lock) == self.states.get(session)
            got = self.parts[o].receive(EVERYTHING, session=lock)
            assert ids_of(got) == self.expected[session], session
            assert [r.sequence_number for r in got] == sorted(r.sequence_number for r in got)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(_op, min_size=10, max_size=50))
def test_model_moves_lose_nothing_duplicate_nothing_and_keep_session_order(ops):
    model = _Model()
    for op in ops:
        model.step(op)
        model.check_exactly_once()
    model.finish()
