"""Queue samples for ``raybus stats`` and the rates between two of them (pure).

A sample holds a queue's counts and the running total of messages its partitions accepted
(``sent``). Between two samples:

* in rate  = increase of ``sent`` / elapsed time;
* out rate = in rate - increase of the messages held (active + dead-letter + scheduled) /
  elapsed time, i.e. messages that left the queue (completed, received-and-deleted, expired,
  purged).

A partition's running total restarts at zero when its actor restarts (or a partition is
removed); a total that went down gives no rate for that interval rather than a wrong one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QueueSample", "Rates", "rates"]


@dataclass(frozen=True)
class QueueSample:
    """One queue at one moment."""

    name: str
    at: float  #: monotonic seconds when the sample was taken
    active: int
    dead_letter: int
    scheduled: int
    partitions: int
    size_in_bytes: int
    status: str
    sent: float | None  #: messages accepted so far (sum over partitions); None if unknown

    @property
    def held(self) -> int:
        return self.active + self.dead_letter + self.scheduled


@dataclass(frozen=True)
class Rates:
    """Messages per second between two samples (``None``: unknown for this interval)."""

    incoming: float | None
    outgoing: float | None


def rates(before: QueueSample | None, after: QueueSample) -> Rates:
    """The in and out rates from ``before`` to ``after`` (same queue)."""
    if before is None or after.at <= before.at:
        return Rates(None, None)
    if before.sent is None or after.sent is None or after.sent < before.sent:
        return Rates(None, None)
    elapsed = after.at - before.at
    incoming = (after.sent - before.sent) / elapsed
    outgoing = incoming - (after.held - before.held) / elapsed
    return Rates(incoming, max(outgoing, 0.0))
