"""Records crossing a call in pieces small enough for Ray to carry inline (raybus._core.wire)."""

from __future__ import annotations

import pickle
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raybus._core.record import MessageRecord, to_wire, wire_sizes
from raybus._core.wire import (
    INLINE_BYTES,
    MAX_PIECES,
    join_groups,
    pack_rows,
    pickle_pieces,
    pieces_for,
    split_groups,
    split_rows,
    unpack_rows,
)

RAY_INLINE_LIMIT = 100 * 1024  # Ray's default max_direct_call_object_size


def rows(n: int, body: int = 1024, start: int = 0) -> list[tuple[object, ...]]:
    return to_wire(
        MessageRecord(body=bytes([i % 251]) * body, size=body + 24, message_id=f"m{i}")
        for i in range(start, start + n)
    )


def test_a_hundred_1kib_messages_cross_in_pieces_each_under_rays_inline_limit() -> None:
    layout, *pieces = split_groups([rows(100)])
    assert layout == [100]
    assert len(pieces) == 2
    for piece in pieces:
        assert len(pickle.dumps(piece, protocol=5)) < RAY_INLINE_LIMIT
    assert join_groups(layout, pieces) == [rows(100)]


def test_small_calls_stay_one_piece() -> None:
    layout, *pieces = split_groups([rows(3, 100), rows(2, 100, start=3)])
    assert layout == [3, 2] and len(pieces) == 1
    assert join_groups(layout, pieces) == [rows(3, 100), rows(2, 100, start=3)]


def test_the_estimate_covers_what_pickle_writes() -> None:
    got = rows(200, 300)
    estimated = sum(wire_sizes(got))
    assert len(pickle.dumps(got, protocol=5)) <= estimated


def test_piece_count_is_bounded() -> None:
    assert pieces_for(0) == 1
    assert pieces_for(INLINE_BYTES) == 1
    assert pieces_for(INLINE_BYTES + 1) == 2
    assert pieces_for(MAX_PIECES * INLINE_BYTES) == MAX_PIECES
    # Past that, one object through the object store: not several that each go there.
    assert pieces_for(MAX_PIECES * INLINE_BYTES + 1) == 1
    assert pieces_for(100 * INLINE_BYTES) == 1


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=5000), max_size=80),
    pieces=st.integers(min_value=1, max_value=MAX_PIECES),
)
def test_split_rows_keeps_every_row_in_order_in_about_equal_pieces(
    sizes: list[int], pieces: int
) -> None:
    got = to_wire(MessageRecord(message_id=f"m{i}", size=s) for i, s in enumerate(sizes))
    out = split_rows(got, pieces)
    assert len(out) == pieces
    assert [r for piece in out for r in piece] == got
    share = sum(wire_sizes(got)) / pieces
    biggest = max(wire_sizes(got), default=0)
    for piece in out:  # a piece is its share, give or take the row on each border
        assert sum(wire_sizes(piece)) <= share + biggest


def by_middle_byte(got: list[tuple[object, ...]], pieces: int) -> list[list[object]]:
    """The rule, one row at a time and in exact fractions: a row goes to the piece its middle
    byte falls in."""
    share = Fraction(sum(wire_sizes(got)), pieces)
    out: list[list[object]] = [[] for _ in range(pieces)]
    acc = 0
    for row, size in zip(got, wire_sizes(got), strict=True):
        out[min(pieces - 1, int((acc + Fraction(size, 2)) // share))].append(row)
        acc += size
    return out


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=70_000), min_size=1, max_size=120),
    pieces=st.integers(min_value=2, max_value=MAX_PIECES),
)
def test_split_rows_puts_each_row_in_the_piece_its_middle_byte_falls_in(
    sizes: list[int], pieces: int
) -> None:
    got = to_wire(MessageRecord(message_id=f"m{i}", size=s) for i, s in enumerate(sizes))
    assert split_rows(got, pieces) == by_middle_byte(got, pieces)


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=12))
def test_groups_round_trip(lengths: list[int]) -> None:
    groups, start = [], 0
    for n in lengths:
        groups.append(rows(n, 2000, start))
        start += n
    layout, *pieces = split_groups(groups)
    assert join_groups(layout, pieces) == groups


@pytest.mark.parametrize(
    ("layout", "carried"), [([2], 3), ([3], 2), ([1, -1, 2], 2)], ids=["more", "fewer", "negative"]
)
def test_a_layout_that_does_not_match_the_rows_is_refused(layout: list[int], carried: int) -> None:
    with pytest.raises(ValueError, match="records"):
        join_groups(layout, [rows(carried)])


@pytest.mark.parametrize(("n", "body", "pieces"), [(3, 100, 1), (100, 1024, 2), (400, 1024, 6)])
def test_packed_rows_round_trip_in_inline_pieces(n: int, body: int, pieces: int) -> None:
    """Rows pickled once for many calls: pieces of bytes each under the inline limit."""
    original = rows(n, body)
    packed = pack_rows(original)
    assert len(packed) == pieces
    assert all(isinstance(p, bytes) and len(p) <= INLINE_BYTES for p in packed)
    assert unpack_rows(packed) == original


def test_packed_rows_past_the_piece_limit_are_one_piece() -> None:
    original = rows(700, 1024)  # about 700 KiB: more than MAX_PIECES inline pieces
    packed = pack_rows(original)
    assert len(packed) == 1 and len(packed[0]) > MAX_PIECES * INLINE_BYTES
    assert unpack_rows(packed) == original


def test_a_pickle_in_pieces_is_the_pickle_and_hands_long_bodies_over_uncopied() -> None:
    bodies = [bytes([i]) * (100 << 10) for i in range(5)]
    mutable = bytearray(b"m" * (100 << 10))
    obj = (7, "send_groups", (rows(3), bodies, mutable), {"_auth": "token"})
    pieces = pickle_pieces(obj)
    assert b"".join(pieces) == pickle.dumps(obj, protocol=5)
    assert all(any(p is body for p in pieces) for body in bodies)  # the objects themselves
    assert all(type(p) is bytes for p in pieces)
    copied = [p for p in pieces if p == bytes(mutable)]
    assert copied and all(p is not mutable for p in copied)  # a bytearray is copied
    mutable[0] = 0
    assert pickle.loads(b"".join(pieces))[2][2] == b"m" * (100 << 10)
    short = (1, True, [b"x" * 10])
    assert b"".join(pickle_pieces(short)) == pickle.dumps(short, protocol=5)


def test_a_rows_size_is_its_message_size_plus_the_allowance() -> None:
    got = to_wire([MessageRecord(message_id="a", size=0), MessageRecord(message_id="b", size=1000)])
    small, large = wire_sizes(got)
    assert large - small == 1000 and small > 0
    # split_groups decides its piece count from the same sizes it cuts by.
    many = to_wire(MessageRecord(message_id=str(i), size=1024) for i in range(100))
    _layout, *pieces = split_groups([many])
    assert len(pieces) == pieces_for(sum(wire_sizes(many))) == 2
