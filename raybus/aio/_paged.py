"""``AsyncList``: what the asyncio clients' ``list_*`` methods return.

The SDK's asyncio ``list_queues``, ``list_rules``, ``list_queue_sessions`` and their siblings
are plain methods returning an ``AsyncItemPaged``, iterated with ``async for``. raybus's own
code (and its users before this) awaits them for a list. An ``AsyncList`` does both: ``async
for item in admin.list_queues()`` and ``await admin.list_queues()``. The listing is one call
(raybus's registry answers a whole list at once, with no pages), made on first use and kept;
``by_page()`` gives it as one page, as the SDK's pages would be iterated.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any, Generic, ParamSpec, TypeVar

__all__ = ["AsyncList", "listing"]

T = TypeVar("T")


class AsyncList(Generic[T]):
    """A listing to iterate (``async for``) or to await (a ``list``)."""

    def __init__(self, fetch: Callable[[], Awaitable[list[T]]]) -> None:
        self._fetch = fetch
        self._items: list[T] | None = None

    async def _all(self) -> list[T]:
        if self._items is None:
            self._items = await self._fetch()
        return list(self._items)

    def __await__(self) -> Generator[Any, None, list[T]]:
        return self._all().__await__()

    def __aiter__(self) -> AsyncIterator[T]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[T]:
        for item in await self._all():
            yield item

    def by_page(self, continuation_token: str | None = None) -> AsyncIterator[AsyncIterator[T]]:
        """The SDK's ``AsyncItemPaged.by_page()``: the listing's pages, each iterated with
        ``async for``; one page, the whole listing (a ``continuation_token`` gives none)."""
        return self._pages(continuation_token)

    async def _pages(self, continuation_token: str | None) -> AsyncIterator[AsyncIterator[T]]:
        if continuation_token is None:
            yield self._iterate()


P = ParamSpec("P")


def listing(method: Callable[P, Awaitable[list[T]]]) -> Callable[P, AsyncList[T]]:
    """Make an ``async def`` that returns a list a plain method returning an ``AsyncList``
    (as the SDK's asyncio ``list_*`` methods are)."""

    @functools.wraps(method)
    def listed(*args: P.args, **kwargs: P.kwargs) -> AsyncList[T]:
        return AsyncList(lambda: method(*args, **kwargs))

    return listed
