"""``raybus http``: serve the namespace over HTTP (Service Bus REST runtime + ATOM management)
on Ray Serve until interrupted.

The gateway is a Serve application in the Ray cluster the CLI joins; it stops when the command
ends (Ctrl-C or SIGTERM). With an embedded Ray (no cluster running) the broker stops with it
too, so for anything but a try-out run a cluster first (``cluster/local.sh``).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Annotated, Any

import typer
from rich.console import Console

from . import _context
from ._errors import fail

__all__ = ["http"]


def http(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on.")] = 8080,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to listen on; the default serves this machine only. Anything else "
            "exposes the broker to the network: use --tls and authorization rules.",
        ),
    ] = "127.0.0.1",
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="HTTPS with a self-signed certificate for localhost (made once, in "
            "RAYBUS_TLS_DIR or ~/.raybus/tls), unless --cert/--key are given.",
        ),
    ] = False,
    cert: Annotated[
        str | None, typer.Option("--cert", help="TLS certificate file (PEM).", show_default=False)
    ] = None,
    key: Annotated[
        str | None, typer.Option("--key", help="TLS private key file (PEM).", show_default=False)
    ] = None,
    max_replicas: Annotated[
        int, typer.Option("--max-replicas", help="Most gateway replicas autoscaling may start.")
    ] = 4,
) -> None:
    """Serve the namespace over HTTP until interrupted (Service Bus REST API on Ray Serve)."""
    if (cert is None) != (key is None):
        fail("give both --cert and --key, or neither")
    if not 0 < port < 65536:
        fail(f"--port must be 1-65535, not {port}")
    if max_replicas < 1:
        fail("--max-replicas must be at least 1")
    import raybus.http

    cli = _context.get(ctx)
    cli.join()
    files: Any = (cert, key) if cert is not None else (True if tls else None)
    url = raybus.http.start_http_gateway(
        cli.namespace,
        host=host,
        port=port,
        tls=files,
        address=cli.address,
        storage_path=cli.storage_path,
        max_replicas=max_replicas,
    )
    out = Console(highlight=False, stderr=True)
    out.print(f"raybus HTTP gateway for namespace [b]{cli.namespace}[/b] at [b]{url}[/b]")
    if files is True:
        from ..http._tls import CERT_FILE

        certfile = os.path.join(raybus.http.default_tls_directory(), CERT_FILE)
        out.print(f"self-signed certificate: {certfile} (curl --cacert {certfile})")
    out.print("Ctrl-C to stop")
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        raybus.http.stop_http_gateway(cli.namespace)
        out.print("stopped")
