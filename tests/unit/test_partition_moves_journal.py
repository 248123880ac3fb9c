"""Slot moves through the journal, and a model-based test of moves (``raybus._core.migration``).

Pure unit tests: plain ``Partition`` objects on a ``FakeClock``, no Ray. Durability tests
collect a partition's journal into a list (what a group commit writes), pass it through the
Arrow table format and replay it into a fresh partition, as the Committer does on recovery.
The model checks that random moves lose nothing, duplicate nothing and keep session order.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from partition_moves_support import (
    ALL,
    EVERYTHING,
    NONE,
    SESSION_QUEUE,
    _session_history,
    accept,
    all_records,
    counted,
    deliver,
    flush,
    ids_of,
    keys_in_distinct_slots,
    part,
    rec,
    recover,
    settle_one,
    total_size,
)

from raybus._core import journal, migration
from raybus._core.partition import COMPLETE, Partition
from raybus._core.record import MessageRecord, to_wire
from raybus._core.slots import slot_of
from raybus.exceptions import PartitionMovedError
from raybus.testing import FakeClock

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
