"""The asyncio ``ServiceBusAdministrationClient``: create, inspect, change, delete queues."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from .. import _rpc
from .._clock import from_timestamp
from .._connection import Connection
from .._models import (
    NamespaceProperties,
    QueueProperties,
    QueueRuntimeProperties,
    given_options,
    sdk_queue_options,
    validate_entity_name,
)
from .._sdk_options import check_admin_options
from .._topic_models import is_subscription
from ..auth import (
    AccessRights,
    AuthorizationRule,
    CredentialLike,
    client_namespace,
    parse_connection_string,
)
from ..exceptions import InvalidArgumentError, MessagingEntityNotFoundError
from ._entity_rules import apply_rules, given_rules, with_all_rules, with_rules
from ._paged import listing
from ._topic_management import TopicManagement

__all__ = ["ServiceBusAdministrationClient"]


def _queue_runtime(route: Any, counts: list[Any]) -> QueueRuntimeProperties:
    """A queue's runtime properties from its route and its partitions' counts."""
    return QueueRuntimeProperties(
        name=route.properties.name,
        active_message_count=sum(c.active for c in counts),
        dead_letter_message_count=sum(c.dead_letter for c in counts),
        scheduled_message_count=sum(c.scheduled for c in counts),
        size_in_bytes=sum(c.size_in_bytes for c in counts),
        created_at_utc=from_timestamp(route.created_at),
        updated_at_utc=from_timestamp(route.updated_at),
        accessed_at_utc=from_timestamp(max(c.accessed_at for c in counts)),
        partition_count=len(route.pmap.live),
        partition_map_version=route.pmap.version,
    )


class ServiceBusAdministrationClient(TopicManagement):
    """Manages the entities of one namespace (see ``ServiceBusClient`` for the arguments).

    The SDK's HTTP options (``api_version``, ``logging_enable``, ``user_agent``, ``proxies``,
    ``connection_verify``) are accepted, checked, and have no effect
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
        **http_options: Any,
    ) -> None:
        check_admin_options(http_options)
        name = client_namespace(namespace, fully_qualified_namespace)
        self._conn = Connection(name, address, storage_path, credential)
        self.namespace = name

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusAdministrationClient:
        """An administration client for the namespace and key of a Service Bus connection
        string (``raybus.auth.parse_connection_string``; ``EntityPath`` is ignored, as by the
        SDK's); ``kwargs`` are the constructor's (``address``, ``storage_path``)."""
        info = parse_connection_string(conn_str, kwargs)
        return cls(info.namespace, credential=info.credential, **kwargs)

    async def _call(self, entity: str | None, method: str, *args: Any) -> Any:
        # Reads are retried across a registry restart; changes are not (they may have applied).
        reads = (
            "route",
            "list_queues",
            "counts",
            "queue_counts",
            "get_topic",
            "list_topics",
            "topic_counts",
            "topics_counts",
            "subscription_counts",
            "subscription_runtime",
            "get_subscription",
            "list_subscriptions",
            "list_rules",
            "namespace_created",
            "list_authorization_rules",
            "list_entity_rules",
        )
        retries = _rpc.READ_RETRIES if method in reads else 0
        return await _rpc.call(
            entity, getattr(self._conn.registry_for(entity), method), *args, retries=retries
        )

    async def create_queue(self, queue_name: str, **options: Any) -> QueueProperties:
        """Create a queue; ``options`` are ``QueueProperties`` fields (durations as
        ``timedelta``; the SDK's ``enable_partitioning`` too: ``sdk_queue_options``;
        ``authorization_rules``: ``QueueProperties.authorization_rules``). Raises
        ``MessagingEntityAlreadyExistsError`` if the name is taken."""
        options = sdk_queue_options(given_options(options, update=False), None, queue_name)
        rules = given_rules(options.pop("authorization_rules", None), queue_name)
        unknown = set(options) - QueueProperties.option_names()
        if unknown:
            raise InvalidArgumentError(
                f"unknown queue option(s): {', '.join(sorted(unknown))}",
                queue_name,
                sorted(unknown)[0],
            )
        props = QueueProperties(validate_entity_name(queue_name), **options)
        route = await self._call(queue_name, "create_queue", props)
        self._conn.forget(queue_name)
        return await apply_rules(self._call, route.properties, rules, created=True)

    async def get_queue(self, queue_name: str) -> QueueProperties:
        route = await self._call(queue_name, "route", validate_entity_name(queue_name))
        if not isinstance(route.properties, QueueProperties) or is_subscription(
            route.properties.name
        ):
            raise MessagingEntityNotFoundError(f"no queue named {queue_name!r}", queue_name)
        return await with_rules(self._call, route.properties)

    async def update_queue(self, queue: QueueProperties, **options: Any) -> QueueProperties:
        """Apply changed settings (``queue`` as returned by ``get_queue``, edited; ``options``
        override fields). Settings fixed at creation raise ``InvalidArgumentError``."""
        if not isinstance(queue, QueueProperties):
            raise InvalidArgumentError(
                "update_queue takes the QueueProperties that get_queue returned", None, "queue"
            )
        options = sdk_queue_options(given_options(options, update=True), queue, queue.name)
        rules = given_rules(
            options.pop("authorization_rules", queue.authorization_rules), queue.name
        )
        unknown = set(options) - QueueProperties.option_names()
        if unknown:
            raise InvalidArgumentError(
                f"unknown queue option(s): {', '.join(sorted(unknown))}",
                queue.name,
                sorted(unknown)[0],
            )
        props = dataclasses.replace(queue, **options)  # validates again
        route = await self._call(queue.name, "update_queue", props)
        self._conn.forget(queue.name)
        return await apply_rules(self._call, route.properties, rules, created=False)

    async def delete_queue(self, queue_name: str) -> None:
        """Delete a queue and every message in it."""
        await self._call(queue_name, "delete_queue", validate_entity_name(queue_name))
        self._conn.forget(queue_name)

    @listing
    async def list_queues(self) -> list[QueueProperties]:
        routes = await self._call(None, "list_queues")
        return await with_all_rules(self._call, [r.properties for r in routes])

    async def get_queue_runtime_properties(self, queue_name: str) -> QueueRuntimeProperties:
        route, counts = await self._call(queue_name, "counts", validate_entity_name(queue_name))
        return _queue_runtime(route, counts)

    async def wait_for_partitions(self, queue_name: str, *, timeout: float = 60.0) -> int:
        """Wait until a change of ``partition_count`` has completed (every slot moved, removed
        partitions drained and stopped) or ``timeout`` seconds passed; returns the number of
        live partitions. A raybus extension: senders and receivers need not wait for it."""
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise InvalidArgumentError("timeout must be a positive number", queue_name, "timeout")
        route = await _rpc.call(
            queue_name,
            self._conn.registry_for(queue_name).wait_partitions,
            validate_entity_name(queue_name),
            float(timeout),
            timeout=timeout + 10,
        )
        self._conn.forget(queue_name)
        return len(route.pmap.live)

    # ------------------------------------------------------------ access rules (raybus extension)

    async def create_authorization_rule(
        self,
        key_name: str,
        rights: Iterable[AccessRights | str],
        *,
        entity: str | None = None,
        primary_key: str | None = None,
        secondary_key: str | None = None,
    ) -> AuthorizationRule:
        """Add (or replace) a shared-access rule on the namespace or on ``entity`` (a queue or
        a topic, whose rules cover its subscriptions; as in Service Bus, a subscription path is
        refused with ``InvalidArgumentError``); keys are generated unless given. The namespace's
        first rule closes it: from then on every call needs a token (see ``raybus.auth``)."""
        return await self._call(  # type: ignore[no-any-return]
            entity,
            "create_authorization_rule",
            key_name,
            list(rights) if not isinstance(rights, str) else [rights],
            entity,
            primary_key,
            secondary_key,
        )

    async def list_authorization_rules(
        self, *, entity: str | None = None
    ) -> list[AuthorizationRule]:
        return await self._call(entity, "list_authorization_rules", entity)  # type: ignore[no-any-return]

    async def regenerate_authorization_key(
        self,
        key_name: str,
        *,
        entity: str | None = None,
        which: str = "primary",
        key: str | None = None,
    ) -> AuthorizationRule:
        """Replace the rule's primary or secondary key (the other one keeps working: rotate
        clients to it first)."""
        return await self._call(  # type: ignore[no-any-return]
            entity, "regenerate_authorization_key", key_name, entity, which, key
        )

    async def delete_authorization_rule(self, key_name: str, *, entity: str | None = None) -> None:
        await self._call(entity, "delete_authorization_rule", key_name, entity)

    async def get_namespace_properties(self) -> NamespaceProperties:
        """The namespace's name, type, tier and creation time (see ``NamespaceProperties``).
        Needs the Manage right, as ``list_queues`` does."""
        created = from_timestamp(await self._call(None, "namespace_created"))
        return NamespaceProperties(
            name=self.namespace, created_at_utc=created, modified_at_utc=created
        )

    @listing
    async def list_queues_runtime_properties(self) -> list[QueueRuntimeProperties]:
        """Every queue's counts, asked in one call to the registry (``queue_counts``); a queue
        deleted between the listing and its counts is left out."""
        routes = await self._call(None, "list_queues")  # no rules needed
        found = await self._call(None, "queue_counts", [r.properties.name for r in routes])
        return [_queue_runtime(*pair) for pair in found if pair is not None]

    async def close(self) -> None:
        """Nothing to release."""

    async def __aenter__(self) -> ServiceBusAdministrationClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
