"""Helpers shared by the benchmark scripts: payloads, deadlines, a watchdog, machine facts.

Imported by the scripts in this folder as ``_common`` (they run with this folder on sys.path).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray

import raybus

ROOT = Path(__file__).resolve().parent.parent


class BenchError(RuntimeError):
    """A measurement failed (timeout, wrong count, lost or duplicated message)."""


def make_body(i: int, size: int) -> bytes:
    """A distinct ``size``-byte body per message: its index, then filler."""
    return i.to_bytes(8, "big") + b"\xa5" * (size - 8)


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


class Deadline:
    def __init__(self, seconds: float, what: str) -> None:
        self.at = time.monotonic() + seconds
        self.seconds = seconds
        self.what = what

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise BenchError(f"{self.what}: not done within {self.seconds:g} s")
        return left


def actor_pids() -> list[tuple[int, str]]:
    """raybus actor processes on this machine (read-only; for py-spy dumps)."""
    out = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd.startswith(("ray::PartitionActor", "ray::NamespaceActor")):
            out.append((int(entry), cmd))
    return out


def py_spy_dump(pid: int, timeout: float = 20.0) -> str:
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return "(py-spy not installed)"
    try:
        res = subprocess.run(
            [str(spy), "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return (res.stdout + res.stderr).strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(py-spy failed: {exc!r})"


def kill_children() -> None:
    """SIGKILL the processes this process started (by pid, via /proc; Linux only)."""
    me = os.getpid()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me:
            with contextlib.suppress(OSError):
                os.kill(int(entry), 9)


class Watchdog:
    """Last resort when a call without a timeout hangs (a stuck actor): dump this process's
    stacks and py-spy dumps of raybus's actors, kill the Ray cluster this process started,
    delete the storage directory and exit with status 3."""

    def __init__(self, cleanup: Callable[[], None] = lambda: None) -> None:
        self._cond = threading.Condition()
        self._due: float | None = None
        self._what = ""
        self._cleanup = cleanup
        threading.Thread(target=self._run, name="bench-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def armed(self, seconds: float, what: str) -> Iterator[None]:
        with self._cond:
            self._due, self._what = time.monotonic() + seconds, what
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._due = None
                self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                if self._due is None:
                    self._cond.wait()
                    continue
                left = self._due - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                break
        print(f"\nWATCHDOG: {self._what} is stuck; stacks follow, then exit", file=sys.stderr)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for pid, cmd in actor_pids():
            print(f"\n--- py-spy dump {pid} {cmd}\n{py_spy_dump(pid)}", file=sys.stderr)
        kill_children()
        with contextlib.suppress(Exception):
            self._cleanup()
        os._exit(3)


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": sys.version.split()[0],
        "python_impl": platform.python_implementation(),
        "ray": ray.__version__,
        "raybus": raybus.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    try:
        with open("/proc/cpuinfo") as f:
            models = {ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")}
        facts["cpu_model"] = sorted(models)
    except OSError:
        pass
    try:  # read-only git facts
        facts["git_commit"] = (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            or None
        )
        # Uncommitted changes to the package make the commit alone an incomplete description.
        facts["git_modified"] = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "raybus"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        facts["git_commit"] = None
    return facts


def write_results(
    name: str,
    started: float,
    args: Any,
    facts: dict[str, Any],
    body: dict[str, Any],
    *,
    hidden: tuple[str, ...] = (),
) -> Path:
    """Write a run's JSON (settings, machine facts and ``body``) to ``args.output`` or
    ``benchmarks/results/<name>-<timestamp>.json``; returns the path."""
    facts["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    out = args.output or Path(__file__).resolve().parent / "results" / f"{name}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in hidden
    }
    record = {
        "benchmark": name,
        "started_at": started,
        "duration_s": time.time() - started,
        "settings": settings,
        "machine": facts,
        **body,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    return Path(out)


def report_errors(errors: list[str]) -> None:
    """Print failures to stderr (the caller then exits non-zero)."""
    if errors:
        print(f"\n{len(errors)} FAILURE(S):", file=sys.stderr)
        for e in errors:
            print(f"  - {e}", file=sys.stderr)
