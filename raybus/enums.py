"""Enumerations with the azure-servicebus names and values."""

from __future__ import annotations

from enum import Enum, IntEnum

__all__ = [
    "NEXT_AVAILABLE_SESSION",
    "EntityAvailabilityStatus",
    "EntityStatus",
    "ServiceBusDisposition",
    "ServiceBusMessageState",
    "ServiceBusReceiveMode",
    "ServiceBusSessionFilter",
    "ServiceBusSubQueue",
]


class ServiceBusReceiveMode(str, Enum):
    """PEEK_LOCK (at-least-once, settle explicitly) or RECEIVE_AND_DELETE (at-most-once)."""

    PEEK_LOCK = "peeklock"
    RECEIVE_AND_DELETE = "receiveanddelete"


class ServiceBusSubQueue(str, Enum):
    """The sub-queues of a queue or subscription."""

    DEAD_LETTER = "deadletter"
    TRANSFER_DEAD_LETTER = "transferdeadletter"


class ServiceBusDisposition(str, Enum):
    """How ``settle_message_by_lock_token`` settles a message: the outcomes of Service Bus's
    ``$management`` ``update-disposition`` and REST settlement, plus AMQP's ``released``.

    COMPLETED removes it; ABANDONED makes it available again with ``delivery_count + 1``;
    DEFERRED sets it aside for ``receive_deferred_messages``; DEAD_LETTERED moves it to the
    dead-letter sub-queue; RELEASED gives it back *without* counting a delivery (for a
    message received but never handed to the application, e.g. a gateway's surplus).
    """

    COMPLETED = "completed"
    ABANDONED = "abandoned"
    DEFERRED = "deferred"
    DEAD_LETTERED = "deadlettered"
    RELEASED = "released"


class ServiceBusMessageState(IntEnum):
    """Where a message stands, as ``peek_messages`` shows it."""

    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2


class ServiceBusSessionFilter(Enum):
    """Pass ``NEXT_AVAILABLE_SESSION`` as ``session_id`` to accept whichever session is free."""

    NEXT_AVAILABLE = 0


NEXT_AVAILABLE_SESSION = ServiceBusSessionFilter.NEXT_AVAILABLE


class EntityStatus(str, Enum):
    """An entity's status. Messages are kept in every status; operations the status forbids
    raise ``MessagingEntityDisabledError``.

    The first four are the ones an entity is given (a topic not ``RECEIVE_DISABLED``, a
    subscription not ``SEND_DISABLED``); the rest are the SDK's names of Service Bus's own
    passing states, which raybus entities are never in and which no one may set (an
    ``InvalidArgumentError``, as Service Bus refuses them).
    """

    ACTIVE = "Active"
    DISABLED = "Disabled"
    SEND_DISABLED = "SendDisabled"
    RECEIVE_DISABLED = "ReceiveDisabled"
    CREATING = "Creating"
    DELETING = "Deleting"
    RENAMING = "Renaming"
    RESTORING = "Restoring"
    UNKNOWN = "Unknown"

    @property
    def can_send(self) -> bool:
        return self in (EntityStatus.ACTIVE, EntityStatus.RECEIVE_DISABLED)

    @property
    def can_receive(self) -> bool:
        return self in (EntityStatus.ACTIVE, EntityStatus.SEND_DISABLED)


#: The statuses a queue may be given (the others of ``EntityStatus`` are Service Bus's own).
QUEUE_STATUSES = (
    EntityStatus.ACTIVE,
    EntityStatus.DISABLED,
    EntityStatus.SEND_DISABLED,
    EntityStatus.RECEIVE_DISABLED,
)


class MessagingSku(str, Enum):
    """A namespace's tier (``azure.servicebus.management`` names); a raybus namespace reads
    ``STANDARD``, the tier whose defaults it keeps (``NamespaceProperties``)."""

    BASIC = "Basic"
    STANDARD = "Standard"
    PREMIUM = "Premium"


class NamespaceType(str, Enum):
    """A namespace's kind (``azure.servicebus.management`` names); raybus's are
    ``MESSAGING``."""

    MESSAGING = "Messaging"
    NOTIFICATION_HUB = "NotificationHub"
    MIXED = "Mixed"
    EVENT_HUB = "EventHub"
    RELAY = "Relay"


class EntityAvailabilityStatus(str, Enum):
    """An entity's availability (``azure.servicebus.management`` names): a raybus entity that
    can be read is ``AVAILABLE``; the others are Service Bus's states of geo-recovery and
    throttling, which raybus has not."""

    AVAILABLE = "Available"
    LIMITED = "Limited"
    RENAMING = "Renaming"
    RESTORING = "Restoring"
    UNKNOWN = "Unknown"
