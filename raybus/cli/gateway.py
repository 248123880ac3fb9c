"""``raybus gateway``: serve the namespace over AMQP 1.0, for the azure-servicebus SDK.

The gateway runs in this process (an asyncio server; see ``raybus.amqp``) until Ctrl-C or
``--duration``. It prints the connection string the SDK needs.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

import typer

from . import _context
from ._parse import parse_duration

__all__ = ["gateway"]


async def _serve(
    cli: _context.CliContext, host: str, port: int, duration: float | None, confirm: bool
) -> None:
    from ..amqp import Gateway

    server = Gateway(
        cli.namespace,
        host,
        port,
        address=cli.address,
        storage_path=cli.storage_path,
        confirm_settlements=confirm,
    )
    await server.start()
    typer.echo(f"raybus AMQP gateway for namespace {cli.namespace!r} on {host}:{server.port}")
    typer.echo(
        f"connection string: Endpoint=sb://localhost:{server.port};SharedAccessKeyName=k;"
        "SharedAccessKey=v;UseDevelopmentEmulator=true;"
    )
    try:
        if duration is None:
            await asyncio.Event().wait()
        else:
            await asyncio.sleep(duration)
    finally:
        await server.stop()


def gateway(
    ctx: typer.Context,
    port: Annotated[
        int, typer.Option("--port", "-p", min=0, max=65535, help="TCP port (0: any free one).")
    ] = 5672,
    host: Annotated[
        str,
        typer.Option("--host", help="Interface to listen on (keep 127.0.0.1 unless you mean it)."),
    ] = "127.0.0.1",
    duration: Annotated[
        str | None,
        typer.Option(
            "--duration", help="Stop after this long (e.g. 30s, 5m); default: until Ctrl-C."
        ),
    ] = None,
    confirm_settlements: Annotated[
        bool,
        typer.Option(
            "--confirm-settlements",
            help="Tell the SDK a settlement's outcome only after the broker applied it "
            "(slower; default: the native client's guarantee).",
        ),
    ] = False,
) -> None:
    """Serve the namespace over AMQP 1.0 so the azure-servicebus SDK works against it.

    Messages stay in raybus: a gateway restart loses nothing but locks, which expire.
    """
    seconds = None
    if duration is not None:
        try:
            seconds = parse_duration(duration).total_seconds()
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--duration") from None
    cli = _context.get(ctx)
    cli.join()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(cli, host, port, seconds, confirm_settlements))
