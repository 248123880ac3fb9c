"""The unmodified Azure SDK admin client against raybus's ATOM management API over HTTPS.

``azure.servicebus.management.ServiceBusAdministrationClient`` talks to raybus's HTTP gateway
(``raybus.http.start_http_gateway`` on a free loopback port, with TLS from the gateway's
self-signed certificate, trusted through ``connection_verify``), whose ingress hands
management requests to ``raybus.http._atom``; what it creates is checked through raybus's
own clients too, so the translation is tested end to end:
every setting round-trips, rules created over HTTP filter and change real messages, runtime
counts follow real messages, and raybus's errors arrive as the SDK's typed exceptions.

Cost: one raybus namespace and one gateway for the module (Serve's controller and proxy take
seconds to start; Serve is shut down after, as its HTTP options, TLS included, are fixed by
whoever starts it); every test uses its own entity names, and topics are deleted after each
test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
import requests
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.servicebus.management import (
    AuthorizationRule,
    CorrelationRuleFilter,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from net import free_port

import raybus
import raybus.http
from raybus import ServiceBusMessage, ServiceBusReceiveMode
from raybus.auth import SharedAccessKeyCredential
from raybus.exceptions import ServiceBusAuthorizationError, ServiceBusError
from raybus.http._tls import ensure_certificate
from raybus.management import ServiceBusAdministrationClient as RaybusAdmin

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> str:
    return module_namespace


@dataclass(frozen=True)
class Gateway:
    port: int
    certfile: str

    @property
    def connection_string(self) -> str:
        # The namespace is open (no authorization rules): the key signs tokens nobody checks.
        return (
            f"Endpoint=sb://127.0.0.1:{self.port}/;SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=unused-in-an-open-namespace"
        )


@pytest.fixture(scope="module")
def server(namespace: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    from ray import serve

    certfile, keyfile = ensure_certificate(tmp_path_factory.mktemp("certs"))
    serve.shutdown()  # Serve's HTTP options (TLS) are fixed by whoever starts it
    url = raybus.http.start_http_gateway(
        namespace, port=free_port(), tls=(certfile, keyfile), max_replicas=1
    )
    try:
        yield Gateway(int(url.rsplit(":", 1)[1]), certfile)
    finally:
        raybus.http.stop_http_gateway(namespace)
        serve.shutdown()


@pytest.fixture
def sdk(server: Gateway) -> Iterator[ServiceBusAdministrationClient]:
    client = ServiceBusAdministrationClient.from_connection_string(
        server.connection_string, connection_verify=server.certfile
    )
    with client:
        yield client


@pytest.fixture(autouse=True)
def _delete_topics(namespace: str) -> Iterator[None]:
    yield
    admin = RaybusAdmin(namespace)
    for topic in admin.list_topics():
        try:
            admin.delete_topic(topic.name)
        except ServiceBusError:
            pass


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_queue_settings_round_trip_through_create_get_update_and_delete(
    sdk: ServiceBusAdministrationClient, namespace: str
) -> None:
    name, dead = _name("q"), _name("dlq")
    sdk.create_queue(dead)
    created = sdk.create_queue(
        name,
        lock_duration=timedelta(seconds=30),
        max_delivery_count=5,
        default_message_time_to_live=timedelta(hours=1),
        dead_lettering_on_message_expiration=True,
        requires_duplicate_detection=True,
        duplicate_detection_history_time_window=timedelta(minutes=2),
        max_size_in_megabytes=2048,
        requires_session=True,
        auto_delete_on_idle=timedelta(minutes=10),
        enable_batched_operations=False,
        forward_dead_lettered_messages_to=dead,
        user_metadata="owned by the http test",
        max_message_size_in_kilobytes=512,
    )
    got = sdk.get_queue(name)
    for props in (created, got):
        assert props.name == name
        assert props.lock_duration == timedelta(seconds=30)
        assert props.max_delivery_count == 5
        assert props.default_message_time_to_live == timedelta(hours=1)
        assert props.dead_lettering_on_message_expiration is True
        assert props.requires_duplicate_detection is True
        assert props.duplicate_detection_history_time_window == timedelta(minutes=2)
        assert props.max_size_in_megabytes == 2048
        assert props.requires_session is True
        assert props.auto_delete_on_idle == timedelta(minutes=10)
        assert props.enable_batched_operations is False
        assert props.forward_dead_lettered_messages_to.endswith(f"/{dead}")
        assert props.user_metadata == "owned by the http test"
        assert props.max_message_size_in_kilobytes == 512
        assert props.status == "Active"
        assert props.enable_partitioning is False
    # raybus stores what the SDK asked for.
    mine = RaybusAdmin(namespace).get_queue(name)
    assert mine.lock_duration == timedelta(seconds=30)
    assert mine.forward_dead_lettered_messages_to == dead
    assert mine.max_message_size_in_kilobytes == 512

    got.max_delivery_count = 7
    got.status = "ReceiveDisabled"
    sdk.update_queue(got, user_metadata="changed")  # keyword overrides, as the SDK allows
    again = sdk.get_queue(name)
    assert (again.max_delivery_count, again.status, again.user_metadata) == (
        7,
        "ReceiveDisabled",
        "changed",
    )
    assert again.lock_duration == timedelta(seconds=30)  # untouched fields kept
    assert RaybusAdmin(namespace).get_queue(name).max_delivery_count == 7

    sdk.delete_queue(name)
    with pytest.raises(ResourceNotFoundError):
        sdk.get_queue(name)


def test_partitioned_queue_and_forward_to_read_back_as_service_bus_writes_them(
    sdk: ServiceBusAdministrationClient, namespace: str
) -> None:
    name, target = _name("q"), _name("target")
    sdk.create_queue(target)
    props = sdk.create_queue(name, enable_partitioning=True, forward_to=target)
    assert props.enable_partitioning is True
    assert (
        props.forward_to == f"sb://127.0.0.1:{sdk.fully_qualified_namespace.split(':')[1]}/{target}"
    )
    mine = RaybusAdmin(namespace).get_queue(name)
    assert mine.partition_count > 1
    assert mine.forward_to == target
    # Partitioning is fixed at creation, as in Service Bus.
    props.enable_partitioning = False
    with pytest.raises(HttpResponseError) as info:
        sdk.update_queue(props)
    assert info.value.status_code == 400
    assert "EnablePartitioning" in str(info.value)


def test_an_sdk_update_with_forward_to_none_stops_forwarding(
    sdk: ServiceBusAdministrationClient, namespace: str
) -> None:
    """The SDK leaves None out of an update's XML; the update replaces the description, so
    the source stops forwarding and can be received from again."""
    name, target = _name("q"), _name("target")
    sdk.create_queue(target)
    sdk.create_queue(name, forward_to=target, user_metadata="was")
    props = sdk.get_queue(name)
    props.forward_to = None
    props.user_metadata = None
    sdk.update_queue(props)
    got = sdk.get_queue(name)
    assert (got.forward_to, got.user_metadata) == (None, None)
    with raybus.ServiceBusClient(namespace) as client:
        client.get_queue_sender(name).send_messages(ServiceBusMessage("stays"))
        with client.get_queue_receiver(
            name, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver:
            assert [str(m) for m in receiver.receive_messages(1, max_wait_time=10)] == ["stays"]
    with pytest.raises(HttpResponseError) as info:
        sdk.update_topic(sdk.create_topic(_name("t")), status="ReceiveDisabled")
    assert info.value.status_code == 400 and "status" in str(info.value)


def test_list_queues_pages_through_skip_and_top(sdk: ServiceBusAdministrationClient) -> None:
    prefix = _name("page")
    names = sorted(f"{prefix}-{i}" for i in range(5))
    for name in names:
        sdk.create_queue(name)
    listed = [q.name for q in sdk.list_queues(max_page_size=2) if q.name.startswith(prefix)]
    assert listed == names
    runtime = [q.name for q in sdk.list_queues_runtime_properties() if q.name.startswith(prefix)]
    assert runtime == names


def test_queue_runtime_properties_follow_real_messages(
    sdk: ServiceBusAdministrationClient, namespace: str
) -> None:
    name = _name("q")
    sdk.create_queue(name)
    with raybus.ServiceBusClient(namespace) as client:
        with client.get_queue_sender(name) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
        with client.get_queue_receiver(name) as receiver:
            (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.dead_letter_message(first, reason="test")
    runtime = sdk.get_queue_runtime_properties(name)
    assert runtime.name == name
    assert runtime.active_message_count == 2
    assert runtime.dead_letter_message_count == 1
    assert runtime.scheduled_message_count == 0
    assert runtime.total_message_count == 3
    assert runtime.size_in_bytes > 0
    assert runtime.created_at_utc is not None
    assert runtime.accessed_at_utc >= runtime.created_at_utc


def test_topics_and_subscriptions_round_trip_and_count(
    sdk: ServiceBusAdministrationClient, namespace: str
) -> None:
    topic, sub = _name("t"), "audit"
    created = sdk.create_topic(
        topic,
        default_message_time_to_live=timedelta(hours=2),
        max_size_in_megabytes=2048,
        requires_duplicate_detection=True,
        duplicate_detection_history_time_window=timedelta(minutes=3),
        support_ordering=True,
        user_metadata="topic meta",
    )
    assert created.default_message_time_to_live == timedelta(hours=2)
    assert created.requires_duplicate_detection is True
    assert created.support_ordering is True
    got = sdk.get_topic(topic)
    assert (got.max_size_in_megabytes, got.user_metadata) == (2048, "topic meta")
    sdk.update_topic(got, max_size_in_megabytes=4096)
    assert sdk.get_topic(topic).max_size_in_megabytes == 4096
    assert topic in [t.name for t in sdk.list_topics()]

    made = sdk.create_subscription(
        topic,
        sub,
        lock_duration=timedelta(seconds=45),
        max_delivery_count=3,
        dead_lettering_on_message_expiration=True,
        dead_lettering_on_filter_evaluation_exceptions=False,
        user_metadata="sub meta",
    )
    assert made.lock_duration == timedelta(seconds=45)
    assert made.dead_lettering_on_filter_evaluation_exceptions is False
    fetched = sdk.get_subscription(topic, sub)
    assert (fetched.max_delivery_count, fetched.user_metadata) == (3, "sub meta")
    fetched.max_delivery_count = 9
    sdk.update_subscription(topic, fetched)
    assert sdk.get_subscription(topic, sub).max_delivery_count == 9
    assert RaybusAdmin(namespace).get_subscription(topic, sub).max_delivery_count == 9
    assert [s.name for s in sdk.list_subscriptions(topic)] == [sub]

    with raybus.ServiceBusClient(namespace) as client, client.get_topic_sender(topic) as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    sub_runtime = sdk.get_subscription_runtime_properties(topic, sub)
    assert (sub_runtime.active_message_count, sub_runtime.total_message_count) == (2, 2)
    assert [r.active_message_count for r in sdk.list_subscriptions_runtime_properties(topic)] == [2]
    topic_runtime = sdk.get_topic_runtime_properties(topic)
    assert topic_runtime.subscription_count == 1
    assert topic_runtime.created_at_utc is not None

    sdk.delete_subscription(topic, sub)
    with pytest.raises(ResourceNotFoundError):
        sdk.get_subscription(topic, sub)
    sdk.delete_topic(topic)
    with pytest.raises(ResourceNotFoundError):
        sdk.get_topic(topic)


def test_rules_made_over_http_filter_and_change_real_messages(
    sdk: ServiceBusAdministrationClient, namespace: str
) -> None:
    topic, sub = _name("t"), "orders"
    sdk.create_topic(topic)
    sdk.create_subscription(topic, sub)
    sql = sdk.create_rule(
        topic,
        sub,
        "big",
        filter=SqlRuleFilter(
            "amount > @limit AND region = @region", {"@limit": 100, "@region": "eu"}
        ),
        action=SqlRuleAction("SET tier = @tier", {"@tier": "gold"}),
    )
    assert isinstance(sql.filter, SqlRuleFilter)
    assert sql.filter.parameters == {"@limit": 100, "@region": "eu"}
    assert sql.action.sql_expression == "SET tier = @tier"
    corr = sdk.create_rule(
        topic,
        sub,
        "vip",
        filter=CorrelationRuleFilter(correlation_id="vip", label="order", properties={"x": 1}),
    )
    assert (corr.filter.correlation_id, corr.filter.label) == ("vip", "order")
    assert corr.filter.properties == {"x": 1}
    assert corr.action is None
    sdk.delete_rule(topic, sub, "$Default")
    rules = {r.name: r for r in sdk.list_rules(topic, sub)}
    assert sorted(rules) == ["big", "vip"]
    assert rules["big"].filter.parameters == {"@limit": 100, "@region": "eu"}

    with raybus.ServiceBusClient(namespace) as client:
        with client.get_topic_sender(topic) as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(
                        "small", application_properties={"amount": 5, "region": "eu"}
                    ),
                    ServiceBusMessage(
                        "big", application_properties={"amount": 500, "region": "eu"}
                    ),
                    ServiceBusMessage(
                        "vip",
                        correlation_id="vip",
                        subject="order",
                        application_properties={"x": 1},
                    ),
                ]
            )
        with client.get_subscription_receiver(
            topic, sub, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=5)
    bodies = {str(m): m for m in got}
    assert sorted(bodies) == ["big", "vip"]
    assert bodies["big"].application_properties["tier"] == "gold"

    # An update replaces the filter; a bad one is refused and the old rule stays.
    big = sdk.get_rule(topic, sub, "big")
    sdk.update_rule(topic, sub, big, filter=SqlRuleFilter("amount > 1000"))
    assert sdk.get_rule(topic, sub, "big").filter.sql_expression == "amount > 1000"
    # In place, in one step (raybus's update_rule): its position among the rules is kept.
    assert [r.name for r in sdk.list_rules(topic, sub)] == ["big", "vip"]
    with pytest.raises(HttpResponseError) as info:
        sdk.update_rule(topic, sub, big, filter=SqlRuleFilter("amount >"))
    assert info.value.status_code == 400
    assert sdk.get_rule(topic, sub, "big").filter.sql_expression == "amount > 1000"
    sdk.create_rule(topic, sub, "all", filter=TrueRuleFilter())
    assert isinstance(sdk.get_rule(topic, sub, "all").filter, TrueRuleFilter)


def test_raybus_errors_arrive_as_the_sdks_typed_errors(
    sdk: ServiceBusAdministrationClient,
) -> None:
    name, topic = _name("q"), _name("t")
    sdk.create_queue(name)
    sdk.create_topic(topic)
    sdk.create_subscription(topic, "s")
    with pytest.raises(ResourceNotFoundError):
        sdk.get_queue(_name("missing"))
    with pytest.raises(ResourceNotFoundError):
        sdk.get_subscription(topic, "missing")
    with pytest.raises(ResourceNotFoundError):
        sdk.get_rule(topic, "s", "missing")
    with pytest.raises(ResourceNotFoundError):
        sdk.delete_queue(_name("missing"))
    missing = sdk.get_queue(name)
    missing.name = _name("missing")
    with pytest.raises(ResourceNotFoundError):
        sdk.update_queue(missing)
    with pytest.raises(ResourceExistsError):
        sdk.create_queue(name)
    with pytest.raises(ResourceExistsError):
        sdk.create_topic(name)  # names are shared by queues and topics
    with pytest.raises(ResourceExistsError):
        sdk.create_rule(topic, "s", "$Default")
    with pytest.raises(HttpResponseError) as info:
        sdk.create_queue(_name("q"), lock_duration=timedelta(minutes=10))
    assert info.value.status_code == 400
    assert "lock_duration" in info.value.message
    with pytest.raises(HttpResponseError) as info:
        sdk.create_rule(topic, "s", "bad", filter=SqlRuleFilter("a = = 1"))
    assert info.value.status_code == 400
    assert "position" in info.value.message
    with pytest.raises(HttpResponseError) as info:
        sdk.create_queue("bad name!")
    assert info.value.status_code == 400


def test_hostile_and_malformed_bodies_get_400_and_change_nothing(
    server: Gateway, sdk: ServiceBusAdministrationClient
) -> None:
    name = _name("q")
    laughs = (
        b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
        b'<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>'
        b'<entry xmlns="http://www.w3.org/2005/Atom"><content>&lol2;</content></entry>'
    )
    for body in (laughs, b"<entry><content>", b"\xff\xfe<entry/>", b"x" * 300_000):
        response = requests.put(
            f"https://127.0.0.1:{server.port}/{name}?api-version=2021-05",
            data=body,
            headers={"Content-Type": "application/atom+xml"},
            verify=server.certfile,
            timeout=30,
        )
        assert response.status_code == 400, body[:40]
        assert b"<Detail>" in response.content
    with pytest.raises(ResourceNotFoundError):
        sdk.get_queue(name)


def test_namespace_properties(sdk: ServiceBusAdministrationClient, namespace: str) -> None:
    props = sdk.get_namespace_properties()
    own = RaybusAdmin(namespace).get_namespace_properties()
    assert props.name == namespace
    assert props.messaging_sku == "Standard" and props.namespace_type == "Messaging"
    assert props.messaging_units is None and props.alias is None
    assert own.created_at_utc is not None and props.created_at_utc is not None
    # The feed carries whole seconds or milliseconds; the times are raybus's own.
    assert abs((props.created_at_utc - own.created_at_utc).total_seconds()) < 1
    assert props.modified_at_utc == props.created_at_utc


def test_sas_keys_from_the_connection_string_are_checked_by_the_broker(
    server: Gateway, namespace: str
) -> None:
    """The SDK signs with the connection string's key; the gateway passes the token on and
    raybus's actors check it: a Manage key works, a wrong key is 401 (the SDK's
    ClientAuthenticationError), and so is a Send-only key (Service Bus answers a token without
    the Manage claim 401). Runs last: rules close the namespace,
    so they are removed again at the end."""
    root_key, send_key = "R" * 44, "S" * 44
    open_admin = RaybusAdmin(namespace)
    open_admin.create_authorization_rule("root", ["Manage"], primary_key=root_key)
    root = RaybusAdmin(namespace, credential=SharedAccessKeyCredential("root", root_key))
    try:
        root.create_authorization_rule("sender", ["Send"], primary_key=send_key)

        def client(key_name: str, key: str) -> ServiceBusAdministrationClient:
            conn = server.connection_string.split(";SharedAccessKeyName=")[0]
            return ServiceBusAdministrationClient.from_connection_string(
                f"{conn};SharedAccessKeyName={key_name};SharedAccessKey={key}",
                connection_verify=server.certfile,
            )

        name = _name("q")
        with client("root", root_key) as manager:
            manager.create_queue(name)
            assert manager.get_queue(name).name == name
        with client("root", "W" * 44) as wrong, pytest.raises(ClientAuthenticationError):
            wrong.get_queue(name)
        # A token without Manage: Service Bus answers 401, which the SDK raises as
        # ClientAuthenticationError.
        with client("sender", send_key) as sender, pytest.raises(ClientAuthenticationError):
            sender.create_queue(_name("q"))
        assert [q.name for q in root.list_queues() if q.name == name] == [name]

        # An entity's AuthorizationRules are raybus's entity-level rules.
        guarded, reader_key = _name("q"), "L" * 44
        with client("root", root_key) as manager:
            made = manager.create_queue(
                guarded,
                authorization_rules=[
                    AuthorizationRule(key_name="reader", rights=["Listen"], primary_key=reader_key)
                ],
            )
            assert [(r.key_name, r.rights) for r in made.authorization_rules] == [
                ("reader", ["Listen"])
            ]
        (stored,) = root.list_authorization_rules(entity=guarded)
        assert (stored.key_name, stored.primary_key) == ("reader", reader_key)
        with raybus.ServiceBusClient(
            namespace, credential=SharedAccessKeyCredential("reader", reader_key)
        ) as reader:
            with reader.get_queue_receiver(guarded) as receiver:
                assert receiver.peek_messages(max_message_count=1) == []
            with (
                reader.get_queue_sender(guarded) as sender,
                pytest.raises(ServiceBusAuthorizationError),
            ):
                sender.send_messages(ServiceBusMessage("not allowed"))
        root.delete_queue(guarded)
    finally:
        for rule in ("sender", "root"):
            try:
                root.delete_authorization_rule(rule)
            except ServiceBusError:
                pass
