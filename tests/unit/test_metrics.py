"""Metrics export: counter deltas, gauges and histogram samples reach ray.util.metrics."""

from __future__ import annotations

from typing import Any

import pytest

from raybus import _metrics
from raybus._core.partition import Partition
from raybus._core.record import MessageRecord
from raybus._core.store import SettleOp
from raybus._models import QueueProperties
from raybus.testing import FakeClock


class FakeMetric:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, dict[str, str]]] = []

    def inc(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("inc", value, tags))

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("set", value, tags))

    def observe(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("observe", value, tags))


@pytest.fixture
def fake_metrics(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeMetric]:
    fakes: dict[str, Any] = {}
    for name in list(_metrics.COUNTERS.values()) + list(_metrics.GAUGES.values()):
        fakes[name] = FakeMetric()
    for name, _bounds in _metrics.HISTOGRAMS.values():
        fakes[name] = FakeMetric()
    monkeypatch.setattr(_metrics, "_metrics", fakes)
    return fakes


def test_export_sends_counter_deltas_gauges_and_samples_with_tags(fake_metrics):
    m = _metrics.PartitionMetrics("ns", "orders", 2)
    m.export({"sent": 5, "delivered": 3}, {"active": 2}, {"flush_seconds": [0.001, 0.002]})
    m.export({"sent": 8, "delivered": 3}, {"active": 5}, {})
    tags = {"namespace": "ns", "entity": "orders", "partition": "2"}
    assert fake_metrics["raybus_messages_sent_total"].calls == [
        ("inc", 5, tags),
        ("inc", 3, tags),
    ]
    assert fake_metrics["raybus_messages_delivered_total"].calls == [("inc", 3, tags)]
    assert fake_metrics["raybus_active_messages"].calls == [("set", 2, tags), ("set", 5, tags)]
    assert [c[1] for c in fake_metrics["raybus_flush_seconds"].calls] == [0.001, 0.002]


def test_a_total_that_went_down_after_a_rebuild_counts_from_zero(fake_metrics):
    m = _metrics.PartitionMetrics("ns", "q", 0)
    m.export({"sent": 10}, {}, {})
    m.export({"sent": 4}, {}, {})  # the core was rebuilt: its totals restarted
    assert [c[1] for c in fake_metrics["raybus_messages_sent_total"].calls] == [10, 4]


def test_export_never_raises(monkeypatch):
    class Broken:
        def inc(self, *a: Any, **k: Any) -> None:
            raise RuntimeError("exporter down")

    monkeypatch.setattr(_metrics, "_metrics", {"raybus_messages_sent_total": Broken()})
    _metrics.PartitionMetrics("ns", "q", 0).export({"sent": 1}, {}, {})


def test_partition_counts_what_the_metrics_report():
    clock = FakeClock()
    p = Partition(QueueProperties("q", lock_duration=1, max_delivery_count=2), clock)
    p.send([MessageRecord(body=b"x", size=10) for _ in range(3)])
    got = p.receive(3)
    p.settle([SettleOp("complete", got[0].lock_token or "")])
    p.settle([SettleOp("dead_letter", got[1].lock_token or "")])
    clock.advance(2)  # the third lock expires: redelivered
    p.tick()
    assert p.delete_messages(10, clock.now()) == 1  # the redelivered one, unreceived
    assert p.stats == {
        "sent": 3,
        "delivered": 3,
        "completed": 1,
        "dead_lettered": 1,
        "lock_expired": 1,
        "redelivered": 1,
        "deleted": 1,
    }
