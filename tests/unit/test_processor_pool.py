"""The processor's replica pool (``raybus._core.pool``): scaling decisions with hysteresis and
statistics aggregation, on a fake clock; and the processor's argument checks (no Ray)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from raybus._core.pool import (
    HeldLock,
    HeldSession,
    PoolSettings,
    ProcessorStatistics,
    ReplicaPool,
    ReplicaReport,
    ScalePlan,
)
from raybus.aio._processor import ServiceBusProcessor, inspect_handler
from raybus.exceptions import InvalidArgumentError
from raybus.testing import FakeClock


def make_pool(clock: FakeClock, **settings: Any) -> ReplicaPool:
    defaults: dict[str, Any] = {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_backlog_per_replica": 10,
        "scale_down_delay_s": 5.0,
    }
    return ReplicaPool(PoolSettings(**{**defaults, **settings}), clock)


def started(pool: ReplicaPool, count: int) -> list[int]:
    """Add ``count`` replicas and mark them ready."""
    ids = [pool.add() for _ in range(count)]
    for rid in ids:
        pool.ready(rid)
    return ids


# ---------------------------------------------------------------------- desired size


@pytest.mark.parametrize(
    ("backlog", "want"),
    [(0, 1), (1, 1), (10, 1), (11, 2), (30, 3), (40, 4), (41, 4), (10_000, 4)],
)
def test_desired_replicas_is_backlog_over_target_within_bounds(backlog: int, want: int) -> None:
    settings = PoolSettings(min_replicas=1, max_replicas=4, target_backlog_per_replica=10)
    assert settings.desired(backlog) == want


def test_min_replicas_zero_scales_to_zero_when_idle_and_back_on_work(clock: FakeClock) -> None:
    pool = make_pool(clock, min_replicas=0, scale_down_delay_s=0)
    assert pool.observe(0) == ScalePlan()
    assert pool.observe(3) == ScalePlan(start=1)
    (rid,) = started(pool, 1)
    clock.advance(1)
    assert pool.observe(0) == ScalePlan(drain=(rid,))


# ---------------------------------------------------------------------- growing


def test_observe_grows_at_once_to_the_desired_size(clock: FakeClock) -> None:
    pool = make_pool(clock)
    assert pool.observe(0) == ScalePlan(start=1)
    started(pool, 1)
    assert pool.observe(35) == ScalePlan(start=3)


def test_replicas_still_starting_count_so_a_reading_starts_none_twice(clock: FakeClock) -> None:
    pool = make_pool(clock)
    assert pool.observe(40) == ScalePlan(start=4)
    for _ in range(4):
        pool.add()  # starting, not ready yet
    assert pool.observe(40) == ScalePlan()
    stats = pool.statistics()
    assert (stats.replicas, stats.replicas_starting, stats.desired_replicas) == (0, 4, 4)


# ---------------------------------------------------------------------- shrinking


def test_shrink_waits_for_scale_down_delay(clock: FakeClock) -> None:
    pool = make_pool(clock)
    started(pool, 4)
    assert pool.observe(0) == ScalePlan()
    clock.advance(4.9)
    assert pool.observe(0) == ScalePlan()
    clock.advance(0.1)
    plan = pool.observe(0)
    assert len(plan.drain) == 3 and plan.start == 0


def test_shrink_goes_to_the_largest_size_desired_during_the_window(clock: FakeClock) -> None:
    pool = make_pool(clock)
    started(pool, 4)
    pool.observe(0)
    clock.advance(2)
    pool.observe(25)  # wants 3 for a moment
    clock.advance(3)
    plan = pool.observe(0)
    assert len(plan.drain) == 1  # 4 -> 3, not 4 -> 1


def test_backlog_rising_again_cancels_a_pending_shrink(clock: FakeClock) -> None:
    pool = make_pool(clock)
    started(pool, 4)
    pool.observe(0)
    clock.advance(4)
    assert pool.observe(40) == ScalePlan()  # back to 4: the low window ends
    clock.advance(2)
    assert pool.observe(0) == ScalePlan()  # a new window starts: no drain yet
    clock.advance(5)
    assert len(pool.observe(0).drain) == 3


def test_a_falling_backlog_shrinks_step_by_step_without_a_new_window_each(
    clock: FakeClock,
) -> None:
    pool = make_pool(clock, scale_down_delay_s=2.0)
    started(pool, 4)

    def drain(plan: ScalePlan) -> int:
        for rid in plan.drain:
            pool.draining(rid)
            pool.drained(rid, None)
        return len(plan.drain)

    pool.observe(40)
    clock.advance(1)
    pool.observe(25)  # wants 3: the pool is too big from now on
    clock.advance(1)
    assert pool.observe(15) == ScalePlan()  # wants 2, but only 1 s too big
    clock.advance(1)
    assert drain(pool.observe(0)) == 1  # 2 s too big; the window [1 s, 3 s] wanted 3 at most
    clock.advance(0.5)
    assert drain(pool.observe(0)) == 1  # the window [1.5 s, 3.5 s] wanted 2 at most
    clock.advance(1)
    assert drain(pool.observe(0)) == 1  # and now 1
    assert pool.size == 1


def test_a_shrink_needs_the_pool_too_big_for_a_whole_window(clock: FakeClock) -> None:
    pool = make_pool(clock)
    started(pool, 2)
    clock.advance(100)  # long idle before the first reading
    assert pool.observe(0) == ScalePlan()  # no history: wait a full window
    clock.advance(5)
    assert len(pool.observe(0).drain) == 1


def test_draining_replicas_no_longer_count_toward_the_size(clock: FakeClock) -> None:
    pool = make_pool(clock, scale_down_delay_s=0)
    ids = started(pool, 2)
    pool.draining(ids[0])
    assert pool.size == 1
    assert pool.statistics().replicas == 1
    assert pool.observe(0) == ScalePlan()


def test_drain_picks_least_work_in_flight_then_newest(clock: FakeClock) -> None:
    pool = make_pool(clock, scale_down_delay_s=0)
    a, b, c, d = started(pool, 4)
    pool.report(a, ReplicaReport(version=1, in_flight=0))
    pool.report(b, ReplicaReport(version=1, in_flight=3))
    pool.report(c, ReplicaReport(version=1, in_flight=0))
    pool.report(d, ReplicaReport(version=1, in_flight=1))
    assert pool.observe(15).drain == (c, a)


def test_a_stopped_pool_plans_nothing(clock: FakeClock) -> None:
    pool = make_pool(clock, scale_down_delay_s=0)
    started(pool, 2)
    pool.stop()
    assert pool.observe(0) == ScalePlan()
    assert pool.observe(1000) == ScalePlan()


def test_failed_backlog_reading_keeps_the_last_one(clock: FakeClock) -> None:
    pool = make_pool(clock)
    started(pool, 1)
    pool.observe(30)
    assert pool.observe(None) == ScalePlan(start=2)
    assert pool.statistics().backlog == 30


# ---------------------------------------------------------------------- failures


def test_lost_replica_is_replaced_at_once_and_counted(clock: FakeClock) -> None:
    pool = make_pool(clock)
    a, _b = started(pool, 2)
    pool.observe(20)
    pool.lost(a)
    assert pool.observe(20) == ScalePlan(start=1)
    stats = pool.statistics()
    assert (stats.replicas, stats.replicas_lost, stats.replicas_started) == (1, 1, 2)


def test_lost_replica_locks_split_into_abandon_release_and_sessions(clock: FakeClock) -> None:
    pool = make_pool(clock)
    (rid,) = started(pool, 1)
    running, prefetched = HeldLock(0, "t1", True), HeldLock(1, "t2", False)
    session = HeldSession(0, "s1", "st")
    pool.report(
        rid,
        ReplicaReport(version=3, in_flight=1, locks=(running, prefetched), sessions=(session,)),
    )
    work = pool.lost(rid)
    assert work.abandon == (running,)
    assert work.release == (prefetched,)
    assert work.sessions == (session,)
    assert pool.lost(rid).abandon == ()  # a second notice gives nothing back twice


def test_replica_dying_before_ready_backs_off_exponentially(clock: FakeClock) -> None:
    pool = make_pool(clock, restart_backoff_s=1.0, max_restart_backoff_s=3.0)
    assert pool.observe(0) == ScalePlan(start=1)
    pool.start_failed(pool.add())
    assert pool.observe(0) == ScalePlan()  # waits 1 s
    clock.advance(1)
    assert pool.observe(0) == ScalePlan(start=1)
    pool.lost(pool.add())  # died while starting: also a start failure
    clock.advance(1.5)
    assert pool.observe(0) == ScalePlan()  # waits 2 s now
    clock.advance(0.5)
    pool.start_failed(pool.add())
    clock.advance(2.9)
    assert pool.observe(0) == ScalePlan()  # capped at 3 s
    clock.advance(0.1)
    assert pool.observe(0) == ScalePlan(start=1)
    (rid,) = started(pool, 1)
    assert pool.statistics().replicas_lost == 3
    pool.lost(rid)  # a failure after ready: the back-off had been reset
    assert pool.observe(0) == ScalePlan(start=1)


# ---------------------------------------------------------------------- statistics


def test_statistics_sum_live_reports_and_keep_departed_replicas(clock: FakeClock) -> None:
    pool = make_pool(clock)
    a, b, c = started(pool, 3)
    pool.report(a, ReplicaReport(version=5, handled=10, failed=2, dead_lettered=1, in_flight=2))
    pool.report(b, ReplicaReport(version=2, handled=7, in_flight=1))
    pool.report(c, ReplicaReport(version=1, handled=1, released=0))
    pool.draining(b)
    pool.drained(b, ReplicaReport(version=3, handled=8, released=4, final=True))
    pool.lost(c)
    pool.gave_back(interrupted=2, released=1)
    stats = pool.statistics()
    assert stats == ProcessorStatistics(
        handled=19,
        failed=2,
        dead_lettered=1,
        in_flight=2,
        replicas=1,
        replicas_starting=0,
        desired_replicas=0,
        backlog=0,
        replicas_started=3,
        replicas_lost=1,
        interrupted=2,
        released=5,
    )


def test_an_older_report_does_not_replace_a_newer_one(clock: FakeClock) -> None:
    pool = make_pool(clock)
    (rid,) = started(pool, 1)
    pool.report(rid, ReplicaReport(version=4, handled=9))
    pool.report(rid, ReplicaReport(version=3, handled=8))
    assert pool.statistics().handled == 9
    pool.draining(rid)
    pool.drained(rid, ReplicaReport(version=2, handled=5))  # stale final: the newer counts
    assert pool.statistics().handled == 9


def test_statistics_are_a_frozen_snapshot(clock: FakeClock) -> None:
    pool = make_pool(clock)
    (rid,) = started(pool, 1)
    before = pool.statistics()
    pool.report(rid, ReplicaReport(version=1, handled=1))
    assert before.handled == 0 and pool.statistics().handled == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.handled = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "settings",
    [
        {"min_replicas": -1},
        {"min_replicas": 3, "max_replicas": 2},
        {"max_replicas": 0, "min_replicas": 0},
        {"target_backlog_per_replica": 0},
        {"scale_down_delay_s": -1.0},
        {"min_replicas": True},
    ],
)
def test_pool_settings_are_validated(settings: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        PoolSettings(**settings)


# ---------------------------------------------------------------------- processor arguments


async def _async_two(message: Any, context: Any) -> None:
    pass


def _sync_one(message: Any) -> None:
    pass


class _AsyncCallable:
    async def __call__(self, message: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (_async_two, (True, True)),
        (_sync_one, (False, False)),
        (_AsyncCallable(), (True, False)),
        (lambda *args: None, (False, True)),
        (lambda m, ctx=None: None, (False, True)),
    ],
)
def test_handler_kind_and_arity_are_detected(handler: Any, expected: tuple[bool, bool]) -> None:
    assert inspect_handler(handler, "q") == expected


def _processor(entity: Any = "q", handler: Any = _sync_one, **options: Any) -> Any:
    return ServiceBusProcessor(None, entity, handler, **options)  # type: ignore[arg-type]


def test_topic_subscription_pair_names_the_subscription_entity() -> None:
    assert _processor(("orders", "audit")).entity_path == "orders/Subscriptions/audit"


@pytest.mark.parametrize("entity", [("orders",), ("orders", "a", "b"), ("orders", "bad name")])
def test_malformed_topic_subscription_pair_is_refused(entity: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        _processor(entity)


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"max_concurrent_calls": 0}, "max_concurrent_calls"),
        ({"prefetch_count": -1}, "prefetch_count"),
        ({"min_replicas": 2, "max_replicas": 1}, "max_replicas"),
        ({"target_backlog_per_replica": 0}, "target_backlog_per_replica"),
        ({"max_auto_lock_renewal_duration": -1}, "max_auto_lock_renewal_duration"),
        ({"actor_options": {"name": "mine"}}, "actor_options"),
        ({"actor_options": {"max_restarts": 3}}, "actor_options"),
        ({"session": "yes"}, "session"),
        ({"auto_complete": 1}, "auto_complete"),
    ],
)
def test_bad_processor_options_raise_invalid_argument(
    options: dict[str, Any], argument: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        _processor(**options)
    assert info.value.argument == argument


def test_handler_that_cannot_be_pickled_is_refused_up_front() -> None:
    lock = threading.Lock()

    def handler(message: Any) -> None:
        with lock:
            pass

    with pytest.raises(InvalidArgumentError, match="picklable"):
        _processor(handler=handler)


def test_handler_without_a_message_parameter_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="first positional"):
        _processor(handler=lambda: None)


def test_max_replicas_defaults_to_min_replicas() -> None:
    assert _processor(min_replicas=3)._settings.max_replicas == 3
    assert _processor(min_replicas=0)._settings.max_replicas == 1
