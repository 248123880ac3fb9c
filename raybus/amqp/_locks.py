"""Lock tokens that ``$management`` requests name but this connection did not deliver.

Service Bus names a locked message by its lock token alone: ``renew-lock`` and
``update-disposition`` on ``<entity>/$management`` carry tokens and nothing else (the SDK sends
no sequence number), and they work for a token issued on any connection or link of the entity:
an SDK whose connection was replaced settles and renews what it received before through the
new one, and one process may settle what another received.

raybus's entity-level API for that is ``settle_message_by_lock_token`` /
``renew_message_lock_by_lock_token``, which wants the message's sequence number: its top 16
bits name the partition that holds the lock. So:

* ``LockIndex`` (one per gateway) remembers the sequence number of every token the gateway
  delivered, on any of its connections (bounded: the oldest are forgotten first);
* a token it does not know (delivered by another gateway, or a native raybus receiver) is tried
  on every partition of the entity at once (``by_token``). Lock tokens are unique, so at most
  one partition holds it; the others refuse with ``MessageLockLostError`` having changed
  nothing, and if all refuse, so does the request, with nothing changed.

Session entities are not served this way (``_management`` refuses): a session's messages are
settled by the owner of the session's lock, the receiver link that accepted the session.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..exceptions import MessageLockLostError

__all__ = ["LockIndex", "by_token"]

_T = TypeVar("_T")
_CAPACITY = 65_536  # ~10 MB at most; a token older than this many deliveries has long expired
_PARTITION_SHIFT = 48  # a sequence number's top 16 bits are its partition id


class LockIndex:
    """Lock token -> sequence number of the message it locks, for every delivery of a gateway.

    Bounded: past ``capacity`` tokens the oldest is forgotten (its lock has ended long since,
    or it is found by asking every partition). Used from the gateway's event loop only.
    """

    def __init__(self, capacity: int = _CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, not {capacity}")
        self._capacity = capacity
        self._seqs: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seqs)

    def remember(self, lock_token: str, sequence_number: int) -> None:
        self._seqs[lock_token] = sequence_number
        self._seqs.move_to_end(lock_token)
        if len(self._seqs) > self._capacity:
            self._seqs.popitem(last=False)

    def forget(self, lock_token: str) -> None:
        self._seqs.pop(lock_token, None)

    def sequence_number(self, lock_token: str) -> int | None:
        return self._seqs.get(lock_token)


async def by_token(
    call: Callable[[int | None], Awaitable[_T]],
    sequence_number: int | None,
    partition_ids: tuple[int, ...],
) -> _T:
    """``call(sequence_number)``; with no sequence number, ``call`` for each partition at once
    (a sequence number naming it) and the one answer that is not ``MessageLockLostError``.

    Raises ``MessageLockLostError`` when every partition refused (no partition holds the
    lock, so nothing changed), and any other error a partition raised (the first one).
    """
    if sequence_number is not None:
        return await call(sequence_number)
    if not partition_ids:
        raise MessageLockLostError("the entity has no partition to hold a lock", None, None)
    answers = await asyncio.gather(
        *(call(pid << _PARTITION_SHIFT) for pid in partition_ids), return_exceptions=True
    )
    refusal: BaseException | None = None
    for answer in answers:
        if not isinstance(answer, BaseException):
            return answer
        if refusal is None or isinstance(refusal, MessageLockLostError):
            refusal = answer
    assert refusal is not None
    raise refusal
