"""``ClientCache``: the gateways' raybus clients, one per SAS token (``raybus.http`` and
``raybus.amqp`` both serve many callers, each with its own credential)."""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from .auth import SasTokenCredential

__all__ = ["ClientCache"]

T = TypeVar("T")


class ClientCache(Generic[T]):
    """Clients keyed by SAS token (``None`` for requests without one), least recently used
    evicted past ``capacity``.

    Why per token: a raybus client presents one credential; reusing it across requests of the
    same caller keeps its routes and coalescers warm (a fresh client pays a registry lookup).
    Bounded because tokens are caller-chosen: a flood of distinct tokens must not grow memory.
    An evicted client holds nothing that needs closing (senders and receivers are closed by
    whoever made them; one still in use keeps its client alive).

    Why ``factory`` runs in a worker thread: creating a client looks the namespace actor up
    through Ray's GCS, a blocking call that would stall every request the replica's event
    loop serves. Concurrent first requests with one token share one creation (and its error,
    which is not cached: the next request tries again).
    """

    def __init__(self, factory: Callable[[SasTokenCredential | None], T], capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._factory = factory
        self._capacity = capacity
        self._clients: OrderedDict[str | None, T] = OrderedDict()
        self._creating: dict[str | None, asyncio.Future[T]] = {}

    async def get(self, token: str | None) -> T:
        client = self._clients.get(token)
        if client is not None:
            self._clients.move_to_end(token)
            return client
        creating = self._creating.get(token)
        if creating is None:
            credential = None if token is None else SasTokenCredential(token)
            creating = asyncio.ensure_future(asyncio.to_thread(self._factory, credential))
            self._creating[token] = creating
            creating.add_done_callback(functools.partial(self._created, token))
        # Shielded: a request that goes away must not cancel the creation others wait for.
        return await asyncio.shield(creating)

    def _created(self, token: str | None, creating: asyncio.Future[T]) -> None:
        # Runs before any waiter resumes, so they all find the client cached.
        del self._creating[token]
        if creating.cancelled() or creating.exception() is not None:
            return
        self.add(token, creating.result())

    def __len__(self) -> int:
        return len(self._clients)

    def add(self, token: str | None, client: T) -> None:
        """Cache a client made elsewhere (e.g. while nothing is served yet)."""
        self._clients[token] = client
        self._clients.move_to_end(token)
        while len(self._clients) > self._capacity:
            self._clients.popitem(last=False)

    def __contains__(self, token: object) -> bool:
        return token in self._clients

    def discard_where(self, stale: Callable[[str | None], bool]) -> None:
        """Drop the clients whose token ``stale`` says is no longer worth keeping."""
        for token in [t for t in self._clients if stale(t)]:
            del self._clients[token]
