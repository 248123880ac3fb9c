"""What every command shares: the global options, and clients created on first use.

Nothing here joins Ray until a command asks for a client, so ``raybus --help`` (and importing
``raybus.cli``) never starts Ray.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray
import typer

from ..exceptions import ServiceBusConnectionError

if TYPE_CHECKING:
    from .._sync_client import ServiceBusClient
    from ..management import ServiceBusAdministrationClient

__all__ = ["PROBE_TIMEOUT_S", "CliContext", "get"]

# How long to wait for the cluster's GCS port to answer before reporting it unreachable: Ray
# itself retries an unreachable address for minutes.
PROBE_TIMEOUT_S = 5.0


@dataclass
class CliContext:
    """The global options (``--address``, ``--namespace``, ``--storage-path``) and the clients
    built from them (one of each per command, closed when the command ends)."""

    address: str | None = None
    namespace: str = "default"
    storage_path: str | None = None
    _client: ServiceBusClient | None = field(default=None, repr=False)
    _admin: ServiceBusAdministrationClient | None = field(default=None, repr=False)

    def join(self) -> None:
        """Prepare to join Ray: loopback only and no usage stats when the Ray is embedded or
        on 127.0.0.1 (unless the environment says otherwise), and fail fast if an explicit
        address is unreachable."""
        if ray.is_initialized():
            return
        address = self.address or os.environ.get("RAYBUS_ADDRESS") or os.environ.get("RAY_ADDRESS")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if is_loopback(address):
            prefer_loopback()
        probe(address)

    def credential(self) -> Any:
        """A token from ``RAYBUS_SAS_TOKEN``, or a key from ``RAYBUS_KEY_NAME`` and
        ``RAYBUS_KEY``, for namespaces with access rules (None: present nothing)."""
        from ..auth import SasTokenCredential, SharedAccessKeyCredential

        token = os.environ.get("RAYBUS_SAS_TOKEN")
        if token:
            return SasTokenCredential(token)
        name, key = os.environ.get("RAYBUS_KEY_NAME"), os.environ.get("RAYBUS_KEY")
        if name and key:
            return SharedAccessKeyCredential(name, key)
        return None

    def client(self) -> ServiceBusClient:
        if self._client is None:
            from .._sync_client import ServiceBusClient

            self.join()
            self._client = ServiceBusClient(
                self.namespace,
                address=self.address,
                storage_path=self.storage_path,
                credential=self.credential(),
            )
        return self._client

    def admin(self) -> ServiceBusAdministrationClient:
        if self._admin is None:
            from ..management import ServiceBusAdministrationClient

            self.join()
            self._admin = ServiceBusAdministrationClient(
                self.namespace,
                address=self.address,
                storage_path=self.storage_path,
                credential=self.credential(),
            )
        return self._admin

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()


def _host_port(address: str) -> tuple[str, int] | None:
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def is_loopback(address: str | None) -> bool:
    """Whether ``address`` means this machine only: none (embedded or already running
    here), ``auto``/``local``, or a loopback host."""
    if not address or address in ("auto", "local"):
        return True
    hp = _host_port(address)
    return hp is not None and (hp[0] == "localhost" or hp[0].startswith("127.") or hp[0] == "::1")


def prefer_loopback() -> None:
    """Keep Ray on 127.0.0.1, unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is already set.

    Ray reads that variable once, when ``ray`` is imported, which ``import raybus`` has
    already done; so besides the environment (inherited by the Ray processes an embedded
    start spawns) the constant Ray computed from it is set too. Without it, Ray rewrites a
    ``127.0.0.1`` address into the machine's external IP and an embedded Ray listens there.
    """
    if "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" in os.environ:
        return
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def probe(address: str | None, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise ``ServiceBusConnectionError`` if ``address`` (``host:port`` or
    ``ray://host:port``) does not accept a TCP connection within ``timeout`` seconds.
    ``None``, ``auto`` and ``local`` are left to Ray."""
    if not address or address in ("auto", "local"):
        return
    hp = _host_port(address)
    if hp is None:
        return  # not host:port; let Ray judge it
    try:
        with socket.create_connection(hp, timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ServiceBusConnectionError(
            f"cannot reach the Ray cluster at {address}: {reason}"
        ) from None


def get(ctx: typer.Context) -> CliContext:
    """The ``CliContext`` of the running command (set by the root callback)."""
    obj: Any = ctx.find_object(CliContext)
    if obj is None:  # a command invoked without the root group (tests of one command)
        obj = ctx.ensure_object(CliContext)
    result: CliContext = obj
    return result
