"""The sync ``ServiceBusAdministrationClient`` (a facade over the asyncio one)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._core.filters import RuleProperties, SqlRuleAction
from .._models import NamespaceProperties, QueueProperties, QueueRuntimeProperties
from .._paged import ItemList
from .._sync import run
from .._topic_models import (
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
)
from ..aio._management import ServiceBusAdministrationClient as _AsyncAdmin
from ..auth import AccessRights, AuthorizationRule, CredentialLike, parse_connection_string

__all__ = ["ServiceBusAdministrationClient"]


class ServiceBusAdministrationClient:
    """Creates, inspects, changes and deletes entities of one namespace (see the asyncio
    ``raybus.aio.management.ServiceBusAdministrationClient`` for each method)."""

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
        self._aio = _AsyncAdmin(
            namespace,
            credential,
            fully_qualified_namespace=fully_qualified_namespace,
            address=address,
            storage_path=storage_path,
            **http_options,
        )
        self.namespace = self._aio.namespace

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusAdministrationClient:
        """See ``raybus.aio.management.ServiceBusAdministrationClient.from_connection_string``."""
        info = parse_connection_string(conn_str, kwargs)
        return cls(info.namespace, credential=info.credential, **kwargs)

    def create_queue(self, queue_name: str, **options: Any) -> QueueProperties:
        return run(self._aio.create_queue(queue_name, **options))

    def get_queue(self, queue_name: str) -> QueueProperties:
        return run(self._aio.get_queue(queue_name))

    def update_queue(self, queue: QueueProperties, **options: Any) -> QueueProperties:
        return run(self._aio.update_queue(queue, **options))

    def delete_queue(self, queue_name: str) -> None:
        run(self._aio.delete_queue(queue_name))

    def create_authorization_rule(
        self, key_name: str, rights: Iterable[AccessRights | str], **options: Any
    ) -> AuthorizationRule:
        """See ``raybus.aio.ServiceBusAdministrationClient.create_authorization_rule``."""
        return run(self._aio.create_authorization_rule(key_name, rights, **options))

    def list_authorization_rules(self, *, entity: str | None = None) -> list[AuthorizationRule]:
        return ItemList(run(self._aio.list_authorization_rules(entity=entity)))

    def regenerate_authorization_key(self, key_name: str, **options: Any) -> AuthorizationRule:
        return run(self._aio.regenerate_authorization_key(key_name, **options))

    def delete_authorization_rule(self, key_name: str, *, entity: str | None = None) -> None:
        run(self._aio.delete_authorization_rule(key_name, entity=entity))

    def list_queues(self) -> list[QueueProperties]:
        return ItemList(run(self._aio.list_queues()))

    def get_namespace_properties(self) -> NamespaceProperties:
        return run(self._aio.get_namespace_properties())

    def get_queue_runtime_properties(self, queue_name: str) -> QueueRuntimeProperties:
        return run(self._aio.get_queue_runtime_properties(queue_name))

    def wait_for_partitions(self, queue_name: str, *, timeout: float = 60.0) -> int:
        return run(self._aio.wait_for_partitions(queue_name, timeout=timeout))

    def list_queues_runtime_properties(self) -> list[QueueRuntimeProperties]:
        return ItemList(run(self._aio.list_queues_runtime_properties()))

    def create_topic(self, topic_name: str, **options: Any) -> TopicProperties:
        return run(self._aio.create_topic(topic_name, **options))

    def get_topic(self, topic_name: str) -> TopicProperties:
        return run(self._aio.get_topic(topic_name))

    def list_topics(self) -> list[TopicProperties]:
        return ItemList(run(self._aio.list_topics()))

    def update_topic(self, topic: TopicProperties, **options: Any) -> TopicProperties:
        return run(self._aio.update_topic(topic, **options))

    def delete_topic(self, topic_name: str) -> None:
        run(self._aio.delete_topic(topic_name))

    def get_topic_runtime_properties(self, topic_name: str) -> TopicRuntimeProperties:
        return run(self._aio.get_topic_runtime_properties(topic_name))

    def create_subscription(
        self,
        topic_name: str,
        subscription_name: str,
        *,
        default_rule: RuleProperties | None = None,
        **options: Any,
    ) -> SubscriptionProperties:
        return run(
            self._aio.create_subscription(
                topic_name, subscription_name, default_rule=default_rule, **options
            )
        )

    def get_subscription(self, topic_name: str, subscription_name: str) -> SubscriptionProperties:
        return run(self._aio.get_subscription(topic_name, subscription_name))

    def list_subscriptions(self, topic_name: str) -> list[SubscriptionProperties]:
        return ItemList(run(self._aio.list_subscriptions(topic_name)))

    def update_subscription(
        self, topic_name: str, subscription: SubscriptionProperties, **options: Any
    ) -> SubscriptionProperties:
        return run(self._aio.update_subscription(topic_name, subscription, **options))

    def delete_subscription(self, topic_name: str, subscription_name: str) -> None:
        run(self._aio.delete_subscription(topic_name, subscription_name))

    def get_subscription_runtime_properties(
        self, topic_name: str, subscription_name: str
    ) -> SubscriptionRuntimeProperties:
        return run(self._aio.get_subscription_runtime_properties(topic_name, subscription_name))

    def create_rule(
        self,
        topic_name: str,
        subscription_name: str,
        rule_name: str,
        *,
        filter: Any = None,
        action: SqlRuleAction | None = None,
    ) -> RuleProperties:
        return run(
            self._aio.create_rule(
                topic_name, subscription_name, rule_name, filter=filter, action=action
            )
        )

    def get_rule(self, topic_name: str, subscription_name: str, rule_name: str) -> RuleProperties:
        return run(self._aio.get_rule(topic_name, subscription_name, rule_name))

    def list_rules(self, topic_name: str, subscription_name: str) -> list[RuleProperties]:
        return ItemList(run(self._aio.list_rules(topic_name, subscription_name)))

    def delete_rule(self, topic_name: str, subscription_name: str, rule_name: str) -> None:
        run(self._aio.delete_rule(topic_name, subscription_name, rule_name))

    def update_rule(
        self, topic_name: str, subscription_name: str, rule: RuleProperties, **changes: Any
    ) -> RuleProperties:
        return run(self._aio.update_rule(topic_name, subscription_name, rule, **changes))

    def list_topics_runtime_properties(self) -> list[TopicRuntimeProperties]:
        return ItemList(run(self._aio.list_topics_runtime_properties()))

    def list_subscriptions_runtime_properties(
        self, topic_name: str
    ) -> list[SubscriptionRuntimeProperties]:
        return ItemList(run(self._aio.list_subscriptions_runtime_properties(topic_name)))

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> ServiceBusAdministrationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
