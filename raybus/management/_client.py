"""The sync ``ServiceBusAdministrationClient`` (a facade over the asyncio one)."""

from __future__ import annotations

from typing import Any

from .._models import QueueProperties, QueueRuntimeProperties
from .._sync import run
from ..aio._management import ServiceBusAdministrationClient as _AsyncAdmin

__all__ = ["ServiceBusAdministrationClient"]


class ServiceBusAdministrationClient:
    """Creates, inspects, changes and deletes entities of one namespace (see the asyncio
    ``raybus.aio.management.ServiceBusAdministrationClient`` for each method)."""

    def __init__(
        self,
        namespace: str = "default",
        *,
        address: str | None = None,
        storage_path: str | None = None,
    ) -> None:
        self._aio = _AsyncAdmin(namespace, address=address, storage_path=storage_path)
        self.namespace = namespace

    def create_queue(self, queue_name: str, **options: Any) -> QueueProperties:
        return run(self._aio.create_queue(queue_name, **options))

    def get_queue(self, queue_name: str) -> QueueProperties:
        return run(self._aio.get_queue(queue_name))

    def update_queue(self, queue: QueueProperties, **options: Any) -> QueueProperties:
        return run(self._aio.update_queue(queue, **options))

    def delete_queue(self, queue_name: str) -> None:
        run(self._aio.delete_queue(queue_name))

    def list_queues(self) -> list[QueueProperties]:
        return run(self._aio.list_queues())

    def get_queue_runtime_properties(self, queue_name: str) -> QueueRuntimeProperties:
        return run(self._aio.get_queue_runtime_properties(queue_name))

    def wait_for_partitions(self, queue_name: str, *, timeout: float = 60.0) -> int:
        return run(self._aio.wait_for_partitions(queue_name, timeout=timeout))

    def list_queues_runtime_properties(self) -> list[QueueRuntimeProperties]:
        return run(self._aio.list_queues_runtime_properties())

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> ServiceBusAdministrationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
