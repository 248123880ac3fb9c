"""Durability across restarts under load and of a whole cluster (``make fault``: each takes
8-25 s, so they stay out of the default suite).

The whole-cluster restart runs two separate Ray clusters in subprocesses on the same storage
path (the session's own cluster stays up); the load test kills a partition actor while a
sender and a receiver run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import ray

from raybus import ServiceBusMessage

pytestmark = pytest.mark.fault
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def namespace(ray_cluster: str) -> str:
    return f"dur-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def storage(tmp_path: Path) -> str:
    return str(tmp_path / "storage")


_PHASE = textwrap.dedent(
    """
    import os, sys, json
    from datetime import datetime, timedelta, timezone
    import ray, raybus
    from raybus import ServiceBusMessage
    from raybus.management import ServiceBusAdministrationClient
    phase, storage, ns = sys.argv[1], sys.argv[2], sys.argv[3]
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=100 * 1024 * 1024, logging_level="ERROR", log_to_driver=False)
    client = raybus.connect(ns, storage_path=storage)
    admin = ServiceBusAdministrationClient(ns, storage_path=storage)
    out = {}
    if phase == "write":
        admin.create_queue("work", lock_duration=timedelta(seconds=30))
        with client.get_queue_sender("work") as s:
            s.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(30)])
            later = datetime.now(timezone.utc) + timedelta(hours=1)
            out["scheduled"] = s.schedule_messages(ServiceBusMessage("later"), later)
        with client.get_queue_receiver("work", max_wait_time=5) as r:
            got = r.receive_messages(10)
            r.complete_messages(got[:5])
            r._aio  # the rest: one dead-lettered, one deferred, three left locked
            r.dead_letter_message(got[5], reason="Bad", error_description="why")
            r.defer_message(got[6])
            out["deferred"] = got[6].sequence_number
            out["dead"] = got[5].sequence_number
            out["completed"] = [m.message_id for m in got[:5]]
        out["last_seq"] = max(m.sequence_number for m in got)
    else:
        props = admin.get_queue_runtime_properties("work")
        out["counts"] = [props.active_message_count, props.dead_letter_message_count,
                         props.scheduled_message_count]
        with client.get_queue_receiver("work", max_wait_time=3) as r:
            ids = []
            while batch := r.receive_messages(100):
                ids += [m.message_id for m in batch]
                r.complete_messages(batch)
            out["ids"] = ids
            out["deferred"] = [m.sequence_number for m in r.receive_deferred_messages(
                [int(sys.argv[4])])]
        with client.get_queue_receiver("work", sub_queue="deadletter", max_wait_time=3) as d:
            out["dead"] = [(m.sequence_number, m.dead_letter_reason) for m in d.receive_messages(5)]
        with client.get_queue_sender("work") as s:
            s.send_messages(ServiceBusMessage("new"))
        with client.get_queue_receiver("work", max_wait_time=3) as r:
            out["new_seq"] = r.receive_messages(1)[0].sequence_number
    ray.shutdown()
    print("RESULT", json.dumps(out))
    """
)


def _phase(*args: str) -> dict:
    import json

    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _PHASE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :]))


def test_a_fresh_cluster_with_the_same_storage_path_has_everything_back(
    ray_cluster: str, tmp_path: Path
) -> None:
    # Two separate Ray clusters (in subprocesses; the session's own cluster stays up).
    storage, ns = str(tmp_path / "store"), f"restart-{uuid.uuid4().hex[:6]}"
    before = _phase("write", storage, ns)
    after = _phase("read", storage, ns, str(before["deferred"]))
    # 30 sent, 5 completed, 1 dead-lettered, 1 deferred: 23 active + 1 deferred.
    assert after["counts"] == [24, 1, 1]
    assert len(after["ids"]) == 23 and not set(before["completed"]) & set(after["ids"])
    assert after["deferred"] == [before["deferred"]]
    assert after["dead"] == [[before["dead"], "Bad"]]
    assert after["new_seq"] > max(before["last_seq"], *before["scheduled"])
    _ = datetime.now(timezone.utc)


@pytest.mark.parametrize("prefetch", [0, 100])
async def test_partition_killed_under_load_loses_no_acknowledged_message(
    namespace: str, storage: str, prefetch: int
) -> None:
    """A sender and a receiver run while the partition actor is killed (and restarted by
    Ray). Every acknowledged send is received; a message comes twice only if the completion
    of its earlier delivery was not acknowledged (its lock died with the actor). With
    ``prefetch`` the receiver's ``complete_messages`` refills its buffer in the same call
    (``settle_receive``): messages it holds when the actor dies come out of the buffer with
    dead locks, and their completion is refused."""
    import asyncio

    from raybus import aio
    from raybus.exceptions import ServiceBusError

    admin = aio.ServiceBusAdministrationClient(namespace, storage_path=storage)
    client = aio.ServiceBusClient(namespace, storage_path=storage)
    await admin.create_queue(
        "load", requires_duplicate_detection=True, lock_duration=timedelta(seconds=5)
    )
    acked: set[str] = set()
    received: dict[str, int] = {}
    unacked_completion: set[str] = set()
    refills: list[bool] = []  # per complete_messages: did it refill the buffer
    sending_done = asyncio.Event()

    async def sender() -> None:
        async with client.get_queue_sender("load") as s:
            for batch in range(60):
                ids = [f"{batch}-{i}" for i in range(20)]
                msgs = [ServiceBusMessage(i, message_id=i) for i in ids]
                for _attempt in range(40):  # duplicate detection makes retries idempotent
                    try:
                        await s.send_messages(msgs)
                        acked.update(ids)
                        break
                    except ServiceBusError:
                        await asyncio.sleep(0.25)
                await asyncio.sleep(0.02)
        sending_done.set()

    async def receiver() -> None:
        await asyncio.sleep(0.6)  # a backlog builds up, so the kill hits stored messages
        r = client.get_queue_receiver("load", max_wait_time=1, prefetch_count=prefetch)
        idle = 0
        while idle < 3:
            try:
                batch = await r.receive_messages(50)
            except ServiceBusError:
                await asyncio.sleep(0.25)
                continue
            if not batch:
                idle = idle + 1 if sending_done.is_set() else 0
                continue
            for m in batch:
                received[str(m)] = received.get(str(m), 0) + 1
            held = len(r._buffer)
            try:
                await r.complete_messages(batch)
            except ServiceBusError:
                unacked_completion.update(str(m) for m in batch)
            refills.append(len(r._buffer) > held)
        try:
            await r.close()
        except ServiceBusError:
            pass

    async def killer() -> None:
        await asyncio.sleep(0.4)
        route = await client._conn.route("load")
        ray.kill(route.partitions[0], no_restart=False)

    await asyncio.wait_for(asyncio.gather(sender(), receiver(), killer()), 180)
    assert acked, "nothing was acknowledged"
    assert acked <= set(received), f"lost: {sorted(acked - set(received))[:5]}"
    twice = {i for i, n in received.items() if n > 1}
    assert twice <= unacked_completion, f"illegal duplicates: {sorted(twice)[:5]}"
    assert any(refills) == bool(prefetch)  # the refill path ran (only) with prefetch
