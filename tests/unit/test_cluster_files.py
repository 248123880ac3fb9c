"""The deployment files in cluster/ parse and carry the settings the broker needs.

They are not run here (no cloud); ``cluster/local.sh`` is run by tests/fault/test_local_cluster.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"


def _load(name: str) -> Any:
    return yaml.safe_load((CLUSTER / name).read_text())


def test_ray_up_config_parses_with_fixed_workers_small_object_store_and_s3_storage() -> None:
    config = _load("ray-cluster.yaml")
    assert config["head_node_type"] in config["available_node_types"]
    assert config["provider"]["type"]
    workers = [
        t for name, t in config["available_node_types"].items() if name != config["head_node_type"]
    ]
    assert workers and all(t["min_workers"] == t["max_workers"] for t in workers)
    for commands in (config["head_start_ray_commands"], config["worker_start_ray_commands"]):
        start = " ".join(commands)
        assert "RAYBUS_STORAGE_PATH=s3://" in start
        assert "--object-store-memory=268435456" in start
    assert "--num-cpus=0" in " ".join(config["head_start_ray_commands"])


def test_kuberay_manifest_parses_with_fixed_workers_resources_and_s3_storage() -> None:
    manifest = _load("kuberay-raycluster.yaml")
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayCluster"
    spec = manifest["spec"]
    assert spec["enableInTreeAutoscaling"] is False
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    groups = spec["workerGroupSpecs"]
    assert groups and all(g["minReplicas"] == g["maxReplicas"] == g["replicas"] for g in groups)
    for pod in [head["template"], *(g["template"] for g in groups)]:
        [container] = pod["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["RAYBUS_STORAGE_PATH"].startswith("s3://")
        assert container["resources"]["requests"]["memory"]
        assert container["resources"]["limits"]["memory"]
        assert pod["spec"]["restartPolicy"] == "Always"
    for params in [head["rayStartParams"], *(g["rayStartParams"] for g in groups)]:
        assert int(params["object-store-memory"]) <= 512 * 1024 * 1024


def test_local_cluster_script_has_help_without_starting_ray() -> None:
    proc = subprocess.run(
        [sys.executable, str(CLUSTER / "local.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for command in ("start", "stop", "status"):
        assert command in proc.stdout
    assert (CLUSTER / "local.sh").stat().st_mode & 0o111  # executable
