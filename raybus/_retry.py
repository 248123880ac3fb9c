"""The client's retry policy: azure-servicebus's ``retry_*`` options and what they repeat.

``ServiceBusClient(..., retry_total=3, retry_backoff_factor=0.8, retry_backoff_max=120,
retry_mode="exponential")`` takes the SDK's options with the SDK's defaults. The n-th retry
waits ``retry_backoff_factor * 2 ** (n - 1)`` seconds (``"fixed"``: ``retry_backoff_factor``
each time), at most ``retry_backoff_max``; a ``ServiceBusServerBusyError`` waits 4 s, as the
SDK's fixed back-off for a busy server, within the same cap. ``retry_total=0`` makes every
call try once.

What is repeated, and where raybus differs from the SDK (which repeats any error whose
``retryable`` is set, sends included, so a send it repeats after a broken connection may be
stored twice):

* Receives and peeks, after ``ServiceBusConnectionError`` (the partition restarting): a
  repeat is harmless.
* Sends, after an error that says nothing was stored: ``StorageUnavailableError`` (the flush
  failed and the partition rolled back) and ``ServiceBusServerBusyError``. After
  ``ServiceBusConnectionError`` (the send may or may not have been stored) only when a repeat
  cannot store a message twice: the entity has duplicate detection on and every message of
  the send has a ``message_id``. Otherwise the error is raised, as before this policy, and
  the caller decides (README, Durability, "Retries").
* Not repeated: ``OperationTimeoutError`` (the call's ``timeout`` bounds the whole call,
  repeats included, as in the SDK); ``MessagingEntityDisabledError`` (an administrator's
  decision, not a transient fault; the SDK repeats it); settlements (a settlement whose
  partition restarted finds its lock gone: repeating it cannot succeed); session receivers'
  accepts (the SDK never repeats those either); transactions (their operations are sent at
  the commit, which has its own rules); the administration client's calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from ._storage.errors import StorageUnavailableError
from .exceptions import (
    InvalidArgumentError,
    ServiceBusConnectionError,
    ServiceBusServerBusyError,
)

__all__ = ["SERVER_BUSY_BACKOFF_S", "RetryMode", "RetryPolicy"]

T = TypeVar("T")

# The SDK's fixed back-off after a busy server (``com.microsoft:server-busy``).
SERVER_BUSY_BACKOFF_S = 4.0

_log = logging.getLogger("raybus.retry")


class RetryMode(str, Enum):
    """How the wait between retries grows (azure-core's ``RetryMode`` values)."""

    EXPONENTIAL = "exponential"
    FIXED = "fixed"


def _number(value: Any, option: str, *, integer: bool = False) -> float:
    """``value`` as a float, if it is a number (an int for ``integer``) >= 0."""
    kinds = int if integer else (int, float)
    number: Any = value
    if isinstance(value, bool) or not isinstance(value, kinds) or not number >= 0:  # NaN too
        what = "a whole number" if integer else "a number"
        raise InvalidArgumentError(f"{option} must be {what} >= 0, not {value!r}", None, option)
    return float(number)


def _mode(value: Any) -> RetryMode:
    raw = getattr(value, "value", value)  # azure-core's RetryMode is an enum of these strings
    if isinstance(raw, str):
        try:
            return RetryMode(raw.lower())
        except ValueError:
            pass
    raise InvalidArgumentError(
        f"retry_mode must be 'exponential' or 'fixed', not {value!r}", None, "retry_mode"
    )


@dataclass(frozen=True)
class RetryPolicy:
    """A client's retry options, checked (module docstring)."""

    total: int = 3
    backoff_factor: float = 0.8
    backoff_max: float = 120.0
    mode: RetryMode = RetryMode.EXPONENTIAL

    @classmethod
    def from_options(
        cls,
        retry_total: Any = 3,
        retry_backoff_factor: Any = 0.8,
        retry_backoff_max: Any = 120,
        retry_mode: Any = RetryMode.EXPONENTIAL,
    ) -> RetryPolicy:
        """The policy of a client's ``retry_*`` options; ``InvalidArgumentError`` naming the
        first bad one."""
        return cls(
            int(_number(retry_total, "retry_total", integer=True)),
            _number(retry_backoff_factor, "retry_backoff_factor"),
            _number(retry_backoff_max, "retry_backoff_max"),
            _mode(retry_mode),
        )

    def delay(self, retry: int, error: BaseException | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first) after ``error``."""
        if isinstance(error, ServiceBusServerBusyError):
            wait = SERVER_BUSY_BACKOFF_S
        elif self.mode is RetryMode.FIXED:
            wait = self.backoff_factor
        else:
            wait = self.backoff_factor * 2.0 ** min(retry - 1, 64)  # past 2**1023: OverflowError
        return min(wait, self.backoff_max)

    async def run(
        self,
        op: Callable[[], Awaitable[T]],
        repeatable: Callable[[BaseException], bool],
        what: str,
    ) -> T:
        """``await op()``, again (up to ``total`` more times, after the policy's waits) while
        it raises an error ``repeatable`` accepts; the last error otherwise."""
        retry = 0
        while True:
            try:
                return await op()
            except Exception as exc:
                if retry >= self.total or not repeatable(exc):
                    raise
                retry += 1
                await asyncio.sleep(self.wait_before(retry, exc, what))

    def wait_before(self, retry: int, error: BaseException, what: str) -> float:
        """``delay(retry, error)``, logged as retry number ``retry`` of ``what``."""
        wait = self.delay(retry, error)
        _log.info("retry %d of %d of %s in %.2f s after: %r", retry, self.total, what, wait, error)
        return wait


def send_repeatable(dedup_safe: bool) -> Callable[[BaseException], bool]:
    """Which errors a send may be repeated after (module docstring): ``dedup_safe`` says a
    repeat cannot store a message twice (duplicate detection, every message with an id)."""

    def repeatable(error: BaseException) -> bool:
        if isinstance(error, StorageUnavailableError | ServiceBusServerBusyError):
            return True
        return dedup_safe and isinstance(error, ServiceBusConnectionError)

    return repeatable
