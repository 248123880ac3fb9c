"""The HTTP gateway as a Ray Serve application: one ingress deployment, autoscaled.

Shape:

* **One deployment, ``HttpGateway``**, whose ``__call__`` takes every request (Starlette
  ``Request`` in, ``Response`` out). Its handlers are coroutines on the replica's event loop
  and wait on the broker with ``await`` (Ray object refs), so a long-poll receive holds no
  thread: one replica carries up to ``max_ongoing_requests`` waiting receives at once.
* **Autoscaling** on ongoing requests (``target_ongoing_requests`` per replica, between
  ``min_replicas`` and ``max_replicas``); replicas ask for ``num_cpus=0`` by default (they
  mostly wait on the broker's actors, which hold the real work).
* **The same client layer as Python users**: each replica keeps a bounded LRU of
  ``raybus.aio.ServiceBusClient`` (and admin clients) keyed by the caller's SAS token; a
  request runs through the client of its token (``raybus.http._sas``).
* **Bounded input**: a body larger than ``max_request_bytes`` is refused with 413 before it
  is read in full; Serve's proxy (uvicorn) bounds header sizes.
* **Management** (ATOM) requests — any path that is not a runtime path — go to
  ``raybus.http._atom.handle_management`` with an admin client of the caller's credential.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ray import serve
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response as StarletteResponse

from .._client_cache import ClientCache
from ..aio import ServiceBusAdministrationClient, ServiceBusClient
from ..exceptions import ServiceBusError
from ._runtime import (
    Response,
    error_response,
    handle_runtime,
    match_runtime,
    response_for_error,
)
from ._sas import credential_from_header
from ._wire import HttpError

__all__ = ["GatewaySettings", "HttpGateway"]

log = logging.getLogger("raybus.http")


@dataclass(frozen=True)
class GatewaySettings:
    """The gateway's limits and scaling (validated; defaults suit a laptop).

    ``max_request_bytes``: largest request body (Service Bus: 1 MB over HTTP, batches too).
    ``max_receive_timeout_s``: the cap on a receive's ``timeout`` (long poll).
    ``client_cache_size``: clients (distinct SAS tokens) kept per replica.
    ``access_log``: Serve's log line per request (off by default: it costs the replica and
    the proxy CPU on every request, and message traffic is counted by raybus's metrics).
    """

    max_request_bytes: int = 1024 * 1024
    max_receive_timeout_s: float = 60.0
    client_cache_size: int = 256
    min_replicas: int = 1
    max_replicas: int = 4
    target_ongoing_requests: int = 32
    max_ongoing_requests: int = 1000
    upscale_delay_s: float | None = None  # None: Serve's default (30 s)
    downscale_delay_s: float | None = None  # None: Serve's default (600 s)
    num_cpus: float = 0.0
    access_log: bool = False

    def __post_init__(self) -> None:
        checks = (
            (self.max_request_bytes >= 1024, "max_request_bytes must be at least 1024"),
            (self.max_receive_timeout_s > 0, "max_receive_timeout_s must be positive"),
            (self.client_cache_size >= 1, "client_cache_size must be at least 1"),
            (1 <= self.min_replicas <= self.max_replicas, "need 1 <= min_replicas <= max"),
            (self.target_ongoing_requests >= 1, "target_ongoing_requests must be >= 1"),
            (
                self.max_ongoing_requests >= self.target_ongoing_requests,
                "max_ongoing_requests must be >= target_ongoing_requests",
            ),
            (self.num_cpus >= 0, "num_cpus must be >= 0"),
            (self.upscale_delay_s is None or self.upscale_delay_s >= 0, "bad upscale_delay_s"),
            (
                self.downscale_delay_s is None or self.downscale_delay_s >= 0,
                "bad downscale_delay_s",
            ),
        )
        for ok, why in checks:
            if not ok:
                raise ValueError(why)

    def deployment_options(self) -> dict[str, Any]:
        autoscaling: dict[str, Any] = {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
        }
        for key in ("upscale_delay_s", "downscale_delay_s"):
            if getattr(self, key) is not None:
                autoscaling[key] = getattr(self, key)
        return {
            "autoscaling_config": autoscaling,
            "max_ongoing_requests": self.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": self.num_cpus},
            "logging_config": {"enable_access_log": self.access_log},
        }


Management = Callable[..., Any]


def _load_management() -> Management | None:
    """The ATOM handler (``raybus.http._atom``), imported on first use; None (then 501) if
    it cannot be imported, so the runtime API never depends on it."""
    try:
        from ._atom import handle_management
    except ImportError:
        log.warning("raybus.http: the management API is unavailable", exc_info=True)
        return None
    return handle_management


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise HttpError(400, "Content-Length is not a number")
        if int(declared) > limit:
            raise HttpError(413, f"the request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"the request body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class HttpGateway:
    """The Serve ingress: parse, authenticate, dispatch, answer. See the module docstring."""

    def __init__(
        self,
        namespace: str,
        storage_path: str | None = None,
        settings: GatewaySettings | None = None,
    ) -> None:
        self._namespace = namespace
        self._settings = settings or GatewaySettings()
        size = self._settings.client_cache_size
        self._clients: ClientCache[ServiceBusClient] = ClientCache(
            lambda cred: ServiceBusClient(namespace, storage_path=storage_path, credential=cred),
            size,
        )
        self._admins: ClientCache[ServiceBusAdministrationClient] = ClientCache(
            lambda cred: ServiceBusAdministrationClient(
                namespace, storage_path=storage_path, credential=cred
            ),
            size,
        )
        self._management: Management | None = None

    async def __call__(self, request: Request) -> StarletteResponse:
        try:
            status, headers, body = await self._serve(request)
        except ClientDisconnect:
            status, headers, body = error_response(400, "the client disconnected")
        except Exception:  # a bug: logged, answered without internals
            log.exception(
                "raybus.http: unexpected error serving %s %s", request.method, request.url.path
            )
            status, headers, body = error_response(500, "internal error")
        return StarletteResponse(body, status_code=status, headers=headers)

    async def _serve(self, request: Request) -> Response:
        # The raw path: segments are unquoted once, after splitting (an entity name or lock
        # token may hold an escaped '/' or '%').
        raw = request.scope.get("raw_path") or request.scope["path"].encode()
        path = raw.decode("latin-1").split("?", 1)[0]
        root = request.scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        try:
            route = match_runtime(request.method, path)
            token = credential_from_header(request.headers.get("authorization"))
            body = await _read_body(request, self._settings.max_request_bytes)
        except (HttpError, ServiceBusError) as exc:
            return response_for_error(exc)
        query = dict(urllib.parse.parse_qsl(request.url.query, keep_blank_values=True))
        if route is None:
            return await self._manage(request.method, path, query, request, body, token)
        base_url = str(request.base_url).rstrip("/")
        return await handle_runtime(
            await self._clients.get(token),
            route,
            query=query,
            headers=list(request.headers.items()),
            body=body,
            base_url=base_url,
            max_receive_timeout_s=self._settings.max_receive_timeout_s,
        )

    async def _manage(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        request: Request,
        body: bytes,
        token: str | None,
    ) -> Response:
        if self._management is None:
            self._management = _load_management()
        if self._management is None:
            return error_response(501, "the management (ATOM) API is not available yet")
        try:
            result: Response | None = await self._management(
                method, path, query, dict(request.headers), body, await self._admins.get(token)
            )
        except ServiceBusError as exc:
            return response_for_error(exc)
        if result is None:
            return error_response(404, f"no such endpoint: {method} {path}")
        return result


# The Serve deployment; options (autoscaling, CPUs) are set per application in start().
HttpGatewayDeployment = serve.deployment(name="raybus-http")(HttpGateway)
