"""``raybus authorization-rule create|list|show|renew|delete``: shared-access rules.

The commands of ``az servicebus namespace authorization-rule`` (and of ``queue`` and ``topic
authorization-rule`` with ``--entity``), over ``ServiceBusAdministrationClient``'s rule calls:

* ``create NAME --rights Send --rights Listen [--entity ORDERS]`` adds or replaces a rule and
  prints its keys and a connection string for each (the namespace's first rule closes it: from
  then on the CLI needs ``RAYBUS_KEY_NAME``/``RAYBUS_KEY`` or ``RAYBUS_SAS_TOKEN`` too);
* ``list`` shows names, rights and entity, never keys; ``show NAME`` shows one rule's keys;
* ``renew NAME --key primary|secondary [--value KEY]`` replaces one key (the other keeps
  working: move clients to it first), as ``az ... keys renew`` does;
* ``delete NAME``: tokens signed with its keys stop working at once.

A rule belongs to the namespace or to one queue or topic (a topic's rules cover its
subscriptions). The connection strings name the namespace as the first label of the endpoint's
host (``sb://NAMESPACE.servicebus.windows.net/``), which is how raybus's clients and the Azure
SDK's read them; an entity rule's carries ``EntityPath``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ..auth import AccessRights, AuthorizationRule
from ..exceptions import InvalidArgumentError, MessagingEntityNotFoundError
from . import _context
from ._options import AsJson
from ._render import json_line

__all__ = ["app", "connection_string", "rule_json"]

app = typer.Typer(
    help="Create, list, show, renew the keys of and delete shared-access rules.",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(help="Rule (key) name.", show_default=False)]
Entity = Annotated[
    str | None,
    typer.Option(
        "--entity",
        "-e",
        metavar="QUEUE|TOPIC",
        help="The queue or topic the rule belongs to (default: the whole namespace).",
        show_default=False,
    ),
]
Rights = Annotated[
    list[str],
    typer.Option(
        "--rights",
        "-r",
        metavar="RIGHT",
        help="Send, Listen or Manage (repeatable, or comma-separated; Manage implies the "
        "other two).",
        show_default=False,
    ),
]
Key = Annotated[
    str,
    typer.Option(
        "--key", metavar="primary|secondary", help="Which key to replace.", show_default=False
    ),
]


def connection_string(namespace: str, rule: AuthorizationRule, key: str) -> str:
    """A connection string for ``rule`` signed with ``key``, in the form raybus's clients and
    the Azure SDK read (the namespace is the first label of the endpoint's host)."""
    text = (
        f"Endpoint=sb://{namespace}.servicebus.windows.net/;"
        f"SharedAccessKeyName={rule.key_name};SharedAccessKey={key}"
    )
    return f"{text};EntityPath={rule.entity}" if rule.entity else text


def _rights(rule: AuthorizationRule) -> list[str]:
    return [r.value for r in AccessRights if r in rule.rights]


def rule_json(rule: AuthorizationRule, namespace: str | None = None) -> dict[str, Any]:
    """The rule as JSON; with ``namespace``, its keys and connection strings too."""
    data: dict[str, Any] = {
        "key_name": rule.key_name,
        "rights": _rights(rule),
        "entity": rule.entity,
    }
    if namespace is not None:
        data |= {
            "primary_key": rule.primary_key,
            "secondary_key": rule.secondary_key,
            "primary_connection_string": connection_string(namespace, rule, rule.primary_key),
            "secondary_connection_string": connection_string(namespace, rule, rule.secondary_key),
        }
    return data


def _print_rule(rule: AuthorizationRule, namespace: str, as_json: bool) -> None:
    data = rule_json(rule, namespace)
    if as_json:
        typer.echo(json_line(data))
        return
    width = max(len(field) for field in data)
    for field, value in data.items():  # plain lines: keys and strings copy whole
        shown = ", ".join(value) if isinstance(value, list) else value
        typer.echo(f"{field:<{width}}  {'(namespace)' if shown is None else shown}")


def _split_rights(rights: list[str]) -> list[str]:
    split = [r.strip() for given in rights for r in given.split(",") if r.strip()]
    if not split:
        raise InvalidArgumentError(
            "give at least one --rights (Send, Listen, Manage)", None, "rights"
        )
    return split


@app.command()
def create(
    ctx: typer.Context,
    name: Name,
    rights: Rights,
    entity: Entity = None,
    primary_key: Annotated[
        str | None,
        typer.Option(
            "--primary-key", help="The primary key (default: generated).", show_default=False
        ),
    ] = None,
    secondary_key: Annotated[
        str | None,
        typer.Option(
            "--secondary-key", help="The secondary key (default: generated).", show_default=False
        ),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Add (or replace) a rule and print its keys and connection strings."""
    wanted = _split_rights(rights)  # before joining Ray: bad input needs no cluster
    cli = _context.get(ctx)
    rule = cli.admin().create_authorization_rule(
        name,
        wanted,
        entity=entity,
        primary_key=primary_key,
        secondary_key=secondary_key,
    )
    _print_rule(rule, cli.namespace, as_json)


@app.command("list")
def list_(ctx: typer.Context, entity: Entity = None, as_json: AsJson = False) -> None:
    """List the rules of the namespace (or of --entity): names, rights, no keys."""
    rules = _context.get(ctx).admin().list_authorization_rules(entity=entity)
    if as_json:
        for rule in rules:
            typer.echo(json_line(rule_json(rule)))
        return
    table = Table("name", "rights", "entity")
    for rule in rules:
        table.add_row(rule.key_name, ", ".join(_rights(rule)), rule.entity or "(namespace)")
    Console().print(table)


@app.command()
def show(ctx: typer.Context, name: Name, entity: Entity = None, as_json: AsJson = False) -> None:
    """Show one rule with its keys and connection strings."""
    cli = _context.get(ctx)
    for rule in cli.admin().list_authorization_rules(entity=entity):
        if rule.key_name == name:
            _print_rule(rule, cli.namespace, as_json)
            return
    where = f"entity {entity!r}" if entity else "the namespace"
    raise MessagingEntityNotFoundError(f"no authorization rule {name!r} on {where}", entity)


@app.command()
def renew(
    ctx: typer.Context,
    name: Name,
    key: Key,
    entity: Entity = None,
    value: Annotated[
        str | None,
        typer.Option("--value", help="The new key (default: generated).", show_default=False),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Replace the rule's primary or secondary key; tokens signed with the other keep working."""
    cli = _context.get(ctx)
    rule = cli.admin().regenerate_authorization_key(name, entity=entity, which=key, key=value)
    _print_rule(rule, cli.namespace, as_json)


@app.command()
def delete(ctx: typer.Context, name: Name, entity: Entity = None) -> None:
    """Delete a rule: tokens signed with its keys stop working at once."""
    _context.get(ctx).admin().delete_authorization_rule(name, entity=entity)
    typer.echo(f"deleted authorization rule {name}", err=True)
