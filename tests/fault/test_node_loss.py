"""Multi-node: removing a Ray node that hosts partitions mid-stream loses nothing acknowledged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fault

SCENARIO = Path(__file__).with_name("node_loss_scenario.py")


def test_node_hosting_partitions_removed_mid_stream_loses_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    env.pop("RAYBUS_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, str(SCENARIO), str(tmp_path / "storage")],
        capture_output=True,
        text=True,
        timeout=420,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(result)
    assert result["victim_partitions"], "the removed node hosted no partition"
    assert not result["hung"]
    assert result["acked"] == 3000
    assert result["lost_count"] == 0, result["lost"]
    assert result["left_in_queue"] == 0
