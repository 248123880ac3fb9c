"""The client's retry options (azure-servicebus's ``retry_total``, ``retry_backoff_factor``,
``retry_backoff_max``, ``retry_mode``) on real clients: accepted by both APIs, refused with a
typed error when bad, and what they repeat across a partition restart (``raybus._retry``).

Storage failures a send rides out are in ``test_write_failures.py`` (they need its fault)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import pytest
import ray
from restarts import process_id, restart, wait_for_successor

import raybus
from raybus import RetryMode, ServiceBusMessage, _rpc, aio
from raybus._storage.errors import StorageUnavailableError
from raybus.exceptions import InvalidArgumentError, ServiceBusConnectionError
from raybus.management import ServiceBusAdministrationClient


def _partition(client: raybus.ServiceBusClient, queue: str) -> Any:
    return ray.get(client._aio._conn.registry.route.remote(queue)).partitions[0]


def _drain(client: raybus.ServiceBusClient, queue: str) -> list[str]:
    got: list[str] = []
    with client.get_queue_receiver(queue, max_wait_time=2) as receiver:
        while batch := receiver.receive_messages(50, max_wait_time=2):
            receiver.complete_messages(batch)
            got += [str(m) for m in batch]
    return sorted(got)


def test_both_clients_take_the_sdks_retry_options(namespace: str) -> None:
    with raybus.ServiceBusClient(
        namespace,
        retry_total=5,
        retry_backoff_factor=0.1,
        retry_backoff_max=2,
        retry_mode=RetryMode.FIXED,
    ) as client:
        policy = client._aio._conn.retry
        assert (policy.total, policy.backoff_factor, policy.backoff_max) == (5, 0.1, 2.0)
        assert policy.mode is RetryMode.FIXED
    defaults = aio.ServiceBusClient(namespace)._conn.retry
    assert (defaults.total, defaults.backoff_factor, defaults.backoff_max) == (3, 0.8, 120.0)
    assert defaults.mode is RetryMode.EXPONENTIAL


@pytest.mark.parametrize("api", ["sync", "aio"])
def test_a_bad_retry_option_is_refused_when_the_client_is_made(namespace: str, api: str) -> None:
    make = raybus.ServiceBusClient if api == "sync" else aio.ServiceBusClient
    with pytest.raises(InvalidArgumentError) as err:
        make(namespace, retry_total=-1)
    assert err.value.argument == "retry_total"
    with pytest.raises(InvalidArgumentError, match="retry_mode must be 'exponential' or 'fixed'"):
        make(namespace, retry_mode="linear")


def test_sends_with_ids_to_a_deduplicating_queue_ride_out_a_partition_restart(
    namespace: str, admin: ServiceBusAdministrationClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Eight asyncio senders keep sending while the partition's process is killed and
    restarted. A send that met the process dying may have been stored: duplicate detection
    makes repeating it safe, so the policy repeats it. No send raises, and each message is
    there once. (How many sends meet the death is up to timing; the test reports it.
    ``test_a_send_that_could_store_twice_is_not_repeated`` makes the failure to order.)"""
    admin.create_queue("dedup", requires_duplicate_detection=True)
    caplog.set_level(logging.INFO, logger="raybus.retry")

    async def scenario(client: aio.ServiceBusClient, handle: Any) -> list[str]:
        sent: list[str] = []
        stop = asyncio.Event()
        ids = itertools.count()

        async def keep_sending() -> None:
            async with client.get_queue_sender("dedup") as sender:
                while not stop.is_set():
                    body = f"m{next(ids):04d}"
                    await sender.send_messages(ServiceBusMessage(body, message_id=body))
                    sent.append(body)

        tasks = [asyncio.ensure_future(keep_sending()) for _ in range(8)]
        while len(sent) < 200:  # the lane is up and the senders are in full flow
            await asyncio.sleep(0.01)
        before = await asyncio.to_thread(process_id, handle)
        ray.kill(handle, no_restart=False)
        await asyncio.to_thread(wait_for_successor, handle, before)
        await asyncio.sleep(0.2)  # sends to the new process too
        stop.set()
        await asyncio.gather(*tasks)  # raises what a send raised
        return sent

    # Six retries, 0.5 s doubling (31.5 s in all): on a loaded two-core machine a restart
    # outlasted three (3.5 s), and a send then raised, as its policy said it should. Retries
    # cost time only when they are needed.
    client = aio.ServiceBusClient(namespace, retry_total=6, retry_backoff_factor=0.5)
    with raybus.ServiceBusClient(namespace) as sync:
        sent = raybus._sync.run(scenario(client, _partition(sync, "dedup")))
        retried = [r for r in caplog.records if "retry 1 of" in r.getMessage()]
        print(f"{len(sent)} sends, {len(retried)} of them repeated after the restart")
        assert _drain(sync, "dedup") == sorted(sent)


def test_a_send_that_could_store_twice_is_not_repeated(
    namespace: str, admin: ServiceBusAdministrationClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without duplicate detection (or a message without an id) a send whose connection broke
    may have been stored: it is raised, not repeated, whatever the policy. The connection
    error is made to order here (a real restart may or may not meet a send)."""
    admin.create_queue("plain")
    admin.create_queue("dedup", requires_duplicate_detection=True)
    calls: list[str] = []
    real = _rpc.call

    async def breaks(entity: Any, method: Any, *args: Any, **kw: Any) -> Any:
        if _rpc._name(method) == "send_groups":
            calls.append(entity)
            raise ServiceBusConnectionError("the partition restarted (test)", entity)
        return await real(entity, method, *args, **kw)

    with raybus.ServiceBusClient(namespace, retry_backoff_factor=0.01) as client:
        monkeypatch.setattr(_rpc, "call", breaks)
        # A timeout sends on raybus's loop, through ``_rpc.call``, never the direct path.
        unnamed = ServiceBusMessage("x")
        unnamed.message_id = None  # (one built without an id gets one, as in the SDK)
        for queue, message in [
            ("plain", ServiceBusMessage("x", message_id="id")),
            ("dedup", unnamed),  # no id: duplicate detection cannot see it
        ]:
            calls.clear()
            with client.get_queue_sender(queue) as sender, pytest.raises(ServiceBusConnectionError):
                sender.send_messages(message, timeout=30)
            assert calls == [queue], f"{queue}: tried {len(calls)} times"
        for message in (ServiceBusMessage("x", message_id="id"), ServiceBusMessage("x")):
            calls.clear()  # an id of its own or the one it was given: repeated
            with (
                client.get_queue_sender("dedup") as sender,
                pytest.raises(ServiceBusConnectionError),
            ):
                sender.send_messages(message, timeout=30)
            assert calls == ["dedup"] * 4  # one try and the policy's three retries
    assert admin.get_queue_runtime_properties("dedup").active_message_count == 0


def test_receives_and_peeks_repeat_as_the_policy_says_and_settlements_never(
    namespace: str, admin: ServiceBusAdministrationClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_rpc.call`` repeats a call after ``ServiceBusConnectionError`` (unit-tested in
    ``tests/unit/test_lane.py``); a receiver hands it the client's policy."""
    admin.create_queue("q")
    seen: dict[str, tuple[int, Any]] = {}
    real = _rpc.call

    async def spy(entity: Any, method: Any, *args: Any, **kw: Any) -> Any:
        seen[_rpc._name(method)] = (kw.get("retries", 0), kw.get("backoff"))
        return await real(entity, method, *args, **kw)

    with raybus.ServiceBusClient(namespace, retry_total=2, retry_backoff_factor=0.3) as client:
        policy = client._aio._conn.retry
        with client.get_queue_sender("q") as sender:
            sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        monkeypatch.setattr(_rpc, "call", spy)
        with client.get_queue_receiver("q", max_wait_time=5) as receiver:
            assert len(receiver.peek_messages(2, timeout=30)) == 2
            msgs = receiver.receive_messages(2, max_wait_time=5)
            receiver.renew_message_lock(msgs[0], timeout=30)
            receiver.complete_messages(msgs)
    assert seen["peek"] == (2, policy.delay)
    assert seen["receive"] == (2, policy.delay)
    assert seen["renew_locks"][0] == 0


def test_a_receive_rides_out_a_partition_restart(
    namespace: str, admin: ServiceBusAdministrationClient
) -> None:
    admin.create_queue("q")
    with raybus.ServiceBusClient(namespace, retry_backoff_factor=0.5) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("kept"))
        with client.get_queue_receiver("q", max_wait_time=5) as receiver:
            receiver.peek_messages()  # the route and the lane are set up
            restart(_partition(client, "q"))
            # The receiver's lane leads to the process that died; the receive reaches the
            # successor (through the lane's re-open, so it passes with retry_total=0 too).
            (msg,) = receiver.receive_messages(max_wait_time=5)
            assert str(msg) == "kept"
            receiver.complete_message(msg)


def test_only_the_failed_share_of_a_send_across_partitions_is_repeated(
    namespace: str, admin: ServiceBusAdministrationClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list spread over two partitions, one of which refuses its share once with a storage
    failure (nothing stored): that share alone is sent again; each message is there once."""
    admin.create_queue("split", partition_count=2)
    calls: list[Any] = []
    real = _rpc.call

    async def one_share_fails_once(entity: Any, method: Any, *args: Any, **kw: Any) -> Any:
        if _rpc._name(method) == "send_groups":
            actor = getattr(method, "_method", method)._actor._actor_id
            calls.append(actor)
            if calls.count(calls[0]) == 1 and actor == calls[0]:
                raise StorageUnavailableError("disk full (test)", None, 28, entity)
        return await real(entity, method, *args, **kw)

    bodies = [f"m{i:02d}" for i in range(20)]
    with raybus.ServiceBusClient(namespace, retry_backoff_factor=0.01) as client:
        monkeypatch.setattr(_rpc, "call", one_share_fails_once)
        with client.get_queue_sender("split") as sender:
            sender.send_messages(
                [ServiceBusMessage(b, partition_key=f"k{i}") for i, b in enumerate(bodies)]
            )
        monkeypatch.setattr(_rpc, "call", real)
        assert len(set(calls)) == 2, "the list did not span both partitions"
        assert sorted(calls.count(a) for a in set(calls)) == [1, 2]  # the failed share again
        assert _drain(client, "split") == bodies


@pytest.mark.parametrize("retry_total", [2, 0])
def test_a_receive_waiting_when_its_partition_dies_is_repeated_by_the_policy(
    namespace: str, admin: ServiceBusAdministrationClient, retry_total: int
) -> None:
    """A receive waiting at an empty queue's partition when the partition's process dies
    fails in flight (Ray: ``ActorUnavailableError``; the client: ``ServiceBusConnectionError``).
    It took nothing, so the policy repeats it, and the repeat waits at the successor for the
    message sent there. With ``retry_total=0`` the receive raises."""
    admin.create_queue("w")

    async def scenario(client: aio.ServiceBusClient, handle: Any) -> list[str]:
        async with client.get_queue_receiver("w") as receiver:
            await receiver.peek_messages()  # the route and the lane are set up
            waiting = asyncio.ensure_future(receiver.receive_messages(max_wait_time=20))
            await asyncio.sleep(0.5)  # the receive waits at the partition
            assert not waiting.done()
            before = await asyncio.to_thread(process_id, handle)
            ray.kill(handle, no_restart=False)
            await asyncio.to_thread(wait_for_successor, handle, before)
            async with client.get_queue_sender("w") as sender:
                await sender.send_messages(ServiceBusMessage("after the restart"))
            got = await waiting
            await receiver.complete_messages(got)
            return [str(m) for m in got]

    client = aio.ServiceBusClient(namespace, retry_total=retry_total, retry_backoff_factor=0.5)
    with raybus.ServiceBusClient(namespace) as sync:
        handle = _partition(sync, "w")
        if retry_total:
            assert raybus._sync.run(scenario(client, handle)) == ["after the restart"]
        else:
            with pytest.raises(ServiceBusConnectionError):
                raybus._sync.run(scenario(client, handle))
