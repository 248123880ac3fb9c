"""Bad-input cases of messages, sending, entity names and queue settings (registered in
``bad_input_catalogue.CASES`` on import; run by ``test_bad_input_catalogue.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from bad_input_catalogue import (
    AE,
    ANY,
    CASES,
    FAR,
    IAE,
    MAIN,
    MISSING,
    NF,
    PROPS,
    SESS,
    SMALL,
    SUB_PATH,
    Case,
    Msg,
    simple,
)

from raybus import ServiceBusMessage
from raybus.exceptions import MessageNotFoundError, MessageSizeExceededError

# ----------------------------------------------------------------------------- messages

simple("body_set", IAE, "body", lambda e: Msg({1, 2}))
simple("body_object", IAE, "body", lambda e: Msg(object()))
simple("body_set_inside_list", IAE, "body[1]", lambda e: Msg([1, {2}]))
simple(
    "property_value_nested_dict",
    IAE,
    "application_properties['k']",
    lambda e: Msg("x", application_properties={"k": {"a": 1}}),
)
simple(
    "property_value_list",
    IAE,
    "application_properties['k']",
    lambda e: Msg("x", application_properties={"k": [1]}),
)
simple(
    "property_value_object",
    IAE,
    "application_properties['k']",
    lambda e: Msg("x", application_properties={"k": object()}),
)
simple(
    "property_value_int_overflow",
    IAE,
    "application_properties['k']",
    lambda e: Msg("x", application_properties={"k": 2**64}),
)
simple("property_key_int", IAE, PROPS, lambda e: Msg("x", application_properties={1: "v"}))
simple("properties_not_a_dict", IAE, PROPS, lambda e: Msg("x", application_properties=[("k", "v")]))
simple(
    "one_property_over_64k",
    MessageSizeExceededError,
    ANY,
    lambda e: Msg("x", application_properties={"k": "v" * 70_000}),
)
simple(
    "properties_total_over_64k",
    MessageSizeExceededError,
    ANY,
    lambda e: Msg("x", application_properties={f"k{i}": "v" * 10_000 for i in range(8)}),
)
simple("message_id_too_long", IAE, "message_id", lambda e: Msg("x", message_id="m" * 129))
simple("session_id_too_long", IAE, "session_id", lambda e: Msg("x", session_id="s" * 129))
simple("partition_key_too_long", IAE, "partition_key", lambda e: Msg("x", partition_key="p" * 129))
simple("message_id_empty", IAE, "message_id", lambda e: Msg("x", message_id=""))
simple("session_id_empty", IAE, "session_id", lambda e: Msg("x", session_id=""))
simple("message_id_not_str", IAE, "message_id", lambda e: Msg("x", message_id=5))
simple("ttl_negative", IAE, "time_to_live", lambda e: Msg("x", time_to_live=timedelta(seconds=-1)))
simple("ttl_zero", IAE, "time_to_live", lambda e: Msg("x", time_to_live=timedelta(0)))
simple("ttl_not_timedelta", IAE, "time_to_live", lambda e: Msg("x", time_to_live="1h"))
simple(
    "scheduled_time_not_datetime",
    IAE,
    "scheduled_enqueue_time_utc",
    lambda e: Msg("x", scheduled_enqueue_time_utc="tomorrow"),
)


def _mutated(e: SimpleNamespace) -> None:
    m = Msg("ok")
    m.application_properties = {"k": {1}}
    e.senders[MAIN].send_messages(m)


simple(
    "message_changed_after_construction_is_checked_at_send",
    IAE,
    "application_properties['k']",
    _mutated,
)


def _validated(e: SimpleNamespace) -> ServiceBusMessage:
    m = Msg("ok", application_properties={"a": 1})
    assert m.size_in_bytes > 0  # validated (and cached)
    return m


def _mutated_in_place(e: SimpleNamespace, m: ServiceBusMessage) -> None:
    assert m.application_properties is not None
    m.application_properties["k"] = object()
    e.senders[MAIN].send_messages(m)


CASES.append(
    Case(
        "properties_changed_in_place_are_checked_at_send",
        IAE,
        "application_properties['k']",
        _mutated_in_place,
        _validated,
    )
)

# ----------------------------------------------------------------------------- sending

simple(
    "partition_key_differs_from_session_id",
    IAE,
    "partition_key",
    lambda e: e.senders[SESS].send_messages(Msg("x", session_id="a", partition_key="b")),
)
simple(
    "body_over_queue_max_message_size",
    MessageSizeExceededError,
    ANY,
    lambda e: e.senders[SMALL].send_messages(Msg("x" * 2000)),
)
simple(
    "list_with_one_oversize_message_stores_nothing",
    MessageSizeExceededError,
    ANY,
    lambda e: e.senders[SMALL].send_messages([Msg("a"), Msg("b"), Msg("x" * 2000), Msg("c")]),
)
simple(
    "list_with_a_non_message_stores_nothing",
    IAE,
    "message",
    lambda e: e.senders[MAIN].send_messages([Msg("a"), "b"]),
)
simple("send_a_str", IAE, "message", lambda e: e.senders[MAIN].send_messages("hello"))
simple("send_a_dict", IAE, "message", lambda e: e.senders[MAIN].send_messages({"body": "x"}))
simple(
    "send_timeout_negative",
    IAE,
    "timeout",
    lambda e: e.senders[MAIN].send_messages(Msg("x"), timeout=-1),
)
simple(
    "send_to_unknown_queue",
    NF,
    ANY,
    lambda e: e.client.get_queue_sender(MISSING).send_messages(Msg("x")),
)
simple(
    "send_to_unknown_topic",
    NF,
    ANY,
    lambda e: e.client.get_topic_sender(MISSING).send_messages(Msg("x")),
)
simple(
    "send_to_a_subscription_path",
    IAE,
    "entity",
    lambda e: e.client.get_queue_sender(SUB_PATH).send_messages(Msg("x")),
)


def _batch_over(e: SimpleNamespace, _s: Any) -> None:
    batch = e.senders[SMALL].create_message_batch()
    batch.add_message(Msg("small"))
    e.batch = batch
    batch.add_message(Msg("x" * 2000))


def _batch_unchanged(e: SimpleNamespace, _s: Any) -> None:
    assert len(e.batch) == 1


CASES.append(
    Case(
        "batch_add_over_the_limit_leaves_batch_unchanged",
        MessageSizeExceededError,
        ANY,
        _batch_over,
        after=_batch_unchanged,
    )
)
simple(
    "batch_max_size_above_queue_limit",
    IAE,
    "max_size_in_bytes",
    lambda e: e.senders[SMALL].create_message_batch(10**9),
)
simple(
    "batch_max_size_zero",
    IAE,
    "max_size_in_bytes",
    lambda e: e.senders[MAIN].create_message_batch(0),
)
simple(
    "batch_add_a_str",
    IAE,
    "message",
    lambda e: e.senders[MAIN].create_message_batch().add_message("x"),
)
simple(
    "schedule_time_is_a_str",
    IAE,
    "schedule_time_utc",
    lambda e: e.senders[MAIN].schedule_messages(Msg("x"), "2030-01-01"),
)
simple(
    "schedule_time_is_a_number",
    IAE,
    "schedule_time_utc",
    lambda e: e.senders[MAIN].schedule_messages(Msg("x"), 1_900_000_000.0),
)
simple(
    "cancel_negative_sequence_number",
    IAE,
    "sequence_numbers",
    lambda e: e.senders[MAIN].cancel_scheduled_messages(-1),
)
simple(
    "cancel_str_sequence_number",
    IAE,
    "sequence_numbers",
    lambda e: e.senders[MAIN].cancel_scheduled_messages(["1"]),
)


def _schedule_one(e: SimpleNamespace) -> int:
    (seq,) = e.senders[MAIN].schedule_messages(Msg("later"), FAR)
    return seq


def _cancel_ok(e: SimpleNamespace, seq: int) -> None:
    e.senders[MAIN].cancel_scheduled_messages([seq])


CASES.append(
    Case(
        "cancel_known_and_unknown_numbers_cancels_none",
        MessageNotFoundError,
        ANY,
        lambda e, seq: e.senders[MAIN].cancel_scheduled_messages([seq, seq + 10_000_000]),
        _schedule_one,
        _cancel_ok,
    )
)

# ----------------------------------------------------------------------------- entity names

simple("create_queue_empty_name", IAE, "name", lambda e: e.admin.create_queue(""))
simple("create_queue_name_too_long", IAE, "name", lambda e: e.admin.create_queue("a" * 261))
simple("create_queue_name_bad_characters", IAE, "name", lambda e: e.admin.create_queue("bad name!"))
simple("create_queue_name_leading_dash", IAE, "name", lambda e: e.admin.create_queue("-abc"))
simple("create_queue_name_empty_segment", IAE, "name", lambda e: e.admin.create_queue("a//b"))
simple(
    "create_queue_reserved_suffix",
    IAE,
    "name",
    lambda e: e.admin.create_queue("orders/$DeadLetterQueue"),
)
simple("create_queue_name_not_a_str", IAE, "name", lambda e: e.admin.create_queue(42))
simple("get_queue_unknown", NF, ANY, lambda e: e.admin.get_queue(MISSING))
simple("delete_queue_unknown", NF, ANY, lambda e: e.admin.delete_queue(MISSING))
simple(
    "runtime_properties_unknown_queue",
    NF,
    ANY,
    lambda e: e.admin.get_queue_runtime_properties(MISSING),
)
simple("create_queue_duplicate", AE, ANY, lambda e: e.admin.create_queue(MAIN))
simple("create_queue_duplicate_other_case", AE, ANY, lambda e: e.admin.create_queue(MAIN.upper()))
simple("receiver_for_empty_name", IAE, "name", lambda e: e.client.get_queue_receiver(""))
simple("sender_for_non_str_name", IAE, "name", lambda e: e.client.get_queue_sender(5))
simple(
    "receive_from_unknown_queue",
    NF,
    ANY,
    lambda e: e.client.get_queue_receiver(MISSING, max_wait_time=1).receive_messages(),
)

# ----------------------------------------------------------------------------- queue settings

# (case name, the refused option, its bad value): each creates "cat-x" with that one option, and
# the error must name the option. A table rather than one ``simple`` call each: the calls differed
# only in these three values.
_BAD_QUEUE_OPTIONS: list[tuple[str, str, object]] = [
    ("lock_duration_zero", "lock_duration", timedelta(0)),
    ("lock_duration_over_5_minutes", "lock_duration", timedelta(minutes=6)),
    ("lock_duration_a_str", "lock_duration", "60s"),
    ("max_delivery_count_zero", "max_delivery_count", 0),
    ("max_delivery_count_a_str", "max_delivery_count", "10"),
    ("partition_count_zero", "partition_count", 0),
    ("partition_count_65", "partition_count", 65),
    ("default_ttl_negative", "default_message_time_to_live", timedelta(seconds=-5)),
    ("dedup_window_too_short", "duplicate_detection_history_time_window", timedelta(seconds=5)),
    ("dedup_window_too_long", "duplicate_detection_history_time_window", timedelta(days=8)),
    ("max_message_size_zero", "max_message_size_in_kilobytes", 0),
    ("requires_session_a_str", "requires_session", "yes"),
    ("status_unknown", "status", "Sleeping"),
    ("unknown_queue_option", "colour", "red"),
    ("forward_to_bad_name", "forward_to", "bad name!"),
]


def _create_queue_with(option: str, value: object) -> Callable[[SimpleNamespace], object]:
    return lambda e: e.admin.create_queue("cat-x", **{option: value})


for _name, _option, _value in _BAD_QUEUE_OPTIONS:
    simple(_name, IAE, _option, _create_queue_with(_option, _value))


def _update_queue_with(option: str, value: object) -> Callable[[SimpleNamespace], object]:
    return lambda e: e.admin.update_queue(e.admin.get_queue(MAIN), **{option: value})


# The same for update_queue on the module's queue: one bad option each.
for _name, _option, _value in [
    ("update_queue_lock_duration_zero", "lock_duration", timedelta(0)),
    ("update_queue_requires_session", "requires_session", True),
    ("update_queue_unknown_option", "colour", "red"),
]:
    simple(_name, IAE, _option, _update_queue_with(_option, _value))
simple("update_queue_not_properties", IAE, "queue", lambda e: e.admin.update_queue(MAIN))
simple(
    "wait_for_partitions_timeout_zero",
    IAE,
    "timeout",
    lambda e: e.admin.wait_for_partitions(MAIN, timeout=0),
)
