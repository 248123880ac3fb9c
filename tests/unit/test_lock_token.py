"""The lock-token form ``settle_message_by_lock_token`` accepts (no Ray needed)."""

from __future__ import annotations

import inspect
import uuid
from typing import Any

import pytest

import raybus
from raybus import ServiceBusDisposition, aio
from raybus.aio._lock_token import check_lock_token
from raybus.exceptions import InvalidArgumentError


def test_lock_tokens_are_normalised_to_the_brokers_lower_case_uuid_form() -> None:
    token = uuid.uuid4()
    assert check_lock_token(str(token), "q") == str(token)
    assert check_lock_token(str(token).upper(), "q") == str(token)
    assert check_lock_token(token, "q") == str(token)  # AMQP decodes lock tokens as UUIDs


@pytest.mark.parametrize("bad", ["", "not-a-uuid", "1234", 42, None, b"\x00" * 16, 1.5])
def test_anything_else_is_an_invalid_argument_naming_lock_token(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check_lock_token(bad, "orders")
    assert info.value.argument == "lock_token"
    assert info.value.entity == "orders"


def test_dispositions_take_their_values_as_strings_too() -> None:
    assert ServiceBusDisposition("completed") is ServiceBusDisposition.COMPLETED
    assert {d.value for d in ServiceBusDisposition} == {
        "completed",
        "abandoned",
        "deferred",
        "deadlettered",
        "released",
    }


@pytest.mark.parametrize(
    ("sync_cls", "aio_cls", "name"),
    [
        (raybus.ServiceBusReceiver, aio.ServiceBusReceiver, "settle_message_by_lock_token"),
        (raybus.ServiceBusReceiver, aio.ServiceBusReceiver, "renew_message_lock_by_lock_token"),
        (raybus.ServiceBusClient, aio.ServiceBusClient, "resolve_entity"),
    ],
)
def test_the_sync_twin_takes_the_same_arguments(sync_cls: type, aio_cls: type, name: str) -> None:
    sync_params = inspect.signature(getattr(sync_cls, name)).parameters
    aio_params = inspect.signature(getattr(aio_cls, name)).parameters
    assert [(p.name, p.kind, p.default) for p in sync_params.values()] == [
        (p.name, p.kind, p.default) for p in aio_params.values()
    ]
