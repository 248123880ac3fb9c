"""SAS tokens through the gateway against a namespace with access rules: the SDK's token
(signed with the connection string's key) reaches the actors, which grant or refuse."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from amqp_gateway_fixtures import receive_n
from azure.servicebus import ServiceBusClient as SdkClient
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthorizationError

from raybus.amqp import GatewayHandle, start_gateway
from raybus.auth import SharedAccessKeyCredential
from raybus.management import ServiceBusAdministrationClient


@pytest.fixture(scope="module")
def closed(module_namespace: str) -> Iterator[tuple[GatewayHandle, str]]:
    """A namespace closed by rules (manage, send-only, listen-only) with one queue, and a
    gateway for it; yields (gateway, queue). The queue is deleted with the manage key (the
    module namespace's own cleanup has no token)."""
    namespace = module_namespace
    queue = f"secure-{uuid.uuid4().hex[:6]}"
    ServiceBusAdministrationClient(namespace).create_queue(queue)
    open_admin = ServiceBusAdministrationClient(namespace)
    open_admin.create_authorization_rule("manage", ["Manage"], primary_key="manage-key-0123456789")
    admin = ServiceBusAdministrationClient(
        namespace, credential=SharedAccessKeyCredential("manage", "manage-key-0123456789")
    )
    admin.create_authorization_rule("sender", ["Send"], primary_key="send-key-0123456789")
    admin.create_authorization_rule("listener", ["Listen"], primary_key="listen-key-0123456789")
    try:
        with start_gateway(namespace, port=0) as gateway:
            yield gateway, queue
    finally:
        admin.delete_queue(queue)


def _sdk(gateway: GatewayHandle, key_name: str, key: str) -> SdkClient:
    return SdkClient.from_connection_string(
        f"Endpoint=sb://localhost:{gateway.port};SharedAccessKeyName={key_name};"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true;",
        retry_total=0,
    )


def test_rights_from_the_sdk_token_are_enforced(closed: tuple[GatewayHandle, str]) -> None:
    gateway, queue = closed
    with _sdk(gateway, "sender", "send-key-0123456789") as sdk:
        with sdk.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("signed"), timeout=10)
        receiver = sdk.get_queue_receiver(queue, max_wait_time=1)
        with pytest.raises(ServiceBusAuthorizationError), receiver:
            receiver.receive_messages(max_wait_time=1)
    with _sdk(gateway, "listener", "listen-key-0123456789") as sdk:
        with sdk.get_queue_receiver(queue, max_wait_time=3) as receiver:
            (msg,) = receive_n(receiver, 1)
            assert str(msg) == "signed"
            receiver.complete_message(msg)
        sender = sdk.get_queue_sender(queue)
        with pytest.raises(ServiceBusAuthorizationError), sender:
            sender.send_messages(ServiceBusMessage("not allowed"), timeout=10)


def test_a_token_signed_with_the_wrong_key_is_refused(closed: tuple[GatewayHandle, str]) -> None:
    gateway, queue = closed
    with _sdk(gateway, "sender", "not-the-key-0123456789") as sdk:
        sender = sdk.get_queue_sender(queue)
        with pytest.raises(ServiceBusAuthorizationError), sender:
            sender.send_messages(ServiceBusMessage("x"), timeout=10)
