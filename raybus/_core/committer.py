"""Group commit: making a partition's changes durable before they are acknowledged.

``Committer`` owns a ``Partition`` and, for a durable partition, its ``DurableLog``. The actor
calls ``await committer.durable()`` after every operation that may have changed state; it
returns once everything recorded so far is in the log. All operations that arrive while a flush
is under way share the next flush (one log record and one fsync per flush), so under load many
sends and settlements cost one write.

Guarantees:

* An operation's caller is answered only after its changes are durable (fsync or a completed
  object write). New messages stay invisible to receivers until then (``visible_seq``).
* If a flush fails (disk full, I/O error, unreachable bucket) every operation waiting on it, and
  every one recorded meanwhile, gets the ``StorageUnavailableError`` (retryable), and the core is
  rebuilt from the log: memory returns to exactly the durable state, so a failed send stores
  nothing and a failed settlement leaves its message where it was. Locks held at that moment are
  lost, as after a restart. Reads go on being served. If the core cannot be rebuilt (the log
  cannot be read, what the failed write left cannot be removed, or rebuilding raises anything
  else) the committer is ``broken``: it shows no message, refuses every change, and tells
  ``on_fatal``.
* Checkpoints are taken when the log since the last one holds more changes than
  ``max(checkpoint_min, 2 * live messages)`` (a message stored, settled or moved is one, though
  a batch's share one entry: ``journal.changes``), or more bytes than
  ``max(checkpoint_min_bytes, the last checkpoint's)``: recovery reads and replays a bounded
  amount, and a log of long messages does not grow to thousands of them. Both count only the
  log since the last checkpoint, which a checkpoint empties, so neither can fire again right
  after one, whatever the checkpoint holds. A partition that has flushed nothing for
  ``quiet_checkpoint`` seconds checkpoints too, if its messages (estimated: ``wire_sizes``)
  would take less than half of what it stores, and the last checkpoint was not much larger
  than that estimate said (duplicate-detection ids and session states are not in it: a
  partition of those is left to the other two rules, else each quiet pause would rewrite
  them): a drained queue's storage shrinks back to one small checkpoint once it is quiet.
  Why the floors are high (10,000 changes, 64 MiB): a checkpoint's cost is mostly fixed
  (capturing, a file written and fsynced, the directory fsynced, old files deleted), and
  with 1,000 a busy queue holding a few hundred messages took one every 500 messages sent
  and completed, 15 % of its partition's CPU
  (``benchmarks/profile_hot_paths.py --scenario e2e``, A/B alternating, medians of three:
  partition CPU 19.7 against 23.2 ms per 1,000 messages, 30.9k against 27.6k msg/s); replaying
  10,000 changes takes a fraction of a second. The state is captured at once, between two
  flushes (so it holds durable changes only), but encoded and written, and the log files it
  replaces deleted, in the background (``_start_checkpoint`` says why the encoding too, and
  why the garbage collector pauses meanwhile): flushes go on meanwhile, until the log holds
  twice the threshold (profiled: writing a checkpoint and deleting the files took 15 % of a busy
  partition's samples, and every send and settlement waiting on the next flush waited too).
  A checkpoint that fails loses nothing (the log stays complete): a failed write is tried
  again at the next flush, a state that cannot be captured (a bug) after another threshold.

Where a flush is written: a small one (at most ``INLINE_FLUSH_BYTES`` of Arrow data) to a
local segment is written and fsynced on the event loop's own thread; a larger one, or one to an
object store, in a worker thread, so that the loop serves other calls meanwhile. Why: handing a
write to a thread and its answer back cost more CPU than the write itself (measured, one
1 KiB send and its flush, this process's CPU: 554-643 us through a thread, 344-383 us inline;
on a tmpfs 474 us against 165 us), and on a 2-core machine the broker's throughput is its CPU
per message. End to end the gain is small, as Ray's own cost per call dominates: one sender
and one receiver taking turns (send, receive, complete: three calls and two flushes per
message), two queues of one Ray session measured in turn, 4 % less partition CPU per message
and 2 % lower p50. Why the limit is 96 KiB: it takes one message of 64 KiB inline (about
66 KB of Arrow data; an inline write and sync of that costs about what one of 1 KiB does, 0.24
against 0.19 ms here) and leaves a list of 100 messages of 1 KiB (about 117 KB) to the thread,
where the loop serves the receiver's calls while the list is written (inline flushes of up to
1 MiB cost that cell 27.0k against 31.0k msg/s, and of up to 256 KiB, the partition's CPU 31-36
against 23-25 ms per 1,000 messages, when measured before: ``benchmarks/RESULTS.md``). At
64 KiB, one message of 64 KiB went to the thread: one sender and one receiver taking turns
with such messages (``benchmarks/single_calls.py``, three pairs alternating) got 714-736
msg/s with 96 KiB against 632-660 with 64 KiB, the partition's CPU 0.94-0.98 ms a message
against 1.09-1.20; the suite's 64 KiB single cell (two quick pairs) 723-766 against 580-612
msg/s; the e2e profile's lists of 1 KiB wrote their 2,000 sends in the thread either way
(30.1k and 30.0k msg/s). What it costs: while an inline fsync runs (about 0.25 ms on the
local disk) the partition answers nothing, reads included. A disk that gets slow must not stall
reads for long: the small writes' times (inline or, while the disk is slow, in the thread) are
averaged with a decay (``WRITE_TIME_WEIGHT`` for the newest), and while that average is above
``SLOW_INLINE_S`` they go to the worker thread. So one write of ten times the threshold, or a
streak of slow ones (7 of twice the threshold), sends the next to the thread, and the writes
come back inline once the thread's are quick again. Why an average and not each write: a
virtual machine's disk has outliers (measured here, 1.2 KB appends with ``fdatasync``: p50
0.26 ms, 0.1 % over 5 ms, none over 10), and the earlier rule, one write over 5 ms sending the
next second's to the thread, kept a partition threaded about half the time at 1,000 msg/s
(4,845 of 9,313 flushes inline): p50 from send to receipt 4.25-4.31 ms, against 2.86-2.93
with this rule, which wrote every flush inline (``profile_hot_paths.py --scenario latency``,
two A/B pairs). In the suite's latency cell (``benchmarks/suite.py --scenarios latency``, four
pairs) p50 was 2.47-3.34 ms against 3.82-6.69, p99 9.4-25.4 against 12.5-19.1; its per-message
throughput cells did not change beyond the noise (100 senders 15.5-16.9k against
12.8-17.6k msg/s).

Callers nobody waits on linger. A settlement the client sent without waiting for its answer
(``complete_message`` and its siblings return before the broker answers) calls
``durable(lazy=True)``: if no caller that waits has changes pending, the flush carrying it waits
up to ``LAZY_LINGER_S`` for one, which then shares it (and cuts the wait short). Why: with one
sender and one receiver taking turns, each send and each completion had a flush of its own, and
the send waited for the completion's flush before its own began (measured, 64 KiB bodies, per
message calls: 1.4 ms per send with a receiver completing alongside, 0.9 ms without one).
Nothing is answered before it is durable; a lone completion's answer comes up to
``LAZY_LINGER_S`` later, which its sender does not wait for, until its next call that reaches
the broker: a receive waits for the answers of the settlements sent before it. So a receive
that finds messages at once ends the wait (``hurry``): else, with messages waiting, each
receive of a receiver completing one by one waited for the next send (measured at 1,000 msg/s
sent open loop: p50 from send to receipt 1.81 ms without the linger, 2.40 ms with it and no
``hurry``). A receive that has to wait for a message does not: the send that brings it will.
And only after a flush written in the worker thread does a flush linger: a small one written
inline on a local disk is quick (one 1 KiB message: an fsync of about 0.13 ms), and there the
wait cost more than the flush it saved (``benchmarks/single_calls.py``, 1 KiB per-message
calls: 0.91-0.94x the messages/s of no linger with it, 0.97-1.04x without; 64 KiB, whose
flushes go to the thread: 1.17-1.30x).

Memory-only partitions (no log) pay nothing: ``durable()`` returns at once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

import pyarrow as pa

from .._storage import DurableLog
from ..exceptions import ServiceBusError
from . import journal
from .partition import Partition
from .record import ROW_ALLOWANCE

__all__ = [
    "CHECKPOINT_MIN",
    "CHECKPOINT_MIN_BYTES",
    "INLINE_FLUSH_BYTES",
    "LAZY_LINGER_S",
    "QUIET_CHECKPOINT_S",
    "SLOW_INLINE_S",
    "WRITE_TIME_WEIGHT",
    "Committer",
]

# Flushes of at most this many bytes of Arrow data to a local segment are written on the
# event loop's thread (module docstring); a 1 KiB message takes about 1.1 KiB, so one message
# of 64 KiB (about 66 KB) is written inline and a list of 100 of 1 KiB (about 117 KB) is not.
INLINE_FLUSH_BYTES = 96 * 1024
# While the small writes take longer than this on average, they go to the worker thread (a
# slow disk would otherwise stall every call of the partition); each write's time weighs
# WRITE_TIME_WEIGHT in that average (module docstring).
SLOW_INLINE_S = 0.005
WRITE_TIME_WEIGHT = 0.1
# How long a flush that only callers nobody waits on need waits for a caller that waits to
# share it (module docstring): longer than a client's turn between an answer and its next send.
LAZY_LINGER_S = 0.002
# A checkpoint is due once the log since the last one holds this many changes (or twice the
# messages held, if more) or this many bytes (or the last checkpoint's, if more): module
# docstring. Below CHECKPOINT_MIN a busy queue of few messages checkpointed every few
# hundred messages: 15 % of its partition's CPU (e2e profile, 1,000 against 10,000).
CHECKPOINT_MIN = 10_000
CHECKPOINT_MIN_BYTES = 64 << 20
# A partition with no flush for this long checkpoints if that at least halves its storage (a
# drained queue gives its disk back without waiting for another threshold of changes).
QUIET_CHECKPOINT_S = 1.0
_QUIET_SLACK_BYTES = 64 << 10  # not for a few kilobytes

_log = logging.getLogger("raybus.commit")


class Committer:
    """A partition core plus group commit to its log (asyncio; no Ray)."""

    def __init__(
        self,
        make_core: Callable[[], Partition],
        log: DurableLog | None,
        *,
        on_visible: Callable[[], None] = lambda: None,
        checkpoint_min: int = CHECKPOINT_MIN,
        checkpoint_min_bytes: int = CHECKPOINT_MIN_BYTES,
        quiet_checkpoint: float | None = QUIET_CHECKPOINT_S,
        express_interval: float | None = None,
        on_fatal: Callable[[BaseException], None] = lambda exc: None,
        inline_bytes: int = INLINE_FLUSH_BYTES,
        lazy_linger: float = LAZY_LINGER_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``express_interval`` (seconds) makes the partition express: ``durable()`` returns at
        once and the changes are written within that interval (the loss window of a crash).
        ``on_fatal`` is told when the log can be neither written nor read back (or the core
        cannot be rebuilt from it after a failed flush): the committer then hides every
        message and refuses all changes (the actor exits so that Ray restarts it and it
        recovers once the storage is back). ``inline_bytes`` is the largest flush written on
        the event loop's thread (0: none); ``monotonic`` times those writes. ``lazy_linger``
        (seconds) is how long a flush only ``durable(lazy=True)`` callers wait on may wait
        for one that others wait on (0: not at all). ``checkpoint_min``,
        ``checkpoint_min_bytes`` and ``quiet_checkpoint`` (seconds; None: never) set when a
        checkpoint is taken (module docstring)."""
        self._make_core = make_core
        self._log = log
        self._on_visible = on_visible
        self._checkpoint_min = checkpoint_min
        self._checkpoint_min_bytes = checkpoint_min_bytes
        self._quiet_s = quiet_checkpoint
        self._quiet: asyncio.TimerHandle | None = None  # the check for a quiet partition
        self._last_flush = 0.0  # the loop's time at the end of the last flush
        self._express = express_interval
        self._since_checkpoint = 0  # changes logged since the last checkpoint
        self._log_bytes = 0  # Arrow bytes logged since the last checkpoint
        self._checkpoint_bytes = 0  # the last checkpoint's
        self._checkpoint_estimate = 0  # what ``_live_bytes`` said when it was captured
        self._on_fatal = on_fatal
        self._inline_bytes = inline_bytes
        self._monotonic = monotonic
        # The small writes' decaying average time (module docstring). Only the flush loop
        # reads and updates it, the worker thread while the loop awaits that write.
        self._write_s = 0.0
        self._lazy_linger = lazy_linger
        self._eager = False  # a caller that waits has changes in ``_waiting``
        # Whether the last flush was written in the worker thread: only then does a flush
        # saved by lingering pay for the wait (module docstring).
        self._linger_pays = False
        self._linger_end: asyncio.Future[None] | None = None  # ends the flush loop's wait early
        self.inline_flushes = 0  # statistics
        self.broken: BaseException | None = None
        # The callers waiting for the changes not yet taken, and for the flush being written:
        # a future each (``_wait``).
        self._waiting: list[asyncio.Future[None]] | None = None
        self._inflight: list[asyncio.Future[None]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._checkpointing: asyncio.Task[None] | None = None  # being written, if any
        self.flush_times: list[float] = []  # seconds per flush, since the last metrics export
        self.flushes = 0  # statistics
        self.flushed_entries = 0  # changes written (``journal.changes``: a message sent is one)
        self.core = self._recover()

    @property
    def durable_log(self) -> DurableLog | None:
        return self._log

    def _recover(self) -> Partition:
        """A fresh core holding exactly what the log holds (blocking I/O)."""
        core = self._make_core()
        if self._log is None:
            return core
        # Replaying builds millions of long-lived objects: the cyclic garbage collector would
        # re-scan them again and again (measured: 14.3 s -> 5.3 s for 1M messages without it).
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._replay_into(core)
        finally:
            if enabled:
                gc.enable()
        gc.freeze()  # the recovered messages are old: keep them out of later collections
        return core

    def _replay_into(self, core: Partition) -> None:
        assert self._log is not None
        found = self._log.recover()
        state = journal.ReplayedState()
        self._checkpoint_bytes = 0
        if found.checkpoint is not None:
            journal.replay(journal.from_table(found.checkpoint), state)
            # Its estimate is unknown: taken as right, so one quiet checkpoint may follow.
            self._checkpoint_bytes = found.checkpoint.nbytes
        count = logged = 0
        for _lsn, table in found.entries:
            entries = journal.from_table(table)
            count += journal.changes(entries)
            logged += table.nbytes  # not the buffers' total: read tables slice one buffer
            journal.replay(entries, state)
        core.load(state)
        core.enable_journal()
        if self._express is not None:
            core.visible_seq = None  # acknowledged before written: visible at once
        self._since_checkpoint = count
        self._log_bytes = logged
        self._checkpoint_estimate = self._checkpoint_bytes

    @property
    def shows_when_durable(self) -> bool:
        """Whether new messages become visible only once a flush has made them durable (a
        durable partition that is not express), that flush then telling ``on_visible`` (as
        every flush does). Otherwise they are visible as they are stored, and whoever stores
        them must wake the receivers itself."""
        return self._log is not None and self._express is None

    async def durable(
        self, *, after_inflight: bool = True, force: bool = False, lazy: bool = False
    ) -> None:
        """Return once every change recorded so far is durable; raise the storage error if the
        flush that carried them failed (those changes were then undone).

        ``after_inflight`` also waits for a flush already being written when this call has
        recorded nothing: an answer that depends on earlier changes (a dropped duplicate
        acknowledges its original) must not overtake them. Peek-lock receives pass False: they
        only see durable messages anyway. ``force`` waits for the write even on an express
        partition (two-phase commit needs its prepare and commit records on disk), and so, on
        an express partition too, for the flush in flight when this call recorded nothing: a
        repeated prepare, commit or abort answers only once the first one's record is durable.
        ``lazy``: the caller's own client does not wait for this answer, so the flush may wait
        ``lazy_linger`` for a caller that does (module docstring); such a caller (any call
        without ``lazy``, ``force`` included) ends that wait.
        """
        if self.broken is not None:
            raise self.broken
        if self._log is None:
            return
        if not self.core.has_journal():
            # An express partition acknowledges before writing, so only a forced answer
            # (whose caller relies on the record being on disk) waits for the flush in flight.
            if after_inflight and self._inflight is not None and (self._express is None or force):
                await _wait(self._inflight)
            return
        if self._express is not None and not force:
            if self._task is None:
                self._task = asyncio.ensure_future(self._flush_loop(self._express))
            return
        if self._waiting is None:
            self._waiting = []
        waiting = self._waiting
        if not lazy:
            self.hurry()
        if self._task is None:
            self._task = asyncio.ensure_future(self._flush_loop())
        await _wait(waiting)

    async def durable_since(self, mark: int) -> None:
        """Return once the changes recorded since ``mark`` are durable; at once if there are
        none, even while other callers' changes wait for a flush (they wait for it
        themselves). ``mark`` is ``core.journal_size()`` taken in the same synchronous step,
        before those changes. For reads that show only durable state anyway (peek-lock
        receives): profiled, waiting for a busy partition's next flush delayed them by one
        or two flushes."""
        if self.broken is not None:
            raise self.broken
        if self.core.journal_size() > mark:
            await self.durable(after_inflight=False)

    def _small(self, nbytes: int) -> bool:
        """Whether a flush of ``nbytes`` is one to write on the event loop's thread while
        the disk is quick (module docstring)."""
        assert self._log is not None
        return self._log.segment_bytes is not None and nbytes <= self._inline_bytes

    def _append_timed(self, table: pa.Table) -> None:
        """Append a small flush (on whichever thread calls this) and fold the time it took,
        failed or not, into the average that decides where the next one is written."""
        assert self._log is not None
        before = self._monotonic()
        try:
            self._log.append(table)
        finally:
            took = self._monotonic() - before
            self._write_s += WRITE_TIME_WEIGHT * (took - self._write_s)

    async def _flush_loop(self, delay: float = 0.0) -> None:
        assert self._log is not None
        log = self._log
        try:
            if delay:
                await self._linger(delay)
            while self.core.has_journal() and self.broken is None:
                if (
                    not self._eager
                    and self._express is None
                    and self._lazy_linger > 0
                    and self._linger_pays
                ):
                    # Only callers nobody waits on have changes pending: give one that is
                    # waited on the chance to share this flush (module docstring).
                    await self._linger(self._lazy_linger)
                if self._checkpointing is not None and self._since_checkpoint >= 2 * (
                    self._checkpoint_threshold()
                ):
                    # Appends may run ahead of a slow checkpoint, but only so far: the log
                    # (and so recovery time) stays bounded by twice the threshold.
                    await self._checkpoint_written()
                entries, last_seq = self.core.take_journal()
                waiting, self._waiting = self._waiting, None
                self._eager = False
                if waiting is None:
                    waiting = []
                self._inflight = waiting
                started = time.perf_counter()
                try:
                    table = journal.to_table(entries)
                    # Not ``table.nbytes``: 7 us a call (it measures slices); this table's
                    # buffers are its own.
                    nbytes = table.get_total_buffer_size()
                    small = self._small(nbytes)
                    inline = small and self._write_s < SLOW_INLINE_S
                    self._linger_pays = not inline
                    if inline:
                        self._append_timed(table)
                        self.inline_flushes += 1
                    elif small:  # the disk is slow: timed in the thread, to see it recover
                        await asyncio.to_thread(self._append_timed, table)
                    else:
                        await asyncio.to_thread(log.append, table)
                except Exception as exc:  # a storage error, or a bug encoding the entries
                    failure = (
                        exc
                        if isinstance(exc, ServiceBusError)
                        else ServiceBusError(f"changes not logged: {exc!r}", self.core.entity)
                    )
                    await self._checkpoint_written()  # recovery must not race its writer
                    self._failed(failure, waiting)  # no waiter is left hanging
                    continue
                finally:
                    self._inflight = None
                self.flushes += 1
                changed = journal.changes(entries)
                self.flushed_entries += changed
                if len(self.flush_times) < 1000:  # drained by the metrics export
                    self.flush_times.append(time.perf_counter() - started)
                self._since_checkpoint += changed
                self._log_bytes += nbytes
                core = self.core
                if self._express is None:
                    core.visible_seq = max(core.visible_seq or 0, last_seq)
                for fut in waiting:  # first: they answer before the receivers woken below
                    if not fut.done():
                        fut.set_result(None)
                # Every flush, not only one that logged new numbers: what the flushed calls
                # changed on the way (a lock expired and requeued, a message expired into the
                # dead-letter sub-queue) is announced nowhere else.
                self._on_visible()
                if not core.has_journal() and self._checkpoint_due():
                    try:
                        self._start_checkpoint()
                    except ServiceBusError:  # its waiters are answered: go on flushing
                        _log.exception("checkpoint of %s not captured", core.entity)
            self._watch_quiet()
        finally:
            self._task = None

    def hurry(self) -> None:
        """Write what callers nobody waits on changed without waiting for another caller:
        for a caller that waits (``durable()``), or whose client is about to wait for their
        answers after all (a receive that found messages; see the module docstring)."""
        if self._waiting is not None:
            self._eager = True
            if self._linger_end is not None and not self._linger_end.done():
                self._linger_end.set_result(None)

    async def _linger(self, seconds: float) -> None:
        """Wait ``seconds``, or less if a caller that waits for its answer comes first."""
        loop = asyncio.get_running_loop()
        end = self._linger_end = loop.create_future()
        timer = loop.call_later(seconds, _set_once, end)
        try:
            await end
        finally:
            timer.cancel()
            self._linger_end = None

    def _failed(self, exc: ServiceBusError, waiting: list[asyncio.Future[None]]) -> None:
        later, self._waiting = self._waiting, None
        for fut in [*waiting, *(later or ())]:
            if not fut.done():
                fut.set_exception(exc)
                fut.add_done_callback(lambda f: f.exception())  # retrieved: no warning
        entity = self.core.entity
        _log.warning("flush failed (%s); rebuilding %s from its log", exc, entity)
        try:
            self.core = self._recover()
        except ServiceBusError as again:
            _log.error("cannot read back %s after a failed flush: %s", entity, again)
            self._break(again)
        except Exception as bug:
            # A bug in replay, or MemoryError: raised out of the flush task it would go
            # unreported (nobody awaits that task) and leave the old core, which holds the
            # changes just undone, in service. Treat it as an unreadable log.
            _log.exception("cannot rebuild %s after a failed flush", entity)
            broken = ServiceBusError(f"not rebuilt after a failed flush: {bug!r}", entity)
            broken.__cause__ = bug
            self._break(broken)
        else:
            self._on_visible()

    def _break(self, exc: ServiceBusError) -> None:
        """Stop serving: memory holds changes the log does not (neither written nor read
        back). Serve nothing rather than something never stored; every later ``durable()``
        raises ``exc`` and ``on_fatal`` is told (the actor exits and recovers on restart)."""
        self.broken = exc
        try:
            core = self._make_core()
            core.enable_journal()
        except Exception:
            # Not even an empty core can be built: hide everything the old one holds instead.
            _log.exception("cannot build an empty core for %s", self.core.entity)
            core = self.core
        core.visible_seq = -1
        self.core = core
        self._on_fatal(exc)

    def _checkpoint_threshold(self) -> int:
        return max(self._checkpoint_min, 2 * self.core.message_count())

    def _stored_bytes(self) -> int:
        """About what the log since the last checkpoint and that checkpoint take."""
        return self._checkpoint_bytes + self._log_bytes

    def _live_bytes(self) -> int:
        """About what a checkpoint of the messages held now would take (``wire_sizes``'
        estimate per message; the rest of a checkpoint is not counted)."""
        core = self.core
        return core.message_bytes() + ROW_ALLOWANCE * core.message_count()

    def _checkpoint_due(self) -> bool:
        return self._since_checkpoint >= self._checkpoint_threshold() or (
            self._log_bytes >= max(self._checkpoint_min_bytes, self._checkpoint_bytes)
        )

    def _quiet_checkpoint_pays(self) -> bool:
        """Whether a checkpoint now would at least halve what is stored, going by the
        messages' estimate, and that estimate held for the last checkpoint."""
        trusted = self._checkpoint_bytes <= 2 * self._checkpoint_estimate + _QUIET_SLACK_BYTES
        return (
            self._since_checkpoint > 0
            and trusted
            and self._stored_bytes() >= 2 * self._live_bytes() + _QUIET_SLACK_BYTES
        )

    def _watch_quiet(self) -> None:
        """After a flush: check for a quiet partition ``quiet_checkpoint`` seconds after the
        last flush (one timer at a time, moved on when flushes went on meanwhile)."""
        if self._quiet_s is None or self._log is None:
            return
        loop = asyncio.get_running_loop()
        self._last_flush = loop.time()
        if self._quiet is None:
            self._quiet = loop.call_later(self._quiet_s, self._when_quiet)

    def stop_quiet_checkpoints(self) -> None:
        """No checkpoint for quiet any more (the entity is being deleted: nothing may be
        written after its storage is)."""
        self._quiet_s = None
        if self._quiet is not None:
            self._quiet.cancel()
            self._quiet = None

    def _when_quiet(self) -> None:
        """Checkpoint a partition quiet for ``quiet_checkpoint`` seconds when that at least
        halves its storage (a drained queue, a queue whose log outgrew its messages)."""
        self._quiet = None
        if self._quiet_s is None:
            return
        loop = asyncio.get_running_loop()
        quiet_for = loop.time() - self._last_flush
        if quiet_for < self._quiet_s or self._checkpointing is not None:
            # Not quiet yet, or a checkpoint is being written: look again.
            self._quiet = loop.call_later(
                max(self._quiet_s - quiet_for, 0.0) or self._quiet_s, self._when_quiet
            )
            return
        if self._task is not None or self.core.has_journal() or self.broken is not None:
            return  # a flush is due or under way: it watches again when it ends
        if self._quiet_checkpoint_pays():
            try:
                self._start_checkpoint()
            except ServiceBusError:
                _log.exception("checkpoint of %s not captured", self.core.entity)

    def _start_checkpoint(self) -> None:
        """Capture the state now (call only when every recorded change is durable) and encode
        and write it in the background, unless a checkpoint is being written already.

        A state that cannot be captured or encoded is a bug, not the storage: a capture's is
        raised as a ``ServiceBusError`` (the flush loop logs it and goes on answering its
        waiters), an encoding's logged; either way the next attempt waits for another
        threshold of entries (capturing costs a pass over every message).

        The capture (each message's fields as a tuple) runs on the event loop, the encoding
        (pickling, the Arrow table) in a worker thread, and the cyclic garbage collector is
        paused from the capture until the encoding has let its tuples go. Why: the loop
        answers nothing while it captures, and a partition holding 400,000 messages took
        0.42 s to capture and 0.16 s to encode, a send waiting on it all (a 4 -> 1
        scale-down, ``benchmarks/move_backlog.py``); without the collector the capture takes
        0.31 s (its new tuples made it scan every message held, about a quarter of the time),
        and the encoding leaves the loop between the thread's turns. The tuples hold the
        fields' values, which the partition replaces and never changes in place, so the
        encoding sees the state as captured."""
        assert self._log is not None
        if self._checkpointing is not None:
            return
        collecting = gc.isenabled()
        gc.disable()
        # Captured synchronously: entries recorded after this point are not in it and will
        # be appended with higher LSNs, which recovery replays on top of it. Until the task
        # that encodes it has started, a failure must turn the collector on again itself.
        try:
            entries = self.core.snapshot_entries()
            upto = self._log.next_lsn - 1
            covered = (self._since_checkpoint, self._log_bytes, self._live_bytes())
            self._checkpointing = asyncio.ensure_future(
                self._write_checkpoint(entries, upto, covered, collecting)
            )
        except Exception as exc:
            if collecting:
                gc.enable()
            self._since_checkpoint = 0  # the log stays complete: only its length grows
            raise ServiceBusError(f"checkpoint not captured: {exc!r}", self.core.entity) from exc

    async def _write_checkpoint(
        self,
        entries: list[journal.Entry],
        upto: int,
        covered: tuple[int, int, int],
        collecting: bool,
    ) -> None:
        """Encode and write ``entries`` as the state up to ``upto``; ``covered``: the
        changes and bytes of log it replaces, and the estimate of its size when it was
        captured; ``collecting``: the garbage collector ran before the capture."""
        assert self._log is not None
        try:
            try:
                table = await asyncio.to_thread(_encode, entries)
            finally:
                del entries  # the last reference: nothing captured left for the collector
                if collecting:
                    gc.enable()
        except Exception:
            self._since_checkpoint = 0  # the log stays complete: only its length grows
            _log.exception("checkpoint of %s not encoded", self.core.entity)
            self._checkpointing = None
            return
        try:
            await asyncio.to_thread(self._log.checkpoint, table, upto)
        except ServiceBusError as exc:  # the log is still complete; try again later
            _log.warning("checkpoint of %s failed: %s", self.core.entity, exc)
        except Exception:  # a bug, not the storage: flushes must go on all the same
            _log.exception("checkpoint of %s failed", self.core.entity)
        else:
            # Entries flushed while it was written count toward the next one.
            changes, logged, self._checkpoint_estimate = covered
            self._since_checkpoint = max(0, self._since_checkpoint - changes)
            self._log_bytes = max(0, self._log_bytes - logged)
            self._checkpoint_bytes = table.get_total_buffer_size()
        finally:
            self._checkpointing = None

    async def _checkpoint_written(self) -> None:
        """Wait for the checkpoint being written, if any (it reports its own failure)."""
        task = self._checkpointing
        if task is not None:
            await asyncio.wait([task])

    async def checkpoint_now(self) -> None:
        """Flush, then checkpoint, and wait until it is written (tests and shutdown)."""
        await self.durable()
        await self._checkpoint_written()
        if self._log is None or self._log.next_lsn - 1 <= (self._log.checkpoint_lsn or 0):
            return
        while self._task is not None:  # a flush started meanwhile: checkpoint after it
            await asyncio.wait([self._task])
        if not self.core.has_journal():
            self._start_checkpoint()
        await self._checkpoint_written()


async def _wait(waiters: list[asyncio.Future[None]]) -> None:
    """Join ``waiters`` (of one flush) with a future of one's own, and wait for it.

    Why one per caller, not one shared future behind an ``asyncio.shield`` per caller: a
    caller cancelled cancels only its own future all the same, and the flush wakes each caller
    in one loop step (one callback) where the shield took two, for every caller of the flush
    (100 concurrent senders share a few). It also wakes them before the receivers it makes
    messages visible to. End to end neither was measurable (``benchmarks/RESULTS.md``)."""
    fut = asyncio.get_running_loop().create_future()
    waiters.append(fut)
    await fut


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _encode(entries: list[journal.Entry]) -> pa.Table:
    """A checkpoint's encoding, in the worker thread (tests hold it back here)."""
    return journal.to_table(entries)
