"""raybus: a message broker with Azure Service Bus semantics, built as a cluster of Ray actors.

Start with ``raybus.connect()`` (or ``ServiceBusClient(namespace)``) and
``raybus.management.ServiceBusAdministrationClient``; ``raybus.aio`` has the asyncio twins.

The public names load on first use (PEP 562). Every broker actor is a Ray worker process of
its own that imports ``raybus._actors...``, and so this package first: importing the client
API here too (sync and asyncio clients, processor, management) made each new queue,
subscription or partition import 0.34 s of modules instead of 0.20 s.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Public name -> the module (relative to this package) that defines it.
_HOMES = {
    "ProcessorContext": "._context",
    "ProcessorStatistics": "._core.pool",
    **dict.fromkeys(
        (
            "AutoLockRenewer",
            "ServiceBusClient",
            "ServiceBusProcessor",
            "ServiceBusReceiver",
            "ServiceBusSender",
            "ServiceBusSession",
            "ServiceBusTransaction",
            "connect",
        ),
        "._sync_client",
    ),
    "EntityInfo": ".aio",
    **dict.fromkeys(
        (
            "NEXT_AVAILABLE_SESSION",
            "EntityStatus",
            "ServiceBusDisposition",
            "ServiceBusMessageState",
            "ServiceBusReceiveMode",
            "ServiceBusSessionFilter",
            "ServiceBusSubQueue",
        ),
        ".enums",
    ),
    "ServiceBusAdministrationClient": ".management",
    **dict.fromkeys(
        ("ServiceBusMessage", "ServiceBusMessageBatch", "ServiceBusReceivedMessage"), ".message"
    ),
}

# The public subpackages, reached as attributes of ``raybus`` once anything imported them
# before; now on first use too.
_SUBMODULES = ("aio", "amqp", "auth", "cli", "enums", "exceptions", "http", "management")

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


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)  # sets the attribute itself
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'raybus' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES, *_SUBMODULES})
