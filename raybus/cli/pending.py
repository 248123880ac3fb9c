"""Command groups the CLI does not implement yet: ``topic``, ``subscription``, ``rule``.

The broker has these entities (``ServiceBusAdministrationClient.create_topic``,
``create_subscription``, ``create_rule``, ``ServiceBusClient.get_topic_sender``, ...); the
command line does not manage them yet. The groups exist so the command tree has its final
shape (scripts and ``--help`` show where these commands will be) and so using one fails
clearly: one line on stderr and exit code 2 (``--help`` works and exits 0). Replace each group
with a real module (like ``queue``).
"""

from __future__ import annotations

import typer

from ._errors import USAGE, fail

__all__ = ["GROUPS", "pending_group"]

# (group name, entity, plural)
GROUPS = (
    ("topic", "topics", "Create, show, list, update and delete topics"),
    ("subscription", "subscriptions", "Manage the subscriptions of a topic"),
    ("rule", "rules", "Manage the rules (filters and actions) of a subscription"),
)
_VERBS = ("create", "show", "list", "update", "delete")
_ANY_ARGS = {"ignore_unknown_options": True, "allow_extra_args": True}


def pending_group(name: str, plural: str, summary: str) -> typer.Typer:
    """A group whose every use exits 2 with "not available yet"."""
    help_text = f"{summary} (not available in the CLI yet: exits with code 2)."
    group = typer.Typer(help=help_text, invoke_without_command=True)

    def unavailable() -> None:
        fail(
            f"{plural} are not available yet in the raybus CLI (it manages queues only); "
            f"use the Python API (raybus.management.ServiceBusAdministrationClient)",
            USAGE,
        )

    @group.callback()
    def _group(ctx: typer.Context) -> None:
        if ctx.invoked_subcommand is None and not ctx.resilient_parsing:
            unavailable()

    for verb in _VERBS:
        # Any arguments are accepted so that every use gets the same clear error (and
        # "--help" still works on each command).
        def command(ctx: typer.Context) -> None:
            unavailable()

        command.__doc__ = f"{verb.capitalize()} {plural} (not available in the CLI yet)."
        group.command(verb, context_settings=_ANY_ARGS)(command)
    return group
