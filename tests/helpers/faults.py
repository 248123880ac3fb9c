"""Fault injectors for a running raybus namespace, and the scenario harness the fault and
soak tests share: run the workload, inject faults, drain, check the history, write the counts.

Actors are found the way an operator would: the namespace actor's routes (``route(name)``)
give partition and router handles; the coordinator and the namespace actor are named. Every
kill is ``ray.kill(handle, no_restart=False)``: the actors have ``max_restarts=-1`` and recover
from storage. Storage faults swap a partition actor's log filesystem for
``faulty_fs.FaultyHandler`` wrapping the real one (through ``__ray_call__``), and, for a log
appending to segments on the local disk, its segment writes for a failing ``pwrite``, so its
writes fail with ENOSPC or EIO while armed; a restarted actor gets the real ones back.
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
import pyarrow as pa
import ray
from faulty_fs import FaultyHandler
from history import Anomaly, Fault, Final, History, Receive, Release
from workload import LOCK_S, Workload, create_entities, drain

from raybus import aio
from raybus._actors.coordinator import coordinator_actor_name
from raybus._actors.namespace import namespace_actor_name
from raybus._core.registry import partition_storage_dirs
from raybus._storage.framing import decode, serialize
from raybus._storage.segments import encode_record, scan
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
    if log.segment_bytes is not None and getattr(actor, "_injected_pwrite", None) is None:
        from raybus._storage import segments

        real = segments._pwrite_all
        refused = [0]

        def failing(fd: int, data: Any, offset: int) -> None:
            refused[0] += 1
            view = memoryview(data).cast("B")
            real(fd, view[: min(budget, max(0, len(view) - 1))], offset)  # a remnant
            raise OSError(code, os.strerror(code))

        actor._injected_pwrite = (real, refused)
        segments._pwrite_all = failing
    return int(log.next_lsn)


def _disarm_storage_fault(actor: Any) -> int:
    log = actor._commit._log
    handler = getattr(actor, "_injected_fs", None)
    refused = 0
    if handler is not None:
        log._fs = actor._real_fs
        actor._injected_fs = None
        refused += int(handler.writes)
    injected = getattr(actor, "_injected_pwrite", None)
    if injected is not None:
        from raybus._storage import segments

        segments._pwrite_all = injected[0]
        actor._injected_pwrite = None
        refused += injected[1][0]
    return refused


def _torn_target(actor: Any) -> tuple[str, int] | None:
    """Runs inside a partition actor whose log is in segments: the segment its next append
    writes to (or would create) and that file's size now; ``None`` for one file per append."""
    log = actor._commit._log
    if log.segment_bytes is None:
        return None
    path = log.appending_to or log.segment_path(log.next_lsn)
    return path, os.path.getsize(path) if os.path.exists(path) else 0


def _tear_and_exit(actor: Any, path: str, cut: int) -> bool:
    """Runs inside a partition actor: crash in the middle of the next append to ``path``.

    Holds the log's append lock (no append in flight, none after: the process dies holding
    it), writes the first ``cut`` bytes of a record for the next LSN where the writer would
    (after the acknowledged records, over the zeros written ahead of them) and exits.
    ``False`` (and no crash) if appends no longer go to ``path``.
    """
    log = actor._commit._log
    with log._append_lock:
        target = log.appending_to or log.segment_path(log.next_lsn)
        if os.path.abspath(target) != os.path.abspath(path):
            return False
        payload = serialize(pa.table({"torn": pa.array([b"x" * 200])}))
        record = encode_record(log.next_lsn, payload) + payload.to_pybytes()
        active = log._active
        at = active.end if active is not None and active.path == target else 0
        with open(path, "r+b" if os.path.exists(path) else "wb") as f:
            f.seek(at)
            f.write(record[: max(1, min(cut, len(record) - 1))])
            f.flush()
            os.fsync(f.fileno())
        os._exit(1)


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
    torn_segments: list[tuple[Path, int]] = field(default_factory=list)  # (path, torn size)

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
        """A crash in the middle of a log append: the start of a record for the next LSN (never
        acknowledged) at the end of the segment being written, or a partial copy of the last
        log file as the next LSN when the log writes one file per append, then the actor dies.
        The restarted actor must drop the torn bytes and lose nothing acknowledged."""
        route = await self._route(entity)
        pid, handle = self.rng.choice(route.existing())
        dirs = partition_storage_dirs(self.namespace, entity, route.incarnation, pid)
        log_dir = Path(self.storage, *dirs, "log")
        start = time.time()
        for mod in (sys.modules[__name__],):
            ray.cloudpickle.register_pickle_by_value(mod)
        target = await handle.__ray_call__.remote(_torn_target)
        if target is not None:
            path, size = target
            cut = self.rng.randint(1, 300)
            try:
                torn = await handle.__ray_call__.remote(_tear_and_exit, path, cut)
            except ray.exceptions.RayActorError:
                torn = True  # it exited, as it should
            if not torn:  # the segment rolled meanwhile: a plain crash instead
                ray.kill(handle, no_restart=False)
            else:
                self.torn_segments.append((Path(path), size + cut))
            self.history.add(Fault("torn-tail", start, time.time() + 0.1, entity, pid))
            self._note(f"torn-tail {entity}/{pid} segment {Path(path).name} {cut} bytes", start)
            return path
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
        # A second subscription nobody reads: every publish then has copies for two
        # partitions, so it goes through the router's publish log (one alone is a plain send),
        # and its content, compared with "all", checks that each publish reached both or none.
        await admin.create_subscription(topic, "mirror")
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
    wl.start()
    consumers: list[Any] = []
    killed: dict[Path, float] = {}  # a consumer's history file -> when it was killed
    if sc.killable_consumer:
        consumers.append(start_killable_consumer(namespace, str(storage), q, _sink(storage, sc, 0)))
    # From here: a loaded machine took most of a run's seconds to start the consumer, and the
    # run then ended before its first kill (two CPU hogs, 2026-12-07).
    started = time.monotonic()
    fault_errors: Counter[str] = Counter()
    while time.monotonic() - started < sc.seconds:
        await asyncio.sleep(rng.uniform(*sc.interval))
        # A kill at random, and surely one by half time: the scenario promises at least one.
        overdue = not killed and time.monotonic() - started > sc.seconds / 2
        if consumers and (rng.random() < 0.3 or overdue):
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
    for path, torn_size in inj.torn_segments:  # recovery cut each torn record off
        if not path.exists() or path.stat().st_size < torn_size:
            inj.effects["torn segment tails cut"] += 1
            continue
        # Deleted as empty, then created again for the same (never acknowledged) LSN.
        data = pa.py_buffer(path.read_bytes())
        assert scan(data, int(path.stem), 0).damage is None, f"{path} still torn"
        inj.effects["torn segment LSN rewritten"] += 1
    anomalies = h.check()
    if sc.topic:
        anomalies += await check_mirror(client, h, topic)
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


async def check_mirror(client: aio.ServiceBusClient, h: History, topic: str) -> list[Anomaly]:
    """The topic's publishes reached both subscriptions or neither: the unread "mirror" holds
    each message once (``TOPIC_DUPLICATE``), and exactly the messages "all" was seen to hold
    (received, or found by the final drain: ``TOPIC_PARTIAL``)."""
    from workload import _census

    mirror = [f.mid for f in await _census(client, f"{topic}/Subscriptions/mirror")]
    path = f"{topic}/Subscriptions/all"
    seen = {e.mid for e in h.events if isinstance(e, Receive | Final) and e.entity == path}
    out = [
        Anomaly("TOPIC_DUPLICATE", mid, "the mirror subscription holds it twice")
        for mid, n in Counter(mirror).items()
        if n > 1
    ]
    out += [
        Anomaly("TOPIC_PARTIAL", mid, "in the mirror subscription, never in 'all'")
        for mid in sorted(set(mirror) - seen)
    ]
    out += [
        Anomaly("TOPIC_PARTIAL", mid, "in 'all', not in the mirror subscription")
        for mid in sorted(seen - set(mirror))
    ]
    return out


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
