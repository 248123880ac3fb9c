"""The ``guarded`` wrapper of actor methods, without Ray: the access check runs first, and the
``_serving`` hook is awaited only while the actor is broken (a plain attribute check otherwise)."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from raybus import _failpoints
from raybus._actors.access import Guarded, guarded
from raybus._core.access import ANY, INTERNAL_PREFIX, Guard
from raybus.auth import AccessRights, AuthorizationRule
from raybus.exceptions import ServiceBusAuthenticationError, ServiceBusAuthorizationError
from raybus.testing import FakeClock


class Broken(Exception):
    pass


class Actor(Guarded):
    def __init__(self) -> None:
        self._namespace = "ns"
        self._guard = Guard(None, FakeClock())  # no rules: open
        self.hooks = 0
        self.ran = 0

    async def _serving(self) -> None:
        self.hooks += 1
        if self._broken is not None:
            raise self._broken

    @guarded(ANY)
    async def work(self, x: int) -> int:
        self.ran += 1
        return x * 2


def test_the_serving_hook_runs_only_while_the_actor_is_broken() -> None:
    actor = Actor()
    assert asyncio.run(actor.work(21)) == 42
    assert (actor.hooks, actor.ran) == (0, 1)  # healthy: the hook is not awaited at all
    actor._broken = Broken("damaged log")
    with pytest.raises(Broken):
        asyncio.run(actor.work(1))
    assert (actor.hooks, actor.ran) == (1, 1)  # broken: the hook refused, the method did not run
    actor._broken = None
    assert asyncio.run(actor.work(2)) == 4
    assert (actor.hooks, actor.ran) == (1, 2)


INTERNAL_TOKEN = INTERNAL_PREFIX + "test"
RULE = AuthorizationRule("root", frozenset({AccessRights.MANAGE}))


class Closed(Guarded):
    """An actor whose guard holds a rule (so only the internal token passes INTERNAL)."""

    def __init__(self, *, broken: bool = False) -> None:
        self._namespace = "ns"
        self._guard = Guard(INTERNAL_TOKEN, FakeClock())
        self._guard.load(1, (RULE,))
        self._broken = Broken("damaged log") if broken else None

    async def _serving(self) -> None:
        raise AssertionError("set_access and arm_failpoint must not wait for the actor to serve")


@pytest.mark.parametrize("auth", [None, "SharedAccessSignature sr=x&sig=y", INTERNAL_PREFIX])
def test_set_access_and_arm_failpoint_refuse_a_call_without_the_internal_token(
    auth: object,
) -> None:
    actor = Closed()
    with pytest.raises((ServiceBusAuthenticationError, ServiceBusAuthorizationError)):
        asyncio.run(actor.set_access(2, (), _auth=auth))
    assert actor._guard is not None and actor._guard.table.version == 1  # nothing changed
    with pytest.raises((ServiceBusAuthenticationError, ServiceBusAuthorizationError)):
        asyncio.run(actor.arm_failpoint("guarded.test", "raise", _auth=auth))
    _failpoints.hit("guarded.test")  # not armed: does not raise


@pytest.mark.parametrize("broken", [False, True])
def test_set_access_and_arm_failpoint_run_with_the_internal_token_even_while_broken(
    broken: bool,
) -> None:
    actor = Closed(broken=broken)
    asyncio.run(actor.set_access(2, (), _auth=INTERNAL_TOKEN))
    assert actor._guard is not None and actor._guard.open  # the pushed (empty) rules hold
    asyncio.run(actor.arm_failpoint("guarded.test", "raise", _auth=INTERNAL_TOKEN))
    with pytest.raises(_failpoints.FailPointError):
        _failpoints.hit("guarded.test")


def test_set_access_and_arm_failpoint_take_auth_as_every_guarded_method_does() -> None:
    """Ray reads the signature to accept the keyword: it must show ``_auth`` as ``work``'s."""
    for method in (Guarded.set_access, Guarded.arm_failpoint, Actor.work):
        param = inspect.signature(method).parameters["_auth"]
        assert (param.kind, param.default) == (inspect.Parameter.KEYWORD_ONLY, None)
        assert not hasattr(method, "__wrapped__")
