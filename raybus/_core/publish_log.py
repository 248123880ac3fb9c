"""The topic router's publish log: one durable write per publish instead of a two-phase commit.

A publish to several subscription partitions used to be a two-phase commit: a prepare and a
commit call on every partition (two durable writes each) and the coordinator's logged decision.
The router (``raybus._actors.router``) now, when it can:

1. checks every partition's copies against that subscription's settings and the room the
   partition last reported (``fits``); if one does not pass it uses the two-phase commit, which
   refuses the publish as a send would (a full subscription, a disabled one, ...);
2. numbers the publish and logs it durably with every partition's copies (``begin``): one
   write, by partition actor name;
3. gives each partition its copies in one call carrying (``source``, number); a partition
   applies a number at most once (``raybus._core.deliveries``) and answers its room;
4. answers the publishers once every partition applied it (``acked``), and logs the publish
   done without waiting (``done``).

After a restart the router replays the log and delivers every publish not logged done again,
to the same partition names, before anything new: partitions that applied it skip it. It never
starts a publish while an earlier one is undelivered, so a partition sees one source's numbers
in order: a new publish first delivers the earlier ones, or is refused with nothing stored
(``ServiceBusServerBusyError``) while a partition does not take them. A partition that
refuses because it gave a slot away (``PartitionMovedError``) has stored none of its copies:
they are placed again under the new partition map and logged as a new publish in the same
write that takes them out of the old one (``redo``).

Guarantees: a publish the router logged reaches every subscription that existed, exactly once
per partition, even across crashes of the router or of partitions; one it did not log reached
none. A subscription deleted meanwhile gets nothing. Numbers never repeat for a ``source``: the
source key is drawn afresh whenever a log starts empty, so a lost log cannot make partitions
skip new publishes as old ones.

Only publishes to partitions of subscriptions with one partition take this path (checked by the
router): a partition that gave slots away can then hold none of a publish's copies it refused.

Deviation: the quota is checked against the room each partition reported on its last answer.
Transactions and forwarding entities that send to the topic (they deliver to the subscriptions
themselves, through the coordinator) are not counted until then, so a subscription can end
above its quota by up to one publish.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PublishLog", "Share"]

# (subscription path, copies as ``raybus._core.wire.pack_rows`` pieces), per partition actor
# name: the copies are pickled once, for the log and for the calls.
Share = tuple[str, list[Any]]


@dataclass
class PublishLog:
    """The router's numbering, undelivered publishes and known rooms (pure; the actor logs the
    changes these methods return, in the order returned)."""

    source: str = ""
    next_number: int = 0
    pending: dict[int, dict[str, Share]] = field(default_factory=dict)
    rooms: dict[str, int] = field(default_factory=dict)

    @classmethod
    def replayed(cls, changes: Iterable[tuple[Any, ...]], prefix: str) -> tuple[PublishLog, Any]:
        """The state a logged history leaves, and the change to log first (a fresh source key
        when the history is empty; else None)."""
        log = cls()
        for change in changes:
            kind = change[0]
            if kind == "source":
                log.source = change[1]
            elif kind == "next":
                log.next_number = max(log.next_number, change[1])
            elif kind == "pub":
                _k, number, shares = change
                log.pending[number] = dict(shares)
                log.next_number = max(log.next_number, number + 1)
            elif kind == "redo":
                _k, old, name, number, shares = change
                log._drop(old, name)
                log.pending[number] = dict(shares)
                log.next_number = max(log.next_number, number + 1)
            elif kind == "done":
                log.pending.pop(change[1], None)
        if log.source:
            return log, None
        log.source = f"{prefix}#{uuid.uuid4().hex}"
        return log, ("source", log.source)

    def snapshot(self) -> list[tuple[Any, ...]]:
        """The state as changes (a checkpoint)."""
        out: list[tuple[Any, ...]] = [("source", self.source), ("next", self.next_number)]
        out += [("pub", n, shares) for n, shares in sorted(self.pending.items())]
        return out

    # ------------------------------------------------------------------ room

    def fits(self, name: str, size: int) -> bool | None:
        """Whether ``size`` more bytes fit partition ``name`` (None: its room is unknown)."""
        room = self.rooms.get(name)
        return None if room is None else size <= room

    def forget_rooms(self) -> None:
        """Settings changed (a subscription's size, say): ask the partitions again."""
        self.rooms.clear()

    # ------------------------------------------------------------------ publishes

    def begin(self, shares: dict[str, Share], sizes: dict[str, int]) -> tuple[int, Any]:
        """Number a publish (``sizes``: its bytes per partition, taken from the known room at
        once); the change to log durably before delivering it."""
        if self.pending:
            raise RuntimeError("a publish is still undelivered")
        if not shares:
            raise ValueError("a publish goes to at least one partition")
        number = self.next_number
        self.next_number += 1
        self.pending[number] = dict(shares)
        for name, size in sizes.items():
            if name in self.rooms:
                self.rooms[name] -= size
        return number, ("pub", number, shares)

    def abandon(self, number: int) -> None:
        """The publish was not logged (its write failed): it never happened."""
        self.pending.pop(number, None)
        self.rooms.clear()

    def acked(self, number: int, name: str, room: int | None) -> Any:
        """Partition ``name`` applied publish ``number`` (or is gone: ``room`` None); the
        change to log (without waiting) once no partition is left, else None."""
        if room is None:
            self.rooms.pop(name, None)
        else:
            self.rooms[name] = room
        return self._drop(number, name)

    def redo(self, number: int, name: str, shares: dict[str, Share]) -> tuple[int, Any]:
        """Partition ``name`` refused its share of ``number`` (it gave a slot away): the
        share's copies, placed again as ``shares``, become a new publish. The change to log
        durably before delivering it."""
        new = self.next_number
        self.next_number += 1
        self.pending[new] = dict(shares)
        self._drop(number, name)
        return new, ("redo", number, name, new, shares)

    def undo_redo(self, number: int, name: str, share: Share, new: int) -> None:
        """The ``redo`` change was not logged: the state must match the log again. The refused
        share is due again under ``number``; ``new`` never happened (its number stays used)."""
        self.pending.pop(new, None)
        self.pending.setdefault(number, {})[name] = share

    def _drop(self, number: int, name: str) -> Any:
        shares = self.pending.get(number)
        if shares is None:
            return None
        shares.pop(name, None)
        if shares:
            return None
        del self.pending[number]
        return ("done", number)
