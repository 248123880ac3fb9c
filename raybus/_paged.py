"""``ItemList``: what the sync clients' ``list_*`` methods return.

The SDK's sync ``list_queues``, ``list_rules``, ``list_queue_sessions`` and their siblings
return an ``ItemPaged``: iterated item by item, or page by page with ``by_page()``. raybus's
registry answers a whole listing in one call, with no pages, so an ``ItemList`` is that list
(raybus's own code and its users index and count it) with ``by_page()`` giving it as one page.
The asyncio twin is ``raybus.aio._paged.AsyncList``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

__all__ = ["ItemList"]

T = TypeVar("T")


class ItemList(list[T]):
    """A listing: a ``list``, and the SDK's ``ItemPaged.by_page()``."""

    def by_page(self, continuation_token: str | None = None) -> Iterator[Iterator[T]]:
        """The listing's pages, each an iterator of items: one page, the whole listing. A
        ``continuation_token`` (of a page after it) gives none."""
        if continuation_token is not None:
            return iter(())
        return iter((iter(list(self)),))
