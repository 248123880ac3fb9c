"""Asyncio administration client (``azure.servicebus.aio.management`` names)."""

from __future__ import annotations

from ..._models import QueueProperties, QueueRuntimeProperties
from .._management import ServiceBusAdministrationClient

__all__ = ["QueueProperties", "QueueRuntimeProperties", "ServiceBusAdministrationClient"]
