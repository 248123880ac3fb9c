"""A partition's side of two-phase commit (``raybus._core.transactions``): prepare holds,
commit applies, abort, validation at prepare, pinned locks.

Pure unit tests: plain ``Partition`` objects on a ``FakeClock``, no Ray. lock_duration is
30 s unless stated. Idempotency, sessions, durability: ``test_transactions_recovery.py``; the
model-based test: ``test_transactions_model.py``; helpers: ``transactions_core_support``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import transactions_core_support
from transactions_core_support import (
    EVERYTHING,
    LOCK,
    all_ids,
    counted,
    fingerprint,
    ids_of,
    in_dlq,
    op,
    prepare,
    props,
    rec,
    received,
    stored,
    stored_size,
)

from raybus._core import transactions as txn
from raybus._core.partition import ABANDON, COMPLETE, DEAD_LETTER, DEFER, RELEASE, Partition
from raybus._core.record import DEFERRED
from raybus.enums import EntityStatus
from raybus.exceptions import (
    InvalidArgumentError,
    MessageLockLostError,
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
)
from raybus.testing import FakeClock

q = transactions_core_support.q
dq = transactions_core_support.dq
sq = transactions_core_support.sq


# ================================================================ 1. prepare holds, commit applies


def test_prepared_sends_are_invisible_until_commit(q):
    q.send([rec("old")])
    before = counted(q)
    prepare(q, "t", [rec("a"), rec("b")])
    assert counted(q) == before
    assert ids_of(q.peek(0, EVERYTHING)) == ["old"]
    assert ids_of(q.receive(EVERYTHING)) == ["old"]
    assert q.receive(EVERYTHING) == []
    assert not q.has_available()

    assert txn.commit(q, "t") is True
    assert counted(q)[0] == before[0] + 2
    assert ids_of(q.receive(EVERYTHING)) == ["a", "b"]


def test_commit_gives_sends_consecutive_sequence_numbers_in_the_given_order(q):
    [first] = q.send([rec("first")])
    prepare(q, "t", [rec("c"), rec("a"), rec("b")])
    [meanwhile] = q.send([rec("meanwhile")])  # numbers are assigned at commit, not prepare
    assert meanwhile == first + 1
    assert txn.commit(q, "t")
    got = {r.message_id: r.sequence_number for r in q.peek(0, EVERYTHING)}
    assert [got["c"], got["a"], got["b"]] == [meanwhile + 1, meanwhile + 2, meanwhile + 3]
    assert ids_of(q.receive(EVERYTHING)) == ["first", "meanwhile", "c", "a", "b"]
    assert q.send([rec("after")]) == [meanwhile + 4]


def test_prepared_complete_keeps_the_message_locked_until_commit(q, clock):
    m = received(q, "m")["m"]
    prepare(q, "t", settles=[op(COMPLETE, m.lock_token)])
    assert counted(q) == (1, 0, 0, m.size)
    assert stored(q, "m").lock_token == m.lock_token
    assert q.receive(EVERYTHING) == []
    assert ids_of(q.peek(0, EVERYTHING)) == ["m"]

    assert txn.commit(q, "t")
    assert counted(q) == (0, 0, 0, 0)
    assert q.peek(0, EVERYTHING) == []
    [result] = q.settle([op(COMPLETE, m.lock_token)])  # the token was used
    assert isinstance(result, MessageLockLostError)


def test_abandon_in_a_transaction_applies_at_commit(q):
    m = received(q, "m")["m"]
    assert m.delivery_count == 0
    prepare(q, "t", settles=[op(ABANDON, m.lock_token, properties={"why": "later"})])
    assert q.receive(EVERYTHING) == []
    assert stored(q, "m").delivery_count == 0

    assert txn.commit(q, "t")
    [again] = q.receive(EVERYTHING)
    assert again.message_id == "m"
    assert again.delivery_count == 1
    assert again.application_properties == {"why": "later"}
    assert again.lock_token != m.lock_token


def test_dead_letter_in_a_transaction_applies_at_commit_with_reason_and_description(q):
    m = received(q, "m")["m"]
    prepare(
        q,
        "t",
        settles=[op(DEAD_LETTER, m.lock_token, reason="bad", description="very bad")],
    )
    assert counted(q)[:2] == (1, 0)
    assert q.receive(EVERYTHING, dead_letter=True) == []

    assert txn.commit(q, "t")
    assert counted(q)[:2] == (0, 1)
    [dead] = q.receive(EVERYTHING, dead_letter=True)
    assert dead.message_id == "m"
    assert (dead.dead_letter_reason, dead.dead_letter_error_description) == ("bad", "very bad")


def test_defer_in_a_transaction_applies_at_commit(q):
    m = received(q, "m")["m"]
    prepare(q, "t", settles=[op(DEFER, m.lock_token)])
    assert stored(q, "m").state != DEFERRED
    assert txn.commit(q, "t")
    assert stored(q, "m").state == DEFERRED
    assert stored(q, "m").lock_token is None
    assert q.receive(EVERYTHING) == []
    [deferred] = q.receive_deferred([m.sequence_number])
    assert deferred.message_id == "m"


def test_renew_in_a_transaction_extends_the_lock_at_commit(q, clock):
    t0 = clock.now()
    m = received(q, "m")["m"]
    assert m.locked_until == t0 + LOCK
    prepare(q, "t", renews=[m.lock_token])
    clock.advance(10)
    assert stored(q, "m").locked_until == t0 + LOCK  # nothing yet
    assert txn.commit(q, "t")
    assert stored(q, "m").locked_until == t0 + 10 + LOCK
    clock.advance(LOCK - 5)  # past the original expiry, before the renewed one
    q.tick()
    assert stored(q, "m").lock_token == m.lock_token
    assert q.receive(EVERYTHING) == []
    [until] = q.renew_locks([m.lock_token])  # unpinned after commit
    assert until == clock.now() + LOCK
    assert q.settle([op(COMPLETE, m.lock_token)]) == [None]


def test_a_share_of_sends_settlements_and_renewals_applies_together_at_commit(q):
    got = received(q, "c", "a", "d", "f", "r")
    prepare(
        q,
        "t",
        [rec("s1"), rec("s2")],
        [
            op(COMPLETE, got["c"].lock_token),
            op(ABANDON, got["a"].lock_token),
            op(DEAD_LETTER, got["d"].lock_token, reason="r"),
            op(DEFER, got["f"].lock_token),
        ],
        [got["r"].lock_token],
    )
    assert sorted(q.pinned) == sorted(r.lock_token for r in got.values())
    assert q.pinned == {r.lock_token: "t" for r in got.values()}
    assert q.reserved == rec("s1").size + rec("s2").size
    assert txn.commit(q, "t")
    assert q.pinned == {} and q.prepared == {} and q.reserved == 0
    assert sorted(all_ids(q)) == ["a", "d", "f", "r", "s1", "s2"]
    assert in_dlq(q, "d")
    assert ids_of(q.receive(EVERYTHING)) == ["a", "s1", "s2"]
    assert counted(q)[3] == stored_size(q)


def test_commit_applies_whatever_the_queue_status_became(q):
    m = received(q, "m")["m"]
    prepare(q, "t", [rec("s")], [op(COMPLETE, m.lock_token)])
    q.update_properties(replace(q.properties, status=EntityStatus.DISABLED))
    assert txn.commit(q, "t")
    assert all_ids(q) == ["s"]


def test_a_share_of_max_operations_prepares_and_commits(q):
    half = txn.MAX_OPERATIONS // 2
    got = received(q, *(f"m{i}" for i in range(half)))
    sends = [rec(f"s{i}") for i in range(txn.MAX_OPERATIONS - half)]
    prepare(q, "t", sends, [op(COMPLETE, r.lock_token) for r in got.values()])
    assert len(q.pinned) == half
    assert txn.commit(q, "t")
    assert ids_of(q.receive(EVERYTHING)) == [f"s{i}" for i in range(len(sends))]
    assert counted(q)[0] == len(sends)


# ================================================================ 2. abort


def test_abort_discards_sends_and_releases_the_reservation(q):
    [first] = q.send([rec("first")])
    before = counted(q)
    prepare(q, "t", [rec("a"), rec("b")])
    assert q.reserved > 0
    assert txn.abort(q, "t") is True
    assert (q.reserved, q.prepared, q.pinned) == (0, {}, {})
    assert counted(q) == before
    assert ids_of(q.receive(EVERYTHING)) == ["first"]
    assert q.send([rec("next")]) == [first + 1]  # the aborted sends took no numbers


def test_abort_leaves_settled_messages_locked_by_their_own_tokens(q, clock):
    got = received(q, "a", "b")
    prepare(q, "t", settles=[op(COMPLETE, got["a"].lock_token), op(ABANDON, got["b"].lock_token)])
    assert txn.abort(q, "t")
    assert q.pinned == {}
    assert stored(q, "a").lock_token == got["a"].lock_token
    assert stored(q, "b").lock_token == got["b"].lock_token
    assert q.receive(EVERYTHING) == []  # a rollback leaves them locked
    # ... and they can be settled or renewed normally
    assert q.settle([op(COMPLETE, got["a"].lock_token)]) == [None]
    [until] = q.renew_locks([got["b"].lock_token])
    assert isinstance(until, float)
    assert all_ids(q) == ["b"]


def test_abort_leaves_the_lock_to_expire_at_its_own_time(q, clock):
    m = received(q, "m")["m"]
    prepare(q, "t", settles=[op(COMPLETE, m.lock_token)])
    clock.advance(LOCK / 2)
    assert txn.abort(q, "t")
    clock.advance(LOCK / 2 - 1)
    q.tick()
    assert stored(q, "m").lock_token == m.lock_token
    clock.advance(1)
    [again] = q.receive(EVERYTHING)
    assert (again.message_id, again.delivery_count) == ("m", 1)


# ================================================================ 3. validation at prepare


def _bad_share(p: Partition, clock: FakeClock, case: str) -> tuple[dict[str, Any], type]:
    """A share whose last element cannot commit, and the error prepare must raise. The
    share starts with a valid send and a valid settlement, which must not be held either."""
    late = None
    if case == "expired token":
        late = received(p, "late")["late"]
        clock.advance(LOCK + 1)
        p.tick()
        assert p.settle([op(COMPLETE, p.receive(1)[0].lock_token)]) == [None]
    good = received(p, "good")["good"]
    sends = [rec("fresh")]
    settles = [op(COMPLETE, good.lock_token)]
    renews: list[str] = []
    error: type = InvalidArgumentError
    if case == "unknown token":
        settles.append(op(COMPLETE, "00000000-0000-4000-8000-000000000000"))
        error = MessageLockLostError
    elif case == "expired token":
        assert late is not None
        settles.append(op(COMPLETE, late.lock_token))
        error = MessageLockLostError
    elif case == "unknown renew token":
        renews.append("00000000-0000-4000-8000-000000000000")
        error = MessageLockLostError
    elif case == "pinned by another transaction":
        other = received(p, "other")["other"]
        prepare(p, "other-txn", settles=[op(ABANDON, other.lock_token)])
        settles.append(op(COMPLETE, other.lock_token))
    elif case == "renew pinned by another transaction":
        other = received(p, "other")["other"]
        prepare(p, "other-txn", settles=[op(ABANDON, other.lock_token)])
        renews.append(other.lock_token)
    elif case == "token listed twice":
        settles.append(op(ABANDON, good.lock_token))
    elif case == "release":
        other = received(p, "other")["other"]
        settles.append(op(RELEASE, other.lock_token))
    elif case == "unknown kind":
        other = received(p, "other")["other"]
        settles.append(op("frobnicate", other.lock_token))
    elif case == "dead-letter a dead-lettered message":
        other = received(p, "other")["other"]
        assert p.settle([op(DEAD_LETTER, other.lock_token)]) == [None]
        [dead] = p.receive(1, dead_letter=True)
        settles.append(op(DEAD_LETTER, dead.lock_token))
    elif case == "bad application properties":
        other = received(p, "other")["other"]
        settles.append(op(ABANDON, other.lock_token, properties={"k": object()}))
    elif case == "properties past the header limit":
        other = received(p, "other")["other"]
        big = {"a": "x" * 30_000, "b": "y" * 30_000, "c": "z" * 30_000}
        settles.append(op(DEFER, other.lock_token, properties=big))
        error = MessageSizeExceededError
    elif case == "a dead-letter reason past the property limit":
        other = received(p, "other")["other"]
        settles.append(op(DEAD_LETTER, other.lock_token, reason="r" * 33_000))
        error = MessageSizeExceededError
    elif case == "oversize send":
        sends.append(rec("huge", body=b"x" * (p.properties.max_message_size + 1)))
        error = MessageSizeExceededError
    else:  # pragma: no cover
        raise AssertionError(case)
    return {"sends": sends, "settles": settles, "renews": renews}, error


VALIDATION_CASES = [
    "unknown token",
    "expired token",
    "unknown renew token",
    "pinned by another transaction",
    "renew pinned by another transaction",
    "token listed twice",
    "release",
    "unknown kind",
    "dead-letter a dead-lettered message",
    "bad application properties",
    "properties past the header limit",
    "a dead-letter reason past the property limit",
    "oversize send",
]


@pytest.mark.parametrize("case", VALIDATION_CASES)
def test_prepare_refuses_a_share_that_cannot_commit_and_changes_nothing(clock, case):
    p = Partition(props(max_message_size_in_kilobytes=4), clock)
    share, error = _bad_share(p, clock, case)
    p.tick()  # what is due now happens before the fingerprint
    before = fingerprint(p)
    with pytest.raises(error):
        prepare(p, "t", **share)
    assert fingerprint(p) == before
    assert "t" not in p.prepared
    # The valid part was not held: its lock settles normally, nothing is reserved.
    [good] = share["settles"][:1]
    assert p.settle([op(COMPLETE, good.lock_token)]) == [None]


@pytest.mark.parametrize("status", [EntityStatus.SEND_DISABLED, EntityStatus.DISABLED])
def test_prepare_refuses_sends_to_a_queue_that_takes_no_sends(q, status):
    q.update_properties(replace(q.properties, status=status))
    before = fingerprint(q)
    with pytest.raises(MessagingEntityDisabledError):
        prepare(q, "t", [rec("a")])
    assert fingerprint(q) == before


@pytest.mark.parametrize("status", [EntityStatus.RECEIVE_DISABLED, EntityStatus.DISABLED])
def test_prepare_refuses_settlements_on_a_queue_that_allows_no_receiving(q, status):
    m = received(q, "m")["m"]
    q.update_properties(replace(q.properties, status=status))
    before = fingerprint(q)
    with pytest.raises(MessagingEntityDisabledError):
        prepare(q, "t", settles=[op(COMPLETE, m.lock_token)])
    assert fingerprint(q) == before


def test_prepare_refuses_a_renewal_on_a_queue_that_allows_no_receiving(q):
    """A renewal outside a transaction is refused on a ReceiveDisabled queue; one inside a
    transaction must be refused at prepare too (not silently applied at commit)."""
    m = received(q, "m")["m"]
    q.update_properties(replace(q.properties, status=EntityStatus.RECEIVE_DISABLED))
    with pytest.raises(MessagingEntityDisabledError):
        q.renew_locks([m.lock_token])
    before = fingerprint(q)
    with pytest.raises(MessagingEntityDisabledError):
        prepare(q, "t", renews=[m.lock_token])
    assert fingerprint(q) == before


def test_prepare_refuses_a_dead_letter_reason_that_is_not_a_str(q):
    """A plain settle refuses a non-str reason; prepare must refuse it too, since commit
    cannot fail: otherwise commit answers True but silently skips the settlement."""
    q.send([rec("plain")])
    [p_msg] = q.receive(1)
    [result] = q.settle([op(DEAD_LETTER, p_msg.lock_token, reason=123)])
    assert isinstance(result, InvalidArgumentError)

    m = received(q, "m")["m"]
    before = fingerprint(q)
    try:
        prepare(q, "t", settles=[op(DEAD_LETTER, m.lock_token, reason=123)])
    except InvalidArgumentError:
        assert fingerprint(q) == before
        return
    # Accepted: then the commit must apply it (all or nothing).
    assert txn.commit(q, "t")
    assert in_dlq(q, "m"), "commit returned True but the prepared dead-letter did not happen"


def test_prepare_quota_counts_other_transactions_reserved_bytes(clock):
    p = Partition(props(max_size_in_megabytes=1, max_message_size_in_kilobytes=1024), clock)
    big = 400 * 1024
    prepare(p, "t1", [rec("a", body=b"x" * big)])
    prepare(p, "t2", [rec("b", body=b"x" * big)])
    assert p.reserved > 2 * big
    before = fingerprint(p)
    with pytest.raises(ServiceBusQuotaExceededError):  # fits alone; not with t1 and t2 held
        prepare(p, "t3", [rec("c", body=b"x" * big)])
    assert fingerprint(p) == before
    assert txn.abort(p, "t2")
    prepare(p, "t3", [rec("c", body=b"x" * big)])
    assert txn.commit(p, "t1") and txn.commit(p, "t3")
    assert sorted(all_ids(p)) == ["a", "c"]


def test_prepare_refuses_renewing_a_session_message(sq):
    sq.send([rec("m", session_id="s")])
    token, _ = sq.accept_session("s")
    [m] = sq.receive(1, session=("s", token))
    before = fingerprint(sq)
    with pytest.raises(InvalidArgumentError):
        prepare(sq, "t", renews=[m.lock_token])
    assert fingerprint(sq) == before


# ================================================================ 4. pinned locks


def test_a_pinned_lock_does_not_expire_while_prepared(q, clock):
    m = received(q, "m")["m"]
    prepare(q, "t", settles=[op(COMPLETE, m.lock_token)])
    for _ in range(5):
        clock.advance(10 * LOCK)
        q.tick()
    r = stored(q, "m")
    assert r.lock_token == m.lock_token
    assert r.delivery_count == 0
    assert q.receive(EVERYTHING) == []
    assert q.pinned == {m.lock_token: "t"}
    assert txn.commit(q, "t")
    assert all_ids(q) == []


def test_a_pinned_lock_cannot_be_settled_or_renewed_outside_the_transaction(q):
    m = received(q, "m")["m"]
    prepare(q, "t", settles=[op(ABANDON, m.lock_token)])
    before = fingerprint(q)
    for kind in (COMPLETE, ABANDON, DEAD_LETTER, DEFER, RELEASE):
        [result] = q.settle([op(kind, m.lock_token)])
        assert isinstance(result, ServiceBusError), kind
    [renewed] = q.renew_locks([m.lock_token])
    assert isinstance(renewed, ServiceBusError)
    assert fingerprint(q) == before
    assert txn.commit(q, "t")
    assert stored(q, "m").delivery_count == 1  # the transaction's abandon, once


def test_after_abort_an_expired_pinned_lock_is_released(q, clock):
    m = received(q, "m")["m"]
    prepare(q, "t", settles=[op(COMPLETE, m.lock_token)])
    clock.advance(3 * LOCK)
    q.tick()
    assert stored(q, "m").lock_token == m.lock_token
    assert txn.abort(q, "t")
    clock.advance(1.0)  # the next look at the lock (far less than a lock duration)
    q.tick()
    assert stored(q, "m").lock_token is None
    [again] = q.receive(EVERYTHING)
    assert (again.message_id, again.delivery_count) == ("m", 1)
    [result] = q.settle([op(COMPLETE, m.lock_token)])
    assert isinstance(result, MessageLockLostError)
