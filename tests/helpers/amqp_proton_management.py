"""One ``$management`` request to the AMQP gateway, outside any transaction, with
python-qpid-proton: for the operations azure-servicebus for Python does not send
(``batch-delete-messages``, which the .NET SDK's ``DeleteMessagesAsync`` sends). With a
``session_id`` the connection first opens a receiver link holding that session (with no
credit, so it takes no message), as a session operation needs."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any

from proton import Message, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, Filter

_SESSION_FILTER = symbol("com.microsoft:session-filter")


@dataclass
class Answer:
    status: int | None = None
    condition: str | None = None
    body: Any = None


class _Call(MessagingHandler):  # type: ignore[misc]
    def __init__(self, url: str, entity: str, request: Message, session_id: str | None) -> None:
        super().__init__(prefetch=0)  # credit by hand: the session link must take nothing
        self.url, self.entity, self.request = url, entity, request
        self.node = f"{entity}/$management"
        self.session_id = session_id
        self.answer = Answer()
        self.sent = False
        self.session_link: Any = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, allowed_mechs="ANONYMOUS")
        if self.session_id is None:
            self._open_management(event.container)
        else:
            self.session_link = event.container.create_receiver(
                self.conn, self.entity, options=Filter({_SESSION_FILTER: self.session_id})
            )

    def on_link_opened(self, event: Any) -> None:
        session_link = self.session_link
        if session_link is not None and event.link.name == session_link.name:
            self._open_management(event.container)

    def _open_management(self, container: Any) -> None:
        self.sender = container.create_sender(self.conn, self.node)
        container.create_receiver(self.conn, self.node).flow(1)

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
    port: int,
    entity: str,
    operation: str,
    body: dict[str, Any],
    timeout: float = 30.0,
    session_id: str | None = None,
) -> Answer:
    """Send ``com.microsoft:<operation>`` with ``body`` to ``entity``'s ``$management`` node
    on a new connection and return the answer (fails the test if none comes in time)."""
    request = Message(
        id=str(uuid.uuid4()), properties={"operation": f"com.microsoft:{operation}"}, body=body
    )
    call = _Call(f"amqp://127.0.0.1:{port}", entity, request, session_id)
    thread = threading.Thread(target=Container(call).run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"no answer to {operation} in {timeout} s"
    return call.answer
