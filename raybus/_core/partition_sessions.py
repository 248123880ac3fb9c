"""The session operations of ``Partition`` (accept, renew, release, state, listing).

Kept in their own module for size; they are methods of ``Partition`` (a mixin) and share its
state. The bookkeeping of sessions themselves is ``raybus._core.sessions``.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from .._models import QueueProperties
from ..exceptions import (
    InvalidArgumentError,
    MessageSizeExceededError,
    PartitionMovedError,
    ServiceBusQuotaExceededError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from . import journal
from .record import MessageRecord
from .sessions import Session, SessionTable
from .slots import slot_of
from .store import LockTokens, Store

__all__ = ["SessionOps"]


class SessionOps:
    """Session methods of ``Partition``."""

    if TYPE_CHECKING:
        _sessions: SessionTable | None
        _props: QueueProperties
        _tokens: LockTokens
        _main: Store
        _locks: dict[str, tuple[Store, int]]
        _lock_heap: list[tuple[float, str]]
        _size: int
        entity: str
        visible_seq: int | None
        owned: frozenset[int] | None
        pinned: dict[str, str]

        def _begin(self, *, use: bool = True) -> float: ...
        def _check_receive(self) -> None: ...
        def _record(self, op: int, store: Store, seq: int, payload: Any = None) -> None: ...
        def _redeliver(
            self, store: Store, rec: MessageRecord, now: float, *, count: bool = True
        ) -> bool: ...

    def _check_session_owned(self, session_id: str) -> None:
        if self.owned is not None and slot_of(session_id) not in self.owned:
            raise PartitionMovedError(
                f"session {session_id!r} has moved to another partition", self.entity
            )

    def _held_session(self, session: tuple[str, str] | None) -> Session:
        """The session that ``session`` (id, lock token) holds; raises if it does not."""
        if self._sessions is None:
            raise InvalidArgumentError(
                "the queue does not require sessions: receive without a session",
                self.entity,
                "session_id",
            )
        if session is None:
            raise InvalidArgumentError(
                "the queue requires sessions: accept a session to receive from it",
                self.entity,
                "session_id",
            )
        session_id, token = session
        s = self._sessions.by_id.get(session_id)
        if s is None or s.holder != token:
            raise SessionLockLostError(
                f"the lock on session {session_id!r} was lost: it expired or was released",
                self.entity,
                session_id,
            )
        return s

    def accept_session(self, session_id: str) -> tuple[str, float]:
        """Lock ``session_id`` (which need not have messages yet) for the entity's lock
        duration; returns (session lock token, locked until). Raises
        ``SessionCannotBeLockedError`` while another receiver holds it."""
        now = self._begin()
        self._check_receive()
        sessions = self._require_sessions()
        if not isinstance(session_id, str) or not session_id:
            raise InvalidArgumentError(
                f"session_id must be a non-empty str, not {session_id!r}", self.entity, "session_id"
            )
        self._check_session_owned(session_id)
        s = sessions.by_id.get(session_id)
        if s is not None and s.holder is not None:
            raise SessionCannotBeLockedError(
                f"session {session_id!r} is locked by another receiver until {s.locked_until:.3f}",
                self.entity,
                session_id,
            )
        s = sessions.get(session_id)
        token = self._tokens.next()
        sessions.lock(s, token, now + self._props.lock_duration_s)
        return token, s.locked_until

    def accept_next_session(self) -> tuple[str, str, float] | None:
        """Lock the unlocked session that has waited longest with an available message;
        (session id, token, locked until), or None when there is none."""
        now = self._begin()
        self._check_receive()
        sessions = self._require_sessions()
        for session_id in list(sessions.ready):
            if self._session_head_visible(session_id):
                s = sessions.by_id[session_id]
                token = self._tokens.next()
                sessions.lock(s, token, now + self._props.lock_duration_s)
                return session_id, token, s.locked_until
        return None

    def _session_head_visible(self, session_id: str) -> bool:
        """Whether a ready session's first message can be received now; drops sessions
        that turn out to have none."""
        sessions = self._sessions
        assert sessions is not None
        s = sessions.by_id.get(session_id)
        if s is None or s.holder is not None:
            sessions.ready.pop(session_id, None)
            return False
        heap, main = s.available, self._main
        while heap and not main.is_available(heap[0]):
            heapq.heappop(heap)
        if not heap:
            sessions.ready.pop(session_id, None)
            sessions.forget_if_empty(s)
            return False
        return self.visible_seq is None or heap[0] <= self.visible_seq

    def renew_session_lock(self, session_id: str, token: str) -> float:
        """Extend the session lock (and so its messages' locks); returns the new expiry."""
        now = self._begin()
        self._check_receive()
        s = self._held_session((session_id, token))
        assert self._sessions is not None
        self._sessions.extend(s, now + self._props.lock_duration_s)
        for msg_token in s.locked:
            store, seq = self._locks[msg_token]
            store.messages[seq].locked_until = s.locked_until
        return s.locked_until

    def release_session(self, session_id: str, token: str) -> bool:
        """Give the session up (a receiver closing): its locked messages are available again
        without a delivery counted. Returns False when the lock was already gone."""
        now = self._begin()
        sessions = self._require_sessions()
        s = sessions.by_id.get(session_id)
        if s is None or s.holder != token:
            return False
        self._release_session(s, now, count=False)
        return True

    def _release_session(self, s: Session, now: float, *, count: bool) -> None:
        """End a session lock: unlock its messages (counting a delivery when the lock
        expired, as for an expired message lock), in sequence order."""
        sessions = self._sessions
        assert sessions is not None
        # Messages a prepared transaction holds stay locked until it ends.
        tokens = sorted(
            (t for t in s.locked if t not in self.pinned), key=lambda t: self._locks[t][1]
        )
        for msg_token in s.locked:
            if msg_token in self.pinned:  # expires on its own once the transaction ends
                store, seq = self._locks[msg_token]
                until = store.messages[seq].locked_until
                heapq.heappush(self._lock_heap, (until, msg_token))
        sessions.unlock(s)
        for msg_token in tokens:
            store, seq = self._locks.pop(msg_token)
            rec = store.messages[seq]
            rec.lock_token, rec.locked_until = None, 0.0
            self._redeliver(store, rec, now, count=count)
        self._session_head_visible(s.id)  # forgets it if nothing is left

    def get_session_state(self, session_id: str, token: str) -> bytes | None:
        self._begin()
        return self._held_session((session_id, token)).state

    def set_session_state(self, session_id: str, token: str, state: bytes | None) -> None:
        """Replace the session's state (None clears it). It counts toward the queue's size."""
        now = self._begin()
        self._check_receive()
        s = self._held_session((session_id, token))
        if state is not None and not isinstance(state, bytes):
            raise InvalidArgumentError(
                f"session state must be bytes or None, not {type(state).__name__}",
                self.entity,
                "state",
            )
        new = len(state) if state is not None else 0
        limit = self._props.max_message_size
        if new > limit:
            raise MessageSizeExceededError(
                f"session state of {new} bytes exceeds the queue's limit of {limit} bytes",
                self.entity,
                new,
                limit,
            )
        delta = new - (len(s.state) if s.state is not None else 0)
        if delta > 0 and self._size + delta > self._props.max_size:
            raise ServiceBusQuotaExceededError(
                f"the queue holds {self._size} bytes; a session state {delta} bytes larger "
                "would exceed its size limit",
                self.entity,
                self._size + delta,
                self._props.max_size,
            )
        self._size += delta
        s.state, s.state_updated = state, now
        self._record(journal.SESSION, self._main, 0, (session_id, state, now))

    def list_sessions(self, updated_after: float | None = None) -> list[str]:
        """Ids of the sessions that hold messages or state; with ``updated_after``, only
        those whose state was set after that time (epoch seconds)."""
        self._begin()
        sessions = self._require_sessions()
        with_state = {
            sid: s.state_updated for sid, s in sessions.by_id.items() if s.state is not None
        }
        if updated_after is not None:
            return sorted(sid for sid, at in with_state.items() if at > updated_after)
        ids = set(with_state)
        ids.update(r.session_id for r in self._main.messages.values() if r.session_id)
        return sorted(ids)

    def _require_sessions(self) -> SessionTable:
        if self._sessions is None:
            raise InvalidArgumentError(
                "the queue does not require sessions; session operations need "
                "requires_session=True",
                self.entity,
                "session_id",
            )
        return self._sessions
