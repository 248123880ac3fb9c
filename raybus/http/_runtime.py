"""The Service Bus REST runtime API on top of the raybus asyncio client.

Routes (``{entity}`` is a queue or topic; ``{source}`` is a queue, ``{topic}/subscriptions/{sub}``,
or either followed by ``/$DeadLetterQueue`` or ``/$Transfer/$DeadLetterQueue``, the transfer
dead-letter sub-queue, which is always empty: ``raybus.aio._receiver``):

=========================================================  ====================================
``POST {entity}/messages``                                 send one message, or a JSON batch
``POST {source}/messages/head?timeout=N``                  peek-lock: 201, or 204 when empty
``DELETE {source}/messages/head?timeout=N``                receive-and-delete: 200, or 204
``DELETE {source}/messages/{seq}/{lock-token}``            complete: 200
``PUT {source}/messages/{seq}/{lock-token}``               unlock (abandon): 200
``POST {source}/messages/{seq}/{lock-token}``              renew the lock: 200
=========================================================  ====================================

Every operation goes through the same client calls a Python user makes (``send_messages``,
``receive_messages``, and for settlement ``settle_message_by_lock_token`` and
``renew_message_lock_by_lock_token``, since HTTP is stateless and the URL carries only the lock
token), so the broker's semantics live in one place. The sequence number's top 16 bits name the
partition holding the lock (a message id in its place only works on entities of one partition;
on others it is a 400). Settlements wait for the broker's answer before the response is sent,
so a 200 means done and a 404 means the lock was gone and nothing changed.

Status codes, as Service Bus's REST API answers them: 201 sent / locked, 200, 204 nothing to
receive, 400 bad input (with the reason), 401 no, a bad or an insufficient token, 403 too large
for the entity, full, or disabled, 404 no message with that lock token (unknown, expired or
used), 410 no such queue, topic or subscription, 503 busy or unreachable (retry;
``Retry-After`` set). A request body over the gateway's own limit is a 413
(``raybus.http._app``).
"""

from __future__ import annotations

import html
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..aio import ServiceBusClient, ServiceBusReceiver
from ..enums import ServiceBusDisposition, ServiceBusReceiveMode, ServiceBusSubQueue
from ..exceptions import (
    InvalidArgumentError,
    MessageAlreadySettled,
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from ..message import ServiceBusReceivedMessage
from ._wire import (
    BATCH_CONTENT_TYPE,
    HttpError,
    batch_messages,
    http_date,
    received_body,
    received_headers,
    single_message,
)

__all__ = ["Response", "RuntimeRoute", "error_response", "handle_runtime", "match_runtime"]

Response = tuple[int, dict[str, str], bytes]

# Service Bus's default long-poll when a receive names no timeout.
DEFAULT_RECEIVE_TIMEOUT_S = 60.0
_MAX_LOCK_TOKEN = 128
_MAX_SEQUENCE = 2**64 - 1


@dataclass(frozen=True)
class RuntimeRoute:
    """A parsed runtime request: what to do (``action``) on which entity."""

    action: str  # send | peek_lock | receive_delete | complete | unlock | renew
    entity: str  # the queue or topic
    subscription: str | None = None
    sub_queue: ServiceBusSubQueue | None = None
    sequence_number: int | None = None  # None: the URL named a message id
    lock_token: str | None = None


_SETTLE_ACTIONS = {"DELETE": "complete", "PUT": "unlock", "POST": "renew"}
_HEAD_ACTIONS = {"POST": "peek_lock", "DELETE": "receive_delete"}


def _source(prefix: list[str]) -> tuple[str, str | None, ServiceBusSubQueue | None]:
    """(entity, subscription, sub-queue) of the segments before ``messages``."""
    sub_queue = None
    if prefix and prefix[-1].lower() == "$deadletterqueue":
        prefix = prefix[:-1]
        sub_queue = ServiceBusSubQueue.DEAD_LETTER
        if prefix and prefix[-1].lower() == "$transfer":
            prefix = prefix[:-1]
            sub_queue = ServiceBusSubQueue.TRANSFER_DEAD_LETTER
    subscription = None
    if len(prefix) >= 3 and prefix[-2].lower() == "subscriptions":
        subscription = prefix[-1]
        prefix = prefix[:-2]
    if not prefix:
        raise HttpError(400, "the path names no queue or topic")
    return "/".join(prefix), subscription, sub_queue


def match_runtime(method: str, path: str) -> RuntimeRoute | None:
    """The runtime route of ``method path``; None when the path is not a runtime path (it
    may be a management request). Raises ``HttpError`` for a runtime path that is malformed
    or used with the wrong method."""
    segments = [urllib.parse.unquote(s) for s in path.split("/") if s]
    lowered = [s.lower() for s in segments]
    if len(segments) >= 2 and lowered[-1] == "messages":
        prefix, tail = segments[:-1], []
    elif len(segments) >= 3 and lowered[-2:] == ["messages", "head"]:
        prefix, tail = segments[:-2], ["head"]
    elif len(segments) >= 4 and lowered[-3] == "messages":
        prefix, tail = segments[:-3], segments[-2:]
    else:
        return None
    entity, subscription, sub_queue = _source(prefix)
    method = method.upper()
    if not tail:
        if method != "POST":
            raise HttpError(405, f"{method} is not allowed on .../messages: POST sends")
        if subscription is not None or sub_queue is not None:
            raise HttpError(400, "send to a queue or topic, not to a subscription or sub-queue")
        return RuntimeRoute("send", entity)
    if tail == ["head"]:
        if method not in _HEAD_ACTIONS:
            raise HttpError(405, f"{method} is not allowed on .../messages/head")
        return RuntimeRoute(_HEAD_ACTIONS[method], entity, subscription, sub_queue)
    if method not in _SETTLE_ACTIONS:
        raise HttpError(405, f"{method} is not allowed on a locked message")
    ref, token = tail
    if not token or len(token) > _MAX_LOCK_TOKEN or not token.isprintable():
        raise HttpError(400, "the lock token in the path is malformed")
    seq: int | None = None
    if ref.isdigit() and int(ref) <= _MAX_SEQUENCE:
        seq = int(ref)
    return RuntimeRoute(_SETTLE_ACTIONS[method], entity, subscription, sub_queue, seq, token)


def receive_timeout(query: Mapping[str, str], cap_s: float) -> float:
    """The ``timeout`` query parameter in seconds (default 60), capped at ``cap_s``."""
    raw = query.get("timeout")
    if raw is None:
        return min(DEFAULT_RECEIVE_TIMEOUT_S, cap_s)
    try:
        value = float(raw)
    except ValueError:
        raise HttpError(400, f"timeout={raw!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise HttpError(400, f"timeout={raw!r} must be a non-negative number of seconds")
    return min(value, cap_s)


# ------------------------------------------------------------------------------- errors

# Service Bus's REST reference: 401 for any authorization failure (no, a bad or an
# insufficient token), 403 "quota exceeded or message too large" (and a disabled entity), 404
# "no message was found with the specified MessageId or LockToken", 410 "the specified queue
# or subscription does not exist".
_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (ServiceBusAuthenticationError, 401),
    (ServiceBusAuthorizationError, 401),
    (MessagingEntityNotFoundError, 410),
    (MessageNotFoundError, 404),
    (MessageLockLostError, 404),  # includes SettlementFailedError
    (SessionLockLostError, 404),
    (MessageAlreadySettled, 404),
    (MessageSizeExceededError, 403),
    (ServiceBusQuotaExceededError, 403),
    (MessagingEntityDisabledError, 403),
    (MessagingEntityAlreadyExistsError, 409),
    (SessionCannotBeLockedError, 409),
    (InvalidArgumentError, 400),
)


def status_of(error: BaseException) -> int:
    """The HTTP status of a raybus error (503 for retryable ones, 400 for other refusals)."""
    for cls, status in _STATUS:
        if isinstance(error, cls):
            return status
    if getattr(error, "retryable", False):
        return 503
    return 400


def error_response(status: int, reason: str) -> Response:
    """Service Bus's error body: ``<Error><Code>..</Code><Detail>..</Detail></Error>``."""
    body = f"<Error><Code>{status}</Code><Detail>{html.escape(reason)}</Detail></Error>"
    headers = {"Content-Type": "application/xml; charset=utf-8"}
    if status == 503:
        headers["Retry-After"] = "2"
    return status, headers, body.encode("utf-8")


def response_for_error(error: BaseException) -> Response:
    """The response for an error raised while serving a request."""
    if isinstance(error, HttpError):
        return error_response(error.status, error.reason)
    if isinstance(error, ServiceBusError | MessageAlreadySettled):
        return error_response(status_of(error), f"{type(error).__name__}: {error}")
    raise error


# ------------------------------------------------------------------------------- handlers


def _receiver(
    client: ServiceBusClient, route: RuntimeRoute, *, delete: bool = False
) -> ServiceBusReceiver:
    mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE if delete else ServiceBusReceiveMode.PEEK_LOCK
    sub_queue = route.sub_queue
    if route.subscription is not None:
        return client.get_subscription_receiver(
            route.entity, route.subscription, receive_mode=mode, sub_queue=sub_queue
        )
    return client.get_queue_receiver(route.entity, receive_mode=mode, sub_queue=sub_queue)


def _location(base_url: str, route: RuntimeRoute, msg: ServiceBusReceivedMessage) -> str:
    parts = [route.entity]
    if route.subscription is not None:
        parts += ["subscriptions", route.subscription]
    if route.sub_queue is ServiceBusSubQueue.TRANSFER_DEAD_LETTER:
        parts.append("$Transfer")
    if route.sub_queue is not None:
        parts.append("$DeadLetterQueue")
    path = "/".join(urllib.parse.quote(p, safe="/$") for p in parts)
    return f"{base_url}/{path}/messages/{msg.sequence_number}/{msg.lock_token}"


async def _send(
    client: ServiceBusClient, route: RuntimeRoute, headers: list[tuple[str, str]], body: bytes
) -> Response:
    content_type = next((v for k, v in headers if k.lower() == "content-type"), None)
    if content_type and content_type.split(";")[0].strip().lower() == BATCH_CONTENT_TYPE:
        messages = batch_messages(body)
    else:
        messages = [single_message(headers, content_type, body)]
    sender = client.get_queue_sender(route.entity)
    try:
        await sender.send_messages(messages)
    finally:
        await sender.close()
    return 201, {}, b""


async def _receive(
    client: ServiceBusClient, route: RuntimeRoute, timeout_s: float, base_url: str
) -> Response:
    delete = route.action == "receive_delete"
    receiver = _receiver(client, route, delete=delete)
    try:
        # A zero timeout still asks the broker once; max_wait_time must be positive.
        got = await receiver.receive_messages(1, max_wait_time=max(timeout_s, 1e-3))
    finally:
        await receiver.close()
    if not got:
        return 204, {}, b""
    msg = got[0]
    headers = received_headers(msg)
    if delete:
        return 200, headers, received_body(msg)
    headers["Location"] = _location(base_url, route, msg)
    return 201, headers, received_body(msg)


async def _settle_one(receiver: ServiceBusReceiver, route: RuntimeRoute) -> dict[str, str]:
    token, seq = route.lock_token or "", route.sequence_number
    if route.action in ("complete", "unlock"):
        disposition = (
            ServiceBusDisposition.COMPLETED
            if route.action == "complete"
            else ServiceBusDisposition.ABANDONED
        )
        await receiver.settle_message_by_lock_token(token, disposition, sequence_number=seq)
        return {}
    until = await receiver.renew_message_lock_by_lock_token(token, sequence_number=seq)
    props: dict[str, Any] = {"LockToken": route.lock_token, "LockedUntilUtc": http_date(until)}
    if seq is not None:
        props["SequenceNumber"] = seq
    return {"BrokerProperties": json.dumps(props, separators=(",", ":"))}


async def _settle(client: ServiceBusClient, route: RuntimeRoute) -> Response:
    """Settle by the URL's lock token; the receiver waits for the broker's answer, so a 200
    means done and a 404 that the lock was gone (unknown, expired or used) and nothing
    changed."""
    receiver = _receiver(client, route)
    try:
        headers = await _settle_one(receiver, route)
    finally:
        await receiver.close()
    return 200, headers, b""


async def handle_runtime(
    client: ServiceBusClient,
    route: RuntimeRoute,
    *,
    query: Mapping[str, str],
    headers: list[tuple[str, str]],
    body: bytes,
    base_url: str,
    max_receive_timeout_s: float,
) -> Response:
    """Serve one runtime request with ``client`` (created with the caller's credential).

    Raybus errors and bad input come back as error responses; anything else propagates.
    """
    try:
        if route.action == "send":
            return await _send(client, route, headers, body)
        if route.action in ("peek_lock", "receive_delete"):
            timeout_s = receive_timeout(query, max_receive_timeout_s)
            return await _receive(client, route, timeout_s, base_url)
        return await _settle(client, route)
    except (HttpError, ServiceBusError, MessageAlreadySettled) as exc:
        return response_for_error(exc)
