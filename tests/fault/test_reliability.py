"""Jepsen-style reliability runs (``make fault``): the recorded workload of
``tests/helpers/workload.py`` runs while one kind of fault is injected at random moments; then
the queues are drained and ``tests/helpers/history.py`` checks every promise over the history.

Each run writes its counts (injections, messages checked, anomalies) to
``build/reliability/<name>.json`` (``RAYBUS_RELIABILITY_RESULTS`` to move it). Failing runs
print their anomalies with the evidence; the seed reproduces the workload's choices (the
broker's timing is not reproducible).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from faults import Scenario, results_dir, run_scenario
from history import History
from workload import _running, create_entities, kill_consumer, start_killable_consumer

from raybus import ServiceBusMessage, aio

pytestmark = [pytest.mark.fault, pytest.mark.timeout(150)]

SECONDS = 20.0

SCENARIOS = [
    Scenario("baseline-no-faults", 101, 10.0, ["none"]),
    Scenario("kill-partition", 102, SECONDS, ["partition"]),
    Scenario("kill-router", 103, SECONDS, ["router"], topic=True),
    Scenario("kill-coordinator", 104, SECONDS, ["coordinator"]),
    Scenario("kill-namespace", 105, SECONDS, ["namespace"]),
    Scenario("storage-enospc", 106, SECONDS, ["ENOSPC"]),
    Scenario("storage-eio", 107, SECONDS, ["EIO"]),
    Scenario("torn-log-tail", 108, SECONDS, ["torn-tail"]),
    Scenario(
        "crashed-and-stalled-consumers",
        109,
        SECONDS,
        ["none"],
        killable_consumer=True,
        interval=(2.0, 4.0),
        misbehave=0.08,
    ),
]


def assert_clean(result: dict[str, object]) -> None:
    anomalies = result["anomalies"]
    assert not anomalies, json.dumps(
        {k: result[k] for k in ("scenario", "seed", "anomalies", "anomaly_evidence", "fault_log")},
        indent=1,
    )[:12000]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_workload_under_fault_keeps_every_promise(
    ray_cluster: str, tmp_path: Path, scenario: Scenario
) -> None:
    result = await run_scenario(scenario, tmp_path / "storage")
    print(json.dumps({k: v for k, v in result.items() if k != "fault_log"}))
    assert result["messages_checked"] > 50, "the workload hardly ran"
    if scenario.faults != ["none"]:
        assert sum(result["injections"].values()) >= 3, result["injection_errors"]
    if scenario.killable_consumer:
        assert result["injections"].get("kill-consumer", 0) >= 1
        assert result["workload"]["dropped"] + result["workload"]["stalled"] >= 3
    assert_clean(result)


async def test_a_killed_consumer_has_stopped_before_its_history_is_read(
    ray_cluster: str, tmp_path: Path
) -> None:
    """``run_scenario`` reads a killed consumer's history as soon as ``kill_consumer``
    returns. A process still running then could settle a message after its file was read,
    and the checker would call that message lost (it did once, under load)."""
    namespace, storage = f"kill-{uuid.uuid4().hex[:6]}", str(tmp_path / "storage")
    admin = aio.ServiceBusAdministrationClient(namespace, storage_path=storage)
    client = aio.ServiceBusClient(namespace, storage_path=storage)
    await create_entities(admin, "work", "sessions")
    async with client.get_queue_sender("work") as sender:
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(100)])
    sink = tmp_path / "consumer.jsonl"
    for _ in range(3):
        consumer = start_killable_consumer(namespace, storage, "work", sink)
        while not sink.exists() or sink.stat().st_size == 0:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        await kill_consumer(consumer)
        assert not _running(consumer[2]), "kill_consumer returned while the process ran"
        size = sink.stat().st_size
        await asyncio.sleep(0.3)
        assert sink.stat().st_size == size, "the killed consumer wrote history afterwards"
    await client.close()


RESTART = Path(__file__).with_name("cluster_restart_scenario.py")


def _phase(phase: str, storage: Path, sink: Path, seed: int) -> dict[str, object]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.pop("RAYBUS_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, str(RESTART), phase, str(storage), str(sink), str(seed)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("seed", [201, 202])
def test_whole_cluster_stopped_mid_workload_and_restarted_keeps_every_promise(
    tmp_path: Path, seed: int
) -> None:
    """Ray itself goes away under the workload (every actor dies mid-call) and a fresh
    cluster starts on the same storage path; the history of both lives is checked as one."""
    storage, sink = tmp_path / "storage", tmp_path / "history.jsonl"
    started = time.monotonic()
    before = _phase("run", storage, sink, seed)
    after = _phase("recover", storage, sink, seed)
    h = History()
    h.extend(History.load_jsonl(sink))
    anomalies = h.check()
    counts = h.counts()
    result = {
        "scenario": f"cluster-restart-{seed}",
        "seed": seed,
        "seconds": round(time.monotonic() - started, 1),
        "injections": {"cluster-restart": 1},
        "messages_checked": counts.get("messages", 0),
        "events": counts,
        "before": before,
        "after": after,
        "anomalies": [str(a) for a in anomalies],
        "anomaly_evidence": [[repr(e) for e in a.evidence[:6]] for a in anomalies[:20]],
        "fault_log": [f"{before['stopped_at']:.2f} cluster-stop"],
    }
    (results_dir() / f"cluster-restart-{seed}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    assert result["messages_checked"] > 50
    assert after["received"] > 0, "the restarted cluster delivered nothing"
    assert_clean(result)
