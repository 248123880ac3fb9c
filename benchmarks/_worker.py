#!/usr/bin/env python
"""A sender or receiver process of the suite: every system runs its senders in one such
process and its receivers in another, so all of them have the same process layout.

Protocol (JSON lines on stdin; ``BENCH {json}`` lines on stdout, see ``_common.WorkerProcess``):
``{"op": "prepare", ...cell}`` opens the endpoints and answers ``prepared``; ``{"op": "warm"}``
moves the cell's warm-up messages (untimed) and answers ``warmed``; ``{"op": "go"}`` runs the
role and answers ``done`` with its timing (and, for receivers, the checks and the latency
summary); ``{"op": "exit"}``. Errors answer ``error`` with the traceback.

Warm-up: every system's first calls pay once-only costs (new worker processes, connections,
route lookups, code paths run for the first time) that a long-running application pays once,
not per message. So before the timed run, the senders send ``cell["warmup"]`` messages (indexes
n, n+1, ...; single calls, spread over every sender endpoint) and the receivers receive and
settle all of them on every source, through the same endpoints the run then uses. The same
for every system.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import argparse
import asyncio
import importlib
import json
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import _common
from _peer_base import SYSTEMS, make_body, parse_body
from _stats import latency_summary

# How long a receive waits for a message before it returns empty (and its task looks again
# whether its source is done).
RECEIVE_WAIT_S = 0.2


def _peer(system: str) -> Any:
    return importlib.import_module(f"_peer_{SYSTEMS[system]['peer']}")


async def run_senders(
    cell: dict[str, Any], warm: asyncio.Event, go: asyncio.Event
) -> dict[str, Any]:
    """``cell['senders']`` tasks send indexes 0..n-1 in chunks of ``batch`` (1 for single
    calls), taking the next chunk as they finish one; with ``rate`` set, one message is sent
    per tick instead, open loop (the low-latency scenario; the achieved rate is reported)."""
    system = SYSTEMS[cell["system"]]
    peer = _peer(cell["system"])
    cfg = cell["cfg"]
    n, size = cell["n"], cell["size"]
    eps = [peer.Sender(cell["target"], 0, system, cfg) for _ in range(cell["senders"])]
    step = 1 if cfg["calls"] == "single" else cfg["batch"]
    chunks = iter(range(0, n, step))
    emit(event="prepared")
    await warm.wait()
    w = cell["warmup"]
    await asyncio.gather(*(eps[k % len(eps)].send([make_body(n + k, size)]) for k in range(w)))
    emit(event="warmed")
    await go.wait()
    t0 = time.time()

    async def task(ep: Any) -> None:
        for lo in chunks:
            await ep.send([make_body(i, size) for i in range(lo, min(n, lo + step))])

    async def paced(ep: Any) -> None:
        """Open loop: a send starts at every tick whether or not earlier ones returned, so a
        slow send delays nothing but itself. The body carries the time its send started: the
        tick's, unless this event loop itself fell behind (the achieved rate shows that)."""
        start = time.monotonic()
        sends = []
        for i in range(n):
            delay = start + i / cell["rate"] - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sends.append(asyncio.ensure_future(ep.send([make_body(i, size)])))
        await asyncio.gather(*sends)

    if cell.get("rate"):
        await paced(eps[0])
    else:
        await asyncio.gather(*(task(ep) for ep in eps))
    t1 = time.time()
    await asyncio.gather(*(ep.close() for ep in eps))
    return {"t_start": t0, "t_end": t1, "sent": n}


async def run_receivers(
    cell: dict[str, Any], warm: asyncio.Event, go: asyncio.Event
) -> dict[str, Any]:
    """``cell['receivers']`` tasks; task j reads source j % sources (a topic's subscriptions,
    or the one queue they compete for). Each source must deliver every index 0..n-1 exactly
    once with an intact body; the role ends when all sources did (or at the deadline)."""
    system = SYSTEMS[cell["system"]]
    peer = _peer(cell["system"])
    cfg = cell["cfg"]
    n, size, sources = cell["n"], cell["size"], cell["sources"]
    max_n = 1 if cfg["calls"] == "single" else cfg["batch"]
    seen: list[bytearray] = [bytearray(n) for _ in range(sources)]
    counts = [0] * sources
    problems: list[str] = []
    latencies: list[float] = []
    eps = [
        (j % sources, peer.Receiver(cell["target"], j % sources, system, cfg))
        for j in range(cell["receivers"])
    ]
    emit(event="prepared")
    await warm.wait()
    w = cell["warmup"]
    warmed = [0] * sources

    async def warm_task(src: int, ep: Any) -> None:
        """Receive and settle the warm-up messages (indexes n..n+w-1) of ``src``."""
        while warmed[src] < w:
            got = await ep.receive(max_n, 0.2)
            for body, _tok in got:
                parsed = parse_body(body, size)
                if parsed is None or not n <= parsed[0] < n + w:
                    raise RuntimeError(f"source {src}: a message that is not a warm-up one")
            warmed[src] += len(got)
            await ep.settle([tok for _b, tok in got])

    await asyncio.wait_for(
        asyncio.gather(*(warm_task(src, ep) for src, ep in eps)), cell["timeout"]
    )
    emit(event="warmed")
    await go.wait()
    deadline = time.monotonic() + cell["timeout"]
    t_first: list[float] = []
    settled, t_settled = [0], []
    receiving: dict[int, asyncio.Task[Any]] = {}  # task j, while it waits in a receive

    def finished() -> None:
        """Every message is settled: competing receivers still waiting in a receive (up to
        ``RECEIVE_WAIT_S``) stop waiting, so the rate is the system's, not the wait's."""
        t_settled.append(time.time())
        for j, waiting in list(receiving.items()):
            getattr(eps[j][1], "stop", lambda: None)()
            waiting.cancel()

    async def task(j: int, src: int, ep: Any) -> None:
        while counts[src] < n and not problems:
            if time.monotonic() > deadline:
                return
            receiving[j] = asyncio.current_task()  # type: ignore[assignment]
            try:
                got = await ep.receive(max_n, RECEIVE_WAIT_S)
            except asyncio.CancelledError:
                if t_settled:  # finished() stopped this wait: the run is over
                    return
                raise
            finally:
                del receiving[j]
            now = time.time()
            if not got:
                continue
            if not t_first:
                t_first.append(now)
            for body, _tok in got:
                parsed = parse_body(body, size)
                if parsed is None or not 0 <= parsed[0] < n:
                    problems.append(f"source {src}: a body that is not one sent ({len(body)} B)")
                    return
                i, sent_at = parsed
                if seen[src][i]:
                    problems.append(f"source {src}: message {i} delivered twice")
                    return
                seen[src][i] = 1
                latencies.append(now - sent_at)
            counts[src] += len(got)
            await ep.settle([tok for _b, tok in got])
            settled[0] += len(got)
            if settled[0] == n * sources:
                finished()

    await asyncio.gather(*(task(j, src, ep) for j, (src, ep) in enumerate(eps)))
    await asyncio.gather(*(ep.close() for _src, ep in eps))
    t_end = time.time()
    missing = sum(n - c for c in counts)
    if missing and not problems:
        problems.append(f"{missing} of {n * sources} messages not received in {cell['timeout']} s")
    return {
        "t_first": t_first[0] if t_first else None,
        "t_end": t_end,
        "t_settled": t_settled[0] if t_settled else None,
        "received": sum(counts),
        "problems": problems,
        "latency": latency_summary(latencies) if latencies else None,
    }


def emit(**obj: Any) -> None:
    sys.stdout.write(_common.PROTO + json.dumps(obj) + "\n")
    sys.stdout.flush()


async def serve(role: str) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            return
        if cmd["op"] != "prepare":
            emit(event="error", error=f"expected prepare, got {cmd['op']!r}")
            continue
        run = run_senders if role == "send" else run_receivers
        try:
            emit(event="done", **(await follow_steps(run, cmd, reader.readline)))
        except Exception:
            emit(event="error", error=traceback.format_exc(limit=-8))


Role = Callable[[dict[str, Any], asyncio.Event, asyncio.Event], Awaitable[dict[str, Any]]]


async def follow_steps(
    run: Role, cmd: dict[str, Any], read_line: Callable[[], Awaitable[bytes]]
) -> dict[str, Any]:
    """Run one role for the prepared cell ``cmd``, letting it warm up when the ``warm``
    command arrives and start the timed run when ``go`` does (each read by ``read_line``);
    its result. Any other command, or the end of input, cancels the role and raises; so does
    the role failing while it prepares or warms up (it does not wait for a command then)."""
    steps = [("warm", asyncio.Event()), ("go", asyncio.Event())]
    job = asyncio.ensure_future(run(cmd, steps[0][1], steps[1][1]))
    while steps and not job.done():
        nxt = asyncio.ensure_future(read_line())
        await asyncio.wait({job, nxt}, return_when=asyncio.FIRST_COMPLETED)
        if nxt.done():
            op, event = steps.pop(0)
            if json.loads(nxt.result() or b'{"op": "exit"}')["op"] != op:
                job.cancel()
                raise RuntimeError(f"expected {op}")
            event.set()
            continue
        nxt.cancel()
    return await job


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--role", choices=["send", "receive"], required=True)
    args = p.parse_args()
    import logging

    import ray

    ray.init(address=args.address, logging_level=logging.WARNING, log_to_driver=False)
    emit(event="ready", pid=os.getpid())
    try:
        asyncio.run(serve(args.role))
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
