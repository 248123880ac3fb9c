"""The receives whose receivers stopped waiting for them (the partition's ``end_waits``).

A receiver that stops waiting while its receive is still out at a partition (``close()``, or
a receive its caller cancelled) names that receive's waiter id in an ``end_waits`` call; the
receive then returns no messages at once, unless it took some already. The two calls race:
the end may reach the partition before its receive (which then takes nothing at all) or after
it returned (nothing to end). So an end is remembered until its receive comes and drops it,
or for ``keep_s`` when none comes; the forgetting happens when later ends arrive, so a
partition nobody ends receives on keeps nothing.

Ray-free, with an injected monotonic clock (as ``Committer``'s: only durations count, so a
step of the wall clock changes nothing), so a unit test can move time past ``keep_s``; the
partition actor holds one and asks it on every receive.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

__all__ = ["END_KEEP_S", "EndedWaits"]

# An end for a receive that has not arrived (or already returned) is kept this long.
END_KEEP_S = 60.0


class EndedWaits:
    """Waiter ids whose waits were ended, each with when (see the module docstring)."""

    def __init__(
        self, monotonic: Callable[[], float] = time.monotonic, keep_s: float = END_KEEP_S
    ) -> None:
        self._monotonic = monotonic
        self._keep_s = keep_s
        self._ended: dict[str, float] = {}

    def end(self, waiters: Iterable[str]) -> None:
        """Remember that the receives named ``waiters`` must end; forget ends older than
        ``keep_s`` (no receive came for them)."""
        now = self._monotonic()
        for name, at in list(self._ended.items()):
            if now - at > self._keep_s:
                del self._ended[name]
        for name in waiters:
            self._ended[name] = now

    def __contains__(self, waiter: object) -> bool:
        return waiter in self._ended

    def drop(self, waiter: str) -> None:
        """The receive named ``waiter`` returned: its end, if any, is used up."""
        self._ended.pop(waiter, None)

    def __len__(self) -> int:
        return len(self._ended)
