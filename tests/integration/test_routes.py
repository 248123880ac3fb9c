"""How a client keeps its cached routes current: the routes due for a check are checked in one
namespace call (``routes_changed``), unchanged ones are kept, changed ones are taken and those
of deleted entities are dropped (their next use raises ``MessagingEntityNotFoundError``)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest

from raybus import ServiceBusMessage, _connection, _rpc, aio
from raybus._actors.namespace import route_stamp
from raybus.exceptions import MessagingEntityNotFoundError, ServiceBusConnectionError

TTL_S = 0.05
# Once a test's check has run, its routes stay fresh for this long: at TTL_S a pause of 50 ms
# (a collection, a busy machine) between the check and an assertion made them due again.
HELD_S = 60.0


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    return module_namespace


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _counting(calls: Counter[str], names: list[Any]) -> Any:
    call = _rpc.call

    async def counting(entity: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        method_name = str(getattr(method, "_method_name", method))
        calls[method_name] += 1
        if method_name == "routes_changed":
            names.append(sorted(args[0]))
        return await call(entity, method, *args, **kwargs)

    return counting


async def _refresh(conn: Any, names: list[str]) -> dict[str, Any]:
    """Let every route of ``names`` go stale, use each (which schedules the check) and wait
    for the check; the routes the uses answered (the cached ones)."""
    await asyncio.sleep(2 * TTL_S)
    used = {name: await conn.route(name) for name in names}
    await conn._checking
    return used


async def test_aio_due_routes_are_checked_in_one_call_and_unchanged_ones_are_kept(
    aadmin: aio.ServiceBusAdministrationClient,
    aclient: aio.ServiceBusClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queues = [_name("rq") for _ in range(3)]
    topic = _name("rt")
    for q in queues:
        await aadmin.create_queue(q)
    await aadmin.create_topic(topic)
    await aadmin.create_subscription(topic, "s")
    entities = [*queues, topic, f"{topic}/Subscriptions/s"]
    conn = aclient._conn
    cached = {name: await conn.route(name) for name in entities}
    calls: Counter[str] = Counter()
    checked: list[Any] = []
    monkeypatch.setattr(_connection, "ROUTE_TTL_S", TTL_S)
    monkeypatch.setattr(_rpc, "call", _counting(calls, checked))

    used = await _refresh(conn, entities)
    monkeypatch.setattr(_connection, "ROUTE_TTL_S", HELD_S)

    assert used == cached
    assert calls == {"routes_changed": 1}, calls  # one call for the five, no route call
    assert checked == [sorted(entities)]
    for name in entities:  # kept, and fresh again
        assert await conn.route(name) is cached[name]
        assert conn.cached_route(name) is cached[name]
    assert calls == {"routes_changed": 1}, calls
    await aclient.close()


async def test_aio_a_check_takes_changed_routes_and_drops_those_of_deleted_entities(
    aadmin: aio.ServiceBusAdministrationClient,
    aclient: aio.ServiceBusClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    changed, deleted, same = _name("rq-changed"), _name("rq-deleted"), _name("rq-same")
    for q in (changed, deleted, same):
        await aadmin.create_queue(q)
    conn = aclient._conn
    before = {q: await conn.route(q) for q in (changed, deleted, same)}
    monkeypatch.setattr(_connection, "ROUTE_TTL_S", TTL_S)
    props = await aadmin.get_queue(changed)
    await aadmin.update_queue(props, max_delivery_count=props.max_delivery_count + 3)
    await aadmin.delete_queue(deleted)

    await _refresh(conn, [changed, deleted, same])
    monkeypatch.setattr(_connection, "ROUTE_TTL_S", HELD_S)

    now = conn.cached_route(changed)
    assert now is not None and now is not before[changed]
    assert now.properties.max_delivery_count == props.max_delivery_count + 3
    assert route_stamp(now) != route_stamp(before[changed])
    assert conn.cached_route(same) is before[same]
    assert conn.cached_route(deleted) is None
    calls: Counter[str] = Counter()
    monkeypatch.setattr(_rpc, "call", _counting(calls, []))
    async with aclient.get_queue_sender(deleted) as sender:
        with pytest.raises(MessagingEntityNotFoundError):
            await sender.send_messages(ServiceBusMessage("to nowhere"))
    # Dropped: the send asked the namespace, which answered at once, and called no partition.
    assert calls == {"route": 1}, calls
    monkeypatch.undo()
    # Created again under the same name: the next use finds the new one.
    await aadmin.create_queue(deleted)
    async with aclient.get_queue_sender(deleted) as sender:
        await sender.send_messages(ServiceBusMessage("again"))
    again = await conn.route(deleted)
    assert again.incarnation != before[deleted].incarnation
    assert (await aadmin.get_queue_runtime_properties(deleted)).active_message_count == 1
    await aclient.close()


async def test_aio_a_failed_check_leaves_the_stale_routes_serving_and_the_next_use_asks_again(
    aadmin: aio.ServiceBusAdministrationClient,
    aclient: aio.ServiceBusClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    q = _name("rq")
    await aadmin.create_queue(q)
    conn = aclient._conn
    cached = await conn.route(q)
    monkeypatch.setattr(_connection, "ROUTE_TTL_S", TTL_S)
    call = _rpc.call
    failed: list[str] = []

    async def failing(entity: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(method, "_method_name", None) == "routes_changed":
            failed.append(q)
            raise ServiceBusConnectionError("the namespace is restarting")
        return await call(entity, method, *args, **kwargs)

    monkeypatch.setattr(_rpc, "call", failing)
    assert await _refresh(conn, [q]) == {q: cached}  # the check failed quietly
    assert failed == [q]
    assert conn.cached_route(q) is None  # still due
    async with aclient.get_queue_sender(q) as sender:  # the stale route serves on
        await sender.send_messages(ServiceBusMessage("meanwhile"))
    monkeypatch.setattr(_rpc, "call", call)
    assert await conn.route(q) is cached  # this use asks again, and the check succeeds
    await conn._checking
    monkeypatch.setattr(_connection, "ROUTE_TTL_S", HELD_S)
    assert conn.cached_route(q) is cached
    assert (await aadmin.get_queue_runtime_properties(q)).active_message_count == 1
    await aclient.close()


async def test_aio_namespace_answers_only_the_routes_that_differ(
    aadmin: aio.ServiceBusAdministrationClient, aclient: aio.ServiceBusClient
) -> None:
    q, gone = _name("rq"), _name("rq-gone")
    await aadmin.create_queue(q, partition_count=2)
    route = await aclient._conn.route(q)
    registry = aclient._conn.registry
    stamp = route_stamp(route)

    assert await _rpc.call(None, registry.routes_changed, {q: stamp}) == {}
    assert await _rpc.call(None, registry.routes_changed, {q.upper(): stamp}) == {}
    answer = await _rpc.call(None, registry.routes_changed, {q: (*stamp[:2], -1, stamp[3])})
    assert list(answer) == [q]
    assert route_stamp(answer[q]) == stamp
    assert await _rpc.call(None, registry.routes_changed, {gone: stamp}) == {gone: None}
    await aclient.close()
