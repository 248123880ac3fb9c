"""The one place that makes remote calls and turns Ray's errors into raybus's.

Sync and async clients both go through ``call``: the sync API runs the same coroutines on a
background event loop (``raybus._sync``), so they differ only in how they wait.

Error mapping (why each):

* ``RayTaskError`` wrapping a ``ServiceBusError``/``ValueError``: the broker refused the call
  on purpose; re-raise the broker's own exception, unchanged.
* ``ActorDiedError``: the actor is gone for good. Partition and registry actors restart forever
  (``max_restarts=-1``), so a permanent death means the entity was deleted
  (``MessagingEntityNotFoundError``).
* ``ActorUnavailableError`` and other ``RayActorError``: the actor is restarting or its node is
  unreachable; the call may or may not have happened (``ServiceBusConnectionError``, retryable).
* ``GetTimeoutError``/``asyncio.TimeoutError``: ``OperationTimeoutError``, outcome unknown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import ray
from ray import exceptions as rex

from . import _lane
from .exceptions import (
    MessageAlreadySettled,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusConnectionError,
    ServiceBusError,
)

__all__ = ["READ_RETRIES", "ActorGoneError", "actor_gone", "call", "call_sync", "translate"]

# Reads and receives ride out an actor restart (~1 s) by retrying this often.
READ_RETRIES = 5

# Seconds to wait before the n-th repeat of a call (1 for the first) after an error.
Backoff = Callable[[int, BaseException], float]


def _default_backoff(retry: int, error: BaseException) -> float:
    """0.25 s, 0.5 s, 1 s, 2 s, 2 s, ...: raybus's own calls (routes, counts) ride out an
    actor restart of about a second."""
    return min(2.0, 0.25 * 2.0 ** (retry - 1))


_log = logging.getLogger("raybus.rpc")


class ActorGoneError(MessagingEntityNotFoundError):
    """The called actor died for good (``translate`` of Ray's ``ActorDiedError``).

    To a user it is ``MessagingEntityNotFoundError``, as any deleted entity; inside raybus it
    tells a handle to drop (and look up again) from an actor's own "not found" answer, such as
    a namespace asked for a route it does not have. Pickles as its base class does (its
    arguments), so it keeps its type when an actor passes it on to its caller."""


def actor_gone(error: BaseException) -> bool:
    """Whether ``error`` (as ``translate`` made it) says the called actor is gone for good."""
    return isinstance(error, ActorGoneError)


def translate(exc: BaseException, entity: str | None) -> BaseException:
    """The raybus exception to raise for ``exc`` (raised while calling ``entity``'s actor)."""
    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause
        if isinstance(cause, rex.RayError) and not isinstance(cause, rex.RayTaskError):
            # An actor calling another (the registry asking a partition for counts) saw that
            # one restart or vanish: the same meaning as if we had called it ourselves.
            return translate(cause, entity)
        return _raised(cause, entity)
    if isinstance(exc, rex.ActorDiedError):
        return ActorGoneError("the entity was deleted (its actor is gone)", entity)
    if isinstance(exc, rex.RayActorError):
        return ServiceBusConnectionError(f"the broker is unreachable: {exc}", entity)
    if isinstance(exc, rex.GetTimeoutError | asyncio.TimeoutError | TimeoutError):
        return OperationTimeoutError("the operation timed out; its outcome is unknown", entity)
    if isinstance(exc, rex.RaySystemError):
        return ServiceBusConnectionError(f"Ray system error: {exc}", entity)
    return exc


def _raised(cause: BaseException, entity: str | None) -> BaseException:
    """What to raise for an exception the called method raised (over Ray or a lane)."""
    if isinstance(cause, ServiceBusError | MessageAlreadySettled | ValueError | TypeError):
        return cause
    _log.error("internal error in the broker for %s: %r", entity, cause)
    return ServiceBusError(f"internal broker error: {cause!r}", entity)


async def _lane_broken(entity: str | None, handle: Any) -> BaseException:
    """The error for a call whose lane broke under it: Ray's, for the same cause. The actor
    is asked over Ray; gone for good, Ray says so (``ActorGoneError``); restarting or
    answering, the call may or may not have run (``ServiceBusConnectionError``). The lane
    closed itself, and the next call sets up a new one (``raybus._lane``)."""
    try:
        await asyncio.wait_for(asyncio.wrap_future(handle.lane_address.remote().future()), 5.0)
    except (rex.RayError, asyncio.TimeoutError, TimeoutError) as exc:
        error = translate(exc, entity)
        if actor_gone(error):
            return error
    return ServiceBusConnectionError("the broker's connection broke during the call", entity)


def over_lane(method: Any) -> bool:
    """Whether a call of ``method`` (without object references among its arguments) made now
    goes over a lane: calls over one lane reach the actor in the order they were made."""
    return _over_lane(method, ()) is not None


def _over_lane(method: Any, args: tuple[Any, ...]) -> tuple[Any, Any, dict[str, Any]] | None:
    """(lane, actor handle, keyword arguments) to make this call over a lane, or None."""
    token = getattr(method, "_token", None)
    if token is not None:  # an AuthedHandle's method
        method = method._method
    handle = getattr(method, "_actor", None)
    lane = None if handle is None else _lane.find(handle)
    if lane is None or method._method_name not in lane.methods:
        return None
    if any(isinstance(a, ray.ObjectRef) for a in args):  # Ray resolves those
        return None
    return lane, handle, ({} if token is None else {"_auth": token()})


async def call(
    entity: str | None,
    method: Any,
    *args: Any,
    timeout: float | None = None,
    retries: int = 0,
    returns: int = 1,
    backoff: Backoff | None = None,
) -> Any:
    """Call ``method.remote(*args)`` and await its result, translating failures.

    If this raises ``ServiceBusConnectionError`` or ``OperationTimeoutError`` the call may have
    taken effect. ``retries`` repeats the call that many times after a
    ``ServiceBusConnectionError`` (an actor restarting), waiting ``backoff(n, error)`` seconds
    before the n-th repeat (default 0.25 s, 0.5 s, ... up to 2 s; a client's calls pass its
    retry policy's): only for calls whose repetition is harmless (reads, receives).
    ``returns`` > 1 calls a method that returns that many values (``num_returns``) and gives
    them as a list.

    ``timeout`` bounds the whole call, its repeats and the waits between them included, as
    the SDK's operation timeout does: a repeat whose wait would end past it is not made, and
    the last error is raised instead.
    """
    wait = backoff or _default_backoff
    deadline = None if timeout is None else time.monotonic() + timeout
    for attempt in range(retries + 1):
        if deadline is not None:
            timeout = max(0.0, deadline - time.monotonic())
        lane = _over_lane(method, args)
        if lane is not None:
            try:
                value = await asyncio.wait_for(
                    lane[0].call(method._method_name, args, lane[2]), timeout
                )
                return list(value) if returns > 1 else value
            except _lane.LaneBroken:
                error = await _lane_broken(entity, lane[1])
            except (asyncio.TimeoutError, TimeoutError) as exc:
                raise translate(exc, entity) from None
            except Exception as exc:  # raised by the method
                raise _raised(exc, entity) from None
            if attempt == retries or not isinstance(error, ServiceBusConnectionError):
                raise error from None
            await _pause(method, entity, error, wait(attempt + 1, error), deadline)
            continue
        try:
            if returns > 1:
                refs = method.options(num_returns=returns).remote(*args)
                values = asyncio.gather(*(asyncio.wrap_future(r.future()) for r in refs))
                return list(await asyncio.wait_for(values, timeout))
            ref = method.remote(*args)
            if timeout is None:
                return await ref
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)
        except (rex.RayError, asyncio.TimeoutError, TimeoutError) as exc:
            error = translate(exc, entity)
            if attempt == retries or not isinstance(error, ServiceBusConnectionError):
                raise error from None
        await _pause(method, entity, error, wait(attempt + 1, error), deadline)
    raise AssertionError("unreachable")


async def _pause(
    method: Any, entity: str | None, error: ServiceBusError, seconds: float, deadline: float | None
) -> None:
    """Wait before a repeat of ``call``; raise ``error`` instead if the wait would end past
    the call's deadline."""
    if deadline is not None and time.monotonic() + seconds >= deadline:
        raise error from None
    _log.info("retrying %s on %s after: %s", _name(method), entity, error)
    await asyncio.sleep(seconds)


def call_sync(
    entity: str | None,
    method: Any,
    *args: Any,
    timeout: float | None = None,
    retries: int = 0,
    returns: int = 1,
    backoff: Backoff | None = None,
) -> Any:
    """The blocking twin of ``call`` (same retry, ``backoff`` and ``returns`` rules), for the
    sync API's direct paths."""
    wait = backoff or _default_backoff
    for attempt in range(retries + 1):
        try:
            if returns > 1:
                refs = method.options(num_returns=returns).remote(*args)
                return ray.get(refs, timeout=timeout)
            return ray.get(method.remote(*args), timeout=timeout)
        except (rex.RayError, TimeoutError) as exc:
            error = translate(exc, entity)
            if attempt == retries or not isinstance(error, ServiceBusConnectionError):
                raise error from None
            _log.info("retrying %s on %s after: %s", _name(method), entity, error)
        time.sleep(wait(attempt + 1, error))
    raise AssertionError("unreachable")


def _name(method: Any) -> str:
    return str(getattr(method, "_method_name", method))
