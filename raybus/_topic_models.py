"""Topic and subscription settings (``azure.servicebus.management`` names).

A subscription is stored like a queue: the registry keeps it as an entity at the path
``<topic>/Subscriptions/<name>`` with ``QueueProperties`` derived from the topic's and the
subscription's settings (``subscription_queue_properties``), so every queue feature
(peek-lock, dead-lettering, sessions, partitions, transactions) works on it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from ._models import (
    MAX_DURATION,
    Available,
    QueueProperties,
    _check_int,
    _duration,
    check_status,
    validate_entity_name,
)
from .auth import AuthorizationRule
from .enums import EntityStatus
from .exceptions import InvalidArgumentError

__all__ = [
    "SubscriptionProperties",
    "SubscriptionRuntimeProperties",
    "TopicProperties",
    "TopicRuntimeProperties",
    "is_subscription",
    "subscription_path",
    "subscription_queue_properties",
]

MAX_SUBSCRIPTIONS_PER_TOPIC = 2000


def subscription_path(topic: str, subscription: str) -> str:
    """The entity path of a subscription (Service Bus's form)."""
    return f"{topic}/Subscriptions/{subscription}"


def is_subscription(path: str) -> bool:
    """Whether ``path`` names a subscription (queue and topic names may not look like one)."""
    return "/subscriptions/" in path.lower()


def _check_bool(obj: Any, names: tuple[str, ...]) -> None:
    for flag in names:
        if not isinstance(getattr(obj, flag), bool):
            raise InvalidArgumentError(f"{flag} must be a bool", obj.name, flag)


_TOPIC_STATUSES = (EntityStatus.ACTIVE, EntityStatus.DISABLED, EntityStatus.SEND_DISABLED)
_SUBSCRIPTION_STATUSES = (EntityStatus.ACTIVE, EntityStatus.DISABLED, EntityStatus.RECEIVE_DISABLED)


@dataclass
class TopicProperties(Available):
    """A topic's settings. ``requires_duplicate_detection`` applies to every subscription's
    store: a repeated message is dropped by each, each rule's copy keyed on the rule and the
    published message's id (``raybus._core.slots.dedup_id``)."""

    name: str
    default_message_time_to_live: timedelta = MAX_DURATION
    max_size_in_megabytes: int = 1024
    requires_duplicate_detection: bool = False
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)
    max_message_size_in_kilobytes: int = 256
    status: EntityStatus = EntityStatus.ACTIVE
    auto_delete_on_idle: timedelta = MAX_DURATION
    support_ordering: bool = False
    enable_batched_operations: bool = True
    user_metadata: str | None = None
    # As a queue's (QueueProperties.authorization_rules).
    authorization_rules: list[AuthorizationRule] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        validate_entity_name(self.name, kind="topic")
        if "/subscriptions/" in self.name.lower():
            raise InvalidArgumentError(
                "a topic name may not contain '/Subscriptions/'", self.name, "name"
            )
        for name in (
            "default_message_time_to_live",
            "duplicate_detection_history_time_window",
            "auto_delete_on_idle",
        ):
            object.__setattr__(self, name, _duration(getattr(self, name), name))
        check_status(self, _TOPIC_STATUSES, "topic")
        _check_int(self, "max_size_in_megabytes", 1, 80 * 1024)
        _check_int(self, "max_message_size_in_kilobytes", 1, 102_400)
        _check_bool(
            self, ("requires_duplicate_detection", "support_ordering", "enable_batched_operations")
        )
        # The same ranges as a queue's (one validation of the durations).
        QueueProperties(
            "x",
            default_message_time_to_live=self.default_message_time_to_live,
            duplicate_detection_history_time_window=self.duplicate_detection_history_time_window,
            auto_delete_on_idle=self.auto_delete_on_idle,
        )

    @classmethod
    def option_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls) if f.name != "name")

    # The SDK's topic settings raybus takes and does not keep (``sdk_topic_options``): they
    # read as Service Bus's defaults.
    enable_partitioning = property(lambda self: False)
    enable_express = property(lambda self: False)
    filtering_messages_before_publishing = property(lambda self: False)

    @property
    def max_message_size(self) -> int:
        return self.max_message_size_in_kilobytes * 1024


@dataclass
class SubscriptionProperties(Available):
    """A subscription's settings."""

    topic_name: str
    name: str
    lock_duration: timedelta = timedelta(seconds=60)
    requires_session: bool = False
    default_message_time_to_live: timedelta = MAX_DURATION
    dead_lettering_on_message_expiration: bool = False
    dead_lettering_on_filter_evaluation_exceptions: bool = True
    max_delivery_count: int = 10
    status: EntityStatus = EntityStatus.ACTIVE
    enable_batched_operations: bool = True
    auto_delete_on_idle: timedelta = MAX_DURATION
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    user_metadata: str | None = None
    partition_count: int = 1

    def __post_init__(self) -> None:
        validate_entity_name(self.topic_name, kind="topic")
        validate_entity_name(self.name, max_length=50, kind="subscription")
        if "/" in self.name:
            raise InvalidArgumentError(
                f"subscription name {self.name!r} may not contain '/'", self.name, "name"
            )
        for name in ("lock_duration", "default_message_time_to_live", "auto_delete_on_idle"):
            object.__setattr__(self, name, _duration(getattr(self, name), name))
        check_status(self, _SUBSCRIPTION_STATUSES, "subscription")
        _check_bool(
            self,
            (
                "requires_session",
                "dead_lettering_on_message_expiration",
                "dead_lettering_on_filter_evaluation_exceptions",
                "enable_batched_operations",
            ),
        )
        for what in ("forward_to", "forward_dead_lettered_messages_to"):
            value = getattr(self, what)
            if value is not None:
                try:
                    validate_entity_name(value, kind=what)
                except InvalidArgumentError as exc:
                    raise InvalidArgumentError(exc.message, self.name, what) from None
        # Checks lock duration, delivery count and partition count with the queue's rules.
        QueueProperties(
            "x",
            lock_duration=self.lock_duration,
            max_delivery_count=self.max_delivery_count,
            default_message_time_to_live=self.default_message_time_to_live,
            auto_delete_on_idle=self.auto_delete_on_idle,
            partition_count=self.partition_count,
        )
        if self.forward_to is not None:  # as Service Bus sets it: forwarding is its use
            object.__setattr__(self, "auto_delete_on_idle", MAX_DURATION)

    @property
    def path(self) -> str:
        return subscription_path(self.topic_name, self.name)

    @classmethod
    def option_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls) if f.name not in ("name", "topic_name"))


def subscription_queue_properties(
    topic: TopicProperties, sub: SubscriptionProperties
) -> QueueProperties:
    """How a subscription's messages are stored: the topic's size limits, duplicate detection
    and TTL ceiling; the subscription's locks, delivery count, sessions and status."""
    ttl = min(topic.default_message_time_to_live, sub.default_message_time_to_live)
    # A disabled subscription keeps receiving copies (only its receivers are refused).
    status = (
        EntityStatus.ACTIVE
        if sub.status is EntityStatus.ACTIVE
        else (EntityStatus.RECEIVE_DISABLED)
    )
    return QueueProperties(
        subscription_path(topic.name, sub.name),
        lock_duration=sub.lock_duration,
        max_delivery_count=sub.max_delivery_count,
        default_message_time_to_live=ttl,
        dead_lettering_on_message_expiration=sub.dead_lettering_on_message_expiration,
        requires_duplicate_detection=topic.requires_duplicate_detection,
        duplicate_detection_history_time_window=topic.duplicate_detection_history_time_window,
        max_size_in_megabytes=topic.max_size_in_megabytes,
        max_message_size_in_kilobytes=topic.max_message_size_in_kilobytes,
        status=status,
        auto_delete_on_idle=sub.auto_delete_on_idle,
        requires_session=sub.requires_session,
        forward_to=sub.forward_to,
        forward_dead_lettered_messages_to=sub.forward_dead_lettered_messages_to,
        enable_batched_operations=sub.enable_batched_operations,
        user_metadata=sub.user_metadata,
        partition_count=sub.partition_count,
    )


@dataclass(frozen=True)
class TopicRuntimeProperties:
    """A topic's counters (``get_topic_runtime_properties``)."""

    name: str
    subscription_count: int = 0
    scheduled_message_count: int = 0
    size_in_bytes: int = 0
    created_at_utc: datetime | None = None
    updated_at_utc: datetime | None = None
    accessed_at_utc: datetime | None = None


@dataclass(frozen=True)
class SubscriptionRuntimeProperties:
    """A subscription's counters (``get_subscription_runtime_properties``)."""

    topic_name: str
    name: str
    active_message_count: int = 0
    dead_letter_message_count: int = 0
    transfer_message_count: int = 0
    transfer_dead_letter_message_count: int = 0
    total_message_count: int = 0
    created_at_utc: datetime | None = None
    updated_at_utc: datetime | None = None
    accessed_at_utc: datetime | None = None


# The SDK's topic options raybus takes and ignores (see ``sdk_topic_options``).
IGNORED_TOPIC_OPTIONS = (
    "enable_partitioning",
    "enable_express",
    "filtering_messages_before_publishing",
)


def sdk_topic_options(options: dict[str, Any], entity: str) -> dict[str, Any]:
    """``create_topic``/``update_topic`` options without the SDK's ``enable_partitioning``,
    ``enable_express`` and ``filtering_messages_before_publishing``, which raybus takes (a
    bool or None) and ignores: a topic's subscriptions are stored as raybus stores them (each
    subscription's partitions and durability are its own), and filters run on each message
    as it is published. They read back as Service Bus's defaults (False), as the HTTP
    gateway answers them."""
    if not any(name in options for name in IGNORED_TOPIC_OPTIONS):
        return options
    options = dict(options)
    for name in IGNORED_TOPIC_OPTIONS:
        value = options.pop(name, None)
        if value is not None and not isinstance(value, bool):
            raise InvalidArgumentError(f"{name} must be a bool", entity, name)
    return options
