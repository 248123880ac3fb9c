"""A partition's side of the topic router's logged deliveries (``raybus._core.deliveries``):
at most once per (source, number), through the journal and checkpoints; never refused for
room or settings; refused whole, storing nothing, for a slot given away.

Pure unit tests on a ``FakeClock``, no Ray.
"""

from __future__ import annotations

import pytest
from transactions_core_support import all_ids, durable, flush, props, rebuilt, rec

from raybus._core import journal
from raybus._core.partition import Partition
from raybus._core.slots import slot_of
from raybus._models import EntityStatus
from raybus.exceptions import PartitionMovedError, ServiceBusQuotaExceededError
from raybus.testing import FakeClock

SRC = "raybus/ns/topic/t/0/router#a"


def test_a_delivery_is_stored_once_per_number_and_source(clock: FakeClock) -> None:
    p = Partition(props(), clock)
    assert p.deliver(SRC, 0, [rec("a"), rec("b")])
    assert all_ids(p) == ["a", "b"]
    # Again (a retry after a lost answer), or an older number: nothing stored.
    assert not p.deliver(SRC, 0, [rec("a"), rec("b")])
    assert p.deliver(SRC, 3, [rec("c")])
    assert not p.deliver(SRC, 2, [rec("x")])
    assert all_ids(p) == ["a", "b", "c"]
    # Another source (a router of a re-created topic, or a fresh log) counts on its own.
    assert p.deliver(SRC + "x", 0, [rec("d")])
    assert all_ids(p) == ["a", "b", "c", "d"]
    assert p.counts().active == 4


@pytest.mark.parametrize("through", ["journal", "checkpoint"])
def test_the_mark_survives_a_restart_with_the_copies(clock: FakeClock, through: str) -> None:
    p = Partition(props(), clock)
    log = durable(p)
    p.deliver(SRC, 7, [rec("a")])
    flush(p, log)
    entries = log if through == "journal" else p.snapshot_entries()
    assert (journal.DELIVERED, journal.MAIN, 7, SRC) in entries
    r = rebuilt(p, clock, entries)
    assert r.delivered == {SRC: 7}
    assert not r.deliver(SRC, 7, [rec("a")])  # the router's redelivery
    assert all_ids(r) == ["a"]
    assert r.deliver(SRC, 8, [rec("b")])
    assert all_ids(r) == ["a", "b"]


def test_a_delivery_is_not_refused_for_room_or_status(clock: FakeClock) -> None:
    """The router checked room and settings before logging the publish; a partition that
    refused now would leave it half delivered."""
    p = Partition(props(max_size_in_megabytes=1), clock)
    big = b"x" * (200 * 1024)
    p.send([rec(f"first{i}", big) for i in range(5)])
    with pytest.raises(ServiceBusQuotaExceededError):
        p.send([rec("refused", big)])
    assert p.deliver(SRC, 0, [rec("delivered", big)])
    assert p.room() < 0
    p.update_properties(props(max_size_in_megabytes=1, status=EntityStatus.SEND_DISABLED))
    assert p.deliver(SRC, 1, [rec("while-disabled")])
    assert all_ids(p) == [f"first{i}" for i in range(5)] + ["delivered", "while-disabled"]


def test_room_counts_stored_and_reserved_bytes(clock: FakeClock) -> None:
    p = Partition(props(max_size_in_megabytes=1), clock)
    assert p.room() == 1024 * 1024
    r = rec("a", b"x" * 1000)
    p.send([r])
    assert p.room() == 1024 * 1024 - r.size
    p.reserved += 500  # a prepared transaction's sends
    assert p.room() == 1024 * 1024 - r.size - 500


def test_a_slot_given_away_refuses_the_whole_delivery(clock: FakeClock) -> None:
    p = Partition(props(), clock)
    p.owned = frozenset({slot_of("kept")})
    with pytest.raises(PartitionMovedError):
        p.deliver(SRC, 0, [rec("a", partition_key="kept"), rec("b", partition_key="gone")])
    assert all_ids(p) == []
    assert p.delivered == {}  # the number is still due: the router places the copies again
    assert p.deliver(SRC, 1, [rec("a", partition_key="kept"), rec("c")])
    assert all_ids(p) == ["a", "c"]


def test_duplicate_detection_applies_to_deliveries(clock: FakeClock) -> None:
    p = Partition(props(requires_duplicate_detection=True), clock)
    p.send([rec("a")])
    assert p.deliver(SRC, 0, [rec("a"), rec("b"), rec("b")])
    assert all_ids(p) == ["a", "b"]
