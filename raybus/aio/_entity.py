"""``EntityInfo``: what a client needs to know about an entity before using it.

Why on the client and not only the administration client: a gateway (or any caller that
forwards a protocol's attach / open) must refuse an unknown entity at once, as Service Bus does,
and learn the limits it announces (the max message size), with the credential of the caller
it serves. The administration client needs Manage rights for that; resolving an entity needs
only the rights of using it. The answer comes from the client's route cache, which the
client refreshes in the background anyway, so it costs nothing after the first call.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from .._actors.namespace import TopicRoute
from .._topic_models import is_subscription
from ..exceptions import InvalidArgumentError

if TYPE_CHECKING:
    from .._connection import Connection

__all__ = ["EntityInfo", "resolve_entity"]

EntityKind = Literal["queue", "topic", "subscription"]


@dataclass(frozen=True)
class EntityInfo:
    """A snapshot of an entity's settings, as ``ServiceBusClient.resolve_entity`` found them."""

    entity_path: str
    """The entity's path as the namespace spells it (a queue or topic name, or
    ``<topic>/Subscriptions/<subscription>``)."""
    kind: EntityKind
    """``"queue"``, ``"topic"`` or ``"subscription"``."""
    max_message_size_in_bytes: int
    """The largest message a send to it (or, for a subscription, to its topic) accepts."""
    requires_session: bool
    """Whether receivers must name a session (always False for a topic)."""
    lock_duration: timedelta | None
    """How long a receive locks a message (None for a topic, which is not received from)."""
    partition_ids: tuple[int, ...] = (0,)
    """The ids of the entity's partitions (empty for a topic). A message's sequence number
    names its partition in its top 16 bits; a caller holding only a lock token (a gateway
    serving a protocol that sends no sequence number) can ask each of these partitions,
    since at most one holds the lock."""


async def resolve_entity(conn: Connection, entity_path: str) -> EntityInfo:
    """Look ``entity_path`` up (``MessagingEntityNotFoundError`` if there is none)."""
    if not isinstance(entity_path, str) or not entity_path.strip("/"):
        raise InvalidArgumentError(
            f"entity_path must be a non-empty str, not {entity_path!r}", None, "entity_path"
        )
    route = await conn.route(entity_path.strip("/"))
    props = route.properties
    size = int(props.max_message_size)
    if isinstance(route, TopicRoute):
        return EntityInfo(props.name, "topic", size, False, None, ())
    kind: EntityKind = "subscription" if is_subscription(props.name) else "queue"
    return EntityInfo(
        props.name,
        kind,
        size,
        bool(props.requires_session),
        timedelta(seconds=props.lock_duration_s),
        tuple(route.pmap.partition_ids),
    )
