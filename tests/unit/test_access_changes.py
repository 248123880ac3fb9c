"""The namespace's authorization-rule changes (``AccessOps._change``) without Ray: one at a
time, so a change whose log write fails rolls back only itself."""

from __future__ import annotations

import asyncio
from typing import Any

from raybus._actors.access_admin import AccessOps
from raybus._core.access import AccessTable, Guard
from raybus.auth import AccessRights
from raybus.testing import FakeClock


class _Registry:
    def __init__(self) -> None:
        self.access = AccessTable()


class _Namespace(AccessOps):
    """Just what ``_change`` uses: the registry's table, a log that can fail, the guard."""

    def __init__(self) -> None:
        self._registry = _Registry()  # type: ignore[assignment]
        self._guard = Guard("internal-token", FakeClock())
        self.logged: list[Any] = []
        self.fail_next: asyncio.Event | None = None  # the next write waits for it, then fails

    async def _persist(self, change: tuple[str, Any]) -> None:
        gate, self.fail_next = self.fail_next, None
        if gate is not None:
            await gate.wait()
            raise OSError(5, "Input/output error (injected)")
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
