"""Fixtures and helpers of the topic suites (``test_topics*.py``), against a real local Ray cluster.

Cost: every subscription of one partition is one Ray actor (a worker process, ~0.8 s to
start) and every topic has a router actor, so the tests of a module share one raybus namespace
(one registry, one coordinator) and, unless they change the topic itself, one topic (``topic``);
they keep to a few subscriptions each, and what a test created is deleted after it (its actors
go away). The 100-subscription case is in ``benchmarks/topics.py``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import ray

import raybus
from raybus import ServiceBusReceiveMode, ServiceBusSubQueue, aio
from raybus.exceptions import ServiceBusError
from raybus.management import ServiceBusAdministrationClient

DLQ = ServiceBusSubQueue.DEAD_LETTER
RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE
RULE_NAME = "RuleName"


@pytest.fixture(scope="module")
def namespace(module_namespace: str) -> Iterator[str]:
    # One namespace for the module (see ``module_namespace`` in conftest); every test uses its
    # own uniquely named topics.
    yield module_namespace
    # The coordinator actor (detached; used by publishes spanning several partitions) is not
    # one the shared fixtures know about.
    from raybus._actors.coordinator import coordinator_actor_name

    try:
        actor = ray.get_actor(coordinator_actor_name(module_namespace), namespace="raybus")
        ray.kill(actor, no_restart=True)
    except Exception:  # never created
        pass


SHARED_PREFIX = "shared-"


@pytest.fixture(autouse=True)
def _delete_topics(namespace: str) -> Iterator[None]:
    """Delete the topics a test created (with their subscriptions' and routers' actors): the
    shared fixtures only know about queues."""
    yield
    admin = ServiceBusAdministrationClient(namespace)
    try:
        topics = admin.list_topics()
    except ServiceBusError:
        return
    for topic in topics:
        if topic.name.startswith(SHARED_PREFIX):
            continue
        try:
            admin.delete_topic(topic.name)
        except ServiceBusError:
            pass


@pytest.fixture(scope="module")
def shared_topic(namespace: str) -> Iterator[str]:
    name = f"{SHARED_PREFIX}{uuid.uuid4().hex[:8]}"
    admin = ServiceBusAdministrationClient(namespace)
    admin.create_topic(name)
    yield name
    try:
        admin.delete_topic(name)
    except ServiceBusError:
        pass


@pytest.fixture
def topic(shared_topic: str, admin: ServiceBusAdministrationClient) -> Iterator[str]:
    """A topic with default settings and no subscription: the module's, whose router actor
    the tests share (a router is a worker process). Each test creates its own subscriptions,
    deleted after it; a subscription only gets what is published while it exists, so the
    tests do not see each other's messages. Tests that change the topic itself (status,
    size, deletion, its router) create their own."""
    _delete_subscriptions(admin, shared_topic)  # left by a test that failed to clean up
    yield shared_topic
    _delete_subscriptions(admin, shared_topic)


def _delete_subscriptions(admin: ServiceBusAdministrationClient, topic: str) -> None:
    for sub in admin.list_subscriptions(topic):
        try:
            admin.delete_subscription(topic, sub.name)
        except ServiceBusError:
            pass


def _name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _counts(admin: ServiceBusAdministrationClient, topic: str, sub: str) -> tuple[int, int]:
    """(active, dead-lettered) messages of a subscription."""
    props = admin.get_subscription_runtime_properties(topic, sub)
    return props.active_message_count, props.dead_letter_message_count


async def _acounts(
    aadmin: aio.ServiceBusAdministrationClient, topic: str, sub: str
) -> tuple[int, int]:
    props = await aadmin.get_subscription_runtime_properties(topic, sub)
    return props.active_message_count, props.dead_letter_message_count


def _drain(
    client: raybus.ServiceBusClient,
    topic: str,
    sub: str,
    n: int,
    *,
    sub_queue: ServiceBusSubQueue | None = None,
    timeout: float = 30.0,
) -> list[raybus.ServiceBusReceivedMessage]:
    """Receive (and delete) exactly ``n`` messages of a subscription, then check it has no
    more."""
    got: list[raybus.ServiceBusReceivedMessage] = []
    with client.get_subscription_receiver(
        topic, sub, sub_queue=sub_queue, receive_mode=RAD, max_wait_time=5
    ) as receiver:
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            got.extend(receiver.receive_messages(max_message_count=n - len(got), max_wait_time=5))
        assert len(got) == n, f"{topic}/{sub}: {len(got)} of {n} messages arrived"
        assert receiver.receive_messages(max_message_count=10, max_wait_time=0.2) == []
    return got


async def _adrain(
    aclient: aio.ServiceBusClient,
    topic: str,
    sub: str,
    n: int,
    *,
    sub_queue: ServiceBusSubQueue | None = None,
    timeout: float = 30.0,
) -> list[raybus.ServiceBusReceivedMessage]:
    got: list[raybus.ServiceBusReceivedMessage] = []
    async with aclient.get_subscription_receiver(
        topic, sub, sub_queue=sub_queue, receive_mode=RAD, max_wait_time=5
    ) as receiver:
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            got.extend(await receiver.receive_messages(n - len(got), max_wait_time=5))
        assert len(got) == n, f"{topic}/{sub}: {len(got)} of {n} messages arrived"
        assert await receiver.receive_messages(10, max_wait_time=0.2) == []
    return got


def _bodies(msgs: list[raybus.ServiceBusReceivedMessage]) -> list[Any]:
    return [m.body for m in msgs]


def _props(msg: raybus.ServiceBusReceivedMessage) -> dict[str, Any]:
    return dict(msg.application_properties or {})


def _rule_names(admin: ServiceBusAdministrationClient, topic: str, sub: str) -> list[str]:
    return [r.name for r in admin.list_rules(topic, sub)]
