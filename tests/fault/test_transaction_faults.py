"""Transactions survive crashes of the coordinator and of participant partitions: every
transaction is all-or-nothing whatever dies where (``make fault``).

1. Each named fail point (``raybus._failpoints``) is armed in the actor that passes it and a
   send-via transaction runs: complete a message of queue A, send two messages to the
   two-partition queue B (one per partition). The fail point makes that actor's process exit
   at the point; Ray restarts it and it recovers from storage. Once the system has settled
   the test asserts all-or-nothing: either the A message is gone and both B messages are
   there exactly once (commit), or the A message is there and can be received again and no
   B message exists (abort). Where the decision was logged before the crash, the outcome
   must be commit; where it cannot have been, abort. Participant points run in A's
   partition (a settlement share) and in one of B's (a send share); coordinator points run
   alone and with every participant killed too right after the crash.
2. Express queues (acknowledge before writing) as participants.
3. A participant and the coordinator both restarted after the decision was logged: the
   transaction resolves without client traffic on the participants.
4. Concurrent commits: the coordinator's log keeps every decision (and survives a restart).
5. Conservation: 40 messages hop between three queues in send-via transactions of four
   concurrent workers while partition actors and the coordinator are killed at random for
   20 s; afterwards every message exists exactly once.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import ray
from segment_files import record_starts, segments

import raybus
from raybus import ServiceBusMessage, ServiceBusSubQueue, aio
from raybus._actors.changelog import ChangeLog
from raybus._actors.coordinator import coordinator_actor_name
from raybus._actors.namespace import namespace_actor_name
from raybus.exceptions import (
    OperationTimeoutError,
    ServiceBusConnectionError,
    ServiceBusError,
    TransactionAbortedError,
)
from raybus.management import ServiceBusAdministrationClient

pytestmark = pytest.mark.fault

DLQ = ServiceBusSubQueue.DEAD_LETTER
LOCK = timedelta(seconds=2)
EXPRESS_LOCK = timedelta(seconds=6)
SETTLE_S = 45.0  # how long the system may take to settle after a crash (loaded machine)
STABLE_S = 3.0  # a settled state must not change for this long (> TXN_INQUIRY_S)

PARTICIPANT_POINTS = (
    "participant.before_prepare",
    "participant.after_prepare",
    "participant.before_commit",
    "participant.after_commit",
)
COORDINATOR_POINTS = ("coordinator.before_decision", "coordinator.after_decision")
# The decision is logged before these points: the transaction must commit.
DECIDED = {"participant.before_commit", "participant.after_commit", "coordinator.after_decision"}
UNKNOWN = (ServiceBusConnectionError, OperationTimeoutError)

CASES = [(p, v) for p in PARTICIPANT_POINTS for v in ("A", "B")] + [
    (p, v) for p in COORDINATOR_POINTS for v in ("coordinator", "coordinator+participants")
]

SUMMARY: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _print_summary() -> Iterator[None]:
    yield
    if SUMMARY:
        print("\n--- transaction fault summary ---")
        for line in SUMMARY:
            print(line)


# ---------------------------------------------------------------------------------------------
# helpers


@dataclass
class Bus:
    namespace: str
    storage: str
    admin: ServiceBusAdministrationClient
    client: raybus.ServiceBusClient
    queues: list[str] = field(default_factory=list)

    @property
    def coordinator(self) -> Any:
        return self.client._aio._conn.coordinator

    def create(self, *specs: tuple[str, dict[str, Any]]) -> None:
        """Create queues (name, options) at once: their actors start in parallel."""
        with ThreadPoolExecutor(len(specs)) as pool:
            list(pool.map(lambda s: self.admin.create_queue(s[0], **s[1]), specs))
        self.queues += [name for name, _ in specs]

    def partitions(self, queue: str) -> list[tuple[int, Any]]:
        route = ray.get(self.client._aio._conn.registry.route.remote(queue))
        parts: list[tuple[int, Any]] = route.existing()
        return parts

    def owner(self, queue: str, key: str) -> int:
        route = ray.get(self.client._aio._conn.registry.route.remote(queue))
        pid: int = route.pmap.owner(key)
        return pid


def _close_namespace(namespace: str, storage: str, queues: list[str]) -> None:
    admin = ServiceBusAdministrationClient(namespace, storage_path=storage)
    for name in queues:
        try:
            admin.delete_queue(name)
        except ServiceBusError:
            pass
    for actor_name in (coordinator_actor_name(namespace), namespace_actor_name(namespace)):
        try:
            ray.kill(ray.get_actor(actor_name, namespace="raybus"), no_restart=True)
        except Exception:  # never created, or gone
            pass


@pytest.fixture
def bus(ray_cluster: str, tmp_path: Path) -> Iterator[Bus]:
    namespace = f"txf-{uuid.uuid4().hex[:8]}"
    storage = str(tmp_path / "storage")
    admin = ServiceBusAdministrationClient(namespace, storage_path=storage)
    client = raybus.connect(namespace, storage_path=storage)
    b = Bus(namespace, storage, admin, client)
    try:
        yield b
    finally:
        _close_namespace(namespace, storage, b.queues)


def _restarts(handle: Any) -> int:
    """How often Ray restarted the actor (from the GCS)."""
    info = ray._private.state.actors(actor_id=handle._actor_id.hex())
    return int(info["NumRestarts"])


def _oid(message: Any) -> str:
    return str((message.application_properties or {})["oid"])


def _census(client: raybus.ServiceBusClient, queue: str) -> Counter[str]:
    """Ids of every message in the queue and its dead-letter queue (locked or not), by peek;
    retried while actors restart."""
    for _ in range(20):
        try:
            found: Counter[str] = Counter()
            for sub in (None, DLQ):
                with client.get_queue_receiver(queue, sub_queue=sub) as r:
                    while got := r.peek_messages(250):
                        found.update(_oid(m) for m in got)
            return found
        except ServiceBusError:
            time.sleep(0.3)
    raise AssertionError(f"could not peek {queue}")


def _receive_one(client: raybus.ServiceBusClient, queue: str, wait: float) -> Any:
    try:
        with client.get_queue_receiver(queue, max_wait_time=wait) as r:
            got = r.receive_messages(1, max_wait_time=wait)
    except ServiceBusError:
        return None
    return got[0] if got else None


# ---------------------------------------------------------------------------------------------
# 1. every fail point


def _settle(
    bus: Bus, a: str, b: str, a_id: str, b_ids: list[str], deadline_s: float = SETTLE_S
) -> tuple[str, float]:
    """Wait until the transaction's effects are all there ("commit") or provably none is
    ("abort": the A message can be received again and no B message exists). Fails on a mixed
    state that does not resolve, and at once on a duplicate."""
    start = time.monotonic()
    last: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
    while time.monotonic() - start < deadline_s:
        in_a, in_b = _census(bus.client, a), _census(bus.client, b)
        last = (in_a, in_b)
        assert all(n == 1 for n in (in_a + in_b).values()), f"duplicate: A={in_a} B={in_b}"
        if not in_a and in_b == Counter(b_ids):
            return "commit", time.monotonic() - start
        if in_a == Counter([a_id]) and not in_b:
            again = _receive_one(bus.client, a, 1.0)  # not if still held by the transaction
            if again is not None:
                assert _oid(again) == a_id
                return "abort", time.monotonic() - start
        time.sleep(0.3)
    raise AssertionError(
        f"neither all nor nothing after {deadline_s:.0f} s: in A {dict(last[0])} (the "
        f"message the transaction completes), in B {dict(last[1])} (the messages it sends); "
        f"coordinator {ray.get(bus.coordinator.stats.remote())}"
    )


def _assert_stays(bus: Bus, a: str, b: str, a_id: str, b_ids: list[str], outcome: str) -> None:
    time.sleep(STABLE_S)
    in_a, in_b = _census(bus.client, a), _census(bus.client, b)
    if outcome == "commit":
        assert not in_a and in_b == Counter(b_ids), f"changed after commit: A={in_a} B={in_b}"
    else:
        assert in_a == Counter([a_id]) and not in_b, f"changed after abort: A={in_a} B={in_b}"


@pytest.mark.parametrize(("point", "victim"), CASES)
def test_fail_point_keeps_the_transaction_all_or_nothing(bus: Bus, point: str, victim: str) -> None:
    tag = uuid.uuid4().hex[:6]
    a, b = f"a-{tag}", f"b-{tag}"
    bus.create(
        (a, {"lock_duration": LOCK}),
        (b, {"lock_duration": LOCK, "partition_count": 2}),
    )
    keys = []
    for pid in (0, 1):  # one key per B partition: both take part
        keys.append(next(k for i in range(1000) if bus.owner(b, k := f"k{i}") == pid))
    a_id, b_ids = f"{tag}-a", [f"{tag}-b{i}" for i in range(len(keys))]
    with bus.client.get_queue_sender(a) as s:
        s.send_messages(ServiceBusMessage("payload", application_properties={"oid": a_id}))
    a_parts, b_parts = bus.partitions(a), bus.partitions(b)
    participants = [h for _, h in a_parts + b_parts]
    if victim == "A":
        armed = a_parts[0][1]
    elif victim == "B":
        armed = dict(b_parts)[1]
    else:
        armed = bus.coordinator
    ray.get(bus.coordinator.stats.remote())  # the coordinator is up before arming
    restarts_before = _restarts(armed)

    result, reason = "ok", ""
    with (
        bus.client.get_queue_receiver(a, max_wait_time=5) as ra,
        bus.client.get_queue_sender(b) as sb,
    ):
        (msg,) = ra.receive_messages(1)
        ray.get(armed.arm_failpoint.remote(point))
        started = time.monotonic()
        txn = bus.client.transaction()
        ra.complete_message(msg, transaction=txn)
        for key, bid in zip(keys, b_ids, strict=True):
            sb.send_messages(
                ServiceBusMessage("copy", partition_key=key, application_properties={"oid": bid}),
                transaction=txn,
            )
        try:
            txn.commit()
        except (TransactionAbortedError, *UNKNOWN) as exc:
            result = type(exc).__name__
            reason = getattr(exc, "reason", None) or ""
        except ServiceBusError as exc:  # allowed, recorded
            result = f"{type(exc).__name__}: {exc}"
    commit_s = time.monotonic() - started
    if victim == "coordinator+participants":
        for h in participants:
            ray.kill(h, no_restart=False)

    outcome, settle_s = _settle(bus, a, b, a_id, b_ids)
    _assert_stays(bus, a, b, a_id, b_ids, outcome)
    fired = _restarts(armed) > restarts_before
    SUMMARY.append(
        f"{point:28} {victim:25} commit() -> {result:26} outcome={outcome:6} "
        f"commit {commit_s:4.1f} s, settled after {settle_s:4.1f} s, fired={fired}"
        + (f", reason {reason[:70]!r}" if reason else "")
    )
    print(SUMMARY[-1])
    assert fired, f"{point} did not fire in {victim}"
    if point in DECIDED:
        assert outcome == "commit", f"decision logged before {point}, yet {outcome}"
    else:
        assert outcome == "abort", f"no decision can have been logged before {point}"
    if point.startswith("participant."):
        # The coordinator lived: it knows the outcome and says so.
        expected = "ok" if point in DECIDED else "TransactionAbortedError"
        assert result == expected, f"commit() -> {result}"
    if outcome == "commit":
        deadline = time.monotonic() + 15
        while (undone := ray.get(bus.coordinator.stats.remote())["undone"]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.3)
        assert undone == 0, "the coordinator never learnt that every participant applied it"


# ---------------------------------------------------------------------------------------------
# 2. express participants


@pytest.mark.parametrize("express", ["A", "B"])
def test_express_participant_crashing_before_commit_keeps_the_transaction_atomic(
    bus: Bus, express: str
) -> None:
    """An express queue answers before writing (within 1 s). A share it prepared must still
    survive a crash once the coordinator logged commit: the commit applies it on restart."""
    tag = uuid.uuid4().hex[:6]
    a, b = f"a-{tag}", f"b-{tag}"
    bus.create(
        # A longer lock: this test expects commit, and on a loaded machine the receive, the
        # fail point and the commit together took longer than 2 s (lock lost, abort).
        (a, {"lock_duration": EXPRESS_LOCK, "enable_express": express == "A"}),
        (b, {"lock_duration": EXPRESS_LOCK, "enable_express": express == "B"}),
    )
    a_id, b_ids = f"{tag}-a", [f"{tag}-b0", f"{tag}-b1"]
    with bus.client.get_queue_sender(a) as s:
        s.send_messages(ServiceBusMessage("payload", application_properties={"oid": a_id}))
    time.sleep(1.5)  # the express write of the message itself is done
    armed = bus.partitions(a if express == "A" else b)[0][1]
    before = _restarts(armed)
    with (
        bus.client.get_queue_receiver(a, max_wait_time=5) as ra,
        bus.client.get_queue_sender(b) as sb,
    ):
        (msg,) = ra.receive_messages(1)
        ray.get(armed.arm_failpoint.remote("participant.before_commit"))
        with bus.client.transaction() as txn:  # the decision is logged: commit() returns
            ra.complete_message(msg, transaction=txn)
            sb.send_messages(
                [ServiceBusMessage("copy", application_properties={"oid": i}) for i in b_ids],
                transaction=txn,
            )
    outcome, settle_s = _settle(bus, a, b, a_id, b_ids, deadline_s=12)
    SUMMARY.append(f"express {express}: outcome={outcome} settled after {settle_s:.1f} s")
    assert _restarts(armed) > before
    assert outcome == "commit"


# ---------------------------------------------------------------------------------------------
# 3. resolution without traffic


def test_logged_commit_resolves_without_client_traffic_after_everyone_restarted(
    bus: Bus,
) -> None:
    """The coordinator dies right after logging commit and every participant is restarted
    too. Only peeks (which start nothing) watch: the restarted participants ask for the
    outcome by themselves (TXN_INQUIRY_S) and the transaction completes."""
    tag = uuid.uuid4().hex[:6]
    a, b = f"a-{tag}", f"b-{tag}"
    bus.create((a, {"lock_duration": LOCK}), (b, {"lock_duration": LOCK}))
    a_id, b_id = f"{tag}-a", f"{tag}-b"
    with bus.client.get_queue_sender(a) as s:
        s.send_messages(ServiceBusMessage("payload", application_properties={"oid": a_id}))
    participants = [h for q in (a, b) for _, h in bus.partitions(q)]
    ray.get(bus.coordinator.arm_failpoint.remote("coordinator.after_decision"))
    with (
        bus.client.get_queue_receiver(a, max_wait_time=5) as ra,
        bus.client.get_queue_sender(b) as sb,
    ):
        (msg,) = ra.receive_messages(1)
        txn = bus.client.transaction()
        ra.complete_message(msg, transaction=txn)
        sb.send_messages(
            ServiceBusMessage("copy", application_properties={"oid": b_id}), transaction=txn
        )
        with pytest.raises(UNKNOWN):
            txn.commit()
    for h in participants:
        ray.kill(h, no_restart=False)
    deadline = time.monotonic() + 15
    while True:
        in_a, in_b = _census(bus.client, a), _census(bus.client, b)
        if not in_a and in_b == Counter([b_id]):
            break
        assert time.monotonic() < deadline, (
            f"a logged commit still unapplied after 15 s: A={dict(in_a)} B={dict(in_b)} "
            "(the completed message stays locked, the sent one invisible)"
        )
        time.sleep(0.5)


# ---------------------------------------------------------------------------------------------
# 4. concurrent commits and the coordinator's log


async def test_concurrent_commits_log_every_decision_and_the_coordinator_recovers(
    ray_cluster: str, tmp_path: Path
) -> None:
    """Many transactions commit at once: the coordinator logs each decision and each "done"
    (concurrent ones share writes: group commit), and a restarted coordinator reads its log
    back."""
    namespace = f"txl-{uuid.uuid4().hex[:8]}"
    storage = str(tmp_path / "storage")
    admin = aio.ServiceBusAdministrationClient(namespace, storage_path=storage)
    client = aio.ServiceBusClient(namespace, storage_path=storage)
    count = 40
    try:
        await admin.create_queue("q", partition_count=2)
        async with client.get_queue_sender("q") as sender:

            async def one(i: int) -> None:
                async with client.transaction() as txn:
                    await sender.send_messages(ServiceBusMessage(f"m{i}"), transaction=txn)

            await asyncio.gather(*(one(i) for i in range(count)))
        coordinator = client._conn.coordinator
        stats = await coordinator.stats.remote()
        assert stats == {"committed": count, "aborted": 0, "undone": 0}
        log_dir = Path(storage) / namespace / "coordinator" / "log"

        def logged() -> tuple[Counter[str], int]:
            """(changes by kind, write records) in the coordinator's log as it is on disk."""
            reader = ChangeLog(storage, namespace, "coordinator", list, every=10**9)
            kinds = Counter(change[0] for change in reader.replay())
            # Records are appended to segment files (or one file each, in older logs).
            records = len(list(log_dir.glob("*.arrow"))) + sum(
                len(record_starts(seg.read_bytes())) for seg in segments(log_dir)
            )
            return kinds, records

        # The "done" marks are written after the callers were answered: wait for them.
        deadline = time.monotonic() + 10
        kinds, records = logged()
        while kinds["done"] < count and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            kinds, records = logged()
        # Every decision and every "done", none lost or overwritten; concurrent ones shared
        # writes (at most one record per change).
        assert kinds == Counter({"commit": count, "done": count}), kinds
        assert records <= 2 * count, f"{records} log records for {2 * count} changes"
        ray.kill(coordinator, no_restart=False)
        restarted: Any = None
        deadline = time.monotonic() + 30
        while restarted is None:
            try:
                restarted = await asyncio.wait_for(coordinator.stats.remote(), 10)
            except ray.exceptions.ActorDiedError as exc:  # cannot come back
                restarted = exc
            except (ray.exceptions.RayActorError, asyncio.TimeoutError) as exc:
                if time.monotonic() > deadline:
                    restarted = exc
                await asyncio.sleep(0.5)
        assert isinstance(restarted, dict), f"restart failed: {restarted!r}"[:2000]
        assert restarted["undone"] == 0
    finally:
        await asyncio.to_thread(_close_namespace, namespace, storage, ["q"])


# ---------------------------------------------------------------------------------------------
# 5. conservation under random kills


async def _diagnose(conn: Any, routes: dict[str, Any]) -> list[str]:
    """What each partition holds prepared, and what the coordinator is deciding (read inside
    the actors; the functions are nested so that they travel by value)."""

    def _partition_state(actor: Any) -> dict[str, Any]:
        core, watch = actor._core, actor._txn_watch
        return {
            "prepared": [t[:8] for t in core.prepared],
            "pinned": len(core.pinned),
            "kicked": actor._kicked,
            "watcher": None if watch is None else ("done" if watch.done() else "running"),
        }

    def _coordinator_state(actor: Any) -> dict[str, Any]:
        return {
            "inflight": sorted(t[:8] for t in actor._inflight),
            "decided": sorted(t[:8] for t in actor._decided),
        }

    lines = []
    for q, route in routes.items():
        for pid, h in route.existing():
            try:
                state = await asyncio.wait_for(h.__ray_call__.remote(_partition_state), 10)
            except Exception as exc:
                state = repr(exc)[:800]
            lines.append(f"{q}/{pid}: {state}")
    try:
        cstate = await asyncio.wait_for(
            conn.coordinator.__ray_call__.remote(_coordinator_state), 10
        )
    except Exception as exc:
        cstate = repr(exc)[:800]
    lines.append(f"coordinator: {cstate}")
    return lines


async def test_messages_are_conserved_while_actors_are_killed_at_random(
    ray_cluster: str, tmp_path: Path
) -> None:
    rng = random.Random(20240611)
    namespace = f"txc-{uuid.uuid4().hex[:8]}"
    storage = str(tmp_path / "storage")
    admin = aio.ServiceBusAdministrationClient(namespace, storage_path=storage)
    client = aio.ServiceBusClient(namespace, storage_path=storage)
    layout = {"c0": 1, "c1": 2, "c2": 3}
    queues = list(layout)
    try:
        await asyncio.gather(
            *(
                admin.create_queue(q, partition_count=n, lock_duration=LOCK)
                for q, n in layout.items()
            )
        )
        ids = [f"m{i:02d}" for i in range(40)]
        for q in queues:
            async with client.get_queue_sender(q) as s:
                await s.send_messages(
                    [
                        ServiceBusMessage(f"body-{oid}", application_properties={"oid": oid})
                        for i, oid in enumerate(ids)
                        if queues[i % 3] == q
                    ]
                )
        conn = client._conn
        routes = {q: await conn.registry.route.remote(q) for q in queues}
        victims = [(f"{q}/{pid}", h) for q in queues for pid, h in routes[q].existing()]
        await conn.coordinator.stats.remote()

        stats: Counter[str] = Counter()
        kills: Counter[str] = Counter()
        kill_log: list[str] = []
        history: dict[str, list[str]] = {oid: [] for oid in ids}
        stop = asyncio.Event()

        async def worker(seed: int) -> None:
            wr = random.Random(seed)
            while not stop.is_set():
                src = wr.choice(queues)
                dst = wr.choice([q for q in queues if q != src])
                try:
                    async with (
                        client.get_queue_receiver(src) as r,
                        client.get_queue_sender(dst) as s,
                    ):
                        got = await asyncio.wait_for(r.receive_messages(1, max_wait_time=0.5), 20)
                        if not got:
                            continue
                        m = got[0]
                        hops = int((m.application_properties or {}).get("hops", 0)) + 1
                        txn = client.transaction()
                        await r.complete_message(m, transaction=txn)
                        copy = ServiceBusMessage(
                            str(m), application_properties={"oid": _oid(m), "hops": hops}
                        )
                        await s.send_messages(copy, transaction=txn)
                        t0 = time.monotonic() - started
                        try:
                            await asyncio.wait_for(txn.commit(), 30)
                            result = "committed"
                        except TransactionAbortedError as exc:
                            result = f"aborted: {exc.reason}"
                            stats["aborted"] += 1
                        except (*UNKNOWN, asyncio.TimeoutError) as exc:
                            result = f"unknown: {type(exc).__name__}"
                            stats["unknown"] += 1
                        except ServiceBusError as exc:
                            result = f"unknown: {type(exc).__name__}: {exc}"
                            stats[f"unknown ({type(exc).__name__})"] += 1
                        else:
                            stats["committed"] += 1
                        history[_oid(m)].append(
                            f"{t0:5.2f}-{time.monotonic() - started:5.2f} s worker {seed} "
                            f"{src}/{m.partition_id} seq {m.sequence_number & 0xFFFFFFFFFFFF} "
                            f"dc {m.delivery_count} -> {dst} txn {txn.transaction_id[:8]} "
                            f"{result}"
                        )
                except (ServiceBusError, asyncio.TimeoutError) as exc:
                    stats[f"error outside commit ({type(exc).__name__})"] += 1
                    await asyncio.sleep(0.1)

        async def killer() -> None:
            end = time.monotonic() + 20
            while time.monotonic() < end:
                await asyncio.sleep(rng.uniform(0.3, 1.0))
                if rng.random() < 0.25:
                    name, handle = "coordinator", conn.coordinator
                else:
                    name, handle = rng.choice(victims)
                ray.kill(handle, no_restart=False)
                kills[name.split("/")[0]] += 1
                kill_log.append(f"{time.monotonic() - started:5.2f} s kill {name}")
            stop.set()

        started = time.monotonic()
        workers = [asyncio.ensure_future(worker(i)) for i in range(4)]
        await killer()
        await asyncio.wait_for(asyncio.gather(*workers), 90)
        churn_s = time.monotonic() - started

        # Drain everything (the receives also wake restarted partitions, which then settle
        # transactions they still hold) until every queue and dead-letter queue is empty.
        seen: Counter[str] = Counter()
        dead = 0
        deadline = time.monotonic() + 45
        quiet_since: float | None = None
        while True:
            took = 0
            for q in queues:
                for sub in (None, DLQ):
                    try:
                        async with client.get_queue_receiver(q, sub_queue=sub) as r:
                            got = await r.receive_messages(50, max_wait_time=0.3)
                            for m in got:
                                try:
                                    await r.complete_messages([m])
                                except ServiceBusError:
                                    continue  # delivered again later
                                seen[_oid(m)] += 1
                                history[_oid(m)].append(
                                    f"drained from {q}{'/DLQ' if sub else ''}/"
                                    f"{m.partition_id} seq {m.sequence_number & 0xFFFFFFFFFFFF} "
                                    f"dc {m.delivery_count} hops "
                                    f"{(m.application_properties or {}).get('hops', 0)}"
                                )
                                dead += sub is not None
                                took += 1
                    except ServiceBusError:
                        took += 1  # not quiet yet
            left = 0
            for q in queues:
                for sub in (None, DLQ):
                    async with client.get_queue_receiver(q, sub_queue=sub) as r:
                        left += len(await r.peek_messages(250))
            now = time.monotonic()
            if took or left:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since > STABLE_S:
                break
            if now >= deadline:
                pytest.fail(
                    f"not drained after 45 s: {left} left (held by transactions nobody "
                    f"resolves?), transactions {dict(stats)}\n"
                    + "\n".join(await _diagnose(conn, routes))
                    + "\nkills:\n"
                    + "\n".join(kill_log)
                )
            await asyncio.sleep(0.3)

        duplicates = {k: n for k, n in seen.items() if n > 1}
        missing = sorted(set(ids) - set(seen))
        summary = (
            f"conservation: {churn_s:.0f} s of churn, transactions {dict(stats)}, "
            f"kills {dict(kills)}, drained {sum(seen.values())} of {len(ids)} "
            f"({dead} from dead-letter queues), missing {missing}, duplicated {duplicates}"
        )
        SUMMARY.append(summary)
        print(summary)
        assert sum(kills.values()) >= 15
        assert stats["committed"] > 0
        if missing or duplicates:
            details = "\n".join(
                f"{oid}:\n  " + "\n  ".join(history[oid]) for oid in [*missing, *duplicates]
            )
            pytest.fail(f"{summary}\n{details}\nkills:\n" + "\n".join(kill_log))
        assert set(seen) == set(ids)
    finally:
        await asyncio.to_thread(_close_namespace, namespace, storage, queues)
