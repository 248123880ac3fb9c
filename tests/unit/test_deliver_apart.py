"""``deliver_apart``: after a refused combined delivery, the calls are delivered in halves so a
refused call fails alone, at a cost of O(k log N) deliveries for k refused calls among N
(it was N + 1), and an unknown outcome is never redelivered."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Sequence

import pytest

from raybus._batching import deliver_apart
from raybus.exceptions import (
    OperationTimeoutError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
    ServiceBusServerBusyError,
)

UNKNOWN = (ServiceBusConnectionError, OperationTimeoutError)
BUSY = (ServiceBusServerBusyError,)


class Deliveries:
    """A fake deliver: records each delivery; ``refuse(calls)`` gives the error to raise."""

    def __init__(self, refuse: Callable[[Sequence[str]], ServiceBusError | None]) -> None:
        self.refuse = refuse
        self.made: list[list[str]] = []
        self.accepted: list[str] = []

    async def __call__(self, calls: Sequence[str]) -> None:
        self.made.append(list(calls))
        error = self.refuse(calls)
        if error is not None:
            raise error
        self.accepted.extend(calls)

    def run(self, calls: list[str]) -> list[ServiceBusError | None]:
        return asyncio.run(
            deliver_apart(calls, self, refused=ServiceBusError, unknown=UNKNOWN, busy=BUSY)
        )


def refusing(bad: set[str]) -> Callable[[Sequence[str]], ServiceBusError | None]:
    def refuse(calls: Sequence[str]) -> ServiceBusError | None:
        hit = [c for c in calls if c in bad]
        return ServiceBusQuotaExceededError(f"refused {hit[0]}", "t") if hit else None

    return refuse


def names(n: int) -> list[str]:
    return [f"c{i}" for i in range(n)]


def test_all_accepted_is_one_delivery() -> None:
    fake = Deliveries(refusing(set()))
    assert fake.run(names(64)) == [None] * 64
    assert fake.made == [names(64)]


def test_no_calls_no_delivery() -> None:
    fake = Deliveries(refusing(set()))
    assert fake.run([]) == []
    assert fake.made == []


@pytest.mark.parametrize("n", [2, 3, 7, 64])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_k_refused_calls_among_n_fail_alone_in_o_k_log_n_deliveries(n: int, k: int) -> None:
    rng = random.Random(n * 100 + k)
    calls = names(n)
    bad = set(rng.sample(calls, min(k, n)))
    fake = Deliveries(refusing(bad))

    results = fake.run(calls)

    for call, result in zip(calls, results, strict=True):
        if call in bad:
            assert isinstance(result, ServiceBusQuotaExceededError)
            assert str(result).startswith(f"refused {call}")  # its own refusal, from alone
            assert [call] in fake.made
        else:
            assert result is None
    assert sorted(fake.accepted) == sorted(set(calls) - bad)  # each accepted exactly once
    bound = 1 + 2 * len(bad) * math.ceil(math.log2(n))
    assert len(fake.made) <= bound, (len(fake.made), bound)
    if n == 64:
        assert len(fake.made) < n + 1  # the call-by-call retry's cost


def test_one_refused_call_among_64_costs_at_most_13_deliveries() -> None:
    fake = Deliveries(refusing({"c37"}))
    results = fake.run(names(64))
    assert [i for i, r in enumerate(results) if r is not None] == [37]
    assert len(fake.made) <= 1 + 2 * 6


def test_a_refusal_of_the_combination_only_fails_no_call() -> None:
    """Every call alone would be accepted (a quota the sum exceeds): none is reported refused."""
    fake = Deliveries(
        lambda calls: ServiceBusQuotaExceededError("too much", "t") if len(calls) > 3 else None
    )
    assert fake.run(names(10)) == [None] * 10
    assert sorted(fake.accepted) == sorted(names(10))


def test_a_call_is_refused_only_after_being_delivered_alone() -> None:
    rng = random.Random(7)
    for _ in range(50):
        n = rng.randint(1, 20)
        calls = names(n)
        bad = {c for c in calls if rng.random() < 0.2}
        limit = rng.randint(1, n)  # the combination may be refused too
        fake = Deliveries(
            lambda cs, bad=bad, limit=limit: (
                refusing(bad)(cs)
                or (ServiceBusQuotaExceededError("sum", "t") if len(cs) > limit else None)
            )
        )
        results = fake.run(calls)
        for call, result in zip(calls, results, strict=True):
            assert (result is not None) == (call in bad)
            if result is not None:
                assert [call] in fake.made
        assert sorted(fake.accepted) == sorted(set(calls) - bad)


@pytest.mark.parametrize(
    "error", [ServiceBusConnectionError("gone", "t"), OperationTimeoutError("slow", "t")]
)
def test_an_unknown_outcome_goes_to_every_call_of_that_delivery_and_is_not_redelivered(
    error: ServiceBusError,
) -> None:
    calls = names(8)

    def refuse(part: Sequence[str]) -> ServiceBusError | None:
        if "c1" in part and len(part) == 8:
            return ServiceBusQuotaExceededError("refused c1", "t")
        if part == ["c4", "c5", "c6", "c7"]:
            return error  # the right half's outcome is unknown
        return refusing({"c1"})(part)

    fake = Deliveries(refuse)
    results = fake.run(calls)

    assert results[4:] == [error] * 4
    assert isinstance(results[1], ServiceBusQuotaExceededError)
    assert results[0] is None and results[2:4] == [None, None]
    assert sum(1 for part in fake.made if set(part) & {"c4", "c5", "c6", "c7"}) == 2  # whole, half


def test_an_unknown_outcome_of_the_whole_is_reported_to_all_and_not_split() -> None:
    error = ServiceBusConnectionError("gone", "t")
    fake = Deliveries(lambda calls: error)
    assert fake.run(names(5)) == [error] * 5
    assert len(fake.made) == 1


def test_a_busy_refusal_of_the_whole_is_reported_to_all_and_not_split() -> None:
    """The broker's state refused it (nothing stored): halves would be refused alike."""
    error = ServiceBusServerBusyError("an earlier publish goes first", "t")
    fake = Deliveries(lambda calls: error)
    assert fake.run(names(5)) == [error] * 5
    assert fake.made == [names(5)]


def test_other_errors_propagate() -> None:
    async def deliver(calls: Sequence[str]) -> None:
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        asyncio.run(deliver_apart(["a", "b"], deliver, refused=ServiceBusError, unknown=UNKNOWN))
