"""What an entity may store, checked before anything changes (shared by a partition's sends, the
client's spanning lists and the topic router's deliveries)."""

from __future__ import annotations

from collections.abc import Sequence

from .._models import QueueProperties
from ..exceptions import (
    InvalidArgumentError,
    MessageSizeExceededError,
    MessagingEntityDisabledError,
)
from .record import MessageRecord

__all__ = ["check_sendable"]


def check_sendable(entity: str, props: QueueProperties, records: Sequence[MessageRecord]) -> None:
    """Refuse messages an entity with these settings may not store: sending disabled, a
    message over the size limit, an empty session id, a partition key that is not the
    session's. Shared by sends, by a client sending a list in shares to several partitions
    (before any share goes), and by the topic router, which checks a subscription's copies
    before it delivers them (``raybus._core.deliveries``)."""
    if not props.status.can_send:
        raise MessagingEntityDisabledError(
            f"the queue is {props.status.value}; sending is not allowed",
            entity,
            props.status.value,
        )
    limit = props.max_message_size
    for rec in records:
        if rec.size > limit:
            raise MessageSizeExceededError(
                f"message of {rec.size} bytes exceeds the queue's limit of {limit} bytes",
                entity,
                rec.size,
                limit,
            )
    for rec in records:
        if rec.session_id == "":
            raise InvalidArgumentError("session_id must not be empty", entity, "session_id")
        if rec.partition_key is not None and rec.session_id not in (None, rec.partition_key):
            raise InvalidArgumentError(
                f"partition_key {rec.partition_key!r} differs from session_id "
                f"{rec.session_id!r}: a session's messages are partitioned by their session",
                entity,
                "partition_key",
            )
