"""Administration: create, inspect, change and delete entities (``azure.servicebus.management``
names)."""

from __future__ import annotations

from .._models import MAX_DURATION, QueueProperties, QueueRuntimeProperties
from ..enums import EntityStatus
from ._client import ServiceBusAdministrationClient

__all__ = [
    "MAX_DURATION",
    "EntityStatus",
    "QueueProperties",
    "QueueRuntimeProperties",
    "ServiceBusAdministrationClient",
]
