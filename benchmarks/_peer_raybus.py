"""raybus as a system of the suite: durable or express queues, topics, peek-lock + complete
or receive-and-delete, through the public API only (``raybus.aio`` in the workers, the sync
administration client in the main process)."""

from __future__ import annotations

import itertools
from typing import Any

from _common import BenchError

import raybus
import raybus.aio
from raybus import ServiceBusMessage, ServiceBusReceiveMode
from raybus.management import ServiceBusAdministrationClient

_names = itertools.count(1)


class Admin:
    """Creates each cell's entities in one namespace whose storage is the suite's temporary
    directory (durable: a send is answered once it is in the log; express: at once)."""

    def __init__(self, namespace: str, storage: str) -> None:
        self.namespace, self.storage = namespace, storage
        self.admin = ServiceBusAdministrationClient(namespace, storage_path=storage)

    def setup(self, topology: dict[str, Any], system: dict[str, Any]) -> dict[str, Any]:
        name = f"{topology['kind']}{next(_names)}"
        target = {"namespace": self.namespace, "storage": self.storage, "name": name}
        if topology["kind"] == "queue":
            self.admin.create_queue(name, enable_express=bool(system.get("express")))
            return {**target, "subscriptions": []}
        if system.get("express"):
            raise BenchError("raybus topics have no express option")
        self.admin.create_topic(name)
        subs = [f"s{k}" for k in range(topology["subscriptions"])]
        for s in subs:
            self.admin.create_subscription(name, s)
        return {**target, "subscriptions": subs}

    def check_empty(self, target: dict[str, Any]) -> None:
        if not target["subscriptions"]:
            props = [self.admin.get_queue_runtime_properties(target["name"])]
        else:
            props = [
                self.admin.get_subscription_runtime_properties(target["name"], s)
                for s in target["subscriptions"]
            ]
        left = sum(p.active_message_count + p.dead_letter_message_count for p in props)
        if left:
            raise BenchError(f"raybus {target['name']}: {left} messages left after the run")

    def teardown(self, target: dict[str, Any]) -> None:
        if target["subscriptions"]:
            self.admin.delete_topic(target["name"])
        else:
            self.admin.delete_queue(target["name"])

    def close(self) -> None:
        self.admin.close()


_clients: dict[str, raybus.aio.ServiceBusClient] = {}


def _client(target: dict[str, Any]) -> raybus.aio.ServiceBusClient:
    """One client per namespace and worker process: concurrent tasks share it (and its
    coalescer), as an application's tasks would."""
    ns = target["namespace"]
    if ns not in _clients:
        _clients[ns] = raybus.aio.ServiceBusClient(ns, storage_path=target["storage"])
    return _clients[ns]


class Sender:
    def __init__(
        self, target: dict[str, Any], source: int, system: dict[str, Any], cfg: dict[str, Any]
    ) -> None:
        c = _client(target)
        name = target["name"]
        self.sender = (
            c.get_topic_sender(name) if target["subscriptions"] else c.get_queue_sender(name)
        )
        self.single = cfg["calls"] == "single"

    async def send(self, bodies: list[bytes]) -> None:
        if self.single:
            for b in bodies:
                await self.sender.send_messages(ServiceBusMessage(b))
        else:
            await self.sender.send_messages([ServiceBusMessage(b) for b in bodies])

    async def receive(self, max_n: int, wait: float) -> list[tuple[bytes, Any]]:
        raise NotImplementedError

    async def settle(self, tokens: list[Any]) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        await self.sender.close()


class Receiver:
    def __init__(
        self, target: dict[str, Any], source: int, system: dict[str, Any], cfg: dict[str, Any]
    ) -> None:
        c = _client(target)
        self.delete = system["settle"] == "delete"
        mode = (
            ServiceBusReceiveMode.RECEIVE_AND_DELETE
            if self.delete
            else ServiceBusReceiveMode.PEEK_LOCK
        )
        opts: dict[str, Any] = {"receive_mode": mode, "prefetch_count": cfg["prefetch"]}
        if target["subscriptions"]:
            sub = target["subscriptions"][source]
            self.receiver = c.get_subscription_receiver(target["name"], sub, **opts)
        else:
            self.receiver = c.get_queue_receiver(target["name"], **opts)
        self.single = cfg["calls"] == "single"

    async def send(self, bodies: list[bytes]) -> None:
        raise NotImplementedError

    async def receive(self, max_n: int, wait: float) -> list[tuple[bytes, Any]]:
        msgs = await self.receiver.receive_messages(max_message_count=max_n, max_wait_time=wait)
        return [(m.body, m) for m in msgs]

    async def settle(self, tokens: list[Any]) -> None:
        if self.delete or not tokens:
            return
        if self.single:
            for m in tokens:
                await self.receiver.complete_message(m)
        else:
            await self.receiver.complete_messages(tokens)

    async def close(self) -> None:
        await self.receiver.close()
