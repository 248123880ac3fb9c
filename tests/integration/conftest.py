"""Integration fixtures: one local Ray cluster for the whole session, a fresh namespace per test.

Ray costs ~3.4 s to start and ~1.3 s to stop, so it starts once; tests stay independent by
using their own raybus namespace (and so their own registry and queues).
"""

from __future__ import annotations

import asyncio
import queue as queue_module
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Set
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray
from ray_local import local_ray

import raybus
from raybus import aio
from raybus.management import ServiceBusAdministrationClient


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """A local Ray cluster on 127.0.0.1; yields its GCS address."""
    with local_ray() as address:
        yield address


@pytest.fixture
def namespace(ray_cluster: str) -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def admin(namespace: str) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient(namespace)


@pytest.fixture
def client(namespace: str) -> Iterator[raybus.ServiceBusClient]:
    with raybus.ServiceBusClient(namespace) as c:
        yield c


@pytest.fixture
def aadmin(namespace: str) -> aio.ServiceBusAdministrationClient:
    return aio.ServiceBusAdministrationClient(namespace)


@pytest.fixture
def aclient(namespace: str) -> aio.ServiceBusClient:
    return aio.ServiceBusClient(namespace)


@pytest.fixture
def queue(admin: ServiceBusAdministrationClient) -> str:
    """A fresh queue with default settings; returns its name."""
    name = f"q-{uuid.uuid4().hex[:8]}"
    admin.create_queue(name)
    return name


# ---------------------------------------------------------------------------------------------
# Added for the admin / send-receive / settlement / processes suites.
#
# Every raybus actor is its own worker process and Ray needs ~0.8 s to start one, so a fresh
# namespace per test (registry actor + partition actors) dominates the suite's run time. Modules
# whose tests each use their own uniquely named queues may opt into one namespace per module
# (override ``namespace`` with ``module_namespace``, and ``queue`` with ``pooled_queue``); their
# tests stay independent because no two tests touch the same queue. Whatever the scope, the
# queues and topics a test created are deleted after it, and a namespace's remaining actors are
# killed when it ends (their processes go away), so the number of idle Ray workers, and the
# session's memory, do not grow with the number of tests.

_SHARED_NAMESPACES: set[str] = set()


def _kill_namespace_actors(namespace: str) -> None:
    """Kill every raybus actor of ``namespace``: its registry, transaction coordinator, topic
    routers and the partitions of its queues and subscriptions (all named with the namespace
    as one segment of the name). Killing the registry alone left the others running: each is
    a Ray worker process that wakes every 10 ms, so the suite's leftovers came to 40-60
    processes taking about a quarter of the two cores' time by the end of a run."""
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if namespace not in entry["name"].split("/"):
            continue
        try:
            ray.kill(ray.get_actor(entry["name"], namespace=entry["namespace"]), no_restart=True)
        except Exception:  # already gone
            pass


def _entity_names(namespace: str) -> set[str]:
    """The namespace's queues and topics (topics as ``topic:<name>``)."""
    from raybus.exceptions import ServiceBusError

    admin = ServiceBusAdministrationClient(namespace)
    try:
        queues = {q.name for q in admin.list_queues()}
        return queues | {f"topic:{t.name}" for t in admin.list_topics()}
    except ServiceBusError:
        return set()


def _delete_entities(namespace: str, names: Set[str]) -> None:
    """Delete these queues and topics (with their subscriptions; ``_entity_names``' form)."""
    from raybus.exceptions import ServiceBusError

    admin = ServiceBusAdministrationClient(namespace)
    for name in names:
        try:
            if name.startswith("topic:"):
                admin.delete_topic(name.removeprefix("topic:"))
            else:
                admin.delete_queue(name)
        except ServiceBusError:
            pass


@pytest.fixture(scope="module")
def module_namespace(ray_cluster: str) -> Iterator[str]:
    """One raybus namespace shared by the tests of a module (each uses its own queues)."""
    name = f"test-mod-{uuid.uuid4().hex[:10]}"
    _SHARED_NAMESPACES.add(name)
    try:
        yield name
    finally:
        _SHARED_NAMESPACES.discard(name)
        _kill_namespace_actors(name)


@pytest.fixture(autouse=True)
def _release_raybus_actors(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used a raybus namespace: its own namespace's actors are killed; in a
    module's shared namespace the queues and topics it created are deleted, and those that
    existed before it (module fixtures) are kept."""
    if "namespace" not in request.fixturenames:
        yield
        return
    ns = request.getfixturevalue("namespace")
    shared = ns in _SHARED_NAMESPACES
    if not shared:
        yield
        _kill_namespace_actors(ns)
        return
    before = _entity_names(ns)
    yield
    # Queues the pool made meanwhile are not the test's: ``pooled_queue`` deletes its own.
    made = _entity_names(ns) - before
    _delete_entities(ns, {q for q in made if not q.startswith(_POOL_PREFIX)})


_POOL_PREFIX = "pooled-"


class QueuePool:
    """Fresh default-settings queues, created ahead of use on background threads.

    A queue's partition actor is a new Ray worker process (~0.8 s of CPU to start); the pool
    starts the next ones while the current test waits on locks and timers. Each queue is handed
    out once, unused, and is deleted after the test that took it.
    """

    def __init__(self, namespace: str, depth: int = 2) -> None:
        self._admin = ServiceBusAdministrationClient(namespace)
        self._ready: queue_module.Queue[str | BaseException] = queue_module.Queue()
        self._workers = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="queue-pool")
        for _ in range(depth):
            self._workers.submit(self._create)

    def _create(self) -> None:
        name = f"{_POOL_PREFIX}{uuid.uuid4().hex[:8]}"
        try:
            self._admin.create_queue(name)
        except BaseException as exc:  # handed to the test that takes it
            self._ready.put(exc)
        else:
            self._ready.put(name)

    def take(self) -> str:
        item = self._ready.get(timeout=120)
        self._workers.submit(self._create)
        if isinstance(item, BaseException):
            raise item
        return item

    def delete(self, name: str) -> None:
        from raybus.exceptions import MessagingEntityNotFoundError

        try:
            self._admin.delete_queue(name)
        except MessagingEntityNotFoundError:
            pass  # the test deleted it itself

    def close(self) -> None:
        self._workers.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def queue_pool(module_namespace: str) -> Iterator[QueuePool]:
    pool = QueuePool(module_namespace)
    try:
        yield pool
    finally:
        pool.close()  # module_namespace then deletes what is left


@pytest.fixture
def pooled_queue(queue_pool: QueuePool) -> Iterator[str]:
    """Like ``queue`` (a fresh queue with default settings) but taken from ``queue_pool``;
    for modules whose ``namespace`` is ``module_namespace``."""
    name = queue_pool.take()
    try:
        yield name
    finally:
        queue_pool.delete(name)


@pytest.fixture
def eventually() -> Callable[..., None]:
    """``eventually(check, timeout=10)``: call ``check`` until it stops raising
    ``AssertionError`` (for effects that raybus applies asynchronously by design, such as
    settlements sent without waiting); re-raise its last failure after ``timeout`` seconds."""

    def _eventually(check: Callable[[], object], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                check()
                return
            except AssertionError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.05)

    return _eventually


@pytest.fixture
def aeventually() -> Callable[..., Awaitable[None]]:
    """The asyncio twin of ``eventually``: ``await aeventually(check)`` where ``check`` is a
    coroutine function; waits with ``asyncio.sleep`` so the test's own loop keeps running."""

    async def _aeventually(check: Callable[[], Awaitable[object]], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                await check()
                return
            except AssertionError:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(0.05)

    return _aeventually
