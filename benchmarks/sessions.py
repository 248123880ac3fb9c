#!/usr/bin/env python
"""What sessions cost: one sender and one receiver through a durable queue with sessions,
against the same through a queue without (the peer).

A Service Bus user turns sessions on for ordering and affinity and expects no large price for
it. Each round sends ``--messages`` 1 KiB messages in lists of ``--batch`` while one receiver
(prefetch twice ``--batch``) takes up to ``--batch`` at a time and completes them with
``complete_messages``, both in this process, on three queues in turn (the machine is shared:
compare ratios, rounds alternate):

- ``plain``: no sessions;
- ``session``: every message in one session, the receiver holding it (``session_id``);
- ``sessions``: ``--sessions`` sessions, one receiver per session (``NEXT_AVAILABLE_SESSION``),
  the sender's lists rotating over them.

Reports messages per second from the first send to the last completion (median of rounds) and
each kind ÷ ``plain``. Every message is checked to arrive once, in order within its session.

    python benchmarks/sessions.py [--rounds 3] [--messages 20000] [--batch 100] [--sessions 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common
import ray

from raybus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, aio
from raybus.management import ServiceBusAdministrationClient

KINDS = ("plain", "session", "sessions")
BODY = 1024


def _sessions_of(kind: str, args: argparse.Namespace) -> list[str | None]:
    return {
        "plain": [None],
        "session": ["s0"],
        "sessions": [f"s{k}" for k in range(args.sessions)],
    }[kind]


async def _receive(receiver: aio.ServiceBusReceiver, n: int, batch: int) -> list[int]:
    """Up to ``n`` message indexes, in the order received, each list completed at once."""
    got: list[int] = []
    while len(got) < n:
        msgs = await receiver.receive_messages(max_message_count=batch, max_wait_time=10)
        if not msgs:
            break
        await receiver.complete_messages(msgs)
        got += [int(str(m.application_properties["i"])) for m in msgs]
    return got


async def _run(client: aio.ServiceBusClient, kind: str, args: argparse.Namespace) -> float:
    """Messages per second for one kind; checks every message arrived once, in order."""
    sessions = _sessions_of(kind, args)
    per = args.messages // len(sessions)
    # One receiver for the queue or the one session; one per session, each taking the next.
    held = [NEXT_AVAILABLE_SESSION] * len(sessions) if kind == "sessions" else sessions
    receivers = [
        client.get_queue_receiver(
            kind, session_id=sid, prefetch_count=2 * args.batch, max_wait_time=10
        )
        for sid in held
    ]
    sender = client.get_queue_sender(kind)

    async def send() -> None:
        for start in range(0, per, args.batch):
            for sid in sessions:  # rotating over the sessions, one list each
                await sender.send_messages(
                    [
                        ServiceBusMessage(
                            b"x" * BODY, session_id=sid, application_properties={"i": i}
                        )
                        for i in range(start, min(start + args.batch, per))
                    ]
                )

    async with sender:
        # The receivers open (and take their sessions) on their first receive: send first.
        started = time.perf_counter()
        sending = asyncio.ensure_future(send())
        got = await asyncio.gather(*(_receive(r, per, args.batch) for r in receivers))
        await sending
        took = time.perf_counter() - started
        for r in receivers:
            await r.close()
    for indexes in got:  # each receiver had one session (or the queue): in order, once
        assert indexes == list(range(per)), f"{kind}: {len(indexes)} of {per}, or out of order"
    return len(sessions) * per / took


async def _round(namespace: str, args: argparse.Namespace, r: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with aio.ServiceBusClient(namespace) as client:
        order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))
        for kind in order:
            out[kind] = await _run(client, kind, args)
            _common.progress(f"  {kind}: {out[kind]:,.0f} msg/s")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", type=int, default=20_000, help="per kind and round")
    p.add_argument("--batch", type=int, default=100, help="messages per list")
    p.add_argument("--sessions", type=int, default=4, help="sessions of the 'sessions' kind")
    args = p.parse_args(argv)
    _common.start_local_ray(object_store_mb=200)
    namespace = f"sessions-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as storage:
        admin = ServiceBusAdministrationClient(namespace, storage_path=storage)
        admin.create_queue("plain")
        admin.create_queue("session", requires_session=True)
        admin.create_queue("sessions", requires_session=True)
        rounds: list[dict[str, float]] = []
        try:
            for r in range(args.rounds):
                _common.progress(f"round {r + 1} of {args.rounds}")
                rounds.append(asyncio.run(_round(namespace, args, r)))
        finally:
            ray.shutdown()
    print(
        f"\nOne sender (lists of {args.batch}) and receivers completing lists, durable, 1 KiB, "
        f"{args.messages:,} messages per kind (median of {args.rounds} rounds)\n"
    )
    plain = statistics.median(r["plain"] for r in rounds)
    rows = []
    for kind in KINDS:
        rate = statistics.median(r[kind] for r in rounds)
        rows.append([kind, f"{rate:,.0f}", f"{rate / plain:.2f}x"])
    print("\n".join(_common.md_table("queue | msg/s | ÷ plain", "---|---:|---:", rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
