"""``raybus dlq list|resubmit|purge``: the dead-letter sub-queue of a queue or subscription.

Each command takes a queue name, a subscription path ``TOPIC/Subscriptions/SUB``, or
``--subscription TOPIC/SUB``. ``resubmit`` sends a copy of each dead-lettered message back to
its queue and completes the dead letter in the same transaction, so every message ends up in
exactly one of the two places even if the command dies half-way.

A subscription cannot be sent to, so its dead letters can only be resubmitted through its
topic, with ``--via-topic``: every subscription of the topic whose rules match gets a copy
again (not only this one), and since sends to a topic cannot be transactional, each batch is
sent first and its dead letters completed after (a crash in between leaves a message in both
places, never in neither).
"""

from __future__ import annotations

import time
from typing import Annotated

import typer

from ..aio._transaction import MAX_MESSAGES
from ..enums import ServiceBusSubQueue
from ..message import ServiceBusMessage, ServiceBusReceivedMessage
from . import _context
from ._errors import USAGE, fail
from ._parse import parse_duration
from ._render import json_line, message_json
from .messages import (
    Entity,
    OlderThan,
    SubscriptionOpt,
    cutoff,
    entity_ref,
    open_receiver,
    peek_all,
    report_purged,
)

__all__ = ["app", "resubmit_copy"]

app = typer.Typer(
    help="List, resubmit and purge the dead-lettered messages of a queue or subscription.",
    no_args_is_help=True,
)

Wait = Annotated[
    str, typer.Option("--wait", "-w", help="How long to wait for dead letters to arrive.")
]

# A resubmit is two transactional operations (a send and a completion).
RESUBMIT_BATCH = MAX_MESSAGES // 2


def _wait_s(value: str) -> float:
    try:
        return parse_duration(value).total_seconds()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--wait") from None


@app.command("list")
def list_(
    ctx: typer.Context,
    entity: Entity = None,
    subscription: SubscriptionOpt = None,
    count: Annotated[
        int, typer.Option("--count", "-c", min=1, help="At most this many messages.")
    ] = 100,
) -> None:
    """Show dead-lettered messages as JSON lines, without locking them.

    Each line has the dead-letter reason and description besides the message's fields.
    """
    for msg in peek_all(ctx, entity_ref(entity, subscription), count, dead_letter=True):
        typer.echo(json_line(message_json(msg)))


def resubmit_copy(msg: ServiceBusReceivedMessage, *, new_id: bool = False) -> ServiceBusMessage:
    """A new message with ``msg``'s body, properties and ids (the broker's fields, such as
    sequence number, delivery count and dead-letter reason, start afresh: the reason and
    description a received dead letter shows among its application properties are left
    out)."""
    props = dict(msg.application_properties or {})
    if msg.dead_letter_reason is not None:
        props.pop("DeadLetterReason", None)
    if msg.dead_letter_error_description is not None:
        props.pop("DeadLetterErrorDescription", None)
    return ServiceBusMessage(
        msg.body,
        application_properties=props or None,
        message_id=None if new_id else msg.message_id,
        correlation_id=msg.correlation_id,
        session_id=msg.session_id,
        reply_to=msg.reply_to,
        reply_to_session_id=msg.reply_to_session_id,
        to=msg.to,
        subject=msg.subject,
        content_type=msg.content_type,
        time_to_live=msg.time_to_live,
        partition_key=msg.partition_key,
    )


@app.command()
def resubmit(
    ctx: typer.Context,
    entity: Entity = None,
    subscription: SubscriptionOpt = None,
    count: Annotated[
        int | None,
        typer.Option("--count", "-c", min=1, help="At most this many (default: all)."),
    ] = None,
    wait: Wait = "1",
    new_ids: Annotated[
        bool,
        typer.Option(
            "--new-ids",
            help="Give the copies new message ids (else they keep theirs: on a queue with "
            "duplicate detection a copy sent within the window would be dropped).",
        ),
    ] = False,
    via_topic: Annotated[
        bool,
        typer.Option(
            "--via-topic",
            help="For a subscription: send the copies to its topic (every matching "
            "subscription gets one; not transactional: send, then complete).",
        ),
    ] = False,
) -> None:
    """Send dead-lettered messages back to the queue, in transactions.

    Each copy is sent and its dead letter completed in the same transaction (at most 50
    messages per transaction), so a message is never lost nor left in both places. A
    subscription's dead letters go back through its topic, with --via-topic only.
    """
    ref = entity_ref(entity, subscription)
    if ref.subscription is not None and not via_topic:
        fail(
            f"{ref.path} is a subscription, which cannot be sent to: resubmitting sends the "
            f"copies to the topic {ref.name}, so every subscription whose rules match gets one "
            "again, and not in a transaction; add --via-topic to do that",
            USAGE,
        )
    if via_topic and ref.subscription is None:
        raise typer.BadParameter("is for a subscription's dead letters", param_hint="--via-topic")
    wait_s = _wait_s(wait)
    cli = _context.get(ctx)
    client = cli.client()
    done = 0
    with (
        open_receiver(
            cli, ref, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=wait_s
        ) as dlq,
        (
            client.get_queue_sender(ref.name)
            if ref.subscription is None
            else client.get_topic_sender(ref.name)
        ) as sender,
    ):
        while count is None or done < count:
            want = RESUBMIT_BATCH if count is None else min(RESUBMIT_BATCH, count - done)
            batch = dlq.receive_messages(max_message_count=want, max_wait_time=wait_s)
            if not batch:
                break
            if ref.subscription is not None:
                # A topic send cannot be in a transaction: send, then complete (a crash in
                # between leaves the message in both places, never in neither).
                sender.send_messages([resubmit_copy(m, new_id=new_ids) for m in batch])
                dlq.complete_messages(batch)
                done += len(batch)
                continue
            with client.transaction() as txn:
                sender.send_messages(
                    [resubmit_copy(m, new_id=new_ids) for m in batch], transaction=txn
                )
                for msg in batch:
                    dlq.complete_message(msg, transaction=txn)
            done += len(batch)
    where = ref.name if ref.subscription is None else f"topic {ref.name}"
    typer.echo(f"resubmitted {done} message{'' if done == 1 else 's'} to {where}", err=True)


@app.command()
def purge(
    ctx: typer.Context,
    entity: Entity = None,
    subscription: SubscriptionOpt = None,
    older_than: OlderThan = None,
) -> None:
    """Delete the dead-lettered messages of a queue or subscription (no confirmation).

    The broker deletes them unreceived (purge_messages): those first enqueued before the
    purge began, or --older-than ago (a dead letter keeps its first enqueue time).
    """
    ref = entity_ref(entity, subscription)
    before = cutoff(older_than)
    with open_receiver(_context.get(ctx), ref, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        started = time.monotonic()
        purged = dlq.purge_messages(before_enqueued_time_utc=before)
    report_purged(purged, "dead-lettered message", ref, started)
