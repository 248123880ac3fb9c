#!/usr/bin/env python
"""The HTTP gateway beside the native client, in one run on one local Ray cluster.

Scenarios (1 KiB bodies, ``--concurrency`` tasks in flight, each for ``--seconds``), all driven
from this process's event loop, the HTTP ones with ``httpx.AsyncClient`` over keep-alive
connections to the Serve proxy on 127.0.0.1:

* ``send 1``    native ``send_messages(message)``        vs  ``POST /q/messages`` (one message)
* ``send B``    native ``send_messages(list of B)``      vs  ``POST /q/messages`` JSON batch of B
* ``receive``   native receive-and-delete of 1 per call  vs  ``DELETE /q/messages/head``
* ``lock+complete`` native peek-lock 1 + complete        vs  ``POST .../head`` + ``DELETE Location``

Each round runs every scenario natively and over HTTP, interleaved; rates are medians over
rounds and ratios medians of per-round ratios (HTTP / native). Queues live in memory
(``memory://``) so that the figures show the gateway's cost rather than the disk's; every
receive scenario checks that each message came exactly once.

Run: ``python benchmarks/http_gateway.py [--quick] [--seconds S] [--concurrency C] [--batch B]``.
Prints a Markdown table and writes JSON to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common

ROOT = _common.ROOT

import httpx  # noqa: E402
import ray  # noqa: E402
from _common import BenchError, machine_facts, make_body, median, write_results  # noqa: E402

import raybus.http  # noqa: E402
from raybus import ServiceBusMessage, ServiceBusReceiveMode, aio  # noqa: E402

SCENARIOS = ("send 1", "send B", "receive", "lock+complete")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


LATENCIES: list[float] = []  # of the last _run_for's steps, for the diagnostics line


async def _run_for(seconds: float, concurrency: int, step: Callable[[], Awaitable[int]]) -> float:
    """Run ``step`` (returns messages moved) in ``concurrency`` tasks for ``seconds``; msgs/s."""
    done = 0
    stop_at = time.monotonic() + seconds
    LATENCIES.clear()

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            t = time.monotonic()
            moved = await step()  # not `done += await step()`: that reads done before waiting
            done += moved
            LATENCIES.append(time.monotonic() - t)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.monotonic() - started)


def _latency_line() -> str:
    xs = sorted(LATENCIES)
    if not xs:
        return "no steps"
    return f"{len(xs)} steps, p50 {xs[len(xs) // 2] * 1e3:.0f} ms, max {xs[-1] * 1e3:.0f} ms"


class Bench:
    def __init__(self, args: argparse.Namespace, namespace: str, url: str) -> None:
        self.args = args
        self.client = aio.ServiceBusClient(namespace)
        self.admin = aio.ServiceBusAdministrationClient(namespace)
        self.http = httpx.AsyncClient(
            base_url=url,
            timeout=60,
            limits=httpx.Limits(max_connections=args.concurrency * 2),
        )
        self.body = make_body(0, args.size)

    async def fresh_queue(self) -> str:
        """A new queue, warmed up: its partition actor (a new process, slow to start on a
        loaded machine) has answered, and the gateway's replica has its route cached, so the
        timed window measures steady state only."""
        name = f"bench-{uuid.uuid4().hex[:8]}"
        await self.admin.create_queue(name)
        async with self.client.get_queue_sender(name) as sender:
            await sender.send_messages(ServiceBusMessage(b"warm-up"))
        warm = await self.http.delete(f"/{name}/messages/head?timeout=5")
        if warm.status_code != 200:
            raise BenchError(f"warm-up: {warm.status_code} {warm.text[:200]}")
        return name

    async def fill(self, queue: str, count: int) -> None:
        async with self.client.get_queue_sender(queue) as sender:
            for start in range(0, count, 500):
                n = min(500, count - start)
                await sender.send_messages(
                    [ServiceBusMessage(make_body(start + i, self.args.size)) for i in range(n)]
                )

    # ------------------------------------------------------------------ sends

    async def send(self, kind: str, batch: int) -> float:
        queue = await self.fresh_queue()
        try:
            if kind == "native":
                sender = self.client.get_queue_sender(queue)

                async def step() -> int:
                    if batch == 1:
                        await sender.send_messages(ServiceBusMessage(self.body))
                    else:
                        await sender.send_messages(
                            [ServiceBusMessage(self.body) for _ in range(batch)]
                        )
                    return batch

            else:
                text = self.body.decode("latin-1")
                payload = json.dumps([{"Body": text}] * batch).encode()

                async def step() -> int:
                    if batch == 1:
                        r = await self.http.post(f"/{queue}/messages", content=self.body)
                    else:
                        r = await self.http.post(
                            f"/{queue}/messages",
                            content=payload,
                            headers={"Content-Type": "application/vnd.microsoft.servicebus.json"},
                        )
                    if r.status_code != 201:
                        raise BenchError(f"HTTP send: {r.status_code} {r.text[:200]}")
                    return batch

            return await _run_for(self.args.seconds, self.args.concurrency, step)
        finally:
            await self.admin.delete_queue(queue)

    # ------------------------------------------------------------------ receives

    async def receive(self, kind: str, settle: bool) -> float:
        """Drain a pre-filled queue one message per call; checks exactly-once delivery."""
        queue = await self.fresh_queue()
        seen: set[bytes] = set()
        dupes = 0
        try:
            await self.fill(queue, self.args.prefill)
            mode = (
                ServiceBusReceiveMode.PEEK_LOCK
                if settle
                else ServiceBusReceiveMode.RECEIVE_AND_DELETE
            )

            if kind == "native":
                receiver = self.client.get_queue_receiver(queue, receive_mode=mode)

                async def step() -> int:
                    nonlocal dupes
                    got = await receiver.receive_messages(1, max_wait_time=1)
                    for m in got:
                        dupes += m.body[:8] in seen
                        seen.add(m.body[:8])
                        if settle:
                            await receiver.complete_message(m)
                    return len(got)

            else:

                async def step() -> int:
                    nonlocal dupes
                    method = "POST" if settle else "DELETE"
                    r = await self.http.request(method, f"/{queue}/messages/head?timeout=1")
                    if r.status_code == 204:
                        return 0
                    if r.status_code not in (200, 201):
                        raise BenchError(f"HTTP receive: {r.status_code} {r.text[:200]}")
                    dupes += r.content[:8] in seen
                    seen.add(r.content[:8])
                    if settle:
                        c = await self.http.delete(r.headers["Location"])
                        if c.status_code != 200:
                            raise BenchError(f"HTTP complete: {c.status_code} {c.text[:200]}")
                    return 1

            rate = await _run_for(self.args.seconds, self.args.concurrency, step)
            if kind == "native":
                await receiver.close()
            if dupes:
                raise BenchError(f"{kind} receive delivered {dupes} message(s) twice")
            return rate
        finally:
            await self.admin.delete_queue(queue)

    async def scenario(self, name: str, kind: str) -> float:
        if name == "send 1":
            return await self.send(kind, 1)
        if name == "send B":
            return await self.send(kind, self.args.batch)
        if name == "receive":
            return await self.receive(kind, settle=False)
        return await self.receive(kind, settle=True)


async def _main(args: argparse.Namespace, namespace: str, url: str) -> dict[str, Any]:
    bench = Bench(args, namespace, url)
    rates: dict[str, dict[str, list[float]]] = {s: {"native": [], "http": []} for s in SCENARIOS}
    ratios: dict[str, list[float]] = {s: [] for s in SCENARIOS}
    await bench.scenario("send 1", "http")  # warm-up: replica, clients, routes
    await bench.scenario("send 1", "native")
    for r in range(args.rounds):
        for name in SCENARIOS:
            native = await bench.scenario(name, "native")
            native_steps = _latency_line()
            http = await bench.scenario(name, "http")
            print(f"  native {native_steps}; http {_latency_line()}", file=sys.stderr)
            rates[name]["native"].append(native)
            rates[name]["http"].append(http)
            ratios[name].append(http / native if native else 0.0)
            print(
                f"round {r + 1} {name:14s} native {native:8.0f}/s  http {http:8.0f}/s  "
                f"ratio {http / native if native else 0:.2f}",
                file=sys.stderr,
                flush=True,
            )
    await bench.http.aclose()
    return {
        s: {
            "native_msgs_per_s": median(rates[s]["native"]),
            "http_msgs_per_s": median(rates[s]["http"]),
            "ratio_http_over_native": median(ratios[s]),
            "rounds": {"native": rates[s]["native"], "http": rates[s]["http"]},
        }
        for s in SCENARIOS
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=4.0, help="per scenario and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--batch", type=int, default=50, help="messages per batched send")
    p.add_argument("--size", type=int, default=1024, help="body bytes")
    p.add_argument("--prefill", type=int, default=10000, help="messages per receive scenario")
    p.add_argument("--max-replicas", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="1 round of 2 s")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
    started = time.time()
    _common.start_local_ray(300)
    namespace = f"bench-http-{uuid.uuid4().hex[:6]}"
    aio.ServiceBusClient(namespace, storage_path="memory://")  # creates the namespace in memory
    try:
        url = raybus.http.start_http_gateway(
            namespace, port=_free_port(), max_replicas=args.max_replicas
        )
        facts = machine_facts()
        results = asyncio.run(_main(args, namespace, url))
    finally:
        raybus.http.stop_http_gateway(namespace, shutdown_serve=True)
        ray.shutdown()
    print(
        f"\nHTTP gateway vs native client ({args.concurrency} in flight, {args.size} B bodies, "
        f"batch {args.batch}, median of {args.rounds} round(s) of {args.seconds:g} s)\n"
    )
    print("| scenario | native msgs/s | HTTP msgs/s | HTTP / native |")
    print("|---|---:|---:|---:|")
    for s in SCENARIOS:
        r = results[s]
        label = f"send {args.batch}" if s == "send B" else s
        print(
            f"| {label} | {r['native_msgs_per_s']:,.0f} | {r['http_msgs_per_s']:,.0f} | "
            f"{r['ratio_http_over_native']:.2f} |"
        )
    out = write_results("http_gateway", started, args, facts, {"results": results})
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
