"""Automatic lock renewal for messages being processed (client-side, as in Azure's SDK)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..exceptions import AutoLockRenewFailed, AutoLockRenewTimeout, InvalidArgumentError
from ..message import ServiceBusReceivedMessage
from ._session import ServiceBusSession

__all__ = ["AutoLockRenewer"]

_log = logging.getLogger("raybus.autolockrenew")

# Renew when this much of the lock is left (Azure's SDK uses 10 s), or half the lock when the
# lock is shorter than 20 s.
RENEW_REMAINING_S = 10.0

FailureCallback = Callable[[Any, BaseException | None], Awaitable[None] | None]


@dataclass
class _Entry:
    receiver: Any
    message: ServiceBusReceivedMessage | ServiceBusSession  # what is renewed
    until: float  # stop renewing at this time
    renew_remaining: float
    callback: FailureCallback | None


def _expiry(r: ServiceBusReceivedMessage | ServiceBusSession) -> float:
    return r._locked_until if isinstance(r, ServiceBusSession) else r._record.locked_until


def _finished(r: ServiceBusReceivedMessage | ServiceBusSession) -> bool:
    """Settled (a message) or released (a session): nothing left to renew."""
    if isinstance(r, ServiceBusSession):
        return r._token is None
    return r._settled


def _seq(r: ServiceBusReceivedMessage | ServiceBusSession) -> Any:
    return r.session_id if isinstance(r, ServiceBusSession) else r.sequence_number


class AutoLockRenewer:
    """Keeps the locks of registered messages alive until they are settled, for up to
    ``max_lock_renewal_duration`` seconds each.

    A failed renewal sets ``message.auto_renew_error`` to ``AutoLockRenewFailed`` and calls
    ``on_lock_renew_failure(message, error)``; reaching the maximum duration sets it to
    ``AutoLockRenewTimeout``. Pass the renewer to ``get_queue_receiver(auto_lock_renewer=...)``
    to register every received message, or call ``register`` yourself.

    ``loop`` is accepted for code written for the SDK, which deprecated it; it must be None
    or an event loop, and is not used: the renewer runs on the loop ``register`` is called
    from.
    """

    def __init__(
        self,
        max_lock_renewal_duration: float = 300,
        on_lock_renew_failure: FailureCallback | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if loop is not None and not isinstance(loop, asyncio.AbstractEventLoop):
            raise InvalidArgumentError(
                f"loop must be an asyncio event loop or None, not {type(loop).__name__}",
                None,
                "loop",
            )
        if (
            isinstance(max_lock_renewal_duration, bool)
            or not isinstance(max_lock_renewal_duration, int | float)
            or max_lock_renewal_duration <= 0
        ):
            raise InvalidArgumentError(
                "max_lock_renewal_duration must be a positive number of seconds",
                None,
                "max_lock_renewal_duration",
            )
        self._max = float(max_lock_renewal_duration)
        self._callback = on_lock_renew_failure
        self._entries: list[_Entry] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def register(
        self,
        receiver: Any,
        renewable: ServiceBusReceivedMessage | ServiceBusSession,
        max_lock_renewal_duration: float | None = None,
        on_lock_renew_failure: FailureCallback | None = None,
    ) -> None:
        """Start renewing ``renewable``'s lock: a message received in PEEK_LOCK mode, or a
        session receiver's ``receiver.session`` (call from the event loop's thread)."""
        if self._closed:
            raise InvalidArgumentError("the renewer is closed", None, "renewer")
        if isinstance(renewable, ServiceBusSession):
            if renewable._token is None:
                raise InvalidArgumentError(
                    "the session is not accepted yet (or already released): open the "
                    "receiver first",
                    renewable._entity,
                    "renewable",
                )
        elif not isinstance(renewable, ServiceBusReceivedMessage) or renewable._kind != "locked":
            raise InvalidArgumentError(
                "only messages received in PEEK_LOCK mode, and sessions, can be renewed",
                None,
                "renewable",
            )
        elif receiver.session is not None:
            raise InvalidArgumentError(
                "a session's messages are locked by the session: register receiver.session",
                receiver.entity_path,
                "renewable",
            )
        now = time.time()
        lock_span = max(0.0, _expiry(renewable) - now)
        duration = self._max if max_lock_renewal_duration is None else max_lock_renewal_duration
        self._entries.append(
            _Entry(
                receiver,
                renewable,
                now + duration,
                min(RENEW_REMAINING_S, lock_span / 2),
                on_lock_renew_failure or self._callback,
            )
        )
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        elif self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        while not self._closed:
            now = time.time()
            keep: list[_Entry] = []
            due: list[_Entry] = []
            for e in self._entries:
                msg = e.message
                if _finished(msg):
                    continue
                if now >= e.until:
                    msg.auto_renew_error = AutoLockRenewTimeout(
                        "max_lock_renewal_duration elapsed; the lock is no longer renewed",
                        msg._entity,
                    )
                    continue
                keep.append(e)
                if _expiry(msg) - now <= e.renew_remaining:
                    due.append(e)
            self._entries = keep
            if due:
                await asyncio.gather(*(self._renew(e) for e in due))
                self._entries = [e for e in self._entries if e.message.auto_renew_error is None]
            next_at = min(
                (min(_expiry(e.message) - e.renew_remaining, e.until) for e in self._entries),
                default=now + 3600,
            )
            assert self._wake is not None
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.01, next_at - time.time()))
            except asyncio.TimeoutError:
                pass

    async def _renew(self, entry: _Entry) -> None:
        try:
            if isinstance(entry.message, ServiceBusSession):
                await entry.message.renew_lock()
            else:
                await entry.receiver._renew(entry.message)
        except Exception as exc:
            if _finished(entry.message):
                return  # settled or released while we renewed: nothing lost
            error = AutoLockRenewFailed(f"lock renewal failed: {exc}", entry.message._entity)
            entry.message.auto_renew_error = error
            _log.warning(
                "%s: lock renewal failed for %s (%s): %s",
                entry.receiver.client_identifier,
                entry.message._entity,
                _seq(entry.message),
                exc,
            )
            if entry.callback is not None:
                result = entry.callback(entry.message, error)
                if asyncio.iscoroutine(result):
                    await result

    async def close(self) -> None:
        """Stop renewing (locks then run out unless settled)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def __aenter__(self) -> AutoLockRenewer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
