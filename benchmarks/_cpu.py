"""CPU accounting of a benchmark's processes from ``/proc`` (Linux): the CPU seconds of this
process and of every process it started (this Ray cluster only), grouped by role (driver,
partition actors, bare actors, registry, the rest of Ray), and the whole machine's busy time,
so that a rate on a small shared machine comes with what limited it. Read-only.

Imported by the scripts in this folder as ``_cpu``.
"""

from __future__ import annotations

import os
import threading
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(path: str) -> tuple[int, float]:
    """(parent pid, user + system CPU seconds so far) from a ``/proc`` stat file."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds so far of process ``pid`` (all its threads), or of its thread
    ``thread``; 0.0 once it is gone (Linux /proc)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        return _stat(path)[1]
    except (OSError, IndexError):
        return 0.0


def _proc_table() -> dict[int, tuple[int, float, str]]:
    """pid -> (parent pid, CPU seconds so far, command line) of every process (Linux)."""
    out: dict[int, tuple[int, float, str]] = {}
    if not os.path.isdir("/proc"):
        return out
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid, cpu = _stat(f"/proc/{entry}/stat")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        out[int(entry)] = (ppid, cpu, cmd)
    return out


def _group(pid: int, cmd: str) -> str:
    if pid == os.getpid():
        return "driver"
    if cmd.startswith("ray::PartitionActor"):
        return "partitions"
    if cmd.startswith("ray::BareQueue"):
        return "bare"
    if cmd.startswith("ray::NamespaceActor"):
        return "registry"
    return "ray"  # gcs, raylet, idle workers, agents


def cpu_snapshot() -> dict[int, tuple[str, float]]:
    """CPU seconds of this process and every process it started (this Ray cluster only: other
    Ray clusters on the machine are not descendants), by pid."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _cpu, _cmd) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, tuple[str, float]] = {}
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in out:
            out[pid] = (_group(pid, table[pid][2]), table[pid][1])
            todo.extend(children.get(pid, ()))
    busy = _machine_busy()
    if busy is not None:
        out[-1] = ("machine", busy)
    return out


def _machine_busy() -> float | None:
    """CPU seconds the whole machine spent busy (every process, ours and others')."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal ...: busy = all but idle and iowait
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICK


def cpu_used(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], seconds: float
) -> dict[str, float]:
    """Cores used per group over ``seconds`` (CPU seconds / wall seconds)."""
    groups: dict[str, float] = {}
    for pid, (group, cpu) in after.items():
        prev = before.get(pid)
        delta = cpu - (prev[1] if prev is not None else 0.0)
        groups[group] = groups.get(group, 0.0) + max(0.0, delta)
    if seconds <= 0:
        return {}
    machine = groups.pop("machine", None)
    if machine is not None:  # everything else running on the machine meanwhile
        groups["others"] = max(0.0, machine - sum(groups.values()))
    return {g: round(v / seconds, 3) for g, v in sorted(groups.items())}


class CpuSampler:
    """Samples ``cpu_snapshot`` every ``interval`` seconds in a thread (the event loop may
    stall; this does not): cores used per group in each interval, for the pause timeline."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.samples: list[tuple[float, dict[str, float]]] = []  # (end time, cores by group)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        prev, t_prev = cpu_snapshot(), time.time()
        while not self._stop.wait(self.interval):
            cur, now = cpu_snapshot(), time.time()
            self.samples.append((now, cpu_used(prev, cur, now - t_prev)))
            prev, t_prev = cur, now
