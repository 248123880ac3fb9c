"""A model-based test of a partition's side of two-phase commit: random sends, receives,
settlements, prepares, commits, aborts, clock steps and restarts (from the journal) against
what the partition must hold. Pure unit test: no Ray, a ``FakeClock``.
"""

from __future__ import annotations

from typing import Any

import transactions_core_support
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from transactions_core_support import (
    LOCK,
    all_ids,
    durable,
    fingerprint,
    flush,
    ids_of,
    op,
    prepare,
    props,
    rebuilt,
    rec,
    stored,
    stored_size,
)

from raybus._core import transactions as txn
from raybus._core.partition import ABANDON, COMPLETE, DEAD_LETTER, DEFER, Partition
from raybus._core.record import MessageRecord
from raybus.exceptions import InvalidArgumentError, MessageLockLostError, ServiceBusError
from raybus.testing import FakeClock

q = transactions_core_support.q
dq = transactions_core_support.dq
sq = transactions_core_support.sq


# ================================================================ 9. model


_KINDS = (COMPLETE, ABANDON, DEAD_LETTER, DEFER)

_step = st.one_of(
    st.tuples(st.just("send"), st.integers(1, 3)),
    st.tuples(st.just("receive"), st.integers(1, 4)),
    st.tuples(st.just("settle"), st.integers(0, 20)),
    st.tuples(
        st.just("prepare"),
        st.integers(0, 3),
        st.lists(st.tuples(st.integers(0, 20), st.sampled_from(_KINDS)), max_size=3),
    ),
    st.tuples(st.just("commit"), st.integers(0, 5)),
    st.tuples(st.just("abort"), st.integers(0, 5)),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 10.0, LOCK + 1, 5 * LOCK])),
    st.tuples(st.just("restart"), st.booleans()),
)


class _Model:
    """A journaled partition and what it must hold."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.p = Partition(props(), self.clock)
        self.log = durable(self.p)
        self.n = 0
        self.present: set[str] = set()  # stored (main queue or dead-letter sub-queue)
        self.completed: set[str] = set()
        self.sizes: dict[str, int] = {}
        self.held: list[tuple[str, str]] = []  # (lock token, message id), possibly stale
        self.txns: dict[str, tuple[list[str], list[tuple[str, str]]]] = {}  # sends, settles
        self.t = 0

    def new(self, k: int) -> list[MessageRecord]:
        out = []
        for _ in range(k):
            self.n += 1
            r = rec(f"m{self.n}", body=b"x" * (self.n % 7))
            self.sizes[r.message_id or ""] = r.size
            out.append(r)
        return out

    def step(self, step: tuple[Any, ...]) -> None:
        p, what = self.p, step[0]
        if what == "send":
            recs = self.new(step[1])
            p.send(recs)
            self.present.update(ids_of(recs))  # type: ignore[arg-type]
        elif what == "receive":
            got = p.receive(step[1])
            hidden = {m for sends, settles in self.txns.values() for m in sends} | {
                m for _, settles in self.txns.values() for m, _ in settles
            }
            for r in got:
                assert r.message_id in self.present
                assert r.message_id not in hidden  # nothing prepared is visible
                self.held.append((r.lock_token or "", r.message_id or ""))
        elif what == "settle" and self.held:
            token, mid = self.held[step[1] % len(self.held)]
            pinned = token in p.pinned
            [result] = p.settle([op(COMPLETE, token)])
            if pinned:
                event("a pinned lock refused a settlement")
                assert isinstance(result, InvalidArgumentError)
            elif result is None:
                self.present.discard(mid)
                self.completed.add(mid)
                self.held.remove((token, mid))
            else:
                assert isinstance(result, MessageLockLostError)
        elif what == "prepare":
            self.t += 1
            txn_id = f"t{self.t}"
            if step[2] and not self.held:  # something to settle: receive it first
                self.step(("send", 2))
                self.step(("receive", 3))
            sends = self.new(step[1])
            chosen = {}
            for i, kind in step[2]:
                if self.held:
                    chosen.setdefault(self.held[i % len(self.held)], kind)
            settles = [op(kind, token) for (token, _), kind in chosen.items()]
            p.tick()
            before = fingerprint(p)
            try:
                prepare(p, txn_id, sends, settles)
            except ServiceBusError as exc:
                event(f"prepare refused: {type(exc).__name__}")
                assert fingerprint(p) == before
                assert txn_id not in p.prepared
                return
            self.txns[txn_id] = (
                [r.message_id or "" for r in sends],
                [(mid, kind) for (_, mid), kind in chosen.items()],
            )
        elif what in ("commit", "abort") and self.txns:
            txn_id = sorted(self.txns)[step[1] % len(self.txns)]
            sends, settles = self.txns.pop(txn_id)
            for mid in sends:
                assert mid not in self.present
            event(f"{what} of a share with {len(settles)} settlement(s)")
            if what == "commit":
                assert txn.commit(p, txn_id) is True
                self.present.update(sends)
                for mid, kind in settles:
                    if kind == COMPLETE:
                        self.present.discard(mid)
                        self.completed.add(mid)
            else:
                assert txn.abort(p, txn_id) is True
            assert txn.commit(p, txn_id) is False
        elif what == "advance":
            self.clock.advance(step[1])
            p.tick()
        elif what == "restart":
            if self.txns:
                event("restart with a transaction prepared")
            flush(p, self.log)
            if step[1]:  # from a checkpoint
                self.log = p.snapshot_entries()
            self.p = rebuilt(p, self.clock, self.log)
            self.held = []  # every lock token died with the restart
        flush(self.p, self.log)

    def check(self) -> None:
        p = self.p
        size = p.counts().size_in_bytes
        ids = all_ids(p)
        assert len(ids) == len(set(ids)), "a message is in two places"
        assert set(ids) == self.present
        assert not self.completed & set(ids)
        assert size == stored_size(p) == sum(self.sizes[m] for m in ids)  # type: ignore[index]
        assert sorted(p.prepared) == sorted(self.txns)
        assert p.reserved == sum(self.sizes[m] for sends, _ in self.txns.values() for m in sends)
        shares_tokens = {t: txn_id for txn_id, share in p.prepared.items() for t in share.tokens()}
        assert p.pinned == shares_tokens
        for txn_id, (sends, settles) in self.txns.items():
            for mid in sends:
                assert mid not in self.present
            for mid, _ in settles:
                r = stored(p, mid)
                assert r.lock_token is not None
                assert p.pinned.get(r.lock_token) == txn_id


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(_step, min_size=5, max_size=30))
def test_model_prepared_transactions_are_invisible_then_applied_once(steps):
    model = _Model()
    for s in steps:
        model.step(s)
        model.check()
    while model.txns:  # end them all: every effect lands
        model.step(("commit", 0))
        model.check()
    assert model.p.prepared == {} and model.p.reserved == 0 and model.p.pinned == {}
