"""An AMQP 1.0 gateway, so the official ``azure-servicebus`` SDK works against raybus unmodified.

``start_gateway(namespace, host, port)`` (or ``raybus gateway --port 5672``) listens on
127.0.0.1 and translates AMQP links and ``$management`` requests into ``raybus.aio`` client
calls; it holds no messages itself. Point the SDK at it with
``Endpoint=sb://localhost:<port>;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;``.
See ``docs/AMQP.md`` for what is supported and how messages are mapped.

``AmqpAnnotatedMessage`` (and its header, properties and body type), as in
``azure.servicebus.amqp``: a message as AMQP sections, for the native clients
(``raybus.amqp._annotated``).
"""

from __future__ import annotations

from ._annotated import (
    AmqpAnnotatedMessage,
    AmqpMessageBodyType,
    AmqpMessageHeader,
    AmqpMessageProperties,
)
from ._codec import DecodeError, EncodeError
from ._gateway import Gateway, GatewayHandle, start_gateway

__all__ = [
    "AmqpAnnotatedMessage",
    "AmqpMessageBodyType",
    "AmqpMessageHeader",
    "AmqpMessageProperties",
    "DecodeError",
    "EncodeError",
    "Gateway",
    "GatewayHandle",
    "start_gateway",
]
