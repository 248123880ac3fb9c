"""The replica pool of a processor: scaling decisions and statistics, without Ray.

``ReplicaPool`` is the bookkeeping a processor's controller (``raybus.aio._processor``) keeps
about its replica actors. It never calls Ray; the controller tells it what happened (a replica
was added, became ready, reported, was drained, died) and asks it what to do next
(``observe(backlog)`` returns a ``ScalePlan``). Time comes from an injected clock, so the
hysteresis is unit-tested with ``raybus.testing.FakeClock``.

Policy:

* **Desired size** = ``ceil(backlog / target_backlog_per_replica)`` clamped to
  ``[min_replicas, max_replicas]``; ``backlog`` is the entity's active message count (which
  includes messages locked by handlers and prefetch buffers: work not finished yet).
* **Grow at once** when the desired size exceeds the replicas running or starting (a lost
  replica is therefore replaced on the next look).
* **Shrink with hysteresis** (a stabilisation window, as Kubernetes' HPA has): only once the
  desired size has stayed below the current size for ``scale_down_delay_s``, and then to the
  *largest* size desired during the last ``scale_down_delay_s``, so a backlog that dips between
  bursts does not make the pool flap, while a backlog that keeps falling shrinks it step by
  step without waiting a whole window per step. Replicas with the least work in flight (newest
  first among equals) are drained.
* **Crash-loop back-off**: a replica that dies before it became ready delays the next start by
  ``restart_backoff_s``, doubling per consecutive failure up to ``max_restart_backoff_s``.

Statistics: every replica reports cumulative counters; the pool sums the latest report of each
replica, folding a departed replica's last report into a base, plus what the controller gave
back on behalf of lost replicas.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .._clock import Clock
from ..exceptions import InvalidArgumentError

__all__ = [
    "HeldLock",
    "HeldSession",
    "LostWork",
    "PoolSettings",
    "ProcessorStatistics",
    "ReplicaPool",
    "ReplicaReport",
    "ScalePlan",
]

STARTING, RUNNING, DRAINING = "starting", "running", "draining"


def _check_int(value: Any, name: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(f"{name} must be an int >= {low}, not {value!r}", None, name)


def _check_seconds(value: Any, name: str, *, positive: bool) -> None:
    bad = isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value)
    if bad or value < 0 or (positive and value == 0):
        what = "a positive" if positive else "a non-negative"
        raise InvalidArgumentError(f"{name} must be {what} number of seconds", None, name)


@dataclass(frozen=True)
class PoolSettings:
    """How a processor sizes its pool (validated here; see the module for the policy)."""

    min_replicas: int = 1
    max_replicas: int = 1
    target_backlog_per_replica: int = 100
    scale_down_delay_s: float = 5.0
    restart_backoff_s: float = 1.0
    max_restart_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        _check_int(self.min_replicas, "min_replicas", 0)
        _check_int(self.max_replicas, "max_replicas", max(1, self.min_replicas))
        _check_int(self.target_backlog_per_replica, "target_backlog_per_replica", 1)
        _check_seconds(self.scale_down_delay_s, "scale_down_delay", positive=False)
        _check_seconds(self.restart_backoff_s, "restart_backoff_s", positive=True)
        _check_seconds(self.max_restart_backoff_s, "max_restart_backoff_s", positive=True)

    def desired(self, backlog: int) -> int:
        """The replica count ``backlog`` asks for, within the bounds."""
        want = math.ceil(max(0, backlog) / self.target_backlog_per_replica)
        return max(self.min_replicas, min(self.max_replicas, want))


@dataclass(frozen=True)
class HeldLock:
    """A message lock a replica holds: ``in_handler`` (its handler runs; giving it back
    counts a delivery, as an expired lock would) or prefetched (given back uncounted)."""

    partition_id: int
    lock_token: str
    in_handler: bool


@dataclass(frozen=True)
class HeldSession:
    """A session lock a replica holds (released at once if the replica dies)."""

    partition_id: int
    session_id: str
    token: str


@dataclass(frozen=True)
class ReplicaReport:
    """What a replica tells the controller: cumulative counters, the locks it holds now, and
    the handler errors since its previous report (``(exception, message or None)``)."""

    version: int
    handled: int = 0
    failed: int = 0
    dead_lettered: int = 0
    interrupted: int = 0
    released: int = 0
    in_flight: int = 0
    locks: tuple[HeldLock, ...] = ()
    sessions: tuple[HeldSession, ...] = ()
    errors: tuple[tuple[BaseException, Any], ...] = ()
    final: bool = False


@dataclass(frozen=True)
class ScalePlan:
    """What the controller should do now: start ``start`` replicas, drain ``drain``."""

    start: int = 0
    drain: tuple[int, ...] = ()


@dataclass(frozen=True)
class LostWork:
    """What a replica that died held, by its last report: the controller abandons
    ``abandon`` (handlers were running: a delivery is counted), releases ``release``
    (prefetched: uncounted) and releases the ``sessions``."""

    replica_id: int
    abandon: tuple[HeldLock, ...]
    release: tuple[HeldLock, ...]
    sessions: tuple[HeldSession, ...]


@dataclass(frozen=True)
class ProcessorStatistics:
    """A snapshot of a processor's counters (``processor.statistics``); cumulative since
    ``start()`` unless said otherwise. Replicas report about every 50 ms, so a snapshot may
    lag the replicas by that much."""

    handled: int = 0
    """Handler calls that returned (the message was then completed, or settled by the
    handler through its context)."""
    failed: int = 0
    """Handler calls that raised (the message was abandoned, or dead-lettered once it
    reached the entity's max delivery count)."""
    dead_lettered: int = 0
    """Messages the processor dead-lettered: poison messages at the max delivery count, plus
    those the handler dead-lettered through its context."""
    in_flight: int = 0
    """Handler calls running now (current, not cumulative)."""
    replicas: int = 0
    """Replicas ready and receiving now (current)."""
    replicas_starting: int = 0
    """Replicas being started now (current)."""
    desired_replicas: int = 0
    """The replica count the last backlog reading asks for (current; shrinking waits for
    ``scale_down_delay``)."""
    backlog: int = 0
    """Active messages of the entity at the last reading (current; includes locked ones)."""
    replicas_started: int = 0
    """Replicas that became ready."""
    replicas_lost: int = 0
    """Replicas that died without being stopped by the processor (each is replaced)."""
    interrupted: int = 0
    """Handler calls cut off: their replica died, or ``stop()``'s timeout ran out. Their
    messages were abandoned (a delivery counted), so they will be handled again."""
    released: int = 0
    """Prefetched messages given back unhandled (on stop, scale-down or a lost replica),
    without counting a delivery."""


_COUNTERS = ("handled", "failed", "dead_lettered", "interrupted", "released")


@dataclass
class _Replica:
    rid: int
    status: str
    report: ReplicaReport | None = None


@dataclass
class _Totals:
    handled: int = 0
    failed: int = 0
    dead_lettered: int = 0
    interrupted: int = 0
    released: int = 0

    def add(self, report: ReplicaReport | None) -> None:
        if report is not None:
            for name in _COUNTERS:
                setattr(self, name, getattr(self, name) + getattr(report, name))


@dataclass
class ReplicaPool:
    """Bookkeeping of one processor's replicas (call from one thread/event loop)."""

    settings: PoolSettings
    clock: Clock
    _replicas: dict[int, _Replica] = field(default_factory=dict)
    _next_id: int = 0
    _base: _Totals = field(default_factory=_Totals)
    _started: int = 0
    _lost: int = 0
    _backlog: int = 0
    _desired: int = 0
    _low_since: float | None = None  # since when the desired size is below the current one
    _readings: deque[tuple[float, int]] = field(default_factory=deque)  # (time, desired)
    _failures: int = 0
    _restart_at: float = 0.0
    _stopping: bool = False

    # ------------------------------------------------------------------ lifecycle

    def add(self) -> int:
        """Record a replica being started; returns its id (ids are never reused)."""
        rid = self._next_id
        self._next_id += 1
        self._replicas[rid] = _Replica(rid, STARTING)
        return rid

    def ready(self, rid: int) -> None:
        """The replica started and receives."""
        rep = self._replicas.get(rid)
        if rep is not None and rep.status == STARTING:
            rep.status = RUNNING
            self._started += 1
            self._failures = 0

    def report(self, rid: int, report: ReplicaReport) -> None:
        """Keep the replica's latest report (counters are cumulative; an older one is
        ignored)."""
        rep = self._replicas.get(rid)
        if rep is not None and (rep.report is None or report.version >= rep.report.version):
            rep.report = report

    def draining(self, rid: int) -> None:
        """The controller is stopping the replica on purpose."""
        rep = self._replicas.get(rid)
        if rep is not None:
            rep.status = DRAINING

    def drained(self, rid: int, final: ReplicaReport | None) -> None:
        """The replica stopped on purpose; ``final`` is its last report (None if the drain
        call failed: its last periodic report counts)."""
        rep = self._replicas.pop(rid, None)
        if rep is None:
            return
        if final is not None and (rep.report is None or final.version >= rep.report.version):
            rep.report = final
        self._base.add(rep.report)

    def start_failed(self, rid: int) -> None:
        """The replica died (or was given up) before it became ready: back off."""
        rep = self._replicas.pop(rid, None)
        if rep is None:
            return
        self._base.add(rep.report)
        self._lost += 1
        self._failures += 1
        pause = self.settings.restart_backoff_s * 2 ** (self._failures - 1)
        self._restart_at = self.clock.now() + min(self.settings.max_restart_backoff_s, pause)

    def lost(self, rid: int) -> LostWork:
        """The replica died without being asked to: what it held by its last report.

        Its counters so far are kept. The controller gives the locks back and then calls
        ``gave_back`` with how many of them the broker accepted.
        """
        rep = self._replicas.pop(rid, None)
        if rep is None:
            return LostWork(rid, (), (), ())
        if rep.status == STARTING:
            self._replicas[rid] = rep
            self.start_failed(rid)
            return LostWork(rid, (), (), ())
        self._base.add(rep.report)
        self._lost += 1
        last = rep.report
        if last is None:
            return LostWork(rid, (), (), ())
        return LostWork(
            rid,
            tuple(lk for lk in last.locks if lk.in_handler),
            tuple(lk for lk in last.locks if not lk.in_handler),
            last.sessions,
        )

    def gave_back(self, interrupted: int, released: int) -> None:
        """The controller abandoned ``interrupted`` and released ``released`` messages of a
        lost replica (those whose locks were still valid)."""
        self._base.interrupted += interrupted
        self._base.released += released

    def stop(self) -> None:
        """The processor is stopping: plan nothing more."""
        self._stopping = True

    # ------------------------------------------------------------------ queries

    def ids(self, *statuses: str) -> list[int]:
        """Ids of the replicas in ``statuses`` (every replica not yet gone when empty)."""
        return [r.rid for r in self._replicas.values() if not statuses or r.status in statuses]

    def status(self, rid: int) -> str | None:
        rep = self._replicas.get(rid)
        return None if rep is None else rep.status

    @property
    def size(self) -> int:
        """Replicas running or starting (draining ones no longer count)."""
        return sum(1 for r in self._replicas.values() if r.status in (STARTING, RUNNING))

    # ------------------------------------------------------------------ decisions

    def observe(self, backlog: int | None) -> ScalePlan:
        """Take a backlog reading (None: the reading failed; keep the last) and decide."""
        if backlog is not None:
            self._backlog = max(0, backlog)
        want = self._desired = self.settings.desired(self._backlog)
        if self._stopping:
            return ScalePlan()
        now = self.clock.now()
        window = self.settings.scale_down_delay_s
        readings = self._readings
        readings.append((now, want))
        while readings[0][0] < now - window:
            readings.popleft()
        current = self.size
        if want >= current:
            self._low_since = None
            if want == current or now < self._restart_at:
                return ScalePlan()
            return ScalePlan(start=want - current)
        if self._low_since is None:
            self._low_since = now
        if now - self._low_since < window:
            return ScalePlan()
        target = max(w for _t, w in readings)
        if target >= current:
            return ScalePlan()
        running = [r for r in self._replicas.values() if r.status == RUNNING]
        # Least work in flight first; among equals the newest (its prefetch is the smallest).
        running.sort(key=lambda r: (r.report.in_flight if r.report else 0, -r.rid))
        return ScalePlan(drain=tuple(r.rid for r in running[: current - target]))

    def statistics(self) -> ProcessorStatistics:
        totals = _Totals(**{n: getattr(self._base, n) for n in _COUNTERS})
        in_flight = 0
        for rep in self._replicas.values():
            totals.add(rep.report)
            if rep.report is not None:
                in_flight += rep.report.in_flight
        return ProcessorStatistics(
            handled=totals.handled,
            failed=totals.failed,
            dead_lettered=totals.dead_lettered,
            in_flight=in_flight,
            replicas=sum(1 for r in self._replicas.values() if r.status == RUNNING),
            replicas_starting=sum(1 for r in self._replicas.values() if r.status == STARTING),
            desired_replicas=self._desired,
            backlog=self._backlog,
            replicas_started=self._started,
            replicas_lost=self._lost,
            interrupted=totals.interrupted,
            released=totals.released,
        )
