"""Reads by sequence number: ``peek_messages`` (from a sequence number on, locking nothing)
and ``receive_deferred_messages`` (by the numbers ``defer_message`` left the caller).

Why a module of its own (split from ``_receiver``, which had grown to the house limit): both
address messages by sequence number rather than taking the next available ones, so they share
neither the prefetch buffer nor the receive's waiting; what they share with the receiver is
its plumbing (``_call_rows``, ``_pieces``, ``_wrap``) and the rule that they first report the
refused settlements sent before them. ``SequenceReads`` is a mixin of ``ServiceBusReceiver``
as ``Settlement`` is; it owns the peek cursors.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from .._core.record import WireRecord
from ..exceptions import InvalidArgumentError, MessageNotFoundError
from ..message import ServiceBusReceivedMessage
from ._fanout import peek_partitioned

if TYPE_CHECKING:
    from .._connection import Connection
    from ._session import ServiceBusSession

__all__ = [
    "PEEKED_RUNS_MAX",
    "PEEK_PAGES",
    "PeekedRanges",
    "SequenceReads",
    "check_sequence_numbers",
]

# The most calls one ``peek_messages`` makes when it leaves out messages peeked before a
# move: each call passes up to the peek's count of them, so 8 pass at least 7 counts' worth.
PEEK_PAGES = 8
PEEKED_RUNS_MAX = 100_000


class PeekedRanges:
    """The sequence numbers a receiver's peeks have shown, as merged runs ``[lo, hi)`` of
    consecutive numbers (a partition numbers its messages without gaps, so a page is one run
    less the messages settled meanwhile).

    A partition change moves a message to another partition under a new number, and
    raybus's moves keep its first number as its ``enqueued_sequence_number``
    (``raybus._core.migration.adopt``; a message sent, forwarded or activated from a
    schedule has the two equal). A receiver that was shown the message under that first
    number leaves it out under the new one (``shown_before_move``). The numbers shown, not
    the span a page covered: a scale-up moves some of a partition's messages and keeps the
    rest, so a page of the source after the move spans numbers it never showed. Numbers are
    unique across the partitions (the partition is in the top 16 bits), so one list serves
    them all. At most ``PEEKED_RUNS_MAX`` runs (about 8 MB) are kept; past that the receiver
    starts afresh, and a message it peeked before can show again after a move. Not covered
    either: a message moved twice and peeked at the partition between (under a number that
    is not its first) shows again.
    """

    __slots__ = ("_his", "_los")

    def __init__(self) -> None:
        self._los: list[int] = []
        self._his: list[int] = []

    def add(self, lo: int, hi: int) -> None:
        if lo >= hi:
            return
        los, his = self._los, self._his
        i = bisect_left(his, lo)  # the first run that ends at or after lo
        j = bisect_right(los, hi)  # the runs from i to j touch [lo, hi)
        if i < j:
            lo, hi = min(lo, los[i]), max(hi, his[j - 1])
        los[i:j], his[i:j] = [lo], [hi]
        if len(los) > PEEKED_RUNS_MAX:  # start afresh (class docstring)
            self._los, self._his = [lo], [hi]

    def __contains__(self, seq: int) -> bool:
        i = bisect_right(self._los, seq) - 1
        return i >= 0 and seq < self._his[i]

    def shown_before_move(self, msg: ServiceBusReceivedMessage) -> bool:
        first = msg.enqueued_sequence_number
        return first != msg.sequence_number and first in self


def check_sequence_numbers(sequence_numbers: int | Iterable[int], entity: str) -> list[int]:
    """One sequence number or several, as a list; ``InvalidArgumentError`` for anything but
    non-negative ints (for the deferred receive here and the sender's scheduled cancel)."""
    seqs = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seqs):
        raise InvalidArgumentError(
            f"sequence numbers must be non-negative ints: {seqs!r}", entity, "sequence_numbers"
        )
    return seqs


class SequenceReads:
    """The peek and deferred-receive part of ``ServiceBusReceiver`` (see the module docstring)."""

    if TYPE_CHECKING:
        entity_path: str
        session: ServiceBusSession | None
        _conn: Connection
        _delete: bool
        _dead_letter: bool
        _transfer: bool
        _closing: bool

        async def _settle_pending(self) -> None: ...

        def _check_receivable(self, route: Any) -> None: ...

        async def _call_rows(
            self,
            method_name: str,
            *args: Any,
            partition: int = 0,
            timeout: Any = None,
            pieces: int | None = None,
        ) -> list[WireRecord]: ...

        _call: Callable[..., Awaitable[Any]]  # ServiceBusReceiver._call

        def _rows(self, result: Any, pieces: int) -> list[WireRecord]: ...

        def _pieces(self, count: int) -> int: ...

        def _session_args(self) -> tuple[Any, ...]: ...

        def _wrap(
            self, rows: Iterable[WireRecord], kind: str
        ) -> list[ServiceBusReceivedMessage]: ...

        async def _release_rows(self, rows: list[WireRecord]) -> None: ...

    def _init_reads(self) -> None:
        # Per partition, where the next peek goes on from: after the last number shown.
        self._peek_cursors: dict[int, int] = {}
        self._peeked = PeekedRanges()

    async def peek_messages(
        self, max_message_count: int = 1, *, sequence_number: int = 0, timeout: Any = None
    ) -> list[ServiceBusReceivedMessage]:
        """Up to ``max_message_count`` messages without locking them, from ``sequence_number``
        on (default: after the last one this receiver peeked). Includes locked, deferred and
        scheduled messages; peeked messages cannot be settled.

        A message a partition change moved after this receiver peeked it is not shown again
        under its new number (``PeekedRanges``); the peek then asks for as many more as it
        left out, so it comes back short only where the queue has no more to show."""
        await self._settle_pending()
        from ._receiver import _check_count, _check_non_negative  # _receiver imports this

        count = _check_count(max_message_count, "max_message_count", self.entity_path)
        _check_non_negative(sequence_number, "sequence_number", self.entity_path)
        route = await self._conn.route(self.entity_path)
        self._check_receivable(route)
        if self._transfer:  # always empty (raybus.aio._receiver)
            return []
        if self.session is not None:
            session_id, _token, pid = await self.session.ensure()
            start = sequence_number or self._peek_cursors.get(pid, 0)
            peeked = await self._peek_call(start, count, pid, timeout, session_id)
            if peeked:  # a session's messages do not move while it is held
                self._peek_cursors[pid] = peeked[-1].sequence_number + 1
            return peeked
        shown: list[ServiceBusReceivedMessage] = []
        for _ in range(PEEK_PAGES):
            # Asks for ``count`` each time: a page's left-out messages need room too.
            if route.single:  # its one partition is 0; after a scale-down, the cursor is too
                start = sequence_number or self._peek_cursors.get(0, 0)
                page = await self._peek_call(start, count, 0, timeout)
            else:
                page = await self._conn.retrying(
                    self.entity_path,
                    partial(peek_partitioned, self, count, sequence_number, timeout),
                )
            passed = len(page)  # up to here: a prefix of each partition's part of the page
            for i, msg in enumerate(page):
                if not self._peeked.shown_before_move(msg):
                    shown.append(msg)
                    if len(shown) == count:
                        passed = i + 1
                        break
            self._went_past(page[:passed])
            if len(shown) == count or len(page) < count:
                break  # full, or the partitions had no more
            if sequence_number:  # go on in its partition, after what this page passed
                sequence_number = self._peek_cursors[sequence_number >> 48]
            route = await self._conn.route(self.entity_path)
        return shown

    def _went_past(self, page: list[ServiceBusReceivedMessage]) -> None:
        """Move the cursors of the partitions in ``page`` after its last message of each,
        and note the numbers shown."""
        for msg in page:
            seq = msg.sequence_number
            self._peeked.add(seq, seq + 1)
            self._peek_cursors[msg.partition_id] = seq + 1

    async def receive_deferred_messages(
        self, sequence_numbers: int | Iterable[int], *, timeout: Any = None
    ) -> list[ServiceBusReceivedMessage]:
        """Receive deferred messages by sequence number (all or none: ``MessageNotFoundError``
        names the missing ones): of the receiver's sub-queue, so a dead-letter receiver
        receives the dead letters deferred there, and never the main queue's."""
        await self._settle_pending()
        seqs = check_sequence_numbers(sequence_numbers, self.entity_path)
        if not seqs:
            return []
        if self._transfer:  # always empty (raybus.aio._receiver)
            self._check_receivable(await self._conn.route(self.entity_path))
            raise MessageNotFoundError(
                f"no deferred message has sequence number(s) {seqs}: the transfer dead-letter "
                "sub-queue holds none",
                self.entity_path,
                seqs,
            )
        kind = "deleted" if self._delete else "locked"
        if self.session is not None:
            _sid, _token, pid = await self.session.ensure()
            rows = await self._call_rows(
                "receive_deferred",
                seqs,
                self._delete,
                *self._session_args(),
                self._pieces(len(seqs)),
                partition=pid,
                timeout=timeout,
            )
            return await self._deferred_received(rows, kind)
        rows = await self._receive_deferred_located(seqs, timeout)
        return await self._deferred_received(rows, kind)

    async def _receive_deferred_located(self, seqs: list[int], timeout: Any) -> list[WireRecord]:
        """``receive_deferred`` at the partitions holding ``seqs``, all or none; a share that
        a partition change moved after the lookup is followed to where it went
        (``Connection.follow_moves``)."""
        by_partition = await self._conn.retrying(self.entity_path, lambda: self._locate(seqs))

        async def receive(pid: int, share: list[int]) -> list[WireRecord]:
            pieces = self._pieces(len(share))
            return await self._call_rows(
                "receive_deferred",
                share,
                self._delete,
                None,
                pieces,
                self._dead_letter,
                partition=pid,
                timeout=timeout,
                pieces=pieces,
            )

        outcomes = await asyncio.gather(
            *(
                self._conn.follow_moves(self.entity_path, pid, ss, receive)
                for pid, ss in by_partition.items()
            )
        )
        results = [outcome for each in outcomes for outcome in each]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:  # all or none: give back what the other partitions locked
            got = [row for r in results if not isinstance(r, BaseException) for row in r]
            if got and not self._delete:
                await self._release_rows(got)
            not_found = [e for e in errors if isinstance(e, MessageNotFoundError)]
            if len(not_found) == len(errors):
                missing = [seq for e in not_found for seq in e.sequence_numbers]
                raise MessageNotFoundError(
                    f"no deferred message is available with sequence number(s) {missing}",
                    self.entity_path,
                    missing,
                )
            raise errors[0]
        return [row for r in results if not isinstance(r, BaseException) for row in r]

    async def _deferred_received(
        self, rows: list[WireRecord], kind: str
    ) -> list[ServiceBusReceivedMessage]:
        """The deferred messages received, unless close() started meanwhile: a closed receiver
        could not settle them, so (peek-lock) they go back, deferred again, none counted, and
        the call raises (it asked for these messages: ``[]`` would read as "none there")."""
        if self._closing and rows and not self._delete:
            await self._release_rows(rows)
            raise InvalidArgumentError(
                "the receiver was closed while receiving its deferred messages: they were given "
                "back",
                self.entity_path,
                "receiver",
            )
        return self._wrap(rows, kind)

    async def _locate(self, seqs: list[int]) -> dict[int, list[int]]:
        route = await self._conn.route(self.entity_path)
        by_partition, _missing = await self._conn.locate(route, seqs, dead_letter=self._dead_letter)
        return by_partition

    async def _peek_call(
        self, start: int, count: int, pid: int, timeout: Any, session_id: str | None = None
    ) -> list[ServiceBusReceivedMessage]:
        """Partition ``pid``'s ``peek`` of up to ``count`` messages from ``start`` (of the
        receiver's sub-queue, or of ``session_id``), in pieces sized from the rows last seen."""
        rows = await self._call_rows(
            "peek",
            start,
            count,
            self._dead_letter,
            session_id,
            self._pieces(count),
            partition=pid,
            timeout=timeout,
        )
        return self._wrap(rows, "peeked")

    async def _peek_quiet(
        self, start: int, count: int, pid: int, timeout: Any
    ) -> tuple[list[ServiceBusReceivedMessage], float]:
        """``_peek_call`` of one partition of several, and the seconds since that partition
        last moved messages out (0 while some travel), told in the same call
        (``peek_partitioned``)."""
        pieces = self._pieces(count)
        *values, quiet = await self._call(
            "peek",
            start,
            count,
            self._dead_letter,
            None,
            pieces,
            True,
            partition=pid,
            timeout=timeout,
            returns=pieces + 1,
        )
        rows = self._rows(values if pieces > 1 else values[0], pieces)
        return self._wrap(rows, "peeked"), float(quiet)
