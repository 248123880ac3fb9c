"""Receiving from a queue of several partitions: fair, without polling, few calls.

Functions of a ``ServiceBusReceiver`` (kept apart for size). Each asks the partitions the
receiver's route lists, retiring ones included (their messages are still delivered).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import ray

from .. import _rpc
from .._actors.namespace import Route
from .._core.record import WireRecord
from ..exceptions import MessagingEntityNotFoundError, ServiceBusConnectionError
from ..message import ServiceBusReceivedMessage

if TYPE_CHECKING:
    from ._receiver import ServiceBusReceiver
    from ._sequence_reads import SequenceReads

__all__ = ["peek_partitioned", "receive_partitioned", "wait_any"]

# A wait with no deadline is made in slices of this length.
_WAIT_SLICE_S = 30.0
# How long to pause when every partition is restarting. Their waits fail at once, so waiting
# again at once would only repeat the failure, a Ray call per partition per turn of the loop,
# for the ~1 s a restart takes (for ever if the receive has no deadline).
_RESTART_BACKOFF_S = 0.25


def _ignore_outcome(fut: asyncio.Future[Any]) -> None:
    """Retrieve a cancelled wait's outcome, so asyncio does not report it as lost."""
    if not fut.cancelled():
        fut.exception()


async def wait_any(
    receiver: ServiceBusReceiver, parts: list[tuple[int, Any]], wait_s: float, dead_letter: bool
) -> list[tuple[int, Any]]:
    """Wait (without polling) until some partition has a message or an acceptable
    session; returns those that said so (none after ``wait_s``). The other waits are
    cancelled; one that cannot be cancelled ends by itself within ``wait_s``.

    A partition that is restarting or gone is passed over while another can still answer.
    When every one of them fails, there is nothing left to wait on, so this does not
    return at once (the caller would call again at once, a busy loop): it raises
    ``MessagingEntityNotFoundError`` if any partition is gone (the entity was deleted, or a
    partition change removed that partition: the caller's ``Connection.retrying`` rechecks
    the route and tells the two apart), and otherwise, all restarting, returns none after
    a pause of ``_RESTART_BACKOFF_S`` (at most ``wait_s``)."""
    entity = receiver.entity_path
    refs = [h.wait_available.remote(wait_s, dead_letter) for _pid, h in parts]
    futs = {asyncio.wrap_future(ref.future()): i for i, ref in enumerate(refs)}
    ready: list[tuple[int, Any]] = []
    failed: list[BaseException] = []
    pending = set(futs)
    try:
        while pending and not ready:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                try:
                    if fut.result():
                        ready.append(parts[futs[fut]])
                except Exception as exc:  # restarting or removed: try the others
                    error = _rpc.translate(exc, entity)
                    if not isinstance(
                        error, ServiceBusConnectionError | MessagingEntityNotFoundError
                    ):
                        raise error from None
                    failed.append(error)
            if not ready and pending and all(f.done() for f in pending):
                break
    finally:
        for fut in pending:
            fut.add_done_callback(_ignore_outcome)
            ray.cancel(refs[futs[fut]])
    if not ready and failed and len(failed) == len(refs):
        for error in failed:
            if isinstance(error, MessagingEntityNotFoundError):
                raise error from None
        await asyncio.sleep(min(_RESTART_BACKOFF_S, wait_s))
    return ready


async def receive_partitioned(
    receiver: ServiceBusReceiver, route: Route, fetch: int, deadline: float | None
) -> list[WireRecord]:
    """Receive from a queue of several partitions, fairly and without polling.

    The partition whose turn it is (the turn rotates with every receive, so none starves)
    is asked for all of ``fetch`` without waiting; if it has none, the others are asked at
    once for equal shares (so no more than ``fetch`` messages are locked). When that finds
    nothing, the receiver waits on all partitions at once (``wait_available``, which locks
    nothing) and receives from the first that has a message.

    Raises ``MessagingEntityNotFoundError`` when the wait fails on every partition and some
    partition is gone (the queue was deleted), as a receive from a queue of one partition
    does; while every partition is restarting it waits on until ``deadline``, pausing
    between attempts (see ``wait_any``).
    """
    parts = route.existing()
    n = len(parts)
    start = receiver._next_turn() % n
    parts = parts[start:] + parts[:start]
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
    if rows or (errors and len(errors) == len(results)):
        if not rows:
            raise errors[0]
        return rows
    while True:
        remaining = _WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
        if remaining <= 0 or receiver._closing:  # closing: lock nothing more (no waiting)
            return []
        ready = await wait_any(
            receiver, parts, min(remaining, _WAIT_SLICE_S), receiver._dead_letter
        )
        for pid, _handle in ready:
            rows = await receiver._receive_from(pid, fetch, 0.0)
            if rows:
                return rows


async def peek_partitioned(
    receiver: SequenceReads, count: int, sequence_number: int, timeout: Any
) -> list[ServiceBusReceivedMessage]:
    """Peek a partitioned queue: from ``sequence_number`` within the partition it names,
    else from where this receiver left off in every partition, oldest first."""
    route = await receiver._conn.route(receiver.entity_path)
    if sequence_number:
        pid = sequence_number >> 48
        if route.handle(pid) is None:
            return []
        return await receiver._peek_call(sequence_number, count, pid, timeout)
    parts = route.existing()
    # Each partition may answer all of count: each call sizes its pieces for that.
    results = await asyncio.gather(
        *(
            receiver._peek_call(receiver._peek_cursors.get(pid, pid << 48), count, pid, timeout)
            for pid, _h in parts
        )
    )
    merged = [m for peeked in results for m in peeked]
    merged.sort(key=lambda m: (m._record.enqueued_time, m.sequence_number))
    return merged[:count]
