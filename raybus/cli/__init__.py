"""The ``raybus`` command line (typer + rich): queues, topics, subscriptions, rules, messages,
dead letters, live stats.

``raybus --help`` lists the commands, global options and exit codes. Importing this package
does not start or join Ray; each command joins Ray when it first needs the broker.
"""

from __future__ import annotations

from ._app import app
from ._errors import BROKER_ERROR, NOT_FOUND, OK, UNAVAILABLE, USAGE, exit_code

__all__ = ["BROKER_ERROR", "NOT_FOUND", "OK", "UNAVAILABLE", "USAGE", "app", "exit_code", "main"]


def main() -> None:
    """Run the command line (``python -m raybus.cli``)."""
    app()
