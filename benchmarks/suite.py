#!/usr/bin/env python
"""raybus against its peers in one run: RabbitMQ quorum queues, ``ray.util.queue.Queue`` and
bare Ray actor calls with the same batches (issue 7).

Scenarios (benchmarks/_scenarios.py, after Service Bus's performance guide): high-throughput
queue, many senders (32; and 100 with per-message calls), many competing receivers (8),
topics with 10 and 100 subscriptions, low latency at a fixed 1,000 msg/s. Body sizes 100 B,
1 KiB, 64 KiB; raybus durable and express, peek-lock + complete and receive-and-delete;
per-message and batched calls reported separately.

Every system runs with the same process layout: its senders are asyncio tasks in one worker
process, its receivers asyncio tasks in another (benchmarks/_worker.py); this process only
creates and deletes entities and keeps time. Each cell runs its systems back to back, so a
ratio compares runs made under the same machine load. Every run checks that each message
arrived exactly once with its body intact and that nothing is left afterwards.

    python benchmarks/suite.py --quick            # < 3 min
    python benchmarks/suite.py                    # full, < 20 min
    python benchmarks/suite.py --scenarios throughput,latency --sizes 1024 --no-rabbitmq
    python benchmarks/suite.py --quick --publish  # also regenerate benchmarks/RESULTS.md

RabbitMQ is started by benchmarks/rabbitmq.sh (root; 127.0.0.1 only) and stopped at the end;
if it cannot be started the other systems still run and the tables say so.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import HERE, ROOT, BenchError, Watchdog, WorkerProcess, machine_facts, start_local_ray  # noqa: I001

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from typing import Any

import ray
from _peer_base import LABELS, SYSTEMS
from _report import chart, evaluate_targets, results_md, run_section, split_notes
from _scenarios import PROFILES, SCENARIOS, build_plan
from _stats import SCHEMA_VERSION, cell_key, rates, summarise, validate_result

PUBLISHED = HERE / "published"
TITLES = {k: v["title"] for k, v in SCENARIOS.items()}


# ---------------------------------------------------------------------------- peers


def start_rabbitmq(facts: dict[str, Any]) -> str | None:
    """Start the node; None when it runs, else why not (the suite carries on without it)."""
    try:
        import pika
    except ImportError:
        return "pika is not installed (make install)"
    if os.geteuid() != 0:
        return "not root: benchmarks/rabbitmq.sh needs root to install and start the node"
    # Output to a file, not a pipe: the epmd daemon it starts inherits the descriptors and
    # would keep a pipe open (and subprocess waiting) for as long as it runs.
    log = Path(tempfile.gettempdir()) / "raybus-suite-rabbitmq.log"
    try:
        with log.open("w") as f:
            res = subprocess.run(
                ["bash", str(HERE / "rabbitmq.sh"), "start"],
                timeout=420,
                stdout=f,
                stderr=subprocess.STDOUT,
            )
    except subprocess.TimeoutExpired:
        return f"benchmarks/rabbitmq.sh start did not finish in 420 s (log: {log})"
    if res.returncode:
        tail = log.read_text().strip()[-300:]
        return f"benchmarks/rabbitmq.sh start failed (exit {res.returncode}): {tail}"
    facts["versions"]["pika"] = pika.__version__
    facts["versions"]["rabbitmq-server"] = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"], capture_output=True, text=True
    ).stdout.strip()
    return None


def stop_rabbitmq() -> None:
    subprocess.run(
        ["bash", str(HERE / "rabbitmq.sh"), "stop"],
        timeout=120,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def make_admins(storage: str, unavailable: dict[str, str]) -> dict[str, Any]:
    import _peer_actor
    import _peer_raybus
    import _peer_rayqueue

    admins: dict[str, Any] = {
        "raybus": _peer_raybus.Admin(f"suite-{uuid.uuid4().hex[:8]}", storage),
        "actor": _peer_actor.Admin(),
        "rayqueue": _peer_rayqueue.Admin(),
    }
    if "rabbitmq" not in unavailable:
        import _peer_rabbitmq

        try:
            admins["rabbitmq"] = _peer_rabbitmq.Admin()
        except Exception as exc:
            unavailable["rabbitmq"] = f"cannot connect: {type(exc).__name__}: {exc}"
    return admins


# ---------------------------------------------------------------------------- one run


def prepare_commands(
    cell: dict[str, Any], system: str, target: Any, batch: int, timeout: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``prepare`` commands of a run's receiver and sender workers: one cell, one warm-up
    count for both (the receivers wait for exactly the warm-up messages the senders send)."""
    sources = max(1, cell["topology"].get("subscriptions", 0))
    common = {
        "op": "prepare",
        "system": system,
        "target": target,
        "n": cell["n"],
        "size": cell["size"],
        "cfg": {"calls": cell["calls"], "batch": batch, "prefetch": cell["prefetch"]},
        "timeout": timeout,
        # Warm-up messages: at least one per sender and per competing receiver of a source.
        "warmup": max(20, cell["senders"], -(-cell["receivers"] // sources)),
    }
    return (
        {**common, "receivers": cell["receivers"], "sources": sources},
        {**common, "senders": cell["senders"], "rate": cell.get("rate")},
    )


class Runner:
    """Holds the two worker processes (restarted after a failure: one may be stuck) and each
    system's entities. A system keeps its queue (or topic, actor) from one cell to the next
    while the topology stays the same: every run leaves it empty (checked), and creating one
    (a Ray worker process per raybus partition or peer actor) costs seconds on this machine.
    A run that fails drops its entities; a new topology drops the others'."""

    def __init__(self, gcs: str, admins: dict[str, Any], timeout: float) -> None:
        self.gcs, self.admins, self.timeout = gcs, admins, timeout
        self.workers: dict[str, WorkerProcess] = {}
        self.targets: dict[tuple[str, str], dict[str, Any]] = {}

    def worker(self, role: str) -> WorkerProcess:
        w = self.workers.get(role)
        if w is None or not w.alive():
            argv = [sys.executable, str(HERE / "_worker.py"), "--address", self.gcs, "--role", role]
            w = self.workers[role] = WorkerProcess(argv, 120)
        return w

    def restart_workers(self) -> None:
        for w in self.workers.values():
            w.close()
        self.workers.clear()

    def close(self) -> None:
        self.restart_workers()
        for key in list(self.targets):
            self.drop(key)

    def target(self, system: str, topology: dict[str, Any]) -> tuple[str, str]:
        key = (system, json.dumps(topology, sort_keys=True))
        if key not in self.targets:
            for other in [k for k in self.targets if k[1] != key[1]]:
                self.drop(other)
            self.targets[key] = self.admins[SYSTEMS[system]["peer"]].setup(
                topology, SYSTEMS[system]
            )
        return key

    def drop(self, key: tuple[str, str]) -> None:
        target = self.targets.pop(key)
        try:
            self.admins[SYSTEMS[key[0]]["peer"]].teardown(target)
        except Exception as exc:
            print(f"warning: teardown of {key[0]} failed: {exc!r}", file=sys.stderr)

    def run(self, cell: dict[str, Any], system: str, batch: int) -> dict[str, Any]:
        admin = self.admins[SYSTEMS[system]["peer"]]
        key = self.target(system, cell["topology"])
        target = self.targets[key]
        rx_prepare, tx_prepare = prepare_commands(cell, system, target, batch, self.timeout)
        sources = rx_prepare["sources"]
        try:
            rx, tx = self.worker("receive"), self.worker("send")
            rx.command(**rx_prepare)
            rx.expect("prepared", 120)
            tx.command(**tx_prepare)
            tx.expect("prepared", 120)
            rx.command(op="warm")
            tx.command(op="warm")
            tx.expect("warmed", self.timeout)
            rx.expect("warmed", self.timeout + 30)
            rx.command(op="go")
            tx.command(op="go")
            sent = tx.expect("done", self.timeout + 30)
            got = rx.expect("done", self.timeout + 30)
            if got["problems"]:
                raise BenchError("; ".join(got["problems"]))
            admin.check_empty(target)
        except BaseException:
            self.restart_workers()  # a worker may be stuck mid-run; the next run starts fresh ones
            self.drop(key)  # and messages may be left: the next run gets new entities
            raise
        elapsed = got["t_end"] - sent["t_start"]
        out = rates(cell["n"], elapsed, cell["size"], copies=sources)
        out.update(
            seconds=elapsed,
            send_seconds=sent["t_end"] - sent["t_start"],
            # Informational: the rate's end is after the receivers closed (``t_end``).
            settled_seconds=None
            if got["t_settled"] is None
            else got["t_settled"] - sent["t_start"],
            latency=got["latency"],
        )
        if cell.get("rate"):
            out["achieved_rate"] = cell["n"] / (sent["t_end"] - sent["t_start"])
        return out


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the quick profile (< 3 min)")
    p.add_argument("--scenarios", help=f"comma-separated subset of: {', '.join(SCENARIOS)}")
    p.add_argument(
        "--sizes", help="comma-separated body sizes in bytes (>= 64), for every scenario"
    )
    p.add_argument("--rounds", type=int, help="repetitions of every cell (medians reported)")
    p.add_argument("--batch", type=int, default=100, help="messages per batched call")
    p.add_argument("--timeout", type=float, help="seconds per run")
    p.add_argument(
        "--budget",
        type=float,
        help="seconds after which no new run starts (default: the profile's, per its rounds)",
    )
    p.add_argument("--no-rabbitmq", action="store_true", help="leave RabbitMQ out")
    p.add_argument(
        "--out", type=Path, default=HERE / "results", help="directory for JSON/Markdown/PNG"
    )
    p.add_argument(
        "--render",
        action="store_true",
        help="run nothing: redraw the published charts and regenerate benchmarks/RESULTS.md",
    )
    p.add_argument(
        "--publish",
        action="store_true",
        help="copy to benchmarks/published/ and regenerate benchmarks/RESULTS.md",
    )
    args = p.parse_args(argv)
    args.profile = "quick" if args.quick else "full"
    prof = PROFILES[args.profile]
    args.rounds = args.rounds or prof["rounds"]
    args.timeout = args.timeout or prof["timeout"]
    # A profile's budget is for its own number of rounds: more rounds get proportionally more.
    args.budget = args.budget or prof["budget_s"] * args.rounds / prof["rounds"]
    try:
        args.scenario_list = args.scenarios.split(",") if args.scenarios else None
        args.size_list = [int(x) for x in args.sizes.split(",")] if args.sizes else None
        build_plan(args.profile, args.scenario_list, args.size_list)
    except ValueError as exc:
        p.error(str(exc))
    if args.rounds < 1 or args.batch < 1:
        p.error("--rounds and --batch must be >= 1")
    return args


def versions() -> dict[str, str]:
    import raybus

    v = {"python": sys.version.split()[0], "ray": ray.__version__, "raybus": raybus.__version__}
    with contextlib.suppress(ImportError):
        import matplotlib

        v["matplotlib"] = matplotlib.__version__
    return v


def run_plan(
    plan: list[dict[str, Any]],
    runner: Runner,
    args: argparse.Namespace,
    watchdog: Watchdog,
    started: float,
    runs: list[dict[str, Any]],
) -> None:
    """Every cell's systems back to back, round after round, with a progress bar; appends a
    record per (round, cell, system) to ``runs``, also for runs skipped or failed."""
    import rich.progress as rp

    columns = (rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn())
    with rp.Progress(*columns, rp.TimeElapsedColumn()) as progress:
        bar = progress.add_task("suite", total=args.rounds * sum(len(c["systems"]) for c in plan))
        for rnd in range(args.rounds):
            for index, cell in enumerate(plan):
                what = f"{cell['scenario']} {cell['size']} B {cell['calls']}"
                base = {k: cell[k] for k in ("scenario", "size", "calls", "n")} | {"round": rnd}
                # A different system goes first in each cell: none always meets a cold cache.
                k = (index + rnd) % max(1, len(cell["systems"]))
                # All of a cell's systems or none: a ratio needs both sides.
                out_of_time = args.budget - (time.time() - started) <= cell["reserve_s"]
                for system in cell["systems"][k:] + cell["systems"][:k]:
                    rec = {**base, "system": system, "ok": False}
                    rec["loadavg_1m"] = os.getloadavg()[0]
                    progress.update(bar, description=f"{what}: {system}")
                    if out_of_time:
                        rec["skipped"] = f"time budget of {args.budget:.0f} s used up"
                    else:
                        try:
                            limit = args.timeout + 300 + cell["reserve_s"]
                            with watchdog.armed(limit, f"{what}: {system}"):
                                rec.update(runner.run(cell, system, args.batch))
                            rec["ok"] = True
                        except BenchError as exc:
                            rec["error"] = str(exc)
                            progress.console.print(f"[red]FAILED[/] {what}: {system}: {exc}")
                    runs.append(rec)
                    progress.advance(bar)
                for system, why in cell["skipped"].items():
                    runs.append({**base, "system": system, "ok": False, "skipped": why})


def summary_of(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs' summaries, cell by cell in the order they ran, systems in a fixed order."""
    summary = summarise(runs)
    cells = list(dict.fromkeys((r["scenario"], r["size"], r["calls"]) for r in runs))
    order = list(SYSTEMS)  # within a cell, systems in a fixed order whatever order they ran in
    summary.sort(key=lambda s: (cells.index(cell_key(s)), order.index(s["system"])))
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        for profile in ("full", "quick"):
            path = PUBLISHED / f"suite-{profile}.json"
            if path.exists():
                doc = json.loads(path.read_text())
                validate_result(doc)
                # Summaries and targets again from the recorded runs, by the current rules.
                doc["summary"] = summary_of(doc["runs"])
                doc["targets"] = evaluate_targets(doc["summary"])
                path.write_text(json.dumps(doc, indent=1) + "\n")
                title = f"raybus and peers ({profile}, {doc['started_at']} UTC)"
                chart(doc["summary"], str(path.with_suffix(".png")), title)
        publish_results_md()
        return 0
    started = time.time()
    facts = machine_facts()
    facts["loadavg_start"] = facts.pop("loadavg")
    facts["versions"] = versions()
    with contextlib.suppress(OSError, ValueError):
        facts["mem_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    unavailable: dict[str, str] = {}
    storage = tempfile.mkdtemp(prefix="raybus-suite-")
    rmq_started = False

    def cleanup() -> None:  # also the watchdog's last act
        if rmq_started:
            with contextlib.suppress(Exception):
                stop_rabbitmq()
        shutil.rmtree(storage, ignore_errors=True)

    watchdog = Watchdog(cleanup)
    runs: list[dict[str, Any]] = []
    runner: Runner | None = None
    admins: dict[str, Any] = {}
    try:
        if args.no_rabbitmq:
            unavailable["rabbitmq"] = "left out (--no-rabbitmq)"
        else:
            with watchdog.armed(480, "starting RabbitMQ"):
                rmq_started = True
                why = start_rabbitmq(facts)
            if why:
                unavailable["rabbitmq"] = why
                print(f"RabbitMQ not available: {why}", file=sys.stderr)
        gcs = start_local_ray()
        admins = make_admins(storage, unavailable)
        exclude = {s for s, o in SYSTEMS.items() if o["peer"] in unavailable}
        plan = build_plan(args.profile, args.scenario_list, args.size_list, exclude)
        runner = Runner(gcs, admins, args.timeout)
        # Warm-up (not recorded): worker processes, clients, code paths of every system.
        # 2,000 messages, not 200: after 200, raybus durable's first timed cell (the first of
        # the quick profile) ran 5-40 % below its second round in 5 of 5 two-round runs;
        # after 2,000 the two rounds were level (3 of 3). The same for every system.
        warm = {
            **plan[0],
            "n": 2000,
            "size": 1024,
            "calls": "batch",
            "topology": {"kind": "queue"},
            "senders": 1,
            "receivers": 1,
            "rate": None,
        }
        for system in dict.fromkeys(s for c in plan for s in c["systems"]):
            with contextlib.suppress(BenchError), watchdog.armed(300, f"warm-up {system}"):
                runner.run(warm, system, args.batch)
        run_plan(plan, runner, args, watchdog, started, runs)
    finally:
        if runner is not None:
            runner.close()
        for a in admins.values():
            with contextlib.suppress(Exception):
                a.close()
        ray.shutdown()
        cleanup()

    facts["loadavg_end"] = list(os.getloadavg())
    summary = summary_of(runs)
    doc: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "suite": "raybus-peers",
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "duration_s": time.time() - started,
        "settings": {
            "profile": args.profile,
            "command": "python benchmarks/suite.py "
            + shlex.join(argv if argv is not None else sys.argv[1:]),
            "rounds": args.rounds,
            "batch": args.batch,
            "timeout": args.timeout,
            "budget": args.budget,
            "scenarios": args.scenario_list,
            "sizes": args.size_list,
            "labels": LABELS,
        },
        "machine": facts,
        "runs": runs,
        "summary": summary,
        "targets": evaluate_targets(summary),
        "peers_unavailable": unavailable,
    }
    validate_result(doc)
    write_outputs(doc, args)
    failed = [r for r in runs if not r["ok"] and not r.get("skipped")]
    print(
        f"\n{len(runs)} runs, {len(failed)} failed, in {doc['duration_s']:.0f} s", file=sys.stderr
    )
    return 1 if failed else 0


def write_outputs(doc: dict[str, Any], args: argparse.Namespace) -> None:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.out / f"suite-{args.profile}-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    png = base.with_suffix(".png")
    chart(doc["summary"], str(png), f"raybus and peers ({args.profile}, {doc['started_at']} UTC)")
    section = run_section(doc, TITLES, png.name)
    base.with_suffix(".md").write_text(section)
    print(section)
    print(f"JSON: {base.with_suffix('.json')}\nchart: {png}", file=sys.stderr)
    if args.publish:
        PUBLISHED.mkdir(exist_ok=True)
        shutil.copy(base.with_suffix(".json"), PUBLISHED / f"suite-{args.profile}.json")
        shutil.copy(png, PUBLISHED / f"suite-{args.profile}.png")
        publish_results_md()


def publish_results_md() -> None:
    """Regenerate benchmarks/RESULTS.md from the published full and quick runs."""
    results = HERE / "RESULTS.md"
    notes = split_notes(results.read_text()) if results.exists() else ""
    sections = []
    for profile, heading in (("full", "Full run"), ("quick", "Quick run (`make bench`)")):
        path = PUBLISHED / f"suite-{profile}.json"
        if path.exists():
            doc = json.loads(path.read_text())
            sections.append((heading, doc, f"published/suite-{profile}.png"))
    results.write_text(results_md(sections, TITLES, notes))
    print(f"wrote {results.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
