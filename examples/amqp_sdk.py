"""The official azure-servicebus SDK, unmodified, against raybus through its AMQP gateway.

Starts the gateway on a free port of 127.0.0.1 (``raybus gateway --port 5672`` does the same
from the command line), then uses ``azure.servicebus.ServiceBusClient`` exactly as against
Azure: a batch send, a peek-lock receive with complete and dead-letter, a session, and a
message sent natively by raybus and read by the SDK. Needs ``pip install azure-servicebus``.
"""

from __future__ import annotations

import os
import uuid

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # listen on loopback only
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

import raybus
from raybus.amqp import start_gateway
from raybus.management import ServiceBusAdministrationClient


def main() -> None:
    namespace = f"amqp-example-{uuid.uuid4().hex[:8]}"
    admin = ServiceBusAdministrationClient(namespace)
    admin.create_queue("orders", max_delivery_count=3)
    admin.create_queue("chats", requires_session=True)

    with start_gateway(namespace, port=0) as gateway:
        print(f"gateway on 127.0.0.1:{gateway.port}")
        # The development-emulator form: plain AMQP, the key only signs tokens.
        conn_str = (
            f"Endpoint=sb://localhost:{gateway.port};SharedAccessKeyName=k;"
            "SharedAccessKey=v;UseDevelopmentEmulator=true;"
        )
        with ServiceBusClient.from_connection_string(conn_str) as sdk:
            with sdk.get_queue_sender("orders") as sender:
                batch = sender.create_message_batch()
                for n in range(1, 4):
                    batch.add_message(
                        ServiceBusMessage(f"order {n}", application_properties={"n": n})
                    )
                sender.send_messages(batch)
                print(f"SDK sent a batch of {len(batch)}")

            with sdk.get_queue_receiver("orders", max_wait_time=5) as receiver:
                got = []
                while len(got) < 3:
                    got += receiver.receive_messages(max_message_count=3, max_wait_time=5)
                for msg in got:
                    print(f"SDK received {str(msg)!r} (sequence {msg.sequence_number})")
                receiver.complete_message(got[0])
                receiver.complete_message(got[1])
                receiver.dead_letter_message(got[2], reason="example", error_description="demo")

            with sdk.get_queue_receiver(
                "orders", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5
            ) as dlq:
                (dead,) = dlq.receive_messages(max_wait_time=5)
                print(f"dead-lettered: {str(dead)!r}, reason {dead.dead_letter_reason!r}")
                dlq.complete_message(dead)

            with sdk.get_queue_sender("chats") as sender:
                sender.send_messages(ServiceBusMessage("hi", session_id="alice"))
            with sdk.get_queue_receiver("chats", session_id="alice", max_wait_time=5) as chat:
                (msg,) = chat.receive_messages(max_wait_time=5)
                chat.session.set_state(b"greeted")
                chat.complete_message(msg)
                print(f"session {chat.session.session_id!r}: {str(msg)!r}, state saved")

            with raybus.ServiceBusClient(namespace) as native:
                native.get_queue_sender("orders").send_messages(
                    raybus.ServiceBusMessage("sent natively", subject="native")
                )
            with sdk.get_queue_receiver("orders", max_wait_time=5) as receiver:
                (msg,) = receiver.receive_messages(max_wait_time=5)
                print(f"SDK received a native message: {str(msg)!r}, subject {msg.subject!r}")
                receiver.complete_message(msg)


if __name__ == "__main__":
    main()
