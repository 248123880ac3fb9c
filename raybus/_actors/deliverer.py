"""The router's logged deliveries: one durable write and one call per subscription partition.

The actor half of ``raybus._core.publish_log`` (read it for the protocol and its guarantees):
it writes the log (``ChangeLog``), calls the partitions, retries those that did not answer,
and finishes, after a restart, what the log holds undelivered. A namespace without a storage
path has no log and keeps the two-phase commit (see ``enabled``).

Measured (``benchmarks/profile_topics.py``): see ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import ray

from .. import _failpoints, _rpc
from .._core.publish_log import PublishLog, Share
from .._core.record import from_wire, to_wire
from .._core.wire import INLINE_BYTES, pack_rows, unpack_rows
from ..exceptions import (
    MessagingEntityNotFoundError,
    PartitionMovedError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusServerBusyError,
)
from .access import internal, named_actor
from .changelog import message_log
from .handles import HandleCache

__all__ = ["Deliverer"]

_log = logging.getLogger("raybus.router")
# A partition that does not answer (restarting: ~1 s) is called again this often within one
# publish; the publish then fails with its outcome unknown and the rest is delivered later.
ATTEMPTS = 8
RETRY_S = 0.5
# Past those, the background task tries again this often.
RESUME_S = 1.0
# Partitions whose handles the router keeps.
HANDLES = 1024

# (partition actor name, subscription path, copies) of one publish, the copies as records.
Target = tuple[str, str, list[Any]]
# Places a subscription's copies again after a partition refused them (it gave a slot away):
# (subscription path, copies as records) -> [(partition name, copies)].
Replace = Callable[[str, list[Any]], Awaitable[list[tuple[str, list[Any]]]]]


class Deliverer:
    """Logged deliveries of one router (see the module docstring): ``name`` is its log's
    folder below the namespace's, ``prefix`` starts its source key."""

    def __init__(
        self, namespace: str, storage_path: str | None, name: str, prefix: str, entity: str
    ) -> None:
        self._namespace = namespace
        self._entity = entity  # the topic, named in errors
        self._changes = message_log(storage_path, namespace, name, lambda: self.log.snapshot())
        replayed = self._changes.replay() if self._changes is not None else ()
        self.log, first = PublishLog.replayed(replayed, prefix)
        self._first = first  # the fresh source key, logged before the first publish
        self._handles: HandleCache[Any] = HandleCache(self._look_up, HANDLES)
        self._lock = asyncio.Lock()  # one pusher at a time: numbers reach a partition in order
        self._resume: asyncio.Task[None] | None = None
        self.delivered = 0

    @property
    def enabled(self) -> bool:
        """Only with a storage path: a log in memory dies with the router, and a router killed
        between two partitions' deliveries would leave the publish half delivered (the
        two-phase commit's coordinator, an actor of its own, finishes it instead)."""
        return self._changes is not None

    async def _look_up(self, name: str) -> Any:
        return internal(await named_actor(name), self._namespace)

    async def _append(self, change: Any) -> None:
        if self._changes is not None:
            # The fresh source key goes in the same write as the first publish (queued
            # together, the log writes them as one record).
            first = [self._first] if self._first is not None else []
            await asyncio.gather(*(self._changes.append(c) for c in (*first, change)))
            self._first = None

    def _append_soon(self, change: Any) -> None:
        if self._changes is not None and change is not None:
            self._changes.append_soon(change)

    # ------------------------------------------------------------------ room

    async def fits(self, targets: list[Target]) -> bool:
        """Whether every partition has room for its copies (asking those not known)."""
        unknown = [name for name, _p, recs in targets if self.log.fits(name, _size(recs)) is None]
        if unknown:
            try:
                handles = await asyncio.gather(*map(self._handles.get, unknown))
                rooms = await asyncio.gather(*(h.room.remote() for h in handles))
            except Exception as exc:  # not reachable now: the two-phase commit reports it
                _log.info("room of a subscription partition unknown: %r", exc)
                return False
            self.log.rooms.update(zip(unknown, rooms, strict=True))
        return all(self.log.fits(name, _size(recs)) for name, _p, recs in targets)

    # ------------------------------------------------------------------ delivering

    async def deliver(self, targets: list[Target], replace: Replace) -> None:
        """Log and deliver one publish; return once every partition applied it.

        Raises, with nothing stored: the storage error if it could not be logged, or
        ``ServiceBusServerBusyError`` while an earlier publish has not reached a partition
        (see ``_clear_backlog``). Raises ``ServiceBusConnectionError`` if it was logged but a
        partition did not answer: it is delivered later (the outcome is all, the caller cannot
        know when).

        The work runs shielded from the caller's cancellation: cancelled while its log write
        was under way, the publish would be forgotten here yet written to the log, and
        delivered only after the router's next restart.
        """
        work = asyncio.ensure_future(self._deliver(targets, replace))
        work.add_done_callback(_retrieved)
        await asyncio.shield(work)

    async def _deliver(self, targets: list[Target], replace: Replace) -> None:
        async with self._lock:
            if self.log.pending:
                await self._clear_backlog(replace)
            # Equal copies (subscriptions whose rules select the same messages unchanged) are
            # pickled once, for the log and for every call.
            packed: dict[tuple[int, ...], list[bytes]] = {}
            shares: dict[str, Share] = {}
            for name, path, recs in targets:
                key = tuple(map(id, recs))
                if key not in packed:
                    packed[key] = pack_rows(to_wire(recs))
                shares[name] = (path, packed[key])
            number, change = self.log.begin(shares, {n: _size(r) for n, _p, r in targets})
            try:
                await self._append(change)
            except BaseException:
                self.log.abandon(number)
                raise
            _failpoints.hit("router.after_log")
            try:
                delivered = await self._push_all(replace, ATTEMPTS)
            except Exception as exc:  # logged: it is delivered later, whatever failed now
                self.start_resume(replace)
                raise ServiceBusConnectionError(
                    f"the publish is logged but not delivered yet ({exc!r}): it reaches every "
                    "subscription later",
                    self._entity,
                ) from exc
            if not delivered:
                self.start_resume(replace)
                raise ServiceBusConnectionError(
                    "a subscription partition did not take its copies yet; they are delivered "
                    "when it answers (the publish is logged: it reaches every subscription)",
                    self._entity,
                )
            self.delivered += 1

    async def _clear_backlog(self, replace: Replace) -> None:
        """Deliver the undelivered publishes before a new one (a partition must see one
        router's numbers in order), or refuse the new one with nothing stored.

        A partition that does not take its copies for good (its log damaged, say) thus
        refuses the topic's publishes, as the two-phase commit's failed prepare would, instead
        of holding each publisher through the retries: once a backlog has outlived one
        publish's retries (the background task delivers it), later publishes try once."""
        attempts = 1 if self._resume is not None and not self._resume.done() else ATTEMPTS
        if await self._push_all(replace, attempts):
            return
        self.start_resume(replace)
        owed = sorted({path for shares in self.log.pending.values() for path, _ in shares.values()})
        raise ServiceBusServerBusyError(
            f"an earlier publish has not reached {', '.join(map(repr, owed))} yet: this one was "
            "not stored; retry after a back-off",
            self._entity,
        )

    async def _push_all(self, replace: Replace, attempts: int) -> bool:
        """Deliver every undelivered publish, in order, retrying partitions that do not
        answer; whether none is left."""
        for attempt in range(attempts):
            if await self._push_round(replace):
                continue  # copies placed again as a new publish: deliver it without waiting
            if not self.log.pending:
                return True
            if attempt < attempts - 1:
                await asyncio.sleep(RETRY_S)
        return not self.log.pending

    async def _push_round(self, replace: Replace) -> bool:
        """Deliver every undelivered publish once, in order; True if copies were placed again
        as a new publish meanwhile (it is due at once)."""
        before = set(self.log.pending)
        for number in sorted(before):
            await self._push(number, replace)
        return bool(set(self.log.pending) - before)

    async def _push(self, number: int, replace: Replace) -> None:
        shares = dict(self.log.pending.get(number, {}))
        source = self.log.source
        args: dict[int, tuple[Any, ...]] = {}  # per packed copies: put in the store once
        for _path, pieces in shares.values():
            if id(pieces) not in args:
                args[id(pieces)] = _call_args(pieces)

        async def one(name: str, path: str, pieces: list[bytes]) -> tuple[str, Any]:
            try:
                handle = await self._handles.get(name)
                room = await _rpc.call(path, handle.deliver, source, number, *args[id(pieces)])
                return name, room
            except ValueError:  # no actor of that name: the subscription was deleted
                return name, None
            except BaseException as exc:
                if _rpc.actor_gone(exc):
                    self._handles.forget(name)
                return name, exc

        answers = await asyncio.gather(*(one(n, p, r) for n, (p, r) in shares.items()))
        for name, answer in answers:
            if isinstance(answer, PartitionMovedError):
                await self._redo(number, name, shares[name], replace)
            elif answer is None or isinstance(answer, MessagingEntityNotFoundError):
                self._append_soon(self.log.acked(number, name, None))  # deleted: nothing due
            elif isinstance(answer, BaseException):
                _log.info("delivery %d to %s not confirmed yet: %r", number, name, answer)
            else:
                self._append_soon(self.log.acked(number, name, answer))
                _failpoints.hit("router.after_ack")

    async def _redo(self, number: int, name: str, share: Share, replace: Replace) -> None:
        """``name`` refused ``number`` because it gave slots away: place its copies again."""
        path, pieces = share
        try:
            placed = await replace(path, from_wire(unpack_rows(pieces)))
        except MessagingEntityNotFoundError:  # the subscription was deleted: nothing due
            self._append_soon(self.log.acked(number, name, None))
            return
        except ServiceBusError as exc:  # the route could not be refreshed: try again later
            _log.info("copies of delivery %d to %s not placed again yet: %r", number, name, exc)
            return
        shares = {n: (path, pack_rows(to_wire(r))) for n, r in placed}
        new, change = self.log.redo(number, name, shares)
        try:
            await self._append(change)
        except BaseException:
            self.log.undo_redo(number, name, share, new)
            raise

    # ------------------------------------------------------------------ after a restart

    def start_resume(self, replace: Replace) -> None:
        """Deliver what is undelivered in the background (after a restart, or a partition
        that did not answer in time), until nothing is."""
        if self.log.pending and (self._resume is None or self._resume.done()):
            self._resume = asyncio.get_running_loop().create_task(self._finish(replace))

    async def _finish(self, replace: Replace) -> None:
        while self.log.pending:
            try:
                async with self._lock:
                    await self._push_round(replace)
            except Exception as exc:  # a failed log write: try again
                _log.warning("undelivered publishes not finished yet: %r", exc)
            if self.log.pending:
                await asyncio.sleep(RESUME_S)


def _call_args(pieces: list[bytes]) -> tuple[Any, ...]:
    """A ``deliver`` call's arguments for packed copies (``pack_rows``): the inline pieces, or,
    one piece too big to stay inline, put in the object store once for every partition that
    gets the same copies (Ray resolves it in each; otherwise each call would put its own)."""
    if len(pieces) == 1 and len(pieces[0]) > INLINE_BYTES:
        return (ray.put(pieces[0]),)
    return tuple(pieces)


def _retrieved(work: asyncio.Future[None]) -> None:
    """A publish whose caller was cancelled ends unobserved: its error is only logged."""
    if not work.cancelled() and work.exception() is not None:
        _log.debug("a publish whose caller left ended with %r", work.exception())


def _size(records: list[Any]) -> int:
    return sum(rec.size for rec in records)
