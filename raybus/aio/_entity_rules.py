"""A queue's or topic's ``authorization_rules`` (the SDK's field) in the administration client.

The namespace keeps an entity's shared-access rules in its access table, apart from the
entity's settings (which senders and receivers are given): the client reads them with one more
call and sets them with one (``set_entity_rules``: the whole set at once, logged as one change,
none when nothing changed). See ``QueueProperties.authorization_rules``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from .._core.access import AccessTable
from ..auth import AuthorizationRule, resource_path
from ..exceptions import InvalidArgumentError

__all__ = ["apply_rules", "given_rules", "with_all_rules", "with_rules"]

Call = Callable[..., Awaitable[Any]]  # the admin client's _call(entity, method, *args)
P = TypeVar("P")


def given_rules(value: Any, entity: str) -> list[AuthorizationRule] | None:
    """``authorization_rules`` as given to ``create_*`` or held by an update's properties:
    None (leave the rules), or a list of rules checked and completed as the namespace checks
    them (``AccessTable.validate_all``), so a bad one is refused before anything is
    created."""
    if value is None:
        return None
    if isinstance(value, str | bytes | dict) or not isinstance(value, Iterable):
        raise InvalidArgumentError(
            f"authorization_rules must be a list of AuthorizationRule, not {type(value).__name__}",
            entity,
            "authorization_rules",
        )
    return AccessTable().validate_all(value, entity)


async def apply_rules(
    call: Call, props: P, rules: list[AuthorizationRule] | None, *, created: bool
) -> P:
    """``props`` (as the namespace answered them) with the entity's rules, after making them
    ``rules`` (None: as they are; a new entity has none)."""
    name: str = props.name  # type: ignore[attr-defined]
    if rules is not None:
        stored = await call(name, "set_entity_rules", name, rules)
    elif created:
        stored = []
    else:
        stored = await call(name, "list_authorization_rules", name)
    return dataclasses.replace(props, authorization_rules=stored)  # type: ignore[type-var]


async def with_rules(call: Call, props: P) -> P:
    """``props`` with the entity's current rules."""
    return await apply_rules(call, props, None, created=False)


async def with_all_rules(call: Call, listed: list[P]) -> list[P]:
    """A listing's properties, each with its entity's rules (one call for all)."""
    by_entity: dict[str, list[AuthorizationRule]] = {}
    for rule in await call(None, "list_entity_rules"):
        by_entity.setdefault(resource_path(rule.entity), []).append(rule)
    return [
        dataclasses.replace(  # type: ignore[type-var]
            p,
            authorization_rules=by_entity.get(resource_path(p.name), []),  # type: ignore[attr-defined]
        )
        for p in listed
    ]
