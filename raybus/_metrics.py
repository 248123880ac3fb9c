"""Broker metrics through ``ray.util.metrics`` (exported by Ray's Prometheus endpoint).

Partition actors count in plain integers on their hot paths (``Partition.stats``, the
committer's flush counters) and export the changes every ``EXPORT_INTERVAL_S`` seconds, so
metrics cost nothing per message. Every series carries the tags ``namespace``, ``entity`` and
``partition``.

Counters: ``raybus_messages_sent_total`` (accepted), ``raybus_messages_delivered_total``
(handed to receivers), ``raybus_messages_completed_total``,
``raybus_messages_dead_lettered_total``, ``raybus_messages_deleted_total`` (by a batch delete
or purge, unreceived), ``raybus_lock_expiries_total`` (locks lost),
``raybus_redeliveries_total``, ``raybus_flushes_total`` (of them
``raybus_inline_flushes_total`` written on the actor's event loop thread, not a worker
thread: ``raybus._core.committer``); transactions:
``raybus_transactions_total`` with tag ``outcome`` (committed/aborted). Gauges:
``raybus_active_messages``, ``raybus_dead_letter_messages``, ``raybus_scheduled_messages``,
``raybus_size_bytes``. Histograms (seconds): ``raybus_flush_seconds`` (one storage write),
``raybus_send_seconds`` (a send call inside the partition, durable point included),
``raybus_receive_wait_seconds`` (how long a delivered message had waited in the queue).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

__all__ = ["EXPORT_INTERVAL_S", "PartitionMetrics", "count_transaction"]

EXPORT_INTERVAL_S = 5.0

_log = logging.getLogger("raybus.metrics")
_metrics: dict[str, Any] = {}  # one object per metric name and process
_TAGS = ("namespace", "entity", "partition")
_SECONDS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0]
_WAIT = [0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0, 86400.0]

COUNTERS = {
    "sent": "raybus_messages_sent_total",
    "delivered": "raybus_messages_delivered_total",
    "completed": "raybus_messages_completed_total",
    "dead_lettered": "raybus_messages_dead_lettered_total",
    "deleted": "raybus_messages_deleted_total",
    "lock_expired": "raybus_lock_expiries_total",
    "redelivered": "raybus_redeliveries_total",
    "flushes": "raybus_flushes_total",
    "inline_flushes": "raybus_inline_flushes_total",
}
GAUGES = {
    "active": "raybus_active_messages",
    "dead_letter": "raybus_dead_letter_messages",
    "scheduled": "raybus_scheduled_messages",
    "size_bytes": "raybus_size_bytes",
}
HISTOGRAMS = {
    "flush_seconds": ("raybus_flush_seconds", _SECONDS),
    "send_seconds": ("raybus_send_seconds", _SECONDS),
    "receive_wait_seconds": ("raybus_receive_wait_seconds", _WAIT),
}


def _metric(kind: str, name: str, boundaries: list[float] | None = None) -> Any:
    m = _metrics.get(name)
    if m is None:
        from ray.util import metrics

        if kind == "counter":
            m = metrics.Counter(name, description=name, tag_keys=_TAGS)
        elif kind == "gauge":
            m = metrics.Gauge(name, description=name, tag_keys=_TAGS)
        else:
            m = metrics.Histogram(
                name, description=name, boundaries=boundaries or _SECONDS, tag_keys=_TAGS
            )
        _metrics[name] = m
    return m


class PartitionMetrics:
    """Exports one partition's counters as deltas since the last export."""

    def __init__(self, namespace: str, entity: str, partition: int) -> None:
        self.tags = {"namespace": namespace, "entity": entity, "partition": str(partition)}
        self._last: dict[str, float] = {}

    def export(
        self,
        totals: Mapping[str, float],
        gauges: Mapping[str, float],
        samples: Mapping[str, list[float]],
    ) -> None:
        """Push counter deltas (a total that went down, after a rebuild, restarts from
        zero), gauge values and histogram samples. Never raises: metrics are best effort."""
        try:
            for key, name in COUNTERS.items():
                total = totals.get(key, 0.0)
                delta = total - self._last.get(key, 0.0)
                if delta < 0:
                    delta = total
                self._last[key] = total
                if delta:
                    _metric("counter", name).inc(delta, tags=self.tags)
            for key, name in GAUGES.items():
                if key in gauges:
                    _metric("gauge", name).set(gauges[key], tags=self.tags)
            for key, (name, bounds) in HISTOGRAMS.items():
                values = samples.get(key)
                if values:
                    hist = _metric("histogram", name, bounds)
                    for v in values:
                        hist.observe(v, tags=self.tags)
        except Exception as exc:
            _log.debug("metrics export failed: %s", exc)


def count_transaction(namespace: str, outcome: str) -> None:
    """Count one transaction outcome (``committed`` or ``aborted``)."""
    try:
        m = _metrics.get("raybus_transactions_total")
        if m is None:
            from ray.util import metrics

            m = _metrics["raybus_transactions_total"] = metrics.Counter(
                "raybus_transactions_total",
                description="transactions by outcome",
                tag_keys=("namespace", "outcome"),
            )
        m.inc(1, tags={"namespace": namespace, "outcome": outcome})
    except Exception as exc:
        _log.debug("metrics export failed: %s", exc)
