"""Slots and partition maps (``raybus._core.slots``): the slot hash, partition keys, initial
and balanced maps. Pure unit tests, no Ray.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from partition_moves_support import ALL

from raybus._core.record import MessageRecord
from raybus._core.slots import SLOTS, PartitionMap, partition_key, slot_of

# ============================================================================ 1. slots


def test_slot_of_is_pinned_to_fixed_values():
    """Golden values: slots are stored (durable partitions own slots, messages sit in them),
    so a change of the hash would send existing keys to partitions that do not hold them."""
    assert SLOTS == 1024
    keys = ("", "a", "session-1", "orders/42", "é")
    assert [slot_of(k) for k in keys] == [0, 1001, 72, 901, 464]
    assert slot_of("\ud800") == 714  # a lone surrogate does not raise


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=130))
def test_slot_of_is_stable_and_in_range(key):
    slot = slot_of(key)
    assert 0 <= slot < SLOTS
    assert slot == slot_of(key) == slot_of("".join(list(key)))  # by value, not identity


def test_similar_keys_spread_over_many_slots():
    for pattern in ("s{}", "session-{}", "order/{}/x"):
        slots = Counter(slot_of(pattern.format(i)) for i in range(1000))
        assert len(slots) > 550, pattern  # about 1024 * (1 - e**-(1000/1024)) = 638 expected
        assert max(slots.values()) <= 8, pattern


_ids = st.none() | st.text(min_size=1, max_size=8)


@settings(max_examples=100, deadline=None)
@given(session_id=_ids, pkey=_ids, message_id=_ids, dedup=st.booleans())
def test_partition_key_precedence(session_id, pkey, message_id, dedup):
    r = MessageRecord(session_id=session_id, partition_key=pkey, message_id=message_id)
    if session_id is not None:
        expected = session_id
    elif pkey is not None:
        expected = pkey
    elif dedup:
        expected = message_id
    else:
        expected = None
    assert partition_key(r, dedup) == expected


def test_message_id_places_a_message_only_with_duplicate_detection():
    r = MessageRecord(message_id="m")
    assert partition_key(r, True) == "m"
    assert partition_key(r, False) is None


@pytest.mark.parametrize("n", range(1, 65))
def test_initial_map_gives_every_slot_a_contiguous_even_share(n):
    pmap = PartitionMap.initial(n)
    assert pmap.version == 1
    assert len(pmap.slots) == SLOTS
    assert pmap.live == tuple(range(n)) == pmap.partition_ids
    assert pmap.retiring == ()
    assert pmap.next_id == n
    assert set(pmap.slots) == set(range(n))
    counts = Counter(pmap.slots)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert list(pmap.slots) == sorted(pmap.slots)  # each partition one contiguous run
    owned = [pmap.owned_by(p) for p in range(n)]
    assert sum(len(o) for o in owned) == SLOTS
    assert frozenset().union(*owned) == ALL
    for key in ("a", "session-1", "orders/42"):
        assert pmap.owner(key) == pmap.slots[slot_of(key)]
        assert slot_of(key) in pmap.owned_by(pmap.owner(key))


def test_next_id_counts_retiring_partitions_too():
    pmap = PartitionMap(3, PartitionMap.initial(2).slots, (0, 1), (4,))
    assert pmap.partition_ids == (0, 1, 4)
    assert pmap.next_id == 5
    assert pmap.owned_by(4) == frozenset()


def test_balanced_needs_a_live_partition():
    with pytest.raises(ValueError):
        PartitionMap.initial(2).balanced([])


@st.composite
def maps_and_live_sets(draw: st.DrawFn) -> tuple[PartitionMap, list[int]]:
    """Any current map over up to 64 partition ids (random, skewed or contiguous), and any
    non-empty live set of up to 64 ids overlapping it or not."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    ids = list(range(128))
    rnd.shuffle(ids)
    current = ids[: draw(st.integers(1, 64))]
    style = draw(st.sampled_from(["random", "skewed", "contiguous"]))
    if style == "random":
        slots = rnd.choices(current, k=SLOTS)
    elif style == "skewed":
        weights = [rnd.random() ** 4 + 1e-3 for _ in current]
        slots = rnd.choices(current, weights, k=SLOTS)
    else:
        base = PartitionMap.initial(len(current)).slots
        slots = [current[i] for i in base]
    keep = [p for p in current if rnd.random() < draw(st.sampled_from([0.0, 0.5, 1.0]))]
    new = rnd.sample(range(128, 300), draw(st.integers(0, 64)))
    live = (keep + new)[:64] or [current[0]]
    return PartitionMap(1, tuple(slots), tuple(current)), live


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(maps_and_live_sets())
def test_balanced_assigns_every_slot_evenly_with_the_fewest_moves(case):
    pmap, live = case
    out = pmap.balanced(live)
    assert len(out) == SLOTS
    assert set(out) <= set(live)
    counts = Counter(out)
    per_live = [counts.get(p, 0) for p in live]
    assert max(per_live) - min(per_live) <= 1
    assert sum(per_live) == SLOTS
    # Fewest moves: every live partition ends with its quota q (base or base + 1, the
    # ``extra`` larger quotas going anywhere) and can keep at most min(its count, q) of its
    # own slots; so the most that can stay is the sum of min(count, base) plus one for each
    # larger quota given to a partition holding more than base. Nothing else stays or moves.
    base, extra = divmod(SLOTS, len(live))
    before = Counter(pmap.slots)
    stayed = Counter(a for a, b in zip(pmap.slots, out, strict=True) if a == b)
    for p in live:
        quota = counts[p]
        assert quota in (base, base + 1)
        assert stayed[p] == min(before[p], quota), p  # keeps all it can of its own
    most = sum(min(before[p], base) for p in live) + min(
        extra, sum(1 for p in live if before[p] > base)
    )
    assert sum(stayed.values()) == most
    # A balanced map is a fixed point.
    again = PartitionMap(2, out, tuple(live)).balanced(live)
    assert again == out


def test_balanced_moves_no_slot_of_an_already_balanced_map():
    """``balanced`` promises the fewest moves; an evenly spread map needs none. The initial
    map of n partitions is evenly spread (counts differ by at most one), and the scaler calls
    an entity converged only when ``pmap.slots == pmap.balanced(pmap.live)``."""
    churn = {}
    for n in range(1, 65):
        pmap = PartitionMap.initial(n)
        moved = sum(1 for a, b in zip(pmap.slots, pmap.balanced(pmap.live), strict=True) if a != b)
        if moved:
            churn[n] = moved
    assert churn == {}, f"partition counts whose fresh map is not balanced(): {churn}"
