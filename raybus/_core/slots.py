"""Partition maps: which partition serves which partition key, versioned so it can change.

A partitioned entity hashes each message's partition key (as in Service Bus: ``session_id``,
else ``partition_key``, else ``message_id`` when duplicate detection is on) onto one of
``SLOTS`` slots, and the map assigns every slot to one partition. Messages without a key go
to any *live* partition (the sender spreads them by load). Changing the partition count
moves whole slots from one partition to another, never splits one, so everything that must
stay together (a session's messages and state, the duplicate-detection ids of a key) moves
together.

A map is an immutable snapshot with a ``version``; the namespace actor owns the current one
and every partition knows which slots it owns, so a sender holding an old map is told to
refresh (``PartitionMovedError``) rather than served by the wrong partition.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from .record import MessageRecord

__all__ = ["SLOTS", "PartitionMap", "dedup_slot", "partition_key", "slot_of"]

SLOTS = 1024  # a power of two; at least 16 slots per partition at the 64-partition maximum


_SLOT_SHIFT = 32 - (SLOTS.bit_length() - 1)


def slot_of(key: str) -> int:
    """The slot of a partition key (stable across processes and Python versions).

    CRC-32's low bits barely differ between similar keys ("s1", "s2", ...), so the CRC is
    mixed by Fibonacci hashing and the slot taken from the top bits.
    """
    crc = zlib.crc32(key.encode("utf-8", "surrogatepass"))
    return ((crc * 0x9E3779B1) & 0xFFFFFFFF) >> _SLOT_SHIFT


def partition_key(rec: MessageRecord, dedup: bool) -> str | None:
    """The key that places ``rec``: session id, partition key, or (with duplicate detection)
    message id; None when the message may go to any partition."""
    if rec.session_id is not None:
        return rec.session_id
    if rec.partition_key is not None:
        return rec.partition_key
    if dedup:
        return rec.message_id
    return None


# What duplicate detection keys a message on: its message id, or (message id, key), or for
# a topic's copy made by a rule's action (RULE_COPY, rule name, the message's own id).
DedupId = str | tuple[Any, ...]
RULE_COPY = "rule-copy"


def dedup_id(rec: MessageRecord) -> DedupId | None:
    """The id duplicate detection keys ``rec`` on (None: no message id, never a duplicate):
    its message id with the key that places it, its session id or partition key, when it has
    one. Service Bus keys a partitioned entity's duplicates on MessageId + PartitionKey (the
    session id is the partition key when set); raybus's partition count may change at run
    time, so it keys every entity's so, and a message id sent with different keys is a
    different message wherever the keys land (keyed on the id alone, those that landed in the
    same partition were dropped and the others kept).

    A topic's copy made by a rule's action is keyed on the rule and the published message's
    id (``copy_of``, set by ``raybus._core.fanout.plan``): each matching rule with an action
    gives its own copy, so two rules' copies are not duplicates of each other, and an action
    that changes the message id does not make copies of different messages duplicates."""
    if rec.copy_of is not None:
        return cast(DedupId, rec.copy_of)
    mid = rec.message_id
    if mid is None:
        return None
    key = rec.session_id if rec.session_id is not None else rec.partition_key
    return mid if key is None else (mid, key)


def rule_copy_id(rec: MessageRecord, rule_name: str | None) -> DedupId | None:
    """The ``copy_of`` of rule ``rule_name``'s copy of the published ``rec``."""
    own = dedup_id(rec)
    return None if own is None else (RULE_COPY, rule_name or "", own)


def dedup_id_slot(ident: DedupId) -> int:
    """The slot of a duplicate-detection id whose slot was not recorded: that of its key."""
    if isinstance(ident, str):
        return slot_of(ident)
    if len(ident) == 3:  # a rule's copy: its message's
        return dedup_id_slot(ident[2])
    return slot_of(ident[1])


def dedup_slot(rec: MessageRecord) -> int:
    """The slot a duplicate-detection id is kept under: that of the message's key (not of its
    id), so the id moves with that slot when the partition count changes, even from a single
    partition."""
    return slot_of(partition_key(rec, True) or rec.message_id or "")


@dataclass(frozen=True)
class PartitionMap:
    """One version of an entity's partitioning.

    ``slots[i]`` is the partition that owns slot ``i``. ``live`` partitions take new messages;
    ``retiring`` ones (being removed by a scale-down) take none but are still received from
    until their messages have moved away. Partition ids are never reused within one entity
    incarnation, so a sequence number's partition id (its top 16 bits) is unambiguous.
    """

    version: int
    slots: tuple[int, ...]
    live: tuple[int, ...]
    retiring: tuple[int, ...] = ()

    @classmethod
    def initial(cls, count: int) -> PartitionMap:
        """``count`` partitions (ids 0..count-1), each owning a contiguous run of slots."""
        return cls(1, tuple(s * count // SLOTS for s in range(SLOTS)), tuple(range(count)))

    @property
    def partition_ids(self) -> tuple[int, ...]:
        """Every partition that exists (live, then retiring)."""
        return self.live + self.retiring

    @property
    def next_id(self) -> int:
        return max(self.partition_ids, default=-1) + 1

    def owner(self, key: str) -> int:
        return self.slots[slot_of(key)]

    def place(
        self, records: Sequence[MessageRecord], dedup: bool, spread: Callable[[], int]
    ) -> dict[int, list[int]]:
        """Indexes of ``records`` per partition: keyed ones by their slot's owner, unkeyed ones
        all to the one partition ``spread()`` picks (asked once, only if there are any). The
        one placement rule of senders, routers, forwarders and transactions."""
        groups: dict[int, list[int]] = {}
        spread_pid: int | None = None
        for i, rec in enumerate(records):
            key = partition_key(rec, dedup)
            if key is not None:
                pid = self.owner(key)
            else:
                if spread_pid is None:
                    spread_pid = spread()
                pid = spread_pid
            groups.setdefault(pid, []).append(i)
        return groups

    def owned_by(self, partition_id: int) -> frozenset[int]:
        return frozenset(s for s, p in enumerate(self.slots) if p == partition_id)

    def balanced(self, live: Iterable[int]) -> tuple[int, ...]:
        """A slot assignment spreading the slots evenly over ``live`` (counts differing by
        at most one) with the fewest moves: every partition keeps its slots up to ``base``
        (``SLOTS // len(live)``); the ``SLOTS % len(live)`` partitions allowed one more are
        first those that already hold more; the freed and orphaned slots fill the rest.
        An evenly spread map is returned unchanged."""
        targets = sorted(set(live))
        if not targets:
            raise ValueError("a map needs at least one live partition")
        base, extra = divmod(SLOTS, len(targets))
        own: dict[int, list[int]] = {p: [] for p in targets}
        pool: list[int] = []
        for s, p in enumerate(self.slots):
            own.get(p, pool).append(s)
        keep: dict[int, list[int]] = {}
        for p in targets:
            mine = own[p]
            keep[p] = mine[: base + 1] if extra and len(mine) > base else mine[:base]
            if len(keep[p]) > base:
                extra -= 1
            pool.extend(mine[len(keep[p]) :])
        pool.sort()
        it = iter(pool)
        for p in targets:
            while len(keep[p]) < base:
                keep[p].append(next(it))
        for p in targets:
            if extra and len(keep[p]) == base:
                keep[p].append(next(it))
                extra -= 1
        out = list(self.slots)
        for p, slots in keep.items():
            for s in slots:
                out[s] = p
        return tuple(out)
