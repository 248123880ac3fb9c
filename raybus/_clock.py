"""Clocks: the broker core asks an injected clock for the time, so tests can move it.

Times inside raybus are float seconds since the Unix epoch (UTC); the public API converts them
to timezone-aware ``datetime`` objects.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Protocol

__all__ = ["Clock", "SystemClock", "from_timestamp", "to_timestamp"]


class Clock(Protocol):
    """Anything with ``now()`` returning seconds since the epoch."""

    def now(self) -> float: ...


class SystemClock:
    """The wall clock (``time.time``)."""

    def now(self) -> float:
        return time.time()


def from_timestamp(ts: float | None) -> datetime | None:
    """Epoch seconds to an aware UTC datetime (``None`` and infinity stay ``None``)."""
    if ts is None or ts == float("inf"):
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc)


def to_timestamp(when: datetime) -> float:
    """An aware or naive-UTC datetime to epoch seconds (naive datetimes are taken as UTC)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()
