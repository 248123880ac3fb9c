"""Service Bus descriptions (``QueueDescription`` ...) to and from raybus's entity models.

Reading: a request's description becomes the keyword options of raybus's admin client. Only
the elements a client may set are read; read-only ones (counts, times, ``SizeInBytes``) are
ignored, because the Azure SDK's ``update_*`` sends back everything ``get_*`` returned.

Fields raybus does not have are answered with Service Bus's default and otherwise ignored
(``SupportOrdering``, ``FilteringMessagesBeforePublishing``, a topic's ``EnablePartitioning``,
``EnableExpress`` and ``EnableSubscriptionPartitioning``, ``EntityAvailabilityStatus``),
except ``IsAnonymousAccessible=true``, refused with a 400: silently ignoring it would leave a
caller believing an entity is open when it is not (or the reverse). ``AuthorizationRules``
are raybus's entity-level access rules (``raybus.auth``): the list in a request is the
entity's whole set (``authorization_rules``), keys omitted are kept (or generated for a new
rule); their times are the namespace's.

A queue's ``EnablePartitioning=true`` creates ``PARTITIONED_QUEUE_PARTITIONS`` partitions
(raybus's ``partition_count`` may later be changed through raybus's own client); it reads
back as ``partition_count > 1``. ``ForwardTo`` arrives as ``sb://host/name`` (the SDK makes
every name a URL) and is stored as the bare name; it is written back as ``sb://host/name``,
as Service Bus does.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from .._core.filters import RuleFilter  # the union of the filter classes (a type only)
from .._models import (  # shared with the admin client
    CLEARABLE_OPTIONS,
    PARTITIONED_QUEUE_PARTITIONS,
)
from ..auth import AccessRights, AuthorizationRule, normalise_rights
from ..enums import EntityStatus
from ..exceptions import InvalidArgumentError
from ..management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    QueueProperties,
    QueueRuntimeProperties,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
    TrueRuleFilter,
)
from ._atom_xml import (
    SB_NS,
    XSI_NS,
    child,
    children,
    decode_key_values,
    el,
    elements,
    encode_key_values,
    format_bool,
    format_datetime,
    format_duration,
    local_name,
    parse_bool,
    parse_duration,
    parse_int,
    xsi_type,
)

__all__ = [
    "PARTITIONED_QUEUE_PARTITIONS",
    "WantedRule",
    "authorization_rules",
    "entity_options",
    "queue_description",
    "rule_description",
    "rule_from_description",
    "subscription_description",
    "topic_description",
]


SQL_COMPATIBILITY_LEVEL = "20"
_COUNTS_NS = "http://schemas.microsoft.com/netservices/2011/06/servicebus"


def _status(element: ET.Element) -> EntityStatus:
    value = (element.text or "").strip()
    for status in EntityStatus:
        if status.value.lower() == value.lower():
            return status
    raise InvalidArgumentError(
        f"Status must be one of {', '.join(s.value for s in EntityStatus)}, not {value!r}",
        None,
        "Status",
    )


def _entity_ref(element: ET.Element) -> str | None:
    value = (element.text or "").strip()
    if "://" in value:
        value = urlsplit(value).path.strip("/")
    return value or None


def _metadata(element: ET.Element) -> str | None:
    return element.text


@dataclass(frozen=True)
class _Field:
    xml: str
    option: str
    parse: Callable[[ET.Element], Any]


def _fields(*specs: tuple[str, str, Callable[[ET.Element], Any]]) -> tuple[_Field, ...]:
    return tuple(_Field(*spec) for spec in specs)


_COMMON = _fields(
    ("DefaultMessageTimeToLive", "default_message_time_to_live", parse_duration),
    ("AutoDeleteOnIdle", "auto_delete_on_idle", parse_duration),
    ("EnableBatchedOperations", "enable_batched_operations", parse_bool),
    ("Status", "status", _status),
    ("UserMetadata", "user_metadata", _metadata),
)
_RECEIVABLE = _fields(
    ("LockDuration", "lock_duration", parse_duration),
    ("RequiresSession", "requires_session", parse_bool),
    ("DeadLetteringOnMessageExpiration", "dead_lettering_on_message_expiration", parse_bool),
    ("MaxDeliveryCount", "max_delivery_count", parse_int),
    ("ForwardTo", "forward_to", _entity_ref),
    ("ForwardDeadLetteredMessagesTo", "forward_dead_lettered_messages_to", _entity_ref),
)
_SIZED = _fields(
    ("MaxSizeInMegabytes", "max_size_in_megabytes", parse_int),
    ("RequiresDuplicateDetection", "requires_duplicate_detection", parse_bool),
    (
        "DuplicateDetectionHistoryTimeWindow",
        "duplicate_detection_history_time_window",
        parse_duration,
    ),
    ("MaxMessageSizeInKilobytes", "max_message_size_in_kilobytes", parse_int),
)
_FIELDS: dict[str, tuple[_Field, ...]] = {
    "QueueDescription": (
        *_COMMON,
        *_RECEIVABLE,
        *_SIZED,
        *_fields(("EnableExpress", "enable_express", parse_bool)),
    ),
    "TopicDescription": (
        *_COMMON,
        *_SIZED,
        *_fields(("SupportOrdering", "support_ordering", parse_bool)),
    ),
    "SubscriptionDescription": (
        *_COMMON,
        *_RECEIVABLE,
        *_fields(
            (
                "DeadLetteringOnFilterEvaluationExceptions",
                "dead_lettering_on_filter_evaluation_exceptions",
                parse_bool,
            )
        ),
    ),
}


def entity_options(description: ET.Element, current: Any = None) -> dict[str, Any]:
    """The raybus options a ``Queue``/``Topic``/``SubscriptionDescription`` sets.

    ``current`` is the entity's properties for an update (None for a create): then
    ``EnablePartitioning`` may only repeat what the queue already is, as in Service Bus, and
    the forwarding targets and user metadata the description leaves out are cleared (an
    update replaces the description; other settings left out keep their values).
    """
    kind = local_name(description)
    specs = _FIELDS.get(kind)
    if specs is None:
        raise InvalidArgumentError(f"unexpected description element {kind!r}", None, "body")
    given = children(description)
    anonymous = given.get("IsAnonymousAccessible")
    if anonymous is not None and parse_bool(anonymous):
        raise InvalidArgumentError(
            "IsAnonymousAccessible=true is not supported", None, "IsAnonymousAccessible"
        )
    options = {f.option: f.parse(given[f.xml]) for f in specs if f.xml in given}
    if current is not None:
        # An update replaces the description, as in Service Bus: a setting that may be unset
        # and is left out is unset (the SDK leaves out what is None, so this is how its
        # update_queue(props) with props.forward_to = None stops the forwarding).
        for f in specs:
            if f.option in CLEARABLE_OPTIONS and f.xml not in given:
                options[f.option] = None
    partitioned = given.get("EnablePartitioning")
    if kind == "QueueDescription" and partitioned is not None:
        wanted = parse_bool(partitioned)
        if current is None:
            if wanted:
                options["partition_count"] = PARTITIONED_QUEUE_PARTITIONS
        elif wanted != (current.partition_count > 1):
            raise InvalidArgumentError(
                "EnablePartitioning is fixed when the queue is created",
                current.name,
                "EnablePartitioning",
            )
    return options


# ------------------------------------------------------------------ access rules


@dataclass(frozen=True)
class WantedRule:
    """An entity's access rule as a request describes it (keys None: keep or generate)."""

    key_name: str
    rights: frozenset[AccessRights]
    primary_key: str | None
    secondary_key: str | None


def authorization_rules(description: ET.Element) -> list[WantedRule] | None:
    """The ``AuthorizationRules`` of a description, checked (None when the element is
    absent: the entity's rules are then left as they are)."""
    element = child(description, "AuthorizationRules")
    if element is None:
        return None
    wanted: dict[str, WantedRule] = {}
    for item in element:
        fields = children(item)
        name_el = fields.get("KeyName")
        name = (name_el.text or "").strip() if name_el is not None else ""
        if local_name(item) != "AuthorizationRule" or not name:
            raise InvalidArgumentError(
                "each entry of AuthorizationRules must be an AuthorizationRule with a KeyName",
                None,
                "AuthorizationRules",
            )
        if name in wanted:
            raise InvalidArgumentError(
                f"AuthorizationRules names {name!r} twice", None, "AuthorizationRules"
            )
        rights_el = fields.get("Rights")
        rights = normalise_rights([] if rights_el is None else [r.text or "" for r in rights_el])
        keys = [fields.get(k) for k in ("PrimaryKey", "SecondaryKey")]
        primary, secondary = ((k.text or None) if k is not None else None for k in keys)
        wanted[name] = WantedRule(name, rights, primary, secondary)
    return list(wanted.values())


_RIGHTS_ORDER = (AccessRights.LISTEN, AccessRights.SEND, AccessRights.MANAGE)


def _rules_element(rules: Sequence[AuthorizationRule]) -> str:
    return el(
        "AuthorizationRules",
        *(
            el(
                "AuthorizationRule",
                el("ClaimType", text="SharedAccessKey"),
                el("ClaimValue", text="None"),
                el(
                    "Rights",
                    *(el("AccessRights", text=r.value) for r in _RIGHTS_ORDER if r in rule.rights),
                ),
                *(
                    el(tag, text=format_datetime(when))
                    for tag, when in (
                        ("CreatedTime", rule.created_at_utc),
                        ("ModifiedTime", rule.modified_at_utc),
                    )
                    if when is not None
                ),
                el("KeyName", text=rule.key_name),
                el("PrimaryKey", text=rule.primary_key),
                el("SecondaryKey", text=rule.secondary_key),
                attrs={"i:type": "SharedAccessAuthorizationRule"},
            )
            for rule in rules
        ),
    )


# ------------------------------------------------------------------ rules


def _sql_parts(element: ET.Element, kind: str) -> tuple[str, dict[str, Any] | None]:
    fields = children(element)
    expression = fields.get("SqlExpression")
    if expression is None:
        raise InvalidArgumentError(f"a {kind} needs a SqlExpression", None, "SqlExpression")
    return expression.text or "", decode_key_values(fields.get("Parameters"))


_CORRELATION = (
    ("CorrelationId", "correlation_id"),
    ("MessageId", "message_id"),
    ("To", "to"),
    ("ReplyTo", "reply_to"),
    ("Label", "label"),
    ("SessionId", "session_id"),
    ("ReplyToSessionId", "reply_to_session_id"),
    ("ContentType", "content_type"),
)


def _filter_from(element: ET.Element | None) -> RuleFilter:
    if element is None:
        return TrueRuleFilter()
    kind = xsi_type(element)
    if kind == "TrueFilter":
        return TrueRuleFilter()
    if kind == "FalseFilter":
        return FalseRuleFilter()
    if kind == "SqlFilter":
        text, parameters = _sql_parts(element, kind)
        return SqlRuleFilter(text, parameters)
    if kind == "CorrelationFilter":
        fields = children(element)
        values = {attr: fields[xml].text or "" for xml, attr in _CORRELATION if xml in fields}
        return CorrelationRuleFilter(
            **values, properties=decode_key_values(fields.get("Properties"))
        )
    raise InvalidArgumentError(
        f"unsupported filter type {kind!r} (expected SqlFilter, CorrelationFilter, TrueFilter "
        "or FalseFilter)",
        None,
        "Filter",
    )


def _action_from(element: ET.Element | None) -> SqlRuleAction | None:
    kind = None if element is None else xsi_type(element)
    if element is None or kind == "EmptyRuleAction":
        return None
    if kind == "SqlRuleAction":
        text, parameters = _sql_parts(element, kind)
        return SqlRuleAction(text, parameters)
    raise InvalidArgumentError(
        f"unsupported action type {kind!r} (expected SqlRuleAction or EmptyRuleAction)",
        None,
        "Action",
    )


def rule_from_description(description: ET.Element, name: str | None = None) -> RuleProperties:
    """A ``RuleDescription`` as raybus's ``RuleProperties`` (compiled: bad SQL raises
    ``FilterSyntaxError``). ``name`` (from the URL) wins over the body's ``Name``."""
    if local_name(description) != "RuleDescription":
        raise InvalidArgumentError(
            f"expected a RuleDescription, not {local_name(description)!r}", None, "body"
        )
    fields = children(description)
    if name is None:
        name_el = fields.get("Name")
        name = (name_el.text or "") if name_el is not None else "$Default"
    return RuleProperties(
        name, _filter_from(fields.get("Filter")), _action_from(fields.get("Action"))
    )


def _sql_element(tag: str, kind: str, text: str, parameters: dict[str, Any] | None) -> str:
    parts = [
        el("SqlExpression", text=text),
        el("CompatibilityLevel", text=SQL_COMPATIBILITY_LEVEL),
    ]
    if parameters:
        parts.append(encode_key_values("Parameters", parameters))
    parts.append(el("RequiresPreprocessing", text="false"))
    return el(tag, *parts, attrs={"i:type": kind})


def _filter_element(rule_filter: RuleFilter) -> str:
    if isinstance(rule_filter, TrueRuleFilter):
        return _sql_element("Filter", "TrueFilter", rule_filter.sql_expression, None)
    if isinstance(rule_filter, FalseRuleFilter):
        return _sql_element("Filter", "FalseFilter", rule_filter.sql_expression, None)
    if isinstance(rule_filter, SqlRuleFilter):
        return _sql_element(
            "Filter", "SqlFilter", rule_filter.sql_expression, rule_filter.parameters
        )
    parts = elements((xml, getattr(rule_filter, attr)) for xml, attr in _CORRELATION)
    if rule_filter.properties:
        parts += encode_key_values("Properties", rule_filter.properties)
    return el("Filter", parts, attrs={"i:type": "CorrelationFilter"})


def _root(tag: str, *content: str) -> str:
    return el(tag, *content, attrs={"xmlns": SB_NS, "xmlns:i": XSI_NS})


def rule_description(rule: RuleProperties) -> str:
    action = (
        _sql_element("Action", "SqlRuleAction", rule.action.sql_expression, rule.action.parameters)
        if rule.action is not None
        else el("Action", attrs={"i:type": "EmptyRuleAction"})
    )
    created = (
        el("CreatedAt", text=format_datetime(rule.created_at_utc)) if rule.created_at_utc else ""
    )
    return _root(
        "RuleDescription", _filter_element(rule.filter), action, created, el("Name", text=rule.name)
    )


# ------------------------------------------------------------------ entities


def _counts(active: int, dead: int, scheduled: int, transfer: int, transfer_dead: int) -> str:
    prefixed = (
        ("ActiveMessageCount", active),
        ("DeadLetterMessageCount", dead),
        ("ScheduledMessageCount", scheduled),
        ("TransferMessageCount", transfer),
        ("TransferDeadLetterMessageCount", transfer_dead),
    )
    return el(
        "CountDetails",
        *(el(f"d2p1:{name}", text=str(value)) for name, value in prefixed),
        attrs={"xmlns:d2p1": _COUNTS_NS},
    )


def _times(runtime: Any) -> str:
    return elements(
        (name, format_datetime(value) if isinstance(value, datetime) else None)
        for name, value in (
            ("CreatedAt", runtime.created_at_utc),
            ("UpdatedAt", runtime.updated_at_utc),
            ("AccessedAt", runtime.accessed_at_utc),
        )
    )


def _ref(name: str | None, host: str) -> str | None:
    return None if name is None else f"sb://{host}/{name}"


def _common(props: Any) -> list[tuple[str, str | None]]:
    return [
        ("DefaultMessageTimeToLive", format_duration(props.default_message_time_to_live)),
        ("EnableBatchedOperations", format_bool(props.enable_batched_operations)),
        ("Status", EntityStatus(props.status).value),
        ("AutoDeleteOnIdle", format_duration(props.auto_delete_on_idle)),
        ("EntityAvailabilityStatus", "Available"),
        ("UserMetadata", props.user_metadata),
    ]


def _sized(props: Any) -> list[tuple[str, str | None]]:
    return [
        ("MaxSizeInMegabytes", str(props.max_size_in_megabytes)),
        ("RequiresDuplicateDetection", format_bool(props.requires_duplicate_detection)),
        (
            "DuplicateDetectionHistoryTimeWindow",
            format_duration(props.duplicate_detection_history_time_window),
        ),
        ("MaxMessageSizeInKilobytes", str(props.max_message_size_in_kilobytes)),
        ("IsAnonymousAccessible", "false"),
    ]


def _receivable(props: Any, host: str) -> list[tuple[str, str | None]]:
    return [
        ("LockDuration", format_duration(props.lock_duration)),
        ("RequiresSession", format_bool(props.requires_session)),
        (
            "DeadLetteringOnMessageExpiration",
            format_bool(props.dead_lettering_on_message_expiration),
        ),
        ("MaxDeliveryCount", str(props.max_delivery_count)),
        ("ForwardTo", _ref(props.forward_to, host)),
        ("ForwardDeadLetteredMessagesTo", _ref(props.forward_dead_lettered_messages_to, host)),
    ]


def queue_description(
    props: QueueProperties,
    runtime: QueueRuntimeProperties,
    host: str,
    rules: Sequence[AuthorizationRule] = (),
) -> str:
    """A ``QueueDescription`` with the settings, access rules and counters of one moment."""
    return _root(
        "QueueDescription",
        elements(_receivable(props, host) + _sized(props) + _common(props)),
        elements(
            [
                ("SizeInBytes", str(runtime.size_in_bytes)),
                ("MessageCount", str(runtime.total_message_count)),
                ("SupportOrdering", "true"),
                ("EnablePartitioning", format_bool(props.partition_count > 1)),
                ("EnableExpress", format_bool(props.enable_express)),
            ]
        ),
        _rules_element(rules),
        _times(runtime),
        _counts(
            runtime.active_message_count,
            runtime.dead_letter_message_count,
            runtime.scheduled_message_count,
            runtime.transfer_message_count,
            runtime.transfer_dead_letter_message_count,
        ),
    )


def topic_description(
    props: TopicProperties, runtime: TopicRuntimeProperties, rules: Sequence[AuthorizationRule] = ()
) -> str:
    return _root(
        "TopicDescription",
        elements(_sized(props) + _common(props)),
        elements(
            [
                ("SizeInBytes", str(runtime.size_in_bytes)),
                ("SubscriptionCount", str(runtime.subscription_count)),
                ("SupportOrdering", format_bool(props.support_ordering)),
                ("FilteringMessagesBeforePublishing", "false"),
                ("EnablePartitioning", "false"),
                ("EnableSubscriptionPartitioning", "false"),
                ("EnableExpress", "false"),
            ]
        ),
        _rules_element(rules),
        _times(runtime),
        _counts(0, 0, runtime.scheduled_message_count, 0, 0),
    )


def subscription_description(
    props: SubscriptionProperties, runtime: SubscriptionRuntimeProperties, host: str
) -> str:
    return _root(
        "SubscriptionDescription",
        elements(_receivable(props, host) + _common(props)),
        elements(
            [
                (
                    "DeadLetteringOnFilterEvaluationExceptions",
                    format_bool(props.dead_lettering_on_filter_evaluation_exceptions),
                ),
                ("MessageCount", str(runtime.total_message_count)),
            ]
        ),
        _times(runtime),
        _counts(
            runtime.active_message_count,
            runtime.dead_letter_message_count,
            runtime.total_message_count
            - runtime.active_message_count
            - runtime.dead_letter_message_count,
            runtime.transfer_message_count,
            runtime.transfer_dead_letter_message_count,
        ),
    )


def default_rule(description: ET.Element) -> RuleProperties | None:
    """A ``SubscriptionDescription``'s ``DefaultRuleDescription`` (None when absent)."""
    element = child(description, "DefaultRuleDescription")
    if element is None:
        return None
    # It carries the RuleDescription's fields directly (the element is renamed).
    renamed = ET.Element("RuleDescription")
    renamed.extend(list(element))
    return rule_from_description(renamed)
