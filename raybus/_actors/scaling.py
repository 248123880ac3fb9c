"""Changing an entity's partition count while it runs, and the autoscaling policy.

The namespace actor owns one ``Scaler``. For every entity whose partitions do not match its
``partition_count`` it runs a reconcile loop, one step at a time, each step ending with a new
version of the partition map written durably to the registry:

* **Grow**: create the new partition actors (serving no slot yet) and add them to the map's
  ``live`` list, so senders spread unkeyed messages over them at once.
* **Shrink**: move the highest partition ids from ``live`` to ``retiring``; they take no new
  unkeyed message from then on (senders holding the old map are redirected).
* **Move**: every partition whose slots differ from the balanced assignment hands the extra
  slots over (``raybus._core.migration``); a retiring partition also evacuates its other
  messages, a bounded bundle per step, and the next step follows at once while it has more.
  Slots pinned by a locked session stay and are retried on the next step.
* **Remove**: a retiring partition that is empty (nothing left, nothing locked, nothing in
  transit) leaves the map; then its actor is stopped and its storage deleted.

Each step runs holding the entity's lock (``Scaler.holding``). The namespace holds it too to
read the entity's counts and to tell its partitions new settings: held, the partitions are the
ones the route names (none is removed under the call) and no bundle is between a source and its
target (counts would miss it or count it twice).

Guarantees: no accepted message is lost or stored twice by a change (moves go through the
source's durable outbox and are applied at most once by the target); a session moves only
while no receiver holds it; duplicate-detection ids move with their slot. If the namespace
actor restarts mid-change, the loop resumes from the last map it logged (partitions keep their
own durable view of what they serve and what is in transit).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from typing import TYPE_CHECKING

import ray

from .._core.registry import EntityEntry, partition_actor_name, partition_storage_dirs
from .._core.slots import PartitionMap
from .._storage import open_storage
from ..exceptions import MessagingEntityNotFoundError
from .partition import partition_actor

if TYPE_CHECKING:
    from .namespace import NamespaceActor

__all__ = ["AUTOSCALE_INTERVAL_S", "Scaler"]

_log = logging.getLogger("raybus.scaling")

AUTOSCALE_INTERVAL_S = 2.0  # how often the policy looks at backlogs
SCALE_DOWN_READINGS = 3  # consecutive low readings before partitions are removed
_STEP_PAUSE_S = 0.2  # between reconcile steps (pinned sessions, draining locks)


class Scaler:
    """Reconcile loops and the autoscaling policy of one namespace actor."""

    def __init__(self, ns: NamespaceActor) -> None:
        self._ns = ns
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._watch: asyncio.Task[None] | None = None
        self._low: dict[str, int] = {}
        self._converged: dict[str, tuple[tuple[tuple[str, int, int], int], bool]] = {}
        self._holds: dict[str, asyncio.Lock] = {}

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        """Start the watcher (idempotent; called from the actor's event loop)."""
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watcher())

    def wake(self, name: str) -> None:
        """Make sure a reconcile loop runs for ``name``."""
        key = name.lower()
        task = self._tasks.get(key)
        if task is None or task.done():
            self._tasks[key] = asyncio.get_running_loop().create_task(self._reconcile(name))

    def stop(self, name: str) -> None:
        task = self._tasks.pop(name.lower(), None)
        if task is not None:
            task.cancel()
        self._low.pop(name.lower(), None)
        self._converged.pop(name.lower(), None)
        self._holds.pop(name.lower(), None)

    def holding(self, name: str) -> asyncio.Lock:
        """The lock every step of ``name``'s partition change runs under. Whoever holds it
        sees the entity's partitions as its route names them, none removed under the call
        and no moved bundle between a source and its target.

        Without it, a scale-down removing a retiring partition during ``update_queue``'s
        fan-out failed the call with ``ActorGoneError`` ("the entity was deleted"), and counts
        read during a move missed what was in transit (0 of 200 messages in 1 read of 25)."""
        key = name.lower()
        lock = self._holds.get(key)
        if lock is None:
            lock = self._holds[key] = asyncio.Lock()
        return lock

    def converged(self, entry: EntityEntry) -> bool:
        """Whether the entity's partitions match its settings (cached per map version: the
        watcher asks for every entity every few seconds)."""
        pmap = entry.pmap
        key = (entry.properties.name.lower(), entry.incarnation, pmap.version)
        count = entry.properties.partition_count
        cached = self._converged.get(key[0])
        if cached is not None and cached[0] == (key, count):
            return cached[1]
        result = (
            not pmap.retiring and len(pmap.live) == count and pmap.slots == pmap.balanced(pmap.live)
        )
        self._converged[key[0]] = ((key, count), result)
        return result

    # ------------------------------------------------------------------ loops

    async def _watcher(self) -> None:
        while True:
            for entry in self._ns._registry.list():
                if not entry.has_partitions:
                    continue
                name = entry.properties.name
                try:
                    if not self.converged(entry):
                        self.wake(name)
                    elif entry.properties.max_partitions is not None:
                        await self._autoscale(entry)
                except Exception:
                    _log.exception("scaling check of %s failed", name)
            await asyncio.sleep(AUTOSCALE_INTERVAL_S)

    async def _reconcile(self, name: str) -> None:
        while True:
            failed = False
            async with self.holding(name):
                try:
                    entry = self._ns._registry.get(name)
                except MessagingEntityNotFoundError:
                    return
                if not entry.has_partitions:
                    return
                if self.converged(entry):
                    _log.info(
                        "%s: %d partitions, map v%d",
                        name,
                        len(entry.pmap.live),
                        entry.pmap.version,
                    )
                    return
                again = False
                try:
                    again = await self._step(entry)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a partition restarting: the next step tries again
                    _log.exception("partition change of %s: step failed", name)
                    failed = True
            # A retiring partition that stopped at a bundle's bound goes on at once: the lock
            # was let go in between, so the entity's other calls take their turn.
            await asyncio.sleep(1.0 if failed else 0.0 if again else _STEP_PAUSE_S)

    async def _install(self, entry: EntityEntry, pmap: PartitionMap) -> EntityEntry:
        new = self._ns._registry.set_map(entry.properties.name, pmap)
        try:
            await self._ns._persist(("put", new))
        except Exception:
            self._ns._registry.restore([("put", entry)])
            raise
        return new

    async def _step(self, entry: EntityEntry) -> bool:
        """One step of the change; True if it should be followed at once (a retiring
        partition has more to spill than one bundle carries)."""
        ns = self._ns
        props, pmap = entry.properties, entry.pmap
        handles = ns._handles[props.name.lower()]
        want = props.partition_count
        live = list(pmap.live)
        if len(live) < want:
            new_ids = list(range(pmap.next_id, pmap.next_id + want - len(live)))
            for pid in new_ids:
                handles[pid] = partition_actor(
                    partition_actor_name(ns._namespace, props.name, entry.incarnation, pid),
                    ns._namespace,
                    props,
                    pid,
                    entry.incarnation,
                    ns._storage_path,
                    frozenset(),
                )
            await asyncio.gather(*(ns._in(handles[pid]).ready.remote() for pid in new_ids))
            grown = PartitionMap(pmap.version + 1, pmap.slots, tuple(live + new_ids), pmap.retiring)
            await self._install(entry, grown)
            _log.info("%s: added partitions %s", props.name, new_ids)
            return False
        if len(live) > want:
            keep = tuple(sorted(live)[:want])
            retire = tuple(p for p in live if p not in keep)
            shrunk = PartitionMap(pmap.version + 1, pmap.slots, keep, pmap.retiring + retire)
            await self._install(entry, shrunk)
            _log.info("%s: retiring partitions %s", props.name, list(retire))
            return False
        desired = pmap.balanced(pmap.live)
        moves: dict[int, dict[int, set[int]]] = {}
        for slot, (cur, dst) in enumerate(zip(pmap.slots, desired, strict=True)):
            if cur != dst:
                moves.setdefault(cur, {}).setdefault(dst, set()).add(slot)
        sources = sorted(set(moves) | set(pmap.retiring))
        results = await asyncio.gather(
            *(
                ns._in(handles[src]).hand_over.remote(
                    {t: frozenset(ss) for t, ss in moves.get(src, {}).items()},
                    pmap.live[src % len(pmap.live)] if src in pmap.retiring else None,
                )
                for src in sources
            ),
            return_exceptions=True,
        )
        slots = list(pmap.slots)
        empty: list[int] = []
        more = False
        for src, result in zip(sources, results, strict=True):
            if isinstance(result, BaseException):
                _log.warning("%s: partition %s could not hand over: %s", props.name, src, result)
                continue
            done, _pinned, is_empty, bounded = result
            for target, moved in done.items():
                for slot in moved:
                    slots[slot] = target
            if is_empty:
                empty.append(src)
            more = more or bounded
        gone = [r for r in empty if r not in slots]
        if tuple(slots) == pmap.slots and not gone:
            return more
        retiring = tuple(r for r in pmap.retiring if r not in gone)
        await self._install(
            entry, PartitionMap(pmap.version + 1, tuple(slots), pmap.live, retiring)
        )
        for pid in gone:
            ray.kill(handles.pop(pid), no_restart=True)
            await self._delete_storage(entry, pid)
            _log.info("%s: removed partition %s", props.name, pid)
        return more

    async def _delete_storage(self, entry: EntityEntry, pid: int) -> None:
        ns = self._ns
        if ns._storage_path is None:
            return
        dirs = partition_storage_dirs(ns._namespace, entry.properties.name, entry.incarnation, pid)
        try:
            fs, path = open_storage(ns._storage_path, *dirs)
            await asyncio.to_thread(fs.delete_dir, path)
        except Exception as exc:
            _log.info("could not delete storage of removed partition %s: %s", pid, exc)

    # ------------------------------------------------------------------ policy

    async def _autoscale(self, entry: EntityEntry) -> None:
        """Keep about ``target_backlog_per_partition`` active messages per partition, between
        ``min_partitions`` and ``max_partitions``; grow at once, shrink only after
        ``SCALE_DOWN_READINGS`` low readings in a row (so a burst does not make it flap)."""
        props = entry.properties
        assert props.max_partitions is not None
        _route, counts = await self._ns.counts(props.name)
        backlog = sum(c.active for c in counts)
        want = math.ceil(backlog / props.target_backlog_per_partition)
        want = max(props.min_partitions, min(props.max_partitions, want))
        key = props.name.lower()
        if want < props.partition_count:
            self._low[key] = self._low.get(key, 0) + 1
            if self._low[key] < SCALE_DOWN_READINGS:
                return
        self._low[key] = 0
        if want == props.partition_count:
            return
        _log.info(
            "%s: autoscaling %d -> %d partitions (backlog %d)",
            props.name,
            props.partition_count,
            want,
            backlog,
        )
        new = self._ns._registry.update(dataclasses.replace(props, partition_count=want))
        try:
            await self._ns._persist(("put", new))
        except Exception:
            self._ns._registry.restore([("put", entry)])
            raise
        self.wake(props.name)
