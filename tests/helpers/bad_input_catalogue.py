"""The frame of the bad-input catalogue (``tests/integration/test_bad_input_catalogue.py``):
the module's entities (``env``), what a rejected call must leave unchanged (``state_of``), and
``case``/``simple``, which register a bad operation in ``CASES``. The cases themselves are in
``bad_input_cases_io`` and ``bad_input_cases_settle``; importing those fills ``CASES``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

import raybus
from raybus import ServiceBusMessage, aio
from raybus._core.record import snapshot
from raybus.enums import ServiceBusReceiveMode
from raybus.exceptions import (
    InvalidArgumentError,
    MessagingEntityAlreadyExistsError,
    MessagingEntityNotFoundError,
)
from raybus.management import ServiceBusAdministrationClient
from raybus.message import ServiceBusReceivedMessage

MAIN = "cat-main"
OTHER = "cat-other"
SMALL = "cat-small"  # max_message_size_in_kilobytes=1
SESS = "cat-sess"  # requires_session
TOPIC = "cat-topic"
SUB = "sub1"
SUB_PATH = f"{TOPIC}/Subscriptions/{SUB}"
MISSING = "cat-missing"
QUEUES = (MAIN, OTHER, SMALL, SESS)
FAR = datetime.now(UTC) + timedelta(days=30)


@pytest.fixture
def namespace(module_namespace: str) -> str:
    return module_namespace


@pytest.fixture(scope="module")
def env(module_namespace: str) -> Iterator[SimpleNamespace]:
    admin = ServiceBusAdministrationClient(module_namespace)
    admin.create_queue(MAIN)
    admin.create_queue(OTHER)
    admin.create_queue(SMALL, max_message_size_in_kilobytes=1)
    admin.create_queue(SESS, requires_session=True)
    admin.create_topic(TOPIC)
    admin.create_subscription(TOPIC, SUB)
    client = raybus.ServiceBusClient(module_namespace)
    e = SimpleNamespace(
        ns=module_namespace,
        admin=admin,
        client=client,
        senders={q: client.get_queue_sender(q) for q in (MAIN, OTHER, SMALL, SESS)},
        receivers={q: client.get_queue_receiver(q, max_wait_time=5) for q in (MAIN, OTHER)},
        rad=client.get_queue_receiver(
            MAIN, max_wait_time=5, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ),
    )
    try:
        yield e
    finally:
        client.close()
        try:
            admin.delete_topic(TOPIC)
        except Exception:
            pass


def state_of(e: SimpleNamespace) -> dict[str, Any]:
    """Everything a rejected call must leave unchanged."""
    out: dict[str, Any] = {}
    for q in QUEUES:
        p = e.admin.get_queue_runtime_properties(q)
        out[q] = (p.active_message_count, p.dead_letter_message_count, p.scheduled_message_count)
    s = e.admin.get_subscription_runtime_properties(TOPIC, SUB)
    out[SUB_PATH] = (s.active_message_count, s.dead_letter_message_count)
    out["queues"] = sorted(q.name for q in e.admin.list_queues())
    out["topics"] = sorted(t.name for t in e.admin.list_topics())
    out["subs"] = sorted(s.name for s in e.admin.list_subscriptions(TOPIC))
    out["rules"] = sorted(r.name for r in e.admin.list_rules(TOPIC, SUB))
    main = e.admin.get_queue(MAIN)
    out["main-settings"] = (main.lock_duration, main.max_delivery_count, main.partition_count)
    return out


def fresh(e: SimpleNamespace, queue: str = MAIN) -> ServiceBusReceivedMessage:
    """Send a new message to ``queue`` and receive it under a peek-lock (stale ones are
    completed on the way)."""
    mid = uuid.uuid4().hex
    e.senders[queue].send_messages(ServiceBusMessage("fresh", message_id=mid))
    receiver = e.receivers[queue]
    for _ in range(20):
        for m in receiver.receive_messages(max_message_count=10, max_wait_time=5):
            if m.message_id == mid:
                return m
            receiver.complete_messages([m])
    raise AssertionError("the fresh message never arrived")


def settle_ok(e: SimpleNamespace, m: ServiceBusReceivedMessage, queue: str = MAIN) -> None:
    """A valid settlement of the same message still succeeds (it was left where it was)."""
    e.receivers[queue].complete_messages([m])


def forged(m: ServiceBusReceivedMessage) -> ServiceBusReceivedMessage:
    record = snapshot(m._record)
    record.lock_token = str(uuid.uuid4())
    return ServiceBusReceivedMessage(record, entity=m._entity, kind="locked")


def arun(fn: Callable[[aio.ServiceBusClient, aio.ServiceBusAdministrationClient], Any], ns: str):
    async def main() -> None:
        client = aio.ServiceBusClient(ns)
        try:
            await fn(client, aio.ServiceBusAdministrationClient(ns))
        finally:
            await client.close()

    asyncio.run(main())


ANY = object()


@dataclasses.dataclass
class Case:
    name: str
    exc: type[BaseException]
    argument: Any
    bad: Callable[[SimpleNamespace, Any], object]
    setup: Callable[[SimpleNamespace], Any] | None = None
    after: Callable[[SimpleNamespace, Any], None] | None = None
    mentions: str | None = None  # what the text must name (default: the argument)


CASES: list[Case] = []


def case(
    name: str,
    exc: type[BaseException],
    argument: Any = ANY,
    *,
    setup: Callable[[SimpleNamespace], Any] | None = None,
    after: Callable[[SimpleNamespace, Any], None] | None = None,
) -> Callable[[Callable[[SimpleNamespace, Any], object]], Callable[[SimpleNamespace, Any], object]]:
    def deco(
        fn: Callable[[SimpleNamespace, Any], object],
    ) -> Callable[[SimpleNamespace, Any], object]:
        CASES.append(Case(name, exc, argument, fn, setup, after))
        return fn

    return deco


def simple(
    name: str,
    exc: type[BaseException],
    argument: Any,
    bad: Callable[[SimpleNamespace], object],
    mentions: str | None = None,
) -> None:
    CASES.append(Case(name, exc, argument, lambda e, _s: bad(e), mentions=mentions))


Msg = ServiceBusMessage
IAE = InvalidArgumentError
NF = MessagingEntityNotFoundError
AE = MessagingEntityAlreadyExistsError
PROPS = "application_properties"
MODIFY = "properties_to_modify"
