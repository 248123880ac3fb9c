"""PartitionMap.place: the one placement rule of senders, routers, forwarders, transactions."""

from __future__ import annotations

from raybus._core.record import MessageRecord
from raybus._core.slots import PartitionMap


def test_keyed_messages_go_to_their_slot_owner_and_unkeyed_ones_to_one_spread_partition():
    pmap = PartitionMap.initial(4)
    recs = [
        MessageRecord(session_id="s1"),
        MessageRecord(),
        MessageRecord(partition_key="k"),
        MessageRecord(),
        MessageRecord(message_id="m"),
    ]
    asked: list[int] = []

    def spread() -> int:
        asked.append(1)
        return 3

    groups = pmap.place(recs, dedup=True, spread=spread)
    assert asked == [1]  # asked once, for all unkeyed messages
    assert 1 in groups[3] and 3 in groups[3]
    assert 0 in groups[pmap.owner("s1")]
    assert 2 in groups[pmap.owner("k")]
    assert 4 in groups[pmap.owner("m")]
    assert sorted(i for idxs in groups.values() for i in idxs) == [0, 1, 2, 3, 4]


def test_without_dedup_a_message_id_is_no_key_and_spread_is_not_asked_without_unkeyed():
    pmap = PartitionMap.initial(2)
    groups = pmap.place([MessageRecord(message_id="m")], dedup=False, spread=lambda: 1)
    assert groups == {1: [0]}
    calls: list[int] = []
    keyed = pmap.place(
        [MessageRecord(session_id="a")], dedup=False, spread=lambda: calls.append(1) or 0
    )
    assert calls == [] and keyed == {pmap.owner("a"): [0]}
