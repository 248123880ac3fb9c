"""``raybus queue create|show|list|update|delete``: queue administration.

``create`` and ``update`` take the same options, one per ``QueueProperties`` field; ``update``
changes only the ones given (``requires_session``, ``requires_duplicate_detection`` and
``enable_express`` are fixed at creation: the broker refuses to change them, exit code 2).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from . import _context
from ._options import (
    QUEUE,
    AsJson,
    Status,
    Wait,
    duration_option,
    model_options,
    print_properties,
    settings_options,
)
from ._render import json_line, properties_json, queues_table

__all__ = ["Status", "app", "duration_option", "queue_options"]

app = typer.Typer(
    help="Create, show, list, update and delete queues.",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(help="Queue name (case-insensitive).", show_default=False)]


def queue_options(**settings: Any) -> dict[str, Any]:
    """The ``QueueProperties`` keyword options for the command-line options that were given."""
    return model_options(QUEUE, **settings)


@app.command()
@settings_options(QUEUE)
def create(ctx: typer.Context, name: Name, as_json: AsJson = False, **settings: Any) -> None:
    """Create a queue (exit code 1 with MessagingEntityAlreadyExistsError if it exists).

    Durations: seconds (30), 1m30s, 500ms, ISO-8601 (PT1M30S), 00:01:30.
    """
    options = queue_options(**settings)
    props = _context.get(ctx).admin().create_queue(name, **options)
    print_properties(props, as_json)


@app.command()
@settings_options(QUEUE)
def update(
    ctx: typer.Context, name: Name, wait: Wait = False, as_json: AsJson = False, **settings: Any
) -> None:
    """Change the settings given; the others keep their values."""
    options = queue_options(**settings)
    admin = _context.get(ctx).admin()
    props = admin.update_queue(admin.get_queue(name), **options)
    if wait and "partition_count" in options:
        admin.wait_for_partitions(name)
    print_properties(props, as_json)


@app.command()
def show(
    ctx: typer.Context,
    name: Name,
    as_json: AsJson = False,
) -> None:
    """Show a queue's settings and counters (JSON: durations in seconds, null = never)."""
    admin = _context.get(ctx).admin()
    props = admin.get_queue(name)
    print_properties(props, as_json, admin.get_queue_runtime_properties(name))


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
