"""What the Azure SDK sends and reads, through ``handle_management``, without Ray or sockets.

The unmodified SDK admin client runs over a ``requests`` adapter that calls
``handle_management`` in-process with ``_StubAdmin``: a dictionary of raybus's own property
objects (so raybus's validation applies) standing in for the broker. Each test checks both
directions: the options raybus's admin client receives from the SDK's XML, and the values the
SDK reads back from ours. Routing and error mapping are checked on ``handle_management``
directly. The same flows against real Ray actors are in
``tests/integration/test_http_management.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import io
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import requests
import urllib3
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.core.pipeline.transport import RequestsTransport
from azure.servicebus.management import (
    AuthorizationRule as SdkAuthorizationRule,
)
from azure.servicebus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from requests.structures import CaseInsensitiveDict

from raybus._core import filters as rb
from raybus._models import MAX_DURATION, QueueProperties, QueueRuntimeProperties
from raybus._topic_models import (
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
)
from raybus.aio._entity_rules import given_rules
from raybus.auth import AccessRights, AuthorizationRule, normalise_rights
from raybus.exceptions import (
    FilterSyntaxError,
    InvalidArgumentError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusError,
    ServiceBusServerBusyError,
)
from raybus.http._atom import handle_management

CREATED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


class _StubAdmin:
    """The async admin methods ``handle_management`` calls, over plain dictionaries."""

    namespace = "unit"

    def __init__(self) -> None:
        self.entities: dict[str, Any] = {}
        self.subs: dict[tuple[str, str], SubscriptionProperties] = {}
        self.rules: dict[tuple[str, str], list[rb.RuleProperties]] = {}
        self.calls: list[tuple[str, Any]] = []
        self.access: dict[tuple[str, str], AuthorizationRule] = {}
        self.fail: ServiceBusError | None = None

    def _get(self, name: str, kind: type) -> Any:
        if self.fail is not None:
            raise self.fail
        found = self.entities.get(name)
        if not isinstance(found, kind):
            raise MessagingEntityNotFoundError(f"no {kind.__name__} {name!r}", name)
        return found

    def _new(self, props: Any, rules: Any) -> Any:
        if props.name in self.entities:
            raise MessagingEntityAlreadyExistsError("exists", props.name)
        self.entities[props.name] = props
        self._set_rules(props.name, rules)
        return self._with_rules(props)

    def _with_rules(self, props: Any) -> Any:
        """As the admin client answers: the entity's access rules attached."""
        rules = [r for r in self.access.values() if r.entity == props.name]
        return dataclasses.replace(props, authorization_rules=rules)

    def _set_rules(self, entity: str, rules: list[AuthorizationRule] | None) -> None:
        """As the admin client applies ``authorization_rules``: the entity's whole set, an
        unchanged rule left as it is (calls recorded for the changes only)."""
        if rules is None:
            return
        rules = given_rules(rules, entity)  # checked and completed as the admin client does
        old = {k: r for (e, k), r in self.access.items() if e == entity}
        for key_name in sorted(set(old) - {r.key_name for r in rules}):
            self.calls.append(("delete_authorization_rule", key_name))
            del self.access[entity, key_name]
        for rule in rules:
            prev = old.get(rule.key_name)
            if prev is None or (prev.rights, prev.keys()) != (rule.rights, rule.keys()):
                self.calls.append(("create_authorization_rule", rule.key_name))
                self.access[entity, rule.key_name] = dataclasses.replace(
                    rule, entity=entity, created_at_utc=CREATED, modified_at_utc=CREATED
                )

    def _update(self, props: Any, options: dict[str, Any]) -> Any:
        rules = options.pop("authorization_rules", props.authorization_rules)
        self.entities[props.name] = dataclasses.replace(props, **options, authorization_rules=None)
        self._set_rules(props.name, rules)
        return self._with_rules(self.entities[props.name])

    async def create_queue(self, name: str, **options: Any) -> QueueProperties:
        rules = options.pop("authorization_rules", None)
        self.calls.append(("create_queue", options))
        return self._new(QueueProperties(name, **options), rules)  # type: ignore[no-any-return]

    async def get_queue(self, name: str) -> QueueProperties:
        return self._with_rules(self._get(name, QueueProperties))  # type: ignore[no-any-return]

    async def update_queue(self, queue: QueueProperties, **options: Any) -> QueueProperties:
        self.calls.append(("update_queue", options))
        return self._update(queue, options)  # type: ignore[no-any-return]

    async def delete_queue(self, name: str) -> None:
        del self.entities[self._get(name, QueueProperties).name]

    async def list_queues(self) -> list[QueueProperties]:
        queues = [e for e in self.entities.values() if isinstance(e, QueueProperties)]
        return [self._with_rules(q) for q in queues]

    async def get_queue_runtime_properties(self, name: str) -> QueueRuntimeProperties:
        self._get(name, QueueProperties)
        return QueueRuntimeProperties(
            name, 4, 2, 1, size_in_bytes=99, created_at_utc=CREATED, updated_at_utc=CREATED
        )

    async def create_topic(self, name: str, **options: Any) -> TopicProperties:
        rules = options.pop("authorization_rules", None)
        self.calls.append(("create_topic", options))
        return self._new(TopicProperties(name, **options), rules)  # type: ignore[no-any-return]

    async def get_topic(self, name: str) -> TopicProperties:
        return self._with_rules(self._get(name, TopicProperties))  # type: ignore[no-any-return]

    async def update_topic(self, topic: TopicProperties, **options: Any) -> TopicProperties:
        return self._update(topic, options)  # type: ignore[no-any-return]

    async def get_topic_runtime_properties(self, name: str) -> TopicRuntimeProperties:
        self._get(name, TopicProperties)
        return TopicRuntimeProperties(name, subscription_count=3, scheduled_message_count=1)

    async def create_subscription(
        self, topic: str, name: str, *, default_rule: Any = None, **options: Any
    ) -> SubscriptionProperties:
        self.calls.append(("create_subscription", {**options, "default_rule": default_rule}))
        self.subs[topic, name] = SubscriptionProperties(topic, name, **options)
        self.rules[topic, name] = [
            default_rule or rb.RuleProperties("$Default", rb.TrueRuleFilter())
        ]
        return self.subs[topic, name]

    async def get_subscription(self, topic: str, name: str) -> SubscriptionProperties:
        if (topic, name) not in self.subs:
            raise MessagingEntityNotFoundError("no subscription", name)
        return self.subs[topic, name]

    async def update_subscription(
        self, topic: str, sub: SubscriptionProperties, **options: Any
    ) -> SubscriptionProperties:
        self.subs[topic, sub.name] = dataclasses.replace(sub, **options)
        return self.subs[topic, sub.name]

    async def get_subscription_runtime_properties(
        self, topic: str, name: str
    ) -> SubscriptionRuntimeProperties:
        return SubscriptionRuntimeProperties(topic, name, 5, 1, total_message_count=8)

    async def list_subscriptions(self, topic: str) -> list[SubscriptionProperties]:
        return [s for (t, _), s in self.subs.items() if t == topic]

    async def list_authorization_rules(self, *, entity: str) -> list[AuthorizationRule]:
        return [r for r in self.access.values() if r.entity == entity]

    async def create_authorization_rule(
        self,
        key_name: str,
        rights: Any,
        *,
        entity: str,
        primary_key: str | None = None,
        secondary_key: str | None = None,
    ) -> AuthorizationRule:
        self.calls.append(("create_authorization_rule", key_name))
        keys = {"primary_key": primary_key, "secondary_key": secondary_key}
        rule = AuthorizationRule(
            key_name,
            normalise_rights(rights),
            entity=entity,
            **{k: v for k, v in keys.items() if v is not None},
        )
        self.access[entity, key_name] = rule
        return rule

    async def delete_authorization_rule(self, key_name: str, *, entity: str) -> None:
        self.calls.append(("delete_authorization_rule", key_name))
        del self.access[entity, key_name]

    async def create_rule(
        self, topic: str, sub: str, name: str, *, filter: Any, action: Any
    ) -> rb.RuleProperties:
        rules = self.rules[topic, sub]
        if any(r.name == name for r in rules):
            raise MessagingEntityAlreadyExistsError("rule exists", name)
        rules.append(rb.RuleProperties(name, filter, action))
        return rules[-1]

    async def list_rules(self, topic: str, sub: str) -> list[rb.RuleProperties]:
        return list(self.rules[topic, sub])

    async def get_rule(self, topic: str, sub: str, name: str) -> rb.RuleProperties:
        for rule in self.rules[topic, sub]:
            if rule.name == name:
                return rule
        raise MessagingEntityNotFoundError("no rule", name)

    async def delete_rule(self, topic: str, sub: str, name: str) -> None:
        self.rules[topic, sub].remove(await self.get_rule(topic, sub, name))

    async def update_rule(self, topic: str, sub: str, rule: rb.RuleProperties) -> rb.RuleProperties:
        rules = self.rules[topic, sub]
        rules[rules.index(await self.get_rule(topic, sub, rule.name))] = rule
        return rule


class _InProcess(requests.adapters.BaseAdapter):
    """Answers the SDK's HTTPS requests by calling ``handle_management`` directly."""

    def __init__(self, admin: _StubAdmin) -> None:
        super().__init__()
        self.admin = admin

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        url = urlsplit(request.url or "")
        body = request.body or b""
        result = asyncio.run(
            handle_management(
                request.method or "GET",
                url.path,
                dict(parse_qsl(url.query)),
                dict(request.headers) | {"Host": url.netloc},
                body.encode() if isinstance(body, str) else body,
                self.admin,  # type: ignore[arg-type]
            )
        )
        assert result is not None, request.url
        status, headers, content = result
        response = requests.Response()
        response.status_code, response.reason = status, http.HTTPStatus(status).phrase
        response.headers = CaseInsensitiveDict(headers)
        response._content = content
        # azure-core sets a flag on the raw urllib3 response.
        response.raw = urllib3.HTTPResponse(
            body=io.BytesIO(content), headers=headers, status=status, preload_content=False
        )
        response.url, response.request = request.url or "", request
        return response

    def close(self) -> None:
        pass


@pytest.fixture
def stub() -> _StubAdmin:
    return _StubAdmin()


@pytest.fixture
def sdk(stub: _StubAdmin) -> Iterator[ServiceBusAdministrationClient]:
    session = requests.Session()
    session.mount("https://", _InProcess(stub))
    client = ServiceBusAdministrationClient.from_connection_string(
        "Endpoint=sb://example.test/;SharedAccessKeyName=k;SharedAccessKey=s",
        transport=RequestsTransport(session=session),
        retry_total=0,
    )
    with client:
        yield client


def test_every_queue_setting_crosses_both_ways(
    sdk: ServiceBusAdministrationClient, stub: _StubAdmin
) -> None:
    stub.entities["dlq"] = QueueProperties("dlq")
    props = sdk.create_queue(
        "q",
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
        enable_express=True,
        enable_partitioning=True,
        forward_to="dlq",
        forward_dead_lettered_messages_to="dlq",
        user_metadata="meta",
        max_message_size_in_kilobytes=512,
    )
    assert stub.calls[-1] == (
        "create_queue",
        {
            "lock_duration": timedelta(seconds=30),
            "max_delivery_count": 5,
            "default_message_time_to_live": timedelta(hours=1),
            "dead_lettering_on_message_expiration": True,
            "requires_duplicate_detection": True,
            "duplicate_detection_history_time_window": timedelta(minutes=2),
            "max_size_in_megabytes": 2048,
            "requires_session": True,
            "auto_delete_on_idle": timedelta(minutes=10),
            "enable_batched_operations": False,
            "enable_express": True,
            "partition_count": 4,
            "forward_to": "dlq",
            "forward_dead_lettered_messages_to": "dlq",
            "user_metadata": "meta",
            "max_message_size_in_kilobytes": 512,
        },
    )
    assert props.lock_duration == timedelta(seconds=30)
    # Sent as given; a forwarding queue's reads back as the maximum, as Service Bus sets it.
    assert props.auto_delete_on_idle == MAX_DURATION
    assert props.enable_express is True and props.enable_partitioning is True
    assert props.forward_to == "sb://example.test/dlq"
    assert props.forward_dead_lettered_messages_to == "sb://example.test/dlq"
    assert props.availability_status == "Available"
    runtime = sdk.get_queue_runtime_properties("q")
    assert (runtime.active_message_count, runtime.dead_letter_message_count) == (4, 2)
    assert (runtime.scheduled_message_count, runtime.total_message_count) == (1, 7)
    assert (runtime.size_in_bytes, runtime.created_at_utc) == (99, CREATED)


def test_defaults_read_back_as_service_bus_defaults(sdk: ServiceBusAdministrationClient) -> None:
    props = sdk.create_queue("plain")
    assert props.default_message_time_to_live == MAX_DURATION
    assert props.lock_duration == timedelta(minutes=1)
    assert props.status == "Active"
    assert props.forward_to is None and props.user_metadata is None
    assert props.authorization_rules is None


def test_an_update_sends_back_every_field_and_changes_only_the_edited_ones(
    sdk: ServiceBusAdministrationClient, stub: _StubAdmin
) -> None:
    sdk.create_queue("q", lock_duration=timedelta(seconds=20))
    got = sdk.get_queue("q")
    got.max_delivery_count = 3
    sdk.update_queue(got, status="SendDisabled")
    assert stub.entities["q"] == QueueProperties(
        "q", lock_duration=timedelta(seconds=20), max_delivery_count=3, status="SendDisabled"
    )


def test_an_update_with_forwarding_and_metadata_set_to_none_clears_them(
    sdk: ServiceBusAdministrationClient, stub: _StubAdmin
) -> None:
    """The SDK leaves None fields out of an update's XML; Service Bus replaces the whole
    description, so they are cleared (a forwarding source could otherwise never be received
    from again). Settings it sends stay as sent."""
    stub.entities["dst"] = QueueProperties("dst")
    sdk.create_queue(
        "q", forward_to="dst", forward_dead_lettered_messages_to="dst", user_metadata="m"
    )
    got = sdk.get_queue("q")
    got.forward_to = None
    got.forward_dead_lettered_messages_to = None
    got.user_metadata = None
    sdk.update_queue(got)
    assert stub.entities["q"] == QueueProperties("q", auto_delete_on_idle=MAX_DURATION)
    sdk.update_queue(sdk.get_queue("q"), forward_to="dst")  # and set again
    assert stub.entities["q"].forward_to == "dst"

    stub.entities["t"] = TopicProperties("t", user_metadata="tm")
    topic = sdk.get_topic("t")
    topic.user_metadata = None
    sdk.update_topic(topic)
    assert stub.entities["t"].user_metadata is None
    sdk.create_subscription("t", "s", forward_to="dst", user_metadata="sm")
    sub = sdk.get_subscription("t", "s")
    sub.forward_to = None
    sdk.update_subscription("t", sub)
    assert (stub.subs["t", "s"].forward_to, stub.subs["t", "s"].user_metadata) == (None, "sm")


@pytest.mark.parametrize(
    ("kind", "status"), [("topic", "ReceiveDisabled"), ("subscription", "SendDisabled")]
)
def test_a_status_the_entity_kind_cannot_have_is_refused(
    sdk: ServiceBusAdministrationClient, stub: _StubAdmin, kind: str, status: str
) -> None:
    """Service Bus: a topic is Active, Disabled or SendDisabled; a subscription Active,
    Disabled or ReceiveDisabled. Refused at create and at update, nothing changed."""
    stub.entities["t"] = TopicProperties("t")
    sdk.create_subscription("t", "s")
    with pytest.raises(HttpResponseError, match="status") as info:
        if kind == "topic":
            sdk.create_topic("t2", status=status)
        else:
            sdk.create_subscription("t", "s2", status=status)
    assert info.value.status_code == 400
    assert "t2" not in stub.entities and ("t", "s2") not in stub.subs
    with pytest.raises(HttpResponseError, match="status"):
        if kind == "topic":
            sdk.update_topic(sdk.get_topic("t"), status=status)
        else:
            sdk.update_subscription("t", sdk.get_subscription("t", "s"), status=status)
    assert stub.entities["t"].status == "Active" and stub.subs["t", "s"].status == "Active"


def test_topic_and_subscription_settings_cross_both_ways(
    sdk: ServiceBusAdministrationClient, stub: _StubAdmin
) -> None:
    topic = sdk.create_topic(
        "t",
        default_message_time_to_live=timedelta(hours=2),
        support_ordering=True,
        user_metadata="tm",
        enable_partitioning=True,  # accepted; raybus topics read back unpartitioned
    )
    assert stub.entities["t"] == TopicProperties(
        "t",
        default_message_time_to_live=timedelta(hours=2),
        support_ordering=True,
        user_metadata="tm",
    )
    assert (topic.support_ordering, topic.enable_partitioning) == (True, False)
    assert sdk.get_topic_runtime_properties("t").subscription_count == 3
    sub = sdk.create_subscription(
        "t",
        "s",
        lock_duration=timedelta(seconds=45),
        requires_session=True,
        dead_lettering_on_filter_evaluation_exceptions=False,
        forward_to="elsewhere",
    )
    assert stub.subs["t", "s"] == SubscriptionProperties(
        "t",
        "s",
        lock_duration=timedelta(seconds=45),
        requires_session=True,
        dead_lettering_on_filter_evaluation_exceptions=False,
        forward_to="elsewhere",
    )
    assert sub.lock_duration == timedelta(seconds=45) and sub.requires_session is True
    runtime = sdk.get_subscription_runtime_properties("t", "s")
    assert (runtime.active_message_count, runtime.dead_letter_message_count) == (5, 1)
    assert runtime.total_message_count == 8


def test_rules_cross_both_ways_with_typed_parameters(
    sdk: ServiceBusAdministrationClient, stub: _StubAdmin
) -> None:
    stub.entities["t"] = TopicProperties("t")
    sdk.create_subscription("t", "s")
    when = datetime(2020, 1, 1, tzinfo=timezone.utc)
    params = {"@i": 5, "@l": 2**40, "@f": 1.5, "@b": True, "@s": "x", "@d": when}
    rule = sdk.create_rule(
        "t",
        "s",
        "sql",
        filter=SqlRuleFilter("a = @i OR b = @s", params),
        action=SqlRuleAction("SET c = @v; REMOVE d", {"@v": "q"}),
    )
    stored = stub.rules["t", "s"][-1]
    assert stored.filter == rb.SqlRuleFilter("a = @i OR b = @s", params)
    assert stored.action == rb.SqlRuleAction("SET c = @v; REMOVE d", {"@v": "q"})
    assert rule.filter.parameters == params
    assert rule.action.parameters == {"@v": "q"}

    sdk.create_rule(
        "t",
        "s",
        "corr",
        filter=CorrelationRuleFilter(
            correlation_id="c",
            message_id="m",
            to="to",
            reply_to="r",
            label="L",
            session_id="sid",
            reply_to_session_id="rs",
            content_type="ct",
            properties={"k": 1, "flag": False},
        ),
    )
    assert stub.rules["t", "s"][-1].filter == rb.CorrelationRuleFilter(
        "c", "m", "to", "r", "L", "sid", "rs", "ct", {"k": 1, "flag": False}
    )
    sdk.create_rule("t", "s", "never", filter=FalseRuleFilter())
    assert isinstance(stub.rules["t", "s"][-1].filter, rb.FalseRuleFilter)
    listed = {r.name: r for r in sdk.list_rules("t", "s")}
    assert isinstance(listed["$Default"].filter, TrueRuleFilter)
    assert isinstance(listed["never"].filter, FalseRuleFilter)
    assert listed["corr"].filter.properties == {"k": 1, "flag": False}
    assert listed["corr"].filter.reply_to_session_id == "rs"
    assert listed["sql"].filter.parameters == params


def test_a_subscriptions_default_rule_is_created_with_it(
    sdk: ServiceBusAdministrationClient, stub: _StubAdmin
) -> None:
    xml = (
        '<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
        '<SubscriptionDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/'
        'servicebus/connect" xmlns:i="http://www.w3.org/2001/XMLSchema-instance">'
        '<DefaultRuleDescription><Filter i:type="SqlFilter"><SqlExpression>x = 1'
        "</SqlExpression></Filter><Name>first</Name></DefaultRuleDescription>"
        "</SubscriptionDescription></content></entry>"
    )
    status, _, _ = _call(stub, "PUT", "/t/subscriptions/s", xml.encode())
    assert status == 201
    assert stub.calls[-1][1]["default_rule"] == rb.RuleProperties(
        "first", rb.SqlRuleFilter("x = 1")
    )


def test_update_rule_replaces_it_and_a_bad_filter_keeps_the_old_one(
    sdk: ServiceBusAdministrationClient, stub: _StubAdmin
) -> None:
    stub.entities["t"] = TopicProperties("t")
    sdk.create_subscription("t", "s")
    rule = sdk.create_rule("t", "s", "r", filter=SqlRuleFilter("a = 1"))
    sdk.update_rule("t", "s", rule, filter=SqlRuleFilter("a = 2"))
    assert stub.rules["t", "s"][-1].filter == rb.SqlRuleFilter("a = 2")
    assert [r.name for r in stub.rules["t", "s"]] == ["$Default", "r"]  # updated in place
    with pytest.raises(HttpResponseError) as info:
        sdk.update_rule("t", "s", rule, filter=SqlRuleFilter("a = = 2"))
    assert info.value.status_code == 400
    assert [r.filter for r in stub.rules["t", "s"] if r.name == "r"] == [rb.SqlRuleFilter("a = 2")]
    missing = sdk.get_rule("t", "s", "r")
    missing.name = "nope"
    with pytest.raises(ResourceNotFoundError):
        sdk.update_rule("t", "s", missing)


def test_lists_page_in_name_order(sdk: ServiceBusAdministrationClient, stub: _StubAdmin) -> None:
    for name in ("c", "A", "b", "d", "e"):
        stub.entities[name] = QueueProperties(name)
    assert [q.name for q in sdk.list_queues(max_page_size=2)] == ["A", "b", "c", "d", "e"]
    assert [q.name for q in sdk.list_queues(start_index=3)] == ["d", "e"]


# ------------------------------------------------------------------ routing and errors


def _call(
    stub: _StubAdmin, method: str, path: str, body: bytes = b"", **query: str
) -> tuple[int, dict[str, str], bytes]:
    result = asyncio.run(handle_management(method, path, query, {}, body, stub))  # type: ignore[arg-type]
    assert result is not None
    return result


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/q/messages"),
        ("POST", "/q/messages/head"),
        ("DELETE", "/q/messages/head"),
        ("PUT", "/q/messages/1/lock"),
        ("DELETE", "/t/subscriptions/s/messages/head"),
        ("GET", "/"),
        ("HEAD", "/q"),
        ("POST", "/q"),
    ],
)
def test_runtime_and_non_management_requests_are_left_to_the_gateway(
    stub: _StubAdmin, method: str, path: str
) -> None:
    assert asyncio.run(handle_management(method, path, {}, {}, b"", stub)) is None  # type: ignore[arg-type]


def test_a_percent_encoded_name_holding_messages_is_an_entity(stub: _StubAdmin) -> None:
    stub.entities["a/messages/b"] = QueueProperties("a/messages/b")
    status, _, body = _call(stub, "GET", "/a%2Fmessages%2Fb")
    assert status == 200 and b'<title type="text">a/messages/b</title>' in body


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("PUT", "/$Resources/queues", 405),
        ("GET", "/$Resources/rules", 404),
        ("DELETE", "/t/subscriptions", 405),
        ("GET", "/t/subscriptions/s/other", 404),
        ("GET", "/t/subscriptions/s/rules/r/x", 404),
    ],
)
def test_unknown_management_paths_get_an_error_body(
    stub: _StubAdmin, method: str, path: str, status: int
) -> None:
    got, headers, body = _call(stub, method, path)
    assert got == status
    assert headers["Content-Type"].startswith("application/xml")
    assert body.startswith(b"<Error><Code>")


@pytest.mark.parametrize(("top", "skip"), [("0", "0"), ("1001", "0"), ("x", "0"), ("5", "-1")])
def test_bad_paging_is_400(stub: _StubAdmin, top: str, skip: str) -> None:
    status, _, body = _call(stub, "GET", "/$Resources/queues", **{"$top": top, "$skip": skip})
    assert status == 400 and b"must be an integer" in body


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (MessagingEntityNotFoundError("gone", "q"), 404),
        (MessagingEntityAlreadyExistsError("there", "q"), 409),
        (InvalidArgumentError("bad", "q", "x"), 400),
        (FilterSyntaxError("SQL syntax error at position 3", "q"), 400),
        (ServiceBusAuthenticationError("who are you"), 401),
        (ServiceBusAuthorizationError("not allowed"), 401),  # as Service Bus: claims missing
        (ServiceBusServerBusyError("busy"), 503),
        (ServiceBusError("odd"), 500),
    ],
)
def test_raybus_errors_map_to_service_bus_status_codes(
    stub: _StubAdmin, error: ServiceBusError, status: int
) -> None:
    stub.fail = error
    got, _, body = _call(stub, "GET", "/q")
    assert got == status
    assert error.message.encode() in body


def test_the_sdk_raises_its_typed_errors(
    sdk: ServiceBusAdministrationClient, stub: _StubAdmin
) -> None:
    with pytest.raises(ResourceNotFoundError):
        sdk.get_queue("missing")
    sdk.create_queue("q")
    with pytest.raises(ResourceExistsError):
        sdk.create_queue("q")
    with pytest.raises(HttpResponseError) as info:
        sdk.create_queue("short", lock_duration=timedelta(minutes=6))
    assert info.value.status_code == 400 and "lock_duration" in info.value.message
    with pytest.raises(HttpResponseError) as info:
        sdk.create_queue("bad", status="Creating")
    assert "status 'Creating' is not one a queue can have" in info.value.message
    assert info.value.status_code == 400


@pytest.mark.parametrize(
    ("description", "reason"),
    [
        (
            "<QueueDescription><AuthorizationRules><AuthorizationRule/></AuthorizationRules>"
            "</QueueDescription>",
            "with a KeyName",
        ),
        (
            "<QueueDescription><AuthorizationRules><AuthorizationRule><KeyName>k</KeyName>"
            "<Rights><AccessRights>Fly</AccessRights></Rights></AuthorizationRule>"
            "</AuthorizationRules></QueueDescription>",
            "unknown access right",
        ),
        (
            "<QueueDescription><IsAnonymousAccessible>true</IsAnonymousAccessible>"
            "</QueueDescription>",
            "IsAnonymousAccessible",
        ),
        (
            "<QueueDescription><LockDuration>PT1M</LockDuration><LockDuration>PT2M</LockDuration>"
            "</QueueDescription>",
            "twice",
        ),
        (
            "<QueueDescription><MaxDeliveryCount>many</MaxDeliveryCount></QueueDescription>",
            "MaxDeliveryCount",
        ),
        ("<RuleDescription/>", "expected a QueueDescription or TopicDescription"),
        ("", "content element holding one description"),
    ],
)
def test_bad_descriptions_are_400_and_create_nothing(
    stub: _StubAdmin, description: str, reason: str
) -> None:
    body = f'<entry xmlns="http://www.w3.org/2005/Atom"><content>{description}</content></entry>'
    status, _, detail = _call(stub, "PUT", "/q", body.encode())
    assert status == 400
    assert reason.encode() in detail
    assert stub.entities == {}


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ('<Filter i:type="LikeFilter"/>', "unsupported filter type"),
        ('<Filter i:type="SqlFilter"/>', "needs a SqlExpression"),
        ('<Filter i:type="CorrelationFilter"/>', "at least one field"),
        ('<Action i:type="ScriptAction"/>', "unsupported action type"),
        (
            '<Filter i:type="SqlFilter"><SqlExpression>a = @p</SqlExpression><Parameters>'
            '<KeyValueOfstringanyType><Key>@p</Key><Value i:type="d:duration">PT1M</Value>'
            "</KeyValueOfstringanyType></Parameters></Filter>",
            "@p",
        ),
    ],
)
def test_bad_rules_are_400(stub: _StubAdmin, rule: str, reason: str) -> None:
    stub.entities["t"] = TopicProperties("t")
    asyncio.run(stub.create_subscription("t", "s"))
    body = (
        '<entry xmlns="http://www.w3.org/2005/Atom"><content><RuleDescription '
        'xmlns:i="http://www.w3.org/2001/XMLSchema-instance">'
        f"{rule}</RuleDescription></content></entry>"
    )
    status, _, detail = _call(stub, "PUT", "/t/subscriptions/s/rules/r", body.encode())
    assert status == 400, detail
    assert reason.encode() in detail
    assert [r.name for r in stub.rules["t", "s"]] == ["$Default"]


_VALID_RULE = (
    b'<?xml version="1.0" encoding="utf-8"?><entry xmlns="http://www.w3.org/2005/Atom">'
    b'<content type="application/xml"><RuleDescription xmlns="http://schemas.microsoft.com/'
    b'netservices/2010/10/servicebus/connect" xmlns:i="http://www.w3.org/2001/XMLSchema-instance">'
    b'<Filter i:type="SqlFilter"><SqlExpression>a = @p</SqlExpression><Parameters>'
    b'<KeyValueOfstringanyType><Key>@p</Key><Value i:type="d6p1:int" '
    b'xmlns:d6p1="http://www.w3.org/2001/XMLSchema">5</Value></KeyValueOfstringanyType>'
    b'</Parameters></Filter><Action i:type="SqlRuleAction"><SqlExpression>SET b = 1'
    b"</SqlExpression></Action><Name>r</Name></RuleDescription></content></entry>"
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cut=st.integers(min_value=0, max_value=len(_VALID_RULE)),
    at=st.integers(min_value=0, max_value=len(_VALID_RULE) - 1),
    byte=st.integers(min_value=0, max_value=255),
    tail=st.binary(max_size=20),
)
def test_damaged_bodies_are_answered_400_or_served_never_raised(
    cut: int, at: int, byte: int, tail: bytes
) -> None:
    """Whatever a body's damage (truncated, one byte changed, junk appended), the answer is a
    201 (still valid) or a 400 with a reason: no exception reaches the gateway."""
    damaged = bytearray(_VALID_RULE[:cut] + tail)
    if damaged:
        damaged[min(at, len(damaged) - 1)] = byte
    stub = _StubAdmin()
    stub.entities["t"] = TopicProperties("t")
    asyncio.run(stub.create_subscription("t", "s"))
    status, _, detail = _call(stub, "PUT", "/t/subscriptions/s/rules/r", bytes(damaged))
    assert status in (201, 400), detail
    if status == 400:
        assert detail.startswith(b"<Error><Code>400</Code><Detail>")
        assert [r.name for r in stub.rules["t", "s"]] == ["$Default"]


def test_the_undamaged_body_is_served() -> None:
    stub = _StubAdmin()
    stub.entities["t"] = TopicProperties("t")
    asyncio.run(stub.create_subscription("t", "s"))
    assert _call(stub, "PUT", "/t/subscriptions/s/rules/r", _VALID_RULE)[0] == 201
    assert stub.rules["t", "s"][-1] == rb.RuleProperties(
        "r", rb.SqlRuleFilter("a = @p", {"@p": 5}), rb.SqlRuleAction("SET b = 1")
    )


def test_entity_access_rules_cross_both_ways_and_an_update_rewrites_only_changes(
    sdk: ServiceBusAdministrationClient, stub: _StubAdmin
) -> None:
    props = sdk.create_queue(
        "q",
        authorization_rules=[
            SdkAuthorizationRule(
                key_name="reader", rights=["Listen"], primary_key="P" * 44, secondary_key="S" * 44
            ),
            SdkAuthorizationRule(key_name="admin", rights=["Manage"]),
        ],
    )
    reader = stub.access["q", "reader"]
    assert (reader.rights, reader.primary_key) == (frozenset({AccessRights.LISTEN}), "P" * 44)
    assert stub.access["q", "admin"].rights == frozenset(AccessRights)  # Manage implies all
    got = {r.key_name: r for r in props.authorization_rules}
    assert got["reader"].rights == ["Listen"] and got["reader"].secondary_key == "S" * 44
    assert got["admin"].rights == ["Listen", "Send", "Manage"]
    assert got["admin"].primary_key == stub.access["q", "admin"].primary_key  # generated
    assert got["reader"].claim_type == "SharedAccessKey"
    assert got["reader"].created_at_utc == got["reader"].modified_at_utc == CREATED

    fetched = sdk.get_queue("q")
    stub.calls.clear()
    sdk.update_queue(fetched)  # every rule sent back unchanged: nothing rewritten
    assert [c for c in stub.calls if "authorization" in c[0]] == []
    fetched.authorization_rules = [r for r in fetched.authorization_rules if r.key_name == "reader"]
    fetched.authorization_rules[0].rights = ["Listen", "Send"]
    sdk.update_queue(fetched)
    assert sorted(k for _, k in stub.access) == ["reader"]
    assert stub.access["q", "reader"].rights == frozenset({AccessRights.LISTEN, AccessRights.SEND})
    assert stub.access["q", "reader"].primary_key == "P" * 44  # kept
