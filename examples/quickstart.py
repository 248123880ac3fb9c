"""raybus quickstart: create a queue, send, receive, settle, dead-letter — and print it all.

Run with `make run` (starts an embedded local Ray cluster on 127.0.0.1).
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # listen on loopback only
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from datetime import timedelta

import raybus
from raybus import ServiceBusMessage, ServiceBusSubQueue
from raybus.exceptions import MessagingEntityNotFoundError
from raybus.management import ServiceBusAdministrationClient


def main() -> None:
    # One namespace for every run: its data lives under ~/.raybus/storage/quickstart (a few KB
    # once the queue is deleted), not in a new directory per run.
    namespace = "quickstart"
    client = raybus.connect(namespace)
    admin = ServiceBusAdministrationClient(namespace)
    try:
        admin.delete_queue("orders")  # left by a run that was interrupted
        print("deleted the queue a previous run left")
    except MessagingEntityNotFoundError:
        pass

    queue = admin.create_queue("orders", lock_duration=timedelta(seconds=30), max_delivery_count=3)
    print(
        f"created queue {queue.name!r}: lock {queue.lock_duration}, "
        f"max delivery count {queue.max_delivery_count}"
    )

    with client.get_queue_sender("orders") as sender:
        orders = [
            ServiceBusMessage(
                f"order {n}", message_id=f"order-{n}", application_properties={"amount": n * 10}
            )
            for n in range(1, 6)
        ]
        sender.send_messages(orders)
        print(f"sent {len(orders)} messages in one call")

    with client.get_queue_receiver("orders", max_wait_time=2) as receiver:
        received = receiver.receive_messages(max_message_count=10)
        for msg in received:
            amount = msg.application_properties["amount"]
            if amount > 40:
                receiver.dead_letter_message(
                    msg, reason="TooLarge", error_description=f"amount {amount} over limit"
                )
                print(f"  #{msg.sequence_number} {msg}: dead-lettered (amount {amount})")
            elif amount == 30:
                receiver.abandon_message(msg)
                print(f"  #{msg.sequence_number} {msg}: abandoned, will come again")
            else:
                receiver.complete_message(msg)
                print(f"  #{msg.sequence_number} {msg}: completed")

        again = receiver.receive_messages(max_message_count=10)
        for msg in again:
            print(
                f"  #{msg.sequence_number} {msg}: redelivered, delivery count "
                f"{msg.delivery_count}; completing"
            )
            receiver.complete_message(msg)

    with client.get_queue_receiver(
        "orders", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=2
    ) as dlq:
        for msg in dlq.receive_messages(max_message_count=10):
            print(
                f"dead-letter queue: #{msg.sequence_number} {msg} — "
                f"{msg.dead_letter_reason}: {msg.dead_letter_error_description}"
            )
            dlq.complete_message(msg)

    counts = admin.get_queue_runtime_properties("orders")
    print(
        f"queue now: {counts.active_message_count} active, "
        f"{counts.dead_letter_message_count} dead-lettered"
    )
    admin.delete_queue("orders")
    print("deleted the queue; done")


if __name__ == "__main__":
    main()
