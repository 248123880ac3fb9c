"""A randomised raybus workload that records everything it does into a ``History``.

Drives the public ``raybus.aio`` client only: plain and transactional senders, competing
receivers with a settle mix (mostly complete; some abandon, dead-letter, defer then
``receive_deferred_messages``), session receivers that hop from session to session, consumers
that drop messages without settling (their receiver is simply abandoned, locks run out) or
stall past their lock, and optionally a consumer *process* (a Ray actor) that is killed
mid-processing. ``drain`` then records what is left for the checker.

Every workload task runs in one asyncio loop; faults are injected from outside it (the test)
and recorded with ``History.add(Fault(...))``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from history import Final, History, Release, Txn

from raybus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusSubQueue, aio
from raybus.exceptions import ServiceBusError, TransactionAbortedError

__all__ = ["Workload", "WorkloadStats", "create_entities", "drain", "start_killable_consumer"]

LOCK_S = 5.0
MAX_DELIVERY = 6
DLQ = ServiceBusSubQueue.DEAD_LETTER


@dataclass
class WorkloadStats:
    sent: int = 0
    send_errors: int = 0
    received: int = 0
    settled: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    stalled: int = 0
    txns: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    def bump(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


async def create_entities(
    admin: aio.ServiceBusAdministrationClient, queue: str, session_queue: str, partitions: int = 2
) -> None:
    """A partitioned queue and a session queue, short locks, a low max delivery count."""
    opts: dict[str, Any] = {
        "lock_duration": timedelta(seconds=LOCK_S),
        "max_delivery_count": MAX_DELIVERY,
        "partition_count": partitions,
    }
    await asyncio.gather(
        admin.create_queue(queue, **opts),
        admin.create_queue(session_queue, requires_session=True, **opts),
    )


class Workload:
    """Runs the workload's tasks until ``stop()``; ``paused`` holds every task at its next step."""

    def __init__(
        self,
        client: aio.ServiceBusClient,
        history: History,
        queue: str,
        session_queue: str,
        *,
        seed: int,
        senders: int = 2,
        txn_senders: int = 1,
        receivers: int = 2,
        session_receivers: int = 2,
        sessions: int = 4,
        misbehave: float = 0.03,
        topic: tuple[str, str] | None = None,
    ) -> None:
        self.client, self.h, self.q, self.sq = client, history, queue, session_queue
        self.rng = random.Random(seed)
        self.seed = seed
        self.shape = (senders, txn_senders, receivers, session_receivers)
        self.sessions = [f"S{i}" for i in range(sessions)]
        self.misbehave = misbehave
        self.topic = topic  # (topic, subscription): some sends go there; receiver 0 reads it
        self.stats = WorkloadStats()
        self._stop = asyncio.Event()
        self.running = asyncio.Event()
        self.running.set()
        self._ids = itertools.count()
        self._deferred: list[int] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._abandoned: list[Any] = []  # receivers of "crashed" consumers, never closed

    # -- control ------------------------------------------------------------------------------

    def start(self) -> None:
        s, t, r, sr = self.shape
        make = asyncio.ensure_future
        self._tasks = [make(self._guard(self._sender, i)) for i in range(s)]
        self._tasks += [make(self._guard(self._txn_sender, i)) for i in range(t)]
        self._tasks += [make(self._guard(self._receiver, i)) for i in range(r)]
        self._tasks += [make(self._guard(self._session_receiver, i)) for i in range(sr)]

    async def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        self.running.set()
        _done, pending = await asyncio.wait(self._tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for r in self._abandoned:
            # The "crashed" consumers' locks ran out long ago; closing now frees nothing more.
            try:
                await asyncio.wait_for(r.close(), 10)
            except (ServiceBusError, asyncio.TimeoutError):
                pass

    async def _guard(self, body: Callable[[int], Awaitable[None]], i: int) -> None:
        while not self._stop.is_set():
            try:
                await body(i)
            except (ServiceBusError, asyncio.TimeoutError) as exc:
                self.stats.bump(self.stats.errors, type(exc).__name__)
                await asyncio.sleep(0.2)

    async def _step(self) -> bool:
        await self.running.wait()
        return not self._stop.is_set()

    def _mid(self, prefix: str) -> str:
        return f"{prefix}-{self.seed}-{next(self._ids)}"

    # -- senders ------------------------------------------------------------------------------

    def _message(self, mid: str, session: str | None) -> ServiceBusMessage:
        return ServiceBusMessage(
            f"body {mid}", message_id=mid, session_id=session, partition_key=None
        )

    async def _send(self, sender: Any, entity: str, msgs: list[ServiceBusMessage]) -> None:
        mids, sessions = [str(m.message_id) for m in msgs], [m.session_id for m in msgs]
        try:
            with self.h.sending(entity, mids, sessions=sessions):
                await asyncio.wait_for(sender.send_messages(msgs), 30)
            self.stats.sent += len(msgs)
        except (ServiceBusError, asyncio.TimeoutError):
            self.stats.send_errors += 1
            await asyncio.sleep(0.2)

    async def _sender(self, i: int) -> None:
        async with (
            self.client.get_queue_sender(self.q) as plain,
            self.client.get_queue_sender(self.sq) as sess,
            self.client.get_topic_sender(self.topic[0] if self.topic else self.q) as pub,
        ):
            while await self._step():
                if self.topic is not None and self.rng.random() < 0.2:
                    await self._send(pub, self.topic[0], [self._message(self._mid(f"e{i}"), None)])
                elif self.rng.random() < 0.5:
                    await self._send(plain, self.q, [self._message(self._mid(f"p{i}"), None)])
                else:
                    # One session per batch: a batch goes to one partition, all or nothing.
                    sid = self.rng.choice(self.sessions)
                    n = self.rng.randint(1, 3)
                    msgs = [self._message(self._mid(f"s{i}"), sid) for _ in range(n)]
                    await self._send(sess, self.sq, msgs)
                await asyncio.sleep(self.rng.uniform(0.0, 0.05))

    async def _txn_sender(self, i: int) -> None:
        """Send-via: complete one message of the queue and send two new ones in one
        transaction (or only send, when nothing is there)."""
        async with (
            self.client.get_queue_receiver(self.q, max_wait_time=0.5) as r,
            self.client.get_queue_sender(self.q) as s,
            self.client.get_queue_sender(self.sq) as ss,
        ):
            name = f"txn{i}"
            while await self._step():
                txn = self.client.transaction()
                tid = txn.transaction_id
                start = time.time()
                got = await self._receive(r, name, self.q, 1, 0.3)
                for m in got:
                    with self.h.settling(m, "complete", receiver=name, txn=tid):
                        await r.complete_message(m, transaction=txn)
                msgs = [self._message(self._mid(f"t{i}"), None)]
                smsgs = [self._message(self._mid(f"t{i}"), self.rng.choice(self.sessions))]
                with self.h.sending(self.q, [str(m.message_id) for m in msgs], txn=tid):
                    await s.send_messages(msgs, transaction=txn)
                with self.h.sending(
                    self.sq,
                    [str(m.message_id) for m in smsgs],
                    txn=tid,
                    sessions=[m.session_id for m in smsgs],
                ):
                    await ss.send_messages(smsgs, transaction=txn)
                if self.rng.random() < 0.1:
                    await txn.rollback()
                    outcome = "aborted"
                else:
                    try:
                        await asyncio.wait_for(txn.commit(), 40)
                        outcome = "committed"
                    except TransactionAbortedError:
                        outcome = "aborted"
                    except (ServiceBusError, asyncio.TimeoutError):
                        outcome = "unknown"
                self.h.add(Txn(tid, outcome, start, time.time()))
                self.stats.bump(self.stats.txns, outcome)
                await asyncio.sleep(self.rng.uniform(0.0, 0.1))

    # -- receivers ----------------------------------------------------------------------------

    async def _receive(
        self, r: Any, name: str, entity: str, n: int, wait: float, until: float | None = None
    ) -> list[Any]:
        start = time.time()
        got = await asyncio.wait_for(r.receive_messages(n, max_wait_time=wait), wait + 30)
        if r.session is not None:
            lu = r.session.locked_until_utc
            until = lu.timestamp() if lu is not None else 0.0
        for m in got:
            self.h.received(m, entity=entity, receiver=name, start=start, locked_until=until)
        self.stats.received += len(got)
        return got

    async def _settle(self, r: Any, name: str, m: Any, op: str) -> None:
        """Settle and wait for the broker's answer (a fast-path settlement is confirmed by
        the empty ``complete_messages`` call, which reports its refusal)."""
        try:
            with self.h.settling(m, op, receiver=name):
                if op == "complete":
                    await r.complete_messages([m])
                elif op == "abandon":
                    await r.abandon_message(m)
                elif op == "dead_letter":
                    await r.dead_letter_message(m, reason="poison", error_description=name)
                else:
                    await r.defer_message(m)
                await r.complete_messages([])
            self.stats.bump(self.stats.settled, op)
            if op == "defer":
                self._deferred.append(m.sequence_number)
        except ServiceBusError as exc:
            self.stats.bump(self.stats.settled, f"{op} refused ({type(exc).__name__})")

    def _pick(self) -> str:
        x = self.rng.random()
        if x < self.misbehave:
            return "drop"
        if x < 2 * self.misbehave:
            return "stall"
        return self.rng.choices(["complete", "abandon", "dead_letter", "defer"], [85, 7, 4, 4])[0]

    async def _receiver(self, i: int) -> None:
        name = f"r{i}-{self.rng.random():.6f}"
        entity = self.q
        if self.topic is not None and i == 0:
            entity = f"{self.topic[0]}/Subscriptions/{self.topic[1]}"
            r = self.client.get_subscription_receiver(*self.topic, max_wait_time=1)
        else:
            r = self.client.get_queue_receiver(self.q, max_wait_time=1)
        crashed = False
        try:
            while await self._step() and not crashed:
                for m in await self._receive(r, name, entity, 5, 1.0):
                    action = self._pick()
                    if action == "drop":  # a consumer that crashes: its locks run out
                        self.stats.dropped += 1
                        crashed = True
                        self._abandoned.append(r)
                        break
                    if action == "stall":  # outlives its lock, then tries to complete
                        self.stats.stalled += 1
                        await asyncio.sleep(LOCK_S + 1.0)
                        action = "complete"
                    await self._settle(r, name, m, action)
                if entity == self.q and self._deferred and self.rng.random() < 0.3:
                    await self._take_deferred(r, name)
        finally:
            if not crashed:
                self.h.add(Release(name, time.time()))
                await r.close()

    async def _take_deferred(self, r: Any, name: str) -> None:
        seq = self._deferred.pop(0)
        start = time.time()
        try:
            got = await r.receive_deferred_messages([seq])
        except ServiceBusError as exc:
            self.stats.bump(self.stats.errors, f"deferred {type(exc).__name__}")
            return
        for m in got:
            self.h.received(m, entity=self.q, receiver=name, start=start, source="deferred")
            await self._settle(r, name, m, "complete")

    async def _session_receiver(self, i: int) -> None:
        name = f"sr{i}-{self.rng.random():.6f}"
        r = self.client.get_queue_receiver(
            self.sq, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
        )
        try:
            for _ in range(self.rng.randint(1, 6)):
                if not await self._step():
                    break
                for m in await self._receive(r, name, self.sq, 4, 1.0):
                    op = self.rng.choices(["complete", "abandon", "dead_letter"], [90, 7, 3])[0]
                    await self._settle(r, name, m, op)
        finally:
            self.h.add(Release(name, time.time()))
            try:
                await asyncio.wait_for(r.close(), 20)
            except (ServiceBusError, asyncio.TimeoutError):
                pass


# ---------------------------------------------------------------------------------------------
# a consumer process that a test kills


class KillableConsumer:
    """A Ray actor (its own process) that receives, records to a JSON-lines file, and settles
    slowly, so that a kill catches it holding locks it never settles."""

    def __init__(self, namespace: str, storage: str, queue: str, sink: str) -> None:
        self.client = aio.ServiceBusClient(namespace, storage_path=storage)
        self.h = History(Path(sink))
        self.queue = queue

    def pid(self) -> int:
        return os.getpid()

    async def run(self, name: str) -> int:
        n = 0
        async with self.client.get_queue_receiver(self.queue, max_wait_time=1) as r:
            while True:
                start = time.time()
                try:
                    got = await r.receive_messages(3, max_wait_time=1)
                except ServiceBusError:
                    await asyncio.sleep(0.2)
                    continue
                for m in got:
                    self.h.received(m, entity=self.queue, receiver=name, start=start)
                    await asyncio.sleep(0.3)  # "processing"
                    try:
                        with self.h.settling(m, "complete", receiver=name):
                            await r.complete_messages([m])
                    except ServiceBusError:
                        pass
                    n += 1


def start_killable_consumer(
    namespace: str, storage: str, queue: str, sink: Path
) -> tuple[Any, Any, int]:
    """Start a ``KillableConsumer`` actor (not restarted) and its loop; returns the handle,
    the loop's object ref (it fails once the actor is dead) and the actor's process id."""
    import ray

    for mod in ("history", "workload"):
        ray.cloudpickle.register_pickle_by_value(sys.modules[mod])
    actor = ray.remote(num_cpus=0, max_restarts=0)(KillableConsumer).remote(
        namespace, storage, queue, str(sink)
    )
    pid = ray.get(actor.pid.remote(), timeout=60)
    return actor, actor.run.remote(f"proc-{sink.stem}"), pid


async def kill_consumer(consumer: tuple[Any, Any, int]) -> None:
    """Kill a consumer process and wait until it is really gone.

    Neither ``ray.kill`` returning nor the actor's call failing means the process has
    stopped: measured here, it went on writing its history for 5-13 ms after the call
    failed (longer under load). A settlement it made then, after its file was read, showed up
    as a message the checker could not account for. So this waits for the process itself.
    """
    import ray

    actor, running, pid = consumer
    ray.kill(actor, no_restart=True)
    try:
        await asyncio.wait_for(running, 60)
    except (ray.exceptions.RayError, asyncio.TimeoutError):
        pass
    end = time.monotonic() + 60
    while _running(pid):
        if time.monotonic() > end:
            raise AssertionError(f"the killed consumer (pid {pid}) is still running after 60 s")
        await asyncio.sleep(0.01)


def _running(pid: int) -> bool:
    """Whether process ``pid`` can still run: it exists and is not a zombie (Linux ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


# ---------------------------------------------------------------------------------------------
# the final drain


async def _census(client: aio.ServiceBusClient, entity: str) -> list[Final]:
    found: list[Final] = []
    for sub in (None, DLQ):
        async with client.get_queue_receiver(entity, sub_queue=sub) as r:
            while got := await r.peek_messages(250):
                for m in got:
                    state = "dead_letter" if sub is not None else m.state.name.lower()
                    found.append(
                        Final(
                            str(m.message_id),
                            entity,
                            state,
                            m.sequence_number,
                            m.delivery_count,
                            m.dead_letter_reason,
                        )
                    )
    return found


async def drain(
    client: aio.ServiceBusClient,
    history: History,
    entities: list[str],
    *,
    stable_s: float = 3.0,
    deadline_s: float = 60.0,
) -> int:
    """Record what is left (peeked: active, deferred, scheduled and dead-lettered messages)
    once two censuses ``stable_s`` apart agree; returns how many were found."""
    end = time.monotonic() + deadline_s
    last: list[Final] | None = None
    while True:
        try:
            now: list[Final] = []
            for e in entities:
                now += await asyncio.wait_for(_census(client, e), 30)
        except (ServiceBusError, asyncio.TimeoutError):
            now = []
            last = None
        else:
            key = sorted((f.mid, f.state) for f in now)
            if last is not None and key == sorted((f.mid, f.state) for f in last):
                history.extend(now)
                return len(now)
            last = now
        if time.monotonic() > end:
            raise AssertionError(f"the queues did not settle within {deadline_s:.0f} s")
        await asyncio.sleep(stable_s)
