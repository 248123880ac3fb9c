"""Fan-out to 100 subscriptions with mixed SQL and correlation rules and actions: every copy.

Heavy (100 subscription actors are 100 processes), so it runs under ``make fault``; the
integration suite covers 1 and 10 subscriptions.
"""

from __future__ import annotations

import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

import raybus
from raybus import ServiceBusMessage
from raybus.management import (
    CorrelationRuleFilter,
    RuleProperties,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
)

# 100 subscription actors are 100 worker processes starting on two cores: 174 s alone here,
# past the default 300 s timeout when CI runs beside it.
pytestmark = [pytest.mark.fault, pytest.mark.timeout(900)]

SUBSCRIPTIONS = 100
MESSAGES = 60


def _expected(i: int, sub: int) -> list[str | None]:
    """The copies subscription ``sub`` must get of message ``i`` (rule names, None = plain)."""
    kind = sub % 4
    if kind == 0:  # SQL filter, no action
        return [None] if i % 3 == sub % 3 else []
    if kind == 1:  # correlation filter on a property, no action
        return [None] if i % 5 == sub % 5 else []
    if kind == 2:  # $Default plus a rule with an action: two copies when the action matches
        return [None, "tagged"] if i % 2 == 0 else [None]
    return [None] if i >= MESSAGES // 2 else []  # SQL on a system property


def test_fan_out_to_100_subscriptions_delivers_every_expected_copy(ray_cluster: str) -> None:
    ns = f"fan100-{uuid.uuid4().hex[:6]}"
    admin = ServiceBusAdministrationClient(ns, storage_path="memory://")
    client = raybus.connect(ns)
    admin.create_topic("t")

    def create(sub: int) -> None:
        name = f"s{sub}"
        kind = sub % 4
        if kind == 0:
            rule = RuleProperties("r", SqlRuleFilter(f"n % 3 = {sub % 3}"))
        elif kind == 1:
            rule = RuleProperties("r", CorrelationRuleFilter(properties={"m5": sub % 5}))
        elif kind == 2:
            rule = None
        else:
            rule = RuleProperties("r", SqlRuleFilter("sys.Label = 'late'"))
        admin.create_subscription("t", name, default_rule=rule)
        if kind == 2:
            admin.create_rule(
                "t",
                name,
                "tagged",
                filter=SqlRuleFilter("n % 2 = 0"),
                action=SqlRuleAction("SET tag = 'even'"),
            )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(SUBSCRIPTIONS)))
    with client.get_topic_sender("t") as sender:
        sender.send_messages(
            [
                ServiceBusMessage(
                    str(i),
                    application_properties={"n": i, "m5": i % 5},
                    subject="late" if i >= MESSAGES // 2 else "early",
                )
                for i in range(MESSAGES)
            ]
        )

    def check(sub: int) -> None:
        got: Counter[tuple[int, str | None]] = Counter()
        with client.get_subscription_receiver("t", f"s{sub}", max_wait_time=2) as receiver:
            while True:
                batch = receiver.receive_messages(200)
                if not batch:
                    break
                for m in batch:
                    props = m.application_properties or {}
                    rule = props.get("RuleName")
                    if rule == "tagged":
                        assert props.get("tag") == "even"
                    got[(int(str(m)), rule)] += 1
                receiver.complete_messages(batch)
        want = Counter((i, r) for i in range(MESSAGES) for r in _expected(i, sub))
        assert got == want, f"subscription s{sub}"

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(check, range(SUBSCRIPTIONS)))
    admin.delete_topic("t")
