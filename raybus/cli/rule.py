"""``raybus rule create|show|list|delete TOPIC SUB [NAME]``: a subscription's rules.

A rule is a filter and an optional action. ``create`` takes one filter: ``--sql`` (with
``--param``), correlation conditions (``--correlation-id``, ``--label``, ... and ``--property
key=value``, or ``--correlation key=value``), ``--true`` or ``--false`` (the default is
``--true``). Rules without actions are OR-ed into one copy per message; each matching rule with
an action gives its own copy. SQL is compiled before the broker is asked: a syntax error exits 2
with its position. ``show``/``list`` print each filter on one readable line (``--json``: the
filter as an object with a ``type``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from ..exceptions import InvalidArgumentError
from . import _context
from ._filters import build_rule
from ._render import json_line, rule_json, rule_table, rules_table

__all__ = ["app"]

app = typer.Typer(
    help="Create, show, list and delete the rules (filters and actions) of a subscription.",
    no_args_is_help=True,
)

_SQL = "SQL filter and action"
_CORRELATION = "Correlation filter (exact, case-sensitive; all conditions must hold)"

Topic = Annotated[str, typer.Argument(help="Topic name.", show_default=False)]
Subscription = Annotated[str, typer.Argument(help="Subscription name.", show_default=False)]
Name = Annotated[str, typer.Argument(help="Rule name (1-50 characters).", show_default=False)]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _field(*names: str, help: str) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=_CORRELATION, show_default=False)


@app.command()
def create(
    ctx: typer.Context,
    topic: Topic,
    subscription: Subscription,
    name: Name,
    sql: Annotated[
        str | None,
        typer.Option(
            "--sql",
            metavar="FILTER",
            help='SQL filter over message properties, e.g. "amount > @min AND sys.Label = '
            "'order'\".",
            rich_help_panel=_SQL,
            show_default=False,
        ),
    ] = None,
    params: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            metavar="NAME=VALUE",
            help="Parameter @NAME of --sql and --action (repeatable; JSON numbers, true/false "
            "and quoted strings are typed, the rest are strings).",
            rich_help_panel=_SQL,
            show_default=False,
        ),
    ] = None,
    action: Annotated[
        str | None,
        typer.Option(
            "--action",
            metavar="SQL",
            help="SET/REMOVE statements applied to this rule's copy, e.g. \"SET priority = "
            "'high'; REMOVE tmp\".",
            rich_help_panel=_SQL,
            show_default=False,
        ),
    ] = None,
    correlation_id: Annotated[
        str | None, _field("--correlation-id", help="Correlation id.")
    ] = None,
    message_id: Annotated[str | None, _field("--message-id", help="Message id.")] = None,
    to: Annotated[str | None, _field("--to", help="To address.")] = None,
    reply_to: Annotated[str | None, _field("--reply-to", help="Reply-to address.")] = None,
    label: Annotated[
        str | None, _field("--label", "--subject", help="Label (the message's subject).")
    ] = None,
    session_id: Annotated[str | None, _field("--session-id", help="Session id.")] = None,
    reply_to_session_id: Annotated[
        str | None, _field("--reply-to-session-id", help="Reply-to session id.")
    ] = None,
    content_type: Annotated[str | None, _field("--content-type", help="Content type.")] = None,
    properties: Annotated[
        list[str] | None,
        _field(
            "--property",
            "-p",
            help="Application property key=value (repeatable; typed like raybus send -p: "
            "n=5 matches the integer 5, n='\"5\"' the string).",
        ),
    ] = None,
    correlation: Annotated[
        list[str] | None,
        _field(
            "--correlation",
            help="Condition key=value (repeatable): a message field such as correlation_id or "
            "label, else an application property (or user.KEY).",
        ),
    ] = None,
    true: Annotated[
        bool,
        typer.Option(
            "--true", help="Match every message (the default filter).", show_default=False
        ),
    ] = False,
    false: Annotated[
        bool, typer.Option("--false", help="Match no message.", show_default=False)
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Add a rule (a filter and an optional action) to a subscription.

    Give one filter: --sql, correlation options, --true or --false (default --true). Exit
    code 1 with MessagingEntityAlreadyExistsError if the subscription has a rule of that name.
    """
    fields = {
        "correlation_id": correlation_id,
        "message_id": message_id,
        "to": to,
        "reply_to": reply_to,
        "label": label,
        "session_id": session_id,
        "reply_to_session_id": reply_to_session_id,
        "content_type": content_type,
    }
    try:
        rule = build_rule(
            name,
            sql=sql,
            params=params,
            correlation=correlation,
            fields=fields,
            properties=properties,
            true=true,
            false=false,
            action=action,
        )
    except InvalidArgumentError:
        raise  # the broker's own error line (exit code 2)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    created = (
        _context.get(ctx)
        .admin()
        .create_rule(topic, subscription, rule.name, filter=rule.filter, action=rule.action)
    )
    _print(topic, subscription, created, as_json)


def _print(topic: str, subscription: str, rule: Any, as_json: bool) -> None:
    if as_json:
        typer.echo(json_line(rule_json(rule)))
    else:
        Console().print(rule_table(topic, subscription, rule))


@app.command()
def show(
    ctx: typer.Context,
    topic: Topic,
    subscription: Subscription,
    name: Name,
    as_json: AsJson = False,
) -> None:
    """Show a rule: its filter and action."""
    rule = _context.get(ctx).admin().get_rule(topic, subscription, name)
    _print(topic, subscription, rule, as_json)


@app.command("list")
def list_(
    ctx: typer.Context,
    topic: Topic,
    subscription: Subscription,
    as_json: AsJson = False,
) -> None:
    """List a subscription's rules, in the order they are evaluated (JSON: one per line)."""
    rules = _context.get(ctx).admin().list_rules(topic, subscription)
    if as_json:
        for rule in rules:
            typer.echo(json_line(rule_json(rule)))
    else:
        Console().print(rules_table(topic, subscription, rules))


@app.command()
def delete(ctx: typer.Context, topic: Topic, subscription: Subscription, name: Name) -> None:
    """Delete a rule (deleting the last one leaves a subscription that receives nothing)."""
    _context.get(ctx).admin().delete_rule(topic, subscription, name)
    typer.echo(f"deleted rule {name} of {topic}/Subscriptions/{subscription}", err=True)
