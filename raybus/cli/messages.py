"""``raybus send``, ``raybus receive``, ``raybus peek``, ``raybus purge``: messages in and out of
queues and topics.

``send NAME`` sends to the queue or the topic of that name: it asks the broker whether NAME is
a topic (queues and topics share one set of names) and then uses ``get_topic_sender`` or
``get_queue_sender``. ``receive`` and ``peek`` take a queue name, a subscription path
``TOPIC/Subscriptions/SUB``, or ``--subscription TOPIC/SUB`` (see ``_parse.parse_entity``).

``receive`` and ``peek`` print one JSON object per message and line (see ``_render``), so
their output pipes into ``jq`` or back into ``raybus send``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any

import typer

from .._topic_models import is_subscription
from ..enums import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode, ServiceBusSubQueue
from ..exceptions import MessagingEntityNotFoundError
from ..message import ServiceBusMessage, ServiceBusReceivedMessage
from . import _context
from ._errors import USAGE, fail
from ._parse import EntityRef, parse_duration, parse_entity, parse_property
from ._render import json_line, message_json

__all__ = [
    "OlderThan",
    "cutoff",
    "entity_ref",
    "is_topic",
    "open_receiver",
    "peek",
    "purge",
    "receive",
    "report_purged",
    "send",
]

# Bodies read from stdin are sent in lists of this many (each list is all-or-nothing).
SEND_CHUNK = 100

Entity = Annotated[
    str | None,
    typer.Argument(
        help="Queue name, or a subscription as TOPIC/Subscriptions/SUB.", show_default=False
    ),
]
SubscriptionOpt = Annotated[
    str | None,
    typer.Option(
        "--subscription",
        metavar="TOPIC/SUB",
        help="A topic's subscription instead of a queue (or give the topic as ENTITY and "
        "just SUB here).",
        show_default=False,
    ),
]
SessionId = Annotated[
    str | None,
    typer.Option("--session-id", help="Session to receive from (session-enabled queues)."),
]
NextSession = Annotated[
    bool,
    typer.Option("--next-session", help="Accept whichever session is free (waits --wait)."),
]
DeadLetter = Annotated[
    bool,
    typer.Option(
        "--dlq", "--dead-letter", help="Use the queue's (or subscription's) dead-letter sub-queue."
    ),
]


def entity_ref(entity: str | None, subscription: str | None) -> EntityRef:
    """The queue or subscription an ENTITY argument and ``--subscription`` name (a usage
    error if they do not name one)."""
    try:
        return parse_entity(entity, subscription)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="ENTITY / --subscription") from None


def open_receiver(cli: _context.CliContext, ref: EntityRef, **options: Any) -> Any:
    """A receiver of the queue or subscription ``ref`` (a topic's name is a usage error: its
    messages are in its subscriptions)."""
    if ref.subscription is None:
        if is_topic(cli, ref.name):
            fail(
                f"{ref.name!r} is a topic: receive from one of its subscriptions "
                f"({ref.name}/Subscriptions/SUB or --subscription {ref.name}/SUB; "
                f"raybus subscription list {ref.name})",
                USAGE,
            )
        return cli.client().get_queue_receiver(ref.name, **options)
    return cli.client().get_subscription_receiver(ref.name, ref.subscription, **options)


def is_topic(cli: _context.CliContext, name: str) -> bool:
    """Whether ``name`` is a topic of the namespace (else a queue, or nothing)."""
    try:
        cli.admin().get_topic(name)
    except MessagingEntityNotFoundError:
        return False
    return True


class Mode(str, Enum):
    PEEKLOCK = "peeklock"
    RECEIVEANDDELETE = "receiveanddelete"


def _seconds(value: str, option: str) -> float:
    try:
        return parse_duration(value).total_seconds()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def _bodies(bodies: list[str] | None) -> Iterator[str]:
    if bodies:
        yield from bodies
        return
    if sys.stdin.isatty():
        typer.echo("reading message bodies from stdin, one per line (end with Ctrl-D)", err=True)
    for line in sys.stdin:
        body = line.rstrip("\r\n")
        if body:
            yield body


def send(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(help="Queue or topic name.", show_default=False, metavar="NAME")
    ],
    bodies: Annotated[
        list[str] | None,
        typer.Argument(
            help="Message bodies (one message each); none: read stdin, one message per "
            "non-empty line.",
            show_default=False,
        ),
    ] = None,
    session_id: Annotated[str | None, typer.Option("--session-id", help="Session id.")] = None,
    partition_key: Annotated[
        str | None, typer.Option("--partition-key", help="Partition key.")
    ] = None,
    message_id: Annotated[
        str | None,
        typer.Option(
            "--message-id", help="Message id; '{n}' is replaced by the message's index (0, 1, ...)."
        ),
    ] = None,
    properties: Annotated[
        list[str] | None,
        typer.Option(
            "--property",
            "-p",
            help="Application property key=value (repeatable; JSON numbers, true/false and "
            "quoted strings are typed, the rest are strings).",
        ),
    ] = None,
    ttl: Annotated[str | None, typer.Option("--ttl", help="Time to live (e.g. 30s, 5m).")] = None,
    delay: Annotated[
        str | None, typer.Option("--delay", help="Schedule the messages this far ahead.")
    ] = None,
    correlation_id: Annotated[
        str | None, typer.Option("--correlation-id", help="Correlation id.")
    ] = None,
    subject: Annotated[str | None, typer.Option("--subject", help="Subject (label).")] = None,
    content_type: Annotated[
        str | None, typer.Option("--content-type", help="Content type.")
    ] = None,
    reply_to: Annotated[str | None, typer.Option("--reply-to", help="Reply-to address.")] = None,
) -> None:
    """Send messages to a queue or topic: the BODY arguments, or each line of stdin.

    NAME is looked up: a topic's messages go to its subscriptions (each subscription whose
    rules match gets a copy); otherwise NAME is a queue.
    """
    if is_subscription(name):
        fail(
            f"{name!r} is a subscription: subscriptions are receive-only; send to its topic",
            USAGE,
        )
    props: dict[str, Any] = {}
    for item in properties or []:
        try:
            key, value = parse_property(item)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--property") from None
        props[key] = value
    time_to_live = None if ttl is None else parse_duration_option(ttl, "--ttl")
    scheduled = None
    if delay is not None:
        scheduled = datetime.now(timezone.utc) + parse_duration_option(delay, "--delay")

    def make(n: int, body: str) -> ServiceBusMessage:
        return ServiceBusMessage(
            body,
            application_properties=dict(props) or None,
            message_id=None if message_id is None else message_id.replace("{n}", str(n)),
            session_id=session_id,
            partition_key=partition_key,
            correlation_id=correlation_id,
            subject=subject,
            content_type=content_type,
            reply_to=reply_to,
            time_to_live=time_to_live,
            scheduled_enqueue_time_utc=scheduled,
        )

    cli = _context.get(ctx)
    client = cli.client()
    topic = is_topic(cli, name)
    sent = 0
    with client.get_topic_sender(name) if topic else client.get_queue_sender(name) as sender:
        chunk: list[ServiceBusMessage] = []
        for n, body in enumerate(_bodies(bodies)):
            chunk.append(make(n, body))
            if len(chunk) >= SEND_CHUNK:
                sender.send_messages(chunk)
                sent += len(chunk)
                chunk = []
        if chunk:
            sender.send_messages(chunk)
            sent += len(chunk)
    where = f"topic {name}" if topic else name
    typer.echo(f"sent {sent} message{'' if sent == 1 else 's'} to {where}", err=True)


def parse_duration_option(value: str, option: str) -> Any:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def _session(session_id: str | None, next_session: bool) -> Any:
    if session_id is not None and next_session:
        raise typer.BadParameter("give --session-id or --next-session, not both")
    return NEXT_AVAILABLE_SESSION if next_session else session_id


def receive(
    ctx: typer.Context,
    entity: Entity = None,
    subscription: SubscriptionOpt = None,
    count: Annotated[int, typer.Option("--count", "-c", min=1, help="Messages to receive.")] = 1,
    wait: Annotated[
        str, typer.Option("--wait", "-w", help="Longest total wait for messages (e.g. 5, 2s).")
    ] = "5",
    mode: Annotated[
        Mode, typer.Option("--mode", case_sensitive=False, help="Receive mode.")
    ] = Mode.PEEKLOCK,
    complete: Annotated[
        bool, typer.Option("--complete", help="Complete each message (peek-lock).")
    ] = False,
    abandon: Annotated[
        bool, typer.Option("--abandon", help="Abandon each message: it is delivered again.")
    ] = False,
    dead_letter: DeadLetter = False,
    session_id: SessionId = None,
    next_session: NextSession = False,
) -> None:
    """Receive messages from a queue or subscription as JSON lines.

    Receives up to --count messages, waiting up to --wait in all.

    In peek-lock mode, without --complete or --abandon, the messages stay locked until their
    lock expires and are then delivered again (delivery count + 1).
    """
    ref = entity_ref(entity, subscription)
    wait_s = _seconds(wait, "--wait")
    if complete and abandon:
        raise typer.BadParameter("give --complete or --abandon, not both")
    if mode is Mode.RECEIVEANDDELETE and (complete or abandon):
        raise typer.BadParameter(
            "--complete and --abandon need --mode peeklock", param_hint="--mode"
        )
    session = _session(session_id, next_session)
    receiver = open_receiver(
        _context.get(ctx),
        ref,
        session_id=session,
        sub_queue=ServiceBusSubQueue.DEAD_LETTER if dead_letter else None,
        receive_mode=ServiceBusReceiveMode(mode.value),
        max_wait_time=max(wait_s, 0.01),  # --wait 0: just what is there now
    )
    deadline = time.monotonic() + wait_s
    received = 0
    with receiver:
        while received < count:
            left = deadline - time.monotonic()
            if left <= 0 and received:
                break
            batch = receiver.receive_messages(
                max_message_count=count - received, max_wait_time=max(left, 0.01)
            )
            for msg in batch:
                typer.echo(json_line(message_json(msg)))
            _settle(receiver, batch, complete=complete, abandon=abandon)
            received += len(batch)
            if not batch and time.monotonic() >= deadline:
                break


def _settle(
    receiver: Any, batch: list[ServiceBusReceivedMessage], *, complete: bool, abandon: bool
) -> None:
    if not batch:
        return
    if complete:
        receiver.complete_messages(batch)
    elif abandon:
        for msg in batch:
            receiver.abandon_message(msg)


def peek(
    ctx: typer.Context,
    entity: Entity = None,
    subscription: SubscriptionOpt = None,
    count: Annotated[int, typer.Option("--count", "-c", min=1, help="Messages to peek.")] = 1,
    from_sequence: Annotated[
        int,
        typer.Option("--from-sequence", min=0, help="Start at this sequence number (0: first)."),
    ] = 0,
    dead_letter: DeadLetter = False,
    session_id: SessionId = None,
) -> None:
    """Show messages of a queue or subscription as JSON lines, without locking them.

    Peeking shows active, locked, deferred and scheduled messages.
    """
    ref = entity_ref(entity, subscription)
    for msg in peek_all(ctx, ref, count, from_sequence, dead_letter, session_id):
        typer.echo(json_line(message_json(msg)))


def peek_all(
    ctx: typer.Context,
    ref: EntityRef,
    count: int,
    from_sequence: int = 0,
    dead_letter: bool = False,
    session_id: str | None = None,
) -> list[ServiceBusReceivedMessage]:
    """Up to ``count`` messages from ``from_sequence`` on (peeks continue where the last
    one ended, so several calls walk the whole queue)."""
    out: list[ServiceBusReceivedMessage] = []
    with open_receiver(
        _context.get(ctx),
        ref,
        session_id=session_id,
        sub_queue=ServiceBusSubQueue.DEAD_LETTER if dead_letter else None,
    ) as receiver:
        first = True
        while len(out) < count:
            batch = receiver.peek_messages(
                min(count - len(out), 250), sequence_number=from_sequence if first else 0
            )
            first = False
            if not batch:
                break
            out.extend(batch)
    return out


OlderThan = Annotated[
    str | None,
    typer.Option(
        "--older-than",
        metavar="DURATION",
        help="Only messages enqueued at least this long ago (30s, 2h, 1d, PT1H).",
        show_default=False,
    ),
]


def cutoff(older_than: str | None) -> datetime:
    """The ``before_enqueued_time_utc`` of ``--older-than`` (now when not given)."""
    now = datetime.now(timezone.utc)
    if older_than is None:
        return now
    try:
        return now - parse_duration(older_than)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--older-than") from None


def report_purged(purged: int, what: str, ref: EntityRef, started: float) -> None:
    typer.echo(
        f"purged {purged} {what}{'' if purged == 1 else 's'} from {ref} "
        f"in {time.monotonic() - started:.1f}s",
        err=True,
    )


def purge(
    ctx: typer.Context,
    entity: Entity = None,
    subscription: SubscriptionOpt = None,
    older_than: OlderThan = None,
    session_id: SessionId = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Really delete: the messages are gone for good.")
    ] = False,
) -> None:
    """Delete the messages of a queue or subscription without receiving them (needs --yes).

    The broker deletes (purge_messages) every one enqueued before now, or --older-than ago,
    that is not locked. For dead letters: raybus dlq purge.
    """
    ref = entity_ref(entity, subscription)
    before = cutoff(older_than)
    if not yes:
        fail(f"purging {ref} deletes its messages for good: add --yes", USAGE)
    with open_receiver(_context.get(ctx), ref, session_id=session_id) as receiver:
        started = time.monotonic()
        purged = receiver.purge_messages(before_enqueued_time_utc=before)
    report_purged(purged, "message", ref, started)
