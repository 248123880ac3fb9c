"""One phase of the whole-cluster restart run (``test_reliability.py`` starts it twice, each
time in its own process with its own local Ray, since a Ray cluster cannot be restarted inside
the session's process).

``run``: start Ray, create the entities, run the recorded workload, and at a random moment
record the fault and shut the whole Ray cluster down under the workload's feet (every actor
dies mid-call; nothing is flushed on purpose). ``recover``: start a fresh Ray on the same
``storage_path``, run the workload a little more (receivers then see what survived), drain and
record what is left. Both append to one JSON-lines history file; the test checks it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))

import ray
from history import Fault, History
from ray_local import local_ray
from workload import Workload, create_entities, drain

from raybus import aio

NAMESPACE = "restart"
Q, SQ = "work", "sessions"


async def run(storage: str, sink: Path, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    h = History(sink)
    admin = aio.ServiceBusAdministrationClient(NAMESPACE, storage_path=storage)
    client = aio.ServiceBusClient(NAMESPACE, storage_path=storage)
    await create_entities(admin, Q, SQ)
    wl = Workload(client, h, Q, SQ, seed=seed)
    wl.start()
    await asyncio.sleep(rng.uniform(6.0, 10.0))
    at = time.time()
    h.add(Fault("cluster-stop", at, at, None, None, True))
    ray.shutdown()  # the whole cluster, actors mid-call
    for task in wl._tasks:
        task.cancel()
    await asyncio.wait(wl._tasks, timeout=10)
    return {"sent": wl.stats.sent, "received": wl.stats.received, "stopped_at": at}


async def recover(storage: str, sink: Path, seed: int) -> dict[str, object]:
    h = History(sink)
    client = aio.ServiceBusClient(NAMESPACE, storage_path=storage)
    started = time.monotonic()
    wl = Workload(client, h, Q, SQ, seed=seed + 1000, misbehave=0.0)
    wl.start()
    # Four seconds of work once the fresh cluster answers: under two CPU hogs its actors took
    # longer than four seconds to start, and the run ended before any receive (2026-12-07).
    deadline = time.monotonic() + 60.0
    while wl.stats.received == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(4.0)
    await wl.stop()
    found = await drain(client, h, [Q, SQ])
    return {
        "received": wl.stats.received,
        "left": found,
        "recover_s": round(time.monotonic() - started, 1),
    }


def main() -> None:
    phase, storage, sink, seed = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    loop = asyncio.new_event_loop()
    with local_ray(object_store_mb=150):
        body = run if phase == "run" else recover
        out = loop.run_until_complete(body(storage, sink, seed))
    print(json.dumps(out), flush=True)
    # Not loop.close(): tasks cancelled under a dead Ray may leave executor threads behind.
    os._exit(0)


if __name__ == "__main__":
    main()
