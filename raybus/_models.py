"""Entity properties and runtime counters, with Service Bus field names and defaults.

``QueueProperties`` is a validated snapshot: the namespace registry stores it, pushes it to the
partition actors, and hands copies to clients. It is deliberately *not* frozen, unlike raybus's
other snapshots: Azure SDK users change a queue by setting fields on the object ``get_queue``
returned and passing it to ``update_queue``, which validates it again.

Deviations from Service Bus, each because raybus keeps messages in actor memory and is also
used for tests with short real durations:

* ``lock_duration`` may be as short as 100 ms (Service Bus: 5 s);
* ``max_size_in_megabytes`` may be anything from 1 MB (Service Bus: 1,024-5,120 MB);
* ``max_message_size_in_kilobytes`` defaults to 256 KiB (Service Bus Standard) and may be raised
  to 102,400 KiB (Premium's AMQP limit) on any queue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from .auth import AuthorizationRule
from .enums import QUEUE_STATUSES, EntityAvailabilityStatus, EntityStatus
from .exceptions import InvalidArgumentError

__all__ = [
    "MAX_DURATION",
    "NamespaceProperties",
    "QueueProperties",
    "QueueRuntimeProperties",
    "validate_entity_name",
]

# How long an express entity may hold acknowledged changes before writing them (seconds).
EXPRESS_FLUSH_INTERVAL = 1.0

# .NET TimeSpan.MaxValue, which Service Bus uses for "never".
MAX_DURATION = timedelta(days=10675199, seconds=10085, microseconds=477581)

_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._\-/]*[A-Za-z0-9])?$")
_RESERVED_SUFFIXES = ("$deadletterqueue", "$transfer", "$management")


def validate_entity_name(name: Any, *, max_length: int = 260, kind: str = "queue") -> str:
    """Check a queue/topic name as Service Bus does; return it unchanged.

    Letters, digits, ``.``, ``-``, ``_`` and ``/``; starts and ends with a letter or digit; no
    empty path segment; at most ``max_length`` characters. Names are case-insensitive.
    """
    if not isinstance(name, str):
        raise InvalidArgumentError(
            f"{kind} name must be a str, not {type(name).__name__}", None, "name"
        )
    if not name or len(name) > max_length:
        raise InvalidArgumentError(
            f"{kind} name {name!r} must have 1 to {max_length} characters", name, "name"
        )
    if not _NAME_RE.match(name) or "//" in name:
        raise InvalidArgumentError(
            f"{kind} name {name!r} may contain only letters, digits, '.', '-', '_' and '/', "
            "and must start and end with a letter or digit",
            name,
            "name",
        )
    if name.lower().endswith(_RESERVED_SUFFIXES):
        raise InvalidArgumentError(f"{kind} name {name!r} uses a reserved suffix", name, "name")
    return name


# Settings an update unsets when given None: the SDK leaves what is None out of the entity's
# description, which an update replaces (``update_queue(props)`` with ``props.forward_to =
# None`` stops forwarding).
CLEARABLE_OPTIONS = frozenset(("forward_to", "forward_dead_lettered_messages_to", "user_metadata"))


def given_options(options: dict[str, Any], *, update: bool) -> dict[str, Any]:
    """The admin client's keyword options as raybus applies them: None is the SDK's "not
    given" (the service's default at a create, the current value at an update), except that
    an update's None unsets a setting that may be unset (``CLEARABLE_OPTIONS``)."""
    return {
        name: value
        for name, value in options.items()
        if value is not None or (update and name in CLEARABLE_OPTIONS)
    }


def _bad_duration(message: str, what: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, None, what)


_DURATION = re.compile(
    r"(?P<sign>-)?P(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?"
)


def duration_from_text(value: str, what: str) -> timedelta:
    """An ISO 8601 duration (``P1DT2H``, ``PT0.5S``). Years and months have no fixed length
    (Service Bus rejects them too) and are refused; anything at or beyond .NET's
    ``TimeSpan.MaxValue`` is ``MAX_DURATION`` ("never")."""
    match = _DURATION.fullmatch(value.strip())
    parts = match.groupdict() if match else {}
    if (
        not match
        or value.strip().endswith("T")
        or not any(v for k, v in parts.items() if k != "sign")
    ):
        raise _bad_duration(
            f"{what} must be an ISO 8601 duration such as PT1M, not {value!r}", what
        )
    try:
        seconds = (
            Decimal(parts["weeks"] or 0) * 604800
            + Decimal(parts["days"] or 0) * 86400
            + Decimal(parts["hours"] or 0) * 3600
            + Decimal(parts["minutes"] or 0) * 60
            + Decimal(parts["seconds"] or 0)
        )
    except InvalidOperation:
        raise _bad_duration(f"{what}: {value!r} is not a duration", what) from None
    if parts["sign"]:
        seconds = -seconds
    if seconds >= Decimal(str(MAX_DURATION.total_seconds())) - Decimal("0.000001"):
        return MAX_DURATION
    micros = int((seconds * 1_000_000).to_integral_value())
    try:
        return timedelta(microseconds=micros)
    except OverflowError:  # only a huge negative duration gets here
        raise _bad_duration(f"{what}: {value!r} is out of range", what) from None


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise InvalidArgumentError(
        f"{what} must be a timedelta (or seconds), not {type(value).__name__}", None, what
    )


def _duration(value: Any, what: str) -> timedelta:
    """A setting's duration: a ``timedelta``, seconds, or an ISO 8601 text (``"PT1M"``), as
    the SDK's admin models take it."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, str):
        return duration_from_text(value, what)
    return timedelta(seconds=_seconds(value, what))


def check_status(obj: Any, allowed: tuple[EntityStatus, ...], kind: str) -> None:
    """Check the status against those the entity kind can have: as in Service Bus, a queue is
    Active, Disabled, SendDisabled or ReceiveDisabled, a topic not ReceiveDisabled (no one
    receives from it), a subscription not SendDisabled (no one sends to it); Service Bus's
    own states (Creating, Renaming, ...) are set by no one."""
    try:
        status = EntityStatus(obj.status)
    except ValueError:
        status = None
    if status not in allowed:
        raise InvalidArgumentError(
            f"status {getattr(obj.status, 'value', obj.status)!r} is not one a {kind} can have: "
            f"{', '.join(s.value for s in allowed)}",
            obj.name,
            "status",
        )
    object.__setattr__(obj, "status", status)


class SdkDict:
    """The dict protocol of the SDK's administration models (its ``DictMixin``): a model's
    fields by name, ``props["lock_duration"]``, ``props.get(...)``, ``keys()``, ``items()``,
    ``update(...)``, for code written for ``azure.servicebus.management``. A name that is not
    a field is a ``KeyError`` (the SDK's models store anything given); setting goes through
    the attribute, so a frozen model refuses it."""

    __slots__ = ()
    #: Names read as fields besides the dataclass's own (properties the SDK's models have).
    _sdk_keys: tuple[str, ...] = ()

    def keys(self) -> list[str]:
        return [f.name for f in fields(self)] + list(self._sdk_keys)  # type: ignore[arg-type]

    def values(self) -> list[Any]:
        return [getattr(self, k) for k in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.keys()]

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self.keys() else default

    def has_key(self, key: str) -> bool:
        return key in self.keys()

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __len__(self) -> int:
        return len(self.keys())

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self.keys():
            raise KeyError(key)
        setattr(self, key, value)

    def __delitem__(self, key: str) -> None:
        self[key] = None  # as the SDK's: the field is unset

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


class Available(SdkDict):
    """The SDK's ``availability_status`` of an entity's settings: always ``AVAILABLE`` (as
    the HTTP gateway reports; the others are Service Bus's geo-recovery and throttling)."""

    __slots__ = ()
    _sdk_keys = ("availability_status",)

    @property
    def availability_status(self) -> EntityAvailabilityStatus:
        return EntityAvailabilityStatus.AVAILABLE


@dataclass
class QueueProperties(Available):
    """A queue's settings (``azure.servicebus.management.QueueProperties`` names).

    Durations are ``timedelta`` (numbers are read as seconds); ``MAX_DURATION`` means never.
    ``requires_session``, ``requires_duplicate_detection`` and ``enable_express`` are fixed at
    creation. ``partition_count`` (1 to ``MAX_PARTITIONS``) may change at run time (a raybus
    extension: Service Bus fixes it at creation); with ``max_partitions`` set, raybus changes
    it by itself between ``min_partitions`` and ``max_partitions`` to keep about
    ``target_backlog_per_partition`` active messages per partition. ``enable_express``
    acknowledges sends and settlements before they are written and writes them within
    ``EXPRESS_FLUSH_INTERVAL`` (1 s): a crash loses at most that window (Service Bus express
    entities make the same trade).
    """

    name: str
    lock_duration: timedelta = timedelta(seconds=60)
    max_delivery_count: int = 10
    default_message_time_to_live: timedelta = MAX_DURATION
    dead_lettering_on_message_expiration: bool = False
    requires_duplicate_detection: bool = False
    duplicate_detection_history_time_window: timedelta = timedelta(minutes=10)
    max_size_in_megabytes: int = 1024
    max_message_size_in_kilobytes: int = 256
    status: EntityStatus = EntityStatus.ACTIVE
    auto_delete_on_idle: timedelta = MAX_DURATION
    requires_session: bool = False
    enable_batched_operations: bool = True
    enable_express: bool = False
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    user_metadata: str | None = None
    partition_count: int = 1
    min_partitions: int = 1
    max_partitions: int | None = None
    target_backlog_per_partition: int = 10_000
    # The SDK's: the queue's own shared-access rules (raybus.auth). The administration client
    # fills it (get_*, list_*, create_* and update_* return the entity's rules, keys included,
    # as the SDK's do) and applies it: a list given to create_*, or held by the properties
    # passed to update_*, becomes the entity's whole set of rules (Service Bus replaces them
    # with the entity's description; a rule whose name, rights and keys are unchanged is kept
    # as it is); None leaves them. The namespace keeps rules in its access table, never with
    # the settings, so senders and receivers, which are given the settings, never see keys.
    authorization_rules: list[AuthorizationRule] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        validate_entity_name(self.name)
        for name in (
            "lock_duration",
            "default_message_time_to_live",
            "duplicate_detection_history_time_window",
            "auto_delete_on_idle",
        ):
            object.__setattr__(self, name, _duration(getattr(self, name), name))
        check_status(self, QUEUE_STATUSES, "queue")
        lock = self.lock_duration.total_seconds()
        if not 0.1 <= lock <= 300:
            raise InvalidArgumentError(
                f"lock_duration must be between 100 ms and 5 minutes, not {lock} s",
                self.name,
                "lock_duration",
            )
        _check_int(self, "max_delivery_count", 1, 2**31 - 1)
        _check_int(self, "max_size_in_megabytes", 1, 80 * 1024)
        _check_int(self, "max_message_size_in_kilobytes", 1, 102_400)
        _check_int(self, "partition_count", 1, MAX_PARTITIONS)
        _check_int(self, "min_partitions", 1, MAX_PARTITIONS)
        _check_int(self, "target_backlog_per_partition", 1, 2**31 - 1)
        if self.max_partitions is not None:
            _check_int(self, "max_partitions", self.min_partitions, MAX_PARTITIONS)
        if self.default_message_time_to_live.total_seconds() <= 0:
            raise InvalidArgumentError(
                "default_message_time_to_live must be positive",
                self.name,
                "default_message_time_to_live",
            )
        window = self.duplicate_detection_history_time_window.total_seconds()
        if not 20 <= window <= 7 * 86400:
            raise InvalidArgumentError(
                f"duplicate_detection_history_time_window must be between 20 s and 7 days, "
                f"not {window} s",
                self.name,
                "duplicate_detection_history_time_window",
            )
        if self.auto_delete_on_idle.total_seconds() < 300:
            raise InvalidArgumentError(
                "auto_delete_on_idle must be at least 5 minutes",
                self.name,
                "auto_delete_on_idle",
            )
        for what in ("forward_to", "forward_dead_lettered_messages_to"):
            value = getattr(self, what)
            if value is not None:
                try:
                    validate_entity_name(value, kind=what)
                except InvalidArgumentError as exc:
                    raise InvalidArgumentError(exc.message, self.name, what) from None
        if self.forward_to is not None:
            # Service Bus sets a forwarding entity's auto_delete_on_idle to the maximum: the
            # forwarding is its use, and it is never deleted for idleness.
            object.__setattr__(self, "auto_delete_on_idle", MAX_DURATION)
        for flag in (
            "dead_lettering_on_message_expiration",
            "requires_duplicate_detection",
            "requires_session",
            "enable_batched_operations",
            "enable_express",
        ):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidArgumentError(f"{flag} must be a bool", self.name, flag)

    # Seconds, for the broker core.
    @property
    def lock_duration_s(self) -> float:
        return self.lock_duration.total_seconds()

    @property
    def default_ttl_s(self) -> float:
        ttl = self.default_message_time_to_live
        return float("inf") if ttl >= MAX_DURATION else ttl.total_seconds()

    @property
    def dedup_window_s(self) -> float:
        return self.duplicate_detection_history_time_window.total_seconds()

    @property
    def auto_delete_on_idle_s(self) -> float:
        idle = self.auto_delete_on_idle
        return float("inf") if idle >= MAX_DURATION else idle.total_seconds()

    @property
    def max_message_size(self) -> int:
        return self.max_message_size_in_kilobytes * 1024

    @property
    def max_size(self) -> int:
        return self.max_size_in_megabytes * 1024 * 1024

    @property
    def enable_partitioning(self) -> bool:
        """The SDK's name: whether the queue has (or may scale to) more than one partition."""
        return self.partition_count > 1 or self.max_partitions is not None

    @classmethod
    def option_names(cls) -> frozenset[str]:
        """The keyword options ``create_queue`` accepts (every field but ``name``)."""
        return frozenset(f.name for f in fields(cls) if f.name != "name")


MAX_PARTITIONS = 64
# The partitions of a queue created with the SDK's ``enable_partitioning=True`` (and no
# ``partition_count``): raybus's count may change later, by hand or by itself.
PARTITIONED_QUEUE_PARTITIONS = 4


def sdk_queue_options(
    options: dict[str, Any], current: QueueProperties | None, entity: str
) -> dict[str, Any]:
    """``create_queue``/``update_queue`` options with the SDK's ``enable_partitioning`` read
    as raybus keeps it: at creation, True without a ``partition_count`` (or
    ``max_partitions``) makes ``PARTITIONED_QUEUE_PARTITIONS`` partitions, False one unless
    a count is given; on an update it may only repeat what the queue is (Service Bus fixes
    it at creation). None (the SDK's default) changes nothing."""
    if "enable_partitioning" not in options:
        return options
    options = dict(options)
    wanted = options.pop("enable_partitioning")
    if wanted is None:
        return options
    if not isinstance(wanted, bool):
        raise InvalidArgumentError(
            "enable_partitioning must be a bool", entity, "enable_partitioning"
        )
    if current is not None:
        if wanted != current.enable_partitioning:
            raise InvalidArgumentError(
                "enable_partitioning is fixed when the queue is created (raybus changes "
                "partition_count instead)",
                entity,
                "enable_partitioning",
            )
    elif wanted and "partition_count" not in options and "max_partitions" not in options:
        options["partition_count"] = PARTITIONED_QUEUE_PARTITIONS
    return options


IMMUTABLE_QUEUE_FIELDS = (
    "requires_session",
    "requires_duplicate_detection",
    "enable_express",
)


def _check_int(props: Any, name: str, low: int, high: int) -> None:
    value = getattr(props, name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(
            f"{name} must be an integer from {low} to {high}, not {value!r}", props.name, name
        )


@dataclass(frozen=True)
class NamespaceProperties(SdkDict):
    """The namespace as ``get_namespace_properties`` shows it (azure-servicebus's fields).

    ``created_at_utc`` is when the namespace's registry first started: kept across restarts
    with a ``storage_path``, the actor's start without one. raybus has no namespace settings
    to change, so ``modified_at_utc`` is the creation time; it has no messaging units (it
    scales by partitions), so ``messaging_units`` is None. ``messaging_sku`` is "Standard",
    the tier whose defaults raybus keeps (256 KiB messages unless a queue raises it).
    """

    name: str
    alias: str | None = None
    created_at_utc: datetime | None = None
    messaging_sku: str = "Standard"
    messaging_units: int | None = None
    modified_at_utc: datetime | None = None
    namespace_type: str = "Messaging"


@dataclass(frozen=True, kw_only=True)
class MessageCountDetails:
    """An entity's message counts by kind, as ``azure.servicebus.management`` has the model
    (its runtime properties, raybus's too, carry the same counts as fields of their own)."""

    active_message_count: int | None = None
    dead_letter_message_count: int | None = None
    scheduled_message_count: int | None = None
    transfer_message_count: int | None = None
    transfer_dead_letter_message_count: int | None = None


@dataclass(frozen=True)
class QueueRuntimeProperties:
    """A queue's counters at one moment (``get_queue_runtime_properties``).

    Counts may include expired messages the broker has not collected yet, as in Service Bus.
    ``active_message_count`` includes locked and deferred messages.
    """

    name: str
    active_message_count: int = 0
    dead_letter_message_count: int = 0
    scheduled_message_count: int = 0
    transfer_message_count: int = 0
    transfer_dead_letter_message_count: int = 0
    size_in_bytes: int = 0
    created_at_utc: datetime | None = None
    updated_at_utc: datetime | None = None
    accessed_at_utc: datetime | None = None
    partition_count: int = 1  # partitions serving now (raybus; differs while one changes)
    partition_map_version: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_message_count(self) -> int:
        return (
            self.active_message_count
            + self.dead_letter_message_count
            + self.scheduled_message_count
            + self.transfer_message_count
            + self.transfer_dead_letter_message_count
        )
