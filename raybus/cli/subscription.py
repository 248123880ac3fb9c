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
from ._render import json_line, properties_json, properties_table, subscriptions_table
from .queue import Status, duration_option

__all__ = ["app", "default_rule", "subscription_options"]

app = typer.Typer(
    help="Create, show, list, update and delete the subscriptions of a topic.",
    no_args_is_help=True,
)

_PANEL = "Subscription settings"
_RULE_PANEL = "Default rule (replaces $Default, which matches every message)"


def _opt(*names: str, help: str, **kwargs: Any) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=_PANEL, **kwargs)


Topic = Annotated[str, typer.Argument(help="Topic name.", show_default=False)]
Name = Annotated[
    str, typer.Argument(help="Subscription name (case-insensitive).", show_default=False)
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
LockDuration = Annotated[
    str | None,
    _opt(
        "--lock-duration",
        metavar="DURATION",
        help="Peek-lock duration, 100ms to 5m (default 60s).",
    ),
]
MaxDeliveryCount = Annotated[
    int | None,
    _opt("--max-delivery-count", help="Deliveries before a message is dead-lettered (default 10)."),
]
Ttl = Annotated[
    str | None,
    _opt(
        "--ttl",
        metavar="DURATION",
        help="Default message time to live, or 'never' (default never; the topic's is a ceiling).",
    ),
]
DeadLetterOnExpiration = Annotated[
    bool | None,
    _opt(
        "--dead-letter-expired/--no-dead-letter-expired",
        help="Move expired messages to the dead-letter queue (default no).",
        show_default=False,
    ),
]
DeadLetterOnFilterErrors = Annotated[
    bool | None,
    _opt(
        "--dead-letter-filter-errors/--no-dead-letter-filter-errors",
        help="Dead-letter a message whose filter fails to evaluate, else drop it (default yes).",
        show_default=False,
    ),
]
Sessions = Annotated[
    bool | None,
    _opt(
        "--sessions/--no-sessions",
        help="Require sessions (fixed at creation; default no).",
        show_default=False,
    ),
]
Partitions = Annotated[
    int | None,
    _opt("--partitions", help="Partition count, 1-64 (default 1; may change later)."),
]
StatusOpt = Annotated[
    Status | None,
    _opt(
        "--status",
        case_sensitive=False,
        help="Subscription status (default Active; otherwise it keeps receiving copies but "
        "refuses receivers).",
    ),
]
AutoDelete = Annotated[
    str | None,
    _opt(
        "--auto-delete-on-idle",
        metavar="DURATION",
        help="Delete the subscription after this idle time (>= 5m), or 'never' (default).",
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
ForwardTo = Annotated[
    str | None, _opt("--forward-to", help="Forward every message to this queue or topic.")
]
ForwardDlqTo = Annotated[
    str | None,
    _opt(
        "--forward-dead-lettered-to", help="Forward dead-lettered messages to this queue or topic."
    ),
]
Metadata = Annotated[
    str | None, _opt("--user-metadata", help="Free text kept with the subscription.")
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


def subscription_options(
    *,
    lock_duration: str | None = None,
    max_delivery_count: int | None = None,
    ttl: str | None = None,
    dead_letter_on_expiration: bool | None = None,
    dead_letter_on_filter_errors: bool | None = None,
    sessions: bool | None = None,
    partitions: int | None = None,
    status: Status | None = None,
    auto_delete_on_idle: str | None = None,
    batched_operations: bool | None = None,
    forward_to: str | None = None,
    forward_dead_lettered_to: str | None = None,
    user_metadata: str | None = None,
) -> dict[str, Any]:
    """The ``SubscriptionProperties`` keyword options for the command-line options given."""
    options: dict[str, Any] = {
        "lock_duration": duration_option(lock_duration, "--lock-duration"),
        "max_delivery_count": max_delivery_count,
        "default_message_time_to_live": duration_option(ttl, "--ttl", allow_never=True),
        "dead_lettering_on_message_expiration": dead_letter_on_expiration,
        "dead_lettering_on_filter_evaluation_exceptions": dead_letter_on_filter_errors,
        "requires_session": sessions,
        "partition_count": partitions,
        "status": None if status is None else status.value,
        "auto_delete_on_idle": duration_option(
            auto_delete_on_idle, "--auto-delete-on-idle", allow_never=True
        ),
        "enable_batched_operations": batched_operations,
        "forward_to": forward_to,
        "forward_dead_lettered_messages_to": forward_dead_lettered_to,
        "user_metadata": user_metadata,
    }
    return {k: v for k, v in options.items() if v is not None}


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


def _print(props: Any, as_json: bool, runtime: Any = None, rules: Any = None) -> None:
    if as_json:
        typer.echo(json_line(properties_json(props, runtime, rules=rules)))
    else:
        Console().print(properties_table(props, runtime, rules=rules))


@app.command()
def create(
    ctx: typer.Context,
    topic: Topic,
    name: Name,
    lock_duration: LockDuration = None,
    max_delivery_count: MaxDeliveryCount = None,
    ttl: Ttl = None,
    dead_letter_on_expiration: DeadLetterOnExpiration = None,
    dead_letter_on_filter_errors: DeadLetterOnFilterErrors = None,
    sessions: Sessions = None,
    partitions: Partitions = None,
    status: StatusOpt = None,
    auto_delete_on_idle: AutoDelete = None,
    batched_operations: BatchedOps = None,
    forward_to: ForwardTo = None,
    forward_dead_lettered_to: ForwardDlqTo = None,
    user_metadata: Metadata = None,
    sql: Sql = None,
    correlation: Correlation = None,
    params: Params = None,
    action: Action = None,
    as_json: AsJson = False,
) -> None:
    """Create a subscription of TOPIC, with the rule $Default (or --sql/--correlation).

    From now on it receives a copy of each message sent to the topic that its rules match.
    Without --sql or --correlation, $Default matches every message. A bad SQL filter exits 2
    with the position of the error, before anything is created.
    """
    rule = default_rule(sql, correlation, params, action)
    options = subscription_options(**_settings(locals()))
    admin = _context.get(ctx).admin()
    props = admin.create_subscription(topic, name, default_rule=rule, **options)
    _print(props, as_json, rules=[rule or RuleProperties(DEFAULT_RULE_NAME, TrueRuleFilter())])


@app.command()
def update(
    ctx: typer.Context,
    topic: Topic,
    name: Name,
    lock_duration: LockDuration = None,
    max_delivery_count: MaxDeliveryCount = None,
    ttl: Ttl = None,
    dead_letter_on_expiration: DeadLetterOnExpiration = None,
    dead_letter_on_filter_errors: DeadLetterOnFilterErrors = None,
    sessions: Sessions = None,
    partitions: Partitions = None,
    status: StatusOpt = None,
    auto_delete_on_idle: AutoDelete = None,
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
    """Change the settings given; the others keep their values (rules: raybus rule)."""
    options = subscription_options(**_settings(locals()))
    admin = _context.get(ctx).admin()
    props = admin.update_subscription(topic, admin.get_subscription(topic, name), **options)
    if wait and "partition_count" in options:
        admin.wait_for_partitions(props.path)
    _print(props, as_json)


@app.command()
def show(ctx: typer.Context, topic: Topic, name: Name, as_json: AsJson = False) -> None:
    """Show a subscription's settings, counters and rules.

    JSON: durations in seconds (null = never), the rules under "rules".
    """
    admin = _context.get(ctx).admin()
    props = admin.get_subscription(topic, name)
    runtime = admin.get_subscription_runtime_properties(topic, name)
    _print(props, as_json, runtime, admin.list_rules(topic, name))


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


_NOT_SETTINGS = frozenset(
    {"ctx", "topic", "name", "as_json", "wait", "sql", "correlation", "params", "action", "rule"}
)


def _settings(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if k not in _NOT_SETTINGS}
