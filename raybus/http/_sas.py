"""The gateway's side of access control: the ``Authorization`` header, and one client per token.

The gateway checks only what it can check without the namespace's keys: that the header is a
well-formed ``SharedAccessSignature`` token that has not expired. Whether the signature is good
and the rule's rights cover the request is decided by the broker's actors, which see the token
through a client created with ``credential=SasTokenCredential(token)`` — the same path a Python
client takes, so HTTP and Python callers are held to the same rules.

A request without the header runs with no credential: that is allowed exactly when the
namespace has no authorization rules (an open namespace); otherwise the broker answers
``ServiceBusAuthenticationError`` and the gateway 401.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from ..auth import SasTokenCredential, parse_sas_token
from ..exceptions import ServiceBusAuthenticationError

__all__ = ["ClientCache", "credential_from_header"]

# A header longer than this is not a token (real ones are ~200-400 characters).
MAX_AUTHORIZATION_LENGTH = 4096

T = TypeVar("T")


def credential_from_header(header: str | None, *, now: float | None = None) -> str | None:
    """The SAS token of an ``Authorization`` header, or None when there is no header.

    Raises ``ServiceBusAuthenticationError`` (the gateway's 401) for a header that is not a
    ``SharedAccessSignature`` token, lacks a field, or has expired.
    """
    if header is None or not header.strip():
        return None
    token = header.strip()
    if len(token) > MAX_AUTHORIZATION_LENGTH:
        raise ServiceBusAuthenticationError("the Authorization header is too long", None)
    parsed = parse_sas_token(token)
    if parsed.expiry <= (time.time() if now is None else now):
        raise ServiceBusAuthenticationError(
            f"the SAS token expired at {parsed.expiry} (Unix seconds)", None
        )
    return token


class ClientCache(Generic[T]):
    """Clients keyed by SAS token (``None`` for requests without one), least recently used
    evicted past ``capacity``.

    Why per token: a raybus client presents one credential; reusing it across requests of the
    same caller keeps its routes and coalescers warm (a fresh client pays a registry lookup).
    Bounded because tokens are caller-chosen: a flood of distinct tokens must not grow memory.
    An evicted client holds nothing that needs closing (senders and receivers are per request).

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
        self._clients[token] = creating.result()
        while len(self._clients) > self._capacity:
            self._clients.popitem(last=False)

    def __len__(self) -> int:
        return len(self._clients)
