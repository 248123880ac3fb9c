#!/usr/bin/env python3
"""A multi-node Ray cluster on this machine, for trying raybus across nodes (and for tests).

    cluster/local.sh start [--workers N] [--storage PATH] [--dir DIR] [--cpus N]
    cluster/local.sh status [--dir DIR]
    cluster/local.sh stop [--dir DIR]

``start`` runs one head and N worker nodes, each a node process of this script (below) bound
to 127.0.0.1 with its own temp dir under DIR (default ``$RAYBUS_LOCAL_DIR`` or
``/tmp/raybus-local``; keep it short: Ray's socket paths must fit 107 bytes), records them in
DIR/cluster.json and prints the ``export`` lines to use it (so ``eval "$(cluster/local.sh
start)"`` works; progress goes to stderr). ``stop`` ends exactly those nodes: SIGTERM to each
recorded ``ray start`` process (which stops its node's Ray processes), then SIGKILL to the
process groups and to any process whose command line names DIR. It never runs ``ray stop``,
which would stop every Ray on the machine.

Why not ``ray start``: with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (Ray's "loopback only"
switch, which raybus sets everywhere) ``ray start --address`` refuses to add a node, and with
``=1`` it rewrites 127.0.0.1 into the machine's external address, for the GCS address and the
node's own. So each node is started the way ``ray.cluster_utils.Cluster.add_node`` (Ray's own
multi-node-on-one-machine helper) does it, with ``ray._private.node.Node`` and
``node_ip_address="127.0.0.1"``, in a process that blocks like ``ray start --block`` and stops
its node's processes on SIGTERM. Unlike ``Cluster``, it neither writes nor deletes
``/tmp/ray/ray_current_cluster``, so ``ray.init(address="auto")`` elsewhere on the machine is
not redirected to this cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_DIR = os.environ.get("RAYBUS_LOCAL_DIR", "/tmp/raybus-local")
STATE = "cluster.json"
READY = "raybus local node started"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Every listener on 127.0.0.1; with "1" Ray would turn 127.0.0.1 into the external address.
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")  # no Serve to drain
    for name in ("RAY_ADDRESS", "RAYBUS_ADDRESS"):
        env.pop(name, None)  # `ray start` must not join some other cluster
    return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _processes_naming(path: str) -> list[int]:
    """Pids of processes whose command line contains ``path`` (this cluster's temp dirs)."""
    try:
        out = subprocess.run(
            ["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    pids = []
    for line in out.splitlines():
        pid_text, _, args = line.strip().partition(" ")
        if (
            path in args
            and pid_text.isdigit()
            and int(pid_text) != os.getpid()
            and _alive(int(pid_text))
        ):
            pids.append(int(pid_text))
    return pids


def _load(root: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((root / STATE).read_text())
        return state
    except (OSError, ValueError):
        return None


def _start_node(root: Path, name: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    temp_dir = root / name
    temp_dir.mkdir(parents=True, exist_ok=True)
    log_path = root / f"{name}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "_node", f"--temp-dir={temp_dir}", *args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: stop can kill the whole node
        )
    node = {"name": name, "pid": proc.pid, "temp_dir": str(temp_dir), "log": str(log_path)}
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if READY in log_path.read_text(errors="replace"):
            return node
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name} exited with {proc.returncode} while starting:\n{tail}")
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not start within {START_TIMEOUT_S:.0f} s (see {log_path})")


def run_node(opts: argparse.Namespace) -> int:
    """One node, in this process until SIGTERM/SIGINT (the ``_node`` subcommand)."""
    import ray._private.node
    import ray._private.parameter

    kwargs: dict[str, Any] = {
        "node_ip_address": "127.0.0.1",
        "num_cpus": opts.cpus,
        "num_gpus": 0,
        "object_store_memory": opts.object_store_mb << 20,
        "temp_dir": opts.temp_dir,
        "min_worker_port": 0,
        "max_worker_port": 0,
        "dashboard_agent_listen_port": _free_port(),
        "node_name": Path(opts.temp_dir).name,
    }
    if opts.head:
        kwargs.update(gcs_server_port=opts.port, include_dashboard=False)
    else:
        kwargs.update(gcs_address=opts.address, node_manager_port=0)
    params = ray._private.parameter.RayParams(**kwargs)
    # spawn_reaper: the node's processes die with this one even if it is SIGKILLed.
    node = ray._private.node.Node(params, head=opts.head, shutdown_at_exit=False, spawn_reaper=True)

    def _shutdown(signum: int, frame: Any) -> None:
        node.kill_all_processes(check_alive=False, allow_graceful=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, _shutdown)
    signal.signal(signal.SIGINT, _shutdown)
    print(f"{READY}: {Path(opts.temp_dir).name} at {node.gcs_address}", flush=True)
    while True:
        signal.pause()


def start(opts: argparse.Namespace) -> int:
    root = Path(opts.dir).resolve()
    state = _load(root)
    if state and any(_alive(n["pid"]) for n in state["nodes"]):
        print(
            f"error: a local cluster is already running in {root}; stop it first", file=sys.stderr
        )
        return 1
    root.mkdir(parents=True, exist_ok=True)
    storage = (
        str(Path(opts.storage).expanduser().resolve()) if opts.storage else str(root / "storage")
    )
    if "://" not in storage:
        Path(storage).mkdir(parents=True, exist_ok=True)
    env = _env()
    port = _free_port()
    address = f"127.0.0.1:{port}"
    common = [f"--cpus={opts.cpus}", f"--object-store-mb={opts.object_store_mb}"]
    nodes: list[dict[str, Any]] = []
    state = {"address": address, "storage": storage, "root": str(root), "nodes": nodes}
    try:
        print(f"starting head node at {address} ...", file=sys.stderr)
        nodes.append(
            _start_node(
                root,
                "head",
                ["--head", f"--port={port}", *common],
                env,
            )
        )
        (root / STATE).write_text(json.dumps(state, indent=2))
        for i in range(1, opts.workers + 1):
            print(f"starting worker node {i} ...", file=sys.stderr)
            nodes.append(_start_node(root, f"worker{i}", [f"--address={address}", *common], env))
            (root / STATE).write_text(json.dumps(state, indent=2))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        _stop_nodes(root, nodes)
        (root / STATE).unlink(missing_ok=True)
        return 1
    print(
        f"local Ray cluster up: head + {opts.workers} worker node(s) on 127.0.0.1; "
        f"logs in {root}; stop with: cluster/local.sh stop --dir {root}",
        file=sys.stderr,
    )
    print(f"export RAYBUS_ADDRESS={address}")
    print(f"export RAYBUS_STORAGE_PATH={storage}")
    print("export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0")
    return 0


def _stop_nodes(root: Path, nodes: list[dict[str, Any]]) -> list[int]:
    """Stop the nodes (workers first); return pids still alive afterwards (none if it
    worked)."""
    for node in reversed(nodes):
        if _alive(node["pid"]):
            try:
                os.kill(node["pid"], signal.SIGTERM)  # ray start --block stops its processes
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(_alive(n["pid"]) for n in nodes):
        time.sleep(0.2)
    for node in nodes:
        try:
            os.killpg(node["pid"], signal.SIGKILL)  # the group is the node's (own session)
        except (ProcessLookupError, PermissionError):
            pass
    # Workers and agents that left the group: anything naming this cluster's directory.
    leftovers = _processes_naming(str(root) + os.sep)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    remaining = _processes_naming(str(root) + os.sep)
    while remaining and time.monotonic() < deadline:
        time.sleep(0.2)
        remaining = _processes_naming(str(root) + os.sep)
    return remaining


def stop(opts: argparse.Namespace) -> int:
    root = Path(opts.dir).resolve()
    state = _load(root)
    nodes = state["nodes"] if state else []
    remaining = _stop_nodes(root, nodes)
    (root / STATE).unlink(missing_ok=True)
    if remaining:
        print(f"error: processes still running: {remaining}", file=sys.stderr)
        return 1
    print(
        f"stopped the local cluster in {root}" if state else f"no cluster in {root}",
        file=sys.stderr,
    )
    return 0


def status(opts: argparse.Namespace) -> int:
    root = Path(opts.dir).resolve()
    state = _load(root)
    if not state:
        print(f"no local cluster in {root}")
        return 3
    host, _, port = state["address"].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            gcs = "reachable"
    except OSError:
        gcs = "unreachable"
    nodes = [{**n, "alive": _alive(n["pid"])} for n in state["nodes"]]
    if opts.json:
        print(json.dumps({**state, "gcs": gcs, "nodes": nodes}))
    else:
        print(f"address {state['address']} (GCS {gcs}); storage {state['storage']}")
        for n in nodes:
            print(
                f"  {n['name']:<10} pid {n['pid']:<8} {'up' if n['alive'] else 'DOWN'}  {n['log']}"
            )
    return 0 if gcs == "reachable" and all(n["alive"] for n in nodes) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cluster/local.sh", description="A multi-node Ray cluster on 127.0.0.1 for raybus."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="start a head and N worker nodes")
    p_start.add_argument("--workers", type=int, default=2, help="worker nodes (default 2)")
    p_start.add_argument(
        "--storage", help="RAYBUS_STORAGE_PATH for all nodes (default DIR/storage)"
    )
    p_start.add_argument("--cpus", type=int, default=1, help="CPUs per node (default 1)")
    p_start.add_argument(
        "--object-store-mb", type=int, default=100, help="object store per node (default 100)"
    )
    for p in (p_start, sub.add_parser("stop", help="stop the nodes"), sub.add_parser("status")):
        p.add_argument("--dir", default=DEFAULT_DIR, help=f"state and temp dir ({DEFAULT_DIR})")
    sub.choices["status"].add_argument("--json", action="store_true")
    p_node = sub.add_parser("_node", help=argparse.SUPPRESS)  # one node; used by start
    p_node.add_argument("--head", action="store_true")
    p_node.add_argument("--port", type=int)
    p_node.add_argument("--address")
    p_node.add_argument("--temp-dir", required=True)
    p_node.add_argument("--cpus", type=int, default=1)
    p_node.add_argument("--object-store-mb", type=int, default=100)
    opts = parser.parse_args(argv)
    if opts.command == "start" and opts.workers < 0:
        parser.error("--workers must be >= 0")
    handler = {"start": start, "stop": stop, "status": status, "_node": run_node}[opts.command]
    return handler(opts)


if __name__ == "__main__":
    sys.exit(main())
