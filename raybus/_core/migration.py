"""Moving slots (and messages) between partitions while the entity keeps running.

A partition change (``raybus._actors.namespace`` drives it) moves whole slots of the partition
map (``raybus._core.slots``) from a source partition to a target:

1. ``hand_over`` (source): the slots stop being served here at once (a send or session accept
   for them gets ``PartitionMovedError`` and the client retries with the new map). Slots that
   hold a session locked by a receiver are *pinned*: they stay, so a session never moves while
   someone works on it. For the other slots the source takes out, in sequence order, the
   session messages (every state), the session states and the duplicate-detection ids; a
   *retiring* source (scale-down) also takes out its other unlocked messages, dead-lettered
   ones included, for the ``spill`` partition, oldest first and at most
   ``MOVE_BUNDLE_MESSAGES`` / ``MOVE_BUNDLE_BYTES`` of them per call: the namespace calls again
   at once while a bundle stops at that bound (``Bundle.bounded``). What is taken out is
   written to the source's log as an *outbox* entry in the same durable step that removes it,
   so it is never lost and never visible in two places.

   Why the bound: the target stores a bundle in one call, and its sends and receives wait
   behind that call. With one bundle per retiring partition a send waited 1.3 s during a
   4 -> 1 scale-down of 100,000 durable 1 KiB messages and 4.7 s at 400,000
   (``benchmarks/move_backlog.py``); bounded, it waits about as long as a bundle's storing,
   however deep the backlog, and receivers go on taking the messages not moved yet. Messages
   whose slot moves go in one bundle, unbounded: from the moment the slot is the target's,
   its sends go there, and a session's messages must arrive before them (a retiring
   partition's slots move in its first call; later calls spill alone).
2. ``adopt`` (target): stores the bundle durably, under new sequence numbers (taken in the
   original order, so a session's order holds). Deferred and scheduled messages keep working
   under their old numbers (an alias). Each bundle is applied at most once (its move id is
   logged with it), so the source may resend it after any failure.
3. ``finish`` (source): the target confirmed; the outbox entry is dropped.

A deferred or scheduled message is asked for by its sequence number, which the client looks up
in every partition at once (``locate``). While its bundle is between source and target, and just
after, it is in neither store; ``moved`` tells where it went (the target, with the move id while
the move is on its way), so the source's ``locate`` can wait for the move and name the target.

A message keeps its delivery count, times, state and properties; it gets a new sequence number
in its new partition (as a scheduled message does when it turns active). A message locked by a
receiver is never moved: a retiring partition keeps it until it is settled or its lock ends.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from . import journal
from .partition import Partition
from .record import ACTIVE, DEFERRED, SCHEDULED, MessageRecord
from .slots import SLOTS, DedupId, dedup_id_slot, partition_key, slot_of

__all__ = [
    "MOVED_OUT_KEEP_S",
    "MOVE_BUNDLE_BYTES",
    "MOVE_BUNDLE_MESSAGES",
    "Bundle",
    "adopt",
    "finish",
    "hand_over",
    "is_empty",
    "moved",
    "quiet_for",
]

# How long a source remembers where a finished move took its deferred and scheduled messages:
# a client's lookup in flight when the move finished needs it for one call; a minute is ample.
MOVED_OUT_KEEP_S = 60.0

# The most a retiring partition spills in one bundle (the first bound reached ends it; a bundle
# takes one message at least). Measured with these: during a 4 -> 1 scale-down of 100,000
# durable 1 KiB messages a send waited 187 ms at most, three bundles being stored at once.
MOVE_BUNDLE_MESSAGES = 4096
MOVE_BUNDLE_BYTES = 4 * 1024 * 1024


@dataclass
class Bundle:
    """What one move carries to one target."""

    slots: frozenset[int]
    records: list[tuple[int, tuple[Any, ...]]] = field(default_factory=list)  # (store, row)
    dedup: list[tuple[DedupId, float, int, int]] = field(default_factory=list)  # id, at, seq, slot
    sessions: list[tuple[str, bytes, float]] = field(default_factory=list)  # id, state, at
    # Earlier numbers of moved records (moved before): number at the source -> older numbers.
    aliases: dict[int, list[int]] = field(default_factory=dict)
    # The source stopped spilling at MOVE_BUNDLE_MESSAGES / MOVE_BUNDLE_BYTES: more follows.
    bounded: bool = False

    # A bundle does not change once handed over, and a source evacuating many messages is
    # asked for these by every count and every lookup by number while the move travels:
    # each is derived once (not pickled: the journal and the target get the fields alone).
    @cached_property
    def tally(self) -> tuple[int, int, int, int]:
        """(active, dead-lettered, scheduled, bytes) of what it carries, session states
        included in the bytes (``Partition.counts`` of a source)."""
        active = dead = scheduled = size = 0
        for store_id, rec in self._messages():
            size += rec.size
            if store_id != journal.MAIN:
                dead += 1
            elif rec.state == SCHEDULED:
                scheduled += 1
            else:
                active += 1
        size += sum(len(state) for _sid, state, _at in self.sessions)
        return active, dead, scheduled, size

    @cached_property
    def addressed(self) -> frozenset[int]:
        """Numbers (at the source) of its messages that are asked for by number: the
        deferred ones (of the main store or the dead-letter sub-queue) and the scheduled."""
        return frozenset(
            rec.sequence_number for store_id, rec in self._messages() if _addressed(store_id, rec)
        )

    def _messages(self) -> Iterator[tuple[int, MessageRecord]]:
        for store_id, row in self.records:
            yield store_id, MessageRecord(*row)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("tally", "addressed")}


def _addressed(store_id: int, rec: MessageRecord) -> bool:
    """Whether a receiver asks for ``rec`` by its number: a deferred message (of the main
    store or the dead-letter sub-queue) or a scheduled one (which a sender cancels by number),
    so a partition change that moves it must say where it went."""
    return rec.state == DEFERRED or (rec.state == SCHEDULED and store_id == journal.MAIN)


def hand_over(
    p: Partition, moves: dict[int, frozenset[int]], spill: int | None
) -> tuple[dict[str, tuple[int, Bundle]], frozenset[int]]:
    """Stop serving the slots in ``moves`` (target partition id -> slots) and take out what
    goes with them. With ``spill`` the partition is retiring: it also takes no more unkeyed
    messages, and its other unlocked messages go to ``spill``.

    Returns the new outbox entries (move id -> (target, bundle)), also kept in ``p.outbox``
    and journaled, and the pinned slots (not moved, still served here).
    """
    now = p._begin(use=False)  # a partition change is not use of the entity
    slot_target = {s: t for t, slots in moves.items() for s in slots}
    pinned: set[int] = set()
    sessions = p._sessions
    if sessions is not None:
        for s in sessions.by_id.values():
            slot = slot_of(s.id)
            if s.holder is not None and slot in slot_target:
                pinned.add(slot)
    if p.prepared:  # keys a prepared transaction will send here stay until it ends
        from .transactions import prepared_slots

        pinned |= prepared_slots(p) & set(slot_target)
    for slot in pinned:
        del slot_target[slot]
    owned = p.owned if p.owned is not None else frozenset(range(SLOTS))
    p.owned = owned - frozenset(slot_target)
    if spill is not None:
        p.retiring = True
    p._record(journal.SLOTS, p._main, 0, (p.owned, p.retiring))

    bundles: dict[int, Bundle] = {}

    def bundle(target: int) -> Bundle:
        b = bundles.get(target)
        if b is None:
            slots = frozenset(s for s, t in slot_target.items() if t == target)
            b = bundles[target] = Bundle(slots)
        return b

    dedup = p._props.requires_duplicate_detection
    earlier: dict[int, list[int]] = {}
    for old, new in p._aliases.items():
        earlier.setdefault(new, []).append(old)
    spilled = spilled_bytes = 0
    bounded = False
    for store in (p._main, p._dlq):
        going: list[tuple[MessageRecord, int]] = []
        for seq in store.numbers_from(0):  # oldest first; the store changes after the walk
            rec = store.messages[seq]
            if rec.lock_token is not None:
                continue  # in a receiver's hands: never moved
            key = partition_key(rec, dedup) if store is p._main else None
            target = slot_target.get(slot_of(key)) if key is not None else None
            if target is None:
                in_session = rec.session_id is not None and sessions is not None
                if spill is None or (in_session and store is p._main):
                    continue  # stays: not retiring, or its session's slot is pinned
                if bounded or (
                    spilled
                    and (
                        spilled >= MOVE_BUNDLE_MESSAGES
                        or spilled_bytes + rec.size > MOVE_BUNDLE_BYTES
                    )
                ):
                    bounded = True
                    if not slot_target:
                        break  # spilling alone: nothing further along goes this time
                    continue  # the rest of the walk finds the moving slots' messages
                spilled += 1
                spilled_bytes += rec.size
                target = spill
            going.append((rec, target))
        for rec, target in going:
            _take_out(p, store, rec)
            b = bundle(target)
            b.records.append((store.id, journal.put_payload(rec)))
            seq = rec.sequence_number
            if seq in earlier:  # only a message asked for by number has earlier numbers
                b.aliases[seq] = earlier[seq]
    if bounded:
        assert spill is not None
        bundle(spill).bounded = True
    for message_id, (accepted_at, seq) in p._dedup.items():
        kept = p._dedup_slots.get(message_id)
        slot = dedup_id_slot(message_id) if kept is None else kept
        target = slot_target.get(slot)
        if target is not None:
            bundle(target).dedup.append((message_id, accepted_at, seq, slot))
    if sessions is not None:
        for s in list(sessions.by_id.values()):
            target = slot_target.get(slot_of(s.id))
            if target is None:
                continue
            if s.state is not None:
                bundle(target).sessions.append((s.id, s.state, s.state_updated))
                p._size -= len(s.state)
                p._record(journal.SESSION, p._main, 0, (s.id, None, now))
            sessions.by_id.pop(s.id, None)
            sessions.ready.pop(s.id, None)
    for target in set(slot_target.values()):  # one that gets slots but no messages, too
        bundle(target)
    out: dict[str, tuple[int, Bundle]] = {}
    for target, b in bundles.items():
        move_id = uuid.uuid4().hex
        out[move_id] = (target, b)
        p.outbox[move_id] = (target, b)
        p._record(journal.OUTBOX, p._main, 0, (move_id, target, b))
    return out, frozenset(pinned)


def _take_out(p: Partition, store: Any, rec: MessageRecord) -> None:
    seq = rec.sequence_number
    del store.messages[seq]
    p._size -= rec.size
    if rec.state == SCHEDULED and store is p._main:
        p._scheduled_count -= 1
    p._record(journal.DEL, store, seq)


def adopt(p: Partition, move_id: str, b: Bundle) -> bool:
    """Store a moved-in bundle and serve its slots; False if it was applied before."""
    p._begin(use=False)
    if move_id in p._adopted:
        return False
    for store_id, row in b.records:
        rec = MessageRecord(*row)
        old = rec.sequence_number
        new = p._take_seq()
        # Its enqueued_sequence_number stays its first number: a receiver's peeks leave it
        # out if they covered that one (``raybus.aio._sequence_reads.PeekedRanges``).
        rec.sequence_number = new
        store = p._main if store_id == journal.MAIN else p._dlq
        store.put(new, rec)
        p._size += rec.size
        p._record(journal.PUT, store, new, journal.put_payload(rec))
        if store is p._dlq:
            heapq.heappush(store.available, new)
        elif rec.state == SCHEDULED:
            p._scheduled_count += 1
            heapq.heappush(p._schedule_heap, (rec.enqueued_time, new))
        elif rec.state == ACTIVE:
            p._push_available(store, rec)
            if rec.expires_at != float("inf"):
                heapq.heappush(p._ttl_heap, (rec.expires_at, new))
        if _addressed(store.id, rec):
            for number in (old, *b.aliases.get(old, ())):  # every number it was known by
                p._aliases[number] = new
                p._record(journal.ALIAS, p._main, new, number)
    if b.dedup:
        merged = dict(p._dedup)
        for message_id, accepted_at, seq, slot in b.dedup:
            merged[message_id] = (accepted_at, seq)
            p._dedup_slots[message_id] = slot
            p._record(journal.DEDUP, p._main, seq, (message_id, accepted_at, slot))
        # The window sweep expects the oldest first.
        p._dedup = dict(sorted(merged.items(), key=lambda kv: kv[1][0]))
    if b.sessions and p._sessions is not None:
        for session_id, state, updated in b.sessions:
            s = p._sessions.get(session_id)
            p._size += len(state) - (len(s.state) if s.state is not None else 0)
            s.state, s.state_updated = state, updated
            p._record(journal.SESSION, p._main, 0, (session_id, state, updated))
    if p.owned is not None:
        p.owned = p.owned | b.slots
        p._record(journal.SLOTS, p._main, 0, (p.owned, p.retiring))
    p._adopted.add(move_id)
    p._record(journal.ADOPTED, p._main, 0, move_id)
    return True


def finish(p: Partition, move_id: str) -> None:
    """The target applied the move: forget it, but remember for ``MOVED_OUT_KEEP_S`` where
    its deferred and scheduled messages went (``moved``)."""
    entry = p.outbox.pop(move_id, None)
    if entry is None:
        return
    p._record(journal.OUTBOX_DONE, p._main, 0, move_id)
    now = p._clock.now()
    p.last_move_end = now
    kept = p.moved_out
    while kept and next(iter(kept.values()))[1] < now - MOVED_OUT_KEEP_S:
        del kept[next(iter(kept))]
    target, bundle = entry
    for seq in bundle.addressed:
        kept[seq] = (target, now)


def moved(p: Partition, sequence_numbers: Iterable[int]) -> dict[int, tuple[int, str | None]]:
    """Where the deferred or scheduled messages of these numbers went, of those a partition
    change moved from ``p``: number -> (target partition, the move's id while it is on its
    way, None once the target has it). Numbers it never moved are left out, and so are
    those of a move that ended ``MOVED_OUT_KEEP_S`` before another move ended."""
    wanted = {p.resolve(s): s for s in sequence_numbers}
    out: dict[int, tuple[int, str | None]] = {}
    for move_id, (target, bundle) in p.outbox.items():
        for seq in bundle.addressed & wanted.keys():
            out[wanted[seq]] = (target, move_id)
    for seq, asked in wanted.items():
        done = p.moved_out.get(seq)
        if done is not None and asked not in out:
            out[asked] = (done[0], None)
    return out


def quiet_for(p: Partition) -> float:
    """Seconds since the last move out of ``p`` was confirmed: 0 while one travels, infinity
    if none ever did.

    A peek across the partitions misses a moved message only if the source's peek came after
    the message left and the target's came before it arrived; the move is confirmed after it
    arrived, so it ended after the target's peek and before the source's, inside the peek's
    round trip. A source quiet for longer than that round trip moved nothing the peek missed
    (``raybus.aio._fanout.peek_partitioned``)."""
    if p.outbox:
        return 0.0
    return max(0.0, float(p._clock.now()) - p.last_move_end)


def is_empty(p: Partition) -> bool:
    """A retiring partition may stop: no message, no slot, no session, nothing in transit."""
    p.tick()
    sessions = p._sessions
    return (
        not p._main.messages
        and not p._dlq.messages
        and not p.owned
        and not p.outbox
        and not p.prepared
        and (sessions is None or not any(s.holder or s.state for s in sessions.by_id.values()))
    )
