"""Authorization rules on the namespace actor: create, list, regenerate keys, delete — and
pushing every change to the actors that check tokens.

A change is logged (``("access", (version, rules))``) before it is answered, applied to the
namespace's own guard, then pushed to every partition, router and the coordinator. An actor the
push misses (restarting at that moment) fetches the rules on its first call after the restart,
so it cannot serve with an old copy for longer than the push takes. Rules of a deleted entity
are deleted with it, as in Service Bus.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import ray

from .._core.access import INTERNAL
from ..auth import AccessRights, AuthorizationRule
from ..exceptions import MessagingEntityNotFoundError
from .access import Guarded, guarded, internal
from .coordinator import coordinator_actor_name

if TYPE_CHECKING:
    from .._core.registry import Registry

__all__ = ["AccessOps"]

_log = logging.getLogger("raybus.namespace")
_MANAGE = AccessRights.MANAGE


class AccessOps(Guarded):
    """The authorization-rule methods of ``NamespaceActor``."""

    if TYPE_CHECKING:
        _registry: Registry
        _handles: dict[str, dict[int, Any]]
        _routers: dict[str, Any]

        async def _persist(self, change: tuple[str, Any]) -> None: ...

    def _in(self, handle: Any) -> Any:
        """``handle`` presenting the broker's own token."""
        return internal(handle, self._namespace)

    @guarded(INTERNAL)
    async def access_rules(self) -> tuple[int, tuple[AuthorizationRule, ...]]:
        """The current rules, for an actor that (re)started."""
        return self._registry.access.snapshot()

    def _entity_name(self, entity: str | None) -> str | None:
        if entity is None:
            return None
        return str(self._registry.get(entity).properties.name)  # raises if it does not exist

    @guarded(_MANAGE, lambda key_name, rights, entity=None, *_keys: entity)
    async def create_authorization_rule(
        self,
        key_name: str,
        rights: Iterable[AccessRights | str],
        entity: str | None = None,
        primary_key: str | None = None,
        secondary_key: str | None = None,
    ) -> AuthorizationRule:
        """Add (or replace) rule ``key_name`` on the namespace or on ``entity``."""
        table = self._registry.access
        rule = table.validate(
            key_name, rights, self._entity_name(entity), primary_key, secondary_key
        )
        await self._change(lambda: table.put(rule))
        return rule

    @guarded(_MANAGE, lambda entity=None: entity)
    async def list_authorization_rules(self, entity: str | None = None) -> list[AuthorizationRule]:
        scope = self._registry.access.scope_of(self._entity_name(entity))
        return [r for (s, _k), r in sorted(self._registry.access.rules.items()) if s == scope]

    @guarded(_MANAGE, lambda key_name, entity=None, *_rest: entity)
    async def regenerate_authorization_key(
        self,
        key_name: str,
        entity: str | None = None,
        which: str = "primary",
        key: str | None = None,
    ) -> AuthorizationRule:
        """Replace one of the rule's two keys (the other keeps working meanwhile)."""
        table = self._registry.access
        rule = table.regenerated(key_name, self._entity_name(entity), which, key)
        await self._change(lambda: table.put(rule))
        return rule

    @guarded(_MANAGE, lambda key_name, entity=None: entity)
    async def delete_authorization_rule(self, key_name: str, entity: str | None = None) -> None:
        table = self._registry.access
        name = self._entity_name(entity)
        table.get(key_name, name)
        await self._change(lambda: table.remove(key_name, name))

    async def _forget_rules(self, entity: str) -> None:
        """Drop a deleted entity's rules (and its subscriptions')."""
        table = self._registry.access
        await self._change(lambda: table.remove_entity(entity))

    async def _change(self, apply: Any) -> None:
        table = self._registry.access
        before = table.snapshot()
        apply()
        if table.version == before[0]:
            return
        try:
            await self._persist(("access", table.snapshot()))
        except BaseException:
            table.load(*before)
            raise
        assert self._guard is not None
        self._guard.load(*table.snapshot())
        await self._push()

    async def _push(self) -> None:
        version, rules = self._registry.access.snapshot()
        targets = [h for hs in self._handles.values() for h in hs.values()]
        targets += list(self._routers.values())
        try:
            targets.append(
                ray.get_actor(coordinator_actor_name(self._namespace), namespace="raybus")
            )
        except ValueError:
            pass  # no transaction yet: it fetches the rules when it starts
        results = await asyncio.gather(
            *(self._in(h).set_access.remote(version, rules) for h in targets),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(
                result, MessagingEntityNotFoundError
            ):
                _log.info("an actor missed the rule change (it fetches it on restart): %s", result)
