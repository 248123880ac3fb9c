"""Administration: create, inspect, change and delete entities (``azure.servicebus.management``
names)."""

from __future__ import annotations

from .._core.filters import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from .._models import (
    MAX_DURATION,
    MessageCountDetails,
    NamespaceProperties,
    QueueProperties,
    QueueRuntimeProperties,
)
from .._sdk_options import ApiVersion
from .._topic_models import (
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
)
from ..auth import AccessRights, AuthorizationRule
from ..enums import EntityAvailabilityStatus, EntityStatus, MessagingSku, NamespaceType
from ._client import ServiceBusAdministrationClient

__all__ = [
    "MAX_DURATION",
    "AccessRights",
    "ApiVersion",
    "AuthorizationRule",
    "CorrelationRuleFilter",
    "EntityAvailabilityStatus",
    "EntityStatus",
    "FalseRuleFilter",
    "MessageCountDetails",
    "MessagingSku",
    "NamespaceProperties",
    "NamespaceType",
    "QueueProperties",
    "QueueRuntimeProperties",
    "RuleProperties",
    "ServiceBusAdministrationClient",
    "SqlRuleAction",
    "SqlRuleFilter",
    "SubscriptionProperties",
    "SubscriptionRuntimeProperties",
    "TopicProperties",
    "TopicRuntimeProperties",
    "TrueRuleFilter",
]
