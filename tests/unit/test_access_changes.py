"""The namespace's authorization-rule changes (``AccessOps._change``) without Ray: one at a
time, so a change whose log write fails rolls back only itself."""

from __future__ import annotations

import asyncio
from typing import Any

from raybus._actors.access_admin import AccessOps
from raybus._core.access import AccessTable, Guard
from raybus.auth import AccessRights, AuthorizationRule
from raybus.exceptions import InvalidArgumentError, MessagingEntityNotFoundError
from raybus.testing import FakeClock


class _Registry:
    def __init__(self) -> None:
        self.access = AccessTable()
        self.entities = {"q": _Entry("q")}
        self.clock = FakeClock()

    def get(self, name: str) -> Any:
        try:
            return self.entities[name.lower()]
        except KeyError:
            raise MessagingEntityNotFoundError(f"no entity {name!r}", name) from None

    def now(self) -> float:
        return self.clock.now()


class _Entry:
    def __init__(self, name: str) -> None:
        self.properties = type("Props", (), {"name": name})()


class _Namespace(AccessOps):
    """Just what ``_change`` uses: the registry's table, a log that can fail, the guard."""

    def __init__(self) -> None:
        self._registry = _Registry()  # type: ignore[assignment]
        self._guard = Guard("internal-token", FakeClock())
        self.logged: list[Any] = []
        self.fail_next: asyncio.Event | None = None  # the next write waits for it, then fails
        self.hold_next: asyncio.Event | None = None  # the next write waits for it

    async def _persist(self, change: tuple[str, Any]) -> None:
        gate, self.fail_next = self.fail_next, None
        if gate is not None:
            await gate.wait()
            raise OSError(5, "Input/output error (injected)")
        hold, self.hold_next = self.hold_next, None
        if hold is not None:
            await hold.wait()
        self.logged.append(change)

    def _durable_guard(self) -> Guard:
        return self._guard

    async def _push(self) -> None:
        pass


def _put(ns: _Namespace, name: str) -> Any:
    table = ns._registry.access
    rule = table.validate(name, [AccessRights.SEND], None, None, None)
    return lambda: table.put(rule)


def test_a_failed_change_does_not_roll_back_a_concurrent_one() -> None:
    async def main() -> tuple[Any, _Namespace]:
        ns = _Namespace()
        gate = ns.fail_next = asyncio.Event()
        doomed = asyncio.ensure_future(ns._change(_put(ns, "doomed")))
        await asyncio.sleep(0)  # "doomed" is being logged
        kept = asyncio.ensure_future(ns._change(_put(ns, "kept")))
        await asyncio.sleep(0.01)
        gate.set()  # the write of "doomed" fails
        results = await asyncio.gather(doomed, kept, return_exceptions=True)
        return results, ns

    (doomed, kept), ns = asyncio.run(main())
    assert isinstance(doomed, OSError) and kept is None
    names = {key for _scope, key in ns._registry.access.rules}
    assert names == {"kept"}  # in memory: the logged change, and only it
    [(_kind, (_version, logged))] = ns.logged
    assert {r.key_name for r in logged} == {"kept"}
    assert {r.key_name for r in ns._guard.table.snapshot()[1]} == {"kept"}


def test_a_change_that_raises_changes_nothing_and_frees_the_next() -> None:
    async def main() -> _Namespace:
        ns = _Namespace()

        def bad() -> None:
            raise ValueError("bad input")

        try:
            await ns._change(bad)
        except ValueError:
            pass
        await ns._change(_put(ns, "after"))
        return ns

    ns = asyncio.run(main())
    assert {key for _scope, key in ns._registry.access.rules} == {"after"}


def _set(ns: _Namespace, entity: str, rules: list[AuthorizationRule]) -> Any:
    """``set_entity_rules`` as the actor runs it (with the broker's own token: the first
    rule closes the namespace)."""
    return ns.set_entity_rules(entity, rules, _auth="internal-token")


def test_an_entitys_rules_are_replaced_as_one_logged_change_and_unchanged_ones_kept() -> None:
    async def main() -> None:
        ns = _Namespace()
        reader = AuthorizationRule("reader", frozenset({AccessRights.LISTEN}), "R" * 44, "S" * 44)
        first = await _set(ns, "q", [reader, AuthorizationRule("writer", [AccessRights.SEND])])
        assert len(ns.logged) == 1 and {r.key_name for r in first} == {"reader", "writer"}
        stamped = {r.key_name: r for r in first}["reader"]
        assert stamped.entity == "q" and stamped.created_at_utc == stamped.modified_at_utc
        ns._registry.clock.advance(60)
        again = await _set(ns, "q", [reader])  # writer dropped, reader as it was
        assert len(ns.logged) == 2 and again == [stamped]  # kept, times included
        assert await _set(ns, "q", [reader]) == [stamped] and len(ns.logged) == 2  # no change
        changed = AuthorizationRule("reader", [AccessRights.LISTEN, AccessRights.SEND], "R" * 44)
        (renewed,) = await _set(ns, "q", [changed])
        assert renewed.created_at_utc == stamped.created_at_utc
        assert renewed.modified_at_utc > stamped.modified_at_utc
        for bad in ([reader, reader], [AuthorizationRule("bad name!", ["Send"])]):
            try:
                await _set(ns, "q", bad)
            except InvalidArgumentError:
                pass
            else:
                raise AssertionError(f"{bad} was taken")
        assert len(ns.logged) == 3  # the refused sets changed nothing

    asyncio.run(main())


def test_rules_set_while_their_entity_is_deleted_are_not_left_behind() -> None:
    """A change waiting behind another finds its entity gone: nothing is stored (a new queue
    of that name must not inherit the old one's keys)."""

    async def main() -> None:
        ns = _Namespace()
        hold = ns.hold_next = asyncio.Event()
        first = asyncio.ensure_future(ns._change(_put(ns, "root")))
        await asyncio.sleep(0)  # "root" is being logged, holding the turn
        waiting = asyncio.ensure_future(_set(ns, "q", [AuthorizationRule("r", ["Send"])]))
        created = asyncio.ensure_future(
            ns.create_authorization_rule("c", ["Send"], "q", _auth="internal-token")
        )
        await asyncio.sleep(0.01)
        del ns._registry.entities["q"]  # deleted meanwhile
        hold.set()
        await first
        for change in (waiting, created):
            try:
                await change
            except MessagingEntityNotFoundError:
                pass
            else:
                raise AssertionError("rules were stored for a deleted entity")
        assert {key for _scope, key in ns._registry.access.rules} == {"root"}

    asyncio.run(main())


def test_an_entitys_rules_as_given_are_checked_and_completed_before_anything_changes() -> None:
    """``authorization_rules`` as a caller gives them (raybus's rules, the SDK's objects with
    keys left None, or something else) are checked and completed client-side, in one place:
    ``AccessTable.validate_all``."""
    from raybus.aio._entity_rules import given_rules

    class SdkRule:  # the SDK's AuthorizationRule: attributes, keys None unless given
        def __init__(self, key_name: str, rights: list[str]) -> None:
            self.key_name, self.rights = key_name, rights
            self.primary_key = self.secondary_key = None

    (rule,) = given_rules([SdkRule("reader", ["Listen"])], "q")  # type: ignore[misc]
    assert rule.rights == frozenset({AccessRights.LISTEN}) and rule.entity == "q"
    assert len(rule.primary_key) == len(rule.secondary_key) == 44  # generated
    assert given_rules(None, "q") is None
    for bad in ([{"key_name": "x"}], [object()], "reader", 3, [SdkRule("x", [])]):
        try:
            given_rules(bad, "q")
        except InvalidArgumentError as exc:
            assert exc.argument in ("authorization_rules", "rights"), exc.argument
        else:
            raise AssertionError(f"{bad!r} was taken")
