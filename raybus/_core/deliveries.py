"""A partition's side of a topic router's one-call delivery (pure, journaled).

A topic publish used to be a two-phase commit on every subscription partition (a prepare and a
commit call, two durable writes each, and the coordinator's decision). The router now logs the
publish once and gives each subscription partition its copies in ONE call, numbered: see
``raybus._core.publish_log`` for the router's side and the protocol's guarantees.

What a partition promises here:

* **At most once.** It keeps, per source (a router's key), the number of the last delivery it
  applied, journaled in the same write as the copies (``journal.DELIVERED``) and kept in
  checkpoints. A delivery whose number is not above that mark is answered without storing
  anything again: the router's retry after a lost answer, or its redelivery after a restart.
  The router sends one source's deliveries to a partition in order, one at a time.
* **Whole or nothing, and never refused for room or settings.** A logged publish must not be
  refused by one subscription after others stored it, so the router checks the copies against
  the subscription's settings and the room this partition last reported before it logs them
  (``room``), and the partition skips the status and quota checks a send makes. Its only
  refusal is ``PartitionMovedError`` (a keyed copy of a slot this partition gave away): then
  nothing is stored and the router places the copies again.
* Duplicate detection applies as for any send.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import journal
from .partition import Partition
from .record import MessageRecord

__all__ = ["deliver", "room"]


def deliver(p: Partition, source: str, number: int, records: Sequence[MessageRecord]) -> bool:
    """Store delivery ``number`` of ``source`` unless it was applied here already (False)."""
    if p.delivered.get(source, -1) >= number:
        return False
    p.send(records, forced=True)
    p.delivered[source] = number
    p._record(journal.DELIVERED, p._main, number, source)
    return True


def room(p: Partition) -> int:
    """Bytes this partition can still take before its quota (prepared transactions' reserved
    bytes count as taken; a delivery may take it below zero, never a send)."""
    return p._props.max_size - p._size - p.reserved
