"""cluster/local.sh: a head and two worker nodes on 127.0.0.1, used by the raybus CLI.

A ``fault`` test (``make fault``) rather than an integration test because it starts a second
Ray cluster of three nodes beside the session's: on the two-core machines here that takes 20 s
to over a minute when the machine is busy, and its extra processes would slow the integration
suite's timing-sensitive tests. It uses its own directory under /tmp (short: Ray's socket paths
must fit 107 bytes), never ``ray stop``, and checks that nothing of that cluster is left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.fault

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "cluster" / "local.sh"
NODES = """
import json, ray
ray.init(address="{address}", logging_level="ERROR", log_to_driver=False)
print(json.dumps([[n["NodeManagerAddress"], n["Alive"]] for n in ray.nodes()]))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHON=sys.executable)
    for name in ("RAY_ADDRESS", "RAYBUS_ADDRESS", "RAYBUS_NAMESPACE"):
        env.pop(name, None)
    return env


def _processes_naming(path: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True)
    return [
        line
        for line in out.stdout.splitlines()
        if path in line and line.split()[1][:1] != "Z" and "pytest" not in line
    ]


@pytest.fixture
def cluster_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rbl-", dir="/tmp"))
    try:
        yield path
    finally:
        subprocess.run(
            [str(SCRIPT), "stop", "--dir", str(path)], env=_env(), capture_output=True, timeout=120
        )
        shutil.rmtree(path, ignore_errors=True)


def test_two_worker_local_cluster_runs_raybus_cli_and_stops_cleanly(cluster_dir: Path) -> None:
    env = _env()
    started = subprocess.run(
        [str(SCRIPT), "start", "--workers", "2", "--dir", str(cluster_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert started.returncode == 0, started.stderr[-3000:]
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for line in started.stdout.splitlines()
        if line.startswith("export ")
    )
    address = exports["RAYBUS_ADDRESS"]
    assert address.startswith("127.0.0.1:")
    assert exports["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    storage = exports["RAYBUS_STORAGE_PATH"]
    assert Path(storage).is_dir()

    status = subprocess.run(
        [str(SCRIPT), "status", "--dir", str(cluster_dir), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert [n["name"] for n in json.loads(status.stdout)["nodes"]] == ["head", "worker1", "worker2"]

    nodes = subprocess.run(
        [sys.executable, "-c", NODES.format(address=address)],
        env={**env, **exports},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert nodes.returncode == 0, nodes.stderr[-3000:]
    seen = json.loads(nodes.stdout.strip().splitlines()[-1])
    assert len(seen) == 3 and all(ip == "127.0.0.1" and alive for ip, alive in seen)

    cli_env = {**env, **exports, "RAYBUS_NAMESPACE": f"local-{uuid.uuid4().hex[:6]}"}
    raybus = [sys.executable, "-m", "raybus.cli"]

    def cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*raybus, *args],
            env=cli_env,
            input=input,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    cli("queue", "create", "orders", "--partitions", "3")
    cli("send", "orders", input="one\ntwo\nthree\n")
    received = cli("receive", "orders", "--count", "3", "--wait", "30", "--complete")
    bodies = sorted(json.loads(line)["body"] for line in received.stdout.splitlines())
    assert bodies == ["one", "three", "two"]
    assert any(Path(storage).iterdir())  # the namespace wrote to the shared storage path

    stopped = subprocess.run(
        [str(SCRIPT), "stop", "--dir", str(cluster_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stopped.returncode == 0, stopped.stderr
    assert _processes_naming(str(cluster_dir)) == []
    assert not (cluster_dir / "cluster.json").exists()
    down = subprocess.run(
        [str(SCRIPT), "status", "--dir", str(cluster_dir)], env=env, capture_output=True
    )
    assert down.returncode == 3  # no cluster
