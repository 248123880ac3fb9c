"""Fault injectors for a running raybus namespace, and the scenario harness the fault and
soak tests share: run the workload, inject faults, drain, check the history, write the counts.

Actors are found the way an operator would: the namespace actor's routes (``route(name)``)
give partition and router handles; the coordinator and the namespace actor are named. Every
kill is ``ray.kill(handle, no_restart=False)``: the actors have ``max_restarts=-1`` and recover
from storage. Storage faults swap a partition actor's log filesystem for
``faulty_fs.FaultyHandler`` wrapping the real one (through ``__ray_call__``), so its writes
fail with ENOSPC or EIO while armed; a restarted actor gets the real filesystem back.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import faulty_fs
import ray
from faulty_fs import FaultyHandler
from history import Fault, History, Receive, Release
from workload import LOCK_S, Workload, create_entities, drain

from raybus import aio
from raybus._actors.coordinator import coordinator_actor_name
from raybus._actors.namespace import namespace_actor_name
from raybus._core.registry import partition_storage_dirs
from raybus._storage.framing import decode
from raybus.exceptions import ServiceBusError

__all__ = ["Injector", "Scenario", "results_dir", "run_scenario"]

FAULT_LOCK_DROP_S = 1.0  # a storage fault's rebuild may drop locks until this long after


def results_dir() -> Path:
    """Where fault and soak runs write their counts (``RAYBUS_RELIABILITY_RESULTS``)."""
    default = Path(__file__).resolve().parents[2] / "build" / "reliability"
    path = Path(os.environ.get("RAYBUS_RELIABILITY_RESULTS", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _arm_storage_fault(actor: Any, code: int, budget: int) -> int:
    """Runs inside a partition actor: route its log's writes through a failing wrapper."""
    import pyarrow.fs as pafs

    log = actor._commit._log
    handler = getattr(actor, "_injected_fs", None)
    if handler is None:
        handler = FaultyHandler(log._fs)
        actor._injected_fs = handler
        actor._real_fs = log._fs
        log._fs = pafs.PyFileSystem(handler)
    handler.write_errno = code
    handler.write_budget = budget
    return int(log.next_lsn)


def _disarm_storage_fault(actor: Any) -> int:
    log = actor._commit._log
    handler = getattr(actor, "_injected_fs", None)
    if handler is not None:
        log._fs = actor._real_fs
        actor._injected_fs = None
    return int(handler.writes) if handler is not None else 0


@dataclass
class Injector:
    """Injects faults into one namespace and records each in the history."""

    client: aio.ServiceBusClient
    history: History
    namespace: str
    storage: str
    rng: random.Random
    counts: Counter[str] = field(default_factory=Counter)
    effects: Counter[str] = field(default_factory=Counter)  # what the faults did
    log: list[str] = field(default_factory=list)
    torn: list[Path] = field(default_factory=list)

    async def _route(self, name: str) -> Any:
        return await self.client._conn.registry.route.remote(name)

    def _note(self, what: str, start: float) -> None:
        self.counts[what.split(" ")[0]] += 1
        self.log.append(f"{start:.2f} {what}")

    async def kill_partition(self, entity: str) -> None:
        route = await self._route(entity)
        pid, handle = self.rng.choice(route.existing())
        start = time.time()
        ray.kill(handle, no_restart=False)
        self.history.add(Fault("kill-partition", start, time.time() + 0.1, entity, pid))
        self._note(f"kill-partition {entity}/{pid}", start)

    async def kill_router(self, topic: str) -> None:
        route = await self._route(topic)
        start = time.time()
        ray.kill(route.router, no_restart=False)
        self.history.add(Fault("kill-router", start, time.time(), topic, None, False))
        self._note(f"kill-router {topic}", start)

    async def kill_named(self, which: str) -> None:
        """``coordinator`` or ``namespace``: neither holds message locks."""
        name = (
            coordinator_actor_name(self.namespace)
            if which == "coordinator"
            else namespace_actor_name(self.namespace)
        )
        handle = ray.get_actor(name, namespace="raybus")
        start = time.time()
        ray.kill(handle, no_restart=False)
        self.history.add(Fault(f"kill-{which}", start, time.time(), None, None, False))
        self._note(f"kill-{which}", start)

    async def storage_fault(self, entity: str, code: int, seconds: float) -> int:
        """Writes of one partition fail with ``code`` for ``seconds`` (a few bytes of each
        write may land first: remnants the log must replace). Returns the writes refused."""
        route = await self._route(entity)
        pid, handle = self.rng.choice(route.existing())
        budget = self.rng.choice([0, 7, 64])
        start = time.time()
        for mod in (faulty_fs, sys.modules[__name__]):
            ray.cloudpickle.register_pickle_by_value(mod)
        try:
            await handle.__ray_call__.remote(_arm_storage_fault, code, budget)
            await asyncio.sleep(seconds)
            refused = await handle.__ray_call__.remote(_disarm_storage_fault)
        except ray.exceptions.RayActorError:
            refused = -1  # the actor exited (its log unreadable) and came back
        self.effects["writes refused"] += max(refused, 0)
        self.effects["actor exits"] += refused < 0
        end = time.time() + FAULT_LOCK_DROP_S
        self.history.add(Fault(f"storage-{errno.errorcode[code]}", start, end, entity, pid))
        self._note(f"storage-{errno.errorcode[code]} {entity}/{pid} {seconds:.1f}s", start)
        return int(refused)

    async def torn_tail(self, entity: str) -> str:
        """A crash in the middle of a log append: a partial copy of the partition's last log
        file appears as the next LSN (never acknowledged), then the actor is killed. The
        restarted actor must drop the torn file and lose nothing acknowledged."""
        route = await self._route(entity)
        pid, handle = self.rng.choice(route.existing())
        dirs = partition_storage_dirs(self.namespace, entity, route.incarnation, pid)
        log_dir = Path(self.storage, *dirs, "log")
        start = time.time()
        for _ in range(20):
            files = sorted(log_dir.glob("*.arrow"))
            last = files[-1].read_bytes() if files else b"RBSTOR\x00\x01" + b"\x00" * 40
            lsn = int(files[-1].stem) + 1 if files else 1
            torn = last[: self.rng.randint(1, max(1, len(last) - 1))]
            try:  # exclusive: never replace a file the actor wrote meanwhile
                with open(log_dir / f"{lsn:020d}.arrow", "xb") as f:
                    f.write(torn)
                break
            except FileExistsError:
                continue
        ray.kill(handle, no_restart=False)
        self.torn.append(log_dir / f"{lsn:020d}.arrow")
        self.history.add(Fault("torn-tail", start, time.time() + 0.1, entity, pid))
        self._note(f"torn-tail {entity}/{pid} lsn {lsn} {len(torn)} bytes", start)
        return str(log_dir / f"{lsn:020d}.arrow")


@dataclass
class Scenario:
    """One run's settings: which faults, how often, for how long."""

    name: str
    seed: int
    seconds: float
    faults: list[str]  # e.g. ["partition", "coordinator"]; "" entries mean "no fault"
    interval: tuple[float, float] = (2.0, 5.0)
    topic: bool = False
    killable_consumer: bool = False
    misbehave: float = 0.03


async def _one_fault(inj: Injector, kind: str, q: str, sq: str, topic: str) -> None:
    entity = inj.rng.choice([q, sq])
    if kind == "partition":
        await inj.kill_partition(entity)
    elif kind == "router":
        await inj.kill_router(topic)
    elif kind in ("coordinator", "namespace"):
        await inj.kill_named(kind)
    elif kind in ("ENOSPC", "EIO"):
        await inj.storage_fault(entity, getattr(errno, kind), inj.rng.uniform(0.5, 2.0))
    elif kind == "torn-tail":
        await inj.torn_tail(entity)
    elif kind != "none":
        raise ValueError(kind)


async def run_scenario(sc: Scenario, storage: Path) -> dict[str, Any]:
    """Run the workload with ``sc``'s faults in a fresh namespace on the current Ray; drain;
    check; write ``<results>/<name>.json``; return the result (``anomalies`` a list)."""
    from workload import kill_consumer, start_killable_consumer

    namespace = f"rel-{uuid.uuid4().hex[:6]}"
    rng = random.Random(sc.seed)
    h = History(max_delivery_count=6)
    admin = aio.ServiceBusAdministrationClient(namespace, storage_path=str(storage))
    client = aio.ServiceBusClient(namespace, storage_path=str(storage))
    q, sq, topic = "work", "sessions", "events"
    await create_entities(admin, q, sq)
    entities = [q, sq]
    if sc.topic:
        await admin.create_topic(topic)
        await admin.create_subscription(
            topic, "all", lock_duration=timedelta(seconds=LOCK_S), max_delivery_count=6
        )
        entities.append(f"{topic}/Subscriptions/all")
    inj = Injector(client, h, namespace, str(storage), rng)
    wl = Workload(
        client,
        h,
        q,
        sq,
        seed=sc.seed,
        misbehave=sc.misbehave,
        topic=(topic, "all") if sc.topic else None,
    )
    started = time.monotonic()
    wl.start()
    consumers: list[Any] = []
    killed: dict[Path, float] = {}  # a consumer's history file -> when it was killed
    if sc.killable_consumer:
        consumers.append(start_killable_consumer(namespace, str(storage), q, _sink(storage, sc, 0)))
    fault_errors: Counter[str] = Counter()
    while time.monotonic() - started < sc.seconds:
        await asyncio.sleep(rng.uniform(*sc.interval))
        if consumers and rng.random() < 0.3:
            at = time.time()
            await kill_consumer(consumers.pop())
            killed[_sink(storage, sc, len(killed))] = at
            inj._note("kill-consumer", at)
            consumers.append(
                start_killable_consumer(namespace, str(storage), q, _sink(storage, sc, len(killed)))
            )
            continue
        kind = rng.choice(sc.faults)
        try:
            await _one_fault(inj, kind, q, sq, topic)
        except (ServiceBusError, ray.exceptions.RayError, StopIteration) as exc:
            fault_errors[f"{kind}: {type(exc).__name__}"] += 1
    await wl.stop()
    for consumer in consumers:
        killed[_sink(storage, sc, len(killed))] = time.time()
        await kill_consumer(consumer)
    for sink, at in killed.items():
        events = History.load_jsonl(sink)
        h.extend(events)
        for name in {e.receiver for e in events if isinstance(e, Receive)}:
            h.add(Release(name, at))  # killed: the broker may free its locks from then on
    left = await drain(client, h, entities)
    for path in inj.torn:  # recovery deleted each torn file (or the actor rewrote that LSN)
        inj.effects["torn files dropped" if not path.exists() else "torn LSN rewritten"] += 1
        if path.exists():
            decode(path.read_bytes())  # a complete, valid file now
    anomalies = h.check()
    counts = h.counts()
    result = {
        "scenario": sc.name,
        "seed": sc.seed,
        "seconds": round(time.monotonic() - started, 1),
        "injections": dict(inj.counts),
        "injection_errors": dict(fault_errors),
        "fault_effects": dict(inj.effects),
        "messages_checked": counts.get("messages", 0),
        "events": counts,
        "left_at_drain": left,
        "workload": {
            "sent": wl.stats.sent,
            "send_errors": wl.stats.send_errors,
            "received": wl.stats.received,
            "settled": wl.stats.settled,
            "dropped": wl.stats.dropped,
            "stalled": wl.stats.stalled,
            "txns": wl.stats.txns,
            "errors": wl.stats.errors,
        },
        "anomalies": [str(a) for a in anomalies],
        "anomaly_evidence": [[repr(e) for e in a.evidence[:6]] for a in anomalies[:20]],
        "fault_log": inj.log,
    }
    (results_dir() / f"{sc.name}.json").write_text(json.dumps(result, indent=2))
    if anomalies:  # the whole history, to re-check offline: history.History.load_jsonl
        with (results_dir() / f"{sc.name}.history.jsonl").open("w") as f:
            for e in h.events:
                f.write(json.dumps(asdict(e)) + "\n")
    await _cleanup(admin, namespace, [q, sq], topic if sc.topic else None)
    return result


def _sink(storage: Path, sc: Scenario, n: int) -> Path:
    return storage.parent / f"consumer-{sc.seed}-{n}.jsonl"


async def _cleanup(
    admin: aio.ServiceBusAdministrationClient, namespace: str, queues: list[str], topic: str | None
) -> None:
    for q in queues:
        try:
            await admin.delete_queue(q)
        except ServiceBusError:
            pass
    if topic is not None:
        try:
            await admin.delete_topic(topic)
        except ServiceBusError:
            pass
    for name in (coordinator_actor_name(namespace), namespace_actor_name(namespace)):
        try:
            ray.kill(ray.get_actor(name, namespace="raybus"), no_restart=True)
        except Exception:  # never created, or gone
            pass
