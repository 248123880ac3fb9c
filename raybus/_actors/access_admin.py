"""Authorization rules on the namespace actor: create, list, regenerate keys, delete — and
pushing every change to the actors that check tokens.

A change is logged (``("access", (version, rules))``) before it is answered, applied to the
namespace's own guard, then pushed to every partition, router and the coordinator. An actor the
push misses still ends up with the current rules:

* one that restarts fetches them on its first call, before serving anything;
* one that stays up but whose push failed (a transient error, a push that raised) is pushed the
  *current* rules again in the background, with back-off, until it takes them or is gone (dead,
  or its entity deleted) — so it cannot serve with an old copy for longer than the fault lasts;
* pushes lost with the namespace itself (it died between logging a change and pushing it) are
  redone by the restarted namespace, which pushes its rules once on start-up.

Pushing is idempotent (``set_access`` ignores a version older than the one it holds). Rules of a
deleted entity are deleted with it, as in Service Bus. As there, rules belong to the namespace,
a queue or a topic; a subscription has none of its own (its topic's cover it).

Changes are made one at a time (read, change, log, answer): a change whose log write fails is
rolled back in memory, and a concurrent change made meanwhile must not be rolled back with it.
A change to an entity's rules checks again, in its turn, that the entity exists: one that
waited behind the entity's deletion (which drops its rules) must not leave rules behind for a
new entity of the same name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import ray

from .._clock import from_timestamp
from .._core.access import INTERNAL, Guard
from .._topic_models import is_subscription
from ..auth import AccessRights, AuthorizationRule
from ..exceptions import InvalidArgumentError, MessagingEntityNotFoundError
from .access import Guarded, guarded, internal, named_actor
from .coordinator import coordinator_actor_name

if TYPE_CHECKING:
    from .._core.registry import Registry

__all__ = ["AccessOps"]

_log = logging.getLogger("raybus.namespace")
_MANAGE = AccessRights.MANAGE
_REPUSH_FIRST_S = 0.2
_REPUSH_MAX_S = 5.0
T = TypeVar("T")


class AccessOps(Guarded):
    """The authorization-rule methods of ``NamespaceActor``."""

    if TYPE_CHECKING:
        _registry: Registry
        _handles: dict[str, dict[int, Any]]
        _routers: dict[str, Any]

        async def _persist(self, change: tuple[str, Any]) -> None: ...

    _coordinator: Any = None  # its handle once found (it restarts under the same handle)
    _repush_task: asyncio.Task[None] | None = None
    _repush_ids: frozenset[Any] = frozenset()  # actor ids of targets a push missed (_repush)
    _start_push: asyncio.Task[None] | None = None  # the push of _push_after_restart
    _rules_lock: asyncio.Lock | None = None  # one rule change at a time (see the docstring)

    def _in(self, handle: Any) -> Any:
        """``handle`` presenting the broker's own token."""
        return internal(handle, self._namespace)

    @guarded(INTERNAL)
    async def access_rules(self) -> tuple[int, tuple[AuthorizationRule, ...]]:
        """The current rules, for an actor that (re)started."""
        return self._durable_guard().table.snapshot()

    def _entity_name(self, entity: str | None) -> str | None:
        if entity is None:
            return None
        return str(self._registry.get(entity).properties.name)  # raises if it does not exist

    def _rule_scope(self, entity: str | None) -> str | None:
        """The entity a new rule may belong to: the namespace, a queue or a topic.

        Service Bus has no rules on a subscription (a topic's rule covers its subscriptions),
        and the clients sign a subscription's calls for its topic, where such a rule would not
        reach. Refused before anything is stored."""
        name = self._entity_name(entity)
        if name is not None and is_subscription(name):
            raise InvalidArgumentError(
                f"entity {entity!r} is a subscription: authorization rules belong to the "
                "namespace, a queue or a topic (a topic's rules cover its subscriptions)",
                entity,
                "entity",
            )
        return name

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
        name = self._rule_scope(entity)
        fresh = table.validate(key_name, rights, name, primary_key, secondary_key)

        def put() -> AuthorizationRule:  # a replaced rule keeps its creation time
            self._entity_name(entity)  # not deleted while this change waited its turn
            rule = self._rule_stamped(fresh, table.rules.get((table.scope_of(name), key_name)))
            table.put(rule)
            return rule

        return await self._change(put)

    def _rule_stamped(
        self, rule: AuthorizationRule, replaces: AuthorizationRule | None
    ) -> AuthorizationRule:
        """``rule`` with the SDK's times: created now (or when the rule it replaces was),
        modified now."""
        now = from_timestamp(self._registry.now())
        created = replaces.created_at_utc if replaces is not None else None
        return dataclasses.replace(rule, created_at_utc=created or now, modified_at_utc=now)

    @guarded(_MANAGE, lambda entity, rules: entity)
    async def set_entity_rules(
        self, entity: str, rules: list[AuthorizationRule]
    ) -> list[AuthorizationRule]:
        """Make the rules of queue or topic ``entity`` exactly ``rules``: its description's
        ``authorization_rules``, which Service Bus replaces with the description. One change,
        logged once, and none at all when they are the rules it has (a rule whose name,
        rights and keys are the same is kept as it is, times included). Every rule is
        checked before anything changes."""
        table = self._registry.access
        name = self._rule_scope(entity)
        if name is None:
            raise InvalidArgumentError("set_entity_rules needs an entity", None, "entity")
        fresh = table.validate_all(rules, name)

        def replace_all() -> list[AuthorizationRule]:
            self._entity_name(entity)  # not deleted while this change waited its turn
            scope = table.scope_of(name)
            old = {k: r for (s, k), r in table.rules.items() if s == scope}
            for key_name in old.keys() - {r.key_name for r in fresh}:
                table.remove(key_name, name)
            out = []
            for rule in fresh:
                prev = old.get(rule.key_name)
                if prev is not None and (prev.rights, prev.keys()) == (rule.rights, rule.keys()):
                    out.append(prev)
                    continue
                rule = self._rule_stamped(rule, prev)
                table.put(rule)
                out.append(rule)
            return out

        return await self._change(replace_all)

    @guarded(_MANAGE, lambda entity=None: entity)
    async def list_authorization_rules(self, entity: str | None = None) -> list[AuthorizationRule]:
        scope = self._registry.access.scope_of(self._entity_name(entity))
        return [r for (s, _k), r in sorted(self._registry.access.rules.items()) if s == scope]

    @guarded(_MANAGE, lambda: None)
    async def list_entity_rules(self) -> list[AuthorizationRule]:
        """Every queue's and topic's rules (``rule.entity`` names the entity): what the
        listings of queues and topics show as their ``authorization_rules``."""
        rules = sorted(self._registry.access.rules.items())
        return [r for (s, _k), r in rules if s != "/"]

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
        name = self._entity_name(entity)

        def regenerate() -> AuthorizationRule:  # from the rule as it is when its turn comes
            rule = table.regenerated(key_name, name, which, key)
            now = from_timestamp(self._registry.now())
            rule = dataclasses.replace(rule, modified_at_utc=now)
            table.put(rule)
            return rule

        return await self._change(regenerate)

    @guarded(_MANAGE, lambda key_name, entity=None: entity)
    async def delete_authorization_rule(self, key_name: str, entity: str | None = None) -> None:
        table = self._registry.access
        name = self._entity_name(entity)

        def remove() -> None:
            table.get(key_name, name)  # raises if there is no such rule
            table.remove(key_name, name)

        await self._change(remove)

    async def _forget_rules(self, entity: str) -> None:
        """Drop a deleted entity's rules (and its subscriptions')."""
        table = self._registry.access
        await self._change(lambda: table.remove_entity(entity))

    async def _change(self, apply: Callable[[], T]) -> T:
        """Apply one rule change, log it and push it; ``apply``'s result. One change at a time:
        a failed log write rolls back this change only (see the module docstring)."""
        if self._rules_lock is None:
            self._rules_lock = asyncio.Lock()
        async with self._rules_lock:
            table = self._registry.access
            before = table.snapshot()
            result = apply()  # may raise: it changes nothing then
            if table.version == before[0]:
                return result
            after = table.snapshot()
            try:
                await self._persist(("access", after))
            except BaseException:
                table.load(*before)
                raise
            self._durable_guard().load(*after)
        await self._push()
        return result

    def _durable_guard(self) -> Guard:
        """The namespace's own guard: it holds the rules as of the last *logged* change (the
        table may hold one still being logged), so it is what actors are given."""
        assert self._guard is not None  # set in NamespaceActor.__init__
        return self._guard

    async def _push_targets(self) -> list[Any]:
        """Every actor holding a copy of the rules: partitions, routers, the coordinator."""
        targets = [h for hs in self._handles.values() for h in hs.values()]
        targets += list(self._routers.values())
        if self._coordinator is None:
            # Not found means no transaction ran yet: the coordinator fetches the rules when it
            # starts, and the next push finds it.
            try:
                self._coordinator = await named_actor(coordinator_actor_name(self._namespace))
            except ValueError:
                pass
        if self._coordinator is not None:
            targets.append(self._coordinator)
        return targets

    async def _push(self) -> None:
        """Push the current rules to every target; retry the ones it missed (see the module
        docstring)."""
        missed = await self._push_to(await self._push_targets())
        if missed:
            self._repush_ids = self._repush_ids | {h._actor_id for h in missed}
            if self._repush_task is None or self._repush_task.done():
                self._repush_task = asyncio.get_running_loop().create_task(self._repush())

    async def _push_to(self, targets: list[Any]) -> list[Any]:
        """Push the current rules to ``targets``; the ones that must be pushed again."""
        version, rules = self._durable_guard().table.snapshot()
        results = await asyncio.gather(
            *(self._in(h).set_access.remote(version, rules) for h in targets),
            return_exceptions=True,
        )
        missed = []
        for handle, result in zip(targets, results, strict=True):
            if not isinstance(result, BaseException):
                continue
            cause = getattr(result, "cause", result)  # a RayTaskError carries the actor's error
            if isinstance(cause, MessagingEntityNotFoundError) or isinstance(
                result, ray.exceptions.ActorDiedError
            ):
                # Its entity is gone, or it died during the push: ours restart forever, and a
                # restarted actor fetches the rules before serving (or it is gone for good).
                continue
            _log.info("an actor missed rule change %s (pushing it again): %r", version, result)
            missed.append(handle)
        return missed

    async def _repush(self) -> None:
        """Push the current rules again to the actors a push missed, with back-off, until each
        took them or is no longer one of ours."""
        delay = _REPUSH_FIRST_S
        while self._repush_ids:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _REPUSH_MAX_S)
            current = {h._actor_id: h for h in await self._push_targets()}
            wanted = [current[i] for i in self._repush_ids if i in current]  # others: deleted
            missed = {h._actor_id for h in await self._push_to(wanted)}
            # Targets a newer push missed meanwhile were added to the set: keep those too.
            done = {h._actor_id for h in wanted} - missed
            self._repush_ids = frozenset(i for i in self._repush_ids if i in current) - done

    def _push_after_restart(self) -> None:
        """Push the rules once per incarnation, if there are any: a push the previous
        incarnation logged but did not finish is not lost (see the module docstring)."""
        if self._start_push is None and self._registry.access.version > 0:
            self._start_push = asyncio.get_running_loop().create_task(self._push())
