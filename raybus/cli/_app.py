"""The ``raybus`` command tree: global options, and where each group and command lives.

Groups are small modules: ``queue``, ``topic``, ``subscription``, ``rule``,
``authorization_rule``, ``dlq``, ``messages`` (send, receive, peek), ``stats`` and ``demo``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from . import (
    _context,
    authorization_rule,
    demo,
    dlq,
    gateway,
    http,
    messages,
    queue,
    rule,
    stats,
    subscription,
    topic,
)
from ._errors import EXIT_CODES_HELP, RaybusGroup

__all__ = ["app"]

app = typer.Typer(
    name="raybus",
    cls=RaybusGroup,
    help="raybus: a message broker with Azure Service Bus semantics on Ray actors.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["--help", "-h"]},
)


@app.callback()
def main(
    ctx: typer.Context,
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            envvar="RAYBUS_ADDRESS",
            help="Ray cluster to join (host:port or ray://host:port); default RAY_ADDRESS, "
            "else a Ray running here, else an embedded one on 127.0.0.1.",
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[
        str,
        typer.Option("--namespace", "-n", envvar="RAYBUS_NAMESPACE", help="raybus namespace."),
    ] = "default",
    storage_path: Annotated[
        str | None,
        typer.Option(
            "--storage-path",
            envvar="RAYBUS_STORAGE_PATH",
            help="Where a new namespace keeps its data (directory or s3://, gs://, ... URI; "
            "memory:// for none); default ~/.raybus/storage.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """raybus: a message broker with Azure Service Bus semantics on Ray actors."""
    cli = _context.CliContext(address=address, namespace=namespace, storage_path=storage_path)
    ctx.obj = cli
    ctx.call_on_close(cli.close)


app.add_typer(queue.app, name="queue")
app.add_typer(topic.app, name="topic")
app.add_typer(subscription.app, name="subscription")
app.add_typer(rule.app, name="rule")
app.add_typer(authorization_rule.app, name="authorization-rule")
app.command("send")(messages.send)
app.command("receive")(messages.receive)
app.command("peek")(messages.peek)
app.command("purge")(messages.purge)
app.add_typer(dlq.app, name="dlq")
app.command("stats")(stats.stats)
app.command("demo")(demo.demo)
app.command("gateway")(gateway.gateway)
app.command("http")(http.http)
