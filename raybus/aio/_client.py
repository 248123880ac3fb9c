"""The asyncio ``ServiceBusClient``: the entry point for sending and receiving."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from .. import _rpc
from .._clock import to_timestamp
from .._connection import Connection
from .._models import validate_entity_name
from .._retry import RetryMode, RetryPolicy
from .._sdk_options import check_client_options
from .._topic_models import subscription_path
from ..auth import ConnectionString, CredentialLike, client_namespace, parse_connection_string
from ..enums import ServiceBusReceiveMode, ServiceBusSubQueue
from ..exceptions import InvalidArgumentError, OperationTimeoutError
from ._entity import EntityInfo, resolve_entity
from ._paged import listing
from ._processor import ErrorHandler, Handler, Seconds, ServiceBusProcessor
from ._receiver import ServiceBusReceiver, _check_wait
from ._rule_manager import ServiceBusRuleManager
from ._sender import ServiceBusSender
from ._transaction import ServiceBusTransaction

__all__ = ["ServiceBusClient"]


def _handler_options(client_identifier: Any, socket_timeout: Any, entity: str) -> str | None:
    """Check the SDK's per-handler options; return the ``client_identifier`` (None: the
    handler makes one, as the SDK's: ``SBSender-<uuid>``, ``SBReceiver-<uuid>``).

    ``socket_timeout`` is the SDK's timeout for its AMQP socket's reads and writes. A raybus
    client has no such socket (it calls the actors through Ray, or a Unix socket on the same
    node, whose broken connection is noticed at once): the option is checked, so a bad value
    fails as in the SDK, and has no effect (README, Deviations)."""
    if client_identifier is not None and (
        not isinstance(client_identifier, str) or not client_identifier.strip()
    ):
        raise InvalidArgumentError(
            f"client_identifier must be a non-empty str, not {client_identifier!r}",
            entity,
            "client_identifier",
        )
    _check_wait(socket_timeout, "socket_timeout", entity)
    return client_identifier


class ServiceBusClient:
    """Connects to a raybus namespace on a Ray cluster.

    ``namespace`` names the broker (entities of different namespaces are separate);
    ``address`` is the Ray cluster (default: ``RAYBUS_ADDRESS``/``RAY_ADDRESS``, else the local
    cluster already running, else an embedded one). ``storage_path`` (a local directory or a
    ``pyarrow.fs`` URI such as ``s3://bucket/raybus``; default ``RAYBUS_STORAGE_PATH`` or
    ``~/.raybus/storage``) is where the namespace keeps its messages and entities, so they
    survive actor, process and cluster restarts; ``"memory://"`` keeps it in memory only. It
    takes effect when the namespace's registry is first created. Construction joins Ray if this
    process has not yet (blocking, once).

    The SDK's own form works too: ``ServiceBusClient("orders.servicebus.windows.net",
    AzureNamedKeyCredential(name, key))`` (or ``fully_qualified_namespace=``) is the namespace
    ``orders`` (``raybus.auth.client_namespace``).

    ``retry_total``, ``retry_backoff_factor``, ``retry_backoff_max`` and ``retry_mode`` are
    azure-servicebus's retry options, with its defaults: how often, and after how long, a call
    that failed for a transient reason is repeated. Which failures raybus repeats (receives
    and peeks after a partition restart; sends only when nothing was stored, or when duplicate
    detection makes a repeat safe) is in ``raybus._retry``.

    The SDK's transport options (``logging_enable``, ``transport_type``, ``http_proxy``,
    ``user_agent``, ``try_timeout``, ``custom_endpoint_address``, ``connection_verify``,
    ``ssl_context``, ``uamqp_transport``) are accepted, checked, and have no effect
    (``raybus._sdk_options``).
    """

    def __init__(
        self,
        namespace: str | None = None,
        credential: CredentialLike | None = None,
        *,
        fully_qualified_namespace: str | None = None,
        address: str | None = None,
        storage_path: str | None = None,
        retry_total: int = 3,
        retry_backoff_factor: float = 0.8,
        retry_backoff_max: float = 120,
        retry_mode: RetryMode | str = RetryMode.EXPONENTIAL,
        **transport_options: Any,
    ) -> None:
        check_client_options(transport_options)
        retry = RetryPolicy.from_options(
            retry_total, retry_backoff_factor, retry_backoff_max, retry_mode
        )
        name = client_namespace(namespace, fully_qualified_namespace)
        self._conn = Connection(name, address, storage_path, credential, retry)
        self.namespace = name
        # The SDK's: the host name given (a connection string's endpoint host), else the name.
        self.fully_qualified_namespace: str = (
            fully_qualified_namespace if isinstance(fully_qualified_namespace, str) else name
        )
        self._entity_path: str | None = None  # a connection string's EntityPath

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusClient:
        """A client for the namespace and key of a Service Bus connection string
        (``raybus.auth.parse_connection_string``: the namespace is the endpoint's first host
        label); ``kwargs`` are the constructor's (``address``, ``storage_path``, the retry
        options). With ``EntityPath`` the client works on that entity only, as the SDK's."""
        info = parse_connection_string(conn_str, kwargs)
        client = cls(info.namespace, credential=info.credential, **kwargs)
        client._take_connection_string(info)
        return client

    def _take_connection_string(self, info: ConnectionString) -> None:
        """What a connection string says beyond the namespace and key: ``EntityPath`` and
        the endpoint's host (the SDK's ``fully_qualified_namespace``)."""
        self._entity_path = info.entity_path
        self.fully_qualified_namespace = info.host or info.namespace

    def _check_entity(self, name: str, kind: str) -> None:
        """Refuse an entity other than the connection string's ``EntityPath``, if it had one."""
        if self._entity_path is not None and name.lower() != self._entity_path.lower():
            raise InvalidArgumentError(
                f"the {kind} name {name!r} does not match the EntityPath "
                f"{self._entity_path!r} of the connection string this client was made from",
                name,
                f"{kind}_name",
            )

    def get_queue_sender(
        self,
        queue_name: str,
        *,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusSender:
        """A sender for ``queue_name`` (existence is checked on first use).
        ``client_identifier`` and ``socket_timeout``: see ``_handler_options``."""
        self._check_entity(validate_entity_name(queue_name), "queue")
        ident = _handler_options(client_identifier, socket_timeout, queue_name)
        return ServiceBusSender(
            self._conn, queue_name, ident, fully_qualified_namespace=self.fully_qualified_namespace
        )

    def get_queue_receiver(
        self,
        queue_name: str,
        *,
        session_id: Any = None,
        sub_queue: ServiceBusSubQueue | str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        auto_lock_renewer: Any = None,
        prefetch_count: int = 0,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusReceiver:
        """A receiver for ``queue_name`` or its ``sub_queue`` (DEAD_LETTER)."""
        self._check_entity(validate_entity_name(queue_name), "queue")
        return ServiceBusReceiver(
            self._conn,
            queue_name,
            client_identifier=_handler_options(client_identifier, socket_timeout, queue_name),
            receive_mode=receive_mode,
            sub_queue=sub_queue,
            max_wait_time=max_wait_time,
            prefetch_count=prefetch_count,
            session_id=session_id,
            auto_lock_renewer=auto_lock_renewer,
            fully_qualified_namespace=self.fully_qualified_namespace,
        )

    def get_topic_sender(
        self,
        topic_name: str,
        *,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusSender:
        """A sender for ``topic_name`` (existence is checked on first use)."""
        self._check_entity(validate_entity_name(topic_name, kind="topic"), "topic")
        ident = _handler_options(client_identifier, socket_timeout, topic_name)
        return ServiceBusSender(
            self._conn, topic_name, ident, fully_qualified_namespace=self.fully_qualified_namespace
        )

    def get_subscription_receiver(
        self,
        topic_name: str,
        subscription_name: str,
        *,
        session_id: Any = None,
        sub_queue: ServiceBusSubQueue | str | None = None,
        receive_mode: ServiceBusReceiveMode | str = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = None,
        auto_lock_renewer: Any = None,
        prefetch_count: int = 0,
        client_identifier: str | None = None,
        socket_timeout: float | None = None,
    ) -> ServiceBusReceiver:
        """A receiver for a subscription (or its ``sub_queue``); it works exactly as a
        queue receiver does."""
        validate_entity_name(topic_name, kind="topic")
        validate_entity_name(subscription_name, max_length=50, kind="subscription")
        self._check_entity(topic_name, "topic")
        path = subscription_path(topic_name, subscription_name)
        return ServiceBusReceiver(
            self._conn,
            path,
            client_identifier=_handler_options(client_identifier, socket_timeout, path),
            receive_mode=receive_mode,
            sub_queue=sub_queue,
            max_wait_time=max_wait_time,
            prefetch_count=prefetch_count,
            session_id=session_id,
            auto_lock_renewer=auto_lock_renewer,
            fully_qualified_namespace=self.fully_qualified_namespace,
        )

    def get_rule_manager(self, topic_name: str, subscription_name: str) -> ServiceBusRuleManager:
        """A manager of the subscription's rules that needs only Listen rights (.NET's
        ``ServiceBusClient.CreateRuleManager``; azure-servicebus for Python has none: its
        ``ServiceBusAdministrationClient.create_rule`` needs Manage)."""
        rules = ServiceBusRuleManager(self._conn, topic_name, subscription_name)
        self._check_entity(topic_name, "topic")
        return rules

    @listing
    async def list_subscription_sessions(
        self,
        topic_name: str,
        subscription_name: str,
        *,
        state_updated_after: datetime | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """Ids of the subscription's sessions that hold messages or state."""
        return await self.list_queue_sessions(
            subscription_path(topic_name, subscription_name),
            state_updated_after=state_updated_after,
            timeout=timeout,
        )

    async def resolve_entity(self, entity_path: str) -> EntityInfo:
        """The settings of a queue, topic or subscription (``<topic>/Subscriptions/<sub>``)
        that senders and receivers go by; ``MessagingEntityNotFoundError`` if it does not
        exist. Needs only the rights of using the entity (not Manage). A raybus extension
        (see ``raybus.aio.EntityInfo``)."""
        return await resolve_entity(self._conn, entity_path)

    def transaction(self) -> ServiceBusTransaction:
        """A new transaction (``async with client.transaction() as txn:``; see
        ``raybus.aio.ServiceBusTransaction``)."""
        return ServiceBusTransaction(self._conn)

    @listing
    async def list_queue_sessions(
        self,
        queue_name: str,
        *,
        state_updated_after: datetime | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """Ids of the queue's sessions that hold messages or state; with
        ``state_updated_after``, only those whose state was set after that time. Past
        ``timeout`` seconds, ``OperationTimeoutError``."""
        name = validate_entity_name(queue_name)
        seconds = _check_wait(timeout, "timeout", name)
        after = None
        if state_updated_after is not None:
            if not isinstance(state_updated_after, datetime):
                raise InvalidArgumentError(
                    "state_updated_after must be a datetime", name, "state_updated_after"
                )
            after = to_timestamp(state_updated_after)
        policy = self._conn.retry

        async def listed() -> list[list[str]]:
            route = await self._conn.route(name)
            found: list[list[str]] = await asyncio.gather(
                *(
                    _rpc.call(
                        name, h.list_sessions, after, retries=policy.total, backoff=policy.delay
                    )
                    for _pid, h in route.existing()
                )
            )
            return found

        try:
            found = await asyncio.wait_for(listed(), seconds)
        except asyncio.TimeoutError:
            raise OperationTimeoutError(
                f"listing the sessions did not finish within {seconds} s", name
            ) from None
        return sorted({sid for ids in found for sid in ids})

    def get_processor(
        self,
        queue_name: str | tuple[str, str],
        handler: Handler,
        *,
        max_concurrent_calls: int = 1,
        auto_complete: bool = True,
        prefetch_count: int = 0,
        max_auto_lock_renewal_duration: Seconds = 300.0,
        error_handler: ErrorHandler | None = None,
        session: bool | None = None,
        min_replicas: int = 1,
        max_replicas: int | None = None,
        target_backlog_per_replica: int = 100,
        scale_down_delay: Seconds = 5.0,
        actor_options: dict[str, Any] | None = None,
    ) -> ServiceBusProcessor:
        """A processor running ``handler`` on the messages of a queue, or of a subscription
        given as ``(topic_name, subscription_name)``, in a pool of Ray actors (not started:
        ``await processor.start()`` or ``async with``). See ``raybus.aio.ServiceBusProcessor``
        for the options."""
        if isinstance(queue_name, tuple) and queue_name and isinstance(queue_name[0], str):
            self._check_entity(queue_name[0], "topic")
        elif isinstance(queue_name, str):
            self._check_entity(queue_name, "queue")
        return ServiceBusProcessor(
            self._conn,
            queue_name,
            handler,
            max_concurrent_calls=max_concurrent_calls,
            auto_complete=auto_complete,
            prefetch_count=prefetch_count,
            max_auto_lock_renewal_duration=max_auto_lock_renewal_duration,
            error_handler=error_handler,
            session=session,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            target_backlog_per_replica=target_backlog_per_replica,
            scale_down_delay=scale_down_delay,
            actor_options=actor_options,
        )

    async def close(self) -> None:
        """Nothing to release: senders and receivers close themselves."""

    async def __aenter__(self) -> ServiceBusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
