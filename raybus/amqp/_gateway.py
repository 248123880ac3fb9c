"""The gateway: an asyncio AMQP 1.0 listener in the driver process, and its raybus clients.

Why a driver-side asyncio server and not a Ray actor: a listener needs a stable host and port
that clients are told about (``Endpoint=sb://localhost:5672``), and an actor could be placed on
any node with any address; the raybus client layer it translates to (``raybus.aio``) is already
asyncio, so a server in the same event loop adds no hop; and the gateway holds no state worth
making fault tolerant: every message lives in the partition actors, and a restarted gateway
loses only locks, which expire. Run several gateways for more capacity.

``start_gateway`` runs the server on its own event-loop thread and returns a handle;
``Gateway`` is the same server for callers that already run an event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .. import aio
from .._client_cache import ClientCache
from .._topic_models import subscription_path
from ..auth import SasTokenCredential, covers, parse_sas_token, resource_path
from ..enums import ServiceBusReceiveMode, ServiceBusSubQueue
from ..exceptions import InvalidArgumentError, ServiceBusError
from ..message import ServiceBusReceivedMessage
from ._connection import AmqpConnection
from ._locks import LockIndex

__all__ = ["Address", "Gateway", "GatewayHandle", "start_gateway"]

_LOG = logging.getLogger("raybus.amqp")
# Clients kept (one per SAS token); the least recently used beyond this are dropped.
_MAX_CLIENTS = 1024


@dataclass(frozen=True)
class Address:
    """A link address, parsed: ``amqps://host/<queue>``, ``<topic>/Subscriptions/<sub>``, with
    ``/$DeadLetterQueue`` and ``/$management`` suffixes."""

    raw: str  # the path, without scheme and host
    entity: str  # the raybus entity path (queue, topic, or topic/Subscriptions/sub)
    topic: str | None = None
    subscription: str | None = None
    sub_queue: ServiceBusSubQueue | None = None
    management: bool = False

    def receiver(self, client: aio.ServiceBusClient, **kwargs: Any) -> aio.ServiceBusReceiver:
        if self.subscription is not None:
            assert self.topic is not None
            return client.get_subscription_receiver(
                self.topic, self.subscription, sub_queue=self.sub_queue, **kwargs
            )
        return client.get_queue_receiver(self.entity, sub_queue=self.sub_queue, **kwargs)


def parse_address(address: str) -> Address:
    """Parse a link address; ``InvalidArgumentError`` names what is wrong with it."""
    split = urllib.parse.urlsplit(address)
    path = split.path if split.scheme else address
    raw = urllib.parse.unquote(path).strip("/")
    parts = [p for p in raw.split("/") if p]
    management = bool(parts) and parts[-1].lower() == "$management"
    if management:
        parts = parts[:-1]
    sub_queue = None
    if parts and parts[-1].lower() == "$deadletterqueue":
        parts = parts[:-1]
        sub_queue = ServiceBusSubQueue.DEAD_LETTER
        if parts and parts[-1].lower() == "$transfer":
            parts = parts[:-1]
            sub_queue = ServiceBusSubQueue.TRANSFER_DEAD_LETTER
    if not parts or any(p.startswith("$") for p in parts):
        raise InvalidArgumentError(f"no entity in link address {address!r}", None, "address")
    if len(parts) == 3 and parts[1].lower() == "subscriptions":
        return Address(
            raw, subscription_path(parts[0], parts[2]), parts[0], parts[2], sub_queue, management
        )
    return Address(raw, "/".join(parts), None, None, sub_queue, management)


class Gateway:
    """The AMQP listener (``await start()``, ``await stop()``) for one raybus namespace."""

    def __init__(
        self,
        namespace: str = "default",
        host: str = "127.0.0.1",
        port: int = 5672,
        *,
        address: str | None = None,
        storage_path: str | None = None,
        confirm_settlements: bool = False,
    ) -> None:
        self.namespace = namespace
        self.confirm_settlements = confirm_settlements
        self.host = host
        self.port = port
        self._ray_address = address
        self._storage_path = storage_path
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[AmqpConnection] = set()
        # Created off the event loop (a client's creation blocks on a Ray lookup), bounded.
        self._clients: ClientCache[aio.ServiceBusClient] = ClientCache(
            self._new_client, _MAX_CLIENTS
        )
        # Per connection: receivers and senders that $management requests not tied to a
        # receiver link use (peek on a plain receiver, schedule on a sender).
        self._mgmt: dict[tuple[str, str, Any], Any] = {}
        # Every lock token delivered, on any connection, with its message's sequence number:
        # $management requests from another connection name the token only (``_locks``).
        self.lock_index = LockIndex()

    parse_address = staticmethod(parse_address)

    async def start(self) -> None:
        # Join Ray now, in this thread (ray.init wants the main thread, where the CLI runs
        # this), before anything is served: blocking the loop does no harm yet.
        self._clients.add(None, self._new_client(None))
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        _LOG.info(
            "raybus AMQP gateway for namespace %r on %s:%s", self.namespace, self.host, self.port
        )

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def stop(self) -> None:
        """Stop listening and close every connection (their locks run out in raybus)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.fail("amqp:connection:forced", "the gateway is stopping")
        for _ in range(100):
            if not self._connections:
                break
            await asyncio.sleep(0.05)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = AmqpConnection(self, reader, writer)
        self._connections.add(conn)
        await conn.run()

    def forget(self, conn: AmqpConnection) -> None:
        self._connections.discard(conn)
        for key in [k for k in self._mgmt if k[0] == conn.id]:
            receiver = self._mgmt.pop(key)
            if isinstance(receiver, _PeekPages):
                receiver = receiver.receiver
            if isinstance(receiver, aio.ServiceBusReceiver):
                asyncio.get_running_loop().create_task(_quietly(receiver.close()))

    # ------------------------------------------------------------------ clients

    def _new_client(self, credential: SasTokenCredential | None) -> aio.ServiceBusClient:
        return aio.ServiceBusClient(
            self.namespace,
            address=self._ray_address,
            storage_path=self._storage_path,
            credential=credential,
        )

    async def _client(self, token: str | None) -> aio.ServiceBusClient:
        if token not in self._clients:
            self._forget_expired()
        return await self._clients.get(token)

    def _forget_expired(self) -> None:
        """Drop the clients of expired tokens: the SDK puts a fresh token on every connection
        and renews it, so without this the cache would fill with dead tokens' clients (the
        links still using a dropped client keep their own reference)."""
        now = time.time()

        def expired(token: str | None) -> bool:
            if token is None:
                return False
            try:
                return parse_sas_token(token).expiry <= now
            except ServiceBusError:
                return True

        self._clients.discard_where(expired)

    async def client_for(self, conn: AmqpConnection, entity: str) -> aio.ServiceBusClient:
        """The raybus client for ``entity`` on ``conn``: the one holding the token put for the
        most specific audience that covers the entity, else one without credentials (which an
        open namespace accepts and a closed one refuses with ServiceBusAuthenticationError)."""
        path = resource_path(entity)
        best: tuple[int, str] | None = None
        for audience, token in conn.tokens.items():
            scope = resource_path(audience)
            if covers(scope, path) and (best is None or len(scope) > best[0]):
                best = (len(scope), token)
        return await self._client(None if best is None else best[1])

    async def check_entity(self, client: aio.ServiceBusClient, address: Address) -> int:
        """Resolve the entity now (``MessagingEntityNotFoundError`` at attach, as Service Bus
        does); returns its max message size."""
        info = await client.resolve_entity(address.entity)
        return info.max_message_size_in_bytes

    async def management_receiver(
        self, conn: AmqpConnection, node: str, mode: ServiceBusReceiveMode | None = None
    ) -> aio.ServiceBusReceiver:
        address = parse_address(node)
        key = (conn.id, address.raw.lower(), mode)
        receiver = self._mgmt.get(key)
        if receiver is None:
            client = await self.client_for(conn, address.entity)
            receiver = address.receiver(
                client, receive_mode=mode or ServiceBusReceiveMode.PEEK_LOCK
            )
            self._mgmt[key] = receiver
        return receiver

    async def peek_pages(
        self, conn: AmqpConnection, node: str, start: int, count: int
    ) -> list[ServiceBusReceivedMessage] | None:
        """The SDK's paging through peeks, over every partition. The SDK asks from sequence
        number 1, then from one past the last number it was shown; a partitioned entity's
        numbers carry their partition in the top bits, and a peek from an explicit number
        stays in that partition, so paging by numbers saw one partition's messages only. A
        peek from 1 starts a receiver kept for this connection and entity, and a peek from
        one past its last page's last number goes on with its cursors, which page through
        every partition. None when ``start`` does neither (an explicit number: the caller
        peeks from it)."""
        address = parse_address(node)
        key = (conn.id, address.raw.lower(), "peek")
        pages = self._mgmt.get(key)
        if start <= 1:
            if pages is not None:
                await _quietly(pages.receiver.close())
            client = await self.client_for(conn, address.entity)
            pages = self._mgmt[key] = _PeekPages(address.receiver(client))
        elif pages is None or start != pages.next:
            return None
        peeked = await pages.receiver.peek_messages(count)
        if peeked:
            pages.next = peeked[-1].sequence_number + 1
        return peeked

    async def management_sender(self, conn: AmqpConnection, node: str) -> aio.ServiceBusSender:
        address = parse_address(node)
        if address.subscription is not None or address.sub_queue is not None:
            raise InvalidArgumentError(f"cannot schedule on {node!r}", address.entity, "address")
        key = (conn.id, address.raw.lower(), "sender")
        sender = self._mgmt.get(key)
        if sender is None:
            client = await self.client_for(conn, address.entity)
            sender = client.get_queue_sender(address.entity)
            self._mgmt[key] = sender
        return sender


class _PeekPages:
    """A connection's paging through one entity's messages by peeks (``peek_pages``)."""

    def __init__(self, receiver: aio.ServiceBusReceiver) -> None:
        self.receiver = receiver
        self.next = 0  # the number the SDK asks from to go on: one past the last shown


async def _quietly(coro: Any) -> None:
    with contextlib.suppress(ServiceBusError, ValueError):
        await coro


class GatewayHandle:
    """A gateway running on its own event-loop thread (``start_gateway``)."""

    def __init__(
        self, gateway: Gateway, loop: asyncio.AbstractEventLoop, thread: threading.Thread
    ) -> None:
        self._gateway = gateway
        self._loop = loop
        self._thread = thread

    @property
    def port(self) -> int:
        return self._gateway.port

    @property
    def host(self) -> str:
        return self._gateway.host

    @property
    def connection_string(self) -> str:
        """An azure-servicebus connection string for this gateway (development-emulator mode:
        plain AMQP, no TLS; the key is only used to sign tokens)."""
        return (
            f"Endpoint=sb://localhost:{self.port};SharedAccessKeyName=k;SharedAccessKey=v;"
            "UseDevelopmentEmulator=true;"
        )

    def stop(self) -> None:
        """Stop the gateway and its thread (idempotent)."""
        if not self._thread.is_alive():
            return
        fut = asyncio.run_coroutine_threadsafe(self._gateway.stop(), self._loop)
        with contextlib.suppress(Exception):
            fut.result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> GatewayHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_gateway(
    namespace: str = "default",
    host: str = "127.0.0.1",
    port: int = 5672,
    *,
    address: str | None = None,
    storage_path: str | None = None,
    confirm_settlements: bool = False,
) -> GatewayHandle:
    """Start an AMQP 1.0 gateway for ``namespace`` on ``host:port`` (port 0: any free port)
    in a background thread; returns once it listens. ``address``/``storage_path`` are passed to
    ``raybus.aio.ServiceBusClient``; ``confirm_settlements`` makes every disposition wait for
    the partition's answer before the SDK hears the outcome (see ``_links.settle``)."""
    gateway = Gateway(
        namespace,
        host,
        port,
        address=address,
        storage_path=storage_path,
        confirm_settlements=confirm_settlements,
    )
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(gateway.start())
        except BaseException as exc:  # reported to the caller below
            failure.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()
        with contextlib.suppress(Exception):
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

    thread = threading.Thread(target=run, name=f"raybus-amqp-{port}", daemon=True)
    thread.start()
    ready.wait()
    if failure:
        raise failure[0]
    return GatewayHandle(gateway, loop, thread)
