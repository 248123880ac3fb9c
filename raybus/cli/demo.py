"""``raybus demo``: a short tour of the broker (the flow of ``examples/quickstart.py``).

It creates a queue with a unique name, sends five orders, completes, abandons and
dead-letters some, resubmits the dead letter, prints what happens, and deletes the queue.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import typer
from rich.console import Console

from ..enums import ServiceBusSubQueue
from ..message import ServiceBusMessage
from . import _context
from .dlq import resubmit_copy

__all__ = ["demo"]


def demo(ctx: typer.Context) -> None:
    """Run a short demo: send, receive, settle, dead-letter, resubmit.

    Creates a queue with a unique name in the namespace and deletes it at the end.
    """
    cli = _context.get(ctx)
    out = Console(highlight=False)
    admin, client = cli.admin(), cli.client()
    name = f"demo-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name, lock_duration=timedelta(seconds=30), max_delivery_count=3)
    out.print(f"[b]created queue[/b] {name} in namespace {cli.namespace}")
    try:
        with client.get_queue_sender(name) as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(
                        f"order {n}",
                        message_id=f"order-{n}",
                        application_properties={"amount": n * 10},
                    )
                    for n in range(1, 6)
                ]
            )
        out.print("[b]sent[/b] 5 orders in one call")
        with client.get_queue_receiver(name, max_wait_time=2) as receiver:
            for msg in receiver.receive_messages(max_message_count=10):
                amount = msg.application_properties["amount"]  # type: ignore[index]
                if amount > 40:
                    receiver.dead_letter_message(
                        msg, reason="TooLarge", error_description=f"{amount}"
                    )
                    out.print(f"  #{msg.sequence_number} {msg}: dead-lettered (amount {amount})")
                elif amount == 30:
                    receiver.abandon_message(msg)
                    out.print(f"  #{msg.sequence_number} {msg}: abandoned, will come again")
                else:
                    receiver.complete_message(msg)
                    out.print(f"  #{msg.sequence_number} {msg}: completed")
            for msg in receiver.receive_messages(max_message_count=10):
                out.print(f"  #{msg.sequence_number} {msg}: delivery count {msg.delivery_count}")
                receiver.complete_message(msg)
        with (
            client.get_queue_receiver(
                name, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=2
            ) as dlq,
            client.get_queue_sender(name) as sender,
        ):
            dead = dlq.receive_messages(max_message_count=10)
            with client.transaction() as txn:
                sender.send_messages([resubmit_copy(m) for m in dead], transaction=txn)
                for msg in dead:
                    dlq.complete_message(msg, transaction=txn)
            out.print(f"[b]resubmitted[/b] {len(dead)} dead letter(s) in one transaction")
        counts = admin.get_queue_runtime_properties(name)
        out.print(
            f"queue now: {counts.active_message_count} active, "
            f"{counts.dead_letter_message_count} dead-lettered"
        )
    finally:
        admin.delete_queue(name)
    out.print(f"[b]deleted[/b] {name}; try: raybus queue create orders && raybus send orders hi")
