"""Ray's errors become raybus's: the mapping callers rely on to decide whether to retry."""

from __future__ import annotations

import asyncio
import pickle

import pytest
from ray import exceptions as rex

from raybus._rpc import actor_gone, translate
from raybus.exceptions import (
    MessageLockLostError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusConnectionError,
    ServiceBusError,
)

UNAVAILABLE = rex.ActorUnavailableError("restarting", b"\0" * 16)


def test_broker_refusal_is_re_raised_unchanged() -> None:
    refusal = MessageLockLostError("lock lost", "q", "token", 7)
    assert translate(rex.RayTaskError("settle", "tb", refusal), "q") is refusal


def test_bad_argument_from_the_broker_stays_a_value_error() -> None:
    err = ValueError("bad")
    assert translate(rex.RayTaskError("send", "tb", err), "q") is err


def test_actor_gone_for_good_means_the_entity_was_deleted() -> None:
    out = translate(rex.ActorDiedError(), "q")
    assert isinstance(out, MessagingEntityNotFoundError) and out.entity == "q"
    assert out.retryable is False


def test_restarting_actor_is_a_retryable_connection_error() -> None:
    out = translate(UNAVAILABLE, "q")
    assert isinstance(out, ServiceBusConnectionError) and out.retryable


@pytest.mark.parametrize(
    ("inner", "expected"),
    [
        (UNAVAILABLE, ServiceBusConnectionError),
        (rex.ActorDiedError(), MessagingEntityNotFoundError),
    ],
)
def test_an_actor_seen_restarting_by_another_actor_means_the_same(
    inner: rex.RayError, expected: type[ServiceBusError]
) -> None:
    # The registry asked a partition for counts while it restarted.
    assert isinstance(translate(rex.RayTaskError("counts", "tb", inner), "q"), expected)


@pytest.mark.parametrize("timeout", [rex.GetTimeoutError("slow"), asyncio.TimeoutError()])
def test_timeouts_are_operation_timeouts_with_unknown_outcome(timeout: Exception) -> None:
    out = translate(timeout, "q")
    assert isinstance(out, OperationTimeoutError) and out.retryable


def test_unexpected_broker_crash_is_an_internal_service_bus_error() -> None:
    out = translate(rex.RayTaskError("send", "tb", KeyError("boom")), "q")
    assert type(out) is ServiceBusError and "boom" in str(out)


def test_an_actor_gone_is_told_from_an_actors_own_not_found_by_type_even_pickled() -> None:
    gone = translate(rex.ActorDiedError(), "q")
    assert actor_gone(gone)
    again = pickle.loads(pickle.dumps(gone))
    assert actor_gone(again) and again.entity == "q" and str(again) == str(gone)
    # The namespace's own answer for a route it does not have, whatever its words.
    own = MessagingEntityNotFoundError("the entity was deleted (its actor is gone)", "q")
    assert not actor_gone(own)
    assert not actor_gone(translate(rex.RayTaskError("route", "tb", own), "q"))
    # An actor that saw its callee die passes the same meaning on.
    assert actor_gone(translate(rex.RayTaskError("route", "tb", gone), "q"))
