"""``raybus authorization-rule``: shared-access rules from the command line, end to end.

Each test has its own namespace (``namespace``): the first rule closes a namespace, and the
other CLI tests share one per module.
"""

from __future__ import annotations

from typing import Any

import pytest
from cli_support import cli_runner, error_line, json_lines, own_lines
from typer.testing import Result

import raybus
from raybus import ServiceBusMessage
from raybus.auth import SharedAccessKeyCredential
from raybus.exceptions import ServiceBusAuthenticationError, ServiceBusAuthorizationError
from raybus.management import ServiceBusAdministrationClient

ROOT_KEY = "R" * 44


@pytest.fixture
def cli(namespace: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``cli(*args, code=0, key=None)``: run ``raybus --namespace NS *args`` (signing with rule
    ``root``'s key when ``key`` is given), check the exit code, return the result."""
    for name in ("RAYBUS_KEY_NAME", "RAYBUS_KEY", "RAYBUS_SAS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    run = cli_runner(namespace)

    def signed(*args: str, code: int = 0, key: str | None = None) -> Result:
        env = {"RAYBUS_KEY_NAME": "root", "RAYBUS_KEY": key} if key else None
        return run(*args, code=code, env=env)

    return signed


def test_create_list_show_renew_delete_and_the_printed_keys_work(cli: Any, namespace: str) -> None:
    admin = ServiceBusAdministrationClient(namespace)
    admin.create_queue("orders")
    [root] = json_lines(
        cli(
            "authorization-rule",
            "create",
            "root",
            "--rights",
            "Manage",
            "--primary-key",
            ROOT_KEY,
            "--json",
        )
    )
    assert root["rights"] == ["Send", "Listen", "Manage"]  # Manage implies the other two
    assert root["entity"] is None and root["primary_key"] == ROOT_KEY
    assert root["primary_connection_string"] == (
        f"Endpoint=sb://{namespace}.servicebus.windows.net/;"
        f"SharedAccessKeyName=root;SharedAccessKey={ROOT_KEY}"
    )
    # The namespace is closed now: the CLI needs a key.
    error_line(cli("queue", "list", code=1), "ServiceBusAuthenticationError")

    [app_rule] = json_lines(
        cli(
            "authorization-rule",
            "create",
            "app",
            "-r",
            "Send,Listen",
            "-e",
            "orders",
            "--json",
            key=ROOT_KEY,
        )
    )
    assert app_rule["rights"] == ["Send", "Listen"] and app_rule["entity"] == "orders"
    assert app_rule["primary_connection_string"].endswith(";EntityPath=orders")

    # The printed connection string opens the queue, and only that.
    with raybus.ServiceBusClient.from_connection_string(
        app_rule["primary_connection_string"]
    ) as client:
        client.get_queue_sender("orders").send_messages(ServiceBusMessage("by the CLI's key"))
    admin = ServiceBusAdministrationClient(
        namespace, credential=SharedAccessKeyCredential("root", ROOT_KEY)
    )
    admin.create_queue("other")
    app_client = raybus.ServiceBusClient(
        namespace, credential=SharedAccessKeyCredential("app", app_rule["secondary_key"])
    )
    with pytest.raises((ServiceBusAuthenticationError, ServiceBusAuthorizationError)):
        app_client.get_queue_sender("other").send_messages(ServiceBusMessage("not mine"))

    listed = json_lines(cli("authorization-rule", "list", "--json", key=ROOT_KEY))
    assert listed == [{"key_name": "root", "rights": ["Send", "Listen", "Manage"], "entity": None}]
    on_queue = json_lines(cli("authorization-rule", "list", "-e", "orders", "--json", key=ROOT_KEY))
    assert on_queue == [{"key_name": "app", "rights": ["Send", "Listen"], "entity": "orders"}]
    table = "\n".join(
        own_lines(cli("authorization-rule", "list", "-e", "orders", key=ROOT_KEY).stdout)
    )
    assert "app" in table and "Send, Listen" in table and app_rule["primary_key"] not in table
    [shown] = json_lines(
        cli("authorization-rule", "show", "app", "-e", "orders", "--json", key=ROOT_KEY)
    )
    assert shown == app_rule
    text = own_lines(cli("authorization-rule", "show", "app", "-e", "orders", key=ROOT_KEY).stdout)
    assert any(
        line.split() == ["primary_connection_string", app_rule["primary_connection_string"]]
        for line in text
    )

    # Renewing the primary key leaves the secondary working; the old primary stops.
    [renewed] = json_lines(
        cli(
            "authorization-rule",
            "renew",
            "app",
            "-e",
            "orders",
            "--key",
            "primary",
            "--json",
            key=ROOT_KEY,
        )
    )
    assert renewed["primary_key"] != app_rule["primary_key"]
    assert renewed["secondary_key"] == app_rule["secondary_key"]
    app_client.get_queue_sender("orders").send_messages(ServiceBusMessage("on the secondary"))
    old = raybus.ServiceBusClient(
        namespace, credential=SharedAccessKeyCredential("app", app_rule["primary_key"])
    )
    with pytest.raises(ServiceBusAuthenticationError):
        old.get_queue_sender("orders").send_messages(ServiceBusMessage("old key"))
    old.close()

    cli("authorization-rule", "delete", "app", "-e", "orders", key=ROOT_KEY)
    with pytest.raises(ServiceBusAuthenticationError):
        app_client.get_queue_sender("orders").send_messages(ServiceBusMessage("deleted"))
    app_client.close()
    assert admin.get_queue_runtime_properties("orders").active_message_count == 2


def test_bad_input_exits_with_its_code_and_changes_nothing(cli: Any, namespace: str) -> None:
    admin = ServiceBusAdministrationClient(namespace)
    admin.create_topic("t")
    admin.create_subscription("t", "s")
    line = error_line(
        cli("authorization-rule", "create", "x", "-r", "Sned", code=2), "InvalidArgumentError"
    )
    assert "Sned" in line
    line = error_line(
        cli("authorization-rule", "create", "x", "-r", "Listen", "-e", "t/subscriptions/s", code=2),
        "InvalidArgumentError",
    )
    assert "is a subscription" in line
    error_line(
        cli("authorization-rule", "create", "x", "-r", "Listen", "-e", "nope", code=3),
        "MessagingEntityNotFoundError",
    )
    error_line(cli("authorization-rule", "show", "missing", code=3), "MessagingEntityNotFoundError")
    error_line(
        cli("authorization-rule", "renew", "missing", "--key", "primary", code=3),
        "MessagingEntityNotFoundError",
    )
    error_line(
        cli("authorization-rule", "delete", "missing", code=3), "MessagingEntityNotFoundError"
    )
    assert admin.list_authorization_rules() == []  # still open: nothing was created
    # A bad --key names it, and the rule's keys stay as they were.
    [rule] = json_lines(cli("authorization-rule", "create", "root", "-r", "Manage", "--json"))
    line = error_line(
        cli(
            "authorization-rule",
            "renew",
            "root",
            "--key",
            "tertiary",
            code=2,
            key=rule["primary_key"],
        ),
        "InvalidArgumentError",
    )
    assert "tertiary" in line
    [shown] = json_lines(
        cli("authorization-rule", "show", "root", "--json", key=rule["primary_key"])
    )
    assert shown == rule
