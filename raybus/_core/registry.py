"""The namespace registry: which entities exist, their settings and their partition maps.

Plain Python; ``raybus._actors.namespace`` owns one per namespace. Names are case-insensitive
(stored under their lower-case form, reported as created). Each creation gets a new
``incarnation`` number, so actors of a deleted queue can never be mistaken for those of a new
queue with the same name.
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._clock import Clock
from .._models import IMMUTABLE_QUEUE_FIELDS, QueueProperties
from ..exceptions import (
    InvalidArgumentError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityNotFoundError,
)
from .access import AccessTable
from .slots import PartitionMap

__all__ = [
    "EntityEntry",
    "Registry",
    "entity_storage_dirs",
    "partition_actor_name",
    "partition_storage_dirs",
]


def _folder(entity: str) -> str:
    """A file-system-safe folder name for an entity: names may hold '/' and be 260 characters
    long, more than a path component may; a readable prefix plus a digest is unique."""
    key = entity.lower()
    readable = re.sub(r"[^a-z0-9._-]", "_", key)[:48]
    return f"{readable}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def partition_storage_dirs(
    namespace: str, entity: str, incarnation: int, partition: int
) -> tuple[str, ...]:
    """Where a partition keeps its log, below the namespace's ``storage_path``."""
    return (*entity_storage_dirs(namespace, entity, incarnation), str(partition))


def entity_storage_dirs(namespace: str, entity: str, incarnation: int) -> tuple[str, ...]:
    """The folder of all partitions of one entity incarnation (deleted with the entity)."""
    return (namespace, "queues", _folder(entity), str(incarnation))


def router_log_name(topic: str, incarnation: int) -> str:
    """The router's publish log, below the namespace's folder: in the topic incarnation's
    folder (``entity_storage_dirs``), so it goes with the topic."""
    return f"queues/{_folder(topic)}/{incarnation}/router"


def topic_schedule_log_name(topic: str, incarnation: int) -> str:
    """The log of the messages scheduled on a topic (``raybus._core.topic_schedule``), next to
    its router's publish log."""
    return f"queues/{_folder(topic)}/{incarnation}/scheduled"


def partition_actor_name(namespace: str, entity: str, incarnation: int, partition: int) -> str:
    """The Ray actor name of one partition (entity names are case-insensitive)."""
    return f"raybus/{namespace}/queue/{entity.lower()}/{incarnation}/{partition}"


@dataclass(frozen=True)
class EntityEntry:
    """One entity as registered: settings, times, and its current partition map.

    ``properties.partition_count`` is the count asked for; ``pmap`` is what exists now (they
    differ while a partition change is under way).
    """

    properties: Any  # QueueProperties (queues, subscriptions' stores) or TopicProperties
    incarnation: int
    created_at: float
    updated_at: float
    pmap: PartitionMap
    kind: str = "queue"  # queue, topic or subscription
    # A subscription's (SubscriptionProperties, rules tuple); None otherwise.
    extra: Any = None

    def __post_init__(self) -> None:
        # Settings travel to senders and receivers; an entity's access rules (their keys) never
        # do: the namespace keeps them in its access table (QueueProperties.authorization_rules).
        if getattr(self.properties, "authorization_rules", None) is not None:
            bare = dataclasses.replace(self.properties, authorization_rules=None)
            object.__setattr__(self, "properties", bare)

    @property
    def has_partitions(self) -> bool:
        return self.kind != "topic"

    def partition_names(self, namespace: str) -> dict[int, str]:
        """Actor name of every partition that exists, by partition id."""
        name, inc = self.properties.name, self.incarnation
        return {
            pid: partition_actor_name(namespace, name, inc, pid) for pid in self.pmap.partition_ids
        }


# Settings whose features have not landed yet: refused rather than silently ignored.
_NOT_YET: dict[str, tuple[Any, str]] = {}


def _check_supported(properties: QueueProperties) -> None:
    for name, (default, feature) in _NOT_YET.items():
        value = getattr(properties, name)
        if (value is True) if default is True else (value != default):
            raise InvalidArgumentError(
                f"{name} needs {feature}, which this version of raybus does not have yet",
                properties.name,
                name,
            )


class Registry:
    """Entities of one namespace."""

    def __init__(self, namespace: str, clock: Clock) -> None:
        self.namespace = namespace
        self._clock = clock
        self._entities: dict[str, EntityEntry] = {}
        self._incarnations = 0
        self.access = AccessTable()  # the namespace's authorization rules
        self.created_at: float | None = None  # set by ``born`` (or a logged "born" change)

    def now(self) -> float:
        """The registry's clock (epoch seconds): what stamps entities and rules."""
        return self._clock.now()

    def born(self) -> float | None:
        """Give the namespace its creation time if it has none (a new namespace, or a log
        written before creation times were kept); return it if it is new (to be logged),
        else None."""
        if self.created_at is not None:
            return None
        self.created_at = self._clock.now()
        return self.created_at

    def create(self, properties: QueueProperties) -> EntityEntry:
        _check_supported(properties)
        key = properties.name.lower()
        if key in self._entities:
            raise MessagingEntityAlreadyExistsError(
                f"an entity named {properties.name!r} already exists", properties.name
            )
        self._incarnations += 1
        now = self._clock.now()
        pmap = PartitionMap.initial(properties.partition_count)
        entry = EntityEntry(properties, self._incarnations, now, now, pmap)
        self._entities[key] = entry
        return entry

    def add(self, entry: EntityEntry) -> EntityEntry:
        """Register a topic or subscription entry (a new incarnation is assigned)."""
        key = entry.properties.name.lower()
        if key in self._entities:
            raise MessagingEntityAlreadyExistsError(
                f"an entity named {entry.properties.name!r} already exists",
                entry.properties.name,
            )
        self._incarnations += 1
        now = self._clock.now()
        entry = dataclasses.replace(
            entry, incarnation=self._incarnations, created_at=now, updated_at=now
        )
        self._entities[key] = entry
        return entry

    def replace(self, entry: EntityEntry) -> EntityEntry:
        """Store a changed entry of an existing entity (its kind must not change)."""
        old = self.get(entry.properties.name)
        if old.kind != entry.kind:
            raise InvalidArgumentError(
                f"{entry.properties.name!r} is a {old.kind}, not a {entry.kind}",
                entry.properties.name,
                "name",
            )
        entry = dataclasses.replace(entry, updated_at=self._clock.now())
        self._entities[entry.properties.name.lower()] = entry
        return entry

    def get(self, name: str) -> EntityEntry:
        try:
            return self._entities[name.lower()]
        except (KeyError, AttributeError):
            raise MessagingEntityNotFoundError(f"no entity named {name!r}", name) from None

    def update(self, properties: QueueProperties) -> EntityEntry:
        """Replace a queue's settings; fields fixed at creation must not change."""
        old = self.get(properties.name)
        if old.kind != "queue":
            raise MessagingEntityNotFoundError(f"no queue named {properties.name!r}", old.kind)
        _check_supported(properties)
        for field in IMMUTABLE_QUEUE_FIELDS:
            if getattr(old.properties, field) != getattr(properties, field):
                raise InvalidArgumentError(
                    f"{field} cannot be changed after the queue is created",
                    properties.name,
                    field,
                )
        # Keep the name as created: a case-different name refers to the same entity.
        props = dataclasses.replace(properties, name=old.properties.name)
        entry = dataclasses.replace(old, properties=props, updated_at=self._clock.now())
        self._entities[props.name.lower()] = entry
        return entry

    def set_map(self, name: str, pmap: PartitionMap) -> EntityEntry:
        """Install a new partition map (a newer version than the current one)."""
        old = self.get(name)
        if pmap.version <= old.pmap.version:
            raise ValueError(f"map version {pmap.version} is not newer than {old.pmap.version}")
        entry = dataclasses.replace(old, pmap=pmap, updated_at=self._clock.now())
        self._entities[old.properties.name.lower()] = entry
        return entry

    def delete(self, name: str) -> EntityEntry:
        entry = self.get(name)
        del self._entities[name.lower()]
        return entry

    def list(self) -> list[EntityEntry]:
        return sorted(self._entities.values(), key=lambda e: e.properties.name.lower())

    # Durability: the namespace actor logs each change as ("put", entry), ("del", name) or
    # ("access", (version, rules)) and replays them on start. Incarnation numbers never repeat
    # across restarts.

    def restore(self, changes: Iterable[tuple[str, Any]]) -> None:
        """Apply logged changes in order (a snapshot's entries first)."""
        for kind, value in changes:
            if kind == "put":
                self._entities[value.properties.name.lower()] = value
                self._incarnations = max(self._incarnations, value.incarnation)
            elif kind == "del":
                self._entities.pop(value.lower(), None)
            elif kind == "next":
                self._incarnations = max(self._incarnations, value)
            elif kind == "access":  # the whole rule table, as of that change
                self.access.load(*value)
            elif kind == "born":
                self.created_at = value

    def snapshot(self) -> builtins.list[tuple[str, Any]]:
        """Changes that rebuild the current registry."""
        out: builtins.list[tuple[str, Any]] = [("put", e) for e in self._entities.values()]
        out.append(("next", self._incarnations))
        out.append(("access", self.access.snapshot()))
        if self.created_at is not None:
            out.append(("born", self.created_at))
        return out
