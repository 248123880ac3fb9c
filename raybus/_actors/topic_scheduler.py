"""The router's scheduled messages: logged when scheduled, published through the router when due.

The actor half of ``raybus._core.topic_schedule`` (read it for what is kept and why): it logs
every change before answering (``ChangeLog``, in the topic's folder, so it goes with the
topic), and a timer task publishes the messages whose time has come through the router's own
publish path (rules as they stand then, all-or-nothing per message, the publish log), each
message on its own outcome: a refused one is tried again ``RETRY_S`` later.

Guarantee: a message whose ``schedule_messages`` returned is published at its time or, if
cancelled first, never. It is published at least once: if the router dies after the publish
and before the record that it was published is written (one write, milliseconds), the
restarted router publishes it again, and a publish whose outcome is unknown (a subscription
partition that did not answer) is tried again like a refused one (duplicate detection, if the
topic has it, drops the second). Without a storage path the schedule lives in the router's
memory, as every message of such a namespace does in its actor's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .._core.record import MessageRecord, from_wire, to_wire
from .._core.topic_schedule import TopicSchedule
from ..exceptions import MessageNotFoundError, ServiceBusError
from .changelog import message_log

__all__ = ["TopicScheduler"]

_log = logging.getLogger("raybus.router")
# Messages published per round (each its own publish call, combined by the router).
BATCH = 256
# A refused publish is tried again this much later.
RETRY_S = 1.0

# Publishes one message (the router's checks and combined delivery); raises its refusal.
Publish = Callable[[list[MessageRecord]], Awaitable[None]]


class TopicScheduler:
    """Scheduled messages of one topic (see the module docstring); ``entity`` names the
    topic in errors, ``name`` is the log's folder below the namespace's."""

    def __init__(
        self,
        namespace: str,
        storage_path: str | None,
        name: str,
        entity: str,
        publish: Publish,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._entity = entity
        self._publish = publish
        self._now = clock
        self._changes = message_log(storage_path, namespace, name, lambda: self.state.snapshot())
        replayed = self._changes.replay() if self._changes is not None else ()
        self.state = TopicSchedule.replayed(replayed)
        self._timer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def count(self) -> int:
        return len(self.state.entries)

    @property
    def size_in_bytes(self) -> int:
        return self.state.size_in_bytes()

    async def _append(self, change: Any) -> None:
        if self._changes is not None:
            await self._changes.append(change)

    async def schedule(self, records: list[MessageRecord]) -> list[int]:
        """Log ``records`` as scheduled at their ``scheduled_enqueue_time``; their sequence
        numbers. Raises the storage error, with nothing scheduled, if they cannot be logged."""
        dues = [rec.scheduled_enqueue_time or 0.0 for rec in records]
        seqs, change = self.state.add(to_wire(records), dues)
        try:
            await self._append(change)
        except asyncio.CancelledError:  # the write goes on (``ChangeLog.append`` shields it)
            raise
        except BaseException:
            self.state.remove(seqs)
            raise
        self.start()
        return seqs

    async def cancel(self, seqs: list[int]) -> None:
        """Cancel ``seqs``, all or none: ``MessageNotFoundError`` names those not scheduled
        (any more), with nothing cancelled."""
        missing = self.state.missing(seqs)
        if missing:
            raise MessageNotFoundError(
                f"no scheduled message has sequence number(s) {missing}", self._entity, missing
            )
        taken, change = self.state.remove(seqs)
        try:
            await self._append(change)
        except asyncio.CancelledError:
            raise
        except BaseException:
            self.state.restore(taken)
            raise
        self._wake.set()

    # ------------------------------------------------------------------ the timer

    def start(self) -> None:
        """Run the timer (after a restart: unasked, if anything is scheduled), and wake it:
        the next due time may have changed."""
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()

    async def _run(self) -> None:
        while self.state.entries:
            self._wake.clear()
            due = self.state.next_due()
            delay = 0.0 if due is None else due - self._now()
            if due is None or delay > 0:
                # Woken early by a new schedule or a cancel; otherwise sleep to the due time.
                wait = None if due is None else delay
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                continue
            seqs = self.state.due(self._now(), BATCH)
            try:
                await self._fire(seqs)
            except Exception as exc:  # a bug: keep them scheduled, do not spin
                _log.error("scheduled messages of %s not published: %r", self._entity, exc)
                self.state.retry(seqs, self._now() + RETRY_S)

    async def _fire(self, seqs: list[int]) -> None:
        """Publish ``seqs``, each on its own outcome; drop those published (logged), retry the
        refused ones later."""
        records = from_wire(self.state.rows(seqs))
        results = await asyncio.gather(
            *(self._publish([rec]) for rec in records), return_exceptions=True
        )
        done: list[int] = []
        failed: dict[int, BaseException] = {}
        for seq, result in zip(seqs, results, strict=True):
            if isinstance(result, BaseException):
                failed[seq] = result
            else:
                done.append(seq)
        if failed:
            # A refusal is the broker's answer (tried again); anything else is a bug.
            bugs = [e for e in failed.values() if not isinstance(e, ServiceBusError)]
            log = _log.error if bugs else _log.info
            error = bugs[0] if bugs else next(iter(failed.values()))
            log("%d scheduled message(s) of %s not published: %r", len(failed), self._entity, error)
            self.state.retry(failed, self._now() + RETRY_S)
        if done:
            _taken, change = self.state.remove(done)
            try:
                await self._append(change)
            except Exception as exc:  # published: a restart would publish them again
                _log.warning("published scheduled messages not logged as such: %r", exc)
