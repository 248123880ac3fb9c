"""Jepsen-style reliability runs (``make fault``): the recorded workload of
``tests/helpers/workload.py`` runs while one kind of fault is injected at random moments; then
the queues are drained and ``tests/helpers/history.py`` checks every promise over the history.

Each run writes its counts (injections, messages checked, anomalies) to
``build/reliability/<name>.json`` (``RAYBUS_RELIABILITY_RESULTS`` to move it). Failing runs
print their anomalies with the evidence; the seed reproduces the workload's choices (the
broker's timing is not reproducible).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from faults import Scenario, run_scenario

pytestmark = [pytest.mark.fault, pytest.mark.timeout(150)]

SECONDS = 25.0

SCENARIOS = [
    Scenario("baseline-no-faults", 101, 12.0, ["none"]),
    Scenario("kill-partition", 102, SECONDS, ["partition"]),
    Scenario("kill-router", 103, SECONDS, ["router"], topic=True),
    Scenario("kill-coordinator", 104, SECONDS, ["coordinator"]),
    Scenario("kill-namespace", 105, SECONDS, ["namespace"]),
    Scenario("storage-enospc", 106, SECONDS, ["ENOSPC"]),
    Scenario("storage-eio", 107, SECONDS, ["EIO"]),
    Scenario("torn-log-tail", 108, SECONDS, ["torn-tail"]),
    Scenario(
        "crashed-and-stalled-consumers", 109, SECONDS, ["none"], killable_consumer=True,
        interval=(2.0, 4.0), misbehave=0.08,
    ),
]


def assert_clean(result: dict[str, object]) -> None:
    anomalies = result["anomalies"]
    assert not anomalies, json.dumps(
        {k: result[k] for k in ("scenario", "seed", "anomalies", "anomaly_evidence",
                                "fault_log")}, indent=1
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
    assert_clean(result)
