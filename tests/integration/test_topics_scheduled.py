"""Messages scheduled on a topic: held by the topic (its router) and numbered by it, published
to the subscriptions of their time through the rules as they stand then, cancellable on the
topic sender all or none, and kept across a router restart (``raybus._core.topic_schedule``).

Real durations, kept short: messages are scheduled 1.5-4 s ahead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import ray
import topics_support
from topics_support import RAD, _bodies, _drain, _name

import raybus
from raybus import ServiceBusMessage, aio
from raybus.exceptions import (
    MessageNotFoundError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusConnectionError,
    ServiceBusQuotaExceededError,
)
from raybus.management import (
    CorrelationRuleFilter,
    EntityStatus,
    RuleProperties,
    ServiceBusAdministrationClient,
)

namespace = topics_support.namespace
_delete_topics = topics_support._delete_topics


@pytest.fixture
def t(admin: ServiceBusAdministrationClient) -> Iterator[str]:
    """A topic of the test's own (its scheduled count is the test's)."""
    name = _name()
    admin.create_topic(name)
    yield name


def _soon(seconds: float) -> datetime:
    return datetime.now(timezone.utc) + timedelta(seconds=seconds)


def _scheduled(admin: ServiceBusAdministrationClient, topic: str) -> int:
    return admin.get_topic_runtime_properties(topic).scheduled_message_count


def _held_until_late_subscription(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    factor: float,
    by_send: bool = False,
) -> tuple[str, datetime, float] | None:
    """On a topic of its own, schedule two messages ahead, check the topic holds them, and
    create a subscription meanwhile; ``None`` (topic deleted) if the set-up itself outlasted
    the schedule. The lead is ``factor`` times what creating the topic and two subscriptions
    took (at least 4 s): the steps after it, one more subscription and four calls, cost about
    half as much, and a loaded machine slows both alike (a worker process to start for each
    subscription, up to 40 s each on a machine loaded to 2.5 times its cores). ``by_send``:
    sent with ``scheduled_enqueue_time_utc`` instead of scheduled."""
    t = _name()
    started = time.monotonic()
    admin.create_topic(t)
    admin.create_subscription(t, "all")
    admin.create_subscription(
        t, "x", default_rule=RuleProperties("x", CorrelationRuleFilter(label="x"))
    )
    lead = max(4.0, factor * (time.monotonic() - started))
    when = _soon(lead)
    with client.get_topic_sender(t) as sender:
        if by_send:
            sender.send_messages(
                [
                    ServiceBusMessage("plain", scheduled_enqueue_time_utc=when),
                    ServiceBusMessage("labelled", subject="x", scheduled_enqueue_time_utc=when),
                ]
            )
        else:
            seqs = sender.schedule_messages(
                [ServiceBusMessage("plain"), ServiceBusMessage("labelled", subject="x")], when
            )
            assert len(seqs) == 2 and seqs[1] == seqs[0] + 1
    scheduled = _scheduled(admin, t)
    in_all = admin.get_subscription_runtime_properties(t, "all").total_message_count
    with client.get_subscription_receiver(t, "all") as peeker:
        peeked = peeker.peek_messages(10)
    # A subscription created meanwhile gets them: the rules are those of their time.
    admin.create_subscription(t, "late")
    if datetime.now(timezone.utc) >= when:  # what was seen may be after their time
        admin.delete_topic(t)
        return None
    # Held by the topic: no subscription has them yet, not even scheduled.
    assert (scheduled, in_all, peeked) == (2, 0, [])
    return t, when, lead


@pytest.mark.timeout(600)  # a loaded machine stretches the set-up and so the schedule
@pytest.mark.parametrize("by_send", [False, True], ids=["schedule_messages", "send_messages"])
def test_scheduled_messages_wait_in_the_topic_and_reach_the_subscriptions_of_their_time(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, by_send: bool
) -> None:
    """Both ways to schedule: ``schedule_messages``, and ``send_messages`` of messages whose
    ``scheduled_enqueue_time_utc`` is to come (which had fanned out at once and waited in
    each subscription, shown by its peek and counts)."""
    # The lead follows the machine's speed (CI once took 2.4x its usual time); should the
    # set-up still outlast it, a fresh topic gets a longer one rather than a false failure.
    for factor in (1.5, 4):
        held = _held_until_late_subscription(client, admin, factor, by_send)
        if held is not None:
            break
    else:
        pytest.fail("the set-up outlasted the schedule twice")
    t, when, lead = held

    # Each drain waits past their time (a loaded machine publishes late, never early).
    got = {
        sub: _drain(client, t, sub, n, timeout=lead + 60)
        for sub, n in (("all", 2), ("x", 1), ("late", 2))
    }
    assert sorted(_bodies(got["all"])) == sorted(_bodies(got["late"])) == ["labelled", "plain"]
    assert _bodies(got["x"]) == ["labelled"]
    for msg in got["all"] + got["x"]:
        assert msg.scheduled_enqueue_time_utc is not None
        assert abs((msg.scheduled_enqueue_time_utc - when).total_seconds()) < 0.01
        assert msg.enqueued_time_utc is not None
        assert msg.enqueued_time_utc >= when - timedelta(seconds=0.1)  # not before its time
    assert _scheduled(admin, t) == 0


def test_cancel_on_the_topic_sender_is_all_or_none_and_cancelled_messages_never_arrive(
    aclient: aio.ServiceBusClient, aadmin: aio.ServiceBusAdministrationClient, t: str
) -> None:
    async def run() -> list[str]:
        await aadmin.create_subscription(t, "all")
        async with aclient.get_topic_sender(t) as sender:
            seqs = await sender.schedule_messages(
                [ServiceBusMessage(f"m{i}") for i in range(3)], _soon(1.5)
            )
            with pytest.raises(MessageNotFoundError, match=str(seqs[2] + 100)):
                await sender.cancel_scheduled_messages([seqs[0], seqs[2] + 100])
            runtime = await aadmin.get_topic_runtime_properties(t)
            assert runtime.scheduled_message_count == 3  # nothing cancelled
            await sender.cancel_scheduled_messages(seqs[0])
            with pytest.raises(MessageNotFoundError):
                await sender.cancel_scheduled_messages(seqs[0])  # cancelled already
        async with aclient.get_subscription_receiver(t, "all", max_wait_time=10) as receiver:
            got: list[str] = []
            while len(got) < 2:
                batch = await receiver.receive_messages(10, max_wait_time=10)
                assert batch, f"the scheduled messages did not arrive: {got}"
                for msg in batch:
                    got.append(str(msg))
                    await receiver.complete_message(msg)
            # Nothing else comes: the cancelled message was never published.
            assert await receiver.receive_messages(10, max_wait_time=1) == []
        return sorted(got)

    assert asyncio.run(run()) == ["m1", "m2"]


@pytest.mark.fault
def test_scheduled_messages_survive_a_router_restart(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, t: str
) -> None:
    """``ray.kill`` returns before the old process is gone: the cancel may be answered by it
    (logged, then replayed by the new one) or by the new one; a try that fails while the
    router restarts has an unknown outcome, so a later "not found" is also a success — when
    it comes before the message's time. A restart that outlasts that time (a loaded machine)
    lets the new router publish it first, and then "not found" is the truth: it may arrive."""
    admin.create_subscription(t, "all")
    _entry, router = ray.get(client._aio._conn.registry.get_topic.remote(t))
    kept_at, drop_at = _soon(3), _soon(4.5)
    with client.get_topic_sender(t) as sender:
        sender.schedule_messages(ServiceBusMessage("kept"), kept_at)
        (drop,) = sender.schedule_messages(ServiceBusMessage("cancelled"), drop_at)
        ray.kill(router, no_restart=False)
        deadline = time.monotonic() + 120  # a restart under heavy load took up to 54 s
        while True:
            try:
                sender.cancel_scheduled_messages(drop)
                cancelled = True
                break
            except MessageNotFoundError:  # an earlier try cancelled it, or its time came
                cancelled = datetime.now(timezone.utc) < drop_at
                break
            except ServiceBusConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
    # The kept one arrives once, at its time (from the new router, which may still be
    # starting); the cancelled one never: watch until after its time.
    bodies: list[Any] = []
    with client.get_subscription_receiver(t, "all", receive_mode=RAD) as receiver:
        deadline = time.monotonic() + 120
        while "kept" not in bodies or datetime.now(timezone.utc) < drop_at + timedelta(seconds=1):
            assert time.monotonic() < deadline, f"the kept message did not arrive: {bodies}"
            bodies += _bodies(receiver.receive_messages(10, max_wait_time=1))
        bodies += _bodies(receiver.receive_messages(10, max_wait_time=0.2))
    assert sorted(bodies) in ((["kept"],) if cancelled else (["kept"], ["cancelled", "kept"]))
    assert _scheduled(admin, t) == 0
    with client.get_topic_sender(t) as sender:  # the new router, from its log
        with pytest.raises(MessageNotFoundError):
            sender.cancel_scheduled_messages(drop)
        assert sender.schedule_messages(ServiceBusMessage("next"), _soon(60)) == [drop + 1]


def test_a_time_in_the_past_publishes_at_once(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, t: str
) -> None:
    admin.create_subscription(t, "all")
    with client.get_topic_sender(t) as sender:
        (seq,) = sender.schedule_messages(ServiceBusMessage("now"), _soon(-60))
    assert seq >= 1
    assert _bodies(_drain(client, t, "all", 1, timeout=10)) == ["now"]


def test_a_send_mixing_now_and_later_delivers_now_and_holds_later_in_the_topic(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, t: str
) -> None:
    admin.create_subscription(t, "all")
    with client.get_topic_sender(t) as sender:
        sender.send_messages(
            [
                ServiceBusMessage("now"),
                ServiceBusMessage("later", scheduled_enqueue_time_utc=_soon(600)),
                ServiceBusMessage("past", scheduled_enqueue_time_utc=_soon(-60)),
            ]
        )
    assert sorted(_bodies(_drain(client, t, "all", 2, timeout=10))) == ["now", "past"]
    assert _scheduled(admin, t) == 1
    assert admin.get_subscription_runtime_properties(t, "all").total_message_count == 0
    with client.get_subscription_receiver(t, "all") as peeker:
        assert peeker.peek_messages(10) == []


def test_a_send_mixing_now_and_later_that_a_subscription_refuses_schedules_nothing(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    """All or none: the group's scheduled message is held first, and cancelled when the
    delivery of the others is refused (a full subscription)."""
    t = _name()
    admin.create_topic(t, max_size_in_megabytes=1)
    admin.create_subscription(t, "all")
    body = b"x" * 200_000
    with client.get_topic_sender(t) as sender:
        with pytest.raises(ServiceBusQuotaExceededError):
            for _ in range(10):
                sender.send_messages(ServiceBusMessage(body))
        with pytest.raises(ServiceBusQuotaExceededError):
            sender.send_messages(
                [
                    ServiceBusMessage(body),
                    ServiceBusMessage("later", scheduled_enqueue_time_utc=_soon(600)),
                ]
            )
    assert _scheduled(admin, t) == 0


def test_a_topic_that_refuses_sends_schedules_nothing(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, t: str
) -> None:
    topic = admin.get_topic(t)
    admin.update_topic(topic, status=EntityStatus.SEND_DISABLED)
    with client.get_topic_sender(t) as sender, pytest.raises(MessagingEntityDisabledError):
        sender.schedule_messages(ServiceBusMessage("x"), _soon(60))
    assert _scheduled(admin, t) == 0


def test_schedule_and_cancel_on_a_deleted_topic_raise_entity_not_found(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient, t: str
) -> None:
    """The sender's route to the router is cached; the topic's deletion takes the router
    (and its schedule) away: both calls name the missing entity, and the route is dropped."""
    with client.get_topic_sender(t) as sender:
        (seq,) = sender.schedule_messages(ServiceBusMessage("x"), _soon(60))
        admin.delete_topic(t)
        with pytest.raises(MessagingEntityNotFoundError):
            sender.schedule_messages(ServiceBusMessage("y"), _soon(60))
        assert client._aio._conn.cached_route(t) is None  # dropped: the next call asks again
        with pytest.raises(MessagingEntityNotFoundError):
            sender.cancel_scheduled_messages(seq)
