"""``raybus.parse_connection_string``: azure-servicebus's top-level name for
``raybus.auth.connection_string_properties`` (``raybus.auth.parse_connection_string`` is the
clients' own reader, which gives a namespace and a credential)."""

from __future__ import annotations

from .auth import ServiceBusConnectionStringProperties
from .auth import connection_string_properties as parse_connection_string

__all__ = ["ServiceBusConnectionStringProperties", "parse_connection_string"]
