"""A minimal HTTPS server in front of ``raybus.http._atom.handle_management`` for tests.

It listens on 127.0.0.1 on a free port, with the gateway's self-signed certificate, and serves
one raybus namespace through an asyncio admin client (an open namespace: no credential). It
stands in for the full gateway so the management API can be tested with the unmodified Azure
SDK on its own.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from starlette.requests import Request
from starlette.responses import Response

from raybus import aio
from raybus.http._atom import handle_management
from raybus.http._tls import ensure_certificate


@dataclass(frozen=True)
class AtomServer:
    port: int
    certfile: str
    namespace: str

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://127.0.0.1:{self.port}/;SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=unused-in-an-open-namespace"
        )


def _app(namespace: str):  # type: ignore[no-untyped-def]
    admin = aio.ServiceBusAdministrationClient(namespace)

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        raw = scope.get("raw_path") or scope["path"].encode()
        result = await handle_management(
            request.method,
            raw.decode("latin-1").split("?", 1)[0],
            dict(request.query_params),
            dict(request.headers),
            await request.body(),
            admin,
        )
        if result is None:
            response = Response(b"not a management request", status_code=404)
        else:
            status, headers, body = result
            response = Response(body, status_code=status, headers=headers)
        await response(scope, receive, send)

    return app


@contextmanager
def atom_server(namespace: str, cert_dir: str) -> Iterator[AtomServer]:
    """Serve ``namespace`` over HTTPS until the block ends."""
    certfile, keyfile = ensure_certificate(cert_dir)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        _app(namespace),
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        for _ in range(500):
            if server.started:
                break
            threading.Event().wait(0.01)
        yield AtomServer(port, certfile, namespace)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
