"""Helpers shared by the benchmark scripts: the environment for Ray, starting the local
cluster, worker subprocesses, payloads, deadlines, a watchdog, machine facts, result files.

Imported by the scripts in this folder as ``_common`` (they run with this folder on sys.path).
Importing it first sets the environment Ray needs on this machine (loopback only, no usage
stats) and makes this checkout importable by Ray's workers, before anything imports Ray.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks"
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Ray workers (raybus's actors, the benchmarks' own actors) import from this checkout.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")) if p
)

import contextlib  # noqa: E402
import faulthandler  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import queue as stdqueue  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import deque  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402

import raybus  # noqa: E402

PROTO = "BENCH "  # prefix of protocol lines on a worker process's stdout


class BenchError(RuntimeError):
    """A measurement failed (timeout, wrong count, lost or duplicated message)."""


def make_body(i: int, size: int) -> bytes:
    """A distinct ``size``-byte body per message: its index, then filler."""
    return i.to_bytes(8, "big") + b"\xa5" * (size - 8)


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def start_local_ray(object_store_mb: int = 300) -> str:
    """The local Ray cluster every benchmark uses: 127.0.0.1 only (the environment above),
    2 CPUs, a small object store, no dashboard, workers' logs not forwarded. Returns the GCS
    address worker processes join."""
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=object_store_mb << 20,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    return str(ray.get_runtime_context().gcs_address)


class WorkerProcess:
    """Handle on a benchmark's helper subprocess (``argv``): JSON commands go to its stdin, it
    answers ``BENCH {json}`` lines on stdout (other output is ignored; the last stderr lines
    are kept for error messages). The first answer must be ``ready``."""

    def __init__(self, argv: list[str], startup_timeout: float) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: stdqueue.Queue[dict[str, Any] | None] = stdqueue.Queue()
        self.stderr_tail: deque[str] = deque(maxlen=40)
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.expect("ready", startup_timeout)

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PROTO):
                self.lines.put(json.loads(line[len(PROTO) :]))
        self.lines.put(None)  # EOF: the process ended

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail.append(line.rstrip())

    def command(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise BenchError(f"worker process is gone: {exc}\n{self.tail()}") from None

    def tail(self) -> str:
        return "\n".join(self.stderr_tail)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def poll(self) -> dict[str, Any] | None:
        """A pending message, if any (raises if the worker failed or ended)."""
        try:
            msg = self.lines.get_nowait()
        except stdqueue.Empty:
            return None
        return self._check(msg)

    def _check(self, msg: dict[str, Any] | None) -> dict[str, Any]:
        if msg is None:
            raise BenchError(f"worker process ended (rc={self.proc.poll()})\n{self.tail()}")
        if msg.get("event") == "error":
            raise BenchError(f"worker failed:\n{msg['error']}")
        return msg

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"timed out after {timeout:g} s waiting for worker {event!r}")
            try:
                msg = self._check(self.lines.get(timeout=remaining))
            except stdqueue.Empty:
                continue
            if msg.get("event") == event:
                return msg

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.command(op="exit")
                self.proc.wait(timeout=20)
            except (BenchError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=10)


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
