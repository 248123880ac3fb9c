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
from ._options import TOPIC, AsJson, model_options, print_properties, settings_options
from ._render import json_line, properties_json, topics_table

__all__ = ["app", "topic_options"]

app = typer.Typer(
    help="Create, show, list, update and delete topics.",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(help="Topic name (case-insensitive).", show_default=False)]


def topic_options(**settings: Any) -> dict[str, Any]:
    """The ``TopicProperties`` keyword options for the command-line options that were given."""
    return model_options(TOPIC, **settings)


@app.command()
@settings_options(TOPIC)
def create(ctx: typer.Context, name: Name, as_json: AsJson = False, **settings: Any) -> None:
    """Create a topic (exit code 1 with MessagingEntityAlreadyExistsError if the name is taken).

    Queues and topics share names. A new topic has no subscriptions: a message sent to it
    before one exists is kept by nobody.
    Durations: seconds (30), 1m30s, 500ms, ISO-8601 (PT1M30S), 00:01:30.
    """
    props = _context.get(ctx).admin().create_topic(name, **topic_options(**settings))
    print_properties(props, as_json)


@app.command()
@settings_options(TOPIC)
def update(ctx: typer.Context, name: Name, as_json: AsJson = False, **settings: Any) -> None:
    """Change the settings given; the others keep their values."""
    options = topic_options(**settings)
    admin = _context.get(ctx).admin()
    print_properties(admin.update_topic(admin.get_topic(name), **options), as_json)


@app.command()
def show(ctx: typer.Context, name: Name, as_json: AsJson = False) -> None:
    """Show a topic's settings and counters (JSON: durations in seconds, null = never)."""
    admin = _context.get(ctx).admin()
    props = admin.get_topic(name)
    print_properties(props, as_json, admin.get_topic_runtime_properties(name))


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
