"""A partition's side of two-phase commit (``raybus._core.transactions``): prepare, commit,
abort, recover.

Pure unit tests: plain ``Partition`` objects on a ``FakeClock``, no Ray. lock_duration is
30 s unless stated. Durability tests collect a partition's journal into a list (what a group
commit writes), pass it through the Arrow table format and replay it into a fresh partition,
as the actor does on recovery (from the log, or from a checkpoint of ``snapshot_entries``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raybus._core import journal, migration
from raybus._core import transactions as txn
from raybus._core.partition import (
    ABANDON,
    COMPLETE,
    DEAD_LETTER,
    DEFER,
    RELEASE,
    Partition,
    SettleOp,
)
from raybus._core.record import DEFERRED, MessageRecord, encoded_size
from raybus._core.slots import SLOTS, slot_of
from raybus._models import QueueProperties
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

LOCK = 30.0
EVERYTHING = 10_000
ALL = frozenset(range(SLOTS))
MIB = 1024 * 1024


# ---------------------------------------------------------------------------- helpers


def props(**options: Any) -> QueueProperties:
    options.setdefault("lock_duration", LOCK)
    return QueueProperties(name="orders", **options)


def rec(message_id: str | None = None, body: Any = b"payload", **fields: Any) -> MessageRecord:
    """A fresh, validated record ready to send."""
    r = MessageRecord(body=body, message_id=message_id, **fields)
    encoded_size(r)
    return r


@pytest.fixture
def q(clock: FakeClock) -> Partition:
    """A plain (no sessions, no duplicate detection) queue partition."""
    return Partition(props(), clock)


@pytest.fixture
def dq(clock: FakeClock) -> Partition:
    """A queue partition with duplicate detection."""
    return Partition(props(requires_duplicate_detection=True), clock)


@pytest.fixture
def sq(clock: FakeClock) -> Partition:
    """A session-enabled queue partition."""
    return Partition(props(requires_session=True), clock)


def op(kind: str, token: str | None, **fields: Any) -> SettleOp:
    return SettleOp(kind, token, **fields)  # type: ignore[arg-type]


def prepare(
    p: Partition,
    txn_id: str,
    sends: Iterable[MessageRecord] = (),
    settles: Iterable[SettleOp] = (),
    renews: Iterable[str] = (),
) -> None:
    txn.prepare(p, txn_id, list(sends), list(settles), list(renews))


def received(
    p: Partition, *ids: str, log: list[journal.Entry] | None = None
) -> dict[str, MessageRecord]:
    """Send messages ``ids`` and receive (lock) them; the received copies by id. A durable
    partition's sends are flushed to ``log`` first (receivers see only durable messages)."""
    p.send([rec(i) for i in ids])
    if log is not None:
        flush(p, log)
    got = p.receive(len(ids))
    assert [r.message_id for r in got] == list(ids)
    return {r.message_id or "": r for r in got}


def stored(p: Partition, message_id: str) -> MessageRecord:
    """The partition's own record of a message (main queue or dead-letter sub-queue)."""
    found = [
        r for s in (p._main, p._dlq) for r in s.messages.values() if r.message_id == message_id
    ]
    assert len(found) == 1, (message_id, found)
    return found[0]


def in_dlq(p: Partition, message_id: str) -> bool:
    return any(r.message_id == message_id for r in p._dlq.messages.values())


def ids_of(records: Iterable[MessageRecord]) -> list[str | None]:
    return [r.message_id for r in records]


def all_ids(p: Partition) -> list[str | None]:
    """Every stored message's id (main queue, then dead-letter sub-queue)."""
    return [r.message_id for s in (p._main, p._dlq) for r in s.messages.values()]


def counted(p: Partition) -> tuple[int, int, int, int]:
    c = p.counts()
    return c.active, c.dead_letter, c.scheduled, c.size_in_bytes


def stored_size(p: Partition) -> int:
    return sum(r.size for s in (p._main, p._dlq) for r in s.messages.values())


def fingerprint(p: Partition) -> tuple[Any, ...]:
    """Everything a refused prepare must leave unchanged."""
    msgs = tuple(
        (
            s.id,
            seq,
            r.message_id,
            r.state,
            r.lock_token,
            r.locked_until,
            r.delivery_count,
            r.dead_letter_reason,
        )
        for s in (p._main, p._dlq)
        for seq, r in s.messages.items()
    )
    return (
        msgs,
        tuple(p.prepared),
        dict(p.pinned),
        p.reserved,
        p._next_seq,
        p._size,
        dict(p._locks),
        len(p._journal or []),
    )


def through_storage(entries: Iterable[journal.Entry]) -> list[journal.Entry]:
    return journal.from_table(journal.to_table(list(entries)))


def flush(p: Partition, log: list[journal.Entry]) -> None:
    """A successful group commit: the journal goes to ``log``, everything becomes visible."""
    entries, last = p.take_journal()
    log.extend(entries)
    p.visible_seq = max(p.visible_seq or 0, last)


def rebuilt(p: Partition, clock: FakeClock, entries: Iterable[journal.Entry]) -> Partition:
    """A restarted durable partition, loaded from the replay of ``entries``."""
    r = Partition(p.properties, clock, p.partition_id)
    r.load(journal.replay(through_storage(entries)))
    r.enable_journal()
    return r


def durable(p: Partition) -> list[journal.Entry]:
    """Turn the journal on; the log it is written to."""
    p.enable_journal()
    return []


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


# ================================================================ 5. idempotency


def test_a_repeated_prepare_is_a_no_op(q):
    log = durable(q)
    m = received(q, "m", log=log)["m"]
    prepare(q, "t", [rec("a")], [op(COMPLETE, m.lock_token)])
    before = fingerprint(q)
    prepare(q, "t", [rec("a")], [op(COMPLETE, m.lock_token)])  # the coordinator retried
    prepare(q, "t", [rec("zzz"), rec("yyy")])  # even with a different share
    assert fingerprint(q) == before
    flush(q, log)
    [logged] = [e for e in log if e[0] == journal.TXN_PREPARE]
    assert logged[3][0] == "t"
    assert txn.commit(q, "t")
    assert all_ids(q) == ["a"]


def test_commit_or_abort_of_an_unknown_transaction_returns_false_and_changes_nothing(q):
    log = durable(q)
    m = received(q, "m", log=log)["m"]
    prepare(q, "t", [rec("a")], [op(COMPLETE, m.lock_token)])
    before = fingerprint(q)
    assert txn.commit(q, "nope") is False
    assert txn.abort(q, "nope") is False
    assert fingerprint(q) == before
    flush(q, log)
    assert [e[0] for e in log].count(journal.TXN_END) == 0


def test_commit_and_abort_after_the_end_return_false(q):
    prepare(q, "c", [rec("a")])
    prepare(q, "r", [rec("b")])
    assert txn.commit(q, "c") is True
    assert txn.abort(q, "r") is True
    before = fingerprint(q)
    assert txn.commit(q, "c") is False
    assert txn.abort(q, "c") is False
    assert txn.commit(q, "r") is False
    assert txn.abort(q, "r") is False
    assert fingerprint(q) == before
    assert all_ids(q) == ["a"]


# ================================================================ 6. duplicate detection, quota


def test_a_transactional_send_whose_id_was_sent_meanwhile_is_dropped_at_commit(dq):
    prepare(dq, "t", [rec("m", body=b"from the transaction"), rec("n")])
    [plain] = dq.send([rec("m", body=b"plain")])
    assert txn.commit(dq, "t")
    assert sorted(all_ids(dq)) == ["m", "n"]
    assert stored(dq, "m").body == b"plain"
    assert stored(dq, "m").sequence_number == plain
    assert counted(dq)[3] == stored_size(dq)


def test_duplicates_within_and_across_transactions_are_stored_once(dq):
    prepare(dq, "t1", [rec("m", body=b"1"), rec("m", body=b"2")])
    prepare(dq, "t2", [rec("m", body=b"3"), rec("k")])
    assert txn.commit(dq, "t2") and txn.commit(dq, "t1")
    assert sorted(all_ids(dq)) == ["k", "m"]
    assert stored(dq, "m").body == b"3"
    assert dq.reserved == 0


def test_reserved_bytes_make_a_concurrent_plain_send_exceed_the_quota(clock):
    p = Partition(props(max_size_in_megabytes=1, max_message_size_in_kilobytes=1024), clock)
    big = 600 * 1024
    prepare(p, "t", [rec("held", body=b"x" * big)])
    before = fingerprint(p)
    with pytest.raises(ServiceBusQuotaExceededError):
        p.send([rec("plain", body=b"x" * (MIB - big))])
    assert fingerprint(p) == before
    assert txn.abort(p, "t")
    p.send([rec("plain", body=b"x" * (MIB - big))])
    assert all_ids(p) == ["plain"]


# ================================================================ 7. sessions


def test_settling_a_sessions_messages_in_a_transaction(sq):
    sq.send([rec(f"a{i}", session_id="a") for i in range(3)])
    token, _ = sq.accept_session("a")
    got = sq.receive(EVERYTHING, session=("a", token))
    prepare(
        sq,
        "t",
        [rec("a3", session_id="a")],
        [op(COMPLETE, got[0].lock_token), op(ABANDON, got[1].lock_token)],
    )
    assert sq.receive(EVERYTHING, session=("a", token)) == []
    assert txn.commit(sq, "t")
    again = sq.receive(EVERYTHING, session=("a", token))
    assert ids_of(again) == ["a1", "a3"]  # a2 is still locked by the session
    assert again[0].delivery_count == 1
    assert sorted(all_ids(sq)) == ["a1", "a2", "a3"]


@pytest.mark.parametrize("how", ["lock expires", "released"])
def test_a_session_lock_ending_while_prepared_leaves_pinned_messages_locked_until_commit(
    sq, clock, how
):
    sq.send([rec(f"a{i}", session_id="a") for i in range(3)])
    token, _ = sq.accept_session("a")
    got = sq.receive(EVERYTHING, session=("a", token))
    prepare(sq, "t", settles=[op(COMPLETE, got[0].lock_token)])
    if how == "lock expires":
        clock.advance(LOCK + 1)
        sq.tick()
    else:
        assert sq.release_session("a", token)
    assert stored(sq, "a0").lock_token == got[0].lock_token  # pinned: still locked
    assert stored(sq, "a1").lock_token is None  # the others are released as usual
    assert stored(sq, "a2").lock_token is None
    counted_delivery = 1 if how == "lock expires" else 0
    assert stored(sq, "a1").delivery_count == counted_delivery
    assert stored(sq, "a0").delivery_count == 0

    token2, _ = sq.accept_session("a")
    assert ids_of(sq.receive(EVERYTHING, session=("a", token2))) == ["a1", "a2"]
    assert sq.pinned == {got[0].lock_token: "t"}
    assert txn.commit(sq, "t")
    assert sorted(all_ids(sq)) == ["a1", "a2"]


@pytest.mark.parametrize("how", ["lock expires", "released"])
def test_a_session_lock_ending_while_prepared_then_abort_lets_the_pinned_message_go(sq, clock, how):
    """After abort the lock runs its normal course: it ended with the session lock, so the
    message must be delivered again (not stay locked for ever)."""
    sq.send([rec(f"a{i}", session_id="a") for i in range(2)])
    token, _ = sq.accept_session("a")
    got = sq.receive(EVERYTHING, session=("a", token))
    prepare(sq, "t", settles=[op(COMPLETE, got[0].lock_token)])
    if how == "lock expires":
        clock.advance(LOCK + 1)
        sq.tick()
    else:
        assert sq.release_session("a", token)
    assert stored(sq, "a0").lock_token == got[0].lock_token
    assert txn.abort(sq, "t")
    clock.advance(LOCK + 1)  # long enough for any lock it could still have
    sq.tick()
    token2, _ = sq.accept_session("a")
    again = sq.receive(EVERYTHING, session=("a", token2))
    assert "a0" in ids_of(again), (
        f"a0 stays locked by {stored(sq, 'a0').lock_token} (until "
        f"{stored(sq, 'a0').locked_until}, now {clock.now()}): it is in no session's lock set "
        "and not in the lock heap"
    )


# ================================================================ 8. durability


def _prepared_history(p: Partition) -> tuple[list[journal.Entry], dict[str, MessageRecord]]:
    """A durable partition with a flushed prepared transaction "t": sends s1, s2; complete
    c; dead-letter d; abandon a; renew r. Returns (log, the received copies)."""
    log = durable(p)
    got = received(p, "c", "d", "a", "r", "free", log=log)
    prepare(
        p,
        "t",
        [rec("s1"), rec("s2")],
        [
            op(COMPLETE, got["c"].lock_token),
            op(DEAD_LETTER, got["d"].lock_token, reason="why", description="because"),
            op(ABANDON, got["a"].lock_token, properties={"k": 1}),
        ],
        [got["r"].lock_token],
    )
    flush(p, log)
    return log, got


@pytest.mark.parametrize("source", ["log", "checkpoint"])
def test_a_prepared_share_is_held_again_after_a_restart(q, clock, source):
    log, got = _prepared_history(q)
    entries = log if source == "log" else q.snapshot_entries()
    r = rebuilt(q, clock, entries)

    assert list(r.prepared) == ["t"]
    assert r.reserved == q.reserved == rec("s1").size + rec("s2").size
    assert counted(r) == counted(q)
    for mid in ("c", "d", "a"):
        locked = stored(r, mid)
        assert locked.lock_token is not None
        assert locked.lock_token != got[mid].lock_token  # new tokens after a restart
        assert r.pinned[locked.lock_token] == "t"
        assert locked.delivery_count == 0  # the restart is not charged
    assert len(r.pinned) == 3
    # The renewed lock and the unrelated one ended with the restart.
    assert sorted(ids_of(r.receive(EVERYTHING))) == ["free", "r"]
    # Pinned: they survive any time, and cannot be settled outside the transaction.
    clock.advance(10 * LOCK)
    r.tick()
    assert all(stored(r, mid).lock_token in r.pinned for mid in ("c", "d", "a"))
    [refused] = r.settle([op(COMPLETE, stored(r, "c").lock_token)])
    assert isinstance(refused, InvalidArgumentError)


@pytest.mark.parametrize("source", ["log", "checkpoint"])
def test_commit_after_a_restart_applies_the_share_exactly_once(q, clock, source):
    log, _ = _prepared_history(q)
    base = log if source == "log" else q.snapshot_entries()
    r = rebuilt(q, clock, base)
    log2 = list(base)
    assert txn.commit(r, "t") is True
    assert txn.commit(r, "t") is False
    flush(r, log2)

    def check(p: Partition) -> None:
        assert p.prepared == {} and p.pinned == {} and p.reserved == 0
        assert sorted(all_ids(p)) == ["a", "d", "free", "r", "s1", "s2"]
        assert in_dlq(p, "d")
        dead = stored(p, "d")
        assert (dead.dead_letter_reason, dead.dead_letter_error_description) == (
            "why",
            "because",
        )
        assert stored(p, "a").delivery_count == 1
        assert stored(p, "a").application_properties == {"k": 1}
        s1, s2 = stored(p, "s1").sequence_number, stored(p, "s2").sequence_number
        assert s2 == s1 + 1
        assert s1 > max(stored(p, m).sequence_number for m in ("a", "free", "r"))
        assert counted(p)[3] == stored_size(p)

    check(r)
    again = rebuilt(r, clock, log2)  # a second restart replays the commit, not the prepare
    check(again)
    assert counted(again) == counted(r)
    third = rebuilt(r, clock, r.snapshot_entries())
    check(third)


@pytest.mark.parametrize("source", ["log", "checkpoint"])
def test_abort_after_a_restart_releases_the_share(q, clock, source):
    log, _ = _prepared_history(q)
    base = log if source == "log" else q.snapshot_entries()
    r = rebuilt(q, clock, base)
    before = counted(r)
    assert txn.abort(r, "t") is True
    assert r.prepared == {} and r.pinned == {} and r.reserved == 0
    assert counted(r) == before
    assert sorted(all_ids(r)) == ["a", "c", "d", "free", "r"]
    assert sorted(ids_of(r.receive(EVERYTHING))) == ["free", "r"]
    # The messages the share would have settled stay locked until their (new) locks end.
    clock.advance(LOCK + 1)
    assert sorted(ids_of(r.receive(EVERYTHING))) == ["a", "c", "d", "free", "r"]
    log2 = list(base)
    flush(r, log2)
    again = rebuilt(r, clock, log2)
    assert again.prepared == {} and again.reserved == 0
    assert sorted(all_ids(again)) == ["a", "c", "d", "free", "r"]


def test_a_journal_with_prepare_and_commit_replays_to_the_effects_once(q, clock):
    log, _ = _prepared_history(q)
    assert txn.commit(q, "t")
    flush(q, log)
    ops = [e[0] for e in log]
    assert ops.count(journal.TXN_PREPARE) == ops.count(journal.TXN_END) == 1
    assert ops.index(journal.TXN_PREPARE) < ops.index(journal.TXN_END)
    state = journal.replay(through_storage(log))
    assert state.prepared == {}
    r = rebuilt(q, clock, log)
    assert r.prepared == {} and r.pinned == {} and r.reserved == 0
    assert sorted(all_ids(r)) == sorted(all_ids(q))
    assert counted(r) == counted(q)
    assert all(stored(r, m).lock_token is None for m in all_ids(r))  # nothing held


def test_a_checkpoint_followed_by_the_commit_entries_replays_to_no_prepared_transaction(q, clock):
    _prepared_history(q)
    checkpoint = q.snapshot_entries()
    assert [e[0] for e in checkpoint].count(journal.TXN_PREPARE) == 1
    assert txn.commit(q, "t")
    tail: list[journal.Entry] = []
    flush(q, tail)
    r = rebuilt(q, clock, checkpoint + tail)
    assert r.prepared == {} and r.reserved == 0
    assert sorted(all_ids(r)) == sorted(all_ids(q))
    assert counted(r) == counted(q)


def test_a_restart_reserves_the_same_bytes_as_the_prepare_did(dq, clock):
    """A send already a duplicate at prepare reserves nothing; after a restart the share must
    reserve the same (not the duplicate's bytes too)."""
    log = durable(dq)
    dq.send([rec("m")])
    prepare(dq, "t", [rec("m"), rec("n")])
    flush(dq, log)
    assert dq.reserved == rec("n").size
    r = rebuilt(dq, clock, log)
    assert r.reserved == dq.reserved


def test_a_prepared_session_settlement_survives_a_restart(sq, clock):
    log = durable(sq)
    sq.send([rec("a0", session_id="a"), rec("a1", session_id="a")])
    flush(sq, log)
    token, _ = sq.accept_session("a")
    got = sq.receive(EVERYTHING, session=("a", token))
    prepare(sq, "t", settles=[op(COMPLETE, got[0].lock_token)])
    flush(sq, log)
    r = rebuilt(sq, clock, log)
    assert stored(r, "a0").lock_token in r.pinned
    token2, _ = r.accept_session("a")
    assert ids_of(r.receive(EVERYTHING, session=("a", token2))) == ["a1"]
    assert txn.commit(r, "t")
    assert all_ids(r) == ["a1"]


# ================================================================ partition changes


def test_handing_over_a_slot_while_a_send_to_it_is_prepared_stores_it_once(clock):
    """A prepared send whose slot moves to another partition before commit must not be
    stored twice (duplicate detection lives with the slot) nor where the slot is not
    served."""
    options = {"requires_duplicate_detection": True}
    a = Partition(props(**options), clock, 0)
    a.owned = ALL
    b = Partition(props(**options), clock, 1)
    b.owned = frozenset()
    prepare(a, "t", [rec("m", body=b"transaction")])
    out, pinned = migration.hand_over(a, {1: frozenset([slot_of("m")])}, None)
    for move_id, (target, bundle) in out.items():
        assert target == 1
        assert migration.adopt(b, move_id, bundle)
        migration.finish(a, move_id)
    if slot_of("m") not in pinned:
        b.send([rec("m", body=b"plain")])  # the slot's new partition takes the id
    assert txn.commit(a, "t")
    holders = [p for p in (a, b) if "m" in all_ids(p)]
    copies = sum(all_ids(p).count("m") for p in (a, b))
    assert copies == 1, f"message id 'm' stored {copies} times (in partitions {holders})"
    [holder] = holders
    assert holder.owned is None or slot_of("m") in holder.owned


def test_a_retiring_partition_with_a_prepared_share_is_not_empty(clock):
    """A partition may stop only when nothing is left in it: a prepared transaction (whose
    commit would store messages here) is something."""
    a = Partition(props(), clock, 0)
    a.owned = ALL
    b = Partition(props(), clock, 1)
    b.owned = frozenset()
    prepare(a, "t", [rec("pending")])
    out, _ = migration.hand_over(a, {1: ALL}, 1)
    for move_id, (_target, bundle) in out.items():
        migration.adopt(b, move_id, bundle)
        migration.finish(a, move_id)
    assert a.prepared
    assert not migration.is_empty(a)


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
