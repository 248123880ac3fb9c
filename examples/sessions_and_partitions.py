"""Sessions on a partitioned queue, and changing the partition count while it runs.

Run: ``python examples/sessions_and_partitions.py`` (starts an embedded local Ray if none runs).
Each customer's orders form a session: one worker at a time handles a customer, in order,
keeping a running total in the session state. Meanwhile the queue grows from 2 to 4 partitions.
"""

from __future__ import annotations

import os
import uuid

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import raybus
from raybus import NEXT_AVAILABLE_SESSION, ServiceBusMessage
from raybus.exceptions import OperationTimeoutError
from raybus.management import ServiceBusAdministrationClient


def main() -> None:
    namespace = f"example-{uuid.uuid4().hex[:6]}"
    admin = ServiceBusAdministrationClient(namespace, storage_path="memory://")
    admin.create_queue("orders", requires_session=True, partition_count=2)
    client = raybus.connect(namespace)

    customers = ["alice", "bob", "carol"]
    with client.get_queue_sender("orders") as sender:
        for n in range(1, 4):
            sender.send_messages([ServiceBusMessage(f"order {n}", session_id=c) for c in customers])

    # Grow the queue while messages wait in it: sessions keep their messages and order.
    admin.update_queue(admin.get_queue("orders"), partition_count=4)
    print("partitions now:", admin.wait_for_partitions("orders"))

    while True:
        receiver = client.get_queue_receiver(
            "orders", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2
        )
        try:
            with receiver:
                session = receiver.session
                state = session.get_state()
                total = int(state) if state else 0
                for msg in receiver.receive_messages(10, max_wait_time=1):
                    total += 1
                    print(f"{session.session_id}: {msg} (orders so far: {total})")
                    receiver.complete_message(msg)
                session.set_state(str(total))
        except OperationTimeoutError:
            break  # no session has messages left

    print("sessions with state:", client.list_queue_sessions("orders"))
    admin.delete_queue("orders")


if __name__ == "__main__":
    main()
