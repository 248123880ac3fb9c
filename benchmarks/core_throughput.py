#!/usr/bin/env python
"""Core throughput of raybus against its peers, in one run on one local Ray cluster.

Every scenario moves N messages with 1 KiB bodies from a sender in a *separate process* (this
script started again with ``--role sender``) to a receiver in this process, in lists of B:

* A  raybus: ``send_messages(list of B)``; ``receive_messages(max_message_count=B)`` and
  A1 ``complete_message`` one by one in a plain sync loop, A2 ``complete_messages(list)``,
  A3 RECEIVE_AND_DELETE mode.
* B  the bare-Ray peer: a minimal async actor holding a deque; ``put(batch)`` per batch, a
  ``get(B)`` call per batch and, for peek-lock's peer, an ``ack(ids)`` call per batch: the
  round trips raybus needs in A2.
* C  ``ray.util.queue.Queue`` with ``put_nowait_batch``/``get_nowait_batch`` (the receiver
  polls: that queue has no blocking batch get).

Each (system, mode) runs twice per round: end to end (sender and receiver concurrently; time
from the sender's first send to the receiver's last settlement) and split (the sender fills a
fresh queue alone: the send-only figure; then the receiver drains it: the receive+settle-only
figure). Every run checks that each message arrived exactly once with its body intact and that
the queue is empty afterwards, and fails loudly otherwise. Numbers are medians over rounds;
ratios are medians of per-round ratios (the machine may be shared and noisy).

Run: ``python benchmarks/core_throughput.py [--quick] [--messages N] [--batch B]``.
Writes a Markdown table to stdout and JSON to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common

ROOT = _common.ROOT

import ray  # noqa: E402
from _common import (  # noqa: E402
    PROTO,
    BareQueue,
    BenchError,
    Deadline,
    RpcCounter,
    Watchdog,
    WorkerProcess,
    body_ok,
    machine_facts,
    make_body,
    report_errors,
    write_results,
)
from _core_throughput_report import (  # noqa: E402
    LABELS,
    UNITS,
    markdown,
    settlement_notes,
    summarise,
)

import raybus  # noqa: E402
from raybus import ServiceBusMessage, ServiceBusReceiveMode  # noqa: E402
from raybus.management import ServiceBusAdministrationClient  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RAY_NAMESPACE_PREFIX = "raybus-bench"

# ---------------------------------------------------------------------------- payload


def verify(ids: list[int], bodies: list[Any], n: int, size: int, what: str) -> None:
    """Every id in range(n) exactly once, each with its own intact body."""
    if len(ids) != n:
        raise BenchError(f"{what}: received {len(ids)} messages, expected {n}")
    seen = set(ids)
    if len(seen) != n or seen != set(range(n)):
        dup = len(ids) - len(seen)
        missing = n - len(seen & set(range(n)))
        raise BenchError(f"{what}: {dup} duplicates, {missing} missing of {n}")
    bad = [i for i, b in zip(ids, bodies, strict=True) if not body_ok(i, b, size)]
    if bad:
        raise BenchError(f"{what}: {len(bad)} corrupted bodies (first ids {bad[:5]})")


# ---------------------------------------------------------------------------- bare peers


# ---------------------------------------------------------------------------- sender role


def sender_main(args: argparse.Namespace) -> int:
    """The sender process: joins the cluster, then obeys JSON commands on stdin."""

    def emit(**obj: Any) -> None:
        sys.stdout.write(PROTO + json.dumps(obj) + "\n")
        sys.stdout.flush()

    ray.init(address=args.address, logging_level=logging.WARNING, log_to_driver=False)
    clients: dict[str, raybus.ServiceBusClient] = {}
    rpc = RpcCounter()
    emit(event="ready", pid=os.getpid())
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "exit":
                break
            try:
                send_one(cmd, clients, emit, rpc)
            except Exception:
                emit(event="error", error=traceback.format_exc())
    finally:
        for c in clients.values():
            c.close()
        ray.shutdown()
    return 0


def send_one(
    cmd: dict[str, Any],
    clients: dict[str, raybus.ServiceBusClient],
    emit: Callable[..., None],
    rpc: RpcCounter,
) -> None:
    system, target, n, b, size = cmd["system"], cmd["target"], cmd["n"], cmd["batch"], cmd["size"]
    send: Callable[[int, int], None]
    if system == "raybus":
        ns = cmd["namespace"]
        client = clients.get(ns) or clients.setdefault(ns, raybus.connect(ns))
        sender = client.get_queue_sender(target)
        sender.create_message_batch()  # resolves the queue's route before timing starts

        def send(lo: int, hi: int) -> None:
            sender.send_messages(
                [ServiceBusMessage(make_body(i, size), message_id=str(i)) for i in range(lo, hi)]
            )

    else:
        actor = ray.get_actor(target, namespace=cmd["ray_namespace"])
        if system == "actor":
            ray.get(actor.ping.remote())

            def send(lo: int, hi: int) -> None:
                ray.get(actor.put.remote([(i, make_body(i, size)) for i in range(lo, hi)]))

        else:  # rayqueue: what ray.util.queue.Queue.put_nowait_batch does
            ray.get(actor.qsize.remote())

            def send(lo: int, hi: int) -> None:
                ray.get(
                    actor.put_nowait_batch.remote([(i, make_body(i, size)) for i in range(lo, hi)])
                )

    emit(event="prepared")
    go = sys.stdin.readline()
    if json.loads(go)["op"] != "go":
        raise RuntimeError(f"expected go, got {go!r}")
    before = rpc.snapshot()
    t0 = time.time()
    for lo in range(0, n, b):
        send(lo, min(n, lo + b))
    t1 = time.time()
    calls = rpc.since(before) if system == "raybus" else None
    if calls is None:
        calls = {"put" if system == "actor" else "put_nowait_batch": -(-n // b)}
    emit(event="done", t_start=t0, t_end=t1, sent=n, calls=calls)


class SenderProcess(WorkerProcess):
    """The sender subprocess: this script again, with ``--role sender``."""

    def __init__(self, address: str, startup_timeout: float) -> None:
        script = str(Path(__file__).resolve())
        argv = [sys.executable, script, "--role", "sender", "--address", address]
        super().__init__(argv, startup_timeout)


# ---------------------------------------------------------------------------- receivers


def receive_raybus(
    client: raybus.ServiceBusClient,
    queue: str,
    mode: str,
    n: int,
    b: int,
    deadline: Deadline,
    idle: Callable[[], None],
) -> tuple[float, float, list[int], list[Any], dict[str, int]]:
    """Drain n messages; returns (t_first_call, t_last_settled, ids, bodies, calls by kind)."""
    rmode = (
        ServiceBusReceiveMode.RECEIVE_AND_DELETE
        if mode == "delete"
        else ServiceBusReceiveMode.PEEK_LOCK
    )
    receiver = client.get_queue_receiver(queue, receive_mode=rmode, prefetch_count=0)
    got: list[Any] = []
    calls = 0
    t0 = time.time()
    try:
        while len(got) < n:
            wait = max(0.05, min(2.0, deadline.left()))
            msgs = receiver.receive_messages(max_message_count=b, max_wait_time=wait)
            calls += 1
            if not msgs:
                idle()
                continue
            got.extend(msgs)
            if mode == "each":
                for m in msgs:
                    receiver.complete_message(m)
            elif mode == "batch":
                receiver.complete_messages(msgs)
    finally:
        receiver.close()  # waits for settlements sent without waiting (A1)
    t1 = time.time()
    ids = [int(m.message_id) for m in got]
    return t0, t1, ids, [m.body for m in got], {"receive_messages": calls}


def receive_actor(
    actor: Any, mode: str, n: int, b: int, deadline: Deadline, idle: Callable[[], None]
) -> tuple[float, float, list[int], list[Any], dict[str, int]]:
    delete = mode == "delete"
    got: list[tuple[int, bytes]] = []
    calls = acks = 0
    t0 = time.time()
    while len(got) < n:
        wait = max(0.05, min(2.0, deadline.left()))
        items = ray.get(actor.get.remote(b, wait, delete))
        calls += 1
        if not items:
            idle()
            continue
        got.extend(items)
        if not delete:
            acks += 1
            unknown = ray.get(actor.ack.remote([i for i, _ in items]))
            if unknown:
                raise BenchError(f"bare actor: {unknown} acks of unknown ids")
    t1 = time.time()
    counts = {"get": calls, "ack": acks} if acks else {"get": calls}
    return t0, t1, [i for i, _ in got], [body for _, body in got], counts


def receive_rayqueue(
    q: Any, mode: str, n: int, b: int, deadline: Deadline, idle: Callable[[], None]
) -> tuple[float, float, list[int], list[Any], dict[str, int]]:
    from ray.util.queue import Empty

    got: list[tuple[int, bytes]] = []
    calls = 0
    t0 = time.time()
    while len(got) < n:
        calls += 1
        try:
            items = q.get_nowait_batch(min(b, n - len(got)))
        except Empty:
            deadline.left()
            idle()
            time.sleep(0.0005)  # no blocking batch get: poll
            continue
        got.extend(items)
    t1 = time.time()
    return t0, t1, [i for i, _ in got], [body for _, body in got], {"get_nowait_batch": calls}


# ---------------------------------------------------------------------------- one run


class Bench:
    def __init__(self, args: argparse.Namespace, gcs: str) -> None:
        self.args = args
        self.gcs = gcs
        run_id = uuid.uuid4().hex[:8]
        self.namespace = f"bench-{run_id}"  # raybus namespace, unique per run
        self.ray_namespace = f"{RAY_NAMESPACE_PREFIX}-{run_id}"
        # In memory by default, like the peers; --storage measures a durable namespace.
        self.client = raybus.connect(self.namespace, storage_path=args.storage)
        self.admin = ServiceBusAdministrationClient(self.namespace, storage_path=args.storage)
        self.sender: SenderProcess | None = None
        self.counter = 0
        self.rpc = RpcCounter()
        self.watchdog = Watchdog()

    def sender_proc(self) -> SenderProcess:
        if self.sender is None or self.sender.proc.poll() is not None:
            self.sender = SenderProcess(self.gcs, self.args.timeout)
        return self.sender

    def restart_sender(self) -> None:
        if self.sender is not None:
            self.sender.close()
            self.sender = None

    def close(self) -> None:
        self.restart_sender()
        self.client.close()

    # -- targets: create, receive from, check empty, delete

    def _create(self, system: str) -> tuple[str, Any]:
        self.counter += 1
        name = f"q{self.counter}-{system}"
        if system == "raybus":
            self.admin.create_queue(name)
            return name, None
        opts = {"name": name, "namespace": self.ray_namespace, "num_cpus": 0}
        if system == "actor":
            cls: Any = ray.remote(BareQueue)
            handle = cls.options(max_concurrency=1000, **opts).remote()
            ray.get(handle.ping.remote())
            return name, handle
        from ray.util.queue import Queue

        q = Queue(actor_options=opts)
        q.qsize()
        return name, q

    def _receive(
        self,
        system: str,
        name: str,
        handle: Any,
        mode: str,
        deadline: Deadline,
        idle: Callable[[], None],
    ) -> tuple[float, float, list[int], list[Any], dict[str, int]]:
        n, b = self.args.messages, self.args.batch
        if system == "raybus":
            return receive_raybus(self.client, name, mode, n, b, deadline, idle)
        if system == "actor":
            return receive_actor(handle, mode, n, b, deadline, idle)
        return receive_rayqueue(handle, mode, n, b, deadline, idle)

    def _check_empty(self, system: str, name: str, handle: Any) -> None:
        if system == "raybus":
            rt = self.admin.get_queue_runtime_properties(name)
            if rt.active_message_count or rt.dead_letter_message_count:
                raise BenchError(
                    f"raybus queue {name} not empty after the run: {rt.active_message_count} "
                    f"active, {rt.dead_letter_message_count} dead-lettered"
                )
            with self.client.get_queue_receiver(name, max_wait_time=0.2) as r:
                extra = r.receive_messages(max_message_count=10)
            if extra:
                raise BenchError(f"raybus queue {name}: {len(extra)} messages delivered again")
        elif system == "actor":
            left, inflight = ray.get(handle.counts.remote())
            if left or inflight:
                raise BenchError(f"bare actor: {left} left, {inflight} unacknowledged")
        elif handle.qsize():
            raise BenchError(f"ray queue: {handle.qsize()} left")

    def _delete(self, system: str, name: str, handle: Any) -> None:
        if system == "raybus":
            self.admin.delete_queue(name)
        elif system == "actor":
            ray.kill(handle, no_restart=True)
        else:
            handle.shutdown(force=True)

    def _start_send(self, system: str, name: str, n: int) -> SenderProcess:
        sp = self.sender_proc()
        sp.command(
            op="send",
            system=system,
            target=name,
            n=n,
            batch=self.args.batch,
            size=self.args.body_size,
            namespace=self.namespace,
            ray_namespace=self.ray_namespace,
        )
        sp.expect("prepared", self.args.timeout)
        return sp

    # -- the two phases

    def run_unit(self, system: str, mode: str, phase: str) -> dict[str, Any]:
        """phase "e2e": concurrent; "split": send-only, then receive-only."""
        what = f"{LABELS[(system, mode)]} [{phase}]"
        # Phases time out by themselves; the watchdog covers calls that cannot (no timeout).
        with self.watchdog.armed(3 * self.args.timeout + 60, what):
            return self._run_unit(system, mode, phase)

    def _run_unit(self, system: str, mode: str, phase: str) -> dict[str, Any]:
        n, size = self.args.messages, self.args.body_size
        what = f"{LABELS[(system, mode)]} [{phase}]"
        name, handle = self._create(system)
        try:
            gc.collect()
            sp = self._start_send(system, name, n)
            deadline = Deadline(self.args.timeout, what)
            result: dict[str, Any] = {}
            if phase == "e2e":
                done: list[dict[str, Any]] = []

                def idle() -> None:
                    msg = sp.poll()
                    if msg is not None and msg.get("event") == "done":
                        done.append(msg)

                sp.command(op="go")
                before = self.rpc.snapshot()
                _t0, t1, ids, bodies, calls = self._receive(
                    system, name, handle, mode, deadline, idle
                )
                rpc_calls = self.rpc.since(before)
                sent = done[0] if done else sp.expect("done", deadline.left())
                result["e2e_s"] = t1 - sent["t_start"]
                result["send_contended_s"] = sent["t_end"] - sent["t_start"]
            else:
                sp.command(op="go")
                sent = sp.expect("done", deadline.left())
                result["send_s"] = sent["t_end"] - sent["t_start"]
                gc.collect()
                before = self.rpc.snapshot()
                t0, t1, ids, bodies, calls = self._receive(
                    system, name, handle, mode, deadline, lambda: None
                )
                rpc_calls = self.rpc.since(before)
                result["recv_s"] = t1 - t0
            verify(ids, bodies, n, size, what)
            self._check_empty(system, name, handle)
            if system == "raybus" and rpc_calls is not None:  # actor calls raybus made
                calls = {k: v for k, v in rpc_calls.items() if k != "route"}
            result["receive_calls"] = calls
            result["send_calls"] = {k: v for k, v in sent["calls"].items() if k != "route"}
            return result
        except BenchError:
            self.restart_sender()  # it may be stuck mid-send
            raise
        except Exception as exc:  # a raybus or Ray error: record it as this scenario's failure
            self.restart_sender()
            tb = traceback.format_exc(limit=-6)
            raise BenchError(f"{what}: {type(exc).__name__}: {exc}\n{tb}") from exc
        finally:
            try:
                self._delete(system, name, handle)
            except Exception as exc:  # cleanup must not hide the scenario's own error
                print(f"warning: could not delete {name}: {exc!r}", file=sys.stderr)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _common.arg_parser(__doc__, "small run (< 90 s)")
    p.add_argument("--messages", type=int, help="messages per scenario (default 30000; quick 5000)")
    p.add_argument("--batch", type=int, default=100, help="messages per send/receive list")
    p.add_argument("--rounds", type=int, help="repetitions of every scenario (default 3; quick 2)")
    p.add_argument("--body-size", type=int, default=1024, help="body bytes (>= 8)")
    _common.add_time_limits(
        p,
        timeout_help="seconds allowed per scenario phase",
        budget_help="seconds; further rounds are skipped once one more would exceed it "
        "(default 270; quick 75)",
    )
    p.add_argument("--no-rayqueue", action="store_true", help="skip scenario C")
    p.add_argument(
        "--storage",
        default="memory://",
        help="raybus storage_path (default memory://, as the in-memory peers; a directory "
        "measures a durable namespace)",
    )
    p.add_argument("--output", type=Path, help="JSON file (default benchmarks/results/...)")
    p.add_argument("--role", choices=["main", "sender"], default="main", help=argparse.SUPPRESS)
    p.add_argument("--address", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.messages is None:
        args.messages = 5000 if args.quick else 30000
    if args.rounds is None:
        args.rounds = 2 if args.quick else 3
    if args.budget is None:
        args.budget = 75.0 if args.quick else 270.0
    args.rounds_skipped = 0
    if args.timeout is None:
        args.timeout = 60.0 if args.quick else 120.0
    if args.messages < 1 or args.batch < 1 or args.rounds < 1 or args.body_size < 8:
        p.error("--messages, --batch, --rounds must be >= 1 and --body-size >= 8")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "sender":
        return sender_main(args)

    started = time.time()
    facts = machine_facts()
    _common.start_local_ray(300)
    runs: list[dict[str, Any]] = []
    errors: list[str] = []
    bench: Bench | None = None
    try:
        gcs = ray.get_runtime_context().gcs_address
        bench = Bench(args, gcs)
        units = [u for u in UNITS if not (args.no_rayqueue and u[0] == "rayqueue")]
        print(
            f"raybus core throughput: {args.messages} messages x {args.body_size} B in lists of "
            f"{args.batch}, {args.rounds} round(s), {len(units)} scenarios x 2 phases; "
            f"raybus namespace {bench.namespace}",
            file=sys.stderr,
        )
        bench.sender_proc()
        # Warm-up (not recorded): worker start-up, imports, first calls of each system.
        saved = args.messages
        args.messages = min(saved, 5 * args.batch)
        for system in dict.fromkeys(s for s, _ in units):
            mode = "delete"
            try:
                bench.run_unit(system, mode, "e2e")
            except BenchError as exc:
                errors.append(f"warm-up {system}: {exc}")
                print(f"FAILED warm-up {system}: {exc}", file=sys.stderr)
        args.messages = saved
        round_s = 0.0
        for rnd in range(args.rounds):
            elapsed = time.time() - started
            if rnd and elapsed + round_s > args.budget:
                skipped = args.rounds - rnd
                print(
                    f"time budget of {args.budget:g} s: skipping the last {skipped} round(s)",
                    file=sys.stderr,
                )
                args.rounds_skipped = skipped
                break
            round_start = time.time()
            for system, mode in units:
                for phase in ("e2e", "split"):
                    rec: dict[str, Any] = {
                        "round": rnd,
                        "system": system,
                        "mode": mode,
                        "phase": phase,
                    }
                    t = time.monotonic()
                    try:
                        rec.update(bench.run_unit(system, mode, phase))
                        rec["ok"] = True
                    except BenchError as exc:
                        rec["ok"] = False
                        rec["error"] = str(exc)
                        errors.append(f"{LABELS[(system, mode)]} [{phase}] round {rnd}: {exc}")
                        print(f"FAILED {errors[-1]}", file=sys.stderr)
                    rec["wall_s"] = time.monotonic() - t
                    runs.append(rec)
                    shown = {
                        k: round(v, 4) if isinstance(v, float) else v
                        for k, v in rec.items()
                        if k != "error"
                    }
                    print(f"  {shown}", file=sys.stderr)
            round_s = time.time() - round_start
    finally:
        if bench is not None:
            try:
                bench.close()
            except Exception as exc:
                print(f"warning: closing the benchmark failed: {exc!r}", file=sys.stderr)
        ray.shutdown()

    rows = summarise(runs, args.messages, args.body_size)
    notes = settlement_notes(runs, args.messages)
    table = markdown(rows) + ("\n\n" + "\n".join(f"- {n}" for n in notes) if notes else "")
    out = write_results(
        "core_throughput",
        started,
        args,
        facts,
        {
            "rows": rows,
            "runs": runs,
            "errors": errors,
            "notes": notes,
            "table_markdown": table,
        },
        hidden=("role", "address"),
    )
    print(table)
    done_rounds = len({r["round"] for r in runs})
    print(
        f"\n{len(runs)} runs ({done_rounds} of {args.rounds} rounds) in "
        f"{time.time() - started:.0f} s; JSON: {out}"
    )
    report_errors(errors)
    if errors:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
