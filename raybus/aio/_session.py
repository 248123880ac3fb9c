"""The session of a session receiver: accepting it, its lock, and its state.

A session lock is held by one receiver at a time: it covers every message of the session that
is in the queue now or arrives while it is held, and those messages are handed out strictly in
sequence order. Message locks of a session end with the session lock (renew the session, not
the messages). Closing the receiver releases the session at once; its unsettled messages come
again without a delivery counted. An expired session lock counts a delivery for each of them,
as an expired message lock does.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import _rpc
from .._clock import from_timestamp
from ..enums import NEXT_AVAILABLE_SESSION
from ..exceptions import (
    InvalidArgumentError,
    OperationTimeoutError,
    PartitionMovedError,
    ServiceBusError,
    SessionLockLostError,
)
from ._fanout import wait_any

if TYPE_CHECKING:
    from ._receiver import ServiceBusReceiver

__all__ = ["NEXT_AVAILABLE_WAIT_S", "ServiceBusSession"]

# How long accepting NEXT_AVAILABLE_SESSION waits when the receiver has no max_wait_time
# (Service Bus's server-side default).
NEXT_AVAILABLE_WAIT_S = 65.0
_WAIT_SLICE_S = 30.0


def check_session_id(session_id: Any, entity: str) -> str | None:
    """``session_id`` validated: a non-empty str of at most 128 characters, or None for
    ``NEXT_AVAILABLE_SESSION``."""
    if session_id is NEXT_AVAILABLE_SESSION:
        return None
    if not isinstance(session_id, str) or not 0 < len(session_id) <= 128:
        raise InvalidArgumentError(
            f"session_id must be a str of 1-128 characters or NEXT_AVAILABLE_SESSION, not "
            f"{session_id!r}",
            entity,
            "session_id",
        )
    return session_id


class ServiceBusSession:
    """The session a receiver works on (``receiver.session``).

    ``session_id`` is None until a ``NEXT_AVAILABLE_SESSION`` receiver has accepted one (on
    its first operation, or on entering its ``async with``).
    """

    def __init__(self, receiver: ServiceBusReceiver, session_id: str | None) -> None:
        self._receiver = receiver
        self.session_id = session_id
        self._token: str | None = None
        self._pid = 0
        self._locked_until = 0.0
        self._accepting: asyncio.Lock | None = None
        self.auto_renew_error: BaseException | None = None

    @property
    def locked_until_utc(self) -> datetime | None:
        """When the session lock ends, by the broker's clock (None before it is accepted)."""
        return from_timestamp(self._locked_until) if self._token is not None else None

    @property
    def _entity(self) -> str:
        return self._receiver.entity_path

    def _lost(self) -> SessionLockLostError:
        return SessionLockLostError(
            f"the lock on session {self.session_id!r} expired or was released; open a new "
            "session receiver",
            self._entity,
            self.session_id,
        )

    def check_held(self) -> None:
        """Raise ``SessionLockLostError`` if the lock has run out by this process's clock."""
        if self._token is None or self._locked_until <= time.time():
            raise self._lost()

    # ------------------------------------------------------------------ accepting

    async def ensure(self) -> tuple[str, str, int]:
        """Accept the session if not yet done; (session id, lock token, partition id)."""
        if self._token is None:
            if self._accepting is None:
                self._accepting = asyncio.Lock()
            async with self._accepting:
                if self._token is None:
                    conn = self._receiver._conn
                    await conn.retrying(self._entity, self._accept)
        assert self.session_id is not None and self._token is not None
        return self.session_id, self._token, self._pid

    async def _accept(self) -> None:
        conn, entity = self._receiver._conn, self._entity
        deadline = time.monotonic() + 60.0
        while True:
            route = await conn.route(entity)
            if not route.properties.requires_session:
                raise InvalidArgumentError(
                    f"queue {entity!r} does not require sessions: use a receiver without "
                    "session_id",
                    entity,
                    "session_id",
                )
            try:
                if self.session_id is not None:
                    pid = 0 if route.single else route.pmap.owner(self.session_id)
                    token, until = await _rpc.call(
                        entity, route.partitions[pid].accept_session, self.session_id
                    )
                    self._token, self._pid, self._locked_until = token, pid, until
                else:
                    await self._accept_next(route)
                return
            except PartitionMovedError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)
                await conn.route(entity, refresh=True)

    async def _accept_next(self, route: Any) -> None:
        wait = self._receiver.max_wait_time
        wait = NEXT_AVAILABLE_WAIT_S if wait is None else wait
        deadline = time.monotonic() + wait
        entity = self._entity
        parts = route.existing()
        start = self._receiver._next_turn()
        parts = parts[start % len(parts) :] + parts[: start % len(parts)]
        while True:
            for pid, handle in parts:  # without waiting, longest-rotated first
                got = await _rpc.call(entity, handle.accept_next_session, 0.0)
                if got is not None:
                    self.session_id, self._token, self._locked_until = got
                    self._pid = pid
                    return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OperationTimeoutError(f"no session became available within {wait} s", entity)
            if len(parts) == 1:
                pid, handle = parts[0]
                got = await _rpc.call(
                    entity, handle.accept_next_session, min(remaining, _WAIT_SLICE_S)
                )
                if got is not None:
                    self.session_id, self._token, self._locked_until = got
                    self._pid = pid
                    return
                continue
            wait_s = min(remaining, _WAIT_SLICE_S)
            ready = await wait_any(self._receiver, parts, wait_s, False)
            parts = ready + [p for p in parts if p not in ready]

    # ------------------------------------------------------------------ lock and state

    async def _call(self, method: str, *args: Any, timeout: Any = None) -> Any:
        session_id, token, pid = await self.ensure()
        route = await self._receiver._conn.route(self._entity)
        handle = route.handle(pid)
        if handle is None:
            raise self._lost()
        return await _rpc.call(
            self._entity, getattr(handle, method), session_id, token, *args, timeout=timeout
        )

    async def renew_lock(self, *, timeout: Any = None) -> datetime:
        """Extend the session lock by the queue's lock duration; returns the new expiry.
        Raises ``SessionLockLostError`` if it had already ended."""
        self._locked_until = await self._call("renew_session_lock", timeout=timeout)
        expiry = from_timestamp(self._locked_until)
        assert expiry is not None
        return expiry

    async def get_state(self, *, timeout: Any = None) -> bytes | None:
        """The session's state (None when it has none)."""
        state: bytes | None = await self._call("get_session_state", timeout=timeout)
        return state

    async def set_state(
        self, state: str | bytes | bytearray | None, *, timeout: Any = None
    ) -> None:
        """Replace the session's state (str is stored UTF-8 encoded; None clears it). The state
        outlives the session's messages and counts toward the queue's size."""
        if isinstance(state, str):
            state = state.encode("utf-8")
        elif isinstance(state, bytearray | memoryview):
            state = bytes(state)
        elif state is not None and not isinstance(state, bytes):
            raise InvalidArgumentError(
                f"session state must be str, bytes or None, not {type(state).__name__}",
                self._entity,
                "state",
            )
        await self._call("set_session_state", state, timeout=timeout)

    async def release(self) -> None:
        """Give the session up (the receiver is closing); harmless if already lost."""
        if self._token is None or self.session_id is None:
            return
        try:
            await self._call("release_session")
        except ServiceBusError:
            pass  # the lock runs out on its own
        self._token = None
