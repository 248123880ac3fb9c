"""The calls waiting on a partition for something to take, woken in turn instead of all at once.

A receive that finds nothing waits until something changes. Waking every waiting call on
every change (an ``asyncio.Event``) costs a wake per waiter per message: with 8 competing
receivers of one queue, each message sent woke all 8, and 7 looked, found nothing and waited
again: a quarter more of the partition's CPU per message than with one receiver, growing
with the number of receivers.

So the waiting calls stand in *lines*, one per kind of thing they wait for (the main queue,
the dead-letter sub-queue, one session, a session to accept, ...): waiters of one line take
from the same messages, so when one of them finds fewer than it asked for, there is nothing
left for the others either. A change wakes the first waiter of every line
(``notify``). A woken call that took as much as it asked for (there may be more) or that
takes nothing itself (``wait_available`` looks without taking) wakes the next one of its line
(``pass_on``); one that found the line's messages exhausted does not. A woken call that ends
without looking (its receiver stopped waiting, or it was cancelled) passes the wake on too,
so a message is never left behind a wake nobody used. ``notify_all`` wakes every waiter, for
changes every waiter must see (the entity deleted or its status changed, waits ended).

Ray-free and clock-free (asyncio timers only): the partition actor holds one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable

__all__ = ["WaitLines"]


def _resolve(fut: asyncio.Future[bool], woken: bool) -> None:
    if not fut.done():
        fut.set_result(woken)


class WaitLines:
    """Waiting calls in lines by what they wait for (see the module docstring)."""

    def __init__(self) -> None:
        self._lines: dict[Hashable, deque[asyncio.Future[bool]]] = {}
        self.wakes = 0  # waiting calls woken by a change (not by their timeout); statistics

    def waiting(self, line: Hashable | None = None) -> int:
        """How many calls wait (in ``line``, or in all lines)."""
        if line is not None:
            return sum(not f.done() for f in self._lines.get(line, ()))
        return sum(not f.done() for q in self._lines.values() for f in q)

    async def wait(self, line: Hashable, timeout: float) -> bool:
        """Wait in ``line`` for a wake or ``timeout`` seconds; True if woken.

        A call woken and then cancelled before it could look passes its wake on."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        queue = self._lines.setdefault(line, deque())
        queue.append(fut)
        timer = loop.call_later(max(timeout, 0.0), _resolve, fut, False)
        try:
            return await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.result():
                self.pass_on(line)
            raise
        finally:
            timer.cancel()
            try:
                queue.remove(fut)
            except ValueError:
                pass  # taken out by the wake
            if not queue and self._lines.get(line) is queue:
                del self._lines[line]

    def pass_on(self, line: Hashable) -> None:
        """Wake the first call still waiting in ``line``, if any."""
        queue = self._lines.get(line)
        while queue:
            fut = queue.popleft()
            if not fut.done():
                fut.set_result(True)
                self.wakes += 1
                return

    def notify(self) -> None:
        """Something may have become available: wake the first waiter of every line."""
        for line in list(self._lines):
            self.pass_on(line)

    def notify_all(self) -> None:
        """Wake every waiting call."""
        lines, self._lines = self._lines, {}
        for queue in lines.values():
            for fut in queue:
                if not fut.done():
                    fut.set_result(True)
                    self.wakes += 1
