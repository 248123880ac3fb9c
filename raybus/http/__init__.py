"""HTTP access to raybus: the Service Bus REST runtime API (and the ATOM management API) on
Ray Serve.

```python
import raybus.http
url = raybus.http.start_http_gateway("my-namespace", port=8080)   # "http://127.0.0.1:8080"
# curl -X POST "$url/orders/messages" -H 'BrokerProperties: {"MessageId":"o-1"}' -d 'order 1'
raybus.http.stop_http_gateway("my-namespace")
```

Webhooks, shell scripts and services in other languages speak HTTP; the gateway runs their
requests through the same ``raybus.aio`` client Python users have, in a Serve deployment that
scales its replicas with the number of requests in flight. Routes, headers and status codes:
``raybus.http._runtime`` and ``raybus.http._wire``.

Access control: a request carries ``Authorization: SharedAccessSignature sr=..&sig=..&se=..
&skn=..``; the gateway refuses a malformed or expired token (401) and the broker checks the
signature and the rule's rights (401 too, as Service Bus answers a token without the right).
A namespace without authorization rules is open: requests without the header are then served.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from ._app import GatewaySettings

__all__ = [
    "GatewaySettings",
    "app_name",
    "default_tls_directory",
    "start_http_gateway",
    "stop_http_gateway",
]


def app_name(namespace: str) -> str:
    """The Serve application name of a namespace's gateway."""
    return f"raybus-http-{namespace}"


def default_tls_directory() -> str:
    """Where ``tls=True`` keeps its self-signed certificate: ``RAYBUS_TLS_DIR``, else
    ``~/.raybus/tls``."""
    return os.environ.get("RAYBUS_TLS_DIR") or os.path.join(
        os.path.expanduser("~"), ".raybus", "tls"
    )


def _tls_files(tls: Any) -> tuple[str, str] | None:
    """(certfile, keyfile): given, or a self-signed pair for localhost when ``tls=True``
    (reused while valid; see ``raybus.http._tls``)."""
    if tls is None or tls is False:
        return None
    if tls is True:
        from ._tls import ensure_certificate

        return ensure_certificate(default_tls_directory())
    if isinstance(tls, tuple | list) and len(tls) == 2 and all(isinstance(p, str) for p in tls):
        return str(tls[0]), str(tls[1])
    raise ValueError("tls must be None, True (self-signed) or (certfile, keyfile)")


def start_http_gateway(
    namespace: str = "default",
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    tls: bool | tuple[str, str] | None = None,
    address: str | None = None,
    storage_path: str | None = None,
    route_prefix: str = "/",
    settings: GatewaySettings | None = None,
    **setting_overrides: Any,
) -> str:
    """Serve ``namespace`` over HTTP on Ray Serve; returns the base URL.

    Joins Ray like ``raybus.connect`` (``address``), starts Serve's HTTP proxy on
    ``host:port`` (127.0.0.1 by default: reachable from this machine only) with TLS when
    ``tls`` is ``(certfile, keyfile)`` or ``True`` (a self-signed certificate for localhost),
    and deploys the gateway as the Serve application ``raybus-http-<namespace>`` at
    ``route_prefix``. Blocks until a replica is ready and the proxy listens (on a loaded
    machine Serve may restart a slow proxy: ``_start_serve``). ``settings`` (or keyword overrides
    such as ``max_replicas=8``) set limits and scaling (see ``GatewaySettings``).

    Serve's HTTP options are per Ray cluster and fixed by whoever starts Serve first: if
    Serve already runs, its host, port and TLS stay as they are.
    """
    from ray import serve

    from .._connection import ensure_ray
    from ._app import HttpGatewayDeployment

    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be 1-65535, not {port!r}")
    if not route_prefix.startswith("/"):
        raise ValueError("route_prefix must start with '/'")
    settings = replace(settings or GatewaySettings(), **setting_overrides)
    files = _tls_files(tls)
    ensure_ray(address)
    http_options: dict[str, Any] = {"host": host, "port": port}
    if files is not None:
        http_options.update(ssl_certfile=files[0], ssl_keyfile=files[1])
    proxy_restarted = _start_serve(serve, http_options, {"enable_access_log": settings.access_log})
    app = HttpGatewayDeployment.options(**settings.deployment_options()).bind(
        namespace, storage_path, settings
    )
    serve.run(app, name=app_name(namespace), route_prefix=route_prefix)
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    if proxy_restarted:
        _wait_listening(shown, port, PROXY_START_TIMEOUT_S)
    scheme = "https" if files is not None else "http"
    if ":" in shown:
        shown = f"[{shown}]"
    return f"{scheme}://{shown}:{port}{route_prefix.rstrip('/')}"


# How long ``start_http_gateway`` waits for Serve's second proxy when the first did not start
# in time (``_start_serve``).
PROXY_START_TIMEOUT_S = 120.0


def _start_serve(serve: Any, http_options: dict[str, Any], logging_config: dict[str, Any]) -> bool:
    """``serve.start``, surviving a proxy that starts slowly; True when the proxy was restarted
    (the caller then waits for its port: ``_wait_listening``).

    Serve's controller kills a proxy that is not ready within its ready check (5 s by default,
    ``RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S``) and starts another with a longer check, but
    ``serve.start`` waits on the first one and raises ``ActorDiedError``. On a loaded machine a
    proxy's start takes longer than 5 s (here: each start in a fresh Ray session, on 2 cores
    shared with two busy processes). The controller it started is still running, so a second
    ``serve.start`` connects to it (with the same options) and returns at once.
    """
    import ray

    try:
        serve.start(http_options=http_options, logging_config=logging_config)
        return False
    except ray.exceptions.ActorDiedError:
        serve.start(http_options=http_options, logging_config=logging_config)
        return True


def _wait_listening(host: str, port: int, timeout_s: float) -> None:
    """Return once ``host:port`` accepts a connection; ``TimeoutError`` naming it after
    ``timeout_s``."""
    import socket
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"Serve's HTTP proxy is not listening on {host}:{port} after {timeout_s} s"
                ) from None
            time.sleep(0.2)


def stop_http_gateway(namespace: str = "default", *, shutdown_serve: bool | None = None) -> None:
    """Remove the namespace's gateway application. Serve itself (its proxy, which holds the
    port) is shut down too when no other application is left, or when ``shutdown_serve``."""
    from ray import serve

    try:
        serve.delete(app_name(namespace))
    except Exception:  # not deployed (or Serve not running): nothing to remove
        pass
    if shutdown_serve is None:
        try:
            shutdown_serve = not serve.status().applications
        except Exception:
            shutdown_serve = True
    if shutdown_serve:
        serve.shutdown()  # type: ignore[no-untyped-call]
