"""Two processes on one Ray cluster share a raybus namespace: each sees the queues and the
messages of the other (the namespace's registry is a named, detached actor)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import raybus
from raybus.management import ServiceBusAdministrationClient

ROOT = Path(__file__).resolve().parents[2]  # the repository root, which holds raybus/


def _run_child(script: str, *args: str) -> str:
    """Run ``script`` in a new Python process joined to the test's Ray cluster; return its
    standard output (the test fails with the child's output if the child fails)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYBUS_ADDRESS")}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


SENDER = """
    import sys
    import raybus

    namespace, address, queue = sys.argv[1:4]
    client = raybus.connect(namespace, address=address)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(
            [raybus.ServiceBusMessage(f"child-{i}", message_id=str(i)) for i in range(10)]
        )
    print("sent 10")
"""

CREATOR = """
    import sys
    import raybus
    from raybus.management import ServiceBusAdministrationClient

    namespace, address, queue = sys.argv[1:4]
    admin = ServiceBusAdministrationClient(namespace, address=address)
    admin.create_queue(queue, max_delivery_count=3)
    with raybus.connect(namespace, address=address).get_queue_sender(queue) as sender:
        sender.send_messages(raybus.ServiceBusMessage("hello from the child"))
    print("created", queue)
"""


def test_messages_sent_by_another_process_reach_this_one(
    ray_cluster: str,
    namespace: str,
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    queue: str,
) -> None:
    assert "sent 10" in _run_child(SENDER, namespace, ray_cluster, queue)
    got: list[raybus.ServiceBusReceivedMessage] = []
    with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        while len(got) < 10:
            batch = receiver.receive_messages(10)
            assert batch, f"only {len(got)} of the child's 10 messages arrived"
            got.extend(batch)
        receiver.complete_messages(got)
        assert receiver.receive_messages(max_wait_time=0.3) == []
    assert [m.body for m in got] == [f"child-{i}" for i in range(10)]
    assert admin.get_queue_runtime_properties(queue).active_message_count == 0


def test_queue_created_by_another_process_is_listed_and_usable_here(
    ray_cluster: str,
    namespace: str,
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
) -> None:
    admin.list_queues()  # this process joins the namespace first; the child finds it
    name = f"child-{uuid.uuid4().hex[:8]}"
    assert f"created {name}" in _run_child(CREATOR, namespace, ray_cluster, name)
    assert name in {q.name for q in admin.list_queues()}
    assert admin.get_queue(name).max_delivery_count == 3
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        assert msg.body == "hello from the child"
        receiver.complete_message(msg)
