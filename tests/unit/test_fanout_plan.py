"""``raybus._core.fanout.plan``: which copies each subscription gets, and which are shared."""

from __future__ import annotations

from datetime import timedelta

from raybus._core.fanout import RULE_NAME_PROPERTY, Target, plan
from raybus._core.filters import (
    CorrelationRuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from raybus._core.partition import Partition
from raybus._core.record import ARRIVE_DEAD_LETTERED, MessageRecord
from raybus._models import QueueProperties
from raybus.testing import FakeClock


def _rec(i: int, **props: object) -> MessageRecord:
    return MessageRecord(body=f"m{i}".encode(), message_id=f"m{i}", application_properties=props)


def test_unchanged_copies_are_the_published_record_in_every_subscription() -> None:
    recs = [_rec(i) for i in range(3)]
    targets = [
        Target(f"s{i}", f"t/subscriptions/s{i}", (RuleProperties("all", TrueRuleFilter()),))
        for i in range(4)
    ]

    out = plan(targets, recs)

    assert list(out) == [t.path for t in targets]
    for copies in out.values():
        assert [id(c) for c in copies] == [id(r) for r in recs]


def test_copies_changed_by_an_action_are_new_records_and_leave_the_original_alone() -> None:
    rec = _rec(1, color="red")
    target = Target(
        "s",
        "t/subscriptions/s",
        (
            RuleProperties("plain", TrueRuleFilter()),
            RuleProperties("tag", TrueRuleFilter(), SqlRuleAction("SET user.tagged = 1")),
        ),
    )

    (copies,) = plan([target], [rec]).values()

    assert copies[0] is rec
    assert copies[1] is not rec
    assert copies[1].application_properties == {
        "color": "red",
        "tagged": 1,
        RULE_NAME_PROPERTY: "tag",
    }
    assert rec.application_properties == {"color": "red"}


def test_a_filter_error_dead_letters_a_copy_not_the_published_record() -> None:
    rec = _rec(1, n="text")
    bad = Target(
        "s", "t/subscriptions/s", (RuleProperties("bad", SqlRuleFilter("user.n + 1 > 0")),)
    )
    plain = Target("p", "t/subscriptions/p", (RuleProperties("all", TrueRuleFilter()),))

    out = plan([bad, plain], [rec])

    (dead,) = out[bad.path]
    assert dead is not rec and dead.state == ARRIVE_DEAD_LETTERED
    assert out[plain.path] == [rec] and out[plain.path][0] is rec
    assert rec.state != ARRIVE_DEAD_LETTERED


def test_subscriptions_selecting_nothing_get_no_entry() -> None:
    target = Target(
        "s", "t/subscriptions/s", (RuleProperties("c", CorrelationRuleFilter(label="x")),)
    )
    assert plan([target], [_rec(1)]) == {}


def test_a_duplicate_detecting_subscription_keeps_each_rules_copy_once() -> None:
    # Service Bus detects duplicates at the topic, before the rules: every matching rule with an
    # action gives its copy, and an action that sets the message id makes no duplicates of
    # other messages' copies. A subscription's store detects them on each rule's copy of the
    # published message (``copy_of``), so a message published again adds nothing.
    target = Target(
        "s",
        "t/Subscriptions/s",
        (
            RuleProperties("plain", TrueRuleFilter()),
            RuleProperties("one", TrueRuleFilter(), SqlRuleAction("SET tag = 'one'")),
            RuleProperties("two", TrueRuleFilter(), SqlRuleAction("SET tag = 'two'")),
            RuleProperties("same", TrueRuleFilter(), SqlRuleAction("SET sys.MessageId = 'same'")),
        ),
    )
    store = Partition(
        QueueProperties(
            "t/Subscriptions/s",
            requires_duplicate_detection=True,
            duplicate_detection_history_time_window=timedelta(minutes=10),
        ),
        FakeClock(),
    )

    def publish(*ids: int) -> None:
        (copies,) = plan([target], [_rec(i) for i in ids]).values()
        store.send(copies)

    publish(1, 2)
    held = store.peek(0, 100)
    assert len(held) == 8  # four copies of each message
    tags = sorted(
        (r.message_id or "", str((r.application_properties or {}).get("tag"))) for r in held
    )
    assert tags == [
        ("m1", "None"),
        ("m1", "one"),
        ("m1", "two"),
        ("m2", "None"),
        ("m2", "one"),
        ("m2", "two"),
        ("same", "None"),
        ("same", "None"),
    ]
    publish(2, 1)  # again: every copy a duplicate
    publish(3)
    assert len(store.peek(0, 100)) == 12
