"""Service Bus's ATOM management API (what ``azure.servicebus.management`` speaks) over raybus.

``handle_management`` is the one entry point: the HTTPS gateway hands it every request and
sends back the ``(status, headers, body)`` it returns, or routes the request elsewhere when it
returns None (the runtime API's ``.../messages`` paths, POSTs, anything not management).

Paths (``api-version`` 2017-04, 2021-05 and 2024-05 are served alike):

* ``GET|PUT|DELETE /{queue or topic}`` (``PUT`` with ``If-Match`` updates, without creates)
* ``GET /$Resources/queues|topics?$skip=&$top=``, ``GET /$namespaceinfo``
* ``GET /{topic}/subscriptions``, ``GET|PUT|DELETE /{topic}/subscriptions/{name}``
* ``GET /{topic}/subscriptions/{name}/rules``, ``GET|PUT|DELETE .../rules/{rule}``

``path`` should be the raw, percent-encoded request path (ASGI ``raw_path``): the SDK sends a
name holding ``/`` as ``%2F``, which keeps a queue named ``a/messages/b`` apart from the
runtime API's ``/a/messages``. A decoded path works too, except for such names.

Every answer is computed by the caller's ``admin`` client, so raybus's own checks (names,
ranges, rights) apply unchanged; raybus errors become the status codes Service Bus uses
(``_STATUS``) with an ``<Error><Code/><Detail/></Error>`` body, which the SDK turns into
``ResourceNotFoundError`` (404), ``ResourceExistsError`` (409), ``ClientAuthenticationError``
(401) or ``HttpResponseError`` carrying the detail. Request bodies are parsed defensively
(see ``_atom_xml``): a bad one is a 400 naming the problem, never a 500.

An entity's ``AuthorizationRules`` are set after the entity is created or updated: if that
fails (a bad key, say) the answer is the error, and the entity exists with its settings
applied but its rules not (the rules were checked before anything changed, so this takes a
broker-side refusal).

Deviations: a rule's update is a delete and a create (raybus has no rule update); the new
rule is compiled first, so a bad one leaves the old rule in place, but a message published in
between meets neither. Rules report no ``CreatedAt`` (raybus does not record it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from ..exceptions import (
    FilterSyntaxError,
    InvalidArgumentError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
    ServiceBusError,
    ServiceBusQuotaExceededError,
    ServiceBusServerBusyError,
)
from . import _atom_models as models
from ._atom_xml import ATOM_NS, SB_NS, XSI_NS, el, format_datetime, local_name, parse_document

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET

    from ..aio import ServiceBusAdministrationClient

__all__ = ["handle_management"]

log = logging.getLogger("raybus.http.atom")

Response = tuple[int, dict[str, str], bytes]

API_VERSION = "2021-05"
MAX_PAGE = 1000
PAGE_CONCURRENCY = 16

# Most specific first: FilterSyntaxError and the others are all ServiceBusErrors.
_STATUS: tuple[tuple[type[ServiceBusError], int], ...] = (
    (MessagingEntityNotFoundError, 404),
    (MessagingEntityAlreadyExistsError, 409),
    (InvalidArgumentError, 400),
    (FilterSyntaxError, 400),
    (MessagingEntityDisabledError, 400),
    (ServiceBusAuthenticationError, 401),
    (ServiceBusAuthorizationError, 401),  # Service Bus: 401, "'Manage' claim(s) are required"
    (ServiceBusQuotaExceededError, 403),
    (ServiceBusServerBusyError, 503),
    (ServiceBusConnectionError, 503),
    (OperationTimeoutError, 504),
)

_XML_DECLARATION = '<?xml version="1.0" encoding="utf-8"?>'


def status_for(exc: ServiceBusError) -> int:
    """The HTTP status Service Bus answers for this raybus error (500 for an unknown one)."""
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 500


def error_response(status: int, detail: str) -> Response:
    body = el("Error", el("Code", text=str(status)), el("Detail", text=detail))
    return status, {"Content-Type": "application/xml; charset=utf-8"}, body.encode("utf-8")


def _xml_response(status: int, kind: str, xml: str) -> Response:
    headers = {"Content-Type": f"application/atom+xml;type={kind};charset=utf-8"}
    return status, headers, (_XML_DECLARATION + xml).encode("utf-8")


@dataclass(frozen=True)
class _Request:
    method: str
    segments: tuple[str, ...]
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    admin: ServiceBusAdministrationClient

    @property
    def host(self) -> str:
        return self.headers.get("host") or f"{self.admin.namespace}.servicebus.raybus"

    @property
    def is_update(self) -> bool:
        return "if-match" in self.headers

    def href(self, path: str, query: str = "") -> str:
        return f"https://{self.host}/{quote(path, safe='/')}?{query}api-version={API_VERSION}"

    def entry(self, path: str, title: str, content: str, updated: datetime | None = None) -> str:
        href = self.href(path)
        stamp = format_datetime(updated or datetime.now(timezone.utc))
        return el(
            "entry",
            el("id", text=href),
            el("title", text=title, attrs={"type": "text"}),
            el("published", text=stamp),
            el("updated", text=stamp),
            el("author", el("name", text=self.admin.namespace)),
            el("link", attrs={"rel": "self", "href": href}),
            el("content", content, attrs={"type": "application/xml"}),
            attrs={"xmlns": ATOM_NS},
        )

    def description(self) -> ET.Element:
        """The description element inside the body's ``entry/content``."""
        root = parse_document(self.body)
        if root.tag != f"{{{ATOM_NS}}}entry":
            raise InvalidArgumentError(
                f"expected an ATOM entry, not {local_name(root)!r}", None, "body"
            )
        content = root.find(f"{{{ATOM_NS}}}content")
        if content is None or len(content) != 1:
            raise InvalidArgumentError(
                "the ATOM entry needs a content element holding one description", None, "body"
            )
        return content[0]

    def page(self) -> tuple[int, int]:
        values = []
        for name, default, low, high in (("$skip", 0, 0, 2**31 - 1), ("$top", 100, 1, MAX_PAGE)):
            text = self.query.get(name, str(default))
            if not text.isdigit() or not low <= int(text) <= high:
                raise InvalidArgumentError(
                    f"{name} must be an integer from {low} to {high}, not {text!r}", None, name
                )
            values.append(int(text))
        return values[0], values[1]


async def handle_management(
    method: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    body: bytes,
    admin: ServiceBusAdministrationClient,
) -> tuple[int, dict[str, str], bytes] | None:
    """Serve one management request, or return None when it is not one (see the module
    docstring). raybus errors become Service Bus status codes; other exceptions are bugs and
    propagate to the gateway."""
    method = method.upper()
    segments = tuple(unquote(s) for s in path.strip("/").split("/") if s)
    if method not in ("GET", "PUT", "DELETE") or not segments:
        return None
    if any(s.lower() == "messages" for s in segments[1:]):
        return None  # the runtime API
    handler = _route(method, segments)
    if handler is None:
        return error_response(405, f"{method} is not supported on {path}")
    request = _Request(
        method, segments, query, {k.lower(): v for k, v in headers.items()}, body, admin
    )
    try:
        return await handler(request)
    except ServiceBusError as exc:
        status = status_for(exc)
        if status == 500:
            log.warning("management %s %s failed: %r", method, path, exc)
        return error_response(status, str(exc))


Handler = Callable[[_Request], Awaitable[Response]]


def _route(method: str, segments: tuple[str, ...]) -> Handler | None:
    first = segments[0].lower()
    if first == "$resources":
        kind = segments[1].lower() if len(segments) == 2 else ""
        if kind not in ("queues", "topics"):
            return _not_found
        return {"GET": _list_queues if kind == "queues" else _list_topics}.get(method)
    if first == "$namespaceinfo" and len(segments) == 1:
        return {"GET": _namespace_info}.get(method)
    lowered = [s.lower() for s in segments]
    if "subscriptions" not in lowered[1:]:
        return {"GET": _get_entity, "PUT": _put_entity, "DELETE": _delete_entity}[method]
    rest = lowered[lowered.index("subscriptions", 1) + 1 :]
    if not rest:
        return {"GET": _list_subscriptions}.get(method)
    if len(rest) == 1:
        return {"GET": _get_subscription, "PUT": _put_subscription, "DELETE": _delete_subscription}[
            method
        ]
    if rest[1] != "rules" or len(rest) > 3:
        return _not_found
    if len(rest) == 2:
        return {"GET": _list_rules}.get(method)
    return {"GET": _get_rule, "PUT": _put_rule, "DELETE": _delete_rule}[method]


async def _not_found(request: _Request) -> Response:
    return error_response(404, f"no management resource at /{'/'.join(request.segments)}")


def _names(request: _Request) -> tuple[str, str, str]:
    """(topic, subscription, rule) of a subscription or rule path ('' when absent)."""
    lowered = [s.lower() for s in request.segments]
    at = lowered.index("subscriptions", 1)
    topic = "/".join(request.segments[:at])
    rest = request.segments[at + 1 :]
    return topic, rest[0], rest[2] if len(rest) == 3 else ""


async def _paged(
    request: _Request,
    title: str,
    items: Sequence[Any],
    render: Callable[[Any], Awaitable[str | None]],
) -> Response:
    """A feed of one page of ``items`` (sorted by name, as Service Bus lists them) with a
    ``next`` link when more follow; ``render`` returns None for an item deleted meanwhile."""
    skip, top = request.page()
    ordered = sorted(items, key=lambda item: item.name.lower())
    # Each entry asks the broker for its counts; a page of 1,000 should not be 1,000 calls
    # in flight at once.
    limit = asyncio.Semaphore(PAGE_CONCURRENCY)

    async def bounded(item: Any) -> str | None:
        async with limit:
            return await render(item)

    rendered = await asyncio.gather(*(bounded(item) for item in ordered[skip : skip + top]))
    path = "/".join(request.segments)
    links = [el("link", attrs={"rel": "self", "href": request.href(path)})]
    if skip + top < len(ordered):
        next_query = f"$skip={skip + top}&$top={top}&"
        links.append(el("link", attrs={"rel": "next", "href": request.href(path, next_query)}))
    feed = el(
        "feed",
        el("title", text=title, attrs={"type": "text"}),
        el("id", text=request.href(path)),
        el("updated", text=format_datetime(datetime.now(timezone.utc))),
        *links,
        *(entry for entry in rendered if entry is not None),
        attrs={"xmlns": ATOM_NS},
    )
    return _xml_response(200, "feed", feed)


async def _missing_is_none(make: Awaitable[str]) -> str | None:
    try:
        return await make
    except MessagingEntityNotFoundError:
        return None


# ------------------------------------------------------------------ queues and topics


async def _queue_entry(request: _Request, props: Any) -> str:
    """A queue's entry (``props`` from the admin client: with its access rules)."""
    runtime = await request.admin.get_queue_runtime_properties(props.name)
    content = models.queue_description(props, runtime, request.host, props.authorization_rules)
    return request.entry(props.name, props.name, content, runtime.updated_at_utc)


async def _topic_entry(request: _Request, props: Any) -> str:
    runtime = await request.admin.get_topic_runtime_properties(props.name)
    content = models.topic_description(props, runtime, props.authorization_rules)
    return request.entry(props.name, props.name, content, runtime.updated_at_utc)


def _access_rules(
    wanted: list[models.WantedRule] | None, current: Any = None
) -> dict[str, list[models.WantedRule]]:
    """The ``authorization_rules`` option of a description's ``AuthorizationRules`` (none:
    the rules are left as they are): a key a rule leaves out keeps the rule's current key (a
    new rule's is generated by the admin client). The admin client replaces the entity's rules
    with them, leaving a rule whose rights and keys are unchanged as it is (the SDK's update
    sends every rule back)."""
    if wanted is None:
        return {}
    have = {r.key_name: r for r in (current.authorization_rules or [])} if current else {}
    rules = []
    for rule in wanted:
        old = have.get(rule.key_name)
        if old is not None:
            rule = dataclasses.replace(
                rule,
                primary_key=rule.primary_key or old.primary_key,
                secondary_key=rule.secondary_key or old.secondary_key,
            )
        rules.append(rule)
    return {"authorization_rules": rules}


async def _get_entity(request: _Request) -> Response:
    name = "/".join(request.segments)
    try:
        entry = await _queue_entry(request, await request.admin.get_queue(name))
    except MessagingEntityNotFoundError:
        entry = await _topic_entry(request, await request.admin.get_topic(name))
    return _xml_response(200, "entry", entry)


async def _put_entity(request: _Request) -> Response:
    name = "/".join(request.segments)
    description = request.description()
    kind = local_name(description)
    admin = request.admin
    # Checked before anything changes; applied with the entity's settings.
    rules = models.authorization_rules(description)
    if kind == "QueueDescription":
        if request.is_update:
            current = await admin.get_queue(name)
            options = models.entity_options(description, current)
            props = await admin.update_queue(current, **options, **_access_rules(rules, current))
        else:
            options = models.entity_options(description)
            props = await admin.create_queue(name, **options, **_access_rules(rules))
        entry = await _queue_entry(request, props)
    elif kind == "TopicDescription":
        if request.is_update:
            now = await admin.get_topic(name)
            options = models.entity_options(description, now)
            topic = await admin.update_topic(now, **options, **_access_rules(rules, now))
        else:
            options = models.entity_options(description)
            topic = await admin.create_topic(name, **options, **_access_rules(rules))
        entry = await _topic_entry(request, topic)
    else:
        raise InvalidArgumentError(
            f"expected a QueueDescription or TopicDescription, not {kind!r}", name, "body"
        )
    return _xml_response(200 if request.is_update else 201, "entry", entry)


async def _delete_entity(request: _Request) -> Response:
    name = "/".join(request.segments)
    try:
        await request.admin.delete_queue(name)
    except MessagingEntityNotFoundError:
        await request.admin.delete_topic(name)
    return 200, {}, b""


async def _list_queues(request: _Request) -> Response:
    queues = await request.admin.list_queues()
    return await _paged(
        request, "Queues", queues, lambda q: _missing_is_none(_queue_entry(request, q))
    )


async def _list_topics(request: _Request) -> Response:
    topics = await request.admin.list_topics()
    return await _paged(
        request, "Topics", topics, lambda t: _missing_is_none(_topic_entry(request, t))
    )


async def _namespace_info(request: _Request) -> Response:
    # The broker checks the caller's Manage right, so the namespace is not told to anyone.
    props = await request.admin.get_namespace_properties()
    created = format_datetime(props.created_at_utc) if props.created_at_utc else ""
    modified = format_datetime(props.modified_at_utc) if props.modified_at_utc else ""
    info = el(
        "NamespaceInfo",
        el("CreatedTime", text=created) if created else "",
        el("MessagingSKU", text=props.messaging_sku),
        el("ModifiedTime", text=modified) if modified else "",
        el("Name", text=props.name),
        el("NamespaceType", text=props.namespace_type),
        attrs={"xmlns": SB_NS, "xmlns:i": XSI_NS},
    )
    entry = request.entry("$namespaceinfo", props.name, info, props.modified_at_utc)
    return _xml_response(200, "entry", entry)


# ------------------------------------------------------------------ subscriptions


async def _subscription_entry(request: _Request, topic: str, props: Any) -> str:
    runtime = await request.admin.get_subscription_runtime_properties(topic, props.name)
    content = models.subscription_description(props, runtime, request.host)
    path = f"{topic}/subscriptions/{props.name}"
    return request.entry(path, props.name, content, runtime.updated_at_utc)


async def _get_subscription(request: _Request) -> Response:
    topic, name, _ = _names(request)
    props = await request.admin.get_subscription(topic, name)
    return _xml_response(200, "entry", await _subscription_entry(request, topic, props))


async def _put_subscription(request: _Request) -> Response:
    topic, name, _ = _names(request)
    description = request.description()
    if local_name(description) != "SubscriptionDescription":
        raise InvalidArgumentError(
            f"expected a SubscriptionDescription, not {local_name(description)!r}", name, "body"
        )
    admin = request.admin
    if request.is_update:
        current = await admin.get_subscription(topic, name)
        props = await admin.update_subscription(
            topic, current, **models.entity_options(description, current)
        )
    else:
        props = await admin.create_subscription(
            topic,
            name,
            default_rule=models.default_rule(description),
            **models.entity_options(description),
        )
    entry = await _subscription_entry(request, topic, props)
    return _xml_response(200 if request.is_update else 201, "entry", entry)


async def _delete_subscription(request: _Request) -> Response:
    topic, name, _ = _names(request)
    await request.admin.delete_subscription(topic, name)
    return 200, {}, b""


async def _list_subscriptions(request: _Request) -> Response:
    topic = "/".join(request.segments[:-1])
    subs = await request.admin.list_subscriptions(topic)
    return await _paged(
        request,
        "Subscriptions",
        subs,
        lambda s: _missing_is_none(_subscription_entry(request, topic, s)),
    )


# ------------------------------------------------------------------ rules


def _rule_entry(request: _Request, topic: str, subscription: str, rule: Any) -> str:
    path = f"{topic}/subscriptions/{subscription}/rules/{rule.name}"
    return request.entry(path, rule.name, models.rule_description(rule), rule.created_at_utc)


async def _get_rule(request: _Request) -> Response:
    topic, sub, name = _names(request)
    rule = await request.admin.get_rule(topic, sub, name)
    return _xml_response(200, "entry", _rule_entry(request, topic, sub, rule))


async def _put_rule(request: _Request) -> Response:
    topic, sub, name = _names(request)
    # Compiled here, before anything changes: a bad filter is a 400 and the old rule stays.
    rule = models.rule_from_description(request.description(), name)
    admin = request.admin
    if request.is_update:  # in place, in one step: its position and creation time kept
        stored = await admin.update_rule(topic, sub, rule)
        return _xml_response(200, "entry", _rule_entry(request, topic, sub, stored))
    created = await admin.create_rule(topic, sub, name, filter=rule.filter, action=rule.action)
    return _xml_response(201, "entry", _rule_entry(request, topic, sub, created))


async def _delete_rule(request: _Request) -> Response:
    topic, sub, name = _names(request)
    await request.admin.delete_rule(topic, sub, name)
    return 200, {}, b""


async def _list_rules(request: _Request) -> Response:
    topic, sub, _ = _names(request)
    rules = await request.admin.list_rules(topic, sub)

    async def render(rule: Any) -> str:
        return _rule_entry(request, topic, sub, rule)

    return await _paged(request, "Rules", rules, render)
