"""The access check every actor runs at the top of every method (Ray-free, injected clock).

``Guard.check(auth, right, path)`` passes or raises ``ServiceBusAuthenticationError`` (no token,
malformed, expired, unknown key, bad signature) or ``ServiceBusAuthorizationError`` (valid token,
but its rule lacks ``right`` or its resource does not cover ``path``). See ``raybus.auth`` for the
token format and the model.

* An **open** guard (the namespace has no rules) passes everything: a laptop's first run needs no
  keys.
* ``INTERNAL`` methods (partition hand-over, two-phase-commit votes, configuration pushes) pass
  only the broker's own token, which its actors read from Ray's internal key-value store
  (``raybus._actors.access``); with rules in place a job calling those handles directly is
  refused.
* Verified tokens are cached (HMAC once per token, then a dictionary lookup per call); the cache
  empties whenever the rules change, so a deleted rule or a regenerated key stops working at
  once on every actor that received the change. It holds at most ``cache_size`` tokens: past
  that the oldest entry goes, so a caller cycling through many tokens costs HMACs, not memory,
  and the answers stay the same (an evicted token is simply verified again).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from .._clock import Clock
from ..auth import (
    AccessRights,
    AuthorizationRule,
    covers,
    generate_key,
    normalise_rights,
    parse_sas_token,
    resource_path,
)
from ..exceptions import (
    InvalidArgumentError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
)

__all__ = ["ANY", "INTERNAL", "INTERNAL_PREFIX", "AccessTable", "Guard", "Need"]

INTERNAL_PREFIX = "RaybusInternal "
_CACHE_MAX = 10_000


class Need:
    """What a method requires besides a right: any right at all, or the broker itself."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ANY = Need("any right")
INTERNAL = Need("the broker's own token")
Requirement = AccessRights | Need

_KEY_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")


@dataclass(frozen=True)
class _Grant:
    expiry: int
    scope: str
    rights: frozenset[AccessRights]


class AccessTable:
    """The namespace's rules: ``(scope, key name) -> AuthorizationRule``, versioned.

    ``scope`` is ``/`` for namespace rules and the entity's path otherwise. Only the namespace
    actor changes it (and logs each change); every other actor holds a copy pushed to it.
    """

    def __init__(self) -> None:
        self.rules: dict[tuple[str, str], AuthorizationRule] = {}
        self.version = 0

    @staticmethod
    def scope_of(entity: str | None) -> str:
        return "/" if entity is None else resource_path(entity)

    def snapshot(self) -> tuple[int, tuple[AuthorizationRule, ...]]:
        return self.version, tuple(self.rules.values())

    def load(self, version: int, rules: Iterable[AuthorizationRule]) -> None:
        self.rules = {(self.scope_of(r.entity), r.key_name): r for r in rules}
        self.version = version

    def get(self, key_name: str, entity: str | None) -> AuthorizationRule:
        rule = self.rules.get((self.scope_of(entity), key_name))
        if rule is None:
            where = f"entity {entity!r}" if entity else "the namespace"
            raise MessagingEntityNotFoundError(
                f"no authorization rule {key_name!r} on {where}", entity
            )
        return rule

    def validate(
        self,
        key_name: str,
        rights: Iterable[AccessRights | str],
        entity: str | None,
        primary_key: str | None,
        secondary_key: str | None,
    ) -> AuthorizationRule:
        """A new rule from user input, or ``InvalidArgumentError`` naming the bad field."""
        if (
            not isinstance(key_name, str)
            or not 1 <= len(key_name) <= 256
            or not set(key_name) <= _KEY_NAME_CHARS
        ):
            raise InvalidArgumentError(
                f"key_name {key_name!r} must be 1-256 letters, digits, '-', '.' or '_'",
                entity,
                "key_name",
            )
        for field, key in (("primary_key", primary_key), ("secondary_key", secondary_key)):
            if key is not None and (not isinstance(key, str) or not 16 <= len(key) <= 256):
                raise InvalidArgumentError(
                    f"{field} must be a string of 16-256 characters", entity, field
                )
        return AuthorizationRule(
            key_name,
            normalise_rights(rights),
            primary_key or generate_key(),
            secondary_key or generate_key(),
            entity,
        )

    def validate_all(self, rules: Iterable[Any], entity: str | None) -> list[AuthorizationRule]:
        """An entity's whole set of rules from user input: raybus's ``AuthorizationRule``s or
        anything with ``key_name`` and ``rights`` (the SDK's; keys left None are generated),
        each checked as ``validate`` checks it, no name given twice."""
        fresh = []
        for r in rules:
            if not (hasattr(r, "key_name") and hasattr(r, "rights")):
                raise InvalidArgumentError(
                    f"authorization_rules holds a {type(r).__name__}, not an AuthorizationRule",
                    entity,
                    "authorization_rules",
                )
            keys = (getattr(r, "primary_key", None), getattr(r, "secondary_key", None))
            fresh.append(self.validate(r.key_name, r.rights or (), entity, *keys))
        names = [r.key_name for r in fresh]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidArgumentError(
                f"authorization rule name(s) given twice: {', '.join(twice)}",
                entity,
                "authorization_rules",
            )
        return fresh

    def put(self, rule: AuthorizationRule) -> None:
        self.rules[(self.scope_of(rule.entity), rule.key_name)] = rule
        self.version += 1

    def remove(self, key_name: str, entity: str | None) -> None:
        self.get(key_name, entity)
        del self.rules[(self.scope_of(entity), key_name)]
        self.version += 1

    def remove_entity(self, entity: str) -> bool:
        """Drop the rules of a deleted entity (and of its subscriptions)."""
        scope = self.scope_of(entity)
        doomed = [k for k in self.rules if k[0] != "/" and covers(scope, k[0])]
        for k in doomed:
            del self.rules[k]
        if doomed:
            self.version += 1
        return bool(doomed)

    def regenerated(
        self, key_name: str, entity: str | None, which: str, key: str | None
    ) -> AuthorizationRule:
        """The rule with its ``which`` key replaced by ``key`` (or a new random one); the table is
        not changed (the caller ``put``s the result). Bad input raises ``InvalidArgumentError``
        naming the field — ``which`` first, so a typo is reported as such."""
        if which not in ("primary", "secondary"):
            raise InvalidArgumentError(
                f"which must be 'primary' or 'secondary', not {which!r}", entity, "which"
            )
        rule = self.get(key_name, entity)
        new = key if key is not None else generate_key()
        self.validate(key_name, rule.rights, entity, new, None)
        if which == "primary":
            return replace(rule, primary_key=new)
        return replace(rule, secondary_key=new)


class Guard:
    """Checks tokens against a copy of the rules (see the module docstring)."""

    def __init__(
        self, internal_token: str | None, clock: Clock, *, cache_size: int = _CACHE_MAX
    ) -> None:
        if cache_size < 1:
            raise InvalidArgumentError(
                f"cache_size must be at least 1, got {cache_size}", None, "cache_size"
            )
        self._internal = internal_token
        self._clock = clock
        self._cache_size = cache_size
        self.table = AccessTable()
        self._grants: dict[str, _Grant] = {}  # insertion-ordered: the first is the oldest

    @property
    def cached_tokens(self) -> int:
        """How many verified tokens the cache holds (at most ``cache_size``)."""
        return len(self._grants)

    @property
    def open(self) -> bool:
        return not self.table.rules

    def load(self, version: int, rules: Iterable[AuthorizationRule]) -> bool:
        """Take a pushed or fetched copy; older versions than ours are ignored."""
        if version < self.table.version:
            return False
        self.table.load(version, rules)
        self._grants.clear()
        return True

    def is_internal(self, auth: object) -> bool:
        return (
            self._internal is not None
            and isinstance(auth, str)
            and hmac.compare_digest(auth, self._internal)
        )

    def check(self, auth: object, need: Requirement, path: str) -> None:
        if self.open or self.is_internal(auth):
            return
        if need is INTERNAL:
            raise ServiceBusAuthorizationError(
                "this operation is internal to the broker", path or None
            )
        if not isinstance(auth, str) or not auth:
            raise ServiceBusAuthenticationError(
                "this namespace requires a SAS token: connect with credential=", path or None
            )
        grant = self._grants.get(auth)
        now = self._clock.now()
        if grant is None:
            grant = self._verify(auth, path)
            if len(self._grants) >= self._cache_size:
                # Evict the oldest rather than everything: the tokens in steady use stay cached
                # while a burst of new ones passes through.
                del self._grants[next(iter(self._grants))]
            self._grants[auth] = grant
        if grant.expiry <= now:
            raise ServiceBusAuthenticationError("the SAS token has expired", path or None)
        target = resource_path(path)
        if not covers(grant.scope, target):
            raise ServiceBusAuthorizationError(
                f"the token is for {grant.scope!r}, not {target!r}", path or None
            )
        if need is not ANY and need not in grant.rights:
            assert isinstance(need, AccessRights)
            raise ServiceBusAuthorizationError(
                f"the token's rule grants {', '.join(sorted(r.value for r in grant.rights))}, "
                f"not {need.value}",
                path or None,
            )

    def _verify(self, auth: str, path: str) -> _Grant:
        token = parse_sas_token(auth)
        scope = token.path
        # The rule may sit on the namespace or on any entity above the token's resource.
        for rule_scope, key_name in self.table.rules:
            if key_name != token.key_name or not covers(rule_scope, scope):
                continue
            rule = self.table.rules[(rule_scope, key_name)]
            if any(token.signed_by(k) for k in (rule.primary_key, rule.secondary_key)):
                return _Grant(token.expiry, scope, rule.rights)
        raise ServiceBusAuthenticationError(
            f"the SAS token is not signed by a current key of rule {token.key_name!r} "
            f"covering {scope!r}",
            path or None,
        )
