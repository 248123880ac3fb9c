"""The asyncio API: the same classes as ``raybus``, with coroutine methods."""

from __future__ import annotations

from .._core.pool import ProcessorStatistics
from ._auto_lock_renewer import AutoLockRenewer
from ._client import ServiceBusClient
from ._context import ProcessorContext
from ._entity import EntityInfo
from ._management import ServiceBusAdministrationClient
from ._processor import ServiceBusProcessor
from ._receiver import ServiceBusReceiver
from ._rule_manager import ServiceBusRuleManager
from ._sender import ServiceBusSender
from ._session import ServiceBusSession
from ._transaction import ServiceBusTransaction

__all__ = [
    "AutoLockRenewer",
    "EntityInfo",
    "ProcessorContext",
    "ProcessorStatistics",
    "ServiceBusAdministrationClient",
    "ServiceBusClient",
    "ServiceBusProcessor",
    "ServiceBusReceiver",
    "ServiceBusRuleManager",
    "ServiceBusSender",
    "ServiceBusSession",
    "ServiceBusTransaction",
]
