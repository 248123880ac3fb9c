#!/usr/bin/env python
"""What access control costs: the same workload on an open namespace and on a closed one, in one
run, plus the check itself.

* ``guard``: ``Guard.check`` per call for a cached token (the common case: every call after a
  client's first) and for a token seen for the first time (one HMAC-SHA256 verification).
* ``end to end``: N x 1 KiB messages sent in lists of 100 and received + completed in batches,
  on an open namespace and on one with rules whose client signs with a shared-access key. The
  ratio closed ÷ open is the cost (the machine is shared: ratios hold, absolute numbers drift).

Run: ``python benchmarks/access_control.py [--quick]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse
import time
import uuid
from pathlib import Path
from typing import Any

import ray
from _common import machine_facts, make_body, median, write_results

import raybus
from raybus._clock import SystemClock
from raybus._core.access import AccessTable, Guard
from raybus.auth import AccessRights, SharedAccessKeyCredential, generate_sas_token
from raybus.management import ServiceBusAdministrationClient

KEY = "K" * 44


def guard_costs(n: int) -> dict[str, float]:
    table = AccessTable()
    table.put(table.validate("app", ["Send"], None, KEY, None))
    guard = Guard("RaybusInternal x", SystemClock())
    guard.load(*table.snapshot())
    expiry = int(time.time() + 3600)
    token = generate_sas_token("sb://x/", "app", KEY, expiry)
    guard.check(token, AccessRights.SEND, "q")
    t0 = time.perf_counter()
    for _ in range(n):
        guard.check(token, AccessRights.SEND, "q")
    cached = (time.perf_counter() - t0) / n
    fresh = [generate_sas_token("sb://x/", "app", KEY, expiry + i) for i in range(n // 10)]
    t0 = time.perf_counter()
    for t in fresh:
        guard.check(t, AccessRights.SEND, "q")
    first = (time.perf_counter() - t0) / len(fresh)
    return {"cached_check_us": cached * 1e6, "first_check_us": first * 1e6}


def run_once(namespace: str, credential: Any, n: int) -> float:
    """Seconds to send n messages and receive + complete them all."""
    body = make_body(0, 1024)
    with raybus.ServiceBusClient(namespace, credential=credential) as client:
        sender = client.get_queue_sender("q")
        t0 = time.perf_counter()
        for i in range(0, n, 100):
            sender.send_messages([raybus.ServiceBusMessage(body) for _ in range(min(100, n - i))])
        got = 0
        with client.get_queue_receiver("q", prefetch_count=200, max_wait_time=5) as receiver:
            while got < n:
                batch = receiver.receive_messages(max_message_count=100, max_wait_time=5)
                if not batch:
                    raise RuntimeError(f"only {got} of {n} messages arrived")
                receiver.complete_messages(batch)
                got += len(batch)
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    n = args.messages or (5_000 if args.quick else 20_000)
    started = time.time()
    facts = machine_facts()
    costs = guard_costs(200_000 if not args.quick else 50_000)
    print(
        f"guard: cached token {costs['cached_check_us']:.2f} µs/check, "
        f"first sight {costs['first_check_us']:.1f} µs/check"
    )
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 2**20,
        log_to_driver=False,
    )
    try:
        open_ns, closed_ns = (
            f"acl-open-{uuid.uuid4().hex[:6]}",
            f"acl-closed-{uuid.uuid4().hex[:6]}",
        )
        for ns in (open_ns, closed_ns):
            ServiceBusAdministrationClient(ns, storage_path="memory://").create_queue("q")
        ServiceBusAdministrationClient(closed_ns).create_authorization_rule(
            "app", ["Manage"], primary_key=KEY
        )
        cred = SharedAccessKeyCredential("app", KEY)
        times: dict[str, list[float]] = {"open": [], "closed": []}
        for _ in range(args.rounds):  # interleaved, so drift hits both alike
            times["open"].append(run_once(open_ns, None, n))
            times["closed"].append(run_once(closed_ns, cred, n))
        rates = {k: n / (median(v) or 1) for k, v in times.items()}
        ratio = rates["closed"] / rates["open"]
        print(f"end to end ({n} x 1 KiB, send + receive + complete, median of {args.rounds}):")
        print(f"  open namespace   {rates['open']:>9,.0f} msgs/s")
        print(f"  closed namespace {rates['closed']:>9,.0f} msgs/s  = {ratio:.2f}x open")
        out = write_results(
            "access_control",
            started,
            args,
            facts,
            {"guard": costs, "msgs_per_s": rates, "closed_over_open": ratio, "seconds": times},
        )
        print(f"results: {out}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
