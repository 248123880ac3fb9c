"""Receiving from the broker's partitions: fair, without polling, few calls, and none while a
queue stays idle.

Functions of a ``ServiceBusReceiver`` (kept apart for size): the receive from a queue of
several partitions, the receive from a queue of one partition for a receiver without a
standing request, and the waits both leave at the partitions between receives that found
nothing (``StandingWaits``). Each asks the partitions the receiver's route lists, retiring
ones included (their messages are still delivered).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from itertools import islice
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import TaskCancelledError

from .. import _rpc
from .._actors.namespace import Route
from .._core.record import WireRecord
from ..exceptions import MessagingEntityNotFoundError, ServiceBusConnectionError
from ..message import ServiceBusReceivedMessage

if TYPE_CHECKING:
    from ._receiver import ServiceBusReceiver
    from ._sequence_reads import SequenceReads

__all__ = [
    "StandingWaits",
    "peek_partitioned",
    "receive_partitioned",
    "receive_single",
    "wait_any",
]

# A wait with no deadline is made in slices of this length.
_WAIT_SLICE_S = 30.0
# How long to pause when every partition is restarting. Their waits fail at once, so waiting
# again at once would only repeat the failure, a Ray call per partition per turn of the loop,
# for the ~1 s a restart takes (for ever if the receive has no deadline).
_RESTART_BACKOFF_S = 0.25


def _past(deadline: float | None) -> bool:
    """Whether ``deadline`` (``time.monotonic``; None: never) has passed."""
    return deadline is not None and time.monotonic() >= deadline


def _ignore_outcome(fut: asyncio.Future[Any]) -> None:
    """Retrieve a wait's outcome, so asyncio does not report one nobody awaited as lost."""
    if not fut.cancelled():
        fut.exception()


class StandingWaits:
    """The ``wait_available`` calls a receiver leaves out at its partitions between receives
    that found nothing (``receive_partitioned``, ``receive_single``).

    A wait locks nothing, so one left out takes nothing for nobody, and the partition holds
    it ``_WAIT_SLICE_S`` at the most. While one is unanswered, its partition has had nothing
    available since the wait reached it (it answers as soon as a message or a lock expiry
    makes one available), so a receive need not ask that partition again. The waits are
    made, awaited and cancelled on the receiver's event loop; the sync API's direct path
    (a queue of one partition) only asks ``out_at`` and the counts of empty receives from
    the caller's thread, and leaves its wait through the loop."""

    def __init__(self) -> None:
        # pid -> (handle, ref, future of the answer); an answered one is replaced by the
        # next wait there (``ensure``).
        self._waits: dict[int, tuple[Any, Any, asyncio.Future[bool]]] = {}
        self._empty = 0  # receives in a row that found nothing (``receive_single``)

    def found_nothing(self) -> bool:
        """Count a receive of one partition that found nothing by its deadline; True from
        the second in a row on: a receiver polling an idle queue, which a wait saves calls.
        A receiver that receives once and closes (the HTTP gateway's, a script's) leaves no
        wait: it would cost it a wait and a cancel more than its one long poll."""
        self._empty += 1
        return self._empty >= 2

    def found_some(self) -> None:
        self._empty = 0

    def _keep_only(self, parts: list[tuple[int, Any]]) -> None:
        """Cancel the waits at partitions ``parts`` (the route's) no longer lists, or lists
        with another actor (a route refreshed after a partition change). Actors are told
        apart by id: a refreshed route (every ``ROUTE_TTL_S``) holds new handle objects."""
        live = {pid: handle._actor_id for pid, handle in parts}
        for pid, (handle, _ref, _fut) in list(self._waits.items()):
            if live.get(pid) != handle._actor_id:
                self._cancel(pid)

    def quiet(self, parts: list[tuple[int, Any]]) -> set[int]:
        """The partitions of ``parts`` whose wait is out and unanswered: nothing available
        there."""
        self._keep_only(parts)
        return {pid for pid, (_h, _r, fut) in self._waits.items() if not fut.done()}

    def out_at(self, pid: int) -> bool:
        """Whether partition ``pid``'s wait is out and unanswered (safe from any thread: the
        sync API asks before it receives on the caller's own thread)."""
        held = self._waits.get(pid)
        return held is not None and not held[2].done()

    def ensure(
        self, parts: list[tuple[int, Any]], dead_letter: bool
    ) -> dict[asyncio.Future[bool], tuple[int, Any]]:
        """A wait at every partition of ``parts``: the one out and unanswered, else a new
        one. An answered wait is old news by now: the caller asked its partition directly
        since (``receive_partitioned``, a session's accept), and a new wait answers at once
        if something is still available there."""
        self._keep_only(parts)
        futs: dict[asyncio.Future[bool], tuple[int, Any]] = {}
        for pid, handle in parts:
            held = self._waits.get(pid)
            if held is None or held[2].done():
                ref = handle.wait_available.remote(_WAIT_SLICE_S, dead_letter)
                fut = asyncio.wrap_future(ref.future())
                fut.add_done_callback(_ignore_outcome)
                held = self._waits[pid] = (handle, ref, fut)
            futs[held[2]] = (pid, handle)
        return futs

    def cancel(self) -> None:
        """Cancel every wait still out (``close()``)."""
        for pid in list(self._waits):
            self._cancel(pid)

    def _cancel(self, pid: int) -> None:
        _handle, ref, fut = self._waits.pop(pid)
        if not fut.done():
            ray.cancel(ref)


async def wait_any(
    receiver: ServiceBusReceiver, parts: list[tuple[int, Any]], wait_s: float, dead_letter: bool
) -> list[tuple[int, Any]]:
    """Wait (without polling) until some partition has a message or an acceptable
    session; returns those that said so (none after ``wait_s``). The waits still unanswered
    then stay out (``StandingWaits``): the next receive waits on them again, asking those
    partitions nothing.

    A partition that is restarting or gone is passed over while another can still answer.
    When every one of them fails, there is nothing left to wait on, so this does not
    return at once (the caller would call again at once, a busy loop): it raises
    ``MessagingEntityNotFoundError`` if any partition is gone (the entity was deleted, or a
    partition change removed that partition: the caller's ``Connection.retrying`` rechecks
    the route and tells the two apart), and otherwise, all restarting, returns none after
    a pause of ``_RESTART_BACKOFF_S`` (at most ``wait_s``)."""
    entity = receiver.entity_path
    futs = receiver._standing_waits.ensure(parts, dead_letter)
    end = time.monotonic() + wait_s
    ready: list[tuple[int, Any]] = []
    failed: list[BaseException] = []
    pending = set(futs)
    while pending and not ready:
        remaining = end - time.monotonic()
        if remaining <= 0:
            break
        done, pending = await asyncio.wait(
            pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
        )
        for fut in done:
            if fut.cancelled() or isinstance(fut.exception(), TaskCancelledError):
                continue  # given up (close(), or a partition change seen by another receive)
            try:
                if fut.result():
                    ready.append(futs[fut])
            except Exception as exc:  # restarting or removed: try the others
                error = _rpc.translate(exc, entity)
                if not isinstance(error, ServiceBusConnectionError | MessagingEntityNotFoundError):
                    raise error from None
                failed.append(error)
    if not ready and failed and len(failed) == len(futs):
        for error in failed:
            if isinstance(error, MessagingEntityNotFoundError):
                raise error from None
        await asyncio.sleep(min(_RESTART_BACKOFF_S, wait_s))
    return ready


async def _ask(
    receiver: ServiceBusReceiver, parts: list[tuple[int, Any]], fetch: int
) -> list[WireRecord]:
    """Receive without waiting from ``parts``, in turn order: the first is asked for all of
    ``fetch``; if it has none, the others at once for equal shares (so no more than
    ``fetch`` messages are locked). Raises when every share's call failed."""
    # One call when the partition whose turn it is has messages (the usual case under
    # load): a receive costs one round trip whatever the partition count.
    try:
        first = await receiver._receive_from(parts[0][0], fetch, 0.0)
    except ServiceBusConnectionError:
        first = []
    if first:
        return first
    rest = parts[1:]
    m = max(1, len(rest))
    shares = [fetch // m + (1 if i < fetch % m else 0) for i in range(len(rest))]
    asked = [(p, share) for p, share in zip(rest, shares, strict=True) if share]
    results = await asyncio.gather(
        *(receiver._receive_from(pid, share, 0.0) for (pid, _h), share in asked),
        return_exceptions=True,
    )
    rows = [r for got in results if not isinstance(got, BaseException) for r in got]
    errors = [e for e in results if isinstance(e, BaseException)]
    if not rows and errors and len(errors) == len(results):
        raise errors[0]
    return rows


async def _wait_ready(
    receiver: ServiceBusReceiver, parts: list[tuple[int, Any]], deadline: float | None
) -> list[tuple[int, Any]]:
    """Wait on ``parts`` (``wait_any``, in slices of ``_WAIT_SLICE_S`` when there is no
    deadline) until some partition says it has a message: those that said so; none once
    ``deadline`` passed or close() started (a closing receiver locks nothing more)."""
    while True:
        remaining = _WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
        if remaining <= 0 or receiver._closing:
            return []
        ready = await wait_any(
            receiver, parts, min(remaining, _WAIT_SLICE_S), receiver._dead_letter
        )
        if ready:
            return ready


async def receive_partitioned(
    receiver: ServiceBusReceiver, route: Route, fetch: int, deadline: float | None
) -> list[WireRecord]:
    """Receive from a queue of several partitions, fairly and without polling.

    The partitions are asked in turn order (the turn rotates with every receive, so none
    starves; ``_ask``), all but those whose wait from an earlier receive is still out and
    unanswered: nothing is available there (``StandingWaits``). When that finds nothing, the
    receiver waits on all partitions at once (``wait_available``, which locks nothing) and
    receives from the first that has a message. The waits that have not answered when the
    receive returns stay out for the next one, so a receiver that loops over short receives
    of an idle queue makes no call at all until something arrives (before, each such
    receive cost two calls per partition and a cancel; ``benchmarks/idle_receivers.py``: 4
    partitions, 0.2 s receives, 2.26 times the CPU of the same loop sleeping, now 1.10).

    Raises ``MessagingEntityNotFoundError`` when the wait fails on every partition and some
    partition is gone (the queue was deleted), as a receive from a queue of one partition
    does; while every partition is restarting it waits on until ``deadline``, pausing
    between attempts (see ``wait_any``).
    """
    parts = route.existing()
    n = len(parts)
    start = receiver._next_turn() % n
    parts = parts[start:] + parts[:start]
    quiet = receiver._standing_waits.quiet(parts)
    unknown = [p for p in parts if p[0] not in quiet]
    if unknown:
        rows = await _ask(receiver, unknown, fetch)
        if rows:
            return rows
    while ready := await _wait_ready(receiver, parts, deadline):
        for pid, _handle in ready:
            rows = await receiver._receive_from(pid, fetch, 0.0)
            if rows:
                return rows
    return []


async def receive_single(
    receiver: ServiceBusReceiver, route: Route, fetch: int, deadline: float | None
) -> list[WireRecord]:
    """Receive from a queue of one partition, the receiver keeping no standing request
    (no prefetch, or receive-and-delete): one long poll, which the partition answers when a
    message arrives or at ``deadline``, taking what it returns.

    A long poll cannot stay out after its receive returns: it would take the next message
    for nobody. So the second receive in a row that found nothing by its deadline leaves a
    wait at the partition instead (``StandingWaits``: it locks nothing; not the first, see
    ``found_nothing``), and the next receive waits on that wait while it is unanswered,
    calling nothing; once it answers, the receive makes its long poll. A loop of short
    receives on an idle queue thus makes no call (before, one per receive); the first
    message after such a pause costs two calls, the wait's answer and the receive. A
    receive with no deadline never ends empty, so it leaves no wait.
    """
    parts = route.existing()
    waits = receiver._standing_waits
    if waits.quiet(parts) and not await _wait_ready(receiver, parts, deadline):
        return []
    while True:
        rows: list[WireRecord] = await receiver._receive_call(
            receiver._receive_args(fetch, deadline), 0
        )
        if rows:
            waits.found_some()
            return rows
        if receiver._closing:
            return rows
        if _past(deadline):
            if waits.found_nothing():
                waits.ensure(parts, receiver._dead_letter)  # for the next receive
            return rows


# A peek across partitions that a partition change overlapped is made again: a moved bundle is
# in neither partition while it travels (before, a peek during a scale-down from 4 partitions
# to 1 missed 50-150 of 200 messages in 34 of 519 reads). Each partition's answer says how long
# ago it last moved messages out (``migration.quiet_for``, 0 while some travel). A move the
# round missed was confirmed within the round's own round trip, so a round stands once every
# partition was quiet for longer than that (and PEEK_SLACK_S, for the partitions' wall clocks
# against this one). Rounds go on PEEK_PAUSE_S apart for PEEK_BUDGET_S at most (or the peek's
# own timeout, if shorter); then the last one stands (a change moving messages without a pause
# for that long).
PEEK_BUDGET_S = 2.0
PEEK_PAUSE_S = 0.01
PEEK_SLACK_S = 0.005


async def peek_partitioned(
    receiver: SequenceReads, count: int, sequence_number: int, timeout: Any
) -> list[ServiceBusReceivedMessage]:
    """Peek a partitioned queue: from ``sequence_number`` within the partition it names,
    else from where this receiver left off in every partition, oldest first.

    A partition that moved messages out since the route peeked was last known current (its
    quiet time shorter than that route's age) may have moved them to a partition the route
    lacks (a scale-up's): the route is fetched again, once, and the peek made again. The age
    is read when the route is taken, since a check in the background may store a newer
    route while the peek goes on with this one's partitions.

    The partitions' answers are merged oldest first, each partition's taken in the order of
    its numbers (``heapq.merge`` of the answers as they come), and cut at ``count``: so what
    a partition gives is a prefix of its answer, and the receiver's cursor for it (after the
    last number it showed) passes only messages it showed, and a partition's messages come
    in the order a single partition's peek gives them. Two kinds of message have enqueued
    times out of their partition's number order: a moved one keeps its time and takes a
    new, higher number, and a scheduled one's time is its schedule's. Sorted by time alone
    and cut, a peek could return messages numbered after such a one and leave it out, and
    every later peek then skipped it."""
    name = receiver.entity_path
    route = await receiver._conn.route(name)
    if sequence_number:
        pid = sequence_number >> 48
        if route.handle(pid) is None:
            return []
        return await receiver._peek_call(sequence_number, count, pid, timeout)
    parts = route.existing()
    # When ``route`` was last known current: a check in the background may store a newer one
    # while this peek goes on with these partitions.
    known = receiver._conn.known_current(name)
    from ._receiver import _check_wait  # _receiver imports this module

    limit = _check_wait(timeout, "timeout", name)  # the operation's bound covers the rounds
    give_up = time.monotonic() + (PEEK_BUDGET_S if limit is None else min(limit, PEEK_BUDGET_S))
    refreshed = False
    while True:
        # Each partition may answer all of count: each call sizes its pieces for that.
        cursors = receiver._peek_cursors
        began = time.monotonic()
        results = await asyncio.gather(
            *(
                receiver._peek_quiet(cursors.get(pid, pid << 48), count, pid, timeout)
                for pid, _h in parts
            )
        )
        ended = time.monotonic()
        quiet = min(q for _peeked, q in results)
        if not refreshed and quiet < ended - known + PEEK_SLACK_S:
            refreshed, known = True, time.monotonic()
            parts = (await receiver._conn.route(name, refresh=True)).existing()
            continue
        if quiet > ended - began + PEEK_SLACK_S or ended >= give_up:
            break
        await asyncio.sleep(PEEK_PAUSE_S)
    return list(islice(heapq.merge(*(peeked for peeked, _quiet in results), key=_age), count))


def _age(message: ServiceBusReceivedMessage) -> tuple[float, int]:
    return message._record.enqueued_time, message.sequence_number
