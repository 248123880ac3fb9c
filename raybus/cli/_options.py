"""The settings options of ``queue``, ``topic`` and ``subscription`` ``create``/``update``,
written once.

Each setting (its flag, help text, metavar, and how its value becomes the management model's
keyword option) is one row of ``SETTINGS``; an entity takes the rows that name it, in the
table's order, which is the order ``--help`` lists them in. Help text that differs between
entities says so (``{entity}`` or one text per entity), so that a flag means the same thing
everywhere and is parsed the same way.

* ``settings_options(entity)`` decorates a command whose function takes ``**settings``: it adds
  one typer option per setting to the signature typer reads (after the positional arguments),
  so ``create`` and ``update`` list them without spelling them out;
* ``model_options(entity, **settings)`` turns what the command received into the model's
  keyword options, leaving out what was not given (``update`` changes only those). A bad
  duration is a usage error naming its flag (exit code 2, before joining Ray).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from ._parse import parse_duration
from ._render import json_line, properties_json, properties_table

__all__ = [
    "QUEUE",
    "SETTINGS",
    "SUBSCRIPTION",
    "TOPIC",
    "AsJson",
    "Setting",
    "Status",
    "Wait",
    "duration_option",
    "model_options",
    "print_properties",
    "settings_options",
]

QUEUE, TOPIC, SUBSCRIPTION = "queue", "topic", "subscription"
_ALL = frozenset({QUEUE, TOPIC, SUBSCRIPTION})
_QUEUE_AND_SUB = frozenset({QUEUE, SUBSCRIPTION})
_QUEUE_AND_TOPIC = frozenset({QUEUE, TOPIC})


class Status(str, Enum):
    """Entity status (as ``raybus.EntityStatus``)."""

    ACTIVE = "Active"
    DISABLED = "Disabled"
    SEND_DISABLED = "SendDisabled"
    RECEIVE_DISABLED = "ReceiveDisabled"


AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Wait = Annotated[
    bool,
    typer.Option("--wait/--no-wait", help="Wait until a partition-count change finished."),
]


def duration_option(
    value: str | None, option: str, *, allow_never: bool = False
) -> timedelta | None:
    """The duration an option gave (``None`` if not given); a bad one is a usage error."""
    if value is None:
        return None
    try:
        return parse_duration(value, allow_never=allow_never)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def _as_given(value: Any, flag: str) -> Any:
    return value


def _duration(value: str, flag: str) -> timedelta | None:
    return duration_option(value, flag)


def _duration_or_never(value: str, flag: str) -> timedelta | None:
    return duration_option(value, flag, allow_never=True)


def _status(value: Status, flag: str) -> str:
    return value.value


@dataclass(frozen=True)
class Setting:
    """One command-line setting and the model field it sets."""

    param: str
    """The parameter name typer passes the value under."""
    flag: str
    """The option's declaration: ``--name``, or ``--name/--no-name`` for a switch."""
    field: str
    """The management model's keyword option (``QueueProperties`` etc.)."""
    kind: type
    """The value's type (``None`` always means "not given")."""
    help: str | Mapping[str, str]
    """The help text (``{entity}`` is replaced), or one per entity."""
    entities: frozenset[str]
    metavar: str | None = None
    parse: Callable[[Any, str], Any] = _as_given
    """``(value, flag) -> model value``; raises ``typer.BadParameter`` naming ``flag``."""

    def help_for(self, entity: str) -> str:
        text = self.help if isinstance(self.help, str) else self.help[entity]
        return text.format(entity=entity)

    def option(self, entity: str) -> Any:
        """The typer option of this setting on ``entity``'s commands."""
        extra: dict[str, Any] = {}
        if self.metavar is not None:
            extra["metavar"] = self.metavar
        if self.kind is bool:
            extra["show_default"] = False  # a switch given neither way keeps the value
        if issubclass(self.kind, Enum):
            extra["case_sensitive"] = False
        return typer.Option(
            self.flag,
            help=self.help_for(entity),
            rich_help_panel=f"{entity.capitalize()} settings",
            **extra,
        )


_TTL_HELP = "Default message time to live, or 'never' (default never"
_STATUS_HELP = {
    QUEUE: "Queue status (default Active).",
    TOPIC: "Topic status (default Active; Disabled and SendDisabled refuse sends).",
    SUBSCRIPTION: "Subscription status (default Active; otherwise it keeps receiving copies "
    "but refuses receivers).",
}

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "lock_duration",
        "--lock-duration",
        "lock_duration",
        str,
        "Peek-lock duration, 100ms to 5m (default 60s).",
        _QUEUE_AND_SUB,
        "DURATION",
        _duration,
    ),
    Setting(
        "max_delivery_count",
        "--max-delivery-count",
        "max_delivery_count",
        int,
        "Deliveries before a message is dead-lettered (default 10).",
        _QUEUE_AND_SUB,
    ),
    Setting(
        "ttl",
        "--ttl",
        "default_message_time_to_live",
        str,
        {
            QUEUE: _TTL_HELP + ").",
            TOPIC: _TTL_HELP + "); a subscription's own TTL can only shorten it.",
            SUBSCRIPTION: _TTL_HELP + "; the topic's is a ceiling).",
        },
        _ALL,
        "DURATION",
        _duration_or_never,
    ),
    Setting(
        "dead_letter_on_expiration",
        "--dead-letter-expired/--no-dead-letter-expired",
        "dead_lettering_on_message_expiration",
        bool,
        "Move expired messages to the dead-letter queue (default no).",
        _QUEUE_AND_SUB,
    ),
    Setting(
        "dead_letter_on_filter_errors",
        "--dead-letter-filter-errors/--no-dead-letter-filter-errors",
        "dead_lettering_on_filter_evaluation_exceptions",
        bool,
        "Dead-letter a message whose filter fails to evaluate, else drop it (default yes).",
        frozenset({SUBSCRIPTION}),
    ),
    Setting(
        "dedup",
        "--dedup/--no-dedup",
        "requires_duplicate_detection",
        bool,
        {
            QUEUE: "Duplicate detection on message_id (fixed at creation; default no).",
            TOPIC: "Duplicate detection on message_id, in every subscription (fixed at "
            "creation; default no).",
        },
        _QUEUE_AND_TOPIC,
    ),
    Setting(
        "dedup_window",
        "--dedup-window",
        "duplicate_detection_history_time_window",
        str,
        "Duplicate-detection history window, 20s to 7d (default 10m).",
        _QUEUE_AND_TOPIC,
        "DURATION",
        _duration,
    ),
    Setting(
        "sessions",
        "--sessions/--no-sessions",
        "requires_session",
        bool,
        "Require sessions (fixed at creation; default no).",
        _QUEUE_AND_SUB,
    ),
    Setting(
        "partitions",
        "--partitions",
        "partition_count",
        int,
        "Partition count, 1-64 (default 1; may change later).",
        _QUEUE_AND_SUB,
    ),
    Setting(
        "min_partitions",
        "--min-partitions",
        "min_partitions",
        int,
        "Autoscaling floor.",
        frozenset({QUEUE}),
    ),
    Setting(
        "max_partitions",
        "--max-partitions",
        "max_partitions",
        int,
        "Autoscaling ceiling (turns autoscaling on).",
        frozenset({QUEUE}),
    ),
    Setting(
        "target_backlog",
        "--target-backlog",
        "target_backlog_per_partition",
        int,
        "Autoscaling target of active messages per partition (default 10000).",
        frozenset({QUEUE}),
    ),
    Setting(
        "max_size",
        "--max-size",
        "max_size_in_megabytes",
        int,
        {
            QUEUE: "Max size in MB (default 1024).",
            TOPIC: "Max size in MB of each subscription (default 1024).",
        },
        _QUEUE_AND_TOPIC,
        "MB",
    ),
    Setting(
        "max_message_size",
        "--max-message-size",
        "max_message_size_in_kilobytes",
        int,
        "Max message size in KiB (default 256).",
        _QUEUE_AND_TOPIC,
        "KIB",
    ),
    Setting("status", "--status", "status", Status, _STATUS_HELP, _ALL, None, _status),
    Setting(
        "auto_delete_on_idle",
        "--auto-delete-on-idle",
        "auto_delete_on_idle",
        str,
        "Delete the {entity} after this idle time (>= 5m), or 'never' (default).",
        _ALL,
        "DURATION",
        _duration_or_never,
    ),
    Setting(
        "express",
        "--express/--no-express",
        "enable_express",
        bool,
        "Express: acknowledge before writing, write within 1 s (fixed at creation).",
        frozenset({QUEUE}),
    ),
    Setting(
        "ordering",
        "--ordering/--no-ordering",
        "support_ordering",
        bool,
        "Service Bus' support_ordering flag (default no).",
        frozenset({TOPIC}),
    ),
    Setting(
        "batched_operations",
        "--batched/--no-batched",
        "enable_batched_operations",
        bool,
        "Service Bus' enable_batched_operations flag (default yes).",
        _ALL,
    ),
    Setting(
        "forward_to",
        "--forward-to",
        "forward_to",
        str,
        "Forward every message to this queue or topic.",
        _QUEUE_AND_SUB,
    ),
    Setting(
        "forward_dead_lettered_to",
        "--forward-dead-lettered-to",
        "forward_dead_lettered_messages_to",
        str,
        "Forward dead-lettered messages to this queue or topic.",
        _QUEUE_AND_SUB,
    ),
    Setting(
        "user_metadata",
        "--user-metadata",
        "user_metadata",
        str,
        "Free text kept with the {entity}.",
        _ALL,
    ),
)


def _settings_of(entity: str) -> dict[str, Setting]:
    """``param -> Setting`` for ``entity``, in ``SETTINGS`` order."""
    if entity not in _ALL:
        raise ValueError(f"no settings for {entity!r}")
    return {s.param: s for s in SETTINGS if entity in s.entities}


def model_options(entity: str, **settings: Any) -> dict[str, Any]:
    """The model's keyword options for the settings given (``None``: not given, left out).

    ``TypeError`` for a name that is not one of ``entity``'s settings (a programming error).
    """
    known = _settings_of(entity)
    unknown = sorted(set(settings) - known.keys())
    if unknown:
        raise TypeError(f"not {entity} settings: {', '.join(unknown)}")
    options: dict[str, Any] = {}
    for param, setting in known.items():
        value = settings.get(param)
        if value is not None:
            options[setting.field] = setting.parse(value, setting.flag)
    return options


F = TypeVar("F", bound=Callable[..., Any])


def settings_options(entity: str) -> Callable[[F], F]:
    """Give a command taking ``**settings`` one option per setting of ``entity``.

    typer builds a command's options from its function's signature, so the signature is
    rewritten: the settings go after the positional arguments (those without a default) and
    before the command's own options, which is where ``--help`` lists them.
    """
    known = _settings_of(entity)

    def deco(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        at = next((i for i, p in enumerate(own) if p.default is not p.empty), len(own))
        added = [
            inspect.Parameter(
                s.param,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=None,
                annotation=Annotated[s.kind | None, s.option(entity)],
            )
            for s in known.values()
        ]
        new = sig.replace(parameters=[*own[:at], *added, *own[at:]])
        fn.__signature__ = new  # type: ignore[attr-defined]
        return fn

    return deco


def print_properties(props: Any, as_json: bool, runtime: Any = None, rules: Any = None) -> None:
    """An entity's settings (and counters, and rules) as one JSON line or a table."""
    if as_json:
        typer.echo(json_line(properties_json(props, runtime, rules=rules)))
    else:
        Console().print(properties_table(props, runtime, rules=rules))
