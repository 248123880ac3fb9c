"""Session bookkeeping of one partition: per-session queues, session locks, session state.

Plain Python, owned by ``raybus._core.partition.Partition`` (which keeps the messages
themselves). A session exists while it has a message, a lock or a state; an unlocked,
stateless session is forgotten when it is found empty (on release, expiry, or when
``accept_next_session`` passes it), so session ids used once cost nothing afterwards.

Ordering: each session keeps its own min-heap of available sequence numbers, so its messages
are handed out strictly in sequence order and an abandoned message (which goes back on the
heap) is the next one served. ``ready`` lists, in the order they became ready, the unlocked
sessions that may have an available message: ``accept_next`` serves the longest-waiting one.
"""

from __future__ import annotations

import heapq

__all__ = ["Session", "SessionTable"]


class Session:
    """One session: its available messages, its lock and its state."""

    __slots__ = ("available", "holder", "id", "locked", "locked_until", "state", "state_updated")

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.available: list[int] = []  # min-heap of sequence numbers; may hold stale ones
        self.holder: str | None = None  # the session lock token
        self.locked_until = 0.0
        self.locked: set[str] = set()  # lock tokens of its messages handed out under the lock
        self.state: bytes | None = None
        self.state_updated = 0.0


class SessionTable:
    """All sessions of one partition."""

    __slots__ = ("by_id", "lock_heap", "ready")

    def __init__(self) -> None:
        self.by_id: dict[str, Session] = {}
        self.ready: dict[str, None] = {}  # ordered set of unlocked sessions with messages
        self.lock_heap: list[tuple[float, str, str]] = []  # (locked_until, session id, token)

    def get(self, session_id: str) -> Session:
        s = self.by_id.get(session_id)
        if s is None:
            s = self.by_id[session_id] = Session(session_id)
        return s

    def push(self, session_id: str, seq: int) -> None:
        """A message of the session became available."""
        s = self.get(session_id)
        heapq.heappush(s.available, seq)
        if s.holder is None:
            self.ready[session_id] = None

    def lock(self, s: Session, token: str, until: float) -> None:
        s.holder = token
        self.extend(s, until)
        self.ready.pop(s.id, None)

    def extend(self, s: Session, until: float) -> None:
        s.locked_until = until
        if s.holder is not None:
            heapq.heappush(self.lock_heap, (until, s.id, s.holder))

    def unlock(self, s: Session) -> None:
        s.holder = None
        s.locked_until = 0.0
        s.locked.clear()
        if s.available:
            self.ready[s.id] = None

    def forget_if_empty(self, s: Session) -> None:
        """Drop a session that has nothing left (call after cleaning its heap)."""
        if s.holder is None and s.state is None and not s.available:
            self.by_id.pop(s.id, None)
            self.ready.pop(s.id, None)

    def next_deadline(self) -> float | None:
        return self.lock_heap[0][0] if self.lock_heap else None
