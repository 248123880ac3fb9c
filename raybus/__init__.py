"""raybus: a message broker with Azure Service Bus semantics, built as a cluster of Ray actors.

Start with ``raybus.connect()`` (or ``ServiceBusClient(namespace)``) and
``raybus.management.ServiceBusAdministrationClient``; ``raybus.aio`` has the asyncio twins.
"""

from __future__ import annotations

from ._context import ProcessorContext
from ._core.pool import ProcessorStatistics
from ._sync_client import (
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusProcessor,
    ServiceBusReceiver,
    ServiceBusSender,
    ServiceBusSession,
    ServiceBusTransaction,
    connect,
)
from .aio import EntityInfo
from .enums import (
    NEXT_AVAILABLE_SESSION,
    EntityStatus,
    ServiceBusDisposition,
    ServiceBusMessageState,
    ServiceBusReceiveMode,
    ServiceBusSessionFilter,
    ServiceBusSubQueue,
)
from .management import ServiceBusAdministrationClient
from .message import ServiceBusMessage, ServiceBusMessageBatch, ServiceBusReceivedMessage

__version__ = "0.1.0"

__all__ = [
    "NEXT_AVAILABLE_SESSION",
    "AutoLockRenewer",
    "EntityInfo",
    "EntityStatus",
    "ProcessorContext",
    "ProcessorStatistics",
    "ServiceBusAdministrationClient",
    "ServiceBusClient",
    "ServiceBusDisposition",
    "ServiceBusMessage",
    "ServiceBusMessageBatch",
    "ServiceBusMessageState",
    "ServiceBusProcessor",
    "ServiceBusReceiveMode",
    "ServiceBusReceivedMessage",
    "ServiceBusReceiver",
    "ServiceBusSender",
    "ServiceBusSession",
    "ServiceBusSessionFilter",
    "ServiceBusSubQueue",
    "ServiceBusTransaction",
    "connect",
]
