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

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import faulthandler  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import queue as stdqueue  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections import deque  # noqa: E402
from collections.abc import Callable, Iterable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402

import raybus  # noqa: E402

PROTO = "BENCH "  # prefix of protocol lines on a worker process's stdout
MEMORY = "memory://"  # raybus storage_path of a namespace kept in actor memory only


class BenchError(RuntimeError):
    """A measurement failed (timeout, wrong count, lost or duplicated message)."""


def make_body(i: int, size: int) -> bytes:
    """A distinct ``size``-byte body per message: its index, then filler."""
    return i.to_bytes(8, "big") + b"\xa5" * (size - 8)


def body_ok(i: int, body: Any, size: int) -> bool:
    """``body`` is message i's as ``make_body`` made it (received intact)."""
    return isinstance(body, bytes) and len(body) == size and int.from_bytes(body[:8], "big") == i


def progress(text: str) -> None:
    """A progress line on stderr (stdout carries only the tables)."""
    print(text, file=sys.stderr, flush=True)


def int_list(text: str) -> list[int]:
    """An argparse type: ``"1,2,4"`` -> ``[1, 2, 4]``."""
    return [int(x) for x in text.split(",") if x]


def arg_parser(doc: str | None, quick_help: str) -> argparse.ArgumentParser:
    """A benchmark script's command line: the first paragraph of its docstring as the
    description, and ``--quick`` (a small run; ``quick_help`` says how small)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=quick_help)
    return p


def parse_with_output(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Add ``--output`` (where ``write_results`` puts the JSON) as the last option; parse."""
    p.add_argument("--output", type=Path, help="JSON file (default benchmarks/results/...)")
    return p.parse_args(argv)


def md_table(columns: str, rule: str, rows: Iterable[Iterable[object]]) -> list[str]:
    """The lines of a Markdown table: ``columns`` are the headings joined by ``" | "``, ``rule``
    the alignment row without its outer bars (``"---|---:"``), and each row its cells."""
    body = ("| " + " | ".join(str(c) for c in cells) + " |" for cells in rows)
    return [f"| {columns} |", f"|{rule}|", *body]


def add_time_limits(p: argparse.ArgumentParser, *, timeout_help: str, budget_help: str) -> None:
    """``--timeout`` (seconds allowed per phase) and ``--budget`` (seconds for the whole run:
    later repeats are skipped once one more would exceed it); both floats, defaults per script."""
    p.add_argument("--timeout", type=float, help=timeout_help)
    p.add_argument("--budget", type=float, help=budget_help)


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


def actor_pids_by_class() -> dict[str, list[int]]:
    """Live actors' PIDs by class name (raybus's and any other on this local cluster)."""
    out: dict[str, list[int]] = {}
    for info in ray._private.state.actors().values():
        if info.get("State") == "ALIVE" and info.get("Pid"):
            out.setdefault(info.get("ActorClassName", "?"), []).append(int(info["Pid"]))
    return out


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


class BareQueue:
    """The bare-Ray peer of a queue (or of one partition): a deque in an async actor, the
    engine's ceiling. Receivers wait without polling; ``get(..., delete=False)`` keeps what it
    hands out in flight until ``ack`` (peek-lock's peer), ``delete=True`` does not."""

    def __init__(self) -> None:
        self.items: deque[tuple[int, bytes]] = deque()
        self.inflight: dict[int, bytes] = {}
        self.changed = asyncio.Event()

    async def ping(self) -> bool:
        return True

    async def put(self, batch: list[tuple[int, bytes]]) -> int:
        self.items.extend(batch)
        self.changed.set()
        self.changed = asyncio.Event()
        return len(batch)

    async def get(self, n: int, wait_s: float, delete: bool = False) -> list[tuple[int, bytes]]:
        deadline = time.monotonic() + wait_s
        while not self.items:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        out = [self.items.popleft() for _ in range(min(n, len(self.items)))]
        if not delete:
            for i, body in out:
                self.inflight[i] = body
        return out

    async def ack(self, ids: list[int]) -> int:
        """Settle; returns how many ids were not in flight (0 when all is well)."""
        return sum(self.inflight.pop(i, None) is None for i in ids)

    async def counts(self) -> tuple[int, int]:
        return len(self.items), len(self.inflight)


class RpcCounter:
    """Counts raybus's actor calls made from this process, by method name: a diagnostic (how
    many round trips a phase took; whether settlements were coalesced). Wraps
    ``raybus._rpc.call`` and, with ``sync``, ``call_sync`` (the sync API's direct path); a
    receiver's ``wait_available`` calls on a partitioned queue bypass both and are not
    counted. Names in ``ignore`` are left out of ``since``."""

    def __init__(self, *, sync: bool = True, ignore: frozenset[str] = frozenset()) -> None:
        self.counts: dict[str, int] = {}
        self.ignore = ignore
        self.installed = False
        try:
            from raybus import _rpc
        except ImportError:
            return
        orig = getattr(_rpc, "call", None)
        if orig is None or not asyncio.iscoroutinefunction(orig):
            return
        counts = self.counts

        async def call(entity: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
            name = getattr(method, "_method_name", "?")
            counts[name] = counts.get(name, 0) + 1
            return await orig(entity, method, *args, **kwargs)

        _rpc.call = call
        orig_sync = getattr(_rpc, "call_sync", None)
        if sync and orig_sync is not None:

            def call_sync(entity: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
                name = getattr(method, "_method_name", "?")
                counts[name] = counts.get(name, 0) + 1
                return orig_sync(entity, method, *args, **kwargs)

            _rpc.call_sync = call_sync
        self.installed = True

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)

    def since(self, before: dict[str, int]) -> dict[str, int] | None:
        """Calls made since ``snapshot`` returned ``before`` (None if not counting)."""
        if not self.installed:
            return None
        return {
            k: v - before.get(k, 0)
            for k, v in self.counts.items()
            if v - before.get(k, 0) and k not in self.ignore
        }


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


def start_run() -> tuple[float, dict[str, Any]]:
    """The start of a run: its wall-clock time (``started`` of ``write_results``), then
    ``machine_facts`` plus the raybus package that ran (which checkout)."""
    started = time.time()
    facts = machine_facts()
    facts["raybus_path"] = str(Path(raybus.__file__).resolve().parent)
    return started, facts


@contextlib.contextmanager
def ray_run(
    errors: list[str],
    *,
    before_shutdown: Callable[[], None] = lambda: None,
    scratch_dir: str | None = None,
) -> Iterator[None]:
    """Around a benchmark's run on the local Ray cluster (started by the caller). An exception
    is added to ``errors`` as ``run aborted: ...`` (traceback on stderr) instead of escaping,
    so that what was measured before it is still reported. Whatever happens,
    ``before_shutdown`` runs (e.g. killing the benchmark's own actors), Ray shuts down and
    ``scratch_dir`` (if any) is deleted."""
    try:
        yield
    except Exception as exc:  # report what was measured before
        errors.append(f"run aborted: {type(exc).__name__}: {exc}")
        progress(traceback.format_exc())
    finally:
        before_shutdown()
        ray.shutdown()
        if scratch_dir:
            shutil.rmtree(scratch_dir, ignore_errors=True)


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


def finish(
    name: str,
    started: float,
    args: Any,
    facts: dict[str, Any],
    text: str,
    body: dict[str, Any],
) -> int:
    """The end of a benchmark run: write its JSON (``body``, which holds the ``errors`` list,
    then the tables ``text`` as ``table_markdown``), print the tables, the run time and where
    the JSON went, then the failures. Returns the exit status: 1 if anything failed."""
    out = write_results(name, started, args, facts, {**body, "table_markdown": text})
    print(text)
    print(f"\ndone in {time.time() - started:.0f} s; JSON: {out}")
    errors: list[str] = body["errors"]
    report_errors(errors)
    return 1 if errors else 0
