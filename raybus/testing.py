"""Helpers for testing code that uses raybus: a clock you move by hand."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A clock that stands still until ``advance`` moves it (seconds since the epoch)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (never backwards)."""
        if seconds < 0:
            raise ValueError(f"a clock only moves forward, not by {seconds} s")
        self._now += seconds
