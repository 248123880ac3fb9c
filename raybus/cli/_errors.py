"""Exit codes of the ``raybus`` command and the one place that turns errors into them.

Every command runs inside ``RaybusGroup.invoke``: a raybus error ends the command with ONE line
on stderr (``error: <ClassName>: <message>``, no traceback) and the exit code of its kind, so
scripts can branch on the code and humans read one line. Usage errors (bad options or values)
are click's own, which also exit 2. A ``FilterSyntaxError`` (bad SQL in a rule filter or
action) exits 2 too; its line names the position and shows the text around it.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from ..exceptions import (
    FilterSyntaxError,
    InvalidArgumentError,
    MessageAlreadySettled,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusConnectionError,
    ServiceBusError,
)

__all__ = [
    "BROKER_ERROR",
    "EXIT_CODES_HELP",
    "NOT_FOUND",
    "OK",
    "UNAVAILABLE",
    "USAGE",
    "RaybusGroup",
    "exit_code",
    "fail",
]

OK = 0
BROKER_ERROR = 1
USAGE = 2
NOT_FOUND = 3
UNAVAILABLE = 4

EXIT_CODES_HELP = """\
[b]Exit codes[/b]

  0  ok
  1  broker error: one line on stderr, error: <ClassName>: <message>
  2  usage error: bad options or values (InvalidArgumentError too);
     FilterSyntaxError: bad SQL in a filter or action (the line names
     the position)
  3  not found: MessagingEntityNotFoundError (create the entity first)
  4  timeout or connection: OperationTimeoutError,
     ServiceBusConnectionError (retryable)

[b]Environment[/b]

  RAYBUS_ADDRESS       Ray cluster to join (else RAY_ADDRESS, else a
                       Ray running here, else an embedded one)
  RAYBUS_NAMESPACE     raybus namespace (default: default)
  RAYBUS_STORAGE_PATH  where a new namespace keeps its data
                       (default: ~/.raybus/storage)
  RAYBUS_SAS_TOKEN     a token to present in a namespace with rules
  RAYBUS_KEY_NAME      or a rule's name and key to sign tokens with
  RAYBUS_KEY           (raybus authorization-rule create prints them)
"""


def exit_code(exc: BaseException) -> int:
    """The exit code for an error a command raised (see ``EXIT_CODES_HELP``)."""
    if isinstance(exc, MessagingEntityNotFoundError):
        return NOT_FOUND
    if isinstance(exc, OperationTimeoutError | ServiceBusConnectionError):
        return UNAVAILABLE
    if isinstance(exc, InvalidArgumentError | FilterSyntaxError):
        return USAGE
    return BROKER_ERROR


def error_line(exc: BaseException) -> str:
    """``error: <ClassName>: <message>`` on one line."""
    text = " ".join(str(exc).split()) or type(exc).__doc__ or ""
    line = f"error: {type(exc).__name__}: {text}"
    if isinstance(exc, FilterSyntaxError):
        line += _near(exc.text, exc.position)
    return line


_WINDOW = 30  # characters of SQL shown on each side of a syntax error


def _near(text: Any, position: Any) -> str:
    """`` near: a = >>>= 1``: the SQL around ``position``, ``>>>`` marking it ("" when the
    error has no position)."""
    if not isinstance(text, str) or not isinstance(position, int):
        return ""
    if not 0 <= position <= len(text):
        return ""
    start, end = max(0, position - _WINDOW), min(len(text), position + _WINDOW)
    before = re.sub(r"\s", " ", text[start:position])
    after = re.sub(r"\s", " ", text[position:end])
    return f" near: {'...' if start else ''}{before}>>>{after}{'...' if end < len(text) else ''}"


def fail(message: str, code: int = USAGE) -> NoReturn:
    """End the command with ``error: <message>`` on stderr and ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


class RaybusGroup(TyperGroup):
    """The root command group: maps raybus errors raised by any subcommand to exit codes."""

    def invoke(self, ctx: Any) -> Any:  # typer.Context (typer vendors click)
        try:
            return super().invoke(ctx)
        except (ServiceBusError, MessageAlreadySettled) as exc:
            typer.echo(error_line(exc), err=True)
            raise typer.Exit(exit_code(exc)) from None
