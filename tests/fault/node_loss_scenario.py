"""A three-node Ray cluster on this machine loses the worker node that hosts partitions
mid-stream; nothing acknowledged may be lost.

Run by ``test_node_loss.py`` in its own process (it needs its own Ray cluster, which cannot
share a process with the session's local Ray). Prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray
from ray.cluster_utils import Cluster

import raybus
from raybus import ServiceBusMessage
from raybus.management import ServiceBusAdministrationClient

TOTAL = 3000
PARTITIONS = 4


def node_of(handle: object) -> str:
    node: str = ray.get(
        handle.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id()),  # type: ignore[attr-defined]
        timeout=30,
    )
    return node


def main(storage: str) -> dict[str, object]:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "object_store_memory": 150 << 20,
        },
    )
    workers = [cluster.add_node(num_cpus=1, object_store_memory=150 << 20) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    try:
        client = raybus.connect("nodeloss", storage_path=storage)
        admin = ServiceBusAdministrationClient("nodeloss")
        admin.create_queue("q", partition_count=PARTITIONS)
        route = ray.get(client._aio._conn.registry.route.remote("q"))
        hosts = {pid: node_of(h) for pid, h in route.existing()}
        by_node: dict[str, list[int]] = {}
        for pid, node in hosts.items():
            by_node.setdefault(node, []).append(pid)
        victim = max(workers, key=lambda w: len(by_node.get(w.node_id, [])))
        victim_partitions = by_node.get(victim.node_id, [])

        acked: set[str] = set()
        failed_sends = 0
        completed: set[str] = set()
        deliveries = 0
        done_sending = threading.Event()

        def send() -> None:
            nonlocal failed_sends
            with client.get_queue_sender("q") as sender:
                i = 0
                while i < TOTAL:
                    batch = [ServiceBusMessage(f"m{i + j}") for j in range(10)]
                    try:
                        sender.send_messages(batch, timeout=30)
                    except raybus.exceptions.ServiceBusError:
                        failed_sends += 1  # not acknowledged: may or may not be stored
                        time.sleep(0.2)
                        continue
                    acked.update(f"m{i + j}" for j in range(10))
                    i += 10
                    time.sleep(0.002)
            done_sending.set()

        def receive() -> None:
            nonlocal deliveries
            with client.get_queue_receiver("q", max_wait_time=1) as receiver:
                quiet = 0.0
                while not done_sending.is_set() or quiet < 5.0:
                    try:
                        got = receiver.receive_messages(100, max_wait_time=1)
                    except raybus.exceptions.ServiceBusError:
                        time.sleep(0.2)
                        continue
                    quiet = 0.0 if got else quiet + 1.0
                    deliveries += len(got)
                    for msg in got:
                        try:
                            receiver.complete_message(msg)
                            completed.add(str(msg))
                        except raybus.exceptions.ServiceBusError:
                            pass  # lock lost to the failure: it comes again

        threads = [threading.Thread(target=send), threading.Thread(target=receive)]
        for t in threads:
            t.start()
        while len(acked) < TOTAL // 3:
            time.sleep(0.05)
        removed_at = len(acked)
        cluster.remove_node(victim)
        for t in threads:
            t.join(timeout=240)
        hung = any(t.is_alive() for t in threads)
        left = admin.get_queue_runtime_properties("q").active_message_count
        return {
            "victim_partitions": victim_partitions,
            "removed_at_acked": removed_at,
            "acked": len(acked),
            "completed": len(completed),
            "lost": sorted(acked - completed)[:20],
            "lost_count": len(acked - completed),
            "deliveries": deliveries,
            "failed_sends": failed_sends,
            "left_in_queue": left,
            "hung": hung,
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
