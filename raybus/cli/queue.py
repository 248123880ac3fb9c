"""``raybus queue create|show|list|update|delete``: queue administration.

``create`` and ``update`` take the same options, one per ``QueueProperties`` field; ``update``
changes only the ones given (``requires_session``, ``requires_duplicate_detection`` and
``enable_express`` are fixed at creation: the broker refuses to change them, exit code 2).
"""

from __future__ import annotations

from datetime import timedelta
from enum import Enum
from typing import Annotated, Any

import typer
from rich.console import Console

from . import _context
from ._parse import parse_duration
from ._render import json_line, properties_json, properties_table, queues_table

__all__ = ["Status", "app", "duration_option", "queue_options"]

app = typer.Typer(
    help="Create, show, list, update and delete queues.",
    no_args_is_help=True,
)

_PANEL = "Queue settings"


class Status(str, Enum):
    """Queue status (as ``raybus.EntityStatus``)."""

    ACTIVE = "Active"
    DISABLED = "Disabled"
    SEND_DISABLED = "SendDisabled"
    RECEIVE_DISABLED = "ReceiveDisabled"


Name = Annotated[str, typer.Argument(help="Queue name (case-insensitive).", show_default=False)]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
LockDuration = Annotated[
    str | None,
    typer.Option(
        "--lock-duration",
        metavar="DURATION",
        help="Peek-lock duration, 100ms to 5m (default 60s).",
        rich_help_panel=_PANEL,
    ),
]
MaxDeliveryCount = Annotated[
    int | None,
    typer.Option(
        "--max-delivery-count",
        help="Deliveries before a message is dead-lettered (default 10).",
        rich_help_panel=_PANEL,
    ),
]
Ttl = Annotated[
    str | None,
    typer.Option(
        "--ttl",
        metavar="DURATION",
        help="Default message time to live, or 'never' (default never).",
        rich_help_panel=_PANEL,
    ),
]
DeadLetterOnExpiration = Annotated[
    bool | None,
    typer.Option(
        "--dead-letter-expired/--no-dead-letter-expired",
        help="Move expired messages to the dead-letter queue (default no).",
        rich_help_panel=_PANEL,
        show_default=False,
    ),
]
Dedup = Annotated[
    bool | None,
    typer.Option(
        "--dedup/--no-dedup",
        help="Duplicate detection on message_id (fixed at creation; default no).",
        rich_help_panel=_PANEL,
        show_default=False,
    ),
]
DedupWindow = Annotated[
    str | None,
    typer.Option(
        "--dedup-window",
        metavar="DURATION",
        help="Duplicate-detection history window, 20s to 7d (default 10m).",
        rich_help_panel=_PANEL,
    ),
]
Sessions = Annotated[
    bool | None,
    typer.Option(
        "--sessions/--no-sessions",
        help="Require sessions (fixed at creation; default no).",
        rich_help_panel=_PANEL,
        show_default=False,
    ),
]
Partitions = Annotated[
    int | None,
    typer.Option(
        "--partitions",
        help="Partition count, 1-64 (default 1; may change later).",
        rich_help_panel=_PANEL,
    ),
]
MinPartitions = Annotated[
    int | None,
    typer.Option("--min-partitions", help="Autoscaling floor.", rich_help_panel=_PANEL),
]
MaxPartitions = Annotated[
    int | None,
    typer.Option(
        "--max-partitions",
        help="Autoscaling ceiling (turns autoscaling on).",
        rich_help_panel=_PANEL,
    ),
]
TargetBacklog = Annotated[
    int | None,
    typer.Option(
        "--target-backlog",
        help="Autoscaling target of active messages per partition (default 10000).",
        rich_help_panel=_PANEL,
    ),
]
MaxSize = Annotated[
    int | None,
    typer.Option(
        "--max-size",
        metavar="MB",
        help="Max size in MB (default 1024).",
        rich_help_panel=_PANEL,
    ),
]
MaxMessageSize = Annotated[
    int | None,
    typer.Option(
        "--max-message-size",
        metavar="KIB",
        help="Max message size in KiB (default 256).",
        rich_help_panel=_PANEL,
    ),
]
StatusOpt = Annotated[
    Status | None,
    typer.Option(
        "--status",
        case_sensitive=False,
        help="Queue status (default Active).",
        rich_help_panel=_PANEL,
    ),
]
AutoDelete = Annotated[
    str | None,
    typer.Option(
        "--auto-delete-on-idle",
        metavar="DURATION",
        help="Delete the queue after this idle time (>= 5m), or 'never' (default).",
        rich_help_panel=_PANEL,
    ),
]
Express = Annotated[
    bool | None,
    typer.Option(
        "--express/--no-express",
        help="Express: acknowledge before writing, write within 1 s (fixed at creation).",
        rich_help_panel=_PANEL,
        show_default=False,
    ),
]
BatchedOps = Annotated[
    bool | None,
    typer.Option(
        "--batched/--no-batched",
        help="Service Bus' enable_batched_operations flag (default yes).",
        rich_help_panel=_PANEL,
        show_default=False,
    ),
]
ForwardTo = Annotated[
    str | None,
    typer.Option(
        "--forward-to", help="Forward every message to this queue or topic.", rich_help_panel=_PANEL
    ),
]
ForwardDlqTo = Annotated[
    str | None,
    typer.Option(
        "--forward-dead-lettered-to",
        help="Forward dead-lettered messages to this queue or topic.",
        rich_help_panel=_PANEL,
    ),
]
Metadata = Annotated[
    str | None,
    typer.Option("--user-metadata", help="Free text kept with the queue.", rich_help_panel=_PANEL),
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


def queue_options(
    *,
    lock_duration: str | None = None,
    max_delivery_count: int | None = None,
    ttl: str | None = None,
    dead_letter_on_expiration: bool | None = None,
    dedup: bool | None = None,
    dedup_window: str | None = None,
    sessions: bool | None = None,
    partitions: int | None = None,
    min_partitions: int | None = None,
    max_partitions: int | None = None,
    target_backlog: int | None = None,
    max_size: int | None = None,
    max_message_size: int | None = None,
    status: Status | None = None,
    auto_delete_on_idle: str | None = None,
    express: bool | None = None,
    batched_operations: bool | None = None,
    forward_to: str | None = None,
    forward_dead_lettered_to: str | None = None,
    user_metadata: str | None = None,
) -> dict[str, Any]:
    """The ``QueueProperties`` keyword options for the command-line options that were given."""
    options: dict[str, Any] = {
        "lock_duration": duration_option(lock_duration, "--lock-duration"),
        "max_delivery_count": max_delivery_count,
        "default_message_time_to_live": duration_option(ttl, "--ttl", allow_never=True),
        "dead_lettering_on_message_expiration": dead_letter_on_expiration,
        "requires_duplicate_detection": dedup,
        "duplicate_detection_history_time_window": duration_option(dedup_window, "--dedup-window"),
        "requires_session": sessions,
        "partition_count": partitions,
        "min_partitions": min_partitions,
        "max_partitions": max_partitions,
        "target_backlog_per_partition": target_backlog,
        "max_size_in_megabytes": max_size,
        "max_message_size_in_kilobytes": max_message_size,
        "status": None if status is None else status.value,
        "auto_delete_on_idle": duration_option(
            auto_delete_on_idle, "--auto-delete-on-idle", allow_never=True
        ),
        "enable_express": express,
        "enable_batched_operations": batched_operations,
        "forward_to": forward_to,
        "forward_dead_lettered_messages_to": forward_dead_lettered_to,
        "user_metadata": user_metadata,
    }
    return {k: v for k, v in options.items() if v is not None}


def _print_queue(props: Any, as_json: bool, runtime: Any = None) -> None:
    if as_json:
        typer.echo(json_line(properties_json(props, runtime)))
    else:
        Console().print(properties_table(props, runtime))


@app.command()
def create(
    ctx: typer.Context,
    name: Name,
    lock_duration: LockDuration = None,
    max_delivery_count: MaxDeliveryCount = None,
    ttl: Ttl = None,
    dead_letter_on_expiration: DeadLetterOnExpiration = None,
    dedup: Dedup = None,
    dedup_window: DedupWindow = None,
    sessions: Sessions = None,
    partitions: Partitions = None,
    min_partitions: MinPartitions = None,
    max_partitions: MaxPartitions = None,
    target_backlog: TargetBacklog = None,
    max_size: MaxSize = None,
    max_message_size: MaxMessageSize = None,
    status: StatusOpt = None,
    auto_delete_on_idle: AutoDelete = None,
    express: Express = None,
    batched_operations: BatchedOps = None,
    forward_to: ForwardTo = None,
    forward_dead_lettered_to: ForwardDlqTo = None,
    user_metadata: Metadata = None,
    as_json: AsJson = False,
) -> None:
    """Create a queue (exit code 1 with MessagingEntityAlreadyExistsError if it exists).

    Durations: seconds (30), 1m30s, 500ms, ISO-8601 (PT1M30S), 00:01:30.
    """
    options = queue_options(**_settings(locals()))
    props = _context.get(ctx).admin().create_queue(name, **options)
    _print_queue(props, as_json)


@app.command()
def update(
    ctx: typer.Context,
    name: Name,
    lock_duration: LockDuration = None,
    max_delivery_count: MaxDeliveryCount = None,
    ttl: Ttl = None,
    dead_letter_on_expiration: DeadLetterOnExpiration = None,
    dedup: Dedup = None,
    dedup_window: DedupWindow = None,
    sessions: Sessions = None,
    partitions: Partitions = None,
    min_partitions: MinPartitions = None,
    max_partitions: MaxPartitions = None,
    target_backlog: TargetBacklog = None,
    max_size: MaxSize = None,
    max_message_size: MaxMessageSize = None,
    status: StatusOpt = None,
    auto_delete_on_idle: AutoDelete = None,
    express: Express = None,
    batched_operations: BatchedOps = None,
    forward_to: ForwardTo = None,
    forward_dead_lettered_to: ForwardDlqTo = None,
    user_metadata: Metadata = None,
    wait: Annotated[
        bool,
        typer.Option("--wait/--no-wait", help="Wait until a partition-count change finished."),
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Change the settings given; the others keep their values."""
    options = queue_options(**_settings(locals()))
    admin = _context.get(ctx).admin()
    props = admin.update_queue(admin.get_queue(name), **options)
    if wait and "partition_count" in options:
        admin.wait_for_partitions(name)
    _print_queue(props, as_json)


@app.command()
def show(
    ctx: typer.Context,
    name: Name,
    as_json: AsJson = False,
) -> None:
    """Show a queue's settings and counters (JSON: durations in seconds, null = never)."""
    admin = _context.get(ctx).admin()
    props = admin.get_queue(name)
    _print_queue(props, as_json, admin.get_queue_runtime_properties(name))


@app.command("list")
def list_(ctx: typer.Context, as_json: AsJson = False) -> None:
    """List the namespace's queues (JSON: one queue per line)."""
    queues = sorted(_context.get(ctx).admin().list_queues(), key=lambda q: q.name.lower())
    if as_json:
        for q in queues:
            typer.echo(json_line(properties_json(q)))
    else:
        Console().print(queues_table(queues))


@app.command()
def delete(ctx: typer.Context, name: Name) -> None:
    """Delete a queue and every message in it (no confirmation)."""
    _context.get(ctx).admin().delete_queue(name)
    typer.echo(f"deleted queue {name}", err=True)


_NOT_SETTINGS = frozenset({"ctx", "name", "as_json", "wait"})


def _settings(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if k not in _NOT_SETTINGS}
