"""Access control end to end: rules close a namespace, tokens open it again, per right and per
entity; the check runs inside the actors, so direct handle calls are refused too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import ray
from restarts import restart_all

import raybus
from raybus import ServiceBusMessage, _connection, aio
from raybus._actors.namespace import namespace_actor_name
from raybus._core.record import to_wire
from raybus._core.registry import partition_actor_name
from raybus._core.wire import send_args
from raybus.auth import SasTokenCredential, SharedAccessKeyCredential, generate_sas_token
from raybus.exceptions import (
    InvalidArgumentError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusError,
)
from raybus.management import ServiceBusAdministrationClient

ROOT_KEY = "R" * 44


@pytest.fixture
def closed(namespace: str) -> Iterator[ServiceBusAdministrationClient]:
    """The namespace with a queue ``q`` and a Manage rule ``root``; yields an admin client
    holding its key. (Tests that need a second queue make it: each is an actor to start.)"""
    open_admin = ServiceBusAdministrationClient(namespace)
    open_admin.create_queue("q")
    open_admin.create_authorization_rule("root", ["Manage"], primary_key=ROOT_KEY)
    yield ServiceBusAdministrationClient(
        namespace, credential=SharedAccessKeyCredential("root", ROOT_KEY)
    )


def client_with(namespace: str, name: str, key: str) -> raybus.ServiceBusClient:
    return raybus.ServiceBusClient(namespace, credential=SharedAccessKeyCredential(name, key))


def active(admin: ServiceBusAdministrationClient, queue: str = "q") -> int:
    return int(admin.get_queue_runtime_properties(queue).active_message_count)


def test_a_namespace_is_open_until_its_first_rule(namespace: str) -> None:
    admin = ServiceBusAdministrationClient(namespace)
    admin.create_queue("q")
    with raybus.ServiceBusClient(namespace) as client:
        client.get_queue_sender("q").send_messages(ServiceBusMessage("open"))
        admin.create_authorization_rule("root", ["Manage"], primary_key=ROOT_KEY)
        with pytest.raises(ServiceBusAuthenticationError, match="requires a SAS token"):
            client.get_queue_sender("q").send_messages(ServiceBusMessage("closed"))
        with pytest.raises(ServiceBusAuthenticationError):
            admin.create_queue("q2")
    root = ServiceBusAdministrationClient(
        namespace, credential=SharedAccessKeyCredential("root", ROOT_KEY)
    )
    assert active(root) == 1  # the refused send stored nothing
    assert [q.name for q in root.list_queues()] == ["q"]


async def test_a_client_with_a_token_for_one_entity_keeps_its_route_current(
    namespace: str, closed: ServiceBusAdministrationClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token may cover one entity only, so a client with a credential checks each route it
    caches on its own (``route``), not all at once (``routes_changed``, a namespace-wide
    call its token would be refused)."""
    rule = closed.create_authorization_rule("q-only", ["Send"], entity="q")
    client = aio.ServiceBusClient(
        namespace, credential=SharedAccessKeyCredential("q-only", rule.primary_key)
    )
    conn = client._conn
    cached = await conn.route("q")
    monkeypatch.setattr(_connection, "ROUTE_TTL_S", 0.05)
    await asyncio.sleep(0.1)
    assert conn.cached_route("q") is None
    assert await conn.route("q") is cached  # the stale one serves while it is fetched
    await conn._refreshing["q"]
    monkeypatch.setattr(_connection, "ROUTE_TTL_S", 60.0)  # fresh now, whatever pauses come
    assert conn._checking is None  # no namespace-wide check
    fresh = conn.cached_route("q")
    assert fresh is not None and fresh is not cached
    assert fresh.incarnation == cached.incarnation
    async with client.get_queue_sender("q") as sender:
        await sender.send_messages(ServiceBusMessage("through the fresh route"))
    await client.close()
    assert active(closed) == 1


def test_send_and_listen_rights_are_enforced(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    send = closed.create_authorization_rule("send", ["Send"])
    listen = closed.create_authorization_rule("listen", ["Listen"])
    with client_with(namespace, "send", send.primary_key) as sender_client:
        sender_client.get_queue_sender("q").send_messages(
            [ServiceBusMessage(f"m{i}") for i in range(3)]
        )
        with (
            pytest.raises(ServiceBusAuthorizationError, match="not Listen"),
            sender_client.get_queue_receiver("q", max_wait_time=1) as r,
        ):
            r.receive_messages(max_message_count=1, max_wait_time=1)
    assert active(closed) == 3
    with client_with(namespace, "listen", listen.secondary_key) as listener:
        with listener.get_queue_receiver("q", max_wait_time=2) as receiver:
            got = receiver.receive_messages(max_message_count=3, max_wait_time=5)
            for m in got:
                receiver.complete_message(m)
        assert sorted(str(m) for m in got) == ["m0", "m1", "m2"]
        with pytest.raises(ServiceBusAuthorizationError, match="not Send"):
            listener.get_queue_sender("q").send_messages(ServiceBusMessage("no"))
        listen_admin = ServiceBusAdministrationClient(
            namespace, credential=SharedAccessKeyCredential("listen", listen.primary_key)
        )
        with pytest.raises(ServiceBusAuthorizationError, match="not Manage"):
            listen_admin.create_queue("nope")
        # Every queue's counts in one call need the namespace's Manage right, as the listing.
        with pytest.raises(ServiceBusAuthorizationError, match="not Manage"):
            raybus._sync.run(listen_admin._aio._call(None, "queue_counts", ["q"]))
        with pytest.raises(ServiceBusAuthorizationError, match="not Manage"):
            raybus._sync.run(listen_admin._aio._call(None, "topics_counts", ["t"]))
        with pytest.raises(ServiceBusAuthorizationError, match="not Manage"):
            raybus._sync.run(listen_admin._aio._call("t", "subscription_counts", "t", ["s"]))
    assert active(closed) == 0
    assert "nope" not in [q.name for q in closed.list_queues()]


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_send_only_token_schedules_and_cancels_and_a_listen_only_one_cannot_cancel(
    namespace: str, closed: ServiceBusAdministrationClient, partitions: int
) -> None:
    """Cancelling is a sender's operation (Service Bus: the Send right). Finding the
    partitions that hold the numbers asked for Listen, so a Send-only sender was refused."""
    queue = f"sched-{partitions}"
    closed.create_queue(queue, partition_count=partitions)
    send = closed.create_authorization_rule("send", ["Send"])
    listen = closed.create_authorization_rule("listen", ["Listen"])
    at = datetime.now(timezone.utc) + timedelta(hours=1)
    with client_with(namespace, "send", send.primary_key) as c, c.get_queue_sender(queue) as s:
        seqs = s.schedule_messages(
            [ServiceBusMessage(f"s{i}", partition_key=f"k{i}") for i in range(6)], at
        )
        s.cancel_scheduled_messages(seqs[:4])
    with (
        client_with(namespace, "listen", listen.primary_key) as c,
        c.get_queue_sender(queue) as s,
        pytest.raises(ServiceBusAuthorizationError, match="not Send"),
    ):
        s.cancel_scheduled_messages(seqs[4:])
    runtime = closed.get_queue_runtime_properties(queue)
    assert runtime.scheduled_message_count == 2


def test_an_entity_rule_reaches_only_its_entity(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    closed.create_queue("other")
    rule = closed.create_authorization_rule("q-send", ["Send"], entity="q")
    assert [r.key_name for r in closed.list_authorization_rules(entity="q")] == ["q-send"]
    with client_with(namespace, "q-send", rule.primary_key) as client:
        client.get_queue_sender("q").send_messages(ServiceBusMessage("mine"))
        with pytest.raises((ServiceBusAuthenticationError, ServiceBusAuthorizationError)):
            client.get_queue_sender("other").send_messages(ServiceBusMessage("not mine"))
    assert active(closed, "q") == 1 and active(closed, "other") == 0
    closed.delete_queue("q")  # its rules go with it
    closed.create_queue("q")
    assert closed.list_authorization_rules(entity="q") == []


def test_an_entitys_authorization_rules_are_set_and_read_with_its_properties_as_the_sdks(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    """``authorization_rules`` of the SDK's queue and topic models: given at creation (the
    SDK's own AuthorizationRule objects too), read back with keys and times by get and list,
    replaced as a whole by an update, left by an update without them; never among the
    settings senders and receivers are given; a bad one creates nothing."""
    from azure.servicebus.management import AccessRights as SdkRights
    from azure.servicebus.management import AuthorizationRule as SdkRule

    from raybus.management import AccessRights, AuthorizationRule

    props = closed.create_queue(
        "ruled",
        authorization_rules=[
            AuthorizationRule(key_name="reader", rights=[AccessRights.LISTEN]),
            SdkRule(key_name="writer", rights=[SdkRights.SEND], primary_key="W" * 44),
        ],
    )
    rules = {r.key_name: r for r in props.authorization_rules}
    assert rules["writer"].rights == frozenset({AccessRights.SEND})
    assert (
        rules["writer"].primary_key == "W" * 44 and rules["writer"].claim_type == "SharedAccessKey"
    )
    assert rules["reader"].created_at_utc is not None
    with client_with(namespace, "writer", "W" * 44) as client:
        client.get_queue_sender("ruled").send_messages(ServiceBusMessage("by the entity's rule"))
        route = client._aio._conn.cached_route("ruled")
        assert route is not None and route.properties.authorization_rules is None  # no keys
    assert active(closed, "ruled") == 1
    fetched = closed.get_queue("ruled")
    assert {r.key_name for r in fetched.authorization_rules} == {"reader", "writer"}
    assert [q.authorization_rules for q in closed.list_queues() if q.name == "q"] == [[]]
    listed = {q.name: q for q in closed.list_queues()}["ruled"]
    assert {r.key_name for r in listed.authorization_rules} == {"reader", "writer"}
    reader_before = {r.key_name: r for r in fetched.authorization_rules}["reader"]
    fetched.max_delivery_count = 3
    kept = closed.update_queue(fetched)  # the rules sent back as they are: kept as they are
    assert {r.key_name: r for r in kept.authorization_rules}["reader"] == reader_before
    fetched.authorization_rules = [r for r in fetched.authorization_rules if r.key_name == "reader"]
    assert [r.key_name for r in closed.update_queue(fetched).authorization_rules] == ["reader"]
    assert [r.key_name for r in closed.list_authorization_rules(entity="ruled")] == ["reader"]
    refused = pytest.raises((ServiceBusAuthenticationError, ServiceBusAuthorizationError))
    with client_with(namespace, "writer", "W" * 44) as client, refused:
        client.get_queue_sender("ruled").send_messages(ServiceBusMessage("rule gone"))
    assert closed.get_queue("ruled").max_delivery_count == 3

    topic = closed.create_topic(
        "ruled-topic", authorization_rules=[AuthorizationRule("t-send", [AccessRights.SEND])]
    )
    assert [r.key_name for r in topic.authorization_rules] == ["t-send"]
    assert [r.key_name for r in closed.get_topic("ruled-topic").authorization_rules] == ["t-send"]
    topic.authorization_rules = []
    assert closed.update_topic(topic).authorization_rules == []

    for bad in (
        [AuthorizationRule("twice", ["Send"]), AuthorizationRule("twice", ["Listen"])],
        [SdkRule(key_name="bad name!", rights=[SdkRights.SEND])],
        [SdkRule(key_name="short", rights=[SdkRights.SEND], primary_key="too short")],
        "reader",
    ):
        with pytest.raises(InvalidArgumentError):
            closed.create_queue("never", authorization_rules=bad)
    assert "never" not in {q.name for q in closed.list_queues()}


def test_a_rule_on_a_subscription_is_refused_and_its_topics_rule_covers_it(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    """Service Bus keeps rules on the namespace, queues and topics only: a rule asked for on a
    subscription path is refused naming ``entity``, stores nothing, and the topic's Listen
    rule is what lets a receiver read the subscription."""
    closed.create_topic("t")
    closed.create_subscription("t", "s")
    with pytest.raises(InvalidArgumentError, match="is a subscription") as info:
        closed.create_authorization_rule("sub-listen", ["Listen"], entity="t/subscriptions/s")
    assert info.value.argument == "entity"
    assert closed.list_authorization_rules(entity="t/subscriptions/s") == []
    assert "sub-listen" not in {r.key_name for r in closed.list_authorization_rules()}
    assert closed.list_authorization_rules(entity="t") == []
    closed.get_topic("t")  # the refusal changed no entity

    send = closed.create_authorization_rule("t-send", ["Send"], entity="t")
    listen = closed.create_authorization_rule("t-listen", ["Listen"], entity="t")
    with client_with(namespace, "t-send", send.primary_key) as client:
        client.get_topic_sender("t").send_messages(ServiceBusMessage("for s"))
    with (
        client_with(namespace, "t-listen", listen.primary_key) as client,
        client.get_subscription_receiver("t", "s", max_wait_time=5) as receiver,
    ):
        (msg,) = receiver.receive_messages(max_wait_time=5)
        receiver.complete_message(msg)
    assert str(msg) == "for s"
    assert closed.get_subscription_runtime_properties("t", "s").active_message_count == 0


def test_a_topics_manage_rule_reaches_its_subscriptions_counts_and_no_other_topics(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    """The batched subscription counts (``subscription_counts``) are checked against the
    topic, as ``list_subscriptions`` is: a Manage rule on one topic lists its subscriptions'
    runtime properties, and a direct batched call for another topic is refused."""
    for topic in ("t", "t2"):
        closed.create_topic(topic)
        for sub in ("s", "other"):
            closed.create_subscription(topic, sub)
    rule = closed.create_authorization_rule("t2-manage", ["Manage"], entity="t2")
    admin = ServiceBusAdministrationClient(
        namespace, credential=SharedAccessKeyCredential("t2-manage", rule.primary_key)
    )
    subs = admin.list_subscriptions_runtime_properties("t2")
    assert [(s.topic_name, s.name) for s in subs] == [("t2", "other"), ("t2", "s")]
    with pytest.raises((ServiceBusAuthenticationError, ServiceBusAuthorizationError)):
        raybus._sync.run(admin._aio._call("t", "subscription_counts", "t", ["s", "other"]))
    with pytest.raises((ServiceBusAuthenticationError, ServiceBusAuthorizationError)):
        admin.list_subscriptions_runtime_properties("t")
    # One subscription's runtime properties (one call, ``subscription_runtime``) likewise.
    assert admin.get_subscription_runtime_properties("t2", "s").name == "s"
    with pytest.raises((ServiceBusAuthenticationError, ServiceBusAuthorizationError)):
        admin.get_subscription_runtime_properties("t", "s")
    listen = closed.create_authorization_rule("t2-listen", ["Listen"], entity="t2")
    listener = ServiceBusAdministrationClient(
        namespace, credential=SharedAccessKeyCredential("t2-listen", listen.primary_key)
    )
    with pytest.raises(ServiceBusAuthorizationError):
        listener.get_subscription_runtime_properties("t2", "s")


def test_expired_and_forged_tokens_are_refused(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    expired = generate_sas_token("sb://x/", "root", ROOT_KEY, int(time.time()) - 1)
    forged = generate_sas_token("sb://x/", "root", "F" * 44, int(time.time()) + 60)
    for token, fragment in ((expired, "expired"), (forged, "not signed")):
        with (
            raybus.ServiceBusClient(namespace, credential=SasTokenCredential(token)) as c,
            pytest.raises(ServiceBusAuthenticationError, match=fragment),
        ):
            c.get_queue_sender("q").send_messages(ServiceBusMessage("x"))
    assert active(closed) == 0


def test_keys_rotate_without_downtime_and_deleted_rules_stop_at_once(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    rule = closed.create_authorization_rule("app", ["Send"])
    old_primary = client_with(namespace, "app", rule.primary_key)
    on_secondary = client_with(namespace, "app", rule.secondary_key)
    old_primary.get_queue_sender("q").send_messages(ServiceBusMessage("1"))
    closed.regenerate_authorization_key("app", which="primary")
    on_secondary.get_queue_sender("q").send_messages(ServiceBusMessage("2"))
    with pytest.raises(ServiceBusAuthenticationError):
        old_primary.get_queue_sender("q").send_messages(ServiceBusMessage("3"))
    closed.delete_authorization_rule("app")
    with pytest.raises(ServiceBusAuthenticationError):
        on_secondary.get_queue_sender("q").send_messages(ServiceBusMessage("4"))
    assert active(closed) == 2
    old_primary.close()
    on_secondary.close()


def test_regenerating_a_key_with_a_bad_which_names_it_and_changes_nothing(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    rule = closed.create_authorization_rule("app", ["Send"])
    on_entity = closed.create_authorization_rule("mine", ["Listen"], entity="q")
    with pytest.raises(InvalidArgumentError, match="'tertiary'") as info:
        closed.regenerate_authorization_key("app", which="tertiary")
    assert info.value.argument == "which"

    async def aio_attempt() -> InvalidArgumentError:
        aadmin = aio.ServiceBusAdministrationClient(
            namespace, credential=SharedAccessKeyCredential("root", ROOT_KEY)
        )
        try:
            with pytest.raises(InvalidArgumentError, match="'Primary'") as caught:
                await aadmin.regenerate_authorization_key("mine", entity="q", which="Primary")
        finally:
            await aadmin.close()
        return caught.value

    assert asyncio.run(aio_attempt()).argument == "which"
    keys = {r.key_name: (r.primary_key, r.secondary_key) for r in closed.list_authorization_rules()}
    assert keys["app"] == (rule.primary_key, rule.secondary_key)
    (mine,) = closed.list_authorization_rules(entity="q")
    assert (mine.primary_key, mine.secondary_key) == (
        on_entity.primary_key,
        on_entity.secondary_key,
    )
    with client_with(namespace, "app", rule.primary_key) as client:  # the old key still works
        client.get_queue_sender("q").send_messages(ServiceBusMessage("still"))
    assert active(closed) == 1


def test_direct_actor_calls_without_a_token_get_nowhere(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    registry = ray.get_actor(namespace_actor_name(namespace), namespace="raybus")
    entry_name = partition_actor_name(namespace, "q", 1, 0)
    partition = ray.get_actor(entry_name, namespace="raybus")
    from raybus._core.record import MessageRecord

    record = MessageRecord(body=b"sneaky")
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(partition.send_groups.remote(*send_args([[record]])))
    assert isinstance(info.value.cause, ServiceBusAuthenticationError)
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(partition.txn_commit.remote("t1", _auth="RaybusInternal guess"))
    assert isinstance(info.value.cause, ServiceBusAuthorizationError)
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(registry.delete_queue.remote("q"))
    assert isinstance(info.value.cause, ServiceBusAuthenticationError)
    assert active(closed) == 0
    assert "q" in [q.name for q in closed.list_queues()]  # the refused delete deleted nothing


def test_topics_transactions_and_forwarding_work_in_a_closed_namespace(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    closed.create_queue("other")
    closed.create_topic("t")
    closed.create_subscription("t", "s", forward_to="other")
    closed.create_subscription("t", "plain")
    closed.update_queue(closed.get_queue("q"), partition_count=2)
    app = closed.create_authorization_rule("app", ["Send", "Listen"])
    with client_with(namespace, "app", app.primary_key) as client:
        client.get_topic_sender("t").send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        with client.get_subscription_receiver("t", "plain", max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=2, max_wait_time=10)
            assert sorted(str(m) for m in got) == ["a", "b"]
            with client.transaction() as txn:
                client.get_queue_sender("q").send_messages(
                    [ServiceBusMessage("t1", partition_key="x"), ServiceBusMessage("t2")],
                    transaction=txn,
                )
                for m in got:
                    receiver.complete_message(m, transaction=txn)
        deadline = time.time() + 20
        while active(closed, "other") < 2 and time.time() < deadline:
            time.sleep(0.2)
    assert active(closed, "other") == 2  # forwarded by the subscription's own actors
    assert active(closed, "q") == 2
    assert closed.get_subscription_runtime_properties("t", "plain").active_message_count == 0


def test_rules_survive_restarts_of_the_namespace_and_partition_actors(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    app = closed.create_authorization_rule("app", ["Send"])
    names = (namespace_actor_name(namespace), partition_actor_name(namespace, "q", 1, 0))
    # Both killed at once; then waited for, as ``ray.kill`` returns before the old process is
    # gone (a send may meet it dying: a connection error, not repeated, as it may be stored).
    restart_all([ray.get_actor(name, namespace="raybus") for name in names])
    with (
        raybus.ServiceBusClient(namespace) as anonymous,
        pytest.raises(ServiceBusAuthenticationError),
    ):
        anonymous.get_queue_sender("q").send_messages(ServiceBusMessage("x"))
    with client_with(namespace, "app", app.primary_key) as client:
        client.get_queue_sender("q").send_messages(ServiceBusMessage("y"))
    assert active(closed) == 1
    assert {r.key_name for r in closed.list_authorization_rules()} == {"root", "app"}


@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_an_actor_that_misses_a_rule_push_still_ends_up_with_the_current_rules(
    namespace: str, mode: str
) -> None:
    """The partition's push fails: it raises and the actor stays up (the namespace pushes
    again), or the actor dies on it and restarts (it fetches the rules before serving).
    Either way anonymous sends stop, and the rule's key works there."""
    open_admin = ServiceBusAdministrationClient(namespace)
    open_admin.create_queue("q")
    with raybus.ServiceBusClient(namespace) as anonymous:
        sender = anonymous.get_queue_sender("q")
        sender.send_messages(ServiceBusMessage("open"))  # the partition's guard is loaded
        partition = ray.get_actor(partition_actor_name(namespace, "q", 1, 0), namespace="raybus")
        ray.get(partition.arm_failpoint.remote("access.before_set_access", mode))
        open_admin.create_authorization_rule("root", ["Manage"], primary_key=ROOT_KEY)
        deadline = time.time() + 30
        refused = False
        while not refused and time.time() < deadline:
            try:
                sender.send_messages(ServiceBusMessage("anonymous"))
                time.sleep(0.2)
            except ServiceBusAuthenticationError:
                refused = True
            except ServiceBusError:  # (exit) the partition is restarting
                time.sleep(0.2)
        assert refused, "the partition still serves with the rules from before the change"
    root = ServiceBusAdministrationClient(
        namespace, credential=SharedAccessKeyCredential("root", ROOT_KEY)
    )
    before = active(root)
    with client_with(namespace, "root", ROOT_KEY) as client:
        client.get_queue_sender("q").send_messages(ServiceBusMessage("with the key"))
    assert active(root) == before + 1


def test_a_settlement_refused_for_the_token_says_so_not_lock_lost(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    """Settlements go out without waiting when the lock is comfortably valid; when the broker
    refuses one because of the caller's token, the receiver raises that error (the lock is still
    valid), not SettlementFailedError's "will be delivered again"."""
    listen = closed.create_authorization_rule("listen", ["Listen"])
    send = closed.create_authorization_rule("send", ["Send"])
    with client_with(namespace, "send", send.primary_key) as sender_client:
        sender_client.get_queue_sender("q").send_messages(ServiceBusMessage("m"))
        with (
            client_with(namespace, "listen", listen.primary_key) as listener,
            listener.get_queue_receiver("q", max_wait_time=5) as good,
        ):
            (msg,) = good.receive_messages(max_message_count=1, max_wait_time=5)
            wrong = sender_client.get_queue_receiver("q")
            with pytest.raises(ServiceBusAuthorizationError, match="not Listen"):
                wrong.complete_message(msg)
                wrong.close()
            good.complete_message(msg)
    assert active(closed) == 0


def test_the_coordinator_takes_only_partitions_of_the_entity_each_share_names(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    """A client commits its own participant list: each name must be a partition of the
    entity it names (not another entity's, not a topic's subscription under the topic's
    name). Shares carry no handle: the coordinator calls the partition named."""
    from raybus._core.record import MessageRecord, encoded_size

    closed.create_queue("other")
    closed.create_topic("t")
    closed.create_subscription("t", "s")
    app = closed.create_authorization_rule("app", ["Send"])
    with client_with(namespace, "app", app.primary_key) as client:
        client.get_topic_sender("t").send_messages(ServiceBusMessage("via the topic"))
        client.get_queue_sender("other").send_messages(ServiceBusMessage("plain"))
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]

    def partition_of(entity: str) -> str:
        (name,) = [n for n in names if n.startswith(f"raybus/{namespace}/queue/{entity}/")]
        return name

    q_name = partition_of("q")
    other_name = partition_of("other")
    sub_name = partition_of("t/subscriptions/s")
    record = MessageRecord(body=b"forged")
    encoded_size(record)
    sends = to_wire([record])
    forged = {
        "another entity's partition": (other_name, "q"),
        "a subscription under its topic's name": (sub_name, "t"),
        "a name that is no partition": (q_name + "/0", "q"),
    }
    aclient = aio.ServiceBusClient(
        namespace, credential=SharedAccessKeyCredential("app", app.primary_key)
    )
    coordinator = aclient._conn.coordinator
    for i, (what, (name, entity)) in enumerate(forged.items()):
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(coordinator.commit.remote(f"forged{i}", [(name, entity, sends, [], [])]))
        assert isinstance(info.value.cause, ServiceBusAuthorizationError), what
    assert active(closed, "other") == 1
    assert closed.get_subscription_runtime_properties("t", "s").active_message_count == 1
    ray.get(coordinator.commit.remote("fine", [(q_name, "q", sends, [], [])]))
    assert active(closed, "q") == 1


def _conn_str(namespace: str, name: str, key: str, entity: str | None = None) -> str:
    text = f"Endpoint=sb://{namespace}.servicebus.windows.net/;SharedAccessKeyName={name};"
    text += f"SharedAccessKey={key}"
    return text + (f";EntityPath={entity}" if entity else "")


def test_clients_made_from_a_connection_string_carry_its_key(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    """The code a Service Bus user already has: ``from_connection_string`` on both clients,
    sync and aio; the namespace is the endpoint's first host label, the key signs."""
    admin = ServiceBusAdministrationClient.from_connection_string(
        _conn_str(namespace, "root", ROOT_KEY)
    )
    admin.create_queue("from-conn")
    with (
        raybus.ServiceBusClient.from_connection_string(
            _conn_str(namespace, "root", ROOT_KEY), retry_total=1
        ) as client,
        client.get_queue_sender("from-conn") as sender,
    ):
        assert client._aio._conn.retry.total == 1  # the constructor's options pass through
        sender.send_messages(ServiceBusMessage("sync"))

    async def aio_side() -> list[str]:
        aadmin = aio.ServiceBusAdministrationClient.from_connection_string(
            _conn_str(namespace, "root", ROOT_KEY)
        )
        assert (await aadmin.get_queue_runtime_properties("from-conn")).active_message_count == 1
        async with (
            aio.ServiceBusClient.from_connection_string(
                _conn_str(namespace, "root", ROOT_KEY)
            ) as aclient,
            aclient.get_queue_receiver("from-conn", max_wait_time=5) as receiver,
        ):
            got = await receiver.receive_messages(max_wait_time=5)
            await receiver.complete_messages(got)
            return [str(m) for m in got]

    assert asyncio.run(aio_side()) == ["sync"]
    wrong = raybus.ServiceBusClient.from_connection_string(_conn_str(namespace, "root", "W" * 44))
    with pytest.raises(ServiceBusAuthenticationError):
        wrong.get_queue_sender("from-conn").send_messages(ServiceBusMessage("refused"))
    assert active(closed, "from-conn") == 0


def test_a_connection_strings_entity_path_is_the_only_entity_its_client_reaches(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    closed.create_queue("other")
    with raybus.ServiceBusClient.from_connection_string(
        _conn_str(namespace, "root", ROOT_KEY, entity="q")
    ) as client:
        with client.get_queue_sender("Q") as sender:  # names are case-insensitive
            sender.send_messages(ServiceBusMessage("in q"))
        for make in (
            lambda: client.get_queue_sender("other"),
            lambda: client.get_queue_receiver("other"),
            lambda: client.get_topic_sender("t"),
            lambda: client.get_subscription_receiver("t", "s"),
            lambda: client.get_processor("other", lambda message: None),
            lambda: client.get_processor(("t", "s"), lambda message: None),
        ):
            with pytest.raises(InvalidArgumentError, match="does not match the EntityPath 'q'"):
                make()
    assert active(closed, "q") == 1 and active(closed, "other") == 0


def test_senders_and_receivers_made_from_a_connection_string_as_the_sdks_samples_make_them(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    """``ServiceBusSender._from_connection_string`` and ``ServiceBusReceiver``'s (private in
    the SDK, used by its ``sample_code_servicebus.py``), sync and aio; the handler's options
    go to it and the rest to the client; without a name, the EntityPath is the queue."""
    conn = _conn_str(namespace, "root", ROOT_KEY)
    closed.create_topic("t")
    closed.create_subscription("t", "s")
    with raybus.ServiceBusSender._from_connection_string(
        conn_str=conn, queue_name="q", client_identifier="sample-sender", retry_total=1
    ) as sender:
        assert sender.client_identifier == "sample-sender"
        assert sender._aio._conn.retry.total == 1  # a client option reached the client
        sender.send_messages(ServiceBusMessage("sync"))
    in_q = _conn_str(namespace, "root", ROOT_KEY, entity="q")
    with raybus.ServiceBusSender._from_connection_string(in_q) as sender:  # EntityPath
        sender.send_messages(ServiceBusMessage("by entity path"))
    with raybus.ServiceBusReceiver._from_connection_string(
        in_q, max_wait_time=5, prefetch_count=10
    ) as receiver:
        got = _receive_all(receiver, 2)
        receiver.complete_messages(got)
    assert sorted(str(m) for m in got) == ["by entity path", "sync"]

    async def aio_side() -> list[str]:
        async with aio.ServiceBusSender._from_connection_string(
            conn_str=conn, topic_name="t"
        ) as topic_sender:
            await topic_sender.send_messages(ServiceBusMessage("to t"))
        async with aio.ServiceBusReceiver._from_connection_string(
            conn_str=conn, topic_name="t", subscription_name="s", max_wait_time=5
        ) as sub_receiver:
            got = await sub_receiver.receive_messages(max_wait_time=5)
            await sub_receiver.complete_messages(got)
            return [str(m) for m in got]

    assert asyncio.run(aio_side()) == ["to t"]
    refused = [
        (lambda: raybus.ServiceBusSender._from_connection_string(conn), "queue_name"),
        (lambda: aio.ServiceBusReceiver._from_connection_string(conn), "queue_name"),
        (
            lambda: raybus.ServiceBusSender._from_connection_string(
                conn, queue_name="q", topic_name="t"
            ),
            "topic_name",
        ),
        (
            lambda: aio.ServiceBusReceiver._from_connection_string(conn, topic_name="t"),
            "subscription_name",
        ),
        (
            lambda: raybus.ServiceBusReceiver._from_connection_string(
                conn, queue_name="q", subscription_name="s"
            ),
            "subscription_name",
        ),
        (
            lambda: raybus.ServiceBusReceiver._from_connection_string(in_q, queue_name="t"),
            "queue_name",
        ),
    ]
    for make, argument in refused:
        with pytest.raises(InvalidArgumentError) as info:
            make()
        assert info.value.argument == argument
    assert active(closed, "q") == 0


def _receive_all(
    receiver: raybus.ServiceBusReceiver, n: int
) -> list[raybus.ServiceBusReceivedMessage]:
    got: list[raybus.ServiceBusReceivedMessage] = []
    while len(got) < n:
        batch = receiver.receive_messages(max_message_count=n - len(got), max_wait_time=5)
        assert batch, f"{len(got)} of {n} received"
        got += batch
    return got


def test_azure_cores_named_key_credential_opens_a_closed_namespace_and_rotates(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    """Code written for azure-servicebus with ``AzureNamedKeyCredential`` works unchanged; a
    regenerated key handed to the credential's ``update`` is used from the next token on."""
    from azure.core.credentials import AzureNamedKeyCredential

    rule = closed.create_authorization_rule("app", ["Send", "Listen"], entity="q")
    named = AzureNamedKeyCredential("app", rule.primary_key)
    with (
        raybus.ServiceBusClient(namespace, credential=named) as client,
        client.get_queue_sender("q") as sender,
    ):
        sender.send_messages(ServiceBusMessage("with the primary"))
        rotated = closed.regenerate_authorization_key("app", which="primary", entity="q")
        with pytest.raises(ServiceBusAuthenticationError):  # the replaced key stops at once
            sender.send_messages(ServiceBusMessage("refused"))
        named.update("app", rotated.primary_key)
        sender.send_messages(ServiceBusMessage("with the new primary"))
    assert active(closed) == 2
    with pytest.raises(InvalidArgumentError, match="Azure AD"):
        raybus.ServiceBusClient(namespace, credential=type("Ad", (), {"get_token": print})())


def test_a_get_token_credential_of_sas_tokens_opens_a_closed_namespace_as_the_sdks_sample(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    """The SDK's ``generate_sas_token_and_authenticate_client`` sample: a credential whose
    ``get_token`` returns a SAS token (``token_type`` the SAS one) signs every call."""
    from azure.core.credentials import AccessToken

    rule = closed.create_authorization_rule("app", ["Send", "Listen"], entity="q")

    class CustomizedSasCredential:
        token_type = b"servicebus.windows.net:sastoken"

        def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
            expiry = int(time.time()) + 3600
            token = generate_sas_token(scopes[0], "app", rule.primary_key, expiry)
            return AccessToken(token, expiry)

    with raybus.ServiceBusClient(namespace, credential=CustomizedSasCredential()) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages(ServiceBusMessage("by a token source"))
        with client.get_queue_receiver("q", max_wait_time=5) as receiver:
            (msg,) = receiver.receive_messages()
            receiver.complete_message(msg)
    assert str(msg) == "by a token source"


def test_the_sdks_constructor_form_a_host_name_and_a_credential(
    namespace: str, closed: ServiceBusAdministrationClient
) -> None:
    """``ServiceBusClient("<ns>.servicebus.windows.net", AzureNamedKeyCredential(...))``, as
    code written for azure-servicebus makes it, reaches the namespace of the host's first
    label; the admin client takes ``fully_qualified_namespace=`` too."""
    from azure.core.credentials import AzureNamedKeyCredential

    host = f"{namespace}.servicebus.windows.net"
    key = AzureNamedKeyCredential("root", ROOT_KEY)
    admin = ServiceBusAdministrationClient(fully_qualified_namespace=host, credential=key)
    assert admin.namespace == namespace
    with (
        raybus.ServiceBusClient(host, key) as client,
        client.get_queue_sender("q") as sender,
    ):
        assert client.namespace == namespace
        sender.send_messages(ServiceBusMessage("the SDK's form"))
    assert active(admin) == 1
    with pytest.raises(InvalidArgumentError, match="not both"):
        raybus.ServiceBusClient(namespace, fully_qualified_namespace=host)


def test_a_clients_fully_qualified_namespace_is_the_host_it_was_given() -> None:
    """The SDK's ``client.fully_qualified_namespace``: a connection string's endpoint host,
    or the host passed; the namespace raybus connects to is its first label (a client joins
    Ray when made: an integration test)."""
    import raybus
    import raybus.aio

    conn = "Endpoint=sb://orders.servicebus.windows.net/;SharedAccessKeyName=a;SharedAccessKey=b"
    for make in (raybus.ServiceBusClient, raybus.aio.ServiceBusClient):
        client = make.from_connection_string(conn)
        assert (client.namespace, client.fully_qualified_namespace) == (
            "orders",
            "orders.servicebus.windows.net",
        )
        given = make(fully_qualified_namespace="shop.servicebus.windows.net")
        assert (given.namespace, given.fully_qualified_namespace) == (
            "shop",
            "shop.servicebus.windows.net",
        )
        assert make("shop").fully_qualified_namespace == "shop"
        # ... and its senders' and receivers', as the SDK's handlers have it; a sender's
        # entity_name is its queue or topic
        handlers = (
            client.get_queue_sender("q"),
            client.get_topic_sender("t"),
            client.get_queue_receiver("q"),
            client.get_subscription_receiver("t", "s"),
        )
        for handler in handlers:
            assert handler.fully_qualified_namespace == "orders.servicebus.windows.net"
        assert [h.entity_name for h in handlers[:2]] == ["q", "t"]
        assert (
            given.get_queue_sender("q").fully_qualified_namespace == "shop.servicebus.windows.net"
        )
