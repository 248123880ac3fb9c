"""The SDK's per-handler options on both APIs: ``client_identifier`` (kept, or made as the
SDK makes it), ``socket_timeout`` (checked, no effect: README Deviations), and ``timeout`` on
``list_queue_sessions`` / ``list_subscription_sessions``."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

import raybus
from raybus import ServiceBusMessage, _rpc, aio
from raybus.exceptions import InvalidArgumentError, OperationTimeoutError
from raybus.management import ServiceBusAdministrationClient

_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def test_handlers_keep_a_given_client_identifier_or_make_one_as_the_sdk_does(
    client: raybus.ServiceBusClient, admin: ServiceBusAdministrationClient
) -> None:
    admin.create_queue("q")
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    with (
        client.get_queue_sender("q", client_identifier="orders-api-1", socket_timeout=5) as named,
        client.get_queue_sender("q") as anonymous,
        client.get_topic_sender("t", client_identifier="pub") as pub,
        client.get_queue_receiver("q", client_identifier="worker-7", socket_timeout=0.5) as worker,
        client.get_subscription_receiver("t", "s") as sub,
    ):
        assert named.client_identifier == "orders-api-1" and pub.client_identifier == "pub"
        assert worker.client_identifier == "worker-7"
        assert re.fullmatch(f"SBSender-{_UUID}", anonymous.client_identifier)
        assert re.fullmatch(f"SBReceiver-{_UUID}", sub.client_identifier)
        named.send_messages(ServiceBusMessage("works as any sender"))
        (got,) = worker.receive_messages(max_wait_time=5)
        worker.complete_message(got)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("client_identifier", ""),
        ("client_identifier", 7),
        ("socket_timeout", 0),
        ("socket_timeout", -1.0),
        ("socket_timeout", "5"),
        ("socket_timeout", True),
    ],
)
def test_a_bad_handler_option_is_a_typed_error_naming_it(
    client: raybus.ServiceBusClient, option: str, value: Any
) -> None:
    aclient = client._aio
    for make in (
        lambda: client.get_queue_sender("q", **{option: value}),
        lambda: client.get_topic_sender("t", **{option: value}),
        lambda: client.get_queue_receiver("q", **{option: value}),
        lambda: aclient.get_subscription_receiver("t", "s", **{option: value}),
    ):
        with pytest.raises(InvalidArgumentError) as err:
            make()
        assert err.value.argument == option


def test_listing_sessions_takes_a_timeout(
    client: raybus.ServiceBusClient,
    admin: ServiceBusAdministrationClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin.create_queue("sq", requires_session=True)
    admin.create_topic("st")
    admin.create_subscription("st", "s", requires_session=True)
    with client.get_queue_sender("sq") as sender:
        sender.send_messages(ServiceBusMessage("m", session_id="a"))
    assert client.list_queue_sessions("sq", timeout=10) == ["a"]
    assert client.list_subscription_sessions("st", "s", timeout=10) == []
    with pytest.raises(InvalidArgumentError) as err:
        client.list_queue_sessions("sq", timeout=0)
    assert err.value.argument == "timeout"

    real = _rpc.call

    async def slow(entity: Any, method: Any, *args: Any, **kw: Any) -> Any:
        if _rpc._name(method) == "list_sessions":
            await asyncio.sleep(5)
        return await real(entity, method, *args, **kw)

    monkeypatch.setattr(_rpc, "call", slow)
    with pytest.raises(OperationTimeoutError, match=r"within 0\.2 s"):
        client.list_queue_sessions("sq", timeout=0.2)

    async def aio_side() -> None:
        with pytest.raises(OperationTimeoutError):
            await aio.ServiceBusClient(client.namespace).list_subscription_sessions(
                "st", "s", timeout=0.2
            )

    asyncio.run(aio_side())
