"""The asyncio API: the same classes as ``raybus``, with coroutine methods."""

from __future__ import annotations

from ._auto_lock_renewer import AutoLockRenewer
from ._client import ServiceBusClient
from ._management import ServiceBusAdministrationClient
from ._receiver import ServiceBusReceiver
from ._sender import ServiceBusSender
from ._session import ServiceBusSession
from ._transaction import ServiceBusTransaction

__all__ = [
    "AutoLockRenewer",
    "ServiceBusAdministrationClient",
    "ServiceBusClient",
    "ServiceBusReceiver",
    "ServiceBusSender",
    "ServiceBusSession",
    "ServiceBusTransaction",
]
