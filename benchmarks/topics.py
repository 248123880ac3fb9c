#!/usr/bin/env python
"""Topics: publish throughput into a topic with 1, 10 and 100 subscriptions against sending the
same copies straight to as many queues, and the router's filter evaluations per second.

1. **Publish.** For each subscription count N (1 and 10 with ``--quick``; also 100 otherwise)
   a topic gets N subscriptions of one partition, each with one rule that selects roughly half
   of the messages, in two kinds: ``correlation`` (``CorrelationRuleFilter(properties={"half":
   j % 2})``) and ``sql`` (``SqlRuleFilter("k >= lo AND k < lo + 50")``, a different window
   per subscription; k is uniform in 0..99). ``--senders`` asyncio tasks (one ``raybus.aio``
   client each) publish M = min(``--messages``, 2 x ``--max-copies`` / N) messages (so a
   cell stores about as many copies whatever N) with 1 KiB bodies in lists of ``--batch``;
   the time runs from the first send to the last send returning (a topic send returns once
   every subscription's copy is stored). Reported: messages/s in and copies/s stored.
   **Peer** (in the same run, on the same cluster): what a client without topics would do —
   N queues, and for every list the same senders send each queue the messages its
   subscription would have received, one ``send_messages`` per queue, concurrently. The same
   copies are stored; ``topic ÷ direct`` is the ratio of the two rates.
2. **Filter evaluation** in-process: ``raybus._core.fanout.plan`` (what the router runs on
   each publish: every subscription's rules over every record, plus the copies) over
   ``--eval-records`` records for N subscriptions of each kind; reported as rule
   evaluations/s (N x records / time), messages planned/s and copies/s, and the bare
   ``filter.evaluate`` rate without copying.

Checks (every cell): each subscription (or queue) holds exactly the copies its rule selects
(runtime counts), and draining it (receive-and-delete) yields exactly the expected message
indexes, each once. A failure marks the cell FAILED, is listed at the end and makes the exit
status 1. Phases are bounded by ``--timeout``; a watchdog covers calls without a timeout (exit
status 3).

Run: ``python benchmarks/topics.py [--quick]``. Writes Markdown tables to stdout and JSON to
``benchmarks/results/topics-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common

ROOT = _common.ROOT

import ray  # noqa: E402
from _common import BenchError, Deadline, make_body, median, progress  # noqa: E402

from raybus import ServiceBusMessage, ServiceBusReceiveMode, aio  # noqa: E402
from raybus._core.fanout import Target, plan  # noqa: E402
from raybus.management import (  # noqa: E402
    CorrelationRuleFilter,
    RuleProperties,
    SqlRuleFilter,
)

KINDS = ("correlation", "sql")
# Subscriptions (and queues) are created this many at a time: each is a new Ray worker process.
CREATE_CONCURRENCY = 8
RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE


# ---------------------------------------------------------------------------- rules and data


def rule_for(kind: str, j: int) -> RuleProperties:
    """Subscription j's rule: selects roughly half of the messages, a different half for
    neighbouring subscriptions."""
    if kind == "correlation":
        return RuleProperties(f"corr{j}", CorrelationRuleFilter(properties={"half": j % 2}))
    lo = (j * 7) % 50
    return RuleProperties(f"sql{j}", SqlRuleFilter(f"k >= {lo} AND k < {lo + 50}"))


def selector(kind: str, j: int) -> Callable[[dict[str, Any]], bool]:
    """The same selection, written independently (for the expected copies and the peer)."""
    if kind == "correlation":
        return lambda p: p["half"] == j % 2
    lo = (j * 7) % 50
    return lambda p: lo <= p["k"] < lo + 50


def make_props(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"i": i, "half": rng.randrange(2), "k": rng.randrange(100)} for i in range(n)]


def expected_sets(kind: str, subs: int, props: list[dict[str, Any]]) -> list[list[int]]:
    """Per subscription j: the message indexes it receives."""
    out = []
    for j in range(subs):
        sel = selector(kind, j)
        out.append([p["i"] for p in props if sel(p)])
    return out


# ---------------------------------------------------------------------------- in-process eval


def eval_cell(kind: str, subs: int, records_n: int, min_s: float) -> dict[str, Any]:
    """Time ``plan`` (and bare ``evaluate``) for ``subs`` subscriptions over ``records_n``
    records; repeat until ``min_s`` has passed."""
    props = make_props(records_n, seed=subs)
    records = [
        ServiceBusMessage(make_body(p["i"], 1024), application_properties=p)._to_record()
        for p in props
    ]
    targets = [
        Target(f"s{j}", f"t/Subscriptions/s{j}", (rule_for(kind, j),), True) for j in range(subs)
    ]
    want = sum(len(x) for x in expected_sets(kind, subs, props))
    copies = plan(targets, records)  # warm-up, and a check of the copy count
    got = sum(len(c) for c in copies.values())
    if got != want:
        raise BenchError(f"eval {kind} N={subs}: plan made {got} copies, expected {want}")
    reps, start = 0, time.perf_counter()
    while True:
        plan(targets, records)
        reps += 1
        plan_s = time.perf_counter() - start
        if plan_s >= min_s:
            break
    filters = [t.rules[0].filter for t in targets]
    ereps, start = 0, time.perf_counter()
    while True:
        for f in filters:
            evaluate = f.evaluate
            for rec in records:
                evaluate(rec)
        ereps += 1
        eval_s = time.perf_counter() - start
        if eval_s >= min_s:
            break
    evaluations = subs * records_n
    return {
        "kind": kind,
        "subscriptions": subs,
        "records": records_n,
        "plan_repeats": reps,
        "plan_s": plan_s,
        "evaluations_per_s": evaluations * reps / plan_s,
        "messages_per_s": records_n * reps / plan_s,
        "copies_per_s": want * reps / plan_s,
        "copies_per_message": want / records_n,
        "evaluate_only_per_s": evaluations * ereps / eval_s,
    }


# ---------------------------------------------------------------------------- the Ray part


class Bench:
    def __init__(self, args: argparse.Namespace, storage: str) -> None:
        self.args = args
        self.storage = storage
        self.ns = f"bench-topics-{uuid.uuid4().hex[:6]}"
        self.errors: list[str] = []
        self.cells: list[dict[str, Any]] = []
        self.setups: list[dict[str, Any]] = []
        self.watchdog = _common.Watchdog(self.cleanup)

    def cleanup(self) -> None:
        if ray.is_initialized():
            ray.shutdown()

    async def run(self) -> None:
        args = self.args
        self.admin = aio.ServiceBusAdministrationClient(self.ns, storage_path=self.storage)
        self.clients = [
            aio.ServiceBusClient(self.ns, storage_path=self.storage) for _ in range(args.senders)
        ]
        for n in args.subscriptions:
            await self.run_count(n)

    async def _gather_limited(self, coros: list[Any]) -> list[Any]:
        sem = asyncio.Semaphore(CREATE_CONCURRENCY)

        async def one(c: Any) -> Any:
            async with sem:
                return await c

        return await asyncio.gather(*(one(c) for c in coros))

    async def run_count(self, n: int) -> None:
        args = self.args
        topic, queues = f"topic-{n}", [f"q-{n}-{j}" for j in range(n)]
        subs = [f"s{j}" for j in range(n)]
        messages = min(args.messages, args.max_copies * 2 // n)
        with self.watchdog.armed(args.timeout + 60 + 3 * n, f"create N={n}"):
            start = time.perf_counter()
            await self.admin.create_topic(topic)
            kind = KINDS[0]
            await self._gather_limited(
                [
                    self.admin.create_subscription(topic, s, default_rule=rule_for(kind, j))
                    for j, s in enumerate(subs)
                ]
            )
            subs_s = time.perf_counter() - start
            start = time.perf_counter()
            await self._gather_limited([self.admin.create_queue(q) for q in queues])
            queues_s = time.perf_counter() - start
        self.setups.append(
            {"subscriptions": n, "create_topic_and_subs_s": subs_s, "create_queues_s": queues_s}
        )
        progress(
            f"N={n}: topic + {n} subscriptions in {subs_s:.1f} s, {n} queues in {queues_s:.1f} s"
        )
        try:
            # Warm-up (routes resolved, router configured, a first 2PC), then emptied.
            warm = make_props(args.batch, seed=0)
            with self.watchdog.armed(args.timeout + 60, f"warm-up N={n}"):
                await self.publish_topic(topic, warm)
                await self.publish_direct(queues, kind, warm)
                await self.drain_all(topic, subs, queues, None, None)
            for rep in range(args.repeats):
                for kind_i, kind in enumerate(KINDS):
                    if rep or kind_i:
                        await self.set_rules(topic, subs, kind)
                    props = make_props(messages, seed=1000 * n + 10 * rep + kind_i)
                    want = expected_sets(kind, n, props)
                    for system in ("topic", "direct"):
                        await self.cell(n, kind, rep, system, topic, subs, queues, props, want)
        finally:
            with self.watchdog.armed(args.timeout + 60 + 2 * n, f"delete N={n}"):
                try:
                    await self.admin.delete_topic(topic)
                    await self._gather_limited([self.admin.delete_queue(q) for q in queues])
                except Exception as exc:  # reported; the run goes on
                    self.errors.append(f"N={n}: cleanup failed: {exc!r}")

    async def set_rules(self, topic: str, subs: list[str], kind: str) -> None:
        async def one(j: int, s: str) -> None:
            for old in await self.admin.list_rules(topic, s):
                await self.admin.delete_rule(topic, s, old.name)
            rule = rule_for(kind, j)
            await self.admin.create_rule(topic, s, rule.name, filter=rule.filter)

        with self.watchdog.armed(self.args.timeout, f"rules {kind}"):
            await self._gather_limited([one(j, s) for j, s in enumerate(subs)])

    # -- sending ---------------------------------------------------------------------------

    def _batches(self, props: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        b = self.args.batch
        return [props[i : i + b] for i in range(0, len(props), b)]

    def _messages(self, batch: list[dict[str, Any]]) -> list[ServiceBusMessage]:
        size = self.args.body_size
        return [ServiceBusMessage(make_body(p["i"], size), application_properties=p) for p in batch]

    async def publish_topic(self, topic: str, props: list[dict[str, Any]]) -> float:
        batches = self._batches(props)
        senders = len(self.clients)

        async def worker(w: int) -> None:
            async with self.clients[w].get_topic_sender(topic) as sender:
                for batch in batches[w::senders]:
                    await sender.send_messages(self._messages(batch))

        start = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(worker(w) for w in range(senders))), self.args.timeout
        )
        return time.perf_counter() - start

    async def publish_direct(
        self, queues: list[str], kind: str, props: list[dict[str, Any]]
    ) -> float:
        """The peer: each list's messages sent to every queue whose subscription selects
        them, one send per queue, concurrently. Which queues get which messages is worked out
        before the clock starts (indexes into the list)."""
        batches = self._batches(props)
        sels = [selector(kind, j) for j in range(len(queues))]
        plans = [
            [(j, [k for k, p in enumerate(batch) if sel(p)]) for j, sel in enumerate(sels)]
            for batch in batches
        ]
        senders = len(self.clients)

        async def worker(w: int) -> None:
            qs = [self.clients[w].get_queue_sender(q) for q in queues]
            try:
                for bi in range(w, len(batches), senders):
                    msgs = self._messages(batches[bi])
                    await asyncio.gather(
                        *(
                            qs[j].send_messages([msgs[k] for k in idx])
                            for j, idx in plans[bi]
                            if idx
                        )
                    )
            finally:
                for s in qs:
                    await s.close()

        start = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(worker(w) for w in range(senders))), self.args.timeout
        )
        return time.perf_counter() - start

    # -- checking --------------------------------------------------------------------------

    async def _drain(
        self, receiver_of: Callable[[], Any], want: list[int] | None, what: str
    ) -> int:
        """Receive-and-delete everything; check the indexes against ``want`` (if given)."""
        seen: list[int] = []
        async with receiver_of() as receiver:
            while True:
                got = await receiver.receive_messages(1000, max_wait_time=0.3)
                if not got:
                    break
                seen.extend(int(m.application_properties["i"]) for m in got)
        if want is not None and sorted(seen) != want:
            dup = len(seen) - len(set(seen))
            missing = len(set(want) - set(seen))
            extra = len(set(seen) - set(want))
            raise BenchError(
                f"{what}: {len(seen)} received, expected {len(want)} "
                f"({dup} duplicated, {missing} missing, {extra} unexpected)"
            )
        return len(seen)

    async def drain_all(
        self,
        topic: str,
        subs: list[str],
        queues: list[str],
        want: list[list[int]] | None,
        system: str | None,
    ) -> None:
        client = self.clients[0]
        jobs = []
        if system in (None, "topic"):
            jobs += [
                self._drain(
                    lambda s=s: client.get_subscription_receiver(topic, s, receive_mode=RAD),
                    None if want is None else want[j],
                    f"{topic}/{s}",
                )
                for j, s in enumerate(subs)
            ]
        if system in (None, "direct"):
            jobs += [
                self._drain(
                    lambda q=q: client.get_queue_receiver(q, receive_mode=RAD),
                    None if want is None else want[j],
                    q,
                )
                for j, q in enumerate(queues)
            ]
        await self._gather_limited(jobs)

    async def counts(
        self, system: str, topic: str, subs: list[str], queues: list[str]
    ) -> list[int]:
        if system == "topic":
            rts = await self._gather_limited(
                [self.admin.get_subscription_runtime_properties(topic, s) for s in subs]
            )
        else:
            rts = await self._gather_limited(
                [self.admin.get_queue_runtime_properties(q) for q in queues]
            )
        return [rt.active_message_count for rt in rts]

    async def cell(
        self,
        n: int,
        kind: str,
        rep: int,
        system: str,
        topic: str,
        subs: list[str],
        queues: list[str],
        props: list[dict[str, Any]],
        want: list[list[int]],
    ) -> None:
        args = self.args
        copies = sum(len(w) for w in want)
        rec: dict[str, Any] = {
            "subscriptions": n,
            "kind": kind,
            "system": system,
            "repeat": rep,
            "messages": len(props),
            "copies": copies,
            "ok": False,
        }
        deadline = Deadline(3 * args.timeout + 60, f"N={n} {kind} {system}")
        try:
            with self.watchdog.armed(deadline.seconds + 60, f"N={n} {kind} {system}"):
                if system == "topic":
                    secs = await self.publish_topic(topic, props)
                else:
                    secs = await self.publish_direct(queues, kind, props)
                held = await self.counts(system, topic, subs, queues)
                wanted = [len(w) for w in want]
                if held != wanted:
                    bad = [
                        (j, h, w)
                        for j, (h, w) in enumerate(zip(held, wanted, strict=True))
                        if h != w
                    ]
                    raise BenchError(
                        f"N={n} {kind} {system}: {len(bad)} stores hold the wrong count "
                        f"(first (index, held, expected): {bad[:3]})"
                    )
                deadline.left()
                await self.drain_all(topic, subs, queues, want, system)
            rec.update(
                ok=True,
                seconds=secs,
                msgs_per_s=len(props) / secs,
                copies_per_s=copies / secs,
            )
            progress(
                f"  N={n:<3} {kind:11s} {system:6s} rep {rep}: "
                f"{len(props) / secs:8,.0f} msgs/s in, {copies / secs:9,.0f} copies/s "
                f"({copies} copies in {secs:.2f} s)"
            )
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
            self.errors.append(f"N={n} {kind} {system} rep {rep}: {rec['error']}")
            progress(f"  N={n} {kind} {system} rep {rep}: FAILED {rec['error']}")
            # Empty the stores for the next cell whatever happened.
            try:
                with self.watchdog.armed(args.timeout + 60, f"drain N={n}"):
                    await self.drain_all(topic, subs, queues, None, None)
            except Exception as exc2:
                self.errors.append(f"N={n}: drain after failure failed: {exc2!r}")
        self.cells.append(rec)


# ---------------------------------------------------------------------------- reporting


def summarise(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    keys = sorted(
        {(c["subscriptions"], c["kind"]) for c in cells}, key=lambda k: (k[0], KINDS.index(k[1]))
    )
    for n, kind in keys:
        mine = [c for c in cells if (c["subscriptions"], c["kind"]) == (n, kind)]
        by = {s: [c for c in mine if c["system"] == s and c["ok"]] for s in ("topic", "direct")}
        ratios = []
        for c in by["topic"]:
            peer = [d for d in by["direct"] if d["repeat"] == c["repeat"]]
            if peer:
                ratios.append(c["copies_per_s"] / peer[0]["copies_per_s"])
        rows.append(
            {
                "subscriptions": n,
                "kind": kind,
                "messages": mine[0]["messages"],
                "copies": mine[0]["copies"],
                "topic_msgs_per_s": median([c["msgs_per_s"] for c in by["topic"]]),
                "topic_copies_per_s": median([c["copies_per_s"] for c in by["topic"]]),
                "direct_msgs_per_s": median([c["msgs_per_s"] for c in by["direct"]]),
                "direct_copies_per_s": median([c["copies_per_s"] for c in by["direct"]]),
                "topic_over_direct": median(ratios),
                "failed": sum(1 for c in mine if not c["ok"]),
            }
        )
    return rows


def _f(x: float | None, fmt: str = ",.0f") -> str:
    return "FAILED" if x is None else format(x, fmt)


def markdown(
    rows: list[dict[str, Any]], evals: list[dict[str, Any]], setups: list[dict[str, Any]]
) -> str:
    out = _common.md_table(
        "subscriptions | filter | messages | copies | topic msgs/s in | topic copies/s stored "
        "| direct to N queues msgs/s | direct copies/s | topic ÷ direct",
        "---:|---|---:|---:|---:|---:|---:|---:|---:",
        [
            (
                r["subscriptions"],
                r["kind"],
                f"{r['messages']:,}",
                f"{r['copies']:,}",
                _f(r["topic_msgs_per_s"]),
                _f(r["topic_copies_per_s"]),
                _f(r["direct_msgs_per_s"]),
                _f(r["direct_copies_per_s"]),
                _f(r["topic_over_direct"], ".2f"),
            )
            for r in rows
        ],
    )
    if setups:
        out.append("")
        out.append(
            "Set-up: "
            + "; ".join(
                f"N={s['subscriptions']}: topic + subscriptions "
                f"{s['create_topic_and_subs_s']:.1f} s, queues {s['create_queues_s']:.1f} s"
                for s in setups
            )
        )
    out += [
        "",
        "### Filter evaluation in-process (`raybus._core.fanout.plan`, one rule per subscription)",
        "",
    ]
    out += _common.md_table(
        "subscriptions | filter | records | rule evaluations/s (plan) | messages planned/s "
        "| copies/s | evaluate only, evaluations/s",
        "---:|---|---:|---:|---:|---:|---:",
        [
            (
                e["subscriptions"],
                e["kind"],
                f"{e['records']:,}",
                f"{e['evaluations_per_s']:,.0f}",
                f"{e['messages_per_s']:,.0f}",
                f"{e['copies_per_s']:,.0f}",
                f"{e['evaluate_only_per_s']:,.0f}",
            )
            for e in evals
        ],
    )
    return "\n".join(out)


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _common.arg_parser(__doc__, "N = 1, 10 only; fewer messages (< 3 min)")
    p.add_argument(
        "--subscriptions",
        type=_common.int_list,
        help="subscription counts (default 1,10,100; quick 1,10)",
    )
    p.add_argument(
        "--messages",
        type=int,
        help="at most this many messages per cell (default 50000; quick 20000)",
    )
    p.add_argument(
        "--max-copies",
        type=int,
        help="cap on copies per cell: fewer messages for large N (default 100000; quick 30000)",
    )
    p.add_argument("--batch", type=int, default=100, help="messages per send list (100)")
    p.add_argument("--senders", type=int, default=4, help="asyncio senders, one client each (4)")
    p.add_argument("--body-size", type=int, default=1024, help="body bytes (>= 8; 1024)")
    p.add_argument("--repeats", type=int, help="repeats of every cell (default 3; quick 2)")
    p.add_argument(
        "--eval-records", type=int, help="records per in-process plan (default 2000; quick 1000)"
    )
    p.add_argument(
        "--eval-subscriptions",
        type=_common.int_list,
        help="subscription counts of the in-process part (default 1,10,100)",
    )
    p.add_argument("--eval-seconds", type=float, default=0.5, help="minimum time per eval cell")
    p.add_argument(
        "--storage",
        default=_common.MEMORY,
        help="namespace storage: memory:// (default), 'durable' (a temporary directory) or a path",
    )
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per phase (180)")
    p.add_argument("--no-eval", action="store_true", help="skip the in-process part")
    p.add_argument("--no-publish", action="store_true", help="skip the Ray part")
    args = _common.parse_with_output(p, argv)
    quick = args.quick
    args.subscriptions = args.subscriptions or ([1, 10] if quick else [1, 10, 100])
    args.messages = args.messages or (20000 if quick else 50000)
    args.max_copies = args.max_copies or (30_000 if quick else 100_000)
    args.repeats = args.repeats or (2 if quick else 3)
    args.eval_records = args.eval_records or (1000 if quick else 2000)
    args.eval_subscriptions = args.eval_subscriptions or [1, 10, 100]
    if args.body_size < 8 or args.batch < 1 or args.senders < 1 or args.messages < 1:
        p.error("--body-size >= 8; --batch, --senders, --messages >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, facts = _common.start_run()
    tmp = tempfile.mkdtemp(prefix="raybus-bench-topics-") if args.storage == "durable" else None
    storage = tmp or args.storage
    progress(
        f"raybus topics: N in {args.subscriptions}, {args.messages} messages x {args.body_size} B "
        f"per cell in lists of {args.batch}, {args.senders} senders, {args.repeats} repeat(s), "
        f"storage {args.storage}; {os.cpu_count()} CPUs"
    )
    evals: list[dict[str, Any]] = []
    errors: list[str] = []
    if not args.no_eval:
        for n in args.eval_subscriptions:
            for kind in KINDS:
                try:
                    e = eval_cell(kind, n, args.eval_records, args.eval_seconds)
                except Exception as exc:
                    errors.append(f"eval {kind} N={n}: {type(exc).__name__}: {exc}")
                    continue
                evals.append(e)
                progress(
                    f"  eval N={n:<3} {kind:11s}: {e['evaluations_per_s']:11,.0f} evaluations/s "
                    f"in plan, {e['evaluate_only_per_s']:11,.0f} evaluate only"
                )
    bench = Bench(args, storage)
    if not args.no_publish:
        _common.start_local_ray(200)
        with _common.ray_run(bench.errors, scratch_dir=tmp):
            asyncio.run(bench.run())
    errors += bench.errors
    rows = summarise(bench.cells)
    text = (
        f"### Publish into a topic vs the same copies sent to N queues ({args.batch}-message "
        f"lists of {args.body_size} B, {args.senders} senders, medians of {args.repeats}; "
        f"storage {args.storage}; {os.cpu_count()} CPUs)\n\n" + markdown(rows, evals, bench.setups)
    )
    body = {
        "rows": rows,
        "cells": bench.cells,
        "setups": bench.setups,
        "eval": evals,
        "errors": errors,
    }
    return _common.finish("topics", started, args, facts, text, body)


if __name__ == "__main__":
    sys.exit(main())
