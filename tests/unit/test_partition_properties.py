"""Property test: random operation sequences against ``Partition`` keep its invariants.

A hypothesis state machine sends, receives (peek-lock and receive-and-delete, main queue and
dead-letter queue), settles, renews, fetches deferred messages and moves a FakeClock. A small
model remembers the lock tokens it was handed and until when each is valid. After every step:

* receive never hands out a message on which another valid (unexpired, unsettled) lock exists;
* settling or renewing succeeds exactly when the model says the lock is valid;
* every sent message is in exactly one place: main queue (active, locked, deferred or
  scheduled), dead-letter queue, or completed; and
  ``sent == completed + active + dead_letter + scheduled``;
* sequence numbers are unique and increase.

Expired messages are dead-lettered (``dead_lettering_on_message_expiration``), so TTL moves
messages without losing them from the count.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raybus._core.partition import (
    ABANDON,
    COMPLETE,
    DEAD_LETTER,
    DEFER,
    RELEASE,
    Partition,
    SettleOp,
)
from raybus._core.record import DEFERRED, SCHEDULED, MessageRecord, encoded_size
from raybus._models import QueueProperties
from raybus.exceptions import InvalidArgumentError, MessageLockLostError, MessageNotFoundError
from raybus.testing import FakeClock

LOCK = 10.0
EVERYTHING = 10**9


@dataclass
class Held:
    """A lock token the model holds."""

    seq: int
    message_id: str
    until: float
    dead_letter: bool


class PartitionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.p = Partition(
            QueueProperties(
                name="prop",
                lock_duration=LOCK,
                max_delivery_count=3,
                dead_lettering_on_message_expiration=True,
            ),
            self.clock,
        )
        self.sent: set[str] = set()
        self.completed: set[str] = set()
        self.held: dict[str, Held] = {}
        self.used: list[str] = []  # tokens already settled or known lost
        self.deferred: set[int] = set()
        self.next_id = 0
        self.last_send_seq = 0

    # ------------------------------------------------------------ model helpers

    def now(self) -> float:
        return self.clock.now()

    def validly_locked(self) -> set[int]:
        now = self.now()
        return {h.seq for h in self.held.values() if h.until > now}

    def take(self, rec: MessageRecord, *, dead_letter: bool, locked: set[int]) -> None:
        assert rec.sequence_number not in locked, (
            f"seq {rec.sequence_number} handed out while another valid lock exists"
        )
        assert rec.lock_token is not None
        assert rec.lock_token not in self.held and rec.lock_token not in self.used
        assert rec.locked_until == self.now() + LOCK
        self.held[rec.lock_token] = Held(
            rec.sequence_number, rec.message_id or "", rec.locked_until, dead_letter
        )

    def drop(self, token: str) -> None:
        del self.held[token]
        self.used.append(token)

    # ------------------------------------------------------------ rules

    @rule(
        n=st.integers(1, 3),
        ttl=st.sampled_from([None, None, 5.0, 25.0]),
        delay=st.sampled_from([None, None, None, 5.0, 15.0]),
    )
    def send(self, n: int, ttl: float | None, delay: float | None) -> None:
        records = []
        for _ in range(n):
            self.next_id += 1
            rec = MessageRecord(
                body=b"x",
                message_id=f"m{self.next_id}",
                time_to_live=ttl,
                scheduled_enqueue_time=None if delay is None else self.now() + delay,
            )
            encoded_size(rec)
            records.append(rec)
        seqs = self.p.send(records)
        assert len(seqs) == n
        assert seqs == sorted(seqs) and len(set(seqs)) == n
        assert seqs[0] > self.last_send_seq
        self.last_send_seq = seqs[-1]
        self.sent.update(r.message_id for r in records)  # type: ignore[misc]

    @rule(k=st.integers(1, 3), dead_letter=st.booleans(), delete=st.booleans())
    def receive(self, k: int, dead_letter: bool, delete: bool) -> None:
        locked = self.validly_locked()
        got = self.p.receive(k, dead_letter=dead_letter, delete=delete)
        assert len(got) <= k
        seqs = [r.sequence_number for r in got]
        assert len(set(seqs)) == len(seqs)
        for rec in got:
            if delete:
                assert rec.sequence_number not in locked
                assert rec.lock_token is None
                self.completed.add(rec.message_id or "")
            else:
                self.take(rec, dead_letter=dead_letter, locked=locked)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), kind=st.sampled_from([COMPLETE, ABANDON, DEAD_LETTER, DEFER, RELEASE]))
    def settle(self, data: st.DataObject, kind: str) -> None:
        token = data.draw(st.sampled_from(list(self.held)))
        held = self.held[token]
        valid = held.until > self.now()
        [result] = self.p.settle([SettleOp(kind, token)])
        if not valid:
            assert isinstance(result, MessageLockLostError)
            self.drop(token)
        elif kind == DEAD_LETTER and held.dead_letter:
            assert isinstance(result, InvalidArgumentError)  # refused; lock kept
        else:
            assert result is None, result
            self.drop(token)
            if kind == COMPLETE:
                self.completed.add(held.message_id)
            elif kind == DEFER and not held.dead_letter:
                self.deferred.add(held.seq)

    @precondition(lambda self: self.used)
    @rule(data=st.data(), kind=st.sampled_from([COMPLETE, ABANDON, DEFER]))
    def settle_with_used_token(self, data: st.DataObject, kind: str) -> None:
        token = data.draw(st.sampled_from(self.used))
        [result] = self.p.settle([SettleOp(kind, token)])
        assert isinstance(result, MessageLockLostError)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(list(self.held)))
        held = self.held[token]
        [result] = self.p.renew_locks([token])
        if held.until > self.now():
            assert result == self.now() + LOCK
            held.until = result
        else:
            assert isinstance(result, MessageLockLostError)
            self.drop(token)

    @precondition(lambda self: self.deferred)
    @rule(data=st.data())
    def receive_deferred(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.deferred)))
        locked = self.validly_locked()
        try:
            [rec] = self.p.receive_deferred([seq])
        except MessageNotFoundError as exc:
            assert exc.sequence_numbers == [seq]
            if seq not in locked:  # expired (and dead-lettered) or gone for good
                self.deferred.discard(seq)
            return
        assert rec.state == DEFERRED
        self.take(rec, dead_letter=False, locked=locked)

    @rule(seconds=st.sampled_from([0.5, 4.0, 9.9, 10.0, 16.0, 31.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # ------------------------------------------------------------ invariants

    @invariant()
    def counts_are_conserved(self) -> None:
        c = self.p.counts()
        assert len(self.sent) == len(self.completed) + c.active + c.dead_letter + c.scheduled

    @invariant()
    def every_message_is_in_exactly_one_place(self) -> None:
        main = self.p.peek(0, EVERYTHING)
        dlq = self.p.peek(0, EVERYTHING, dead_letter=True)
        ids = [r.message_id for r in main + dlq]
        assert len(ids) == len(set(ids)), "a message is in two places"
        assert not set(ids) & self.completed, "a completed message is still stored"
        assert set(ids) | self.completed == self.sent, "a message was lost"
        seqs = [r.sequence_number for r in main + dlq]
        assert len(seqs) == len(set(seqs)), "sequence numbers are not unique"
        assert [r.sequence_number for r in main] == sorted(r.sequence_number for r in main)
        scheduled = sum(1 for r in main if r.state == SCHEDULED)
        assert scheduled == self.p.counts().scheduled


TestPartitionProperties = PartitionMachine.TestCase
TestPartitionProperties.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, database=None
)
