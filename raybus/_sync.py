"""Runs the asyncio implementation for the sync API on one background event loop per process.

raybus writes every client operation once, as a coroutine (``raybus.aio``). The sync classes
submit those coroutines to a daemon thread's event loop and wait for the result, so both APIs
share batching, settlement and error handling. Calling a sync raybus method from inside that
loop's own thread would deadlock; it is only reachable from raybus callbacks, which the docs
say must not call the sync API.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["loop", "run", "submit"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _get_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    if _loop is not None and _loop.is_running():
        return _loop
    with _lock:
        if _loop is None or not _loop.is_running():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def _main() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            thread = threading.Thread(target=_main, name="raybus-sync-loop", daemon=True)
            thread.start()
            started.wait()
            _loop, _thread = loop, thread
    return _loop


def loop() -> asyncio.AbstractEventLoop:
    """The background loop (started on first use)."""
    return _get_loop()


def submit(coro: Coroutine[Any, Any, T]) -> Future[T]:
    """Start ``coro`` on the background loop; return a concurrent future of its result."""
    return asyncio.run_coroutine_threadsafe(coro, _get_loop())


def run(coro: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
    """Run ``coro`` (or another awaitable, such as an ``AsyncList``) on the background loop
    and block until it finishes."""
    if threading.current_thread() is _thread:
        raise RuntimeError("the sync raybus API cannot be called from raybus's own loop")
    work = coro if asyncio.iscoroutine(coro) else _awaited(coro)
    result: T = submit(work).result()
    return result


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
