#!/usr/bin/env python
"""What an idle actor process costs, and where: the floor under the topic100 cell.

A topic with ``--subscriptions`` subscriptions is that many subscription actors, each its own
Ray worker process (the shape raybus keeps: every subscription owns its messages and locks).
This starts that many raybus subscriptions (durable, each having delivered and completed one
message, so every actor is warm) and the same number of empty async bare actors (the peer:
what any Ray actor costs with nothing to do), waits, then reads from ``/proc`` the CPU each
process and each of its threads spends over ``--seconds`` with nobody calling them.

Reports, for both kinds: percent of a core per actor (median and range), what all of them
together cost in cores, and the share of that spent by the main thread (in a Ray worker it
runs the core worker's task loop; for an async actor the calls run on another thread). It
also counts the main thread's wake-ups (voluntary context switches) per second.

    python benchmarks/idle_actors.py [--subscriptions 20] [--seconds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid

# Before Ray: sets Ray's environment (loopback only, no usage stats) and puts this checkout on
# the import paths of this process and of Ray's workers.
import _common
import ray
from _common import actor_pids_by_class
from _cpu import cpu_seconds

import raybus
from raybus.management import ServiceBusAdministrationClient


@ray.remote(num_cpus=0)
class IdleBare:
    """An async actor that is never called after it started."""

    def pid(self) -> int:
        return os.getpid()

    async def ping(self) -> int:
        return 1


def sample(pid: int) -> tuple[float, float, int]:
    """(process CPU seconds, main thread CPU seconds, main thread voluntary switches)."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        switches = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt"))
    return cpu_seconds(pid), cpu_seconds(pid, thread=pid), switches


def measure(pids: list[int], seconds: float) -> dict[str, float]:
    before = {p: sample(p) for p in pids}
    time.sleep(seconds)
    after = {p: sample(p) for p in pids}
    per = [(after[p][0] - before[p][0]) / seconds * 100 for p in pids]
    main = sum(after[p][1] - before[p][1] for p in pids)
    total = sum(after[p][0] - before[p][0] for p in pids)
    wakes = [(after[p][2] - before[p][2]) / seconds for p in pids]
    return {
        "actors": len(pids),
        "pct_core_median": statistics.median(per),
        "pct_core_min": min(per),
        "pct_core_max": max(per),
        "cores_all": sum(per) / 100,
        "main_thread_share": main / total if total else 0.0,
        "main_wakeups_per_s": statistics.median(wakes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subscriptions", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds to wait before measuring")
    args = ap.parse_args()
    _common.start_local_ray(200)
    tmp = tempfile.mkdtemp(prefix="raybus-idle-")
    namespace = f"idle-{uuid.uuid4().hex[:8]}"
    admin = ServiceBusAdministrationClient(namespace, storage_path=tmp)
    client = raybus.connect(namespace, storage_path=tmp)
    try:
        admin.create_topic("t")
        for i in range(args.subscriptions):
            admin.create_subscription("t", f"s{i}")
        with client.get_topic_sender("t") as sender:
            sender.send_messages(raybus.ServiceBusMessage("warm"))
        for i in range(args.subscriptions):
            with client.get_subscription_receiver("t", f"s{i}", max_wait_time=5) as r:
                r.complete_messages(r.receive_messages(1))
        bares = [IdleBare.remote() for _ in range(args.subscriptions)]  # type: ignore[attr-defined]
        bare_pids = ray.get([b.pid.remote() for b in bares])
        subs = actor_pids_by_class().get("PartitionActor", [])  # the subscriptions: no queue here
        time.sleep(args.settle)
        results = {
            "bare Ray actor": measure(bare_pids, args.seconds),
            "raybus subscription": measure(subs, args.seconds),
        }
        cores = os.cpu_count() or 1
        print(f"{args.subscriptions} actors of each kind idle for {args.seconds:.0f} s:")
        print(
            f"{'kind':<22}{'% core/actor':>14}{'range':>14}{'all, cores':>12}"
            f"{'main thread':>13}{'wakes/s':>9}{'per 100 actors':>16}"
        )
        for kind, m in results.items():
            per100 = m["pct_core_median"]  # % of a core per actor = cores per 100 actors
            print(
                f"{kind:<22}{m['pct_core_median']:>14.2f}"
                f"{m['pct_core_min']:>7.2f}-{m['pct_core_max']:<6.2f}{m['cores_all']:>12.3f}"
                f"{m['main_thread_share']:>12.0%}{m['main_wakeups_per_s']:>9.0f}"
                f"{per100:>9.2f} cores ({per100 / cores:.0%} of {cores})"
            )
    finally:
        try:
            admin.delete_topic("t")
        finally:
            client.close()
            admin.close()
            ray.shutdown()


if __name__ == "__main__":
    main()
