"""Transactions against a real local Ray cluster (sync and asyncio clients): sends and
settlements given ``transaction=`` take effect together at commit or not at all.

Covered: send-via (receive from A, complete it and send to B in one transaction) and what is
visible before and after the commit; rollback on an exception and explicit ``rollback()``;
atomicity across the partitions of a partitioned queue and across queues; broker refusals at
commit (a lock that expired, a message completed outside the transaction, a queue's quota)
roll back everything; the 100-message limit; RECEIVE_AND_DELETE receivers are refused;
consecutive sequence numbers in the transaction's order; abandon, defer, dead-letter,
schedule and lock renewal applied at commit; no reuse after the end; the two-minute timeout
(shortened here by monkeypatching ``raybus.aio._transaction.TIMEOUT_S``).

The tests share one raybus namespace (and so one coordinator actor); each uses its own
uniquely named queues.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import ray

import raybus
from raybus import ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue, aio
from raybus.aio import _transaction as aio_transaction
from raybus.exceptions import (
    InvalidArgumentError,
    MessageAlreadySettled,
    MessageLockLostError,
    MessageNotFoundError,
    ServiceBusError,
    TransactionAbortedError,
    TransactionSizeExceededError,
    TransactionTimeoutError,
)
from raybus.management import ServiceBusAdministrationClient

DLQ = ServiceBusSubQueue.DEAD_LETTER
RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> Iterator[str]:
    # Each test uses its own uniquely named queues; see ``module_namespace`` in conftest.
    yield module_namespace
    # The coordinator actor (detached) is not one the shared fixtures know about.
    from raybus._actors.coordinator import coordinator_actor_name

    try:
        actor = ray.get_actor(coordinator_actor_name(module_namespace), namespace="raybus")
        ray.kill(actor, no_restart=True)
    except Exception:  # never created
        pass


@pytest.fixture
def fresh(queue_pool: Any) -> Iterator[Any]:
    """``fresh()``: a new default-settings queue, created ahead of time by the module's pool
    (see ``QueuePool`` in conftest); deleted after the test."""
    taken: list[str] = []

    def take() -> str:
        taken.append(queue_pool.take())
        return taken[-1]

    yield take
    for name in taken:
        queue_pool.delete(name)


def _name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _make(admin: ServiceBusAdministrationClient, prefix: str = "q", **options: Any) -> str:
    name = _name(prefix)
    admin.create_queue(name, **options)
    return name


def _make_all(admin: ServiceBusAdministrationClient, *specs: dict[str, Any]) -> list[str]:
    """Create several queues at once (their actors start in parallel)."""
    with ThreadPoolExecutor(len(specs)) as pool:
        return list(pool.map(lambda spec: _make(admin, **spec), specs))


async def _amake(admin: aio.ServiceBusAdministrationClient, prefix: str = "q", **opts: Any) -> str:
    name = _name(prefix)
    await admin.create_queue(name, **opts)
    return name


def _peek(client: raybus.ServiceBusClient, queue: str, *, dlq: bool = False) -> list[Any]:
    """Every message of the queue (or its dead-letter queue), locked or not, without locking."""
    out: list[Any] = []
    with client.get_queue_receiver(queue, sub_queue=DLQ if dlq else None) as r:
        while True:
            got = r.peek_messages(250)
            if not got:
                return out
            out += got


async def _apeek(client: aio.ServiceBusClient, queue: str, *, dlq: bool = False) -> list[Any]:
    out: list[Any] = []
    async with client.get_queue_receiver(queue, sub_queue=DLQ if dlq else None) as r:
        while True:
            got = await r.peek_messages(250)
            if not got:
                return out
            out += got


def _bodies(messages: list[Any]) -> list[str]:
    return sorted(str(m) for m in messages)


def _send(client: raybus.ServiceBusClient, queue: str, *bodies: str) -> None:
    with client.get_queue_sender(queue) as s:
        s.send_messages([ServiceBusMessage(b) for b in bodies])


def _receive(
    receiver: raybus.ServiceBusReceiver, count: int, wait: float = 5.0
) -> list[raybus.ServiceBusReceivedMessage]:
    """Exactly ``count`` messages (receiving until they all came, within ``wait`` seconds)."""
    got: list[raybus.ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + wait
    while len(got) < count and time.monotonic() < deadline:
        got += receiver.receive_messages(count - len(got), max_wait_time=0.5)
    assert len(got) == count, f"received {len(got)} of {count}"
    return got


async def _areceive(
    receiver: aio.ServiceBusReceiver, count: int, wait: float = 5.0
) -> list[raybus.ServiceBusReceivedMessage]:
    got: list[raybus.ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + wait
    while len(got) < count and time.monotonic() < deadline:
        got += await receiver.receive_messages(count - len(got), max_wait_time=0.5)
    assert len(got) == count, f"received {len(got)} of {count}"
    return got


def _stats(client: raybus.ServiceBusClient) -> dict[str, int]:
    stats: dict[str, int] = ray.get(client._aio._conn.coordinator.stats.remote())
    return stats


# ---------------------------------------------------------------------------------------------
# commit, rollback


def test_send_via_commit_applies_the_completion_and_the_send_together(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, fresh: Any
) -> None:
    a, b = fresh(), fresh()
    _send(client, a, "order-1")
    with client.get_queue_receiver(a) as ra, client.get_queue_sender(b) as sb:
        (msg,) = _receive(ra, 1)
        with client.transaction() as txn:
            ra.complete_message(msg, transaction=txn)
            sb.send_messages(ServiceBusMessage("shipped-1"), transaction=txn)
            assert txn.state == "open"
            # Settled by the transaction: not again outside it.
            with pytest.raises(MessageAlreadySettled):
                ra.complete_message(msg)
            # Nothing visible before the commit: B empty, the A message still there and locked.
            assert _peek(client, b) == []
            assert _bodies(_peek(client, a)) == ["order-1"]
            assert ra.receive_messages(1, max_wait_time=0.5) == []
        assert txn.state == "committed"
        assert _peek(client, a) == []
        assert ra.receive_messages(1, max_wait_time=0.3) == []
    with client.get_queue_receiver(b) as rb:
        (out,) = _receive(rb, 1)
        assert str(out) == "shipped-1"
        assert out.delivery_count == 0
        rb.complete_message(out)


async def test_aio_send_via_explicit_commit(
    aclient: aio.ServiceBusClient, aadmin: aio.ServiceBusAdministrationClient, fresh: Any
) -> None:
    a, b = fresh(), fresh()
    async with aclient.get_queue_sender(a) as sa:
        await sa.send_messages([ServiceBusMessage("x1"), ServiceBusMessage("x2")])
    async with aclient.get_queue_receiver(a) as ra, aclient.get_queue_sender(b) as sb:
        msgs = await _areceive(ra, 2)
        txn = aclient.transaction()
        for m in msgs:
            await ra.complete_message(m, transaction=txn)
            await sb.send_messages(ServiceBusMessage(f"via-{m}"), transaction=txn)
        assert await _apeek(aclient, b) == []
        assert len(await _apeek(aclient, a)) == 2
        assert await ra.receive_messages(2, max_wait_time=0.5) == []
        await txn.commit()
        assert txn.state == "committed"
        assert await _apeek(aclient, a) == []
    assert _bodies(await _apeek(aclient, b)) == ["via-x1", "via-x2"]


def test_exception_rolls_back_discarding_sends_and_leaving_the_message_locked(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    eventually: Any,
    fresh: Any,
) -> None:
    a, b = fresh(), fresh()
    _send(client, a, "keep-me")
    with client.get_queue_receiver(a) as ra, client.get_queue_sender(b) as sb:
        (msg,) = _receive(ra, 1)
        with (
            pytest.raises(RuntimeError, match="processing failed"),
            client.transaction() as txn,
        ):
            ra.complete_message(msg, transaction=txn)
            sb.send_messages(ServiceBusMessage("never"), transaction=txn)
            raise RuntimeError("processing failed")
        assert txn.state == "rolled back"
        assert _peek(client, b) == []
        # Still there, still locked by us: nobody else receives it...
        assert _bodies(_peek(client, a)) == ["keep-me"]
        with client.get_queue_receiver(a) as other:
            assert other.receive_messages(1, max_wait_time=0.5) == []
        # ...and it can be settled normally now.
        ra.complete_message(msg)
    eventually(lambda: _expect(_peek(client, a) == []))
    time.sleep(0.3)
    assert _peek(client, b) == []


def _expect(condition: bool) -> None:
    assert condition


async def test_aio_explicit_rollback_and_no_reuse_after_it(
    aclient: aio.ServiceBusClient, aadmin: aio.ServiceBusAdministrationClient, fresh: Any
) -> None:
    a, b = fresh(), fresh()
    async with aclient.get_queue_sender(a) as sa:
        await sa.send_messages(ServiceBusMessage("m"))
    async with aclient.get_queue_receiver(a) as ra, aclient.get_queue_sender(b) as sb:
        (m,) = await _areceive(ra, 1)
        txn = aclient.transaction()
        await ra.dead_letter_message(m, "r", "d", transaction=txn)
        await sb.send_messages(ServiceBusMessage("gone"), transaction=txn)
        await txn.rollback()
        assert txn.state == "rolled back"
        with pytest.raises(InvalidArgumentError):
            await txn.commit()
        with pytest.raises(InvalidArgumentError):
            await sb.send_messages(ServiceBusMessage("late"), transaction=txn)
        await txn.rollback()  # harmless
        assert await _apeek(aclient, b) == []
        assert await _apeek(aclient, a, dlq=True) == []
        # The message is still ours: settle it (waiting for the broker's answer).
        await ra.complete_messages([m])
    assert await _apeek(aclient, a) == []


def test_transaction_cannot_be_reused_after_commit(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, fresh: Any
) -> None:
    a, b = fresh(), fresh()
    _send(client, a, "one", "two")
    with client.get_queue_receiver(a) as ra, client.get_queue_sender(b) as sb:
        first, second = _receive(ra, 2)
        txn = client.transaction()
        sb.send_messages(ServiceBusMessage("b1"), transaction=txn)
        ra.complete_message(first, transaction=txn)
        txn.commit()
        assert txn.state == "committed"
        with pytest.raises(InvalidArgumentError):
            sb.send_messages(ServiceBusMessage("b2"), transaction=txn)
        with pytest.raises(InvalidArgumentError):
            ra.complete_message(second, transaction=txn)
        with pytest.raises(InvalidArgumentError):
            txn.commit()
        txn.rollback()  # no effect on a committed transaction
        assert txn.state == "committed"
        # ``second`` was not taken by the refused call: it settles normally.
        ra.complete_messages([second])
    assert _bodies(_peek(client, b)) == ["b1"]
    assert _peek(client, a) == []


def test_empty_transaction_commits(client: raybus.ServiceBusClient) -> None:
    with client.transaction() as txn:
        pass
    assert txn.state == "committed"
    txn2 = client.transaction()
    txn2.commit()
    assert txn2.state == "committed"


# ---------------------------------------------------------------------------------------------
# atomicity across partitions and entities


def _keys_per_partition(
    client: raybus.ServiceBusClient, queue: str, per: int
) -> dict[int, list[str]]:
    """``per`` partition keys landing on each partition of ``queue``."""
    route = ray.get(client._aio._conn.registry.route.remote(queue))
    found: dict[int, list[str]] = {pid: [] for pid, _ in route.existing()}
    i = 0
    while any(len(v) < per for v in found.values()):
        key = f"key-{i}"
        pid = route.pmap.owner(key)
        if len(found[pid]) < per:
            found[pid].append(key)
        i += 1
    return found


def test_commit_is_atomic_across_partitions_and_queues(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, fresh: Any
) -> None:
    src = fresh()
    part = _make(admin, "part", partition_count=3)
    other = fresh()
    _send(client, src, "s1", "s2")
    keys = _keys_per_partition(client, part, 2)
    before = _stats(client)
    with (
        client.get_queue_receiver(src) as rs,
        client.get_queue_sender(part) as sp,
        client.get_queue_sender(other) as so,
    ):
        msgs = _receive(rs, 2)
        with client.transaction() as txn:
            for m in msgs:
                rs.complete_message(m, transaction=txn)
            for pid, ks in keys.items():
                for k in ks:
                    sp.send_messages(
                        ServiceBusMessage(f"p{pid}-{k}", partition_key=k), transaction=txn
                    )
            so.send_messages([ServiceBusMessage("o1"), ServiceBusMessage("o2")], transaction=txn)
            assert _peek(client, part) == []
            assert _peek(client, other) == []
            assert len(_peek(client, src)) == 2
    got = _peek(client, part)
    assert _bodies(got) == sorted(f"p{pid}-{k}" for pid, ks in keys.items() for k in ks)
    assert {m.partition_id for m in got} == {0, 1, 2}
    for m in got:  # each landed on the partition its key names
        assert str(m).startswith(f"p{m.partition_id}-")
    assert _bodies(_peek(client, other)) == ["o1", "o2"]
    assert _peek(client, src) == []
    after = _stats(client)
    assert after["committed"] >= before["committed"] + 1


async def test_aio_rollback_is_atomic_across_partitions_and_queues(
    aclient: aio.ServiceBusClient, aadmin: aio.ServiceBusAdministrationClient, fresh: Any
) -> None:
    src, part = await asyncio.gather(
        _amake(aadmin, "src", partition_count=2), _amake(aadmin, "part", partition_count=3)
    )
    other = fresh()
    async with aclient.get_queue_sender(src) as ss:
        await ss.send_messages([ServiceBusMessage(f"s{i}") for i in range(4)])
    async with (
        aclient.get_queue_receiver(src) as rs,
        aclient.get_queue_sender(part) as sp,
        aclient.get_queue_sender(other) as so,
    ):
        msgs = await _areceive(rs, 4)
        with pytest.raises(KeyError):
            async with aclient.transaction() as txn:
                for m in msgs:
                    await rs.complete_message(m, transaction=txn)
                await sp.send_messages(
                    [ServiceBusMessage(f"p{i}", partition_key=f"k{i}") for i in range(9)],
                    transaction=txn,
                )
                await so.send_messages(ServiceBusMessage("o"), transaction=txn)
                raise KeyError("boom")
        assert txn.state == "rolled back"
        assert await _apeek(aclient, part) == []
        assert await _apeek(aclient, other) == []
        assert len(await _apeek(aclient, src)) == 4
        # All four still locked by us: complete them normally.
        await rs.complete_messages(msgs)
    assert await _apeek(aclient, src) == []


# ---------------------------------------------------------------------------------------------
# broker refusals at commit


def test_lock_expired_before_commit_aborts_everything(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, fresh: Any
) -> None:
    short, part = _make_all(
        admin,
        {"prefix": "short", "lock_duration": timedelta(seconds=1.5)},
        {"prefix": "part", "partition_count": 2},
    )
    steady, b = fresh(), fresh()
    _send(client, short, "expiring")
    _send(client, steady, "steady")
    with (
        client.get_queue_receiver(short) as r_short,
        client.get_queue_receiver(steady) as r_steady,
        client.get_queue_sender(b) as sb,
        client.get_queue_sender(part) as sp,
    ):
        (m_steady,) = _receive(r_steady, 1)
        (m_short,) = _receive(r_short, 1)
        txn = client.transaction()
        r_short.complete_message(m_short, transaction=txn)  # accepted: the lock is valid now
        r_steady.complete_message(m_steady, transaction=txn)
        sb.send_messages(ServiceBusMessage("b-out"), transaction=txn)
        sp.send_messages(
            [ServiceBusMessage(f"p{i}", partition_key=f"k{i}") for i in range(4)],
            transaction=txn,
        )
        time.sleep(2.0)  # the short lock ends before the commit
        with pytest.raises(TransactionAbortedError) as info:
            txn.commit()
        err = info.value
        assert err.transaction_id == txn.transaction_id
        assert err.reason is not None and "MessageLockLost" in err.reason, err.reason
        assert txn.state == "rolled back"
        # Nothing took effect: no sends anywhere...
        assert _peek(client, b) == []
        assert _peek(client, part) == []
        # ...the other settlement did not happen (the message is still ours, locked)...
        assert _bodies(_peek(client, steady)) == ["steady"]
        with client.get_queue_receiver(steady) as other:
            assert other.receive_messages(1, max_wait_time=0.5) == []
        r_steady.complete_messages([m_steady])
        # ...and the expired message comes back.
        (again,) = _receive(r_short, 1)
        assert str(again) == "expiring"
        assert again.delivery_count == 1
        r_short.complete_messages([again])
    assert _peek(client, steady) == []
    assert _peek(client, short) == []


async def test_aio_message_completed_outside_the_transaction_aborts_it(
    aclient: aio.ServiceBusClient, aadmin: aio.ServiceBusAdministrationClient, fresh: Any
) -> None:
    a, b, c = fresh(), fresh(), fresh()
    async with aclient.get_queue_sender(a) as sa:
        await sa.send_messages([ServiceBusMessage("first"), ServiceBusMessage("second")])
    async with (
        aclient.get_queue_receiver(a) as ra,
        aclient.get_queue_sender(b) as sb,
        aclient.get_queue_sender(c) as sc,
    ):
        first, second = await _areceive(ra, 2)
        # Another holder of the same lock token (as another process holding it would be).
        twin = copy.copy(second)
        txn = aclient.transaction()
        await ra.complete_message(first, transaction=txn)
        await ra.defer_message(second, transaction=txn)
        await sb.send_messages(ServiceBusMessage("b"), transaction=txn)
        await sc.send_messages(ServiceBusMessage("c"), transaction=txn)
        await ra.complete_messages([twin])  # settled outside, before the commit
        with pytest.raises(TransactionAbortedError) as info:
            await txn.commit()
        assert "MessageLockLost" in (info.value.reason or ""), info.value.reason
        assert await _apeek(aclient, b) == []
        assert await _apeek(aclient, c) == []
        # ``first`` was not completed (still ours); ``second`` is gone (completed outside).
        left = await _apeek(aclient, a)
        assert [str(m) for m in left] == ["first"]
        await ra.complete_messages([first])
    assert await _apeek(aclient, a) == []


def test_quota_refusal_at_commit_aborts_everything(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, fresh: Any
) -> None:
    a = fresh()
    small = _make(admin, "small", max_size_in_megabytes=1)
    c = fresh()
    _send(client, a, "src")
    big = "x" * (200 * 1024)
    with (
        client.get_queue_receiver(a) as ra,
        client.get_queue_sender(small) as s_small,
        client.get_queue_sender(c) as sc,
    ):
        (m,) = _receive(ra, 1)
        txn = client.transaction()
        ra.complete_message(m, transaction=txn)
        sc.send_messages(ServiceBusMessage("c"), transaction=txn)
        for i in range(6):  # 1.2 MB: more than the queue's 1 MB
            s_small.send_messages(ServiceBusMessage(big, message_id=f"big{i}"), transaction=txn)
        with pytest.raises(TransactionAbortedError) as info:
            txn.commit()
        assert "QuotaExceeded" in (info.value.reason or ""), info.value.reason
        assert _peek(client, small) == []
        assert _peek(client, c) == []
        assert _bodies(_peek(client, a)) == ["src"]
        ra.complete_messages([m])
    # The aborted transaction reserved nothing for good: the queue takes 1 MB's worth now.
    with client.get_queue_sender(small) as s_small:
        s_small.send_messages([ServiceBusMessage(big) for _ in range(4)])
    assert len(_peek(client, small)) == 4


# ---------------------------------------------------------------------------------------------
# limits and refusals when adding


def test_one_hundred_messages_at_most_and_the_hundred_still_commit(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, fresh: Any
) -> None:
    a, b = fresh(), fresh()
    _send(client, a, "m0", "m1")
    with client.get_queue_receiver(a) as ra, client.get_queue_sender(b) as sb:
        m0, m1 = _receive(ra, 2)
        with client.transaction() as txn:
            ra.complete_message(m0, transaction=txn)  # 1
            sb.send_messages([ServiceBusMessage(f"b{i}") for i in range(90)], transaction=txn)
            for i in range(90, 98):  # 99
                sb.send_messages(ServiceBusMessage(f"b{i}"), transaction=txn)
            with pytest.raises(TransactionSizeExceededError):  # 99 + 2: refused whole
                sb.send_messages(
                    [ServiceBusMessage("x1"), ServiceBusMessage("x2")], transaction=txn
                )
            sb.send_messages(ServiceBusMessage("b98"), transaction=txn)  # 100
            with pytest.raises(TransactionSizeExceededError):  # the 101st
                sb.send_messages(ServiceBusMessage("b99"), transaction=txn)
            with pytest.raises(TransactionSizeExceededError):
                ra.complete_message(m1, transaction=txn)
            with pytest.raises(TransactionSizeExceededError):
                sb.schedule_messages(
                    ServiceBusMessage("s"), datetime.now(timezone.utc), transaction=txn
                )
        assert txn.state == "committed"
        # m1 was not taken by the refused call: still ours to settle.
        ra.complete_messages([m1])
    assert _peek(client, a) == []
    got = _peek(client, b)
    assert len(got) == 99
    assert sorted(str(m) for m in got) == sorted(f"b{i}" for i in range(99))


async def test_aio_receive_and_delete_receiver_cannot_join(
    aclient: aio.ServiceBusClient, aadmin: aio.ServiceBusAdministrationClient, fresh: Any
) -> None:
    a, b = fresh(), fresh()
    async with aclient.get_queue_sender(a) as sa:
        await sa.send_messages(ServiceBusMessage("gone"))
    async with (
        aclient.get_queue_receiver(a, receive_mode=RAD) as ra,
        aclient.get_queue_sender(b) as sb,
    ):
        (m,) = await _areceive(ra, 1)
        async with aclient.transaction() as txn:
            await sb.send_messages(ServiceBusMessage("b"), transaction=txn)
            for settle in (
                ra.complete_message(m, transaction=txn),
                ra.abandon_message(m, transaction=txn),
                ra.defer_message(m, transaction=txn),
                ra.dead_letter_message(m, transaction=txn),
            ):
                with pytest.raises(ServiceBusError):
                    await settle
        assert txn.state == "committed"
    assert _bodies(await _apeek(aclient, b)) == ["b"]


# ---------------------------------------------------------------------------------------------
# ordering


def test_sends_get_consecutive_sequence_numbers_in_transaction_order(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, fresh: Any
) -> None:
    single = fresh()
    part = _make(admin, "part", partition_count=2)
    expected = [f"t{i}" for i in range(12)]
    with (
        client.get_queue_sender(single) as s1,
        client.get_queue_sender(single) as s2,
        client.get_queue_sender(part) as sp,
    ):
        txn = client.transaction()
        for i, body in enumerate(expected):
            sender = s1 if i % 2 == 0 else s2  # two senders, one partition
            one = ServiceBusMessage(body)
            sender.send_messages([one] if i == 4 else one, transaction=txn)
            sp.send_messages(ServiceBusMessage(body, partition_key="same"), transaction=txn)
            # Sends outside the transaction meanwhile are numbered at once.
            s1.send_messages(ServiceBusMessage(f"plain{i}"))
            sp.send_messages(ServiceBusMessage(f"plain{i}", partition_key="same"))
        txn.commit()
        s1.send_messages(ServiceBusMessage("after"))
    for queue in (single, part):
        msgs = sorted(_peek(client, queue), key=lambda m: m.sequence_number)
        txn_msgs = [m for m in msgs if str(m).startswith("t")]
        assert [str(m) for m in txn_msgs] == expected
        seqs = [m.sequence_number for m in txn_msgs]
        assert seqs == list(range(seqs[0], seqs[0] + len(expected))), seqs
        plain = [m.sequence_number for m in msgs if str(m).startswith("plain")]
        assert len(plain) == len(expected) and max(plain) < seqs[0]
    last = max(_peek(client, single), key=lambda m: m.sequence_number)
    assert str(last) == "after"


# ---------------------------------------------------------------------------------------------
# abandon, defer, dead-letter, schedule, renew


async def test_aio_abandon_defer_and_dead_letter_apply_at_commit(
    aclient: aio.ServiceBusClient, aadmin: aio.ServiceBusAdministrationClient, fresh: Any
) -> None:
    a = fresh()
    async with aclient.get_queue_sender(a) as sa:
        await sa.send_messages([ServiceBusMessage(b) for b in ("ab", "de", "dl")])
    async with aclient.get_queue_receiver(a) as ra:
        ab, de, dl = sorted(await _areceive(ra, 3), key=lambda m: str(m))
        txn = aclient.transaction()
        await ra.abandon_message(ab, {"tried": 1}, transaction=txn)
        await ra.defer_message(de, transaction=txn)
        await ra.dead_letter_message(dl, "bad-input", "could not parse", transaction=txn)
        # Nothing applied yet.
        assert await ra.receive_messages(3, max_wait_time=0.5) == []
        assert await _apeek(aclient, a, dlq=True) == []
        with pytest.raises(MessageNotFoundError):
            await ra.receive_deferred_messages([de.sequence_number])
        await txn.commit()
        (again,) = await _areceive(ra, 1)
        assert str(again) == "ab"
        assert again.delivery_count == 1
        assert again.application_properties == {"tried": 1}
        (deferred,) = await ra.receive_deferred_messages([de.sequence_number])
        assert str(deferred) == "de"
        await ra.complete_messages([again, deferred])
    async with aclient.get_queue_receiver(a, sub_queue=DLQ) as rd:
        (dead,) = await _areceive(rd, 1)
        assert str(dead) == "dl"
        assert dead.dead_letter_reason == "bad-input"
        assert dead.dead_letter_error_description == "could not parse"
        await rd.complete_messages([dead])
    assert await _apeek(aclient, a) == []


def test_schedule_messages_in_a_transaction_enqueue_at_commit(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    fresh: Any,
) -> None:
    """Nothing is stored before the commit; at the commit one message is active, one scheduled.

    Each check that "later" is not yet active holds only while its time has not come, so it is
    made only when the call that checked it ended before then: on a loaded machine the commit
    alone has taken longer than the schedule's 3 s.
    """
    b = fresh()
    with client.get_queue_sender(b) as sb:
        txn = client.transaction()
        at = datetime.now(timezone.utc) + timedelta(seconds=3)
        assert sb.schedule_messages(ServiceBusMessage("later"), at, transaction=txn) == []
        sb.send_messages(ServiceBusMessage("now"), transaction=txn)
        props = admin.get_queue_runtime_properties(b)
        assert (props.scheduled_message_count, props.active_message_count) == (0, 0)
        txn.commit()
    props = admin.get_queue_runtime_properties(b)
    assert props.scheduled_message_count + props.active_message_count == 2
    if datetime.now(timezone.utc) < at:
        assert props.scheduled_message_count == 1
    with client.get_queue_receiver(b) as rb:
        got = _receive(rb, 1)
        got += rb.receive_messages(1, max_wait_time=0.5)
        if datetime.now(timezone.utc) < at:
            assert [str(m) for m in got] == ["now"]
        if len(got) < 2:
            got += _receive(rb, 1, wait=8)
        assert sorted(str(m) for m in got) == ["later", "now"]
        assert datetime.now(timezone.utc) >= at
        rb.complete_messages(got)


def test_renew_in_a_transaction_extends_the_lock_at_commit(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    a = _make(admin, "a", lock_duration=timedelta(seconds=4))
    _send(client, a, "renew-me")
    with client.get_queue_receiver(a) as ra:
        (m,) = _receive(ra, 1)
        t0 = time.monotonic()
        time.sleep(2.0)
        with client.transaction() as txn:
            assert ra.renew_message_lock(m, transaction=txn) is None
        # Past the first lock's end (t0 + 4 s), inside the renewed one (about t0 + 6 s).
        time.sleep(max(0.0, 4.5 - (time.monotonic() - t0)))
        with client.get_queue_receiver(a) as other:
            assert other.receive_messages(1, max_wait_time=0.3) == []
        # The broker holds the renewed lock for us: completing the message must work (the
        # client must know the new expiry, as after a renewal outside a transaction).
        try:
            ra.complete_messages([m])
        except MessageLockLostError as exc:
            pytest.fail(
                "the transaction renewed the lock (the broker still holds it: no other "
                f"receiver got the message), yet the client refuses to settle it: {exc!r}; "
                f"message.locked_until_utc still says {m.locked_until_utc}"
            )
    assert _peek(client, a) == []


# ---------------------------------------------------------------------------------------------
# timeout


def test_transaction_not_committed_in_time_is_rolled_back(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    monkeypatch: pytest.MonkeyPatch,
    fresh: Any,
) -> None:
    monkeypatch.setattr(aio_transaction, "TIMEOUT_S", 1.0)
    a, b = fresh(), fresh()
    _send(client, a, "m")
    with client.get_queue_receiver(a) as ra, client.get_queue_sender(b) as sb:
        (m,) = _receive(ra, 1)
        with pytest.raises(TransactionTimeoutError) as info, client.transaction() as txn:
            ra.complete_message(m, transaction=txn)
            sb.send_messages(ServiceBusMessage("late"), transaction=txn)
            time.sleep(1.3)
        assert isinstance(info.value, TransactionAbortedError)
        assert txn.state == "rolled back"
        assert _peek(client, b) == []
        assert _bodies(_peek(client, a)) == ["m"]
        # Rolled back: the message is still ours.
        ra.complete_messages([m])
        # A transaction committed in time still works.
        with client.transaction() as quick:
            sb.send_messages(ServiceBusMessage("quick"), transaction=quick)
    assert _bodies(_peek(client, b)) == ["quick"]


async def test_aio_timeout_counts_from_the_first_operation(
    aclient: aio.ServiceBusClient,
    aadmin: aio.ServiceBusAdministrationClient,
    monkeypatch: pytest.MonkeyPatch,
    fresh: Any,
) -> None:
    monkeypatch.setattr(aio_transaction, "TIMEOUT_S", 1.0)
    b = fresh()
    txn = aclient.transaction()
    await asyncio.sleep(1.2)  # an idle transaction has not started its clock
    async with aclient.get_queue_sender(b) as sb:
        await sb.send_messages(ServiceBusMessage("first"), transaction=txn)
        await asyncio.sleep(1.2)
        with pytest.raises(TransactionTimeoutError):
            await txn.commit()
        assert txn.state == "rolled back"
        with pytest.raises(InvalidArgumentError):
            await txn.commit()
    assert await _apeek(aclient, b) == []
