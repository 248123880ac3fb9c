"""A sender or receiver made straight from a connection string, as the Azure SDK's samples make
them: ``ServiceBusSender._from_connection_string(conn_str=..., queue_name=...)`` and
``ServiceBusReceiver._from_connection_string(...)`` (``sample_code_servicebus.py``, sync and
asyncio). The methods are private in the SDK and raybus keeps them for code copied from those
samples; ``ServiceBusClient.from_connection_string(...).get_queue_sender(...)`` is the public
way and what these do.

The keyword arguments are split as the SDK's one constructor takes them: the handler's own
options (``client_identifier``, ``prefetch_count``, ...) go to ``get_*_sender`` /
``get_*_receiver``, the rest (``storage_path``, the retry options, ...) to the client. Without
an entity name the connection string's ``EntityPath`` is the queue (or, for a sender, the
topic), as in the SDK; a name that differs from it is refused, as the client refuses it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, TypeVar

from .auth import parse_connection_string
from .exceptions import InvalidArgumentError

__all__ = ["ReceiverFromConnectionString", "SenderFromConnectionString"]

H = TypeVar("H")

_SENDER_OPTIONS = frozenset({"client_identifier", "socket_timeout"})
_RECEIVER_OPTIONS = _SENDER_OPTIONS | {
    "session_id",
    "sub_queue",
    "receive_mode",
    "max_wait_time",
    "auto_lock_renewer",
    "prefetch_count",
}


class _ClientClass(Protocol):
    def from_connection_string(self, conn_str: str, **kwargs: Any) -> Any: ...


def _client(
    client_cls: _ClientClass, conn_str: str, kwargs: dict[str, Any], own: frozenset[str]
) -> tuple[Any, dict[str, Any]]:
    """The client, and the handler's options taken out of ``kwargs``."""
    options = {name: kwargs.pop(name) for name in own & kwargs.keys()}
    return client_cls.from_connection_string(conn_str, **kwargs), options


def _queue_name(conn_str: str, name: str | None, wanted: str) -> str:
    """``name``, else the connection string's ``EntityPath`` (read by the parser the clients
    use); ``InvalidArgumentError`` naming ``queue_name`` if there is neither."""
    if name is None:
        name = parse_connection_string(conn_str).entity_path
    if name is None:
        raise InvalidArgumentError(
            f"give {wanted} (the connection string has no EntityPath)", None, "queue_name"
        )
    return name


def _sender(
    client_cls: _ClientClass,
    conn_str: str,
    queue_name: str | None,
    topic_name: str | None,
    kwargs: dict[str, Any],
) -> Any:
    """A sender of ``client_cls``'s kind (sync or asyncio) for ``queue_name`` or
    ``topic_name`` (at most one), else for the connection string's ``EntityPath``."""
    if queue_name is not None and topic_name is not None:
        raise InvalidArgumentError(
            "give queue_name or topic_name, not both", queue_name, "topic_name"
        )
    client, options = _client(client_cls, conn_str, kwargs, _SENDER_OPTIONS)
    if topic_name is not None:
        return client.get_topic_sender(topic_name, **options)
    name = _queue_name(conn_str, queue_name, "queue_name or topic_name")
    return client.get_queue_sender(name, **options)


def _receiver(
    client_cls: _ClientClass,
    conn_str: str,
    queue_name: str | None,
    topic_name: str | None,
    subscription_name: str | None,
    kwargs: dict[str, Any],
) -> Any:
    """A receiver of ``client_cls``'s kind for ``queue_name``, or for ``topic_name`` and
    ``subscription_name``, else for the connection string's ``EntityPath`` (a queue)."""
    if queue_name is not None and (topic_name is not None or subscription_name is not None):
        raise InvalidArgumentError(
            "give queue_name, or topic_name and subscription_name, not both",
            queue_name,
            "topic_name" if topic_name is not None else "subscription_name",
        )
    if (topic_name is None) != (subscription_name is None):
        missing = "subscription_name" if subscription_name is None else "topic_name"
        raise InvalidArgumentError(
            "a subscription's receiver needs topic_name and subscription_name",
            topic_name,
            missing,
        )
    client, options = _client(client_cls, conn_str, kwargs, _RECEIVER_OPTIONS)
    if topic_name is not None:
        return client.get_subscription_receiver(topic_name, subscription_name, **options)
    name = _queue_name(conn_str, queue_name, "queue_name, or topic_name and subscription_name")
    return client.get_queue_receiver(name, **options)


def _client_class(sync: bool) -> _ClientClass:
    """The client that makes the handler: imported when asked for, as both client modules
    import this one."""
    if sync:
        from . import _sync_client

        return _sync_client.ServiceBusClient
    from .aio import _client

    return _client.ServiceBusClient


class SenderFromConnectionString:
    """``_from_connection_string`` of the sync and the asyncio ``ServiceBusSender`` (``_SYNC``
    says which client makes it)."""

    _SYNC: ClassVar[bool]

    @classmethod
    def _from_connection_string(
        cls: type[H],
        conn_str: str,
        *,
        queue_name: str | None = None,
        topic_name: str | None = None,
        **kwargs: Any,
    ) -> H:
        """A sender straight from a connection string, as the Azure SDK's samples make one
        (module docstring); ``kwargs`` are the sender's options and
        ``ServiceBusClient.from_connection_string``'s."""
        sync: bool = cls._SYNC  # type: ignore[attr-defined]
        sender: H = _sender(_client_class(sync), conn_str, queue_name, topic_name, kwargs)
        return sender


class ReceiverFromConnectionString:
    """``_from_connection_string`` of the sync and the asyncio ``ServiceBusReceiver``."""

    _SYNC: ClassVar[bool]

    @classmethod
    def _from_connection_string(
        cls: type[H],
        conn_str: str,
        *,
        queue_name: str | None = None,
        topic_name: str | None = None,
        subscription_name: str | None = None,
        **kwargs: Any,
    ) -> H:
        """A receiver straight from a connection string, as the Azure SDK's samples make one
        (module docstring); ``kwargs`` are the receiver's options and
        ``ServiceBusClient.from_connection_string``'s."""
        sync: bool = cls._SYNC  # type: ignore[attr-defined]
        receiver: H = _receiver(
            _client_class(sync), conn_str, queue_name, topic_name, subscription_name, kwargs
        )
        return receiver
