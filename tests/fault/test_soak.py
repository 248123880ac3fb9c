"""Soak (``make soak``): the recorded workload runs for ``RAYBUS_SOAK_SECONDS`` (default 600)
while every kind of in-cluster fault is injected at random: partition, router, coordinator and
namespace actors killed, ENOSPC and EIO on a live partition's log, torn log tails, consumer
processes killed, consumers that crash or stall. Then the history is checked as in
``test_reliability.py`` and the counts written to ``build/reliability/soak-<seed>.json``.

(The whole-cluster restart needs its own Ray per life: ``test_reliability.py`` runs it.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from faults import Scenario, run_scenario
from test_reliability import assert_clean

SOAK_S = float(os.environ.get("RAYBUS_SOAK_SECONDS", "600"))
SEED = int(os.environ.get("RAYBUS_SOAK_SEED", "4242"))
FAULTS = ["partition", "router", "coordinator", "namespace", "ENOSPC", "EIO", "torn-tail", "none"]

pytestmark = [pytest.mark.soak, pytest.mark.timeout(SOAK_S + 400)]


async def test_soak_with_random_faults_keeps_every_promise(
    ray_cluster: str, tmp_path: Path
) -> None:
    scenario = Scenario(
        f"soak-{SEED}",
        SEED,
        SOAK_S,
        FAULTS,
        interval=(1.5, 4.0),
        topic=True,
        killable_consumer=True,
        misbehave=0.03,
    )
    result = await run_scenario(scenario, tmp_path / "storage")
    print(json.dumps({k: v for k, v in result.items() if k != "fault_log"}))
    assert result["messages_checked"] > SOAK_S * 5, "the workload hardly ran"
    expected = {f"kill-{k}" for k in ("partition", "router", "coordinator", "namespace")}
    if SOAK_S >= 300:  # long enough that every kind must have come up
        expected |= {"storage-ENOSPC", "storage-EIO", "torn-tail", "kill-consumer"}
        assert expected <= set(result["injections"]), result["injections"]
    assert_clean(result)
