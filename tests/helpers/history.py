"""A recorded history of broker operations and a checker of raybus's promises over it.

In the spirit of Jepsen: workloads record what they *asked* and what the broker *answered*
(with the time before and after each call), faults are recorded with their time span, and
after the run a drain records what is left. ``check`` then looks for histories that no correct
broker could have produced:

* ``LOST``: an acknowledged send (or a send of a committed transaction) that ended neither
  completed, dead-lettered nor still present.
* ``PHANTOM``: a message whose send definitely failed (or whose transaction aborted) appeared.
* ``DELIVERED_AFTER_SETTLE``: delivered again after its complete was acknowledged (or from
  the main queue after an acknowledged dead-letter, or by a plain receive after an
  acknowledged defer).
* ``DOUBLE_COMPLETE``: two completes with different lock tokens both acknowledged.
* ``DOUBLE_LOCK``: a second lock granted while the first was certainly still valid: the first
  was not settled, had not expired, no fault that drops locks had begun and its receiver had
  not been closed or killed.
* ``SESSION_ORDER``: within a session, a message delivered for the first time with a lower
  sequence number than one delivered before it (redeliveries after an abandon or a lost lock
  are allowed).
* ``TXN_PARTIAL``: some but not all sends of one transaction appeared; ``TXN_COMPLETE_UNDONE``:
  a committed transaction's complete did not take effect.
* ``DLQ_UNEXPLAINED``: a dead-lettered message that no dead-letter call, max delivery count or
  expiry explains; ``DLQ_MISSING``: an acknowledged dead-letter whose message is neither in
  the dead-letter queue nor was completed from it.
* ``DUPLICATE_STORED``: the final drain found a message twice.

Outcomes: ``ok`` (the broker acknowledged), ``failed`` (the broker definitely did not apply
it: a typed refusal whose contract says nothing changed), ``unknown`` (a timeout or lost
connection: it may or may not have happened), ``txn`` (decided by its transaction). Times are
``time.time()`` (one clock on one machine; ``TOLERANCE_S`` absorbs what separates processes).

The recorder is thread- and asyncio-safe (one lock, no awaits) and can stream events as JSON
lines to a file, so a consumer process that is killed leaves its history behind.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "Anomaly",
    "Fault",
    "Final",
    "History",
    "Receive",
    "Release",
    "Send",
    "Settle",
    "Txn",
    "check",
    "outcome_of",
]

TOLERANCE_S = 0.05
OK, FAILED, UNKNOWN, IN_TXN = "ok", "failed", "unknown", "txn"
# Streamed before a call starts; superseded by the call's own record. Left alone (the process
# was killed mid-call) it counts as unknown: the broker may have applied the call.
PENDING = "pending"
COMMITTED, ABORTED = "committed", "aborted"
COMPLETE, ABANDON, DEAD_LETTER, DEFER = "complete", "abandon", "dead_letter", "defer"
# Exceptions whose contract is "nothing changed" (see raybus.exceptions and the storage
# errors); anything else that escapes a call may have been applied.
_DEFINITE = {
    "InvalidArgumentError",
    "MessageSizeExceededError",
    "MessageAlreadySettled",
    "MessageLockLostError",
    "SessionLockLostError",
    "MessageNotFoundError",
    "MessagingEntityNotFoundError",
    "MessagingEntityDisabledError",
    "ServiceBusQuotaExceededError",
    "StorageUnavailableError",
    "TransactionAbortedError",
    "TransactionTimeoutError",
}


def outcome_of(exc: BaseException) -> str:
    """``failed`` for typed refusals that change nothing, ``unknown`` otherwise.

    A ``SettlementFailedError`` (a settlement sent without waiting and refused later) is
    ``failed`` only when every reason is a lost lock; an actor that died mid-call may have
    applied it first.
    """
    name = type(exc).__name__
    if name == "SettlementFailedError":
        reasons = [str(r) for *_x, r in getattr(exc, "failures", [])]
        return FAILED if reasons and all("lock" in r.lower() for r in reasons) else UNKNOWN
    return FAILED if name in _DEFINITE else UNKNOWN


@dataclass(frozen=True)
class Send:
    mids: tuple[str, ...]
    entity: str
    outcome: str
    start: float
    end: float
    txn: str | None = None
    sessions: tuple[str | None, ...] = ()
    kind: str = "send"


@dataclass(frozen=True)
class Receive:
    mid: str
    entity: str
    seq: int
    lock_token: str | None
    locked_until: float
    delivery_count: int
    session_id: str | None
    receiver: str
    start: float
    end: float
    partition: int = 0
    source: str = "active"  # "active", "dead_letter" or "deferred" (receive_deferred)
    kind: str = "receive"


@dataclass(frozen=True)
class Settle:
    mid: str
    lock_token: str | None
    op: str
    outcome: str
    start: float
    end: float
    receiver: str
    txn: str | None = None
    kind: str = "settle"


@dataclass(frozen=True)
class Txn:
    txn: str
    outcome: str
    start: float
    end: float
    kind: str = "txn"


@dataclass(frozen=True)
class Fault:
    """A fault that may drop message locks in ``entity`` (``None``: every entity) and
    ``partition`` (``None``: every partition) at any moment of [start, end]."""

    name: str
    start: float
    end: float
    entity: str | None = None
    partition: int | None = None
    drops_locks: bool = True
    kind: str = "fault"


@dataclass(frozen=True)
class Release:
    """A receiver closed or killed: the broker may free its locks from ``at`` on."""

    receiver: str
    at: float
    kind: str = "release"


@dataclass(frozen=True)
class Final:
    """One message found by the final drain (peek of the queue and its dead-letter queue)."""

    mid: str
    entity: str
    state: str  # "active", "deferred", "scheduled" or "dead_letter"
    seq: int
    delivery_count: int
    dead_letter_reason: str | None = None
    kind: str = "final"


Event = Send | Receive | Settle | Txn | Fault | Release | Final
_KINDS: dict[str, type[Any]] = {
    c.kind: c  # type: ignore[attr-defined]
    for c in (Send, Receive, Settle, Txn, Fault, Release, Final)
}


@dataclass(frozen=True)
class Anomaly:
    """One violated promise: ``kind`` (see the module docstring), the message (or session or
    transaction) it concerns, a sentence, and the events that prove it."""

    kind: str
    subject: str
    detail: str
    evidence: tuple[Any, ...] = field(default=())

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}: {self.detail}"


class History:
    """Records events (thread- and asyncio-safe); ``check()`` runs the checker over them."""

    def __init__(self, sink: Path | None = None, *, max_delivery_count: int = 10) -> None:
        self._lock = threading.Lock()
        self.events: list[Event] = []
        self._sink = sink.open("a", buffering=1) if sink is not None else None
        self.max_delivery_count = max_delivery_count

    def add(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)
            if self._sink is not None:
                self._sink.write(json.dumps(asdict(event)) + "\n")

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()

    @classmethod
    def load_jsonl(cls, path: Path) -> list[Event]:
        """Events another process streamed (a torn last line, from a kill, is skipped)."""
        out: list[Event] = []
        if not path.exists():
            return out
        for line in path.read_text().splitlines():
            try:
                raw = json.loads(line)
            except json.JSONDecodeError:
                continue
            cls_ = _KINDS[raw["kind"]]
            for key in ("mids", "sessions"):
                if key in raw:
                    raw[key] = tuple(raw[key])
            out.append(cls_(**raw))
        return out

    def extend(self, events: Iterable[Event]) -> None:
        for e in events:
            self.add(e)

    # -- convenience recorders ---------------------------------------------------------------

    @contextmanager
    def sending(
        self,
        entity: str,
        mids: Iterable[str],
        *,
        sessions: Iterable[str | None] = (),
        txn: str | None = None,
        kind_of: Any = outcome_of,
    ) -> Iterator[None]:
        """Record a send around the ``with`` body; its exception (re-raised) sets the outcome."""
        mids, start = tuple(mids), time.time()
        outcome = IN_TXN if txn is not None else OK
        if self._sink is not None:
            self.add(Send(mids, entity, PENDING, start, start, txn, tuple(sessions)))
        try:
            yield
        except BaseException as exc:
            outcome = kind_of(exc) if txn is None else FAILED
            raise
        finally:
            self.add(Send(mids, entity, outcome, start, time.time(), txn, tuple(sessions)))

    def received(
        self,
        msg: Any,
        *,
        entity: str,
        receiver: str,
        start: float,
        source: str = "active",
        locked_until: float | None = None,
    ) -> Receive:
        """Record a delivered ``ServiceBusReceivedMessage`` (``locked_until``: a session's)."""
        until = locked_until
        if until is None:
            lu = msg.locked_until_utc
            until = lu.timestamp() if lu is not None else 0.0
        event = Receive(
            mid=str(msg.message_id),
            entity=entity,
            seq=int(msg.sequence_number),
            lock_token=msg.lock_token,
            locked_until=until,
            delivery_count=int(msg.delivery_count),
            session_id=msg.session_id,
            receiver=receiver,
            start=start,
            end=time.time(),
            partition=int(msg.sequence_number) >> 48,
            source=source,
        )
        self.add(event)
        return event

    @contextmanager
    def settling(
        self, msg: Any, op: str, *, receiver: str, txn: str | None = None
    ) -> Iterator[None]:
        start = time.time()
        outcome = IN_TXN if txn is not None else OK
        mid, token = str(msg.message_id), msg.lock_token
        if self._sink is not None:
            self.add(Settle(mid, token, op, PENDING, start, start, receiver, txn))
        try:
            yield
        except BaseException as exc:
            outcome = outcome_of(exc) if txn is None else FAILED
            raise
        finally:
            self.add(
                Settle(
                    mid,
                    token,
                    op,
                    outcome,
                    start,
                    time.time(),
                    receiver,
                    txn,
                )
            )

    def check(self) -> list[Anomaly]:
        with self._lock:
            events = list(self.events)
        return check(events, max_delivery_count=self.max_delivery_count)

    def counts(self) -> dict[str, int]:
        with self._lock:
            events = list(self.events)
        by: dict[str, int] = defaultdict(int)
        for e in events:
            by[e.kind] += 1
        by["messages"] = len({m for e in events if isinstance(e, Send) for m in e.mids})
        return dict(by)


# ---------------------------------------------------------------------------------------------
# the checker


class _Index:
    """The events of a history grouped the ways the checks need them."""

    def __init__(self, events: Iterable[Event]) -> None:
        events = _resolve_pending(events)
        self.sends: dict[str, list[Send]] = defaultdict(list)
        self.receives: dict[str, list[Receive]] = defaultdict(list)
        self.settles: dict[str, list[Settle]] = defaultdict(list)
        self.by_token: dict[str, list[Settle]] = defaultdict(list)
        self.finals: dict[str, list[Final]] = defaultdict(list)
        self.txns: dict[str, Txn] = {}
        self.txn_sends: dict[str, list[Send]] = defaultdict(list)
        self.txn_settles: dict[str, list[Settle]] = defaultdict(list)
        self.faults: list[Fault] = []
        self.released: dict[str, float] = {}
        for e in events:
            if isinstance(e, Send):
                for m in e.mids:
                    self.sends[m].append(e)
                if e.txn is not None:
                    self.txn_sends[e.txn].append(e)
            elif isinstance(e, Receive):
                self.receives[e.mid].append(e)
            elif isinstance(e, Settle):
                self.settles[e.mid].append(e)
                if e.lock_token is not None:
                    self.by_token[e.lock_token].append(e)
                if e.txn is not None:
                    self.txn_settles[e.txn].append(e)
            elif isinstance(e, Txn):
                self.txns[e.txn] = e
            elif isinstance(e, Fault):
                self.faults.append(e)
            elif isinstance(e, Release):
                self.released[e.receiver] = min(e.at, self.released.get(e.receiver, e.at))
            else:
                self.finals[e.mid].append(e)
        for rs in self.receives.values():
            rs.sort(key=lambda r: r.start)

    def effective(self, s: Send | Settle) -> str:
        """The outcome taking the transaction into account: ok, failed or unknown."""
        if s.txn is None:
            return s.outcome
        if s.outcome == FAILED:  # never joined the transaction
            return FAILED
        txn = self.txns.get(s.txn)
        if txn is None or txn.outcome == UNKNOWN:
            return UNKNOWN
        return OK if txn.outcome == COMMITTED else FAILED

    def ack_time(self, s: Send | Settle) -> float:
        """When the broker had certainly applied it (the commit's end for transactions)."""
        return s.end if s.txn is None else self.txns[s.txn].end

    def seen(self, mid: str) -> bool:
        return bool(self.receives.get(mid) or self.finals.get(mid))


def _resolve_pending(events: Iterable[Event]) -> list[Event]:
    """Drop each pending record whose call recorded its outcome; the rest become unknown."""
    events = list(events)

    def key(e: Event) -> tuple[Any, ...] | None:
        if isinstance(e, Send):
            return ("send", e.mids, e.start)
        if isinstance(e, Settle):
            return ("settle", e.mid, e.lock_token, e.op, e.start)
        return None

    finished = {key(e) for e in events if getattr(e, "outcome", None) != PENDING}
    out: list[Event] = []
    for e in events:
        if getattr(e, "outcome", None) != PENDING:
            out.append(e)
        elif key(e) not in finished:
            pending_outcome = IN_TXN if getattr(e, "txn", None) is not None else UNKNOWN
            out.append(replace(e, outcome=pending_outcome))  # type: ignore[type-var]
    return out


def check(events: Iterable[Event], *, max_delivery_count: int = 10) -> list[Anomaly]:
    """Every anomaly in the history (an empty list for a correct run)."""
    ix = _Index(events)
    out: list[Anomaly] = []
    out += _check_sends(ix)
    out += _check_settled_stays_settled(ix)
    out += _check_locks(ix)
    out += _check_session_order(ix)
    out += _check_transactions(ix)
    out += _check_dead_letters(ix, max_delivery_count)
    for mid, finals in ix.finals.items():
        if len(finals) > 1:
            out.append(
                Anomaly("DUPLICATE_STORED", mid, f"found {len(finals)} times", tuple(finals))
            )
    return out


def _completed(ix: _Index, mid: str) -> list[Settle]:
    """Completes that may have taken effect (acknowledged or unknown)."""
    return [s for s in ix.settles.get(mid, []) if s.op == COMPLETE and ix.effective(s) != FAILED]


def _check_sends(ix: _Index) -> list[Anomaly]:
    out = []
    for mid, sends in ix.sends.items():
        outcomes = {ix.effective(s) for s in sends}
        if OK in outcomes and not ix.finals.get(mid) and not _completed(ix, mid):
            out.append(
                Anomaly(
                    "LOST",
                    mid,
                    "acknowledged, never completed, not found by the drain",
                    (*sends, *ix.receives.get(mid, []), *ix.settles.get(mid, [])),
                )
            )
        if outcomes == {FAILED} and ix.seen(mid):
            out.append(
                Anomaly(
                    "PHANTOM",
                    mid,
                    "its send failed (or its transaction aborted) yet it appeared",
                    (*sends, *ix.receives.get(mid, []), *ix.finals.get(mid, [])),
                )
            )
    return out


def _check_settled_stays_settled(ix: _Index) -> list[Anomaly]:
    out = []
    for mid, settles in ix.settles.items():
        acked = [s for s in settles if ix.effective(s) == OK]
        completes = [s for s in acked if s.op == COMPLETE]
        if len({s.lock_token for s in completes}) > 1:
            out.append(
                Anomaly(
                    "DOUBLE_COMPLETE", mid, "two locks' completes acknowledged", tuple(completes)
                )
            )
        for s in acked:
            at = ix.ack_time(s)
            later = [
                r
                for r in ix.receives.get(mid, [])
                if r.start > at + TOLERANCE_S and _forbidden_after(s.op, r.source)
            ]
            if s.op == COMPLETE and s.txn is None:  # transactions: TXN_COMPLETE_UNDONE
                later += [f for f in ix.finals.get(mid, [])]  # type: ignore[misc]
            if later:
                out.append(
                    Anomaly(
                        "DELIVERED_AFTER_SETTLE",
                        mid,
                        f"{s.op} acknowledged at {at:.3f}, then {len(later)} more",
                        (s, *later),
                    )
                )
    return out


def _forbidden_after(op: str, source: str) -> bool:
    if op == COMPLETE:
        return True
    if op == DEAD_LETTER:
        return source != "dead_letter"
    if op == DEFER:
        return source == "active"
    return False


def _lock_end(ix: _Index, r: Receive) -> float:
    """The earliest moment the broker may have freed this lock."""
    end = r.locked_until
    for s in ix.by_token.get(r.lock_token or "", []):
        end = min(end, s.start)  # settled (or found lost) from then on
    if r.receiver in ix.released:
        end = min(end, ix.released[r.receiver])
    for f in ix.faults:
        if (
            f.drops_locks
            and f.entity in (None, r.entity)
            and f.partition in (None, r.partition)
            and f.end >= r.start
        ):
            end = min(end, max(f.start, r.start))
    return end


def _check_locks(ix: _Index) -> list[Anomaly]:
    """Two locks were certainly valid at once if both receives had returned (so both were
    granted) before either lock could have ended. Which was granted first is not known: a
    receive that waits may start before and return after another."""
    out = []
    for mid, receives in ix.receives.items():
        locked = [(r, _lock_end(ix, r)) for r in receives if r.lock_token]
        for i, (a, end_a) in enumerate(locked):
            for b, end_b in locked[i + 1 :]:
                both = max(a.end, b.end)
                if a.lock_token != b.lock_token and both + TOLERANCE_S < min(end_a, end_b):
                    out.append(
                        Anomaly(
                            "DOUBLE_LOCK",
                            mid,
                            f"at {both:.3f} locked by {a.receiver} (valid until {end_a:.3f}) "
                            f"and by {b.receiver} (valid until {end_b:.3f})",
                            (a, b),
                        )
                    )
    return out


def _check_session_order(ix: _Index) -> list[Anomaly]:
    by_session: dict[tuple[str, str], list[Receive]] = defaultdict(list)
    for receives in ix.receives.values():
        for r in receives:
            if r.session_id is not None and r.source == "active":
                by_session[(r.entity, r.session_id)].append(r)
    out = []
    for (entity, sid), receives in by_session.items():
        receives.sort(key=lambda r: (r.end, r.seq))
        seen: set[str] = set()
        high: Receive | None = None
        for r in receives:
            if r.mid not in seen and high is not None and r.seq < high.seq:
                out.append(
                    Anomaly(
                        "SESSION_ORDER",
                        f"{entity}/{sid}",
                        f"new message seq {r.seq} after seq {high.seq}",
                        (high, r),
                    )
                )
            seen.add(r.mid)
            if high is None or r.seq > high.seq:
                high = r
    return out


def _check_transactions(ix: _Index) -> list[Anomaly]:
    out = []
    for tid, txn in ix.txns.items():
        sends = [m for s in ix.txn_sends.get(tid, []) if s.outcome != FAILED for m in s.mids]
        appeared = [m for m in sends if ix.seen(m)]
        if sends and 0 < len(appeared) < len(sends):
            out.append(
                Anomaly(
                    "TXN_PARTIAL",
                    tid,
                    f"{txn.outcome}: {len(appeared)} of {len(sends)} sends appeared",
                    (txn, *ix.txn_sends[tid]),
                )
            )
        applied = txn.outcome == COMMITTED or (txn.outcome == UNKNOWN and sends and appeared)
        if not applied:
            continue
        for s in ix.txn_settles.get(tid, []):
            if s.op != COMPLETE or s.outcome == FAILED:
                continue
            left = [f for f in ix.finals.get(s.mid, []) if f.state != "dead_letter"]
            if left:
                out.append(
                    Anomaly(
                        "TXN_COMPLETE_UNDONE",
                        s.mid,
                        f"transaction {tid} ({txn.outcome}) completed it, yet it is still there",
                        (txn, s, *left),
                    )
                )
    return out


def _check_dead_letters(ix: _Index, max_delivery_count: int) -> list[Anomaly]:
    out = []
    for mid, finals in ix.finals.items():
        for f in finals:
            if f.state != "dead_letter":
                continue
            asked = [
                s
                for s in ix.settles.get(mid, [])
                if s.op == DEAD_LETTER and ix.effective(s) != FAILED
            ]
            by_count = f.dead_letter_reason == "MaxDeliveryCountExceeded" and (
                f.delivery_count >= max_delivery_count - 1
            )
            if not asked and not by_count and f.dead_letter_reason != "TTLExpiredException":
                out.append(
                    Anomaly(
                        "DLQ_UNEXPLAINED",
                        mid,
                        f"dead-lettered ({f.dead_letter_reason}) without a dead-letter call",
                        (f, *ix.settles.get(mid, [])),
                    )
                )
    for mid, settles in ix.settles.items():
        dead = [s for s in settles if s.op == DEAD_LETTER and ix.effective(s) == OK]
        if not dead:
            continue
        in_dlq = any(f.state == "dead_letter" for f in ix.finals.get(mid, []))
        taken = any(r.source == "dead_letter" for r in ix.receives.get(mid, []))
        if not in_dlq and not taken:
            out.append(
                Anomaly(
                    "DLQ_MISSING",
                    mid,
                    "dead-letter acknowledged, not in the dead-letter queue",
                    (*dead, *ix.finals.get(mid, [])),
                )
            )
    return out
