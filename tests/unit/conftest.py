"""Fixtures for the unit tests: plain classes, a FakeClock, and no Ray cluster.

The broker core (``raybus._core``) is Ray-free by design. ``raybus/__init__`` imports the client,
which imports ``ray``, so the module may be loaded; but no unit test may start it:
``ray.init`` raises for the duration of every unit test.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raybus._core.partition import Partition, SettleOp
from raybus._core.record import MessageRecord, encoded_size
from raybus._models import QueueProperties
from raybus.exceptions import ServiceBusError
from raybus.testing import FakeClock


def _refuse_ray_init(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("unit tests must not start Ray; use tests/integration for that")


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``ray.init`` raises during every unit test (only patched if something imported ray)."""
    ray = sys.modules.get("ray")
    if ray is not None and hasattr(ray, "init"):
        monkeypatch.setattr(ray, "init", _refuse_ray_init)
    yield


def make_record(body: Any = b"payload", **fields: Any) -> MessageRecord:
    """A fresh, validated record ready to send (``size`` set by ``encoded_size``)."""
    rec = MessageRecord(body=body, **fields)
    encoded_size(rec)
    return rec


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_partition(clock: FakeClock) -> Callable[..., Partition]:
    """``make_partition(partition_id=0, **queue_options)`` on the shared fake clock."""

    def make(partition_id: int = 0, **options: Any) -> Partition:
        return Partition(QueueProperties(name="orders", **options), clock, partition_id)

    return make


@pytest.fixture
def msg() -> Callable[..., MessageRecord]:
    return make_record


@pytest.fixture
def settle() -> Callable[..., ServiceBusError | None]:
    """``settle(partition, kind, token, **op_fields)``: the one result of a one-op settle."""

    def do(p: Partition, kind: str, token: str | None, **fields: Any) -> ServiceBusError | None:
        [result] = p.settle([SettleOp(kind, token, **fields)])  # type: ignore[arg-type]
        return result

    return do
