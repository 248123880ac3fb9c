"""What a processor's handler gets besides the message: ``ProcessorContext``.

A handler settles its message through the context when the processor runs with
``auto_complete=False`` (with ``auto_complete=True`` it may still do so; the processor then
settles nothing). The context also reads and writes the session's state on a session-enabled
entity, and gives senders (for replies) that share the replica's client.

Coroutine-function handlers get this class; plain-function handlers run in a thread pool and
get ``raybus.ProcessorContext``, whose methods block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..exceptions import InvalidArgumentError
from ..message import ServiceBusReceivedMessage
from ._receiver import ServiceBusReceiver
from ._sender import ServiceBusSender

__all__ = ["ProcessorContext"]


class ProcessorContext:
    """The context of one handler call (asyncio; see the module docstring).

    Settling guarantees are the receiver's (``raybus.aio.ServiceBusReceiver``): a settlement
    with the lock comfortably valid returns without waiting for the broker. A message may be
    settled once; a second settlement raises ``MessageAlreadySettled``.
    """

    def __init__(
        self,
        receiver: ServiceBusReceiver,
        message: ServiceBusReceivedMessage,
        replica_id: int,
        get_sender: Callable[[str], ServiceBusSender],
        on_dead_letter: Callable[[], None],
    ) -> None:
        self._receiver = receiver
        self.message = message
        """The message being handled."""
        self.replica_id = replica_id
        """The id of the replica running the handler (ids are not reused within a processor)."""
        self._get_sender = get_sender
        self._on_dead_letter = on_dead_letter

    @property
    def session_id(self) -> str | None:
        """The session being worked (None on an entity without sessions)."""
        session = self._receiver.session
        return None if session is None else session.session_id

    async def complete_message(self) -> None:
        """Remove the message from the entity."""
        await self._receiver.complete_message(self.message)

    async def abandon_message(self, properties_to_modify: dict[str, Any] | None = None) -> None:
        """Give the message back now; it comes again with ``delivery_count + 1``."""
        await self._receiver.abandon_message(self.message, properties_to_modify)

    async def defer_message(self, properties_to_modify: dict[str, Any] | None = None) -> None:
        """Set the message aside (fetch it with ``receive_deferred_messages``)."""
        await self._receiver.defer_message(self.message, properties_to_modify)

    async def dead_letter_message(
        self,
        reason: str | None = None,
        error_description: str | None = None,
        properties_to_modify: dict[str, Any] | None = None,
    ) -> None:
        """Move the message to the dead-letter sub-queue (counted in ``dead_lettered``)."""
        await self._receiver.dead_letter_message(
            self.message, reason, error_description, properties_to_modify
        )
        self._on_dead_letter()

    def _session(self) -> Any:
        if self._receiver.session is None:
            raise InvalidArgumentError(
                "the entity has no sessions: session state needs a session-enabled entity",
                self._receiver.entity_path,
                "session",
            )
        return self._receiver.session

    async def get_session_state(self) -> bytes | None:
        """The state of the session being worked (None when it has none)."""
        state: bytes | None = await self._session().get_state()
        return state

    async def set_session_state(self, state: str | bytes | bytearray | None) -> None:
        """Replace the state of the session being worked."""
        await self._session().set_state(state)

    def get_queue_sender(self, queue_name: str) -> ServiceBusSender:
        """A sender to ``queue_name`` on the replica's client (for replies: send to
        ``message.reply_to`` with ``correlation_id`` set). Shared by the replica's handlers;
        the processor closes it when the replica stops: do not close it yourself."""
        return self._get_sender(queue_name)
