"""The transaction coordinator: two-phase commit across partitions and entities of a namespace.

One named, detached actor per namespace (``raybus/txn/<namespace>``), restarted forever by Ray.
A commit runs:

1. **Prepare** every participant (partition actor) in parallel; each validates and holds its
   share durably (``raybus._core.transactions``).
2. If any refuses (or cannot be reached), every participant is told to abort and the caller
   gets ``TransactionAbortedError``: nothing took effect.
3. Otherwise the decision is **logged durably** before anyone hears of it, then every
   participant is told to commit. The caller's ``commit`` returns once they all applied it (or,
   if one cannot be reached, once the decision is logged: that one applies it when it asks).
   The mark that all applied it is logged with the next write, not waited for.

Guarantees: a transaction is all-or-nothing. The coordinator answers ``outcome(txn)`` with
``commit`` for a logged decision, ``pending`` while it is deciding, and ``abort`` otherwise
(presumed abort: a decision is only ever logged while the caller's commit is in flight in this
same incarnation, so an unknown transaction can never commit later). A restarted coordinator
re-sends every logged decision that not all participants have acknowledged; participants that
restarted while prepared ask for the outcome themselves.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError

from .. import _failpoints, _rpc
from .._core.access import INTERNAL
from .._core.registry import partition_actor_name
from .._metrics import count_transaction
from ..auth import AccessRights
from ..exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusAuthorizationError,
    TransactionAbortedError,
)
from .access import BROKER_ACTOR_OPTIONS, Guarded, guarded, internal, named_actor
from .changelog import ChangeLog
from .handles import HandleCache
from .self_call import call_self_until_answered

__all__ = ["CoordinatorActor", "CoordinatorCommit", "coordinator_actor", "coordinator_actor_name"]

_log = logging.getLogger("raybus.coordinator")
# Partitions whose handles the coordinator keeps (one more is a GCS lookup, in a thread).
PARTITION_CACHE = 4096

# One participant's share as the client sends it: (partition actor name, entity, sends as wire
# rows — or an object ref to them, passed on untouched and resolved by the participant —, settle
# ops as wire tuples, renews). No handle: the coordinator calls the partition of that name
# through its own cached one (deserialising every participant's handle per commit was most of
# its CPU), so a sender cannot point a share at another actor than the one it names.
Participant = tuple[str, str, list[Any], list[Any], list[str]]


@dataclass(frozen=True, slots=True)
class _Partition:
    """A participant partition as the coordinator calls it: looked up by name once, its
    methods bound to the internal token once (profiled per commit: deserialising every
    participant's handle, wrapping it and its methods were most of the coordinator's CPU)."""

    prepare: Any
    commit: Any
    abort: Any


def coordinator_actor_name(namespace: str) -> str:
    return f"raybus/txn/{namespace}"


class CoordinatorActor(Guarded):
    """Runs two-phase commit; see the module docstring for the guarantees."""

    def __init__(self, namespace: str, storage_path: str | None = None) -> None:
        self._namespace = namespace
        self._log: ChangeLog | None = None
        self._decided: dict[str, list[str]] = {}  # committed, not acknowledged by all
        self._inflight: set[str] = set()
        self._resume: asyncio.Task[None] | None = None
        self.committed = 0
        self.aborted = 0
        # Partition name -> its handle's methods. A partition restarts under the same actor
        # id; an entity re-created gets new names; a partition gone for good is dropped. The
        # least recently used beyond PARTITION_CACHE are dropped too: a deleted entity's names
        # would otherwise stay for as long as the coordinator lives.
        self._partitions: HandleCache[_Partition] = HandleCache(self._look_up, PARTITION_CACHE)
        if storage_path is not None:
            # Only undone decisions matter: a checkpoint of them every 1,000 changes.
            self._log = ChangeLog(
                storage_path,
                namespace,
                "coordinator",
                lambda: [("commit", t, n) for t, n in self._decided.items()],
                every=1000,
            )
            for kind, txn_id, names in self._log.replay():
                if kind == "commit":
                    self._decided[txn_id] = names
                else:
                    self._decided.pop(txn_id, None)
            if self._decided:  # re-send logged decisions without waiting for a client
                actor = ray.get_runtime_context().current_actor
                call_self_until_answered(actor.ping.remote, "coordinator-resume")

    async def _append(self, record: tuple[str, str, list[str]]) -> None:
        if self._log is not None:
            await self._log.append(record)

    def _start_resume(self) -> None:
        if self._decided and (self._resume is None or self._resume.done()):
            self._resume = asyncio.get_running_loop().create_task(self._finish_logged())

    async def _finish_logged(self) -> None:
        """Re-send the decisions logged before a restart until every participant applied."""
        while self._decided:
            for txn_id, names in list(self._decided.items()):
                await self._tell_commit(txn_id, names, None)
            await asyncio.sleep(1.0)

    async def ping(self) -> str:
        self._start_resume()
        return self._namespace

    @guarded(INTERNAL)
    async def outcome(self, txn_id: str) -> str:
        """``commit``, ``pending`` or ``abort`` (presumed: see the module docstring)."""
        self._start_resume()
        if txn_id in self._decided:
            return "commit"
        if txn_id in self._inflight:
            return "pending"
        return "abort"

    async def _authorize(self, auth: Any, participants: list[Participant]) -> None:
        """The caller's token must allow each share: Send for its sends, Listen for its
        settlements and renewals, on the entity it names — and the name must be a partition
        of that entity (not of an entity below it, such as a topic's subscription): a forged
        list must not reach another entity. The broker's own token (the router's) skips the
        checks: one comparison."""
        guard = await self._access_guard()
        if guard.open or guard.is_internal(auth):
            return
        # Per participant, its name if that has the shape of a partition name of its entity.
        shaped: list[str | None] = []
        for name, entity, sends, ops, renews in participants:
            if sends:
                guard.check(auth, AccessRights.SEND, entity)
            if ops or renews:
                guard.check(auth, AccessRights.LISTEN, entity)
            prefix = partition_actor_name(self._namespace, entity, 0, 0).rsplit("/", 2)[0] + "/"
            rest = name[len(prefix) :].split("/") if name.startswith(prefix) else []
            ok = len(rest) == 2 and all(part.isdigit() for part in rest)
            shaped.append(name if ok else None)
        # The lookups of a first commit run together (each may be a GCS round trip).
        names = sorted({n for n in shaped if n is not None})
        found = dict(zip(names, await asyncio.gather(*map(self._partition, names)), strict=True))
        for (name, entity, *_share), own in zip(participants, shaped, strict=True):
            if own is None or found[own] is None:
                raise ServiceBusAuthorizationError(
                    f"participant {name!r} is not a partition of {entity!r}", entity
                )

    async def _partition(self, name: str) -> _Partition | None:
        """Partition ``name`` as this coordinator calls it (None if there is none)."""
        try:
            return await self._partitions.get(name)
        except ValueError:  # no actor of that name
            return None

    async def _look_up(self, name: str) -> _Partition:
        authed = internal(await named_actor(name), self._namespace)
        return _Partition(authed.txn_prepare, authed.txn_commit, authed.txn_abort)

    def _gone(self, name: str, error: object) -> None:
        """Forget a partition whose actor died for good (its name may get a new actor)."""
        if isinstance(error, ActorDiedError):
            self._partitions.forget(name)

    async def commit(
        self, txn_id: str, participants: list[Participant], *, _auth: Any = None
    ) -> None:
        """Commit the transaction atomically, or raise ``TransactionAbortedError``."""
        self._start_resume()
        await self._authorize(_auth, participants)
        if txn_id in self._inflight or txn_id in self._decided:
            raise TransactionAbortedError(
                "this transaction is already being committed", None, txn_id, "duplicate"
            )
        names = [p[0] for p in participants]
        found = await asyncio.gather(*(self._partition(n) for n in names))
        handles = [h for h in found if h is not None]
        if len(handles) < len(found):  # nothing prepared yet: nothing to undo
            entity = participants[found.index(None)][1]
            gone = MessagingEntityNotFoundError("the entity was deleted", entity)
            reason = f"{type(gone).__name__}: {gone}"
            raise TransactionAbortedError(
                f"the transaction was rolled back: {reason}", entity, txn_id, reason, gone
            )
        self._inflight.add(txn_id)
        try:
            results = await asyncio.gather(
                *(
                    h.prepare.remote(txn_id, s, o, r)
                    for h, (_n, _e, s, o, r) in zip(handles, participants, strict=True)
                ),
                return_exceptions=True,
            )
            failed = [
                (p[1], res)
                for p, res in zip(participants, results, strict=True)
                if isinstance(res, BaseException)
            ]
            if failed:
                for name, res in zip(names, results, strict=True):
                    self._gone(name, res)
                await asyncio.gather(
                    *(h.abort.remote(txn_id) for h in handles), return_exceptions=True
                )
                self.aborted += 1
                count_transaction(self._namespace, "aborted")
                entity, error = failed[0]
                cause = _rpc.translate(error, entity)
                reason = f"{type(cause).__name__}: {cause}"
                raise TransactionAbortedError(
                    f"the transaction was rolled back: {reason}", entity, txn_id, reason, cause
                )
            _failpoints.hit("coordinator.before_decision")
            await self._append(("commit", txn_id, names))
            self._decided[txn_id] = names
            _failpoints.hit("coordinator.after_decision")
        finally:
            self._inflight.discard(txn_id)
        self.committed += 1
        count_transaction(self._namespace, "committed")
        await self._tell_commit(txn_id, names, handles)

    async def _tell_commit(
        self, txn_id: str, names: list[str], handles: list[_Partition] | None
    ) -> None:
        """Tell every participant to commit; log the transaction done once all applied it."""

        async def one(name: str, handle: _Partition | None) -> bool:
            try:
                if handle is None:
                    handle = await self._partition(name)
                    if handle is None:
                        raise ValueError(f"no actor named {name!r}")
                await handle.commit.remote(txn_id)
                return True
            except Exception as exc:  # restarting: it asks for the outcome, or we resend
                self._gone(name, exc)
                _log.info("commit of %s on %s not confirmed yet: %s", txn_id, name, exc)
                return False

        found = handles if handles is not None else [None] * len(names)
        done = await asyncio.gather(*(one(n, h) for n, h in zip(names, found, strict=True)))
        if all(done):
            # Not waited for: the caller needs only the participants' answers. Lost in a
            # crash, the decision is replayed and told again; they ignore a transaction
            # that already ended.
            if self._decided.pop(txn_id, None) is not None and self._log is not None:
                self._log.append_soon(("done", txn_id, []))
        else:
            self._start_resume()

    @guarded(AccessRights.MANAGE)
    async def stats(self) -> dict[str, int]:
        return {
            "committed": self.committed,
            "aborted": self.aborted,
            "undone": len(self._decided),
        }


def coordinator_actor(namespace: str, storage_path: str | None = None) -> Any:
    """Find or create the namespace's coordinator (named, detached, restarts forever)."""
    cls = ray.remote(CoordinatorActor)
    return cls.options(
        name=coordinator_actor_name(namespace),
        max_concurrency=1000,
        **BROKER_ACTOR_OPTIONS,
    ).remote(namespace, storage_path)


class CoordinatorCommit:
    """The namespace coordinator's ``commit`` for actors that start transactions (routers,
    forwarders), found or created once per actor: ``coordinator_actor`` is a blocking GCS round
    trip plus class wrapping, which cost more than the rest of a publish when made per call, and
    made on an async actor's event loop it stalls every other call. It runs in a thread, once;
    the coordinator restarts under the same handle (``max_restarts=-1``)."""

    def __init__(self, namespace: str, storage_path: str | None) -> None:
        self._namespace = namespace
        self._storage_path = storage_path
        self._commit: HandleCache[Any] = HandleCache(self._find)

    async def _find(self, namespace: str) -> Any:
        handle = await asyncio.to_thread(coordinator_actor, namespace, self._storage_path)
        return internal(handle, namespace).commit

    async def method(self) -> Any:
        return await self._commit.get(self._namespace)
