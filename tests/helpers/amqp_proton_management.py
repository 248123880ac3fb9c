"""One ``$management`` request to the AMQP gateway, outside any transaction, with
python-qpid-proton: for the operations azure-servicebus for Python does not send
(``batch-delete-messages``, which the .NET SDK's ``DeleteMessagesAsync`` sends)."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container


@dataclass
class Answer:
    status: int | None = None
    condition: str | None = None
    body: Any = None


class _Call(MessagingHandler):  # type: ignore[misc]
    def __init__(self, url: str, node: str, request: Message) -> None:
        super().__init__()
        self.url, self.node, self.request = url, node, request
        self.answer = Answer()
        self.sent = False

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url, allowed_mechs="ANONYMOUS")
        self.sender = event.container.create_sender(conn, self.node)
        event.container.create_receiver(conn, self.node)

    def on_sendable(self, event: Any) -> None:
        if not self.sent:
            self.sent = True
            self.request.reply_to = self.node
            self.sender.send(self.request)

    def on_message(self, event: Any) -> None:
        props = event.message.properties or {}
        self.answer = Answer(
            props.get("statusCode"), props.get("errorCondition"), event.message.body
        )
        event.connection.close()


def management_call(
    port: int, entity: str, operation: str, body: dict[str, Any], timeout: float = 30.0
) -> Answer:
    """Send ``com.microsoft:<operation>`` with ``body`` to ``entity``'s ``$management`` node
    on a new connection and return the answer (fails the test if none comes in time)."""
    request = Message(
        id=str(uuid.uuid4()), properties={"operation": f"com.microsoft:{operation}"}, body=body
    )
    call = _Call(f"amqp://127.0.0.1:{port}", f"{entity}/$management", request)
    thread = threading.Thread(target=Container(call).run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"no answer to {operation} in {timeout} s"
    return call.answer
