"""The router combines the publish calls waiting at a moment into one delivery (one
transaction), and keeps each call's outcome its own when the combined delivery is refused."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raybus._actors.router import RouterActor
from raybus._core.record import MessageRecord
from raybus._topic_models import TopicProperties
from raybus.exceptions import (
    OperationTimeoutError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
)


class _Router(RouterActor):
    """A router whose delivery is scripted: ``refuse(records)`` returns the error to raise."""

    def __init__(self, refuse: Any = None) -> None:
        super().__init__("ns", TopicProperties("t"), None)
        self.deliveries: list[list[str | None]] = []
        self.gate: asyncio.Event | None = None
        self.refuse = refuse or (lambda recs: None)

    async def _deliver(self, records: list[Any]) -> None:
        self.deliveries.append([r.message_id for r in records])
        if self.gate is not None:
            await self.gate.wait()
        error = self.refuse(records)
        if error is not None:
            raise error


def _call(name: str, n: int = 2) -> list[MessageRecord]:
    return [MessageRecord(body=b"x", message_id=f"{name}{i}") for i in range(n)]


async def _outcome(router: _Router, recs: list[MessageRecord]) -> ServiceBusError | None:
    try:
        await router._combiner.submit(recs)
    except ServiceBusError as exc:
        return exc
    return None


async def _while_busy(router: _Router, names: list[str]) -> list[ServiceBusError | None]:
    """Publish ``names[0]``'s call, then the others while its delivery is held in flight."""
    router.gate = asyncio.Event()
    first = asyncio.ensure_future(_outcome(router, _call(names[0])))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(_outcome(router, _call(n))) for n in names[1:]]
    await asyncio.sleep(0)
    router.gate.set()
    return list(await asyncio.gather(first, *rest))


async def test_calls_arriving_during_a_delivery_go_together_as_the_next_one() -> None:
    router = _Router()

    assert await _while_busy(router, ["a", "b", "c", "d"]) == [None, None, None, None]
    assert router.deliveries == [["a0", "a1"], ["b0", "b1", "c0", "c1", "d0", "d1"]]
    assert router.published == 8


async def test_a_refused_combined_delivery_is_retried_per_call_so_one_call_fails_alone() -> None:
    def refuse(recs: list[MessageRecord]) -> ServiceBusError | None:
        if any(r.message_id == "big0" for r in recs):
            return ServiceBusQuotaExceededError("full", "t")
        return None

    router = _Router(refuse)

    a, b, big, c = await _while_busy(router, ["a", "b", "big", "c"])

    assert (a, b, c) == (None, None, None)
    assert isinstance(big, ServiceBusQuotaExceededError)
    assert router.deliveries[2:] == [["b0", "b1"], ["big0", "big1"], ["c0", "c1"]]
    assert router.published == 6


@pytest.mark.parametrize(
    "error", [ServiceBusConnectionError("gone", "t"), OperationTimeoutError("slow", "t")]
)
async def test_an_unknown_outcome_is_reported_to_every_call_and_never_redelivered(
    error: ServiceBusError,
) -> None:
    router = _Router(lambda recs: error if len(recs) > 2 else None)

    a, b, c = await _while_busy(router, ["a", "b", "c"])

    assert a is None and b is error and c is error
    assert len(router.deliveries) == 2  # the combined one was not repeated call by call
    assert router.published == 2


async def test_one_refused_call_among_many_costs_log_n_deliveries_not_one_per_call() -> None:
    names = [f"p{i}-" for i in range(17)]  # the first alone, then 16 combined

    def refuse(recs: list[MessageRecord]) -> ServiceBusError | None:
        if any(r.message_id == "p9-0" for r in recs):
            return ServiceBusQuotaExceededError("full", "t")
        return None

    router = _Router(refuse)

    outcomes = await _while_busy(router, names)

    assert [i for i, o in enumerate(outcomes) if o is not None] == [9]
    assert isinstance(outcomes[9], ServiceBusQuotaExceededError)
    assert ["p9-0", "p9-1"] in router.deliveries  # refused alone, not for its company
    assert router.published == 2 * 16
    # The first call, the combined 16, then at most two halves per level down to p9 (log2 16 = 4);
    # one call at a time cost 1 + 1 + 16.
    assert len(router.deliveries) <= 2 + 2 * 4
