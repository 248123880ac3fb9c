"""``raybus subscription create|show|list|update|delete TOPIC NAME``: a topic's subscriptions.

``create`` and ``update`` take the same options, one per ``SubscriptionProperties`` field;
``update`` changes only the ones given (``requires_session`` is fixed at creation: exit code
2). A new subscription gets the rule ``$Default``, which matches every message; ``--sql``
or ``--correlation`` give ``$Default`` that filter instead (``raybus rule`` manages rules
later). Receive with ``raybus receive TOPIC/Subscriptions/NAME`` (or ``--subscription
TOPIC/NAME``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from .._core.filters.rules import DEFAULT_RULE_NAME, RuleProperties, TrueRuleFilter
from ..exceptions import InvalidArgumentError
from . import _context
from ._filters import build_rule
from ._options import SUBSCRIPTION, AsJson, Wait, model_options, print_properties, settings_options
from ._render import json_line, properties_json, subscriptions_table

__all__ = ["app", "default_rule", "subscription_options"]

app = typer.Typer(
    help="Create, show, list, update and delete the subscriptions of a topic.",
    no_args_is_help=True,
)

_RULE_PANEL = "Default rule (replaces $Default, which matches every message)"

Topic = Annotated[str, typer.Argument(help="Topic name.", show_default=False)]
Name = Annotated[
    str, typer.Argument(help="Subscription name (case-insensitive).", show_default=False)
]
Sql = Annotated[
    str | None,
    typer.Option(
        "--sql",
        metavar="FILTER",
        help="SQL filter, e.g. \"amount > @min AND sys.Label = 'order'\".",
        rich_help_panel=_RULE_PANEL,
        show_default=False,
    ),
]
Correlation = Annotated[
    list[str] | None,
    typer.Option(
        "--correlation",
        metavar="KEY=VALUE",
        help="Correlation condition (repeatable, all must hold): a message field "
        "(correlation_id, message_id, to, reply_to, label/subject, session_id, "
        "reply_to_session_id, content_type), else an application property (or user.KEY).",
        rich_help_panel=_RULE_PANEL,
        show_default=False,
    ),
]
Params = Annotated[
    list[str] | None,
    typer.Option(
        "--param",
        metavar="NAME=VALUE",
        help="SQL parameter @NAME of --sql and --action (repeatable; typed like --property).",
        rich_help_panel=_RULE_PANEL,
        show_default=False,
    ),
]
Action = Annotated[
    str | None,
    typer.Option(
        "--action",
        metavar="SQL",
        help="SQL action applied to each copy, e.g. \"SET priority = 'high'\".",
        rich_help_panel=_RULE_PANEL,
        show_default=False,
    ),
]


def subscription_options(**settings: Any) -> dict[str, Any]:
    """The ``SubscriptionProperties`` keyword options for the command-line options given."""
    return model_options(SUBSCRIPTION, **settings)


def default_rule(
    sql: str | None = None,
    correlation: list[str] | None = None,
    params: list[str] | None = None,
    action: str | None = None,
) -> RuleProperties | None:
    """The ``$Default`` rule the options describe, or ``None`` (the broker's true filter)."""
    if sql is None and not correlation and action is None and not params:
        return None
    try:
        return build_rule(
            DEFAULT_RULE_NAME, sql=sql, params=params, correlation=correlation, action=action
        )
    except InvalidArgumentError:
        raise  # the broker's own error line (exit code 2)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


@app.command()
@settings_options(SUBSCRIPTION)
def create(
    ctx: typer.Context,
    topic: Topic,
    name: Name,
    sql: Sql = None,
    correlation: Correlation = None,
    params: Params = None,
    action: Action = None,
    as_json: AsJson = False,
    **settings: Any,
) -> None:
    """Create a subscription of TOPIC, with the rule $Default (or --sql/--correlation).

    From now on it receives a copy of each message sent to the topic that its rules match.
    Without --sql or --correlation, $Default matches every message. A bad SQL filter exits 2
    with the position of the error, before anything is created.
    """
    rule = default_rule(sql, correlation, params, action)
    options = subscription_options(**settings)
    admin = _context.get(ctx).admin()
    props = admin.create_subscription(topic, name, default_rule=rule, **options)
    rules = [rule or RuleProperties(DEFAULT_RULE_NAME, TrueRuleFilter())]
    print_properties(props, as_json, rules=rules)


@app.command()
@settings_options(SUBSCRIPTION)
def update(
    ctx: typer.Context,
    topic: Topic,
    name: Name,
    wait: Wait = False,
    as_json: AsJson = False,
    **settings: Any,
) -> None:
    """Change the settings given; the others keep their values (rules: raybus rule)."""
    options = subscription_options(**settings)
    admin = _context.get(ctx).admin()
    props = admin.update_subscription(topic, admin.get_subscription(topic, name), **options)
    if wait and "partition_count" in options:
        admin.wait_for_partitions(props.path)
    print_properties(props, as_json)


@app.command()
def show(ctx: typer.Context, topic: Topic, name: Name, as_json: AsJson = False) -> None:
    """Show a subscription's settings, counters and rules.

    JSON: durations in seconds (null = never), the rules under "rules".
    """
    admin = _context.get(ctx).admin()
    props = admin.get_subscription(topic, name)
    runtime = admin.get_subscription_runtime_properties(topic, name)
    print_properties(props, as_json, runtime, admin.list_rules(topic, name))


@app.command("list")
def list_(ctx: typer.Context, topic: Topic, as_json: AsJson = False) -> None:
    """List the subscriptions of a topic (JSON: one subscription per line)."""
    subs = sorted(_context.get(ctx).admin().list_subscriptions(topic), key=lambda s: s.name.lower())
    if as_json:
        for s in subs:
            typer.echo(json_line(properties_json(s)))
    else:
        Console().print(subscriptions_table(topic, subs))


@app.command()
def delete(ctx: typer.Context, topic: Topic, name: Name) -> None:
    """Delete a subscription and every message in it (no confirmation)."""
    _context.get(ctx).admin().delete_subscription(topic, name)
    typer.echo(f"deleted subscription {topic}/Subscriptions/{name}", err=True)
