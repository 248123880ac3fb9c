"""Queue administration against a real local Ray cluster: create, get, update, delete, list,
runtime counters, and the errors each refusal raises (sync and asyncio clients)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import raybus
from raybus import EntityStatus, ServiceBusMessage, ServiceBusSubQueue, aio
from raybus.exceptions import (
    InvalidArgumentError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityNotFoundError,
)
from raybus.management import MAX_DURATION, QueueProperties, ServiceBusAdministrationClient


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    # Each test creates its own uniquely named queues; see ``module_namespace`` in conftest.
    return module_namespace


def _name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _near_now(when: datetime | None) -> bool:
    assert when is not None
    assert when.tzinfo is not None
    return abs((datetime.now(timezone.utc) - when).total_seconds()) < 60


# ------------------------------------------------------------------------------ create / get


def test_create_queue_without_options_has_the_service_bus_defaults(
    admin: ServiceBusAdministrationClient,
) -> None:
    name = _name()
    props = admin.create_queue(name)
    assert props.name == name
    assert props.lock_duration == timedelta(seconds=60)
    assert props.max_delivery_count == 10
    assert props.default_message_time_to_live == MAX_DURATION
    assert props.auto_delete_on_idle == MAX_DURATION
    assert props.dead_lettering_on_message_expiration is False
    assert props.requires_duplicate_detection is False
    assert props.duplicate_detection_history_time_window == timedelta(minutes=10)
    assert props.requires_session is False
    assert props.enable_batched_operations is True
    assert props.max_size_in_megabytes == 1024
    assert props.status is EntityStatus.ACTIVE


def test_create_queue_applies_given_options_with_durations_as_timedelta_or_seconds(
    admin: ServiceBusAdministrationClient,
) -> None:
    props = admin.create_queue(
        _name(),
        lock_duration=0.5,
        default_message_time_to_live=timedelta(minutes=90),
        max_delivery_count=3,
        dead_lettering_on_message_expiration=True,
        user_metadata="meta",
    )
    assert props.lock_duration == timedelta(seconds=0.5)
    assert props.default_message_time_to_live == timedelta(minutes=90)
    assert props.max_delivery_count == 3
    assert props.dead_lettering_on_message_expiration is True
    assert props.user_metadata == "meta"


def test_options_as_the_sdk_passes_them_none_for_defaults_and_iso_8601_durations(
    admin: ServiceBusAdministrationClient,
) -> None:
    """The SDK's keywords default to None ("the service's default"), and its models take
    durations as ISO 8601 text; both raised InvalidArgumentError. At an update None keeps a
    setting, except that it unsets forwarding and user metadata (as the SDK, which leaves
    what is None out of the description the update replaces)."""
    target = _name("target")
    admin.create_queue(target)
    name = _name()
    props = admin.create_queue(
        name,
        lock_duration="PT45S",
        max_delivery_count=None,
        default_message_time_to_live="P1DT2H",
        auto_delete_on_idle=None,
        forward_to=target,
        user_metadata="m",
    )
    assert props.lock_duration == timedelta(seconds=45) and props.max_delivery_count == 10
    assert props.default_message_time_to_live == timedelta(days=1, hours=2)
    assert props.forward_to == target
    got = admin.get_queue(name)
    got.lock_duration = "PT2M"  # type: ignore[assignment]  # as the SDK's models take it
    updated = admin.update_queue(got, max_delivery_count=None, forward_to=None, user_metadata=None)
    assert updated.lock_duration == timedelta(minutes=2) and updated.max_delivery_count == 10
    assert (updated.forward_to, updated.user_metadata) == (None, None)
    with pytest.raises(InvalidArgumentError, match="ISO 8601"):
        admin.create_queue(_name(), lock_duration="one minute")
    topic = admin.create_topic(_name("t"), default_message_time_to_live="PT1H", user_metadata=None)
    assert topic.default_message_time_to_live == timedelta(hours=1)
    sub = admin.create_subscription(topic.name, "s", lock_duration="PT30S", forward_to=None)
    assert sub.lock_duration == timedelta(seconds=30) and sub.forward_to is None
    admin.delete_topic(topic.name)


def test_get_queue_returns_the_created_settings_under_any_casing_of_the_name(
    admin: ServiceBusAdministrationClient,
) -> None:
    name = _name("Orders")
    created = admin.create_queue(name, max_delivery_count=4, lock_duration=timedelta(seconds=5))
    assert admin.get_queue(name) == created
    upper = admin.get_queue(name.upper())
    assert upper == created
    assert upper.name == name  # reported as created


def test_the_sdks_enable_partitioning_and_topic_options_are_taken(
    admin: ServiceBusAdministrationClient,
) -> None:
    # Code written for the SDK passes these: a queue is partitioned (raybus's count may change
    # later), a topic takes them and reads back Service Bus's defaults.
    q = _name()
    made = admin.create_queue(q, enable_partitioning=True)
    assert (made.partition_count, made.enable_partitioning) == (4, True)
    got = admin.get_queue(q)
    assert got.enable_partitioning and got.partition_count == 4
    with pytest.raises(InvalidArgumentError):
        admin.update_queue(got, enable_partitioning=False)
    assert admin.update_queue(got, enable_partitioning=True).partition_count == 4
    assert not admin.create_queue(_name(), enable_partitioning=False).enable_partitioning
    # A listing reads as the SDK's ItemPaged: item by item, or by page.
    assert q in [p.name for page in admin.list_queues().by_page() for p in page]
    t = _name("t")
    topic = admin.create_topic(
        t, enable_partitioning=True, enable_express=True, filtering_messages_before_publishing=True
    )
    assert (topic.enable_partitioning, topic.enable_express) == (False, False)
    updated = admin.update_topic(
        admin.get_topic(t), enable_express=False, max_size_in_megabytes=2048
    )
    assert updated.max_size_in_megabytes == 2048
    admin.delete_topic(t)


def test_create_queue_with_taken_name_in_any_casing_raises_already_exists(
    admin: ServiceBusAdministrationClient,
) -> None:
    name = _name("Mixed")
    created = admin.create_queue(name, max_delivery_count=4)
    for other in (name, name.upper(), name.lower()):
        with pytest.raises(MessagingEntityAlreadyExistsError):
            admin.create_queue(other)
    assert admin.get_queue(name) == created  # the original is untouched


def test_create_queue_accepts_a_260_character_path_name(
    admin: ServiceBusAdministrationClient,
) -> None:
    name = "a/" + "b" * 258
    assert admin.create_queue(name).name == name


# ------------------------------------------------------------------------------ update


def test_update_queue_changes_edited_fields_and_keyword_overrides(
    admin: ServiceBusAdministrationClient,
) -> None:
    name = _name()
    props = admin.create_queue(name)
    props.lock_duration = timedelta(seconds=45)
    props.default_message_time_to_live = timedelta(hours=2)
    props.dead_lettering_on_message_expiration = True
    props.user_metadata = "changed"
    updated = admin.update_queue(props, max_delivery_count=7, status=EntityStatus.SEND_DISABLED)
    got = admin.get_queue(name)
    assert got == updated
    assert got.lock_duration == timedelta(seconds=45)
    assert got.default_message_time_to_live == timedelta(hours=2)
    assert got.dead_lettering_on_message_expiration is True
    assert got.user_metadata == "changed"
    assert got.max_delivery_count == 7
    assert got.status is EntityStatus.SEND_DISABLED


def test_update_queue_refusals_raise_invalid_argument_and_change_nothing(
    admin: ServiceBusAdministrationClient,
) -> None:
    name = _name()
    original = admin.create_queue(name)

    immutable = admin.get_queue(name)
    immutable.requires_duplicate_detection = True
    with pytest.raises(InvalidArgumentError) as info:
        admin.update_queue(immutable)
    assert info.value.argument == "requires_duplicate_detection"

    with pytest.raises(InvalidArgumentError):
        admin.update_queue(admin.get_queue(name), lock_duration=timedelta(minutes=6))
    with pytest.raises(InvalidArgumentError):
        admin.update_queue(admin.get_queue(name), no_such_option=1)
    with pytest.raises(InvalidArgumentError):
        admin.update_queue({"name": name})  # type: ignore[arg-type]
    assert admin.get_queue(name) == original


def test_update_queue_of_max_delivery_count_applies_to_later_deliveries(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name, max_delivery_count=10)
    admin.update_queue(admin.get_queue(name), max_delivery_count=1)
    with client.get_queue_sender(name) as sender:
        sender.send_messages(ServiceBusMessage("once"))
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        (msg,) = receiver.receive_messages()
        receiver.abandon_message(msg)
        assert receiver.receive_messages(max_wait_time=0.5) == []
    with client.get_queue_receiver(
        name, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5
    ) as dlq:
        (dead,) = dlq.receive_messages()
        assert dead.body == "once"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        dlq.complete_message(dead)


# ------------------------------------------------------------------------------ delete / list


def test_delete_queue_by_any_casing_removes_it_and_frees_the_name(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name("Case")
    admin.create_queue(name)
    with client.get_queue_sender(name) as sender:
        sender.send_messages(ServiceBusMessage("old"))
    admin.delete_queue(name.upper())
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_queue(name)
    assert name not in {q.name for q in admin.list_queues()}
    # The name is free again, and the new queue starts empty.
    assert admin.create_queue(name).name == name
    assert admin.get_queue_runtime_properties(name).active_message_count == 0


def test_a_sender_holding_a_deleted_queues_route_reaches_the_queue_made_again(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    """The sender's cached route names the dead queue's actors. Its next send finds them gone,
    rechecks the name, learns the new incarnation and reports the old queue deleted (the send
    is not silently redirected); the send after that reaches the new queue. Nothing reaches
    the new queue twice and nothing is lost once a send has succeeded."""
    name = _name("again")
    admin.create_queue(name)
    with client.get_queue_sender(name) as sender:
        sender.send_messages(ServiceBusMessage("old"))
        admin.delete_queue(name)
        admin.create_queue(name)
        sent = 0
        for body in ("new-1", "new-2"):
            try:
                sender.send_messages(ServiceBusMessage(body))
                sent += 1
            except MessagingEntityNotFoundError:
                assert body == "new-1", "only the first send may see the old queue gone"
        sender.send_messages(ServiceBusMessage("new-3"))
    with client.get_queue_receiver(name, max_wait_time=2) as receiver:
        got = receiver.receive_messages(max_message_count=10, max_wait_time=3)
        receiver.complete_messages(got)
    bodies = [str(m) for m in got]
    assert "old" not in bodies and len(bodies) == sent + 1 and bodies[-1] == "new-3"


def test_list_queues_and_their_runtime_properties_cover_every_queue(
    namespace: str, client: raybus.ServiceBusClient
) -> None:
    full, empty = _name(), _name()
    with ServiceBusAdministrationClient(namespace) as admin:
        admin.create_queue(full)
        admin.create_queue(empty)
        with client.get_queue_sender(full) as sender:
            sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        listed = admin.list_queues()
        assert all(isinstance(q, QueueProperties) for q in listed)
        assert {full, empty} <= {q.name for q in listed}
        by_name = {r.name: r for r in admin.list_queues_runtime_properties()}
        assert by_name[full].active_message_count == 2
        assert by_name[empty].active_message_count == 0
    admin.close()  # closing again is harmless


# ------------------------------------------------------------------------------ runtime properties


def test_runtime_properties_count_active_dead_lettered_and_scheduled_messages(
    admin: ServiceBusAdministrationClient,
    client: raybus.ServiceBusClient,
    eventually: Callable[..., None],
) -> None:
    name = _name()
    admin.create_queue(name)
    empty = admin.get_queue_runtime_properties(name)
    assert empty.name == name
    assert (empty.active_message_count, empty.dead_letter_message_count) == (0, 0)
    assert empty.scheduled_message_count == 0
    assert empty.size_in_bytes == 0
    with client.get_queue_sender(name) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(4)])
        sender.schedule_messages(
            ServiceBusMessage("later"), datetime.now(timezone.utc) + timedelta(hours=1)
        )
    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        dead, deferred, locked = receiver.receive_messages(3)
        receiver.dead_letter_message(dead, reason="test")
        receiver.defer_message(deferred)

        # Locked and deferred messages count as active; one message was never received.
        # (The settlements above were sent without waiting, hence ``eventually``.)
        def counted() -> None:
            runtime = admin.get_queue_runtime_properties(name)
            assert runtime.active_message_count == 3
            assert runtime.dead_letter_message_count == 1
            assert runtime.scheduled_message_count == 1
            assert runtime.total_message_count == 5
            assert runtime.size_in_bytes > 0

        eventually(counted)
        receiver.complete_message(locked)


def test_runtime_properties_report_times_and_a_size_that_follows_the_messages(
    admin: ServiceBusAdministrationClient, client: raybus.ServiceBusClient
) -> None:
    name = _name()
    admin.create_queue(name)
    before = admin.get_queue_runtime_properties(name)
    assert _near_now(before.created_at_utc)
    assert _near_now(before.updated_at_utc)
    assert _near_now(before.accessed_at_utc)
    assert before.updated_at_utc >= before.created_at_utc  # type: ignore[operator]

    admin.update_queue(admin.get_queue(name), max_delivery_count=3)
    with client.get_queue_sender(name) as sender:
        sender.send_messages([ServiceBusMessage(b"x" * 1000), ServiceBusMessage(b"y" * 10)])
    after = admin.get_queue_runtime_properties(name)
    assert after.created_at_utc == before.created_at_utc
    assert after.updated_at_utc > before.updated_at_utc  # type: ignore[operator]
    assert after.accessed_at_utc > before.accessed_at_utc  # type: ignore[operator]
    assert after.size_in_bytes > 1000

    with client.get_queue_receiver(name, max_wait_time=5) as receiver:
        (big,) = receiver.receive_messages()
        receiver.complete_messages([big])
    remaining = admin.get_queue_runtime_properties(name).size_in_bytes
    assert remaining > 0
    assert after.size_in_bytes - remaining > 1000


# ------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("operation", ["get", "update", "delete", "runtime"])
def test_operation_on_unknown_queue_raises_not_found(
    admin: ServiceBusAdministrationClient, operation: str
) -> None:
    name = _name("missing")
    calls = {
        "get": lambda: admin.get_queue(name),
        "update": lambda: admin.update_queue(QueueProperties(name)),
        "delete": lambda: admin.delete_queue(name),
        "runtime": lambda: admin.get_queue_runtime_properties(name),
    }
    with pytest.raises(MessagingEntityNotFoundError):
        calls[operation]()


@pytest.mark.parametrize(
    "bad_name", ["-bad", "a//b", "x" * 300, "", "bad-", "has space", "q/$DeadLetterQueue"]
)
def test_create_queue_with_invalid_name_raises_invalid_argument(
    admin: ServiceBusAdministrationClient, bad_name: str
) -> None:
    with pytest.raises(InvalidArgumentError):
        admin.create_queue(bad_name)


@pytest.mark.parametrize("bad_name", ["-bad", "a//b", "x" * 300])
def test_get_queue_with_invalid_name_raises_invalid_argument(
    admin: ServiceBusAdministrationClient, bad_name: str
) -> None:
    with pytest.raises(InvalidArgumentError):
        admin.get_queue(bad_name)


def test_create_queue_with_unknown_option_raises_invalid_argument_and_creates_nothing(
    admin: ServiceBusAdministrationClient,
) -> None:
    name = _name()
    with pytest.raises(InvalidArgumentError) as info:
        admin.create_queue(name, enable_magic=True)
    assert info.value.argument == "enable_magic"
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_queue(name)


@pytest.mark.parametrize(
    "options",
    [
        {"lock_duration": timedelta(minutes=5, seconds=1)},
        {"lock_duration": timedelta(milliseconds=50)},
        {"max_delivery_count": 0},
        {"duplicate_detection_history_time_window": timedelta(seconds=19)},
        {"default_message_time_to_live": timedelta(0)},
        {"auto_delete_on_idle": timedelta(minutes=4)},
        {"max_size_in_megabytes": 0},
        {"status": "Sleeping"},
        {"requires_duplicate_detection": "yes"},
    ],
    ids=lambda o: next(iter(o)),
)
def test_create_queue_with_out_of_range_option_raises_invalid_argument(
    admin: ServiceBusAdministrationClient, options: dict[str, object]
) -> None:
    name = _name()
    with pytest.raises(InvalidArgumentError):
        admin.create_queue(name, **options)
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_queue(name)


def test_create_queue_error_is_a_value_error_for_bad_arguments(
    admin: ServiceBusAdministrationClient,
) -> None:
    with pytest.raises(ValueError):
        admin.create_queue("-bad")


# ------------------------------------------------------------------------------ asyncio client


async def test_aio_create_get_update_delete_queue(
    aadmin: aio.ServiceBusAdministrationClient,
) -> None:
    name = _name("Aio")
    created = await aadmin.create_queue(name, max_delivery_count=5)
    assert created.max_delivery_count == 5
    with pytest.raises(MessagingEntityAlreadyExistsError):
        await aadmin.create_queue(name.swapcase())
    assert await aadmin.get_queue(name.upper()) == created

    created.lock_duration = timedelta(seconds=20)
    updated = await aadmin.update_queue(created, max_delivery_count=6)
    assert updated.lock_duration == timedelta(seconds=20)
    assert updated.max_delivery_count == 6
    assert await aadmin.get_queue(name) == updated
    with pytest.raises(InvalidArgumentError):
        await aadmin.update_queue(updated, requires_duplicate_detection=True)
    with pytest.raises(InvalidArgumentError):
        await aadmin.update_queue(updated, lock_duration=timedelta(minutes=10))
    assert await aadmin.get_queue(name) == updated

    await aadmin.delete_queue(name)
    with pytest.raises(MessagingEntityNotFoundError):
        await aadmin.get_queue(name)


async def test_aio_list_queues_and_runtime_properties_count_messages(
    namespace: str, aclient: aio.ServiceBusClient
) -> None:
    name = _name()
    async with aio.ServiceBusAdministrationClient(namespace) as aadmin:
        await aadmin.create_queue(name)
        assert name in {q.name for q in await aadmin.list_queues()}
        async with aclient.get_queue_sender(name) as sender:
            await sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
            await sender.schedule_messages(
                ServiceBusMessage("later"), datetime.now(timezone.utc) + timedelta(hours=1)
            )
        async with aclient.get_queue_receiver(name, max_wait_time=5) as receiver:
            (msg,) = await receiver.receive_messages()
            await receiver.dead_letter_message(msg)
        runtime = await aadmin.get_queue_runtime_properties(name)
        assert runtime.active_message_count == 1
        assert runtime.dead_letter_message_count == 1
        assert runtime.scheduled_message_count == 1
        assert runtime.size_in_bytes > 0
        assert _near_now(runtime.created_at_utc)
        assert _near_now(runtime.updated_at_utc)
        assert _near_now(runtime.accessed_at_utc)
        listed = {r.name: r for r in await aadmin.list_queues_runtime_properties()}
        assert listed[name].active_message_count == 1


@contextlib.contextmanager
def _registry_calls(aadmin: aio.ServiceBusAdministrationClient) -> Iterator[list[str]]:
    """The names of the registry methods ``aadmin`` calls inside the block, in order."""
    calls: list[str] = []
    real = aadmin._call

    async def spy(entity: Any, method: str, *args: Any) -> Any:
        calls.append(method)
        return await real(entity, method, *args)

    aadmin._call = spy  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        aadmin._call = real  # type: ignore[method-assign]


async def test_aio_queue_runtime_property_list_asks_the_registry_once_and_matches_each_queue(
    namespace: str, aclient: aio.ServiceBusClient
) -> None:
    """One registry call answers every queue's counts (``queue_counts``), and each answer is
    what ``get_queue_runtime_properties`` says of that queue."""
    names = [_name() for _ in range(3)]
    async with aio.ServiceBusAdministrationClient(namespace) as aadmin:
        for k, q in enumerate(names):
            await aadmin.create_queue(q)
            async with aclient.get_queue_sender(q) as sender:
                await sender.send_messages([ServiceBusMessage(b"x") for _ in range(k + 1)])
        with _registry_calls(aadmin) as calls:
            listed = {r.name: r for r in await aadmin.list_queues_runtime_properties()}
        assert calls == ["list_queues", "queue_counts"]
        with pytest.raises(InvalidArgumentError, match="names"):
            await aadmin._call(None, "queue_counts", names[0])  # one name, not a list
        # Only queues are answered: a subscription, a topic or a missing name gives None.
        topic = _name("t")
        await aadmin.create_topic(topic)
        await aadmin.create_subscription(topic, "s")
        others = [f"{topic}/Subscriptions/s", topic, _name()]
        assert await aadmin._call(None, "queue_counts", others) == [None, None, None]
        await aadmin.delete_topic(topic)
        for k, q in enumerate(names):
            one = await aadmin.get_queue_runtime_properties(q)
            assert listed[q].active_message_count == one.active_message_count == k + 1
            assert listed[q].size_in_bytes == one.size_in_bytes > 0
            assert listed[q].partition_count == one.partition_count
            assert listed[q].created_at_utc == one.created_at_utc
        for q in names:
            await aadmin.delete_queue(q)


async def test_aio_topic_and_subscription_runtime_property_lists_ask_the_registry_once_each(
    namespace: str, aclient: aio.ServiceBusClient
) -> None:
    """The topics' counts come in one registry call (``topics_counts``), a topic's
    subscriptions' in one more (``subscription_counts``), and each answer is what the
    per-entity ``get_*_runtime_properties`` says."""
    topics = [_name("t") for _ in range(2)]
    async with aio.ServiceBusAdministrationClient(namespace) as aadmin:
        for t in topics:
            await aadmin.create_topic(t)
            for sub in ("a", "b", "c"):
                await aadmin.create_subscription(t, sub)
        await aadmin.delete_rule(topics[0], "b", "$Default")  # b takes nothing
        async with aclient.get_topic_sender(topics[0]) as sender:
            await sender.send_messages([ServiceBusMessage(b"x") for _ in range(3)])
            await sender.schedule_messages(
                ServiceBusMessage(b"later"), datetime.now(timezone.utc) + timedelta(hours=1)
            )
        with _registry_calls(aadmin) as calls:
            listed = {r.name: r for r in await aadmin.list_topics_runtime_properties()}
        assert calls == ["list_topics", "topics_counts"]
        with _registry_calls(aadmin) as calls:
            subs = await aadmin.list_subscriptions_runtime_properties(topics[0])
        assert calls == ["list_subscriptions", "subscription_counts"]
        assert [(s.topic_name, s.name) for s in subs] == [(topics[0], n) for n in "abc"]
        assert [s.active_message_count for s in subs] == [3, 0, 3]
        for s in subs:
            with _registry_calls(aadmin) as calls:
                one = await aadmin.get_subscription_runtime_properties(topics[0], s.name)
            assert calls == ["subscription_runtime"]  # settings and counts in one call
            assert s == one
        with pytest.raises(MessagingEntityNotFoundError):
            await aadmin.get_subscription_runtime_properties(topics[0], "missing")
        for t in topics:
            one = await aadmin.get_topic_runtime_properties(t)
            assert listed[t].subscription_count == one.subscription_count == 3
            assert listed[t].scheduled_message_count == one.scheduled_message_count
            assert listed[t].size_in_bytes == one.size_in_bytes
            assert listed[t].created_at_utc == one.created_at_utc
        assert listed[topics[0]].scheduled_message_count == 1
        assert listed[topics[0]].size_in_bytes > listed[topics[1]].size_in_bytes == 0
        # Names that are no topic, or no subscription of the topic, are answered None.
        q = _name()
        await aadmin.create_queue(q)
        assert await aadmin._call(None, "topics_counts", [q, _name(), topics[1]]) == [
            None,
            None,
            await aadmin._call(topics[1], "topic_counts", topics[1]),
        ]
        assert await aadmin._call(
            topics[0], "subscription_counts", topics[0], ["gone", "a/../b", "c"]
        ) == [None, None, await aadmin._call(None, "counts", f"{topics[0]}/Subscriptions/c")]
        # Bad input is refused, naming the argument.
        with pytest.raises(InvalidArgumentError, match="names"):
            await aadmin._call(None, "topics_counts", topics[0])  # one name, not a list
        with pytest.raises(InvalidArgumentError, match="names"):
            await aadmin._call(topics[0], "subscription_counts", topics[0], [1])
        with pytest.raises(MessagingEntityNotFoundError):
            await aadmin._call(q, "subscription_counts", q, ["a"])  # a queue is no topic
        await aadmin.delete_queue(q)
        for t in topics:
            await aadmin.delete_topic(t)


async def test_aio_runtime_property_lists_leave_out_entities_deleted_since_they_were_listed(
    namespace: str,
) -> None:
    """The list is taken first, then each entity's counts: one deleted in between is left out
    of the answer, not an error for the whole listing (queues and topics; subscriptions in
    ``test_topics_filters``)."""
    kept, gone, topic = _name(), _name(), _name("t")
    async with aio.ServiceBusAdministrationClient(namespace) as aadmin:
        for q in (kept, gone):
            await aadmin.create_queue(q)
        await aadmin.create_topic(topic)
        queues, topics = await aadmin.list_queues(), await aadmin.list_topics()
        await aadmin.delete_queue(gone)
        await aadmin.delete_topic(topic)

        async def listed_before(items: list[Any]) -> list[Any]:
            return items

        aadmin.list_queues = lambda: listed_before(queues)  # type: ignore[method-assign]
        aadmin.list_topics = lambda: listed_before(topics)  # type: ignore[method-assign]
        names = {r.name for r in await aadmin.list_queues_runtime_properties()}
        assert kept in names and gone not in names
        assert topic not in {r.name for r in await aadmin.list_topics_runtime_properties()}
        await aadmin.delete_queue(kept)


@pytest.mark.parametrize("operation", ["get", "update", "delete", "runtime"])
async def test_aio_operation_on_unknown_queue_raises_not_found(
    aadmin: aio.ServiceBusAdministrationClient, operation: str
) -> None:
    name = _name("missing")
    calls = {
        "get": lambda: aadmin.get_queue(name),
        "update": lambda: aadmin.update_queue(QueueProperties(name)),
        "delete": lambda: aadmin.delete_queue(name),
        "runtime": lambda: aadmin.get_queue_runtime_properties(name),
    }
    with pytest.raises(MessagingEntityNotFoundError):
        await calls[operation]()


@pytest.mark.parametrize("bad_name", ["-bad", "a//b", "x" * 300])
async def test_aio_create_queue_with_invalid_name_raises_invalid_argument(
    aadmin: aio.ServiceBusAdministrationClient, bad_name: str
) -> None:
    with pytest.raises(InvalidArgumentError):
        await aadmin.create_queue(bad_name)


async def test_aio_create_queue_with_bad_options_raises_invalid_argument(
    aadmin: aio.ServiceBusAdministrationClient,
) -> None:
    with pytest.raises(InvalidArgumentError):
        await aadmin.create_queue(_name(), no_such_option=True)
    with pytest.raises(InvalidArgumentError):
        await aadmin.create_queue(_name(), lock_duration=timedelta(minutes=10))
