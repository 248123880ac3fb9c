"""Actor handles cached by name, for actors that call other named actors.

Looking a named actor up is a GCS round trip (made in a thread, ``access.named_actor``), and
wrapping the handle and binding its methods cost more than the call they serve when made per
call, so actors keep what they made of a handle: the forwarder its namespace actor, routers and
forwarders the coordinator's ``commit``, the coordinator its participant partitions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["HandleCache"]

V = TypeVar("V")


class HandleCache(Generic[V]):
    """What ``lookup(name)`` made of the actor named ``name`` (a handle, a bound method, a
    record of bound methods), kept by name.

    ``get`` looks a name up the first time, and again once it was dropped: past ``size`` names
    the least recently used goes (a deleted entity's names do not stay for the owner's life),
    and the owner ``forget``\\ s a name whose actor it found gone for good (the name may get a
    new actor). Raybus's actors restart under the same handle (``max_restarts=-1``), so a
    handle stays good through restarts and nothing else drops it. A lookup that raises (e.g.
    ``ValueError``: no actor has that name) keeps nothing and raises to the caller. Two tasks
    that ask for a name not kept both look it up; the later answer is kept (both are handles of
    the same actor).
    """

    def __init__(self, lookup: Callable[[str], Awaitable[V]], size: int = 1) -> None:
        if size < 1:
            raise ValueError(f"a handle cache holds at least one name, not {size}")
        self._lookup = lookup
        self._size = size
        self._kept: OrderedDict[str, V] = OrderedDict()

    def __contains__(self, name: object) -> bool:
        return name in self._kept

    async def get(self, name: str) -> V:
        """What was made of actor ``name``: kept, or looked up now (see the class)."""
        if name in self._kept:
            self._kept.move_to_end(name)
            return self._kept[name]
        value = await self._lookup(name)
        self._kept[name] = value
        self._kept.move_to_end(name)  # another task may have kept it meanwhile
        while len(self._kept) > self._size:
            self._kept.popitem(last=False)
        return value

    def forget(self, name: str) -> None:
        """Drop ``name`` (its actor is gone for good): the next ``get`` looks it up again."""
        self._kept.pop(name, None)
