"""``ServiceBusRuleManager``: one subscription's rules, managed with its receivers' rights.

Service Bus has two ways to change a subscription's rules. The administration client (HTTP,
``ServiceBusAdministrationClient.create_rule``) needs Manage. A rule manager (the .NET
SDK's ``ServiceBusRuleManager``, Java's ``ServiceBusRuleManagerClient``; over AMQP the
``add-rule``, ``remove-rule`` and ``enumerate-rules`` operations of the subscription's
``$management`` node) needs only Listen on the subscription, so a consuming service can narrow
what reaches it without holding the namespace's keys. azure-servicebus for Python has no rule
manager; raybus offers one under the .NET type's name, with the administration client's
Python argument names. The AMQP gateway serves the three operations with it.

Both ways make the same change in the namespace actor (``TopicOps._add_rule`` /
``_remove_rule``): a rule's name is unique in its subscription (case-insensitive), a filter is
compiled when the rule is made (a bad SQL text raises ``FilterSyntaxError`` and stores
nothing), and the topic's router has the new rules before the call returns.
"""

from __future__ import annotations

from typing import Any

from .. import _rpc
from .._connection import Connection
from .._core.filters import RuleProperties, SqlRuleAction, TrueRuleFilter
from .._models import validate_entity_name
from .._topic_models import subscription_path
from ..exceptions import InvalidArgumentError
from ._paged import listing

__all__ = ["ServiceBusRuleManager"]


class ServiceBusRuleManager:
    """Adds, removes and lists the rules of one subscription with Listen rights.

    Get one from ``ServiceBusClient.get_rule_manager(topic_name, subscription_name)``. The
    calls go to the namespace actor, signed with the client's credential for the topic (as a
    subscription receiver's are).
    """

    def __init__(self, connection: Connection, topic_name: str, subscription_name: str) -> None:
        validate_entity_name(topic_name, kind="topic")
        validate_entity_name(subscription_name, max_length=50, kind="subscription")
        self._conn = connection
        self._topic = topic_name
        self._subscription = subscription_name
        self._closed = False

    @property
    def topic_name(self) -> str:
        return self._topic

    @property
    def subscription_name(self) -> str:
        return self._subscription

    @property
    def subscription_path(self) -> str:
        """``<topic>/Subscriptions/<subscription>`` (.NET's ``SubscriptionPath``)."""
        return subscription_path(self._topic, self._subscription)

    async def _call(self, method: str, *args: Any, read: bool = False) -> Any:
        if self._closed:
            raise InvalidArgumentError(
                "this rule manager is closed", self.subscription_path, "rule_manager"
            )
        registry = self._conn.registry_for(self._topic)
        return await _rpc.call(
            self.subscription_path,
            getattr(registry, method),
            self._topic,
            self._subscription,
            *args,
            retries=_rpc.READ_RETRIES if read else 0,  # a change may have applied
        )

    async def create_rule(
        self, rule_name: str, *, filter: Any = None, action: SqlRuleAction | None = None
    ) -> RuleProperties:
        """Add the rule ``rule_name`` (``filter`` defaults to a true filter); returns it.
        ``MessagingEntityAlreadyExistsError`` if the subscription has a rule of that name."""
        rule = RuleProperties(rule_name, filter if filter is not None else TrueRuleFilter(), action)
        return await self._call("add_rule", rule)  # type: ignore[no-any-return]

    async def delete_rule(self, rule_name: str) -> None:
        """Remove the rule ``rule_name`` (``MessagingEntityNotFoundError`` if there is none)."""
        if not isinstance(rule_name, str) or not rule_name:
            raise InvalidArgumentError(
                f"rule_name must be a non-empty str, not {rule_name!r}",
                self.subscription_path,
                "rule_name",
            )
        await self._call("remove_rule", rule_name)

    @listing
    async def list_rules(self) -> list[RuleProperties]:
        """The subscription's rules, in the order they were added (.NET's ``GetRulesAsync``)."""
        return await self._call("enumerate_rules", read=True)  # type: ignore[no-any-return]

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> ServiceBusRuleManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
