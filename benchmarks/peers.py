#!/usr/bin/env python
"""raybus against its peers in one run: RabbitMQ quorum queue, ray.util.queue, bare Ray actor.

The high-throughput queue scenario (issue 7): 1 sender in a *separate process*, 1 receiver in
this process, 1 KiB bodies, N messages, lists of B (default 100) where the API allows:

* raybus, durable (default storage in a temporary directory): ``send_messages(list of B)``;
  peek-lock ``receive_messages(B)`` + ``complete_messages(list)`` (core_throughput's A2).
* RabbitMQ quorum queue (``x-queue-type=quorum``, durable, persistent messages) via pika's
  BlockingConnection: publisher confirms on, the sender publishes B messages and then waits
  for all their confirms; the consumer has manual acks, ``basic_qos(prefetch_count=200)``
  and acks each batch of B with one ``basic_ack(multiple=True)``.
* bare Ray actor with the same batches: ``put(batch)``, ``get(B)`` + ``ack(ids)``.
* ``ray.util.queue.Queue``: ``put_nowait_batch`` / ``get_nowait_batch(B)`` (polling).

Time is end to end: from the sender's first send to the receiver's last settlement. Every run
checks that each message arrived exactly once with its body intact and that the queue is empty
afterwards. RabbitMQ is started by ``benchmarks/rabbitmq.sh start`` (127.0.0.1 only) and
always stopped at the end, as is the local Ray cluster.

Run: ``python benchmarks/peers.py [--quick] [--messages N] [--batch B] [--no-rabbitmq]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse
import contextlib
import gc
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import deque
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import core_throughput as ct  # noqa: E402  (sets PYTHONPATH for Ray workers)
import ray  # noqa: E402
from _common import (  # noqa: E402
    BenchError,
    Deadline,
    Watchdog,
    machine_facts,
    make_body,
    median,
    report_errors,
    write_results,
)

RMQ_SCRIPT = HERE / "rabbitmq.sh"
RMQ_HOST, RMQ_PORT = "127.0.0.1", int(os.environ.get("RAYBUS_RMQ_PORT", "5672"))
PREFETCH = 200

# (system, core_throughput mode or our own), label; order = run order within a round.
UNITS: list[tuple[str, str]] = [
    ("raybus", "batch"),
    ("rabbitmq", "ack"),
    ("actor", "ack"),
    ("rayqueue", "delete"),
]
LABELS = {
    ("raybus", "batch"): "raybus durable, peek-lock + complete_messages(batch)",
    ("rabbitmq", "ack"): "RabbitMQ quorum queue, confirms + manual ack (multiple)",
    ("actor", "ack"): "bare Ray actor, put / get + ack(ids)",
    ("rayqueue", "delete"): "ray.util.queue, put_nowait_batch / get_nowait_batch",
}


# ---------------------------------------------------------------------------- RabbitMQ


def rmq_params() -> Any:
    import pika

    return pika.ConnectionParameters(
        host=RMQ_HOST, port=RMQ_PORT, heartbeat=0, blocked_connection_timeout=60
    )


def rmq_sender_main() -> int:
    """The RabbitMQ sender process: JSON commands on stdin, ``BENCH {json}`` on stdout."""
    import pika

    def emit(**obj: Any) -> None:
        sys.stdout.write(ct.PROTO + json.dumps(obj) + "\n")
        sys.stdout.flush()

    conn = pika.BlockingConnection(rmq_params())
    emit(event="ready", pid=os.getpid())
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "exit":
                break
            try:
                rmq_send(conn, cmd, emit)
            except Exception:
                emit(event="error", error=traceback.format_exc())
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    return 0


def rmq_send(conn: Any, cmd: dict[str, Any], emit: Any) -> None:
    """Publish n messages in batches of b; after each batch wait for all its confirms.

    BlockingChannel.confirm_delivery makes every basic_publish wait for its own confirm (a
    round trip and a Raft commit per message); to confirm per batch, as the other systems
    settle per batch, this uses the channel's underlying asynchronous API on the same
    connection and lets the blocking connection pump I/O until the batch is confirmed."""
    import pika

    queue, n, b, size = cmd["target"], cmd["n"], cmd["batch"], cmd["size"]
    ch = conn.channel()
    impl = ch._impl
    unconfirmed: set[int] = set()
    nacked: list[int] = []
    ready: list[bool] = []

    def on_confirm(frame: Any) -> None:
        m = frame.method
        tags = {t for t in unconfirmed if t <= m.delivery_tag} if m.multiple else {m.delivery_tag}
        unconfirmed.difference_update(tags)
        if isinstance(m, pika.spec.Basic.Nack):
            nacked.extend(tags)

    impl.confirm_delivery(ack_nack_callback=on_confirm, callback=lambda _f: ready.append(True))
    # BlockingConnection's own wait loop: block on I/O until the predicate holds.
    # (process_data_events(time_limit=t) would sleep the whole t: it does not see these
    # callbacks of the underlying channel.)
    conn._flush_output(lambda: bool(ready))
    emit(event="prepared")
    go = sys.stdin.readline()
    if json.loads(go)["op"] != "go":
        raise RuntimeError(f"expected go, got {go!r}")
    tag = 0
    batches = 0
    t0 = time.time()
    for lo in range(0, n, b):
        for i in range(lo, min(n, lo + b)):
            tag += 1
            unconfirmed.add(tag)
            impl.basic_publish(
                exchange="",
                routing_key=queue,
                body=make_body(i, size),
                properties=pika.BasicProperties(delivery_mode=2, message_id=str(i)),
            )
        conn._flush_output(lambda: not unconfirmed)
        batches += 1
    t1 = time.time()
    if nacked:
        raise RuntimeError(f"{len(nacked)} publishes nacked by the broker")
    ch.close()
    emit(event="done", t_start=t0, t_end=t1, sent=n, calls={"confirmed_batches": batches})


class RmqSender(ct.SenderProcess):
    """The RabbitMQ sender subprocess (this script again, with ``--role rmq-sender``)."""

    def __init__(self, startup_timeout: float) -> None:
        import queue as stdqueue

        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--role", "rmq-sender"],
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


def rmq_receive(
    ch: Any, queue: str, n: int, b: int, deadline: Deadline, idle: Any
) -> tuple[float, list[int], list[Any], dict[str, int]]:
    """Consume n messages with manual acks, one ``basic_ack(multiple=True)`` per b messages.
    Returns (t_last_settled, ids, bodies, calls)."""
    ids: list[int] = []
    bodies: list[Any] = []
    acks = 0
    pending = 0
    last_tag = None
    for method, props, body in ch.consume(queue, auto_ack=False, inactivity_timeout=0.05):
        if method is None:  # inactivity
            deadline.left()
            if pending:
                ch.basic_ack(delivery_tag=last_tag, multiple=True)
                acks += 1
                pending = 0
            idle()
            continue
        ids.append(int(props.message_id))
        bodies.append(body)
        last_tag = method.delivery_tag
        pending += 1
        if pending >= b or len(ids) >= n:
            ch.basic_ack(delivery_tag=last_tag, multiple=True)
            acks += 1
            pending = 0
        if len(ids) >= n:
            break
    ch.cancel()
    # A synchronous round trip on the same channel: the broker has processed the acks.
    left = ch.queue_declare(queue, passive=True).method.message_count
    t1 = time.time()
    if left:
        raise BenchError(f"RabbitMQ queue {queue}: {left} messages left")
    return t1, ids, bodies, {"basic_ack": acks}


class RabbitBench:
    def __init__(self, args: argparse.Namespace) -> None:
        import pika

        self.args = args
        self.conn = pika.BlockingConnection(rmq_params())
        self.sender: RmqSender | None = None
        self.counter = 0
        self.prefix = f"raybus-bench-{uuid.uuid4().hex[:8]}"

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
            self.sender = None
        with contextlib.suppress(Exception):
            self.conn.close()

    def run(self) -> dict[str, Any]:
        a = self.args
        n, b, size = a.messages, a.batch, a.body_size
        what = f"{LABELS[('rabbitmq', 'ack')]} [e2e]"
        self.counter += 1
        queue = f"{self.prefix}-q{self.counter}"
        ch = self.conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        ch.basic_qos(prefetch_count=PREFETCH)
        try:
            if self.sender is None or self.sender.proc.poll() is not None:
                self.sender = RmqSender(a.timeout)
            sp = self.sender
            gc.collect()
            sp.command(op="send", target=queue, n=n, batch=b, size=size)
            sp.expect("prepared", a.timeout)
            deadline = Deadline(a.timeout, what)
            done: list[dict[str, Any]] = []

            def idle() -> None:
                msg = sp.poll()
                if msg is not None and msg.get("event") == "done":
                    done.append(msg)

            sp.command(op="go")
            t1, ids, bodies, calls = rmq_receive(ch, queue, n, b, deadline, idle)
            sent = done[0] if done else sp.expect("done", deadline.left())
            ct.verify(ids, bodies, n, size, what)
            return {
                "e2e_s": t1 - sent["t_start"],
                "send_contended_s": sent["t_end"] - sent["t_start"],
                "receive_calls": calls,
                "send_calls": sent["calls"],
            }
        except BenchError:
            if self.sender is not None:
                self.sender.close()
                self.sender = None
            raise
        except Exception as exc:
            if self.sender is not None:
                self.sender.close()
                self.sender = None
            raise BenchError(f"{what}: {type(exc).__name__}: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                ch.queue_delete(queue)
                ch.close()


def rabbitmq_ctl(op: str, timeout: float = 300) -> None:
    res = subprocess.run(["bash", str(RMQ_SCRIPT), op], timeout=timeout)
    if res.returncode:
        raise BenchError(f"benchmarks/rabbitmq.sh {op} failed (exit {res.returncode})")


# ---------------------------------------------------------------------------- report


def summarise(runs: list[dict[str, Any]], n: int, size: int) -> list[dict[str, Any]]:
    per: dict[str, dict[int, float]] = {}
    failed: set[str] = set()
    for r in runs:
        if r.get("ok"):
            per.setdefault(r["system"], {})[r["round"]] = r["e2e_s"]
        else:
            failed.add(r["system"])
    rb = per.get("raybus", {})
    rows = []
    for system, mode in UNITS:
        secs = per.get(system, {})
        if not secs and system not in failed:
            continue
        s = median(list(secs.values()))
        rates = sorted(n / v for v in secs.values() if v)
        ratios = [secs[k] and rb[k] and secs[k] / rb[k] for k in secs if k in rb]
        rows.append(
            {
                "system": system,
                "scenario": LABELS[(system, mode)],
                "messages": n,
                "seconds": s,
                "msgs_per_s": n / s if s else None,
                "mb_per_s": n * size / s / 1e6 if s else None,
                "msgs_per_s_range": [rates[0], rates[-1]] if rates else None,
                # msgs/s raybus ÷ msgs/s peer == seconds peer ÷ seconds raybus, per round
                "raybus_over_peer": (
                    median([x for x in ratios if x]) if system != "raybus" else None
                ),
                "failed": system in failed or s is None,
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| system (end to end) | messages | seconds | msgs/s | MB/s | msgs/s range "
        "| raybus ÷ peer |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["seconds"] is None:
            out.append(f"| {r['scenario']} | {r['messages']} | FAILED | | | | |")
            continue
        lo, hi = r["msgs_per_s_range"]
        ratio = "" if r["raybus_over_peer"] is None else f"{r['raybus_over_peer']:.2f}"
        if r["failed"]:
            ratio += " (some rounds FAILED)"
        out.append(
            f"| {r['scenario']} | {r['messages']} | {r['seconds']:.3f} | "
            f"{r['msgs_per_s']:,.0f} | {r['mb_per_s']:.1f} | {lo:,.0f} to {hi:,.0f} | {ratio} |"
        )
    return "\n".join(out)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small run (< 3 min)")
    p.add_argument("--messages", type=int, help="messages per run (default 30000; quick 10000)")
    p.add_argument("--batch", type=int, default=100, help="messages per send/receive list")
    p.add_argument("--rounds", type=int, help="repetitions (default 3)")
    p.add_argument("--body-size", type=int, default=1024, help="body bytes (>= 8)")
    p.add_argument("--timeout", type=float, help="seconds per run (default 120; quick 60)")
    p.add_argument("--no-rabbitmq", action="store_true", help="skip RabbitMQ")
    p.add_argument("--no-rayqueue", action="store_true", help="skip ray.util.queue")
    p.add_argument("--output", type=Path, help="JSON file (default benchmarks/results/...)")
    p.add_argument("--role", choices=["main", "rmq-sender"], default="main", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.messages is None:
        args.messages = 10000 if args.quick else 30000
    if args.rounds is None:
        args.rounds = 3
    if args.timeout is None:
        args.timeout = 60.0 if args.quick else 120.0
    if args.messages < 1 or args.batch < 1 or args.rounds < 1 or args.body_size < 8:
        p.error("--messages, --batch, --rounds must be >= 1 and --body-size >= 8")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "rmq-sender":
        return rmq_sender_main()

    started = time.time()
    facts = machine_facts()
    storage = tempfile.mkdtemp(prefix="raybus-peers-")
    args.storage = storage  # raybus durable: default storage in a temporary directory
    rmq_started = False

    def cleanup() -> None:  # also the watchdog's last act
        if rmq_started:
            with contextlib.suppress(Exception):
                rabbitmq_ctl("stop", timeout=90)
        shutil.rmtree(storage, ignore_errors=True)

    watchdog = Watchdog(cleanup)
    units = [
        u
        for u in UNITS
        if not (args.no_rabbitmq and u[0] == "rabbitmq")
        and not (args.no_rayqueue and u[0] == "rayqueue")
    ]
    runs: list[dict[str, Any]] = []
    errors: list[str] = []
    bench: ct.Bench | None = None
    rabbit: RabbitBench | None = None
    try:
        if not args.no_rabbitmq:
            with watchdog.armed(420, "starting RabbitMQ"):
                rmq_started = True
                rabbitmq_ctl("start")
                facts["rabbitmq"] = subprocess.run(
                    ["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"],
                    capture_output=True,
                    text=True,
                ).stdout.strip()
                import pika

                facts["pika"] = pika.__version__
                rabbit = RabbitBench(args)
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=300 * 1024 * 1024,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
        bench = ct.Bench(args, ray.get_runtime_context().gcs_address)
        bench.watchdog = watchdog
        print(
            f"raybus vs peers: {args.messages} messages x {args.body_size} B in lists of "
            f"{args.batch}, {args.rounds} round(s); raybus durable storage in {storage}",
            file=sys.stderr,
        )
        bench.sender_proc()

        def run(system: str, mode: str) -> dict[str, Any]:
            if system == "rabbitmq":
                assert rabbit is not None
                with watchdog.armed(3 * args.timeout + 60, LABELS[(system, mode)]):
                    return rabbit.run()
            return bench.run_unit(system, mode, "e2e")

        saved = args.messages  # warm-up, not recorded
        args.messages = min(saved, 5 * args.batch)
        for system, mode in units:
            try:
                run(system, mode)
            except BenchError as exc:
                errors.append(f"warm-up {system}: {exc}")
                print(f"FAILED warm-up {system}: {exc}", file=sys.stderr)
        args.messages = saved
        for rnd in range(args.rounds):
            for system, mode in units:
                rec: dict[str, Any] = {"round": rnd, "system": system, "mode": mode}
                t = time.monotonic()
                try:
                    rec.update(run(system, mode))
                    rec["ok"] = True
                except BenchError as exc:
                    rec["ok"] = False
                    rec["error"] = str(exc)
                    errors.append(f"{LABELS[(system, mode)]} round {rnd}: {exc}")
                    print(f"FAILED {errors[-1]}", file=sys.stderr)
                rec["wall_s"] = time.monotonic() - t
                runs.append(rec)
                shown = {
                    k: round(v, 4) if isinstance(v, float) else v
                    for k, v in rec.items()
                    if k != "error"
                }
                print(f"  {shown}", file=sys.stderr)
    except BenchError as exc:
        errors.append(str(exc))
        print(f"FAILED {exc}", file=sys.stderr)
    finally:
        for closer in (bench, rabbit):
            if closer is not None:
                try:
                    closer.close()
                except Exception as exc:
                    print(f"warning: closing failed: {exc!r}", file=sys.stderr)
        ray.shutdown()
        cleanup()

    rows = summarise(runs, args.messages, args.body_size)
    table = markdown(rows)
    out = write_results(
        "peers",
        started,
        args,
        facts,
        {"rows": rows, "runs": runs, "errors": errors, "table_markdown": table},
        hidden=("role",),
    )
    print(table)
    print(f"\n{len(runs)} runs in {time.time() - started:.0f} s; JSON: {out}")
    report_errors(errors)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
