"""The blocking ``ProcessorContext`` given to plain-function (sync) processor handlers.

A sync handler runs in a replica's thread pool; the replica's raybus client lives on the
replica actor's event loop. Each method here submits the asyncio context's coroutine to that
loop and blocks the handler's thread until it finishes (``raybus._sync`` does the same for the
sync client, with raybus's own background loop instead of the actor's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from datetime import datetime
from typing import Any, TypeVar

from .aio._context import ProcessorContext as AsyncProcessorContext
from .aio._sender import SendInput
from .aio._sender import ServiceBusSender as AsyncSender
from .message import ServiceBusMessage, ServiceBusReceivedMessage

__all__ = ["ProcessorContext", "ProcessorSender"]

T = TypeVar("T")


def _block(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


class ProcessorSender:
    """A blocking sender on a replica's client (from ``ProcessorContext.get_queue_sender``);
    see ``raybus.aio.ServiceBusSender`` for the guarantees."""

    def __init__(self, inner: AsyncSender, loop: asyncio.AbstractEventLoop) -> None:
        self._aio = inner
        self._loop = loop
        self.entity_path = inner.entity_path

    def send_messages(self, message: SendInput, *, timeout: float | None = None) -> None:
        _block(self._loop, self._aio.send_messages(message, timeout=timeout))

    def schedule_messages(
        self,
        messages: ServiceBusMessage | Iterable[ServiceBusMessage],
        schedule_time_utc: datetime,
        *,
        timeout: float | None = None,
    ) -> list[int]:
        return _block(
            self._loop, self._aio.schedule_messages(messages, schedule_time_utc, timeout=timeout)
        )


class ProcessorContext:
    """The context of one sync handler call: the same methods as
    ``raybus.aio.ProcessorContext``, blocking."""

    def __init__(self, inner: AsyncProcessorContext, loop: asyncio.AbstractEventLoop) -> None:
        self._aio = inner
        self._loop = loop
        self.message: ServiceBusReceivedMessage = inner.message
        self.replica_id: int = inner.replica_id

    @property
    def session_id(self) -> str | None:
        return self._aio.session_id

    def complete_message(self) -> None:
        _block(self._loop, self._aio.complete_message())

    def abandon_message(self, properties_to_modify: dict[str, Any] | None = None) -> None:
        _block(self._loop, self._aio.abandon_message(properties_to_modify))

    def defer_message(self, properties_to_modify: dict[str, Any] | None = None) -> None:
        _block(self._loop, self._aio.defer_message(properties_to_modify))

    def dead_letter_message(
        self,
        reason: str | None = None,
        error_description: str | None = None,
        properties_to_modify: dict[str, Any] | None = None,
    ) -> None:
        _block(
            self._loop,
            self._aio.dead_letter_message(reason, error_description, properties_to_modify),
        )

    def get_session_state(self) -> bytes | None:
        return _block(self._loop, self._aio.get_session_state())

    def set_session_state(self, state: str | bytes | bytearray | None) -> None:
        _block(self._loop, self._aio.set_session_state(state))

    def get_queue_sender(self, queue_name: str) -> ProcessorSender:
        """A blocking sender to ``queue_name`` on the replica's client (do not close it)."""
        sender = self._aio.get_queue_sender(queue_name)
        return ProcessorSender(sender, self._loop)
