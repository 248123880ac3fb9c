"""Random operations, flushes, failed flushes and crashes against a model of what was
acknowledged (hypothesis stateful test).

The model keeps two copies of the queue, message id -> (where, delivery count): ``memory``
(every operation applied at once) and ``durable`` (``memory`` as of the last successful
``durable()``). A failed flush and a crash both turn ``memory`` back into ``durable``; after a
crash the recovered partition must hold exactly ``durable`` (active, deferred and dead-lettered
messages, with their delivery counts), sequence numbers continue gap-free from the last
acknowledged one, and locks from before the crash are gone.
"""

from __future__ import annotations

import asyncio
import errno
from typing import Any

from durability_helpers import EVERYTHING, by_id, committer_on, faulty_fs, records
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from raybus._core.committer import Committer
from raybus._core.partition import ABANDON, COMPLETE, DEAD_LETTER, DEFER, RELEASE, SettleOp
from raybus._core.record import DEFERRED
from raybus._storage import StorageUnavailableError
from raybus.exceptions import MessageLockLostError
from raybus.testing import FakeClock

DIR = "bucket/ns/orders/0"
MAX_DELIVERY = 3
KINDS = [COMPLETE, ABANDON, DEAD_LETTER, DEFER, RELEASE]

Model = dict[str, tuple[str, int]]  # message id -> ("active" | "deferred" | "dlq", delivery count)


class DurableQueue(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.fs, self.handler = faulty_fs()
        self.committer = self.open()
        self.memory: Model = {}
        self.durable: Model = {}
        self.highest_dc: dict[str, int] = {}  # the largest delivery count ever acknowledged
        self.seq_of: dict[str, int] = {}
        self.assigned = 0  # the last sequence number handed out (memory)
        self.acked = 0  # the last sequence number made durable
        self.locks: dict[str, str] = {}  # lock token -> message id
        self.stale: list[str] = []  # tokens from before a crash or a failed flush
        self.n = 0

    # ------------------------------------------------------------ plumbing

    def open(self) -> Committer:
        return committer_on(
            self.fs, DIR, self.clock, checkpoint_min=8, max_delivery_count=MAX_DELIVERY
        )

    def run(self, coro: Any) -> Any:
        """Run ``coro``, then let background work (a checkpoint after a flush) finish, so
        nothing happens between rules."""
        try:
            return self.loop.run_until_complete(coro)
        finally:
            pending = asyncio.all_tasks(self.loop)
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

    def teardown(self) -> None:
        self.loop.close()

    @property
    def core(self) -> Any:
        return self.committer.core

    def observed(self) -> Model:
        out: Model = {}
        for mid, rec in by_id(self.core).items():
            where = "dlq" if rec.dead_letter_reason else "deferred" if rec.state == DEFERRED else ""
            out[mid] = (where or "active", rec.delivery_count)
        return out

    def lose_memory(self) -> None:
        """What a crash or a failed flush leaves: the durable state, no locks."""
        self.memory = dict(self.durable)
        self.stale += list(self.locks)
        self.locks.clear()
        self.assigned = self.acked

    # ------------------------------------------------------------ operations

    @initialize()
    def some_durable_messages(self) -> None:
        self.send(6)
        self.flush()

    @rule(k=st.integers(1, 4))
    def send(self, k: int) -> None:
        mids = [f"m{self.n + i}" for i in range(k)]
        self.n += k
        seqs = self.core.send(records(*mids))
        assert seqs == list(range(self.assigned + 1, self.assigned + k + 1)), (
            "sequence numbers must continue gap-free after the last acknowledged one"
        )
        self.assigned = seqs[-1]
        for mid, seq in zip(mids, seqs, strict=True):
            self.memory[mid] = ("active", 0)
            self.seq_of[mid] = seq

    @rule(k=st.integers(1, 5))
    def receive(self, k: int) -> None:
        for rec in self.core.receive(k):
            mid = rec.message_id or ""
            assert mid in self.durable, f"{mid} was handed out before it was durable"
            assert self.memory[mid] == ("active", rec.delivery_count)
            assert mid not in self.locks.values()
            self.locks[rec.lock_token or ""] = mid

    @rule(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=4))
    def deliver(self, kinds: list[str]) -> None:
        """Receive messages and settle each at once, one kind each."""
        held = set(self.locks)
        self.receive(len(kinds))
        for token, kind in zip(sorted(set(self.locks) - held), kinds, strict=False):
            self.settle_one(token, kind)

    @precondition(lambda self: any(w == "deferred" for w, _ in self.memory.values()))
    @rule(i=st.integers(0, 50))
    def receive_deferred(self, i: int) -> None:
        deferred = sorted(m for m, (w, _) in self.memory.items() if w == "deferred")
        mid = deferred[i % len(deferred)]
        if mid in self.locks.values():
            return
        [rec] = self.core.receive_deferred([self.seq_of[mid]])
        assert rec.message_id == mid
        self.locks[rec.lock_token or ""] = mid

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 50), kind=st.sampled_from(KINDS))
    def settle(self, i: int, kind: str) -> None:
        self.settle_one(sorted(self.locks)[i % len(self.locks)], kind)

    def settle_one(self, token: str, kind: str) -> None:
        mid = self.locks.pop(token)
        reason = "app" if kind == DEAD_LETTER else None
        assert self.core.settle([SettleOp(kind, token, None, reason)]) == [None]
        where, dc = self.memory[mid]
        if kind == COMPLETE:
            del self.memory[mid]
        elif kind == ABANDON:
            dc += 1
            self.memory[mid] = ("dlq" if dc >= MAX_DELIVERY else where, dc)
        elif kind == DEAD_LETTER:
            self.memory[mid] = ("dlq", dc)
        elif kind == DEFER:
            self.memory[mid] = ("deferred", dc)

    @precondition(lambda self: self.stale)
    @rule(i=st.integers(0, 50))
    def settle_with_a_lost_lock(self, i: int) -> None:
        token = self.stale[i % len(self.stale)]
        [result] = self.core.settle([SettleOp(COMPLETE, token)])
        assert isinstance(result, MessageLockLostError)

    # ------------------------------------------------------------ durability

    @rule()
    def flush(self) -> None:
        self.run(self.committer.durable())
        self.durable = dict(self.memory)
        self.acked = self.assigned
        for mid, (_, dc) in self.durable.items():
            self.highest_dc[mid] = max(self.highest_dc.get(mid, 0), dc)
        assert self.observed() == self.memory

    @rule()
    def checkpoint(self) -> None:
        self.run(self.committer.checkpoint_now())  # flushes first
        self.flush()

    @precondition(lambda self: self.core.has_journal())
    @rule(code=st.sampled_from([errno.ENOSPC, errno.EIO]), budget=st.sampled_from([0, 40]))
    def failed_flush(self, code: int, budget: int) -> None:
        self.handler.write_errno, self.handler.write_budget = code, budget
        try:
            self.run(self.committer.durable())
        except StorageUnavailableError as exc:
            assert exc.retryable
        else:
            raise AssertionError("a flush on a full disk succeeded")
        finally:
            self.handler.write_errno = None
        self.lose_memory()
        assert self.observed() == self.durable, "a failed flush left changes in memory"

    @rule()
    def crash(self) -> None:
        self.committer = self.open()
        self.lose_memory()
        seen = self.observed()
        assert seen == self.durable, "recovery differs from what was acknowledged"
        for mid, (_, dc) in seen.items():
            assert dc >= self.highest_dc.get(mid, 0), f"delivery count of {mid} went down"

    @invariant()
    def counts_agree(self) -> None:
        c = self.core.counts()
        kept = [w for w, _ in self.memory.values()]
        assert c.active == kept.count("active") + kept.count("deferred")
        assert c.dead_letter == kept.count("dlq")
        assert c.scheduled == 0
        assert len(self.core.peek(0, EVERYTHING)) <= c.active  # unflushed sends are hidden


DurableQueue.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_durable_queue_matches_what_was_acknowledged = DurableQueue.TestCase
