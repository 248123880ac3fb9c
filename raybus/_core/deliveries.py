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
from typing import TYPE_CHECKING, Any

from . import journal
from .record import MessageRecord

if TYPE_CHECKING:
    from .._models import QueueProperties
    from .store import Store

__all__ = ["DeliveryOps"]


class DeliveryOps:
    """Delivery methods of ``Partition`` (see the module docstring)."""

    if TYPE_CHECKING:
        delivered: dict[str, int]
        reserved: int
        _props: QueueProperties
        _size: int
        _main: Store

        def send(self, records: Sequence[MessageRecord], *, forced: bool = False) -> list[int]: ...

        def _record(self, op: int, store: Store, seq: int, payload: Any = None) -> None: ...

    def deliver(self, source: str, number: int, records: Sequence[MessageRecord]) -> bool:
        """Store delivery ``number`` of ``source`` unless it was applied here already (False)."""
        if self.delivered.get(source, -1) >= number:
            return False
        self.send(records, forced=True)
        self.delivered[source] = number
        self._record(journal.DELIVERED, self._main, number, source)
        return True

    def room(self) -> int:
        """Bytes this partition can still take before its quota (prepared transactions'
        reserved bytes count as taken; a delivery may take it below zero, never a send)."""
        return self._props.max_size - self._size - self.reserved
