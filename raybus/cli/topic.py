"""``raybus topic create|show|list|update|delete``: topic administration.

``create`` and ``update`` take the same options, one per ``TopicProperties`` field; ``update``
changes only the ones given (``requires_duplicate_detection`` is fixed at creation: the broker
refuses to change it, exit code 2). Send to a topic with ``raybus send TOPIC``; its messages
are received from its subscriptions (``raybus subscription``, ``raybus receive
TOPIC/Subscriptions/SUB``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from . import _context
from ._render import json_line, properties_json, properties_table, topics_table
from .queue import Status, duration_option

__all__ = ["app", "topic_options"]

app = typer.Typer(
    help="Create, show, list, update and delete topics.",
    no_args_is_help=True,
)

_PANEL = "Topic settings"


def _opt(*names: str, help: str, **kwargs: Any) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=_PANEL, **kwargs)


Name = Annotated[str, typer.Argument(help="Topic name (case-insensitive).", show_default=False)]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Ttl = Annotated[
    str | None,
    _opt(
        "--ttl",
        metavar="DURATION",
        help="Default message time to live, or 'never' (default never); a subscription's own "
        "TTL can only shorten it.",
    ),
]
Dedup = Annotated[
    bool | None,
    _opt(
        "--dedup/--no-dedup",
        help="Duplicate detection on message_id, in every subscription (fixed at creation; "
        "default no).",
        show_default=False,
    ),
]
DedupWindow = Annotated[
    str | None,
    _opt(
        "--dedup-window",
        metavar="DURATION",
        help="Duplicate-detection history window, 20s to 7d (default 10m).",
    ),
]
MaxSize = Annotated[
    int | None,
    _opt("--max-size", metavar="MB", help="Max size in MB of each subscription (default 1024)."),
]
MaxMessageSize = Annotated[
    int | None,
    _opt("--max-message-size", metavar="KIB", help="Max message size in KiB (default 256)."),
]
StatusOpt = Annotated[
    Status | None,
    _opt(
        "--status",
        case_sensitive=False,
        help="Topic status (default Active; Disabled and SendDisabled refuse sends).",
    ),
]
AutoDelete = Annotated[
    str | None,
    _opt(
        "--auto-delete-on-idle",
        metavar="DURATION",
        help="Delete the topic after this idle time (>= 5m), or 'never' (default).",
    ),
]
Ordering = Annotated[
    bool | None,
    _opt(
        "--ordering/--no-ordering",
        help="Service Bus' support_ordering flag (default no).",
        show_default=False,
    ),
]
BatchedOps = Annotated[
    bool | None,
    _opt(
        "--batched/--no-batched",
        help="Service Bus' enable_batched_operations flag (default yes).",
        show_default=False,
    ),
]
Metadata = Annotated[str | None, _opt("--user-metadata", help="Free text kept with the topic.")]


def topic_options(
    *,
    ttl: str | None = None,
    dedup: bool | None = None,
    dedup_window: str | None = None,
    max_size: int | None = None,
    max_message_size: int | None = None,
    status: Status | None = None,
    auto_delete_on_idle: str | None = None,
    ordering: bool | None = None,
    batched_operations: bool | None = None,
    user_metadata: str | None = None,
) -> dict[str, Any]:
    """The ``TopicProperties`` keyword options for the command-line options that were given."""
    options: dict[str, Any] = {
        "default_message_time_to_live": duration_option(ttl, "--ttl", allow_never=True),
        "requires_duplicate_detection": dedup,
        "duplicate_detection_history_time_window": duration_option(dedup_window, "--dedup-window"),
        "max_size_in_megabytes": max_size,
        "max_message_size_in_kilobytes": max_message_size,
        "status": None if status is None else status.value,
        "auto_delete_on_idle": duration_option(
            auto_delete_on_idle, "--auto-delete-on-idle", allow_never=True
        ),
        "support_ordering": ordering,
        "enable_batched_operations": batched_operations,
        "user_metadata": user_metadata,
    }
    return {k: v for k, v in options.items() if v is not None}


def _print(props: Any, as_json: bool, runtime: Any = None) -> None:
    if as_json:
        typer.echo(json_line(properties_json(props, runtime)))
    else:
        Console().print(properties_table(props, runtime))


@app.command()
def create(
    ctx: typer.Context,
    name: Name,
    ttl: Ttl = None,
    dedup: Dedup = None,
    dedup_window: DedupWindow = None,
    max_size: MaxSize = None,
    max_message_size: MaxMessageSize = None,
    status: StatusOpt = None,
    auto_delete_on_idle: AutoDelete = None,
    ordering: Ordering = None,
    batched_operations: BatchedOps = None,
    user_metadata: Metadata = None,
    as_json: AsJson = False,
) -> None:
    """Create a topic (exit code 1 with MessagingEntityAlreadyExistsError if the name is taken).

    Queues and topics share names. A new topic has no subscriptions: a message sent to it
    before one exists is kept by nobody.
    Durations: seconds (30), 1m30s, 500ms, ISO-8601 (PT1M30S), 00:01:30.
    """
    options = topic_options(**_settings(locals()))
    props = _context.get(ctx).admin().create_topic(name, **options)
    _print(props, as_json)


@app.command()
def update(
    ctx: typer.Context,
    name: Name,
    ttl: Ttl = None,
    dedup: Dedup = None,
    dedup_window: DedupWindow = None,
    max_size: MaxSize = None,
    max_message_size: MaxMessageSize = None,
    status: StatusOpt = None,
    auto_delete_on_idle: AutoDelete = None,
    ordering: Ordering = None,
    batched_operations: BatchedOps = None,
    user_metadata: Metadata = None,
    as_json: AsJson = False,
) -> None:
    """Change the settings given; the others keep their values."""
    options = topic_options(**_settings(locals()))
    admin = _context.get(ctx).admin()
    props = admin.update_topic(admin.get_topic(name), **options)
    _print(props, as_json)


@app.command()
def show(ctx: typer.Context, name: Name, as_json: AsJson = False) -> None:
    """Show a topic's settings and counters (JSON: durations in seconds, null = never)."""
    admin = _context.get(ctx).admin()
    props = admin.get_topic(name)
    _print(props, as_json, admin.get_topic_runtime_properties(name))


@app.command("list")
def list_(ctx: typer.Context, as_json: AsJson = False) -> None:
    """List the namespace's topics (JSON: one topic per line)."""
    topics = sorted(_context.get(ctx).admin().list_topics(), key=lambda t: t.name.lower())
    if as_json:
        for t in topics:
            typer.echo(json_line(properties_json(t)))
    else:
        Console().print(topics_table(topics))


@app.command()
def delete(ctx: typer.Context, name: Name) -> None:
    """Delete a topic, its subscriptions and every message in them (no confirmation)."""
    _context.get(ctx).admin().delete_topic(name)
    typer.echo(f"deleted topic {name}", err=True)


_NOT_SETTINGS = frozenset({"ctx", "name", "as_json"})


def _settings(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if k not in _NOT_SETTINGS}
