"""Sending to one ``Partition``: sequence numbers, size and quota checks, entity status and
duplicate detection (spec §1.2, §1.6, §1.11)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from raybus._core.partition import COMPLETE, DEAD_LETTER
from raybus.enums import EntityStatus
from raybus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    ServiceBusQuotaExceededError,
)


def with_status(p, status):
    p.update_properties(dataclasses.replace(p.properties, status=status))


# ---------------------------------------------------------------- sequence numbers


def test_sequence_numbers_start_at_one_and_increase_by_one(make_partition, msg):
    p = make_partition()
    first = p.send([msg(message_id=f"a{i}") for i in range(3)])
    second = p.send([msg(message_id="b")])
    third = p.send([msg(message_id=f"c{i}") for i in range(2)])
    assert first + second + third == [1, 2, 3, 4, 5, 6]


def test_sequence_numbers_are_assigned_to_the_records(make_partition, msg):
    p = make_partition()
    p.send([msg(), msg()])
    assert [(r.sequence_number, r.enqueued_sequence_number) for r in p.peek(0, 10)] == [
        (1, 1),
        (2, 2),
    ]


def test_sequence_numbers_carry_partition_id_above_bit_48(make_partition, msg):
    p = make_partition(partition_id=3)
    seqs = p.send([msg(), msg(), msg()])
    base = 3 << 48
    assert seqs == [base + 1, base + 2, base + 3]
    assert all(s >> 48 == 3 for s in seqs)


def test_sequence_numbers_are_not_reused_after_settlement(make_partition, msg, settle):
    p = make_partition()
    p.send([msg()])
    [rec] = p.receive(1)
    settle(p, COMPLETE, rec.lock_token)
    assert p.send([msg()]) == [2]


def test_empty_batch_stores_nothing(make_partition, msg):
    p = make_partition()
    assert p.send([]) == []
    assert p.send([msg()]) == [1]


# ---------------------------------------------------------------- size and quota


def test_batch_with_one_oversize_message_raises_and_stores_nothing(make_partition, msg):
    p = make_partition(max_message_size_in_kilobytes=1)
    p.send([msg(message_id="before")])
    counts = p.counts()
    big = msg(body=b"x" * 2000, message_id="big")
    assert big.size > 1024
    batch = [msg(message_id="ok1"), big, msg(message_id="ok2")]
    with pytest.raises(MessageSizeExceededError) as info:
        p.send(batch)
    assert info.value.size == big.size
    assert info.value.max_size == 1024
    assert p.counts() == counts
    assert [r.message_id for r in p.peek(0, 10)] == ["before"]
    assert p.send([msg(message_id="after")]) == [2]


def test_message_exactly_at_the_size_limit_is_accepted(make_partition, msg):
    p = make_partition(max_message_size_in_kilobytes=1)
    probe = msg(body=b"")
    exact = msg(body=b"x" * (1024 - probe.size))
    assert exact.size == 1024
    assert p.send([exact]) == [1]


def test_send_beyond_max_size_raises_quota_exceeded_and_stores_nothing(make_partition, msg):
    p = make_partition(max_size_in_megabytes=1)
    limit = 1024 * 1024
    chunk = 200_000
    stored = 0
    seqs = []
    while stored + msg(body=b"x" * chunk).size <= limit:
        rec = msg(body=b"x" * chunk)
        seqs += p.send([rec])
        stored += rec.size
    assert p.counts().size_in_bytes == stored
    counts = p.counts()
    small = msg(body=b"tiny")
    overflow = msg(body=b"x" * chunk)
    with pytest.raises(ServiceBusQuotaExceededError) as info:
        p.send([small, overflow])
    assert info.value.max_size == limit
    assert info.value.size > limit
    assert p.counts() == counts
    assert len(p.peek(0, 100)) == len(seqs)
    # Making room lets the next send in, with the next gap-free sequence number.
    assert len(p.receive(1, delete=True)) == 1
    assert p.send([msg(body=b"x" * chunk)]) == [seqs[-1] + 1]


def test_dead_lettered_messages_count_toward_the_quota(make_partition, msg, settle):
    p = make_partition(max_size_in_megabytes=1)
    p.send([msg(body=b"x" * 250_000) for _ in range(4)])
    for rec in p.receive(4):
        settle(p, DEAD_LETTER, rec.lock_token)
    assert p.counts().dead_letter == 4
    with pytest.raises(ServiceBusQuotaExceededError):
        p.send([msg(body=b"x" * 250_000)])


# ---------------------------------------------------------------- status


@pytest.mark.parametrize("status", [EntityStatus.DISABLED, EntityStatus.SEND_DISABLED])
def test_send_to_send_disabled_queue_raises_entity_disabled_and_keeps_messages(
    make_partition, msg, status
):
    p = make_partition()
    p.send([msg(message_id="kept")])
    with_status(p, status)
    with pytest.raises(MessagingEntityDisabledError) as info:
        p.send([msg(message_id="refused")])
    assert info.value.status == status.value
    assert p.counts().active == 1
    assert [r.message_id for r in p.peek(0, 10)] == ["kept"]


def test_send_disabled_queue_still_allows_receive(make_partition, msg, settle):
    p = make_partition()
    p.send([msg()])
    with_status(p, EntityStatus.SEND_DISABLED)
    [rec] = p.receive(1)
    assert settle(p, COMPLETE, rec.lock_token) is None


@pytest.mark.parametrize("status", [EntityStatus.DISABLED, EntityStatus.RECEIVE_DISABLED])
def test_receive_disabled_queue_rejects_receive_and_settle(make_partition, msg, settle, status):
    p = make_partition()
    p.send([msg(), msg()])
    [rec] = p.receive(1)
    with_status(p, status)
    with pytest.raises(MessagingEntityDisabledError) as info:
        p.receive(1)
    assert info.value.status == status.value
    with pytest.raises(MessagingEntityDisabledError):
        p.receive_deferred([1])
    err = settle(p, COMPLETE, rec.lock_token)
    assert isinstance(err, MessagingEntityDisabledError)
    assert err.status == status.value
    assert p.counts().active == 2


def test_receive_disabled_queue_allows_send(make_partition, msg):
    p = make_partition()
    with_status(p, EntityStatus.RECEIVE_DISABLED)
    assert p.send([msg()]) == [1]
    assert p.counts().active == 1


def test_peek_is_allowed_on_disabled_queue(make_partition, msg):
    p = make_partition()
    p.send([msg(message_id="x")])
    with_status(p, EntityStatus.DISABLED)
    assert [r.message_id for r in p.peek(0, 10)] == ["x"]


def test_update_properties_back_to_active_reenables_send_and_receive(make_partition, msg, settle):
    p = make_partition()
    p.send([msg(message_id="first")])
    [rec] = p.receive(1)
    with_status(p, EntityStatus.DISABLED)
    with pytest.raises(MessagingEntityDisabledError):
        p.send([msg()])
    with_status(p, EntityStatus.ACTIVE)
    assert p.send([msg(message_id="second")]) == [2]
    assert settle(p, COMPLETE, rec.lock_token) is None
    [second] = p.receive(1)
    assert second.message_id == "second"


def test_rejected_send_does_not_consume_sequence_numbers(make_partition, msg):
    p = make_partition()
    p.send([msg()])
    with_status(p, EntityStatus.SEND_DISABLED)
    with pytest.raises(MessagingEntityDisabledError):
        p.send([msg(), msg()])
    with_status(p, EntityStatus.ACTIVE)
    assert p.send([msg()]) == [2]


# ---------------------------------------------------------------- duplicate detection


def dedup_queue(make_partition, window=timedelta(minutes=10)):
    return make_partition(
        requires_duplicate_detection=True, duplicate_detection_history_time_window=window
    )


def test_duplicate_message_id_within_window_is_dropped_and_reports_original_seq(
    make_partition, msg
):
    p = dedup_queue(make_partition)
    [first] = p.send([msg(body=b"one", message_id="order-1")])
    [again] = p.send([msg(body=b"two", message_id="order-1")])
    assert again == first
    assert p.counts().active == 1
    [stored] = p.peek(0, 10)
    assert stored.body == b"one"
    # The dropped duplicate consumed no sequence number.
    assert p.send([msg(message_id="order-2")]) == [first + 1]


def test_duplicate_is_dropped_even_after_the_original_was_completed(
    make_partition, msg, clock, settle
):
    p = dedup_queue(make_partition)
    [first] = p.send([msg(message_id="once")])
    [rec] = p.receive(1)
    settle(p, COMPLETE, rec.lock_token)
    clock.advance(60)
    assert p.send([msg(message_id="once")]) == [first]
    assert p.counts().active == 0


def test_duplicates_inside_one_batch_are_dropped(make_partition, msg):
    p = dedup_queue(make_partition)
    seqs = p.send(
        [msg(message_id="a"), msg(message_id="b"), msg(message_id="a"), msg(message_id="a")]
    )
    assert seqs == [1, 2, 1, 1]
    assert [r.message_id for r in p.peek(0, 10)] == ["a", "b"]


def test_duplicate_quota_check_counts_only_new_messages(make_partition, msg):
    p = make_partition(requires_duplicate_detection=True, max_size_in_megabytes=1)
    p.send([msg(body=b"x" * 200_000, message_id=f"m{i}") for i in range(5)])
    # Resending the same five ids adds no bytes, so it does not hit the 1 MiB quota.
    seqs = p.send([msg(body=b"x" * 200_000, message_id=f"m{i}") for i in range(5)])
    assert seqs == [1, 2, 3, 4, 5]


def test_message_id_is_accepted_again_after_the_dedup_window(make_partition, msg, clock):
    window = 20.0
    p = dedup_queue(make_partition, timedelta(seconds=window))
    [first] = p.send([msg(message_id="x")])
    clock.advance(window - 1)
    assert p.send([msg(message_id="x")]) == [first]
    clock.advance(2)
    [second] = p.send([msg(message_id="x")])
    assert second == first + 1
    assert p.counts().active == 2


def test_dedup_window_runs_from_the_original_not_the_duplicate(make_partition, msg, clock):
    p = dedup_queue(make_partition, timedelta(seconds=20))
    p.send([msg(message_id="x")])
    clock.advance(15)
    p.send([msg(message_id="x")])  # dropped; does not restart the window
    clock.advance(6)
    assert p.send([msg(message_id="x")]) == [2]


def test_messages_without_message_id_are_never_deduplicated(make_partition, msg):
    p = dedup_queue(make_partition)
    assert p.send([msg(), msg()]) == [1, 2]


def test_without_duplicate_detection_repeated_ids_are_all_stored(make_partition, msg):
    p = make_partition()
    seqs = p.send([msg(message_id="same"), msg(message_id="same")])
    seqs += p.send([msg(message_id="same")])
    assert seqs == [1, 2, 3]
    assert p.counts().active == 3


def test_duplicates_are_keyed_on_the_message_id_and_the_key_that_places_it(make_partition, msg):
    # Service Bus keys a partitioned entity's duplicates on MessageId + PartitionKey (the
    # session id being the partition key): the same id with another key is another message,
    # in whichever partition its key lands.
    p = dedup_queue(make_partition)
    first = p.send(
        [
            msg(body=b"a", message_id="m", partition_key="k1"),
            msg(body=b"b", message_id="m", partition_key="k2"),
            msg(body=b"c", message_id="m", session_id="s1"),
            msg(body=b"d", message_id="m"),
        ]
    )
    assert len(set(first)) == 4
    again = p.send(
        [
            msg(body=b"e", message_id="m", partition_key="k2"),
            msg(body=b"f", message_id="m", session_id="s1", partition_key="s1"),
            msg(body=b"g", message_id="m"),
            msg(body=b"h", message_id="m", partition_key="k1"),
        ]
    )
    assert again == [first[1], first[2], first[3], first[0]]
    assert sorted(r.body for r in p.peek(0, 10)) == [b"a", b"b", b"c", b"d"]


def test_rejected_batch_does_not_register_its_message_ids(make_partition, msg):
    p = make_partition(requires_duplicate_detection=True, max_message_size_in_kilobytes=1)
    with pytest.raises(MessageSizeExceededError):
        p.send([msg(message_id="small"), msg(body=b"x" * 2000, message_id="big")])
    assert p.send([msg(message_id="small")]) == [1]
    assert p.counts().active == 1


def test_a_forwarded_dead_letter_keeps_its_reason_and_others_arrive_without_one(
    make_partition, msg
):
    # The forwarder sends a dead letter on with its source; Service Bus keeps its reason and
    # description (application properties there). Anything else arrives with none.
    p = make_partition()
    forwarded = msg(message_id="f")
    forwarded.dead_letter_source = "orders-in"
    forwarded.dead_letter_reason, forwarded.dead_letter_error_description = "bad", "why"
    plain = msg(message_id="p")
    plain.dead_letter_reason, plain.dead_letter_error_description = "stale", "left over"
    p.send([forwarded, plain])
    got = {r.message_id: r for r in p.receive(2)}
    assert (got["f"].dead_letter_reason, got["f"].dead_letter_error_description) == ("bad", "why")
    assert got["f"].dead_letter_source == "orders-in"
    assert (got["p"].dead_letter_reason, got["p"].dead_letter_error_description) == (None, None)
