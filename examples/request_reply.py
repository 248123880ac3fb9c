"""Request/reply over queues: ``reply_to``, ``reply_to_session_id`` and ``correlation_id``.

Run: ``python examples/request_reply.py`` (starts an embedded local Ray if none runs).
Two clients send factorisation requests to a ``requests`` queue, each naming the ``replies``
queue in ``reply_to`` and its own session there in ``reply_to_session_id``. A processor (a pool
of Ray actors) answers each request into that session, with ``correlation_id`` set to the
request's ``message_id``. Each client receives only its own session's replies and matches them
to its requests.
"""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import raybus
from raybus import ServiceBusMessage
from raybus.management import ServiceBusAdministrationClient


def factorise(n: int) -> str:
    factors, d = [], 2
    while d * d <= n:
        while n % d == 0:
            factors.append(d)
            n //= d
        d += 1
    if n > 1:
        factors.append(n)
    return " x ".join(map(str, factors))


def answer(message: raybus.ServiceBusReceivedMessage, context: raybus.ProcessorContext) -> None:
    """Runs in a replica actor: reply into the requester's session on its reply queue."""
    n = int(str(message.body))
    reply = ServiceBusMessage(
        f"{n} = {factorise(n)}",
        correlation_id=message.message_id,
        session_id=message.reply_to_session_id,
    )
    assert message.reply_to is not None
    context.get_queue_sender(message.reply_to).send_messages(reply)


def requester(client: raybus.ServiceBusClient, me: str, numbers: list[int]) -> list[str]:
    """Send requests, then collect the replies addressed to this requester's session."""
    pending = {}
    with client.get_queue_sender("requests") as sender:
        for n in numbers:
            request_id = f"{me}-{uuid.uuid4().hex[:6]}"
            pending[request_id] = n
            sender.send_messages(
                ServiceBusMessage(
                    str(n), message_id=request_id, reply_to="replies", reply_to_session_id=me
                )
            )
    lines = []
    with client.get_queue_receiver("replies", session_id=me, max_wait_time=30) as replies:
        while pending:
            for reply in replies.receive_messages(len(pending)):
                n = pending.pop(str(reply.correlation_id))
                lines.append(f"{me}: asked {n}, got {reply.body}")
                replies.complete_message(reply)
    return lines


def main() -> None:
    namespace = f"example-{uuid.uuid4().hex[:6]}"
    admin = ServiceBusAdministrationClient(namespace, storage_path="memory://")
    admin.create_queue("requests")
    admin.create_queue("replies", requires_session=True)
    client = raybus.connect(namespace)

    processor = client.get_processor("requests", answer, max_concurrent_calls=4)
    with processor, ThreadPoolExecutor(2) as pool:
        alice = pool.submit(requester, client, "alice", [360, 97, 1001])
        bob = pool.submit(requester, client, "bob", [2**10, 2310])
        for line in [*alice.result(), *bob.result()]:
            print(line)
    # After stop(): the replicas' final reports are in (a reply can arrive before its
    # handler has returned and been counted).
    print(f"processor handled {processor.statistics.handled} requests")
    admin.delete_queue("requests")
    admin.delete_queue("replies")


if __name__ == "__main__":
    main()
