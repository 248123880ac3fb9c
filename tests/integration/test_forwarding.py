"""Auto-forwarding: queues and subscriptions move their messages (and dead letters) onward."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

import raybus
from raybus import ServiceBusMessage
from raybus.exceptions import InvalidArgumentError
from raybus.management import (
    RuleProperties,
    ServiceBusAdministrationClient,
    SqlRuleFilter,
)


@pytest.fixture
def namespace(module_namespace: str) -> str:
    return module_namespace


def _n(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def _active(admin: ServiceBusAdministrationClient, queue: str) -> int:
    return int(admin.get_queue_runtime_properties(queue).active_message_count)


def _drain(client: raybus.ServiceBusClient, queue: str, n: int, **kw: object) -> list:
    got: list = []
    with client.get_queue_receiver(queue, max_wait_time=2, **kw) as receiver:  # type: ignore[arg-type]
        while len(got) < n:
            more = receiver.receive_messages(n - len(got))
            if not more:
                break
            got += more
            receiver.complete_messages(more)
    return got


def test_a_chain_of_forwarding_queues_delivers_every_message_once_at_its_end(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    a, b, c = _n("a"), _n("b"), _n("c")
    admin.create_queue(c)
    admin.create_queue(b, forward_to=c, partition_count=2)
    admin.create_queue(a, forward_to=b)
    with client.get_queue_sender(a) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(50)])
    _until(lambda: admin.get_queue_runtime_properties(c).active_message_count == 50)
    got = _drain(client, c, 50)
    assert sorted(m.message_id for m in got) == sorted(f"m{i}" for i in range(50))
    for q in (a, b):
        assert admin.get_queue_runtime_properties(q).active_message_count == 0


def test_a_message_forwarded_more_than_four_times_is_dead_lettered_where_it_stops(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    names = [_n(f"h{i}") for i in range(7)]
    admin.create_queue(names[-1])
    for i in range(5, -1, -1):
        admin.create_queue(names[i], forward_to=names[i + 1])
    with client.get_queue_sender(names[0]) as sender:
        sender.send_messages(ServiceBusMessage("hop"))
    # Hops: h0->h1->h2->h3->h4 (four); at h4 it stops.
    _until(lambda: admin.get_queue_runtime_properties(names[4]).dead_letter_message_count == 1)
    dead = _drain(client, names[4], 1, sub_queue="deadletter")
    assert dead[0].dead_letter_reason == "MaxTransferHopCountExceeded"
    assert admin.get_queue_runtime_properties(names[-1]).active_message_count == 0


def test_forwarding_to_a_topic_applies_its_rules(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    topic, src = _n("t"), _n("src")
    admin.create_topic(topic)
    admin.create_subscription(topic, "all")
    red = RuleProperties("red", SqlRuleFilter("color = 'red'"))
    admin.create_subscription(topic, "red", default_rule=red)
    admin.create_queue(src, forward_to=topic)
    with client.get_queue_sender(src) as sender:
        sender.send_messages(
            [
                ServiceBusMessage(str(i), application_properties={"color": c})
                for i, c in enumerate(["red", "blue", "red"])
            ]
        )

    def counts() -> tuple[int, int]:
        return (
            admin.get_subscription_runtime_properties(topic, "all").active_message_count,
            admin.get_subscription_runtime_properties(topic, "red").active_message_count,
        )

    _until(lambda: counts() == (3, 2))


def test_dead_letters_are_forwarded_with_their_source(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    src, dl = _n("src"), _n("dl")
    admin.create_queue(dl)
    admin.create_queue(src, forward_dead_lettered_messages_to=dl)
    with client.get_queue_sender(src) as sender:
        sender.send_messages(ServiceBusMessage("bad"))
    with client.get_queue_receiver(src, max_wait_time=2) as receiver:
        (msg,) = receiver.receive_messages(1)
        receiver.dead_letter_message(msg, reason="poison", error_description="no parse")
    _until(lambda: admin.get_queue_runtime_properties(dl).active_message_count == 1)
    (got,) = _drain(client, dl, 1)
    assert str(got) == "bad"
    assert got.dead_letter_source == src
    # Its reason and description go with it (Service Bus keeps them as properties).
    assert (got.dead_letter_reason, got.dead_letter_error_description) == ("poison", "no parse")
    assert admin.get_queue_runtime_properties(src).dead_letter_message_count == 0


def test_a_disabled_destination_dead_letters_at_the_source(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    src, dst = _n("src"), _n("dst")
    admin.create_queue(dst, status="SendDisabled")
    admin.create_queue(src, forward_to=dst)
    with client.get_queue_sender(src) as sender:
        sender.send_messages(ServiceBusMessage("x"))
    _until(lambda: admin.get_queue_runtime_properties(src).dead_letter_message_count == 1)
    # Not in the transfer dead-letter sub-queue (raybus never moves one there), whose receiver
    # a forwarding source allows, as Service Bus does.
    assert admin.get_queue_runtime_properties(src).transfer_dead_letter_message_count == 0
    with client.get_queue_receiver(src, sub_queue="transferdeadletter") as tdlq:
        started = time.monotonic()
        assert tdlq.receive_messages(max_message_count=10, max_wait_time=0.5) == []
        assert time.monotonic() - started >= 0.45  # waited as on an empty queue
        assert tdlq.peek_messages(10) == []
    (dead,) = _drain(client, src, 1, sub_queue="deadletter")
    assert dead.dead_letter_reason == "MessagingEntityDisabledError"


def test_forwarding_settings_are_checked_and_receivers_are_refused(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    q, dst = _n("q"), _n("dst")
    with pytest.raises(InvalidArgumentError):
        admin.create_queue(q, forward_to="no-such-entity")
    with pytest.raises(InvalidArgumentError):
        admin.create_queue(q, forward_to=q)
    admin.create_queue(dst)
    with pytest.raises(InvalidArgumentError):
        admin.create_queue(q, forward_to=dst, requires_session=True)
    admin.create_queue(q, forward_to=dst)
    with (
        client.get_queue_receiver(q, max_wait_time=1) as receiver,
        pytest.raises(InvalidArgumentError),
    ):
        receiver.receive_messages(1)


@pytest.mark.fault
def test_forwarding_rides_out_a_destination_partition_crash(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    """The destination partition dies while preparing a forwarding transaction (a fail point):
    the forwarder's commit is rolled back with a transient cause, it releases the batch and
    tries again once the partition is back, so every message arrives once and none is
    dead-lettered at the source."""
    import ray

    from raybus._sync import run

    src, dest = _n("src"), _n("dest")
    admin.create_queue(dest)
    admin.create_queue(src, forward_to=dest)
    (handle,) = run(client._aio._conn.route(dest)).partitions
    ray.get(handle.arm_failpoint.remote("participant.before_prepare"))
    n = 200
    with client.get_queue_sender(src) as sender:
        for i in range(0, n, 50):
            sender.send_messages([ServiceBusMessage(f"m{j}") for j in range(i, i + 50)])
    # The destination restarts (~1 s, longer on a loaded machine) before the retry lands.
    _until(lambda: _active(admin, dest) == n, timeout=60)
    got = _drain(client, dest, n)
    assert sorted(m.body for m in got) == sorted(f"m{i}" for i in range(n))
    assert _drain(client, src, 1, sub_queue="deadletter") == []


def test_a_message_without_a_session_id_for_a_session_queue_is_dead_lettered_at_the_source(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    # Service Bus dead-letters it at the source; the others go on.
    src, dst = _n("src"), _n("sess")
    admin.create_queue(dst, requires_session=True)
    admin.create_queue(src, forward_to=dst)
    with client.get_queue_sender(src) as sender:
        sender.send_messages(
            [ServiceBusMessage("plain"), ServiceBusMessage("in s1", session_id="s1")]
        )
    _until(lambda: admin.get_queue_runtime_properties(src).dead_letter_message_count == 1)
    _until(lambda: admin.get_queue_runtime_properties(dst).active_message_count == 1)
    (dead,) = _drain(client, src, 1, sub_queue=raybus.ServiceBusSubQueue.DEAD_LETTER)
    assert (str(dead), dead.dead_letter_reason) == ("plain", "Session ID is null")
    with client.get_queue_receiver(dst, session_id="s1", max_wait_time=5) as receiver:
        (got,) = receiver.receive_messages()
        assert str(got) == "in s1"
        receiver.complete_message(got)
    assert admin.get_queue_runtime_properties(dst).dead_letter_message_count == 0
