"""The azure-servicebus client options about its AMQP or HTTP transport: accepted, so code
written for the SDK runs unchanged, checked, and without effect.

A raybus client has no AMQP connection, socket or TLS session of its own: it calls the
broker's actors through Ray, or through a Unix socket on the same node (``raybus._lane``).
So ``transport_type``, ``http_proxy``, ``custom_endpoint_address``, ``connection_verify``,
``ssl_context``, ``uamqp_transport``, ``user_agent`` and ``logging_enable`` (the SDK's
network trace; raybus logs through the ``raybus`` loggers) have nothing to act on, and
``try_timeout`` (a bound on one attempt) is not applied: each operation's own ``timeout``
is. The administration client's ``api_version`` names a REST API version; raybus's registry
has one. README Deviations says so.

Each option is checked for its type, so a misspelt value is an ``InvalidArgumentError``
naming it; an option the SDK does not have is the ``TypeError`` Python raises for any
unexpected keyword argument.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from enum import Enum, IntEnum
from typing import Any

from .exceptions import InvalidArgumentError

__all__ = ["ApiVersion", "TransportType", "check_admin_options", "check_client_options"]


class TransportType(IntEnum):
    """azure-servicebus's ``TransportType`` (accepted as ``transport_type``; no effect)."""

    Amqp = 1
    AmqpOverWebsocket = 2


class ApiVersion(str, Enum):
    """The administration REST API versions of azure-servicebus (``api_version``; no
    effect: raybus's registry has one API)."""

    V2024_05 = "2024-05"
    V2021_05 = "2021-05"
    V2017_04 = "2017-04"


def _of(kind: type | tuple[type, ...], what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if isinstance(value, kind) else what

    return check


def _transport_type(value: Any) -> str | None:
    # raybus's own, azure-servicebus's (an enum of the same names), or its value
    name = getattr(value, "name", None)
    if name in TransportType.__members__ or (value in (1, 2) and not isinstance(value, bool)):
        return None
    return "a TransportType (Amqp or AmqpOverWebsocket)"


def _try_timeout(value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return None
    return "a positive number of seconds"


def _api_version(value: Any) -> str | None:
    versions = {v.value for v in ApiVersion}
    if getattr(value, "value", value) in versions:
        return None
    return f"one of {sorted(versions)}"


_CLIENT: Mapping[str, Callable[[Any], str | None]] = {
    "logging_enable": _of(bool, "True or False"),
    "transport_type": _transport_type,
    "http_proxy": _of(dict, "a dict (proxy_hostname, proxy_port, ...)"),
    "user_agent": _of(str, "a str"),
    "try_timeout": _try_timeout,
    "custom_endpoint_address": _of(str, "a str"),
    "connection_verify": _of(str, "a path (str)"),
    "ssl_context": _of((ssl.SSLContext, type(None)), "an ssl.SSLContext or None"),
    "uamqp_transport": _of(bool, "True or False"),
}

_ADMIN: Mapping[str, Callable[[Any], str | None]] = {
    "api_version": _api_version,
    "logging_enable": _of(bool, "True or False"),
    "user_agent": _of(str, "a str"),
    "proxies": _of(dict, "a dict (scheme to proxy URL)"),
    "connection_verify": _of((bool, str), "True, False or a path (str)"),
}


def _check(owner: str, options: Mapping[str, Any], known: Mapping[str, Any]) -> None:
    for name, value in options.items():
        check = known.get(name)
        if check is None:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
        wanted = check(value)
        if wanted is not None:
            raise InvalidArgumentError(
                f"{name} must be {wanted}, not {type(value).__name__} {value!r}", None, name
            )


def check_client_options(options: Mapping[str, Any]) -> None:
    """Check ``ServiceBusClient``'s transport options (see the module docstring)."""
    _check("ServiceBusClient", options, _CLIENT)


def check_admin_options(options: Mapping[str, Any]) -> None:
    """Check ``ServiceBusAdministrationClient``'s HTTP options (see the module docstring)."""
    _check("ServiceBusAdministrationClient", options, _ADMIN)
