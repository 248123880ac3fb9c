"""Topic, subscription and rule administration (a mixin of the asyncio admin client)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .._clock import from_timestamp
from .._core.filters import RuleProperties, SqlRuleAction, TrueRuleFilter
from .._models import given_options, validate_entity_name
from .._topic_models import (
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
    sdk_topic_options,
    subscription_path,
)
from ..exceptions import InvalidArgumentError, MessagingEntityNotFoundError
from ._entity_rules import apply_rules, given_rules, with_all_rules, with_rules
from ._paged import listing

if TYPE_CHECKING:
    from .._connection import Connection

__all__ = ["TopicManagement"]


def _check_options(options: dict[str, Any], allowed: frozenset[str], entity: str) -> None:
    unknown = set(options) - allowed
    if unknown:
        raise InvalidArgumentError(
            f"unknown option(s): {', '.join(sorted(unknown))}", entity, sorted(unknown)[0]
        )


class TopicManagement:
    """Topic, subscription and rule methods of ``ServiceBusAdministrationClient``."""

    if TYPE_CHECKING:
        _conn: Connection

        async def _call(self, entity: str | None, method: str, *args: Any) -> Any: ...

    # ------------------------------------------------------------------ topics

    async def create_topic(self, topic_name: str, **options: Any) -> TopicProperties:
        """Create a topic; ``options`` are ``TopicProperties`` fields (and the SDK's options
        raybus ignores: ``sdk_topic_options``)."""
        options = sdk_topic_options(given_options(options, update=False), topic_name)
        rules = given_rules(options.pop("authorization_rules", None), topic_name)
        _check_options(options, TopicProperties.option_names(), topic_name)
        props = TopicProperties(validate_entity_name(topic_name, kind="topic"), **options)
        entry, _router = await self._call(topic_name, "create_topic", props)
        self._conn.forget(topic_name)
        return await apply_rules(self._call, entry.properties, rules, created=True)

    async def get_topic(self, topic_name: str) -> TopicProperties:
        entry, _router = await self._call(topic_name, "get_topic", topic_name)
        return await with_rules(self._call, entry.properties)

    @listing
    async def list_topics(self) -> list[TopicProperties]:
        entries = await self._call(None, "list_topics")
        return await with_all_rules(self._call, [e.properties for e in entries])

    async def update_topic(self, topic: TopicProperties, **options: Any) -> TopicProperties:
        if not isinstance(topic, TopicProperties):
            raise InvalidArgumentError(
                "update_topic takes the TopicProperties that get_topic returned", None, "topic"
            )
        options = sdk_topic_options(given_options(options, update=True), topic.name)
        rules = given_rules(
            options.pop("authorization_rules", topic.authorization_rules), topic.name
        )
        _check_options(options, TopicProperties.option_names(), topic.name)
        entry, _router = await self._call(
            topic.name, "update_topic", dataclasses.replace(topic, **options)
        )
        self._conn.forget(topic.name)
        return await apply_rules(self._call, entry.properties, rules, created=False)

    async def delete_topic(self, topic_name: str) -> None:
        """Delete a topic, its subscriptions and every message in them."""
        await self._call(topic_name, "delete_topic", topic_name)
        self._conn.forget(topic_name)

    async def get_topic_runtime_properties(self, topic_name: str) -> TopicRuntimeProperties:
        return _topic_runtime(*await self._call(topic_name, "topic_counts", topic_name))

    # ------------------------------------------------------------------ subscriptions

    async def create_subscription(
        self,
        topic_name: str,
        subscription_name: str,
        *,
        default_rule: RuleProperties | None = None,
        **options: Any,
    ) -> SubscriptionProperties:
        """Create a subscription; ``options`` are ``SubscriptionProperties`` fields. It gets
        the rule ``$Default`` (a true filter) unless ``default_rule`` replaces it."""
        options = given_options(options, update=False)
        _check_options(options, SubscriptionProperties.option_names(), subscription_name)
        if default_rule is not None and not isinstance(default_rule, RuleProperties):
            raise InvalidArgumentError(
                "default_rule must be a RuleProperties", subscription_name, "default_rule"
            )
        sub = SubscriptionProperties(topic_name, subscription_name, **options)
        props, _route = await self._call(topic_name, "create_subscription", sub, default_rule)
        return dataclasses.replace(props)  # type: ignore[no-any-return]

    async def get_subscription(
        self, topic_name: str, subscription_name: str
    ) -> SubscriptionProperties:
        props, _route = await self._call(
            topic_name, "get_subscription", topic_name, subscription_name
        )
        return dataclasses.replace(props)  # type: ignore[no-any-return]

    @listing
    async def list_subscriptions(self, topic_name: str) -> list[SubscriptionProperties]:
        found = await self._call(topic_name, "list_subscriptions", topic_name)
        return [dataclasses.replace(props) for props, _route in found]

    async def update_subscription(
        self, topic_name: str, subscription: SubscriptionProperties, **options: Any
    ) -> SubscriptionProperties:
        if not isinstance(subscription, SubscriptionProperties):
            raise InvalidArgumentError(
                "update_subscription takes the SubscriptionProperties that get_subscription "
                "returned",
                topic_name,
                "subscription",
            )
        options = given_options(options, update=True)
        _check_options(options, SubscriptionProperties.option_names(), subscription.name)
        sub = dataclasses.replace(subscription, topic_name=topic_name, **options)
        props, _route = await self._call(topic_name, "update_subscription", sub)
        self._conn.forget(sub.path)
        return dataclasses.replace(props)  # type: ignore[no-any-return]

    async def delete_subscription(self, topic_name: str, subscription_name: str) -> None:
        await self._call(topic_name, "delete_subscription", topic_name, subscription_name)
        self._conn.forget(subscription_path(topic_name, subscription_name))

    async def get_subscription_runtime_properties(
        self, topic_name: str, subscription_name: str
    ) -> SubscriptionRuntimeProperties:
        """The subscription's counts and times, in one call to the registry
        (``subscription_runtime``: its settings and counts, checked for Manage as
        ``get_subscription`` is)."""
        sub, route, counts = await self._call(
            topic_name, "subscription_runtime", topic_name, subscription_name
        )
        return _subscription_runtime(sub, route, counts)

    # ------------------------------------------------------------------ rules

    async def create_rule(
        self,
        topic_name: str,
        subscription_name: str,
        rule_name: str,
        *,
        filter: Any = None,
        action: SqlRuleAction | None = None,
    ) -> RuleProperties:
        """Add a rule (``filter`` defaults to a true filter). Filters are compiled now: a bad
        SQL filter raises ``FilterSyntaxError`` naming the position."""
        rule = RuleProperties(rule_name, filter if filter is not None else TrueRuleFilter(), action)
        return await self._call(  # type: ignore[no-any-return]
            topic_name, "create_rule", topic_name, subscription_name, rule
        )

    async def get_rule(
        self, topic_name: str, subscription_name: str, rule_name: str
    ) -> RuleProperties:
        for rule in await self.list_rules(topic_name, subscription_name):
            if rule.name.lower() == rule_name.lower():
                return rule
        raise MessagingEntityNotFoundError(
            f"subscription {subscription_name!r} has no rule named {rule_name!r}",
            subscription_path(topic_name, subscription_name),
        )

    async def update_rule(
        self,
        topic_name: str,
        subscription_name: str,
        rule: RuleProperties,
        **changes: Any,
    ) -> RuleProperties:
        """Give the rule named ``rule.name`` the filter and action of ``rule``, with
        ``changes`` (``filter=``, ``action=``) applied, in one step (publishes meanwhile meet
        the old rule or the new one); returns the rule as stored (the SDK's returns None).
        Assign ``rule.filter`` / ``rule.action`` first (as in the SDK), or pass them here."""
        if not isinstance(rule, RuleProperties):
            raise InvalidArgumentError(
                "update_rule takes the RuleProperties that get_rule returned", None, "rule"
            )
        _check_options(changes, frozenset({"filter", "action"}), rule.name)
        updated = dataclasses.replace(rule, **changes)  # checked as a new rule is
        return await self._call(  # type: ignore[no-any-return]
            topic_name, "update_rule", topic_name, subscription_name, updated
        )

    @listing
    async def list_topics_runtime_properties(self) -> list[TopicRuntimeProperties]:
        """Every topic's counts, asked in one call to the registry (``topics_counts``); a
        topic deleted since the listing is left out."""
        entries = await self._call(None, "list_topics")  # no rules needed
        found = await self._call(None, "topics_counts", [e.properties.name for e in entries])
        return [_topic_runtime(*answer) for answer in found if answer is not None]

    @listing
    async def list_subscriptions_runtime_properties(
        self, topic_name: str
    ) -> list[SubscriptionRuntimeProperties]:
        """Every subscription's counts, asked in one call to the registry
        (``subscription_counts``); a subscription deleted since the listing is left out."""
        subs = await self.list_subscriptions(topic_name)
        found = await self._call(
            topic_name, "subscription_counts", topic_name, [s.name for s in subs]
        )
        return [
            _subscription_runtime(sub, *answer)
            for sub, answer in zip(subs, found, strict=True)
            if answer is not None
        ]

    @listing
    async def list_rules(self, topic_name: str, subscription_name: str) -> list[RuleProperties]:
        return await self._call(  # type: ignore[no-any-return]
            topic_name, "list_rules", topic_name, subscription_name
        )

    async def delete_rule(self, topic_name: str, subscription_name: str, rule_name: str) -> None:
        await self._call(topic_name, "delete_rule", topic_name, subscription_name, rule_name)


def _topic_runtime(
    entry: Any, subscriptions: int, counts: list[Any], held: tuple[int, int]
) -> TopicRuntimeProperties:
    """A topic's runtime properties from its registry answer (``topic_counts``)."""
    accessed = max((c.accessed_at for c in counts), default=entry.created_at)
    held_count, held_bytes = held
    return TopicRuntimeProperties(
        name=entry.properties.name,
        subscription_count=subscriptions,
        # held by the router (scheduled outside a transaction) and in the subscriptions
        # (scheduled inside one)
        scheduled_message_count=held_count + sum(c.scheduled for c in counts),
        size_in_bytes=held_bytes + sum(c.size_in_bytes for c in counts),
        created_at_utc=from_timestamp(entry.created_at),
        updated_at_utc=from_timestamp(entry.updated_at),
        accessed_at_utc=from_timestamp(accessed),
    )


def _subscription_runtime(
    sub: SubscriptionProperties, route: Any, counts: list[Any]
) -> SubscriptionRuntimeProperties:
    """A subscription's runtime properties from its registry answer (``counts``)."""
    active = sum(c.active for c in counts)
    dead = sum(c.dead_letter for c in counts)
    return SubscriptionRuntimeProperties(
        topic_name=sub.topic_name,
        name=sub.name,
        active_message_count=active,
        dead_letter_message_count=dead,
        total_message_count=active + dead + sum(c.scheduled for c in counts),
        created_at_utc=from_timestamp(route.created_at),
        updated_at_utc=from_timestamp(route.updated_at),
        accessed_at_utc=from_timestamp(max(c.accessed_at for c in counts)),
    )
