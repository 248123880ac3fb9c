"""The client's retry policy (``raybus._retry``): azure-servicebus's options and defaults, the
waits between retries, which errors are repeated, and typed errors for bad options."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from azure.core.pipeline.policies import RetryMode as AzureRetryMode

from raybus import RetryMode
from raybus._retry import SERVER_BUSY_BACKOFF_S, RetryPolicy, send_repeatable
from raybus._storage.errors import StorageUnavailableError
from raybus.exceptions import (
    InvalidArgumentError,
    MessageLockLostError,
    MessagingEntityDisabledError,
    OperationTimeoutError,
    ServiceBusConnectionError,
    ServiceBusServerBusyError,
)


def test_defaults_are_the_sdks() -> None:
    policy = RetryPolicy.from_options()
    assert policy == RetryPolicy(3, 0.8, 120.0, RetryMode.EXPONENTIAL)
    assert [policy.delay(n) for n in (1, 2, 3)] == [0.8, 1.6, 3.2]


def test_exponential_waits_double_up_to_the_maximum() -> None:
    policy = RetryPolicy.from_options(10, 0.5, 3)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert RetryPolicy.from_options(5000).delay(2000) == 120.0  # no float overflow


@pytest.mark.parametrize("mode", ["fixed", "FIXED", RetryMode.FIXED, AzureRetryMode.Fixed])
def test_fixed_waits_the_factor_each_time(mode: Any) -> None:
    policy = RetryPolicy.from_options(5, 0.25, 120, mode)
    assert policy.mode is RetryMode.FIXED
    assert [policy.delay(n) for n in range(1, 5)] == [0.25] * 4


def test_a_busy_server_is_given_the_sdks_fixed_back_off_within_the_maximum() -> None:
    busy = ServiceBusServerBusyError("busy", "q")
    assert RetryPolicy.from_options(3, 0.1).delay(1, busy) == SERVER_BUSY_BACKOFF_S == 4.0
    assert RetryPolicy.from_options(3, 0.1, 1.5).delay(2, busy) == 1.5


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("retry_total", -1),
        ("retry_total", 1.5),
        ("retry_total", True),
        ("retry_total", "3"),
        ("retry_total", None),
        ("retry_backoff_factor", -0.1),
        ("retry_backoff_factor", math.nan),
        ("retry_backoff_factor", "0.8"),
        ("retry_backoff_max", -1),
        ("retry_backoff_max", [1]),
        ("retry_mode", "linear"),
        ("retry_mode", 3),
        ("retry_mode", None),
    ],
)
def test_a_bad_option_is_a_typed_error_naming_it(option: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        RetryPolicy.from_options(**{option: value})
    assert err.value.argument == option
    assert option in str(err.value) and repr(value) in str(err.value)


def test_zero_retries_and_zero_waits_are_allowed() -> None:
    policy = RetryPolicy.from_options(0, 0, 0)
    assert policy.total == 0 and policy.delay(1) == 0.0


@pytest.mark.parametrize(
    ("error", "dedup_safe", "repeated"),
    [
        (StorageUnavailableError("disk full", "/x", 28, "q"), False, True),
        (ServiceBusServerBusyError("busy", "q"), False, True),
        (ServiceBusConnectionError("restarting", "q"), False, False),
        (ServiceBusConnectionError("restarting", "q"), True, True),
        (OperationTimeoutError("slow", "q"), True, False),
        (MessagingEntityDisabledError("disabled", "q"), True, False),
        (MessageLockLostError("lost", "q"), True, False),
        (ValueError("bad"), True, False),
    ],
)
def test_which_errors_a_send_repeats(error: Exception, dedup_safe: bool, repeated: bool) -> None:
    """Only what stored nothing, or what duplicate detection makes safe to repeat."""
    assert send_repeatable(dedup_safe)(error) is repeated


class _Flaky:
    """Fails ``failures`` times with ``error``, then answers "done"."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits ``RetryPolicy.run`` asks for (not waited)."""
    asked: list[float] = []

    async def sleep(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr("raybus._retry.asyncio.sleep", sleep)
    return asked


def test_run_repeats_until_it_succeeds_with_the_policys_waits(waits: list[float]) -> None:
    op = _Flaky(3, StorageUnavailableError("eio", None, 5, "q"))
    policy = RetryPolicy.from_options(3, 0.5)
    assert asyncio.run(policy.run(op, send_repeatable(False), "a send")) == "done"
    assert op.calls == 4 and waits == [0.5, 1.0, 2.0]


def test_run_raises_the_last_error_once_the_retries_are_spent(waits: list[float]) -> None:
    error = StorageUnavailableError("eio", None, 5, "q")
    op = _Flaky(5, error)
    with pytest.raises(StorageUnavailableError) as got:
        asyncio.run(RetryPolicy.from_options(2, 0.1).run(op, send_repeatable(False), "a send"))
    assert got.value is error and op.calls == 3 and waits == [0.1, 0.2]


def test_run_raises_an_error_it_may_not_repeat_at_once(waits: list[float]) -> None:
    op = _Flaky(1, ServiceBusConnectionError("broke", "q"))
    with pytest.raises(ServiceBusConnectionError):
        asyncio.run(RetryPolicy.from_options().run(op, send_repeatable(False), "a send"))
    assert op.calls == 1 and waits == []


def test_no_retries_means_one_try(waits: list[float]) -> None:
    op = _Flaky(1, ServiceBusServerBusyError("busy", "q"))
    with pytest.raises(ServiceBusServerBusyError):
        asyncio.run(RetryPolicy.from_options(0).run(op, send_repeatable(True), "a send"))
    assert op.calls == 1 and waits == []
