"""Names and options of azure-servicebus that code written for it uses, checked without Ray:
the transport options raybus accepts and ignores, ``TransportType``, ``ApiVersion``,
``parse_connection_string``, ``ServiceBusCommunicationError`` and the asyncio ``AsyncList``."""

from __future__ import annotations

import ssl
from typing import Any

import pytest

import raybus
from raybus import _connection
from raybus._paged import ItemList
from raybus._sdk_options import check_admin_options, check_client_options
from raybus._sync import run
from raybus.aio._paged import AsyncList, listing
from raybus.auth import generate_sas_token
from raybus.exceptions import (
    InvalidArgumentError,
    MessagingEntityNotFoundError,
    ServiceBusCommunicationError,
    ServiceBusConnectionError,
)
from raybus.management import ApiVersion

CONN = "Endpoint=sb://orders.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey=k="


def test_the_sdks_transport_options_are_accepted_with_the_sdks_own_values() -> None:
    from azure.servicebus import TransportType as SdkTransportType

    check_client_options(
        {
            "logging_enable": True,
            "transport_type": SdkTransportType.AmqpOverWebsocket,
            "http_proxy": {"proxy_hostname": "127.0.0.1", "proxy_port": 3128},
            "user_agent": "orders-app",
            "try_timeout": 5,
            "custom_endpoint_address": "sb://127.0.0.1:443",
            "connection_verify": "/etc/ssl/ca.pem",
            "ssl_context": ssl.create_default_context(),
            "uamqp_transport": False,
        }
    )
    check_client_options({"transport_type": raybus.TransportType.Amqp})
    check_admin_options(
        {
            "api_version": ApiVersion.V2021_05,
            "logging_enable": False,
            "user_agent": "x",
            "proxies": {},
            "connection_verify": False,
        }
    )
    check_admin_options({"api_version": "2017-04"})


def test_raybus_has_the_sdks_api_versions_and_transport_types() -> None:
    from azure.servicebus import TransportType as SdkTransportType
    from azure.servicebus.management import ApiVersion as SdkApiVersion

    assert {v.value for v in ApiVersion} == {v.value for v in SdkApiVersion}
    for version in SdkApiVersion:  # code written for the SDK passes the SDK's own members
        check_admin_options({"api_version": version})
    assert {t.name: t.value for t in raybus.TransportType} == {
        t.name: t.value for t in SdkTransportType
    }


@pytest.mark.parametrize(
    ("check", "name", "value"),
    [
        (check_client_options, "logging_enable", "yes"),
        (check_client_options, "transport_type", "websocket"),
        (check_client_options, "try_timeout", 0),
        (check_client_options, "try_timeout", True),
        (check_client_options, "http_proxy", "127.0.0.1:3128"),
        (check_client_options, "ssl_context", "tls"),
        (check_admin_options, "api_version", "2099-01"),
        (check_admin_options, "proxies", ["http://proxy"]),
    ],
)
def test_a_bad_transport_option_is_an_invalid_argument_naming_it(
    check: Any, name: str, value: Any
) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        check({name: value})
    assert err.value.argument == name


def test_an_option_the_sdk_does_not_have_is_pythons_type_error() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'retry_totl'"):
        check_client_options({"retry_totl": 3})
    with pytest.raises(TypeError, match="ServiceBusAdministrationClient"):
        check_admin_options({"transport_type": 1})  # a client option, not an admin one


def test_parse_connection_string_gives_what_the_sdks_gives() -> None:
    from azure.servicebus import parse_connection_string as sdk_parse

    token = generate_sas_token("sb://ns.servicebus.windows.net/q", "send", "k", 2_000_000_000)
    for conn in (
        CONN,
        CONN + ";EntityPath=q1",
        f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessSignature={token}",
    ):
        ours, theirs = raybus.parse_connection_string(conn), sdk_parse(conn)
        assert isinstance(ours, raybus.ServiceBusConnectionStringProperties)
        for field in (
            "fully_qualified_namespace",
            "endpoint",
            "entity_path",
            "shared_access_key_name",
            "shared_access_key",
            "shared_access_signature",
        ):
            assert getattr(ours, field) == getattr(theirs, field), field
    with pytest.raises(InvalidArgumentError) as err:
        raybus.parse_connection_string("Endpoint=sb://ns/;SharedAccessKeyName=only-the-name")
    assert err.value.argument == "conn_str"


def test_ray_out_of_reach_is_a_communication_error_and_a_connection_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unreachable(address: str | None) -> None:
        raise ConnectionError("no GCS at 127.0.0.1:1")

    monkeypatch.setattr(_connection, "_ensure_ray", unreachable)
    with pytest.raises(ServiceBusCommunicationError, match="no GCS") as err:
        _connection.ensure_ray("127.0.0.1:1")
    assert isinstance(err.value, ServiceBusConnectionError)


async def test_an_async_list_is_iterated_or_awaited_and_fetched_once() -> None:
    calls = []

    async def fetch() -> list[int]:
        calls.append(1)
        return [1, 2, 3]

    listed = AsyncList(fetch)
    assert [i async for i in listed] == [1, 2, 3]
    assert await listed == [1, 2, 3]
    assert len(calls) == 1

    class Lister:
        @listing
        async def list_things(self, n: int) -> list[int]:
            return list(range(n))

    things = Lister().list_things(2)
    assert isinstance(things, AsyncList)
    assert [i async for i in things] == [0, 1]


async def test_an_async_list_is_read_by_page_as_the_sdks_async_item_paged() -> None:
    async def fetch() -> list[int]:
        return [1, 2, 3]

    listed = AsyncList(fetch)
    pages = [[i async for i in page] async for page in listed.by_page()]
    assert pages == [[1, 2, 3]]
    assert [page async for page in listed.by_page(continuation_token="next")] == []


def test_a_sync_listing_is_a_list_read_by_page_as_the_sdks_item_paged() -> None:
    listed = ItemList(["a", "b"])
    assert listed == ["a", "b"] and listed[1] == "b"
    assert [list(page) for page in listed.by_page()] == [["a", "b"]]
    assert list(listed.by_page(continuation_token="next")) == []


def test_the_sync_api_runs_an_async_list_to_its_list() -> None:
    async def fetch() -> list[str]:
        return ["a"]

    assert run(AsyncList(fetch)) == ["a"]


async def test_an_async_list_whose_listing_fails_raises_it_when_awaited_or_iterated() -> None:
    calls = []

    async def fetch() -> list[int]:
        calls.append(1)
        raise MessagingEntityNotFoundError("no such topic", "t")

    listed = AsyncList(fetch)
    with pytest.raises(MessagingEntityNotFoundError, match="no such topic"):
        await listed
    with pytest.raises(MessagingEntityNotFoundError, match="no such topic"):
        [i async for i in listed]
    assert len(calls) == 2  # nothing kept from a failed listing: the next use asks again
